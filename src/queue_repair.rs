//! A damaged run of consume-queue entries, made again from the commit log.
//!
//! A consume queue is an index: its entries are what the dispatcher made of
//! the log's records, in log order. When a consumer meets entries whose own
//! bytes do not read (a flipped byte, a zeroed page of a queue file), the
//! records they pointed at are still in the log. The readable entries on
//! either side of the run bound where those records lie, and the
//! dispatcher's rule says which records between them make entries in this
//! queue: if there are exactly as many as the run is long, they are the run.
//! Otherwise (the run reaches the queue's first entry, or the count differs:
//! a bucket scheduler's copies are made by the scheduler, not by this rule)
//! nothing is repaired and the consumer gets the error naming the entry.

use std::sync::Arc;

use crate::commitlog::CommitLog;
use crate::consume_queue::ConsumeQueue;
use crate::dispatcher::{deliveries_entry, delivery_entry, message_entry};
use crate::error::Result;
use crate::format::queue_entry::{self, Entry, FLAG_TIMER_DELIVERY, batch_flags};
use crate::format::record::{
    DeliveriesView, DeliveryView, MessageView, OccurrencesView, RecordKind, RescheduleView,
};

/// Where an entry sorts in its queue: entries follow the log, and the
/// entries of one deliveries record follow its timers.
fn order(entry: &Entry) -> (u64, usize) {
    (entry.log_offset, entry.batch_index().unwrap_or(0))
}

/// Makes again the damaged run of `queue`'s entries that starts at `from`
/// (an entry whose bytes do not read) and returns how many it repaired
/// (`queue.repair` has them); 0 if it could not tell what they were.
pub(crate) fn repair_run(log: &Arc<CommitLog>, queue: &ConsumeQueue, from: u64) -> Result<u64> {
    let readable = |index: u64| queue.read(index).ok();
    let before = match from.checked_sub(1).filter(|&i| i >= queue.first_index()) {
        Some(index) => match readable(index) {
            Some(entry) => Some(entry),
            None => return Ok(0),
        },
        None => None,
    };
    let len = queue.len();
    let to = (from + 1..len).find(|&i| readable(i).is_some()).unwrap_or(len);
    let after = (to < len).then(|| readable(to)).flatten();
    if before.is_none() && after.is_none() {
        return Ok(0);
    }
    let wanted = (to - from) as usize;
    let found = entries_between(log, queue, before.as_ref(), after.as_ref(), wanted)?;
    if found.len() != wanted {
        tracing::error!(
            topic = queue.topic(),
            queue_id = queue.queue_id(),
            from,
            damaged = wanted,
            found = found.len(),
            "damaged consume-queue entries could not be made again from the log"
        );
        return Ok(0);
    }
    tracing::warn!(
        topic = queue.topic(),
        queue_id = queue.queue_id(),
        from,
        repaired = wanted,
        "damaged consume-queue entries made again from the log"
    );
    queue.repair(from, &found);
    Ok(wanted as u64)
}

/// The entries of `queue` that the records between `before` and `after`
/// (the log's start and end where `None`) make, in order; it stops looking
/// once it has one more than `wanted`, or `wanted` with no `after` to reach.
fn entries_between(
    log: &Arc<CommitLog>,
    queue: &ConsumeQueue,
    before: Option<&Entry>,
    after: Option<&Entry>,
    wanted: usize,
) -> Result<Vec<Entry>> {
    let mut found = Vec::new();
    let fits = |entry: &Entry| {
        before.is_none_or(|b| order(entry) > order(b)) && after.is_none_or(|a| order(entry) < order(a))
    };
    let mut at = before.map_or_else(|| log.start(), |b| b.log_offset);
    let end = after.map_or_else(|| log.write_end(), |a| a.log_offset + 1);
    while at < end && found.len() <= wanted && (after.is_some() || found.len() < wanted) {
        let (made, next) = log.walk_checked(at, |offset, kind, bytes| {
            let mut made = Vec::new();
            entries_of(log, queue, offset, kind, bytes, &mut made);
            made
        })?;
        found.extend(made.into_iter().filter(|e| fits(e)));
        at = next;
    }
    Ok(found)
}

/// The entries the record at `offset` made in `queue` when the dispatcher
/// indexed it (`Dispatcher::index`): an ordinary message's, a delivery's of a
/// message of this queue, a deliveries record's for each timer whose record
/// reads, a schedule's occurrence record's, an occurrences record's for
/// each entry whose schedule reads. A record that does not read
/// makes none, as it made none then.
fn entries_of(
    log: &Arc<CommitLog>,
    queue: &ConsumeQueue,
    offset: u64,
    kind: RecordKind,
    bytes: &[u8],
    made: &mut Vec<Entry>,
) {
    let ours = |topic: &str, queue_id: u32| topic == queue.topic() && queue_id == queue.queue_id();
    match kind {
        RecordKind::Message => {
            if let Ok(view) = MessageView::parse(bytes)
                && queue_entry::indexed_as_sent(view.topic, view.timer_deliver_at_ms().is_some())
                && ours(view.topic, view.queue_id)
            {
                made.push(message_entry(&view, offset, bytes.len(), view.store_time_ms, 0));
            }
        }
        RecordKind::Delivery => {
            let Ok(delivery) = DeliveryView::parse(bytes) else { return };
            let _ = with_message(log, delivery.message_offset, |view| {
                if ours(view.topic, view.queue_id) {
                    made.push(delivery_entry(view, offset, &delivery));
                }
            });
        }
        RecordKind::Reschedule => {
            // A schedule's occurrence record delivers the timer it replaced.
            let Ok(occurrence) = RescheduleView::parse(bytes) else { return };
            if !occurrence.delivers() {
                return;
            }
            let _ = with_message(log, occurrence.message_offset, |view| {
                if view.schedule && ours(view.topic, view.queue_id) {
                    let time = occurrence.rescheduled_at_ms;
                    made.push(message_entry(view, offset, bytes.len(), time, FLAG_TIMER_DELIVERY));
                }
            });
        }
        RecordKind::Deliveries => {
            let Ok(view) = DeliveriesView::parse(bytes) else { return };
            if !ours(view.topic, view.queue_id) {
                return;
            }
            for (i, (timer, tag_hash)) in view.timers().enumerate() {
                if with_message(log, timer, |_| ()).is_some() {
                    made.push(deliveries_entry(offset, bytes.len(), &view, i, tag_hash));
                }
            }
        }
        // Each entry delivers an occurrence of its schedule, as an occurrence record does.
        RecordKind::Occurrences => {
            let Ok(view) = OccurrencesView::parse(bytes, offset) else { return };
            for (i, (_, occurrence)) in view.entries().enumerate() {
                let _ = with_message(log, occurrence.message_offset, |schedule| {
                    if schedule.schedule && ours(schedule.topic, schedule.queue_id) {
                        let time = occurrence.rescheduled_at_ms;
                        made.push(message_entry(schedule, offset, bytes.len(), time, batch_flags(i)));
                    }
                });
            }
        }
        _ => {}
    }
}

/// Calls `f` with the message of the timer whose record is at `timer` (the
/// message, or a reschedule record naming it), if it reads.
fn with_message<R>(log: &CommitLog, timer: u64, f: impl FnOnce(&MessageView<'_>) -> R) -> Option<R> {
    let message = match log.visit_checked(timer, |_, kind, bytes| match kind {
        RecordKind::Reschedule => RescheduleView::parse(bytes).ok().map(|r| r.message_offset),
        _ => Some(timer),
    }) {
        Ok((Some(message), _)) => message,
        _ => return None,
    };
    let (made, _) = log
        .visit_checked(message, |_, kind, bytes| {
            (kind == RecordKind::Message).then(|| MessageView::parse(bytes).ok().map(|v| f(&v))).flatten()
        })
        .ok()?;
    made
}
