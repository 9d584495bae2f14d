//! What [`Store::pending`](crate::Store::pending) answers: a pending timer
//! with what its message says of it.

use std::sync::Arc;

use crate::commitlog::{CommitLog, LogReader};
use crate::format::record::{MessageView, RecordKind, RescheduleView};
use crate::message::Handle;
use crate::schedule::{PAUSED_AT_MS, Recurrence, SPEC_PROPERTY, Spec};
use crate::timer::Timer;
use crate::timer::wheel::window::PendingEntry;

/// The most bounds one [`Store::pending_counts`](crate::Store::pending_counts)
/// takes: ten years by the day, or a week by the minute, in one call.
pub const MAX_COUNT_BOUNDS: usize = 10_081;

/// A timer that has not fired and is not cancelled, as
/// [`Store::pending`](crate::Store::pending) found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingTimer {
    /// Cancels it.
    pub handle: Handle,
    /// The topic it will be delivered to (shared by the answers of one
    /// query with the same topic: one allocation per topic, not per timer).
    pub topic: Arc<str>,
    /// The queue of that topic.
    pub queue: u32,
    /// Its business key, if it had one.
    pub key: Option<String>,
    /// Its dedup key, if it was put with one (see `Message::dedup_key`).
    pub dedup_key: Option<String>,
    /// When it is due (epoch ms).
    pub deliver_at_ms: u64,
    /// The legacy delay level it was put with, if any.
    pub delay_level: Option<u16>,
    /// The finest wheel level holding it: 0 for the next 18 hours (1 s
    /// slots), 1 for about 8.5 years (9.1 h slots), 2 beyond.
    pub wheel_level: u8,
    /// For a recurring schedule's armed timer: the schedule's state (its
    /// `deliver_at_ms` is then the next occurrence's instant, unless paused).
    pub schedule: Option<ScheduleState>,
}

/// A recurring schedule as its armed timer's records tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleState {
    /// How it recurs (`None` if its spec does not read: it then fires once more, as a timer).
    pub recurrence: Option<Recurrence>,
    /// Occurrences delivered so far.
    pub fired: u64,
    /// Paused (`Store::pause_schedule`): nothing is delivered until it is resumed.
    pub paused: bool,
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
pub(crate) fn describe(log: &Arc<CommitLog>, entries: Vec<PendingEntry>) -> Vec<PendingTimer> {
    // One reader for all: it takes the log's segment table once, not per timer.
    let mut reader = LogReader::new(Arc::clone(log));
    let mut topics = Topics::default();
    let mut described = Vec::with_capacity(entries.len());
    described.extend(entries.into_iter().filter_map(|entry| describe_one(&mut reader, &mut topics, entry)));
    described
}

/// The topics of one answer, each allocated once.
#[derive(Default)]
struct Topics(Vec<Arc<str>>);

impl Topics {
    fn get(&mut self, topic: &str) -> Arc<str> {
        // Most answers name a few topics: a short list beats hashing each name.
        if let Some(known) = self.0.iter().find(|t| &***t == topic) {
            return Arc::clone(known);
        }
        let new: Arc<str> = Arc::from(topic);
        if self.0.len() < 64 {
            self.0.push(Arc::clone(&new));
        }
        new
    }
}

/// What the record a timer is named by says of it.
enum Named {
    Timer(PendingTimer),
    /// A reschedule record, naming the message at this offset, with the
    /// occurrences delivered if it is a schedule's.
    Rescheduled(u64, u64),
    NotAMessage,
}

fn describe_one(log: &mut LogReader, topics: &mut Topics, entry: PendingEntry) -> Option<PendingTimer> {
    // A rescheduled timer is named by its reschedule record, which names the
    // message; most are named by their message, read (and checked) once.
    let mut offset = entry.timer.message_offset;
    let mut fired = 0;
    for _ in 0..2 {
        let visited = log.visit_checked(offset, |at, kind, bytes| match kind {
            RecordKind::Message if at == offset => describe_message(offset, bytes, (entry, fired), topics),
            RecordKind::Reschedule if offset == entry.timer.message_offset => RescheduleView::parse(bytes)
                .map_or(Named::NotAMessage, |r| {
                    Named::Rescheduled(r.message_offset, r.occurrence.map_or(0, |o| o.fired))
                }),
            _ => Named::NotAMessage,
        });
        match visited {
            Ok((Named::Timer(timer), _)) => return Some(timer),
            Ok((Named::Rescheduled(message, occurrences), _)) => (offset, fired) = (message, occurrences),
            Ok((Named::NotAMessage, _)) => break,
            Err(e) => {
                tracing::warn!(offset, error = %e, "a pending timer's message does not check out: left out");
                return None;
            }
        }
    }
    tracing::warn!(offset, "a pending timer's record is not a message: left out");
    None
}

fn describe_message(
    offset: u64,
    bytes: &[u8],
    (entry, fired): (PendingEntry, u64),
    topics: &mut Topics,
) -> Named {
    let Ok(view) = MessageView::parse(bytes) else { return Named::NotAMessage };
    let Some(own_deliver_at_ms) = view.timer_deliver_at_ms() else { return Named::NotAMessage };
    let schedule = view.schedule.then(|| ScheduleState {
        recurrence: schedule_spec(&view).map(|spec| spec.recurrence),
        fired,
        paused: entry.timer.deliver_at_ms == PAUSED_AT_MS,
    });
    Named::Timer(PendingTimer {
        // The handle the put returned: it names the message's own timer.
        handle: Handle { offset, deliver_at_ms: own_deliver_at_ms },
        topic: topics.get(view.topic),
        queue: view.queue_id,
        key: (!view.key.is_empty()).then(|| view.key.to_string()),
        dedup_key: view.dedup_key().map(str::to_string),
        deliver_at_ms: entry.timer.deliver_at_ms,
        delay_level: (view.timing.delay_level != 0).then_some(view.timing.delay_level),
        wheel_level: entry.level,
        schedule,
    })
}

/// The spec a schedule record keeps in its properties, if it reads.
fn schedule_spec(view: &MessageView<'_>) -> Option<Spec> {
    let properties = view.properties().ok()?;
    let (_, text) = properties.iter().find(|(name, _)| name == SPEC_PROPERTY)?;
    Spec::decode(text).ok()
}
