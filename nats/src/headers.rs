//! The headers of a timer, and of what the tier publishes for it: the
//! fired message (the timer's headers without its target, plus its handle
//! and deduplication id) and the dead letter (plus why, where to, which).

use async_nats::HeaderMap;

use crate::wire;
use crate::{Result, TierError};

/// The longest reason a dead letter carries.
const MAX_REASON_LEN: usize = 1024;

/// The headers a direct get adds to the message it reads (where it was):
/// the server's, not the timer's.
const ADDED_BY_A_GET: [&str; 7] = [
    "Nats-Stream",
    "Nats-Subject",
    "Nats-Sequence",
    "Nats-Time-Stamp",
    "Nats-Num-Pending",
    "Nats-Last-Sequence",
    "Nats-UpTo-Sequence",
];

/// Every (name, value) of a header map, a name repeated per value, without
/// those a direct get adds: a timer read back from the stream has the
/// headers it was published with.
pub(crate) fn header_pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .iter()
        .filter(|(name, _)| {
            let name: &str = name.as_ref();
            !ADDED_BY_A_GET.iter().any(|added| name.eq_ignore_ascii_case(added))
        })
        .flat_map(|(name, values)| values.iter().map(move |v| (name.as_ref(), v.as_str())))
}

pub(crate) fn owned_pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    header_pairs(headers).map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

pub(crate) fn borrowed_pairs(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect()
}

pub(crate) fn deliver_at(headers: &HeaderMap) -> Option<u64> {
    headers.get(wire::DELIVER_AT)?.as_str().trim().parse().ok()
}

/// The value of the one header `name` (matched in any case), if there is
/// one; more than one is refused rather than one picked.
pub(crate) fn value_of<'a>(
    source: &[(&str, &'a str)],
    name: &str,
) -> std::result::Result<Option<&'a str>, String> {
    let mut values = source.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| *v);
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => Err(format!("more than one {name} header")),
        (value, _) => Ok(value),
    }
}

/// The one target a timer names. The header's name is matched in any case,
/// as when it is fired, so the target checked is the target published to;
/// two targets are refused rather than one picked.
pub(crate) fn target_of<'a>(sequence: u64, source: &[(&str, &'a str)]) -> Result<&'a str> {
    let bad = |problem: String| TierError::BadTimer { sequence, problem };
    match value_of(source, wire::TARGET).map_err(bad)? {
        Some(target) if !target.is_empty() => Ok(target),
        _ => Err(bad(format!("no {} header", wire::TARGET))),
    }
}

/// What an occurrence of a schedule carries besides, as nats-server puts
/// on its own: the subject the schedule was published to, when it fires
/// next, the TTL and rollup it asked for; and the handle that names a
/// recurring schedule.
pub(crate) struct Occurrence<'a> {
    pub scheduler: &'a str,
    pub next_ms: Option<u64>,
    pub ttl: Option<&'a str>,
    pub rollup: Option<&'a str>,
    pub schedule: Option<wire::TimerHandle>,
}

/// Whether a header of a schedule's timer stays off its occurrences, as
/// nats-server strips them: the schedule's own (`Delay-Schedule*`, and
/// NATS's names for them) and those about storing the timer itself.
fn schedule_only(name: &str) -> bool {
    starts_with(name, wire::SCHEDULE) || starts_with(name, wire::NATS_SCHEDULE) || about_storing(name)
}

/// Whether a header is about how a stream stores the message that carries
/// it (expectations, its TTL, a rollup): a timer's say how the delay stream
/// stores it, not its occurrences or its next timer.
pub(crate) fn about_storing(name: &str) -> bool {
    starts_with(name, "Nats-Expected-")
        || name.eq_ignore_ascii_case(wire::MESSAGE_TTL)
        || name.eq_ignore_ascii_case(wire::ROLLUP)
}

/// Whether header `name` starts with `prefix`, in any case.
pub(crate) fn starts_with(name: &str, prefix: &str) -> bool {
    name.get(..prefix.len()).is_some_and(|p| p.eq_ignore_ascii_case(prefix))
}

/// The target and headers of a fired timer: the source's headers without the
/// target and the tier's own of a rescheduled copy, plus the deduplication
/// id and the handle it had.
pub(crate) fn fired_headers(
    stream: &str,
    partition: u32,
    sequence: u64,
    source: &[(&str, &str)],
    occurrence: Option<&Occurrence<'_>>,
) -> Result<(String, HeaderMap)> {
    let target = target_of(sequence, source)?;
    let mut headers = HeaderMap::new();
    let dropped = [wire::TARGET, wire::MSG_ID, wire::RESCHEDULED_MSG_ID, wire::REPLACES];
    for &(name, value) in source {
        let schedules = occurrence.is_some() && schedule_only(name);
        if !schedules && !dropped.iter().any(|d| name.eq_ignore_ascii_case(d)) {
            headers.append(name, value);
        }
    }
    headers.insert(wire::MSG_ID, wire::msg_id(stream, sequence).as_str());
    headers.insert(wire::HANDLE, wire::TimerHandle { partition, sequence }.to_string().as_str());
    if let Some(occurrence) = occurrence {
        headers.insert(wire::SCHEDULER, occurrence.scheduler);
        let next = occurrence.next_ms.map_or_else(|| "purge".to_string(), crate::nats_schedule::rfc3339);
        headers.insert(wire::SCHEDULE_NEXT, next.as_str());
        if let Some(ttl) = occurrence.ttl {
            headers.insert(wire::MESSAGE_TTL, ttl);
        }
        if let Some(rollup) = occurrence.rollup {
            headers.insert(wire::ROLLUP, rollup);
        }
        if let Some(schedule) = occurrence.schedule {
            headers.insert(wire::SCHEDULE_HANDLE, schedule.to_string().as_str());
        }
    }
    Ok((target.to_string(), headers))
}

/// The headers of a recurring schedule's next timer, published to the delay
/// stream by the owner before the current one fires: the source's, less the
/// tier's own and what would stop it being stored, plus its time, the
/// schedule's id (the producer's `Nats-Msg-Id`, or one of the tier's) under
/// the tier's header, the timer it replaces (which holds that id until it
/// fires) and the schedule's handle. It carries no `Nats-Msg-Id`: a second
/// copy (an owner that died after publishing it) is dropped by the id, as
/// any duplicate is.
pub(crate) fn successor_headers(
    source: &[(&str, &str)],
    schedule_id: &str,
    replaces: u64,
    schedule: wire::TimerHandle,
    next_ms: u64,
) -> HeaderMap {
    let dropped =
        [wire::MSG_ID, wire::RESCHEDULED_MSG_ID, wire::REPLACES, wire::DELIVER_AT, wire::SCHEDULE_HANDLE];
    let mut headers = HeaderMap::new();
    for &(name, value) in source {
        if !about_storing(name) && !dropped.iter().any(|d| name.eq_ignore_ascii_case(d)) {
            headers.append(name, value);
        }
    }
    headers.insert(wire::DELIVER_AT, next_ms.to_string().as_str());
    headers.insert(wire::RESCHEDULED_MSG_ID, schedule_id);
    headers.insert(wire::REPLACES, replaces.to_string().as_str());
    headers.insert(wire::SCHEDULE_HANDLE, schedule.to_string().as_str());
    headers
}

/// A dead letter's headers: the source's, less its target and any
/// `Delay-Dead-*` a producer set, plus why, the target, the sequence, the
/// handle and the deduplication id (for a stream that keeps dead letters).
pub(crate) fn dead_letter_headers(
    stream: &str,
    partition: Option<u32>,
    sequence: u64,
    source: &[(&str, &str)],
    reason: &str,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let mut target = None;
    for &(name, value) in source {
        let dead =
            name.get(..wire::DEAD_PREFIX.len()).is_some_and(|p| p.eq_ignore_ascii_case(wire::DEAD_PREFIX));
        if name.eq_ignore_ascii_case(wire::TARGET) {
            target.get_or_insert(value);
        } else if !dead && !name.eq_ignore_ascii_case(wire::MSG_ID) {
            headers.append(name, value);
        }
    }
    headers.insert(wire::MSG_ID, wire::msg_id(stream, sequence).as_str());
    if let Some(partition) = partition {
        headers.insert(wire::HANDLE, wire::TimerHandle { partition, sequence }.to_string().as_str());
    }
    headers.insert(wire::DEAD_REASON, header_text(reason).as_str());
    headers.insert(wire::DEAD_SEQUENCE, sequence.to_string().as_str());
    if let Some(target) = target {
        headers.insert(wire::DEAD_TARGET, header_text(target).as_str());
    }
    headers
}

/// Text fit for a header value: no control characters (a line break would
/// end the header), at most `MAX_REASON_LEN` bytes.
pub(crate) fn header_text(text: &str) -> String {
    let mut clean: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if clean.len() > MAX_REASON_LEN {
        let cut = (0..=MAX_REASON_LEN).rev().find(|&i| clean.is_char_boundary(i)).unwrap_or(0);
        clean.truncate(cut);
    }
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timer read back by a direct get (firing one kept by reference, a
    /// reschedule's copy, a taken-over partition's timers) keeps its own
    /// headers, not where the server found it.
    #[test]
    fn a_direct_gets_own_headers_are_not_the_timers() {
        let mut headers = HeaderMap::new();
        for (name, value) in [("Nats-Stream", "DELAY"), ("Nats-Sequence", "7"), ("nats-time-stamp", "x")] {
            headers.insert(name, value);
        }
        headers.insert("Nats-Msg-Id", "order-42");
        headers.insert(wire::TARGET, "orders.cancel");
        let mut pairs: Vec<(&str, &str)> = header_pairs(&headers).collect();
        pairs.sort();
        assert_eq!(pairs, [(wire::TARGET, "orders.cancel"), ("Nats-Msg-Id", "order-42")]);
    }

    #[test]
    fn a_fired_message_keeps_the_users_headers_and_names_itself_for_deduplication() {
        let mut source = HeaderMap::new();
        source.insert(wire::TARGET, "orders.timeout");
        source.insert(wire::DELIVER_AT, "1700000000000");
        source.insert("Order", "o-1");
        source.insert(wire::MSG_ID, "the producer's own id");
        // What a rescheduled copy carries for the tier alone.
        source.insert(wire::RESCHEDULED_MSG_ID, "the producer's own id");
        source.insert(wire::REPLACES, "40");
        let pairs: Vec<_> = header_pairs(&source).collect();
        let (target, headers) = fired_headers("DELAY", 3, 42, &pairs, None).unwrap();
        assert_eq!(target, "orders.timeout");
        assert_eq!(headers.get("Order").unwrap().as_str(), "o-1");
        assert_eq!(headers.get(wire::DELIVER_AT).unwrap().as_str(), "1700000000000");
        assert_eq!(headers.get(wire::MSG_ID).unwrap().as_str(), "DELAY-42");
        assert_eq!(headers.get(wire::HANDLE).unwrap().as_str(), "3:42");
        assert!(headers.get(wire::TARGET).is_none());
        assert!(headers.get(wire::RESCHEDULED_MSG_ID).is_none() && headers.get(wire::REPLACES).is_none());
        assert_eq!(deliver_at(&headers), Some(1_700_000_000_000));
    }

    #[test]
    fn an_occurrence_says_what_nats_says_under_the_tiers_names_and_drops_the_schedules_headers() {
        let mut source = HeaderMap::new();
        source.insert(wire::TARGET, "reports.daily");
        source.insert(wire::SCHEDULE, "@every 1m");
        source.insert(wire::SCHEDULE_TTL, "1h");
        source.insert(wire::SCHEDULE_HANDLE, "3:7");
        source.insert(wire::DELIVER_AT, "1796634060000");
        source.insert(wire::MESSAGE_TTL, "5m");
        source.insert("Nats-Expected-Stream", "DELAY");
        source.insert("Report", "sales");
        let pairs: Vec<_> = header_pairs(&source).collect();
        let schedule = wire::TimerHandle { partition: 3, sequence: 7 };
        let occurrence = Occurrence {
            scheduler: "schedules.report",
            next_ms: Some(1_796_634_120_000),
            ttl: Some("1h"),
            rollup: None,
            schedule: Some(schedule),
        };
        let (target, headers) = fired_headers("DELAY", 3, 42, &pairs, Some(&occurrence)).unwrap();
        assert_eq!(target, "reports.daily");
        let get = |name| headers.get(name).map(|v| v.as_str());
        assert_eq!(get(wire::SCHEDULER), Some("schedules.report"));
        assert_eq!(get(wire::SCHEDULE_NEXT), Some("2026-12-07T09:02:00Z"));
        assert_eq!(get(wire::MESSAGE_TTL), Some("1h"), "the schedule's TTL, not the timer's own");
        assert_eq!(get(wire::SCHEDULE_HANDLE), Some("3:7"));
        assert_eq!(get(wire::HANDLE), Some("3:42"));
        assert_eq!(get(wire::DELIVER_AT), Some("1796634060000"));
        assert_eq!(get("Report"), Some("sales"));
        for gone in [wire::SCHEDULE, wire::SCHEDULE_TTL, "Nats-Expected-Stream", wire::TARGET] {
            assert_eq!(get(gone), None, "{gone}");
        }
        let last = Occurrence { next_ms: None, ttl: None, schedule: None, ..occurrence };
        let (_, headers) = fired_headers("DELAY", 3, 42, &pairs, Some(&last)).unwrap();
        assert_eq!(headers.get(wire::SCHEDULE_NEXT).unwrap().as_str(), "purge");
        assert!(headers.get(wire::MESSAGE_TTL).is_none());
    }

    #[test]
    fn a_schedules_next_timer_carries_its_time_id_and_handle_and_no_msg_id() {
        let mut source = HeaderMap::new();
        source.insert(wire::TARGET, "reports.daily");
        source.insert(wire::SCHEDULE, "@every 1m");
        source.insert(wire::MSG_ID, "daily-report");
        source.insert(wire::DELIVER_AT, "1000");
        source.insert(wire::REPLACES, "5");
        source.insert("Nats-Expected-Last-Sequence", "9");
        let pairs: Vec<_> = header_pairs(&source).collect();
        let schedule = wire::TimerHandle { partition: 3, sequence: 7 };
        let next = successor_headers(&pairs, "daily-report", 42, schedule, 61_000);
        let get = |name| next.get(name).map(|v| v.as_str());
        assert_eq!(get(wire::DELIVER_AT), Some("61000"));
        assert_eq!(get(wire::RESCHEDULED_MSG_ID), Some("daily-report"));
        assert_eq!(get(wire::REPLACES), Some("42"));
        assert_eq!(get(wire::SCHEDULE_HANDLE), Some("3:7"));
        assert_eq!(get(wire::SCHEDULE), Some("@every 1m"));
        assert_eq!(get(wire::TARGET), Some("reports.daily"));
        assert_eq!(get(wire::MSG_ID), None, "a second copy is dropped by the tier, not by JetStream");
        assert_eq!(get("Nats-Expected-Last-Sequence"), None);
    }

    #[test]
    fn a_timer_without_a_target_is_refused_naming_its_sequence() {
        let mut source = HeaderMap::new();
        source.insert(wire::DELIVER_AT, "5");
        let pairs: Vec<_> = header_pairs(&source).collect();
        let err = fired_headers("DELAY", 0, 9, &pairs, None).unwrap_err().to_string();
        assert!(err.contains("sequence 9") && err.contains(wire::TARGET), "{err}");
    }

    #[test]
    fn a_second_target_in_another_case_is_refused_not_picked() {
        // An index that read `Delay-Target` and a firing that read
        // `delay-target` would check one target and publish to another.
        let pairs = [(wire::TARGET, "out.fired"), ("delay-target", "$JS.API.STREAM.PURGE.VICTIM")];
        let err = fired_headers("DELAY", 0, 9, &pairs, None).unwrap_err().to_string();
        assert!(err.contains("more than one"), "{err}");
        assert_eq!(target_of(9, &[("DELAY-TARGET", "out.x")]).unwrap(), "out.x");
        assert!(target_of(9, &[(wire::TARGET, "")]).is_err());
    }

    #[test]
    fn a_dead_letter_says_why_and_where_and_is_no_timer() {
        let source = [
            (wire::TARGET, "nostream.x"),
            (wire::DELIVER_AT, "5"),
            ("Order", "o-1"),
            ("Delay-Dead-Reason", "forged by the producer"),
            (wire::MSG_ID, "the producer's own id"),
        ];
        let reason = format!("no stream captures it\r\n{}", "x".repeat(2 * MAX_REASON_LEN));
        let headers = dead_letter_headers("DELAY", Some(2), 77, &source, &reason);
        assert!(headers.get(wire::TARGET).is_none());
        assert_eq!(headers.get(wire::DEAD_TARGET).unwrap().as_str(), "nostream.x");
        assert_eq!(headers.get(wire::DEAD_SEQUENCE).unwrap().as_str(), "77");
        assert_eq!(headers.get(wire::HANDLE).unwrap().as_str(), "2:77");
        assert_eq!(headers.get(wire::MSG_ID).unwrap().as_str(), "DELAY-77");
        assert_eq!(headers.get("Order").unwrap().as_str(), "o-1");
        let written = headers.get(wire::DEAD_REASON).unwrap().as_str();
        assert!(written.starts_with("no stream captures it  xx"), "{written}");
        assert_eq!(written.len(), MAX_REASON_LEN);
        assert_eq!(headers.get_all(wire::DEAD_REASON).count(), 1, "the producer's own is dropped");
    }
}
