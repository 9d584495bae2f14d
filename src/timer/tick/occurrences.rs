//! Firing a recurring schedule's timer: one record delivers the occurrence
//! and arms the next (a reschedule record with the occurrence flags), so a
//! torn tail keeps both or neither and every occurrence is delivered once.
//! The last occurrence is a delivery record; a schedule whose missed
//! occurrences are skipped to its end closes with a cancel record.

use super::Ticker;
use crate::error::Result;
use crate::format::record::{
    CANCEL_LEN, DELIVERY_LEN, OccurrenceFields, RescheduleView, encode_cancel, encode_delivery,
};
use crate::sync::Locked;
use crate::timer::Timer;
use crate::timer::ledger::LedgerEntry;
use crate::timer::recurring::Armed;

/// The record a fired schedule timer is written as.
enum Written {
    /// Delivers it (or skips it) and arms the next occurrence.
    Occurrence(RescheduleView),
    /// Delivers the last occurrence.
    Last(u64),
    /// Skips the last: the schedule ends without delivering it.
    Closed(Timer),
}

impl Written {
    fn len(&self) -> usize {
        match self {
            Written::Occurrence(view) => view.record_len(),
            Written::Last(_) => DELIVERY_LEN,
            Written::Closed(_) => CANCEL_LEN,
        }
    }
}

impl Ticker {
    /// Writes the records of the schedules' timers among `due` (fired at
    /// `now_ms`) and returns the other timers, for their delivery records.
    pub(super) fn fire_occurrences(&mut self, due: Vec<Timer>, now_ms: u64) -> Result<Vec<Timer>> {
        if self.recurring.is_empty() || due.is_empty() {
            return Ok(due);
        }
        let mut plain = Vec::with_capacity(due.len());
        let mut fired = Vec::new();
        for timer in due {
            match self.recurring.take(&timer) {
                Some(armed) => fired.push((timer, written(&armed, timer, now_ms))),
                None => plain.push(timer),
            }
        }
        for chunk in fired.chunks(super::DELIVERY_CHUNK) {
            self.write_occurrences(chunk, now_ms)?;
        }
        Ok(plain)
    }

    /// Appends one chunk's records under one lock, then enters each in the
    /// ledger and the counts as a reschedule, a delivery or a cancel is.
    fn write_occurrences(&mut self, chunk: &[(Timer, Written)], now_ms: u64) -> Result<()> {
        let lens: Vec<usize> = chunk.iter().map(|(_, w)| w.len()).collect();
        let (offsets, _) = self.log.append_batch_reserved(&lens, |i, buf, offset| match &chunk[i].1 {
            Written::Occurrence(view) => view.encode(buf, offset),
            Written::Last(timer) => encode_delivery(buf, offset, now_ms, *timer),
            Written::Closed(timer) => {
                encode_cancel(buf, offset, now_ms, timer.message_offset, timer.deliver_at_ms)
            }
        })?;
        let mut stats = self.shared.stats.locked();
        for ((timer, written), &offset) in chunk.iter().zip(&offsets) {
            debug_assert!(timer.deliver_at_ms <= now_ms, "a timer fired before its time");
            let delivered = match written {
                Written::Occurrence(view) => {
                    // The handle finds the schedule's timer by it, as after a reschedule.
                    let entry = LedgerEntry::reschedule(view.message_offset, view.deliver_at_ms, offset);
                    self.wheel.record_in_ledger(entry)?;
                    view.delivers()
                }
                Written::Last(_) => true,
                Written::Closed(timer) => {
                    if let Err(e) = self.wheel.record_cancel(*timer, offset) {
                        tracing::error!(error = %e, offset, "could not enter a schedule's end in the ledger");
                    }
                    self.counts.cancel_recorded(offset, timer.deliver_at_ms);
                    false
                }
            };
            self.counts.settled(timer.message_offset);
            if delivered {
                stats.record_lateness(now_ms, now_ms - timer.deliver_at_ms);
                stats.delivered += 1;
            }
        }
        drop(stats);
        self.wake_indexers();
        Ok(())
    }
}

/// What firing `timer` of the schedule `armed` at `now_ms` writes.
fn written(armed: &Armed, timer: Timer, now_ms: u64) -> Written {
    let firing = armed.plan.on_fire(timer.deliver_at_ms, now_ms, armed.fired);
    match (firing.next, firing.deliver) {
        (Some(next), deliver) => Written::Occurrence(RescheduleView {
            rescheduled_at_ms: now_ms,
            message_offset: armed.schedule,
            from_timer: timer.message_offset,
            from_deliver_at_ms: timer.deliver_at_ms,
            deliver_at_ms: next,
            occurrence: Some(OccurrenceFields { fired: armed.fired + u64::from(deliver), delivers: deliver }),
        }),
        (None, true) => Written::Last(timer.message_offset),
        (None, false) => Written::Closed(timer),
    }
}
