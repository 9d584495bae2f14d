//! The schedule intake: where a message made for NATS's own message
//! schedules (`Nats-Schedule` and its kin) is published unchanged.
//!
//! NATS runs a schedule in the stream that captures its subject. The tier's
//! delay streams cannot hold `Nats-Schedule`: JetStream refuses the header on
//! a stream that does not run NATS's schedules, and a stream that did would
//! fire it itself. So every node listens, in one queue group, on the intake
//! subjects (`schedules.>` by default), which no stream may capture. A
//! JetStream publish there is checked, its schedule headers renamed to the
//! tier's (`Nats-Schedule` to `Delay-Schedule`, `Nats-Schedule-Target` to
//! `Delay-Target`, ...), and stored in the delay stream under
//! `<prefix>.<partition>.<subject>`. The publisher gets the delay stream's
//! own publish acknowledgement (`{"stream":"DELAY","seq":N}`), so the
//! JetStream client's publish succeeds as it would with NATS; or a
//! JetStream-shaped error naming what is wrong (the header, the cron's
//! field, the target), as NATS refuses a malformed schedule. The timer's
//! handle is `<partition>:<seq>`, its partition the subject's
//! ([`Layout::schedule_subject`]).

use async_nats::HeaderMap;
use futures::StreamExt;
use serde_json::json;
use std::sync::Arc;
use tokio::task::JoinHandle;

use crate::headers::{about_storing, header_pairs, starts_with, value_of};
use crate::nats_schedule::{NATS_NAMES, NatsSchedule};
use crate::partition::{Shared, now_ms, publish_acked};
use crate::target::TargetPolicy;
use crate::wire::{self, Layout};
use crate::{Result, TierError};

/// The queue group of every node's intake: each publish reaches one node.
const QUEUE_GROUP: &str = "delaytier-schedules";
/// Publishes handled at once by one node.
const CONCURRENCY: usize = 256;

/// NATS's schedule headers and the tier's names for them.
const RENAMED: [(&str, &str); 5] = [
    (wire::NATS_SCHEDULE, wire::SCHEDULE),
    (wire::NATS_SCHEDULE_TIME_ZONE, wire::SCHEDULE_TIME_ZONE),
    (wire::NATS_SCHEDULE_TTL, wire::SCHEDULE_TTL),
    (wire::NATS_SCHEDULE_ROLLUP, wire::SCHEDULE_ROLLUP),
    (wire::NATS_SCHEDULE_TARGET, wire::TARGET),
];

/// Subscribes to `<intake>.>` and takes schedules until the task is aborted.
pub(crate) async fn start(shared: Arc<Shared>, intake: &str) -> Result<JoinHandle<()>> {
    let filter = format!("{intake}.>");
    let subscriber = shared
        .client
        .queue_subscribe(filter.clone(), QUEUE_GROUP.into())
        .await
        .map_err(|e| TierError::nats(format!("subscribe to {filter}"), e))?;
    tracing::info!(%filter, "taking NATS message schedules");
    Ok(tokio::spawn(subscriber.for_each_concurrent(CONCURRENCY, move |message| {
        let shared = shared.clone();
        async move { take(&shared, message).await }
    })))
}

/// Stores one published schedule and answers its publisher.
async fn take(shared: &Shared, message: async_nats::Message) {
    let subject = message.subject.as_str();
    let answer = match translate(subject, message.headers.as_ref(), &shared.layout, &shared.policy) {
        Ok((stored, headers)) => match publish_acked(&shared.js, stored, headers, message.payload).await {
            Ok(ack) => {
                metrics::counter!("delaytier_schedules_taken_total").increment(1);
                json!({ "stream": ack.stream, "seq": ack.sequence, "duplicate": ack.duplicate })
            }
            Err(err) => {
                tracing::warn!(%subject, %err, "a schedule could not be stored");
                error_answer(503, &format!("the delay stream did not take it: {err}"))
            }
        },
        Err(why) => {
            metrics::counter!("delaytier_schedules_refused_total").increment(1);
            tracing::warn!(%subject, why, "schedule refused");
            error_answer(400, &why)
        }
    };
    let Some(reply) = message.reply else { return };
    if let Err(refused) = shared.policy.check_reply(&reply) {
        return tracing::warn!(%subject, %refused, "a schedule's publisher not answered");
    }
    if let Err(err) = shared.client.publish(reply, answer.to_string().into()).await {
        tracing::warn!(%subject, %err, "could not answer a schedule's publisher");
    }
}

/// An error as JetStream answers a publish it refuses.
fn error_answer(code: u16, description: &str) -> serde_json::Value {
    json!({ "error": { "code": code, "description": description } })
}

/// Whether a header of a published schedule asks what the tier cannot do:
/// NATS's other schedule headers, and those about how NATS's stream would
/// store the schedule message itself (an expectation, a TTL that would end
/// the schedule, a rollup).
fn unsupported(name: &str) -> bool {
    let renamed = RENAMED.iter().any(|(nats, _)| name.eq_ignore_ascii_case(nats));
    (starts_with(name, wire::NATS_SCHEDULE) && !renamed) || about_storing(name)
}

fn unsupported_why(name: &str) -> &'static str {
    if name.eq_ignore_ascii_case(wire::NATS_SCHEDULE_SOURCE) {
        "the tier fires a schedule's own message, not the last of another subject"
    } else if starts_with(name, wire::NATS_SCHEDULE) {
        "not a header a publisher sets (NATS puts it on its occurrences)"
    } else {
        "it is about how NATS's stream would store the schedule, which the tier does not"
    }
}

/// The delay-stream subject and headers of a schedule published to
/// `subject`; what is wrong with it, naming the header.
pub(crate) fn translate(
    subject: &str,
    headers: Option<&HeaderMap>,
    layout: &Layout,
    policy: &TargetPolicy,
) -> std::result::Result<(String, HeaderMap), String> {
    let pairs: Vec<(&str, &str)> = headers.map(|h| header_pairs(h).collect()).unwrap_or_default();
    let Some(schedule) = NatsSchedule::read_named(&pairs, &NATS_NAMES)? else {
        return Err(format!("no {} header: {subject} takes NATS message schedules", wire::NATS_SCHEDULE));
    };
    // Refused now rather than dead-lettered when a node reads it.
    schedule.first(now_ms()).map_err(|why| format!("{}: {why}", wire::NATS_SCHEDULE))?;
    if let Some((name, _)) = pairs.iter().find(|(name, _)| unsupported(name)) {
        return Err(format!("{name}: {}", unsupported_why(name)));
    }
    let target = value_of(&pairs, wire::NATS_SCHEDULE_TARGET)?
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("no {} header", wire::NATS_SCHEDULE_TARGET))?;
    policy.check(target).map_err(|refused| format!("{}: {refused}", wire::NATS_SCHEDULE_TARGET))?;
    let mut stored = HeaderMap::new();
    for (name, value) in pairs {
        match RENAMED.iter().find(|(nats, _)| name.eq_ignore_ascii_case(nats)) {
            Some((_, ours)) => stored.insert(*ours, value),
            // The tier's own headers are the tier's to write.
            None if starts_with(name, "Delay-") => {}
            None => stored.append(name, value),
        }
    }
    Ok((layout.schedule_subject(subject), stored))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, *value);
        }
        map
    }

    fn translated(pairs: &[(&str, &str)]) -> std::result::Result<(String, HeaderMap), String> {
        let policy = TargetPolicy::new("delay", "delaytier.dead", Vec::new()).also_own("schedules");
        translate("schedules.report", Some(&headers(pairs)), &Layout::new("DELAY", "delay", 8), &policy)
    }

    #[test]
    fn a_nats_schedule_is_stored_under_the_tiers_names() {
        let (subject, stored) = translated(&[
            ("Nats-Schedule", "@daily"),
            ("Nats-Schedule-Time-Zone", "Europe/Paris"),
            ("Nats-Schedule-Target", "reports.daily"),
            ("Nats-Schedule-TTL", "1h"),
            ("Nats-Msg-Id", "daily-report"),
            ("Delay-Replaces", "7"),
            ("Report", "sales"),
        ])
        .unwrap();
        assert_eq!(subject, Layout::new("DELAY", "delay", 8).schedule_subject("schedules.report"));
        let get = |name| stored.get(name).map(|v| v.as_str().to_string());
        assert_eq!(get("Delay-Schedule").as_deref(), Some("@daily"));
        assert_eq!(get("Delay-Schedule-Time-Zone").as_deref(), Some("Europe/Paris"));
        assert_eq!(get("Delay-Target").as_deref(), Some("reports.daily"));
        assert_eq!(get("Delay-Schedule-TTL").as_deref(), Some("1h"));
        assert_eq!(get("Nats-Msg-Id").as_deref(), Some("daily-report"), "its id dedups it, as a timer's");
        assert_eq!(get("Report").as_deref(), Some("sales"));
        for gone in ["Nats-Schedule", "Nats-Schedule-Target", "Delay-Replaces"] {
            assert_eq!(get(gone), None, "{gone}");
        }
    }

    #[test]
    fn what_nats_would_refuse_and_what_the_tier_cannot_do_are_refused_naming_the_header() {
        let refused = |pairs: &[(&str, &str)]| translated(pairs).unwrap_err();
        let none = refused(&[("Nats-Schedule-Target", "x.y")]);
        assert!(none.contains("no Nats-Schedule header"), "{none}");
        let cron = refused(&[("Nats-Schedule", "0 0 25 * * *"), ("Nats-Schedule-Target", "x.y")]);
        assert!(cron.contains("Nats-Schedule") && cron.contains("hour"), "{cron}");
        let no_target = refused(&[("Nats-Schedule", "@hourly")]);
        assert!(no_target.contains("no Nats-Schedule-Target"), "{no_target}");
        for target in ["$JS.API.STREAM.DELETE.DELAY", "delay.3.x", "schedules.again", "a.*"] {
            let why = refused(&[("Nats-Schedule", "@hourly"), ("Nats-Schedule-Target", target)]);
            assert!(why.starts_with("Nats-Schedule-Target"), "{target}: {why}");
        }
        let source = refused(&[
            ("Nats-Schedule", "@hourly"),
            ("Nats-Schedule-Target", "x.y"),
            ("Nats-Schedule-Source", "x.last"),
        ]);
        assert!(source.contains("Nats-Schedule-Source"), "{source}");
        let hourly = [("Nats-Schedule", "@hourly"), ("Nats-Schedule-Target", "x.y")];
        for unsupported in
            ["Nats-Scheduler", "Nats-Schedule-Next", "Nats-TTL", "Nats-Expected-Last-Subject-Sequence"]
        {
            let why = refused(&[hourly[0], hourly[1], (unsupported, "1")]);
            assert!(why.starts_with(unsupported), "{unsupported}: {why}");
        }
        let never = refused(&[("Nats-Schedule", "0 0 0 30 2 *"), ("Nats-Schedule-Target", "x.y")]);
        assert!(never.contains("never fires"), "{never}");
    }
}
