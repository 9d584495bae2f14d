//! The headers of a timer, and of what the tier publishes for it: the
//! fired message (the timer's headers without its target, plus its handle
//! and deduplication id) and the dead letter (plus why, where to, which).

use async_nats::HeaderMap;

use crate::wire;
use crate::{Result, TierError};

/// The longest reason a dead letter carries.
const MAX_REASON_LEN: usize = 1024;

/// Every (name, value) of a header map, a name repeated per value.
pub(crate) fn header_pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers.iter().flat_map(|(name, values)| values.iter().map(move |v| (name.as_ref(), v.as_str())))
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

/// The one target a timer names. The header's name is matched in any case,
/// as when it is fired, so the target checked is the target published to;
/// two targets are refused rather than one picked.
pub(crate) fn target_of<'a>(sequence: u64, source: &[(&str, &'a str)]) -> Result<&'a str> {
    let mut targets = source.iter().filter(|(n, _)| n.eq_ignore_ascii_case(wire::TARGET)).map(|(_, v)| *v);
    let bad = |problem: String| TierError::BadTimer { sequence, problem };
    match (targets.next(), targets.next()) {
        (Some(target), None) if !target.is_empty() => Ok(target),
        (Some(_), Some(_)) => Err(bad(format!("more than one {} header", wire::TARGET))),
        _ => Err(bad(format!("no {} header", wire::TARGET))),
    }
}

/// The target and headers of a fired timer: the source's headers without the
/// target and the tier's own of a rescheduled copy, plus the deduplication
/// id and the handle it had.
pub(crate) fn fired_headers(
    stream: &str,
    partition: u32,
    sequence: u64,
    source: &[(&str, &str)],
) -> Result<(String, HeaderMap)> {
    let target = target_of(sequence, source)?;
    let mut headers = HeaderMap::new();
    let dropped = [wire::TARGET, wire::MSG_ID, wire::RESCHEDULED_MSG_ID, wire::REPLACES];
    for &(name, value) in source {
        if !dropped.iter().any(|d| name.eq_ignore_ascii_case(d)) {
            headers.append(name, value);
        }
    }
    headers.insert(wire::MSG_ID, wire::msg_id(stream, sequence).as_str());
    headers.insert(wire::HANDLE, wire::TimerHandle { partition, sequence }.to_string().as_str());
    Ok((target.to_string(), headers))
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
        let (target, headers) = fired_headers("DELAY", 3, 42, &pairs).unwrap();
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
    fn a_timer_without_a_target_is_refused_naming_its_sequence() {
        let mut source = HeaderMap::new();
        source.insert(wire::DELIVER_AT, "5");
        let pairs: Vec<_> = header_pairs(&source).collect();
        let err = fired_headers("DELAY", 0, 9, &pairs).unwrap_err().to_string();
        assert!(err.contains("sequence 9") && err.contains(wire::TARGET), "{err}");
    }

    #[test]
    fn a_second_target_in_another_case_is_refused_not_picked() {
        // An index that read `Delay-Target` and a firing that read
        // `delay-target` would check one target and publish to another.
        let pairs = [(wire::TARGET, "out.fired"), ("delay-target", "$JS.API.STREAM.PURGE.VICTIM")];
        let err = fired_headers("DELAY", 0, 9, &pairs).unwrap_err().to_string();
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
