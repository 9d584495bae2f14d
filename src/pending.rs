//! What [`Store::pending`](crate::Store::pending) answers: a pending timer
//! with what its message says of it.

use crate::commitlog::CommitLog;
use crate::format::record::{MessageView, RecordKind, RescheduleView};
use crate::message::Handle;
use crate::timer::Timer;
use crate::timer::window::PendingEntry;

/// A timer that has not fired and is not cancelled, as
/// [`Store::pending`](crate::Store::pending) found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingTimer {
    /// Cancels it.
    pub handle: Handle,
    /// The topic it will be delivered to.
    pub topic: String,
    /// The queue of that topic.
    pub queue: u32,
    /// Its business key, if it had one.
    pub key: Option<String>,
    /// When it is due (epoch ms).
    pub deliver_at_ms: u64,
    /// The legacy delay level it was put with, if any.
    pub delay_level: Option<u16>,
    /// The finest wheel level holding it: 0 for the next 18 hours (1 s
    /// slots), 1 for about 8.5 years (9.1 h slots), 2 beyond.
    pub wheel_level: u8,
}

/// The own timers of the timed messages at `candidates` whose topic and key
/// are these (the key index names every message of a hash).
pub(crate) fn timers_with_key(log: &CommitLog, candidates: Vec<u64>, topic: &str, key: &str) -> Vec<Timer> {
    let timer_of = |offset: u64| {
        let visited = log.visit_checked(offset, |at, kind, bytes| {
            let view =
                MessageView::parse(bytes).ok().filter(|_| at == offset && kind == RecordKind::Message)?;
            let deliver_at_ms = view.timer_deliver_at_ms()?;
            (view.topic == topic && view.key == key)
                .then_some(Timer { deliver_at_ms, message_offset: offset })
        });
        match visited {
            Ok((timer, _)) => timer,
            // Its window passed long ago: it fired.
            Err(crate::error::Error::Reclaimed { .. }) => None,
            Err(e) => {
                tracing::warn!(offset, error = %e, "a message the key index names does not check out: left out");
                None
            }
        }
    };
    candidates.into_iter().filter_map(timer_of).collect()
}

/// The timers of `entries` with their messages' fields, in the same order.
/// A message that no longer checks out is left out (with a warning): the
/// ticking thread will not deliver it either (see `Stats::quarantined`).
pub(crate) fn describe(log: &CommitLog, entries: Vec<PendingEntry>) -> Vec<PendingTimer> {
    entries.into_iter().filter_map(|entry| describe_one(log, entry)).collect()
}

fn describe_one(log: &CommitLog, entry: PendingEntry) -> Option<PendingTimer> {
    // A rescheduled timer is named by its reschedule record, which names the message.
    let timer_record = entry.timer.message_offset;
    let offset = match log.visit_checked(timer_record, |_, kind, bytes| {
        (kind == RecordKind::Reschedule).then(|| RescheduleView::parse(bytes).ok().map(|r| r.message_offset))
    }) {
        Ok((Some(Some(message)), _)) => message,
        Ok((Some(None), _)) => {
            tracing::warn!(offset = timer_record, "a pending timer's reschedule record is damaged: left out");
            return None;
        }
        _ => timer_record,
    };
    let described = log.visit_checked(offset, |at, kind, bytes| {
        let view = MessageView::parse(bytes).ok().filter(|_| at == offset && kind == RecordKind::Message)?;
        Some(PendingTimer {
            // The handle the put returned: it names the message's own timer.
            handle: Handle { offset, deliver_at_ms: view.timer_deliver_at_ms()? },
            topic: view.topic.to_string(),
            queue: view.queue_id,
            key: (!view.key.is_empty()).then(|| view.key.to_string()),
            deliver_at_ms: entry.timer.deliver_at_ms,
            delay_level: (view.timing.delay_level != 0).then_some(view.timing.delay_level),
            wheel_level: entry.level,
        })
    });
    match described {
        Ok((Some(timer), _)) => Some(timer),
        Ok((None, _)) => {
            tracing::warn!(offset, "a pending timer's record is not a message: left out");
            None
        }
        Err(e) => {
            tracing::warn!(offset, error = %e, "a pending timer's message does not check out: left out");
            None
        }
    }
}
