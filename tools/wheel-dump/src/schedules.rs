//! The recurring schedules of a store on disk that are still active, for
//! `delaywheel schedules`: each schedule record whose armed timer `audit`
//! calls pending, with its spec (read by the library's own rules), when its
//! next occurrence is due and how many it has delivered.
//!
//! Like `pending`, it reads the whole commit log, and may run beside a live
//! store (the answer is as of the files' state).

use delaywheel::internals::{PAUSED_AT_MS, ScheduleSpec};
use delaywheel::{MissedRuns, Recurrence};
use serde::Serialize;

use crate::audit::audit_with_facts;
use crate::commitlog::LogFacts;
use crate::error::Result;
use crate::store_files::StoreFiles;
use crate::time::utc_ms;

/// One active schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduleEntry {
    /// `offset@first_occurrence_ms`, as `delaywheel::Handle` prints it.
    pub handle: String,
    pub topic: String,
    pub queue: u32,
    pub key: Option<String>,
    /// The cron expression, or `@every <period>ms`.
    pub recurrence: String,
    /// The IANA zone a cron expression is evaluated in (`None` for `every`).
    pub time_zone: Option<String>,
    pub start_at_ms: u64,
    pub end_at_ms: Option<u64>,
    pub limit: Option<u64>,
    /// `fire_once`, `skip` or `fire_all:<window ms>`.
    pub missed: String,
    /// When its armed occurrence is due (`None` while paused).
    pub next_at_ms: Option<u64>,
    pub next_at_utc: Option<String>,
    /// Occurrences delivered so far.
    pub fired: u64,
    pub paused: bool,
    /// Why its spec does not read, if it does not (the store fires it once, as a timer).
    pub problem: Option<String>,
}

/// The active schedules (of `topic`, if given), by handle.
pub fn list(files: &StoreFiles, topic: Option<&str>) -> Result<Vec<ScheduleEntry>> {
    let (audit, facts) = audit_with_facts(files, true)?;
    let mut found: Vec<ScheduleEntry> = audit
        .pending
        .iter()
        .filter_map(|&(offset, due)| {
            let m = facts.messages.get(&offset).filter(|m| m.schedule)?;
            let wanted = topic.is_none_or(|t| t == facts.topic(m));
            wanted.then(|| entry(&facts, offset, due))
        })
        .collect();
    found.sort_unstable_by_key(|s| s.handle.split('@').next().and_then(|o| o.parse::<u64>().ok()));
    Ok(found)
}

fn entry(facts: &LogFacts, offset: u64, due: u64) -> ScheduleEntry {
    let m = &facts.messages[&offset];
    // The latest occurrence record of the schedule says how many were delivered.
    let fired = facts
        .reschedules
        .values()
        .rfind(|r| r.message_offset == offset)
        .and_then(|r| r.occurrence)
        .map_or(0, |o| o.fired);
    let spec = match facts.schedule_spec(offset) {
        Some(Ok(text)) => ScheduleSpec::decode(text),
        Some(Err(why)) => Err(why.clone()),
        None => Err("not read".to_string()),
    };
    let paused = due == PAUSED_AT_MS;
    let next_at_ms = (!paused).then_some(due);
    let mut entry = ScheduleEntry {
        handle: format!("{offset}@{}", m.deliver_at_ms),
        topic: facts.topic(m).to_string(),
        queue: m.queue_id,
        key: facts.key(offset).map(str::to_string),
        recurrence: String::new(),
        time_zone: None,
        start_at_ms: 0,
        end_at_ms: None,
        limit: None,
        missed: String::new(),
        next_at_ms,
        next_at_utc: next_at_ms.map(utc_ms),
        fired,
        paused,
        problem: None,
    };
    match spec {
        Ok(spec) => {
            (entry.recurrence, entry.time_zone) = match spec.recurrence {
                Recurrence::Cron { expression, time_zone } => (expression, Some(time_zone)),
                Recurrence::Every { period_ms } => (format!("@every {period_ms}ms"), None),
            };
            (entry.start_at_ms, entry.end_at_ms, entry.limit) = (spec.start_ms, spec.end_ms, spec.limit);
            entry.missed = match spec.missed {
                MissedRuns::FireOnce => "fire_once".into(),
                MissedRuns::Skip => "skip".into(),
                MissedRuns::FireAll { window } => format!("fire_all:{}", window.as_millis()),
            };
        }
        Err(why) => entry.problem = Some(why),
    }
    entry
}
