//! The pending timers of a store on disk due in a window of time, for
//! `delaywheel pending`: what `audit` calls pending (the next open delivers
//! them), with their messages' topic, queue and key, by deliver time.
//!
//! Like `audit`, it reads the whole commit log (and the relocated copies);
//! a live store answers the same question from its wheel alone
//! (`Store::pending`). Beside a live store the answer is as of the files'
//! state: timers delivered since the last checkpoint are known by their
//! delivery records, so they are not listed.

use std::ops::Range;

use serde::Serialize;

use crate::audit::audit_with_facts;
use crate::error::Result;
use crate::store_files::StoreFiles;
use crate::time::utc_ms;

/// One pending timer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingTimer {
    /// `offset@deliver_at_ms`, as `delaywheel::Handle` prints it: the
    /// handle the put returned (a reschedule keeps it).
    pub handle: String,
    pub topic: String,
    pub queue: u32,
    pub key: Option<String>,
    /// When it is due now (a rescheduled timer: its new time).
    pub deliver_at_ms: u64,
    pub deliver_at_utc: String,
    /// The legacy delay level it was put with, if any.
    pub level: Option<u16>,
    pub message_offset: u64,
}

/// What to list.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub topic: Option<String>,
    pub key: Option<String>,
}

/// The pending timers due in `window_ms` that pass `filter`, by (deliver time, offset).
pub fn list(files: &StoreFiles, window_ms: Range<u64>, filter: &Filter) -> Result<Vec<PendingTimer>> {
    let (audit, facts) = audit_with_facts(files, true)?;
    let mut found: Vec<PendingTimer> = audit
        .pending
        .iter()
        .filter_map(|&(offset, due)| {
            let m = facts.messages.get(&offset)?;
            let topic = facts.topic(m);
            let key = facts.key(offset);
            let wanted = window_ms.contains(&due)
                && filter.topic.as_deref().is_none_or(|t| t == topic)
                && filter.key.as_deref().is_none_or(|k| Some(k) == key);
            wanted.then(|| PendingTimer {
                handle: format!("{offset}@{}", m.deliver_at_ms),
                topic: topic.to_string(),
                queue: m.queue_id,
                key: key.map(str::to_string),
                deliver_at_ms: due,
                deliver_at_utc: utc_ms(due),
                level: (m.delay_level != 0).then_some(m.delay_level),
                message_offset: offset,
            })
        })
        .collect();
    found.sort_unstable_by_key(|p| (p.deliver_at_ms, p.message_offset));
    Ok(found)
}
