//! Pending timers per topic, for [`Stats::pending_by_topic`](crate::Stats::pending_by_topic).
//!
//! The dispatcher counts them as it reads the log: +1 for a timed message,
//! -1 for the delivery or the cancel record that settles it (a reschedule
//! changes nothing: its message stays pending). So the counts are a pure
//! function of the records below `through`, which makes them an index like
//! any other: persisted now and then to `index/topic_pending` with the
//! offset they are counted to, and brought to the dispatcher's replay start
//! at open by reading the records between the two (applying them forward,
//! or taking them back). Without a usable file (none yet, damaged, or a
//! power loss cut the log below its offset) the dispatcher recounts before
//! it dispatches anything: see [`recount`].
//!
//! The wheel scheduler only: the buckets deliver by copying messages.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::commitlog::{CommitLog, LogReader};
use crate::error::{Error, Result};
use crate::format::record::{
    CancelView, DeliveriesView, DeliveryView, MessageView, RecordKind, RescheduleView,
};
use crate::format::topic_counts::{decode, encode};
use crate::scheduler::SchedulerFront;
use crate::sync::Locked;
use crate::timer::Timer;

/// The counts and the offset they are counted to.
pub(crate) struct TopicCounts {
    path: PathBuf,
    state: Mutex<State>,
}

struct State {
    /// Every record below this is counted.
    through: u64,
    by_topic: HashMap<String, u64>,
    /// Changed since the last write of the file.
    dirty: bool,
    /// `false` until a recount (see [`recount`]) has made them.
    known: bool,
    /// A recount is still to run (it may fail: then they stay unknown).
    recounting: bool,
}

/// What one record does to the counts.
enum Effect {
    /// A timed message of this topic.
    Timed(String),
    /// Settles the timer of the message at this offset.
    Settles(u64),
    /// Settles the timers of these records (a deliveries record).
    SettlesAll(Vec<u64>),
    None,
}

impl TopicCounts {
    /// The counts for a log whose dispatcher resumes at `replay_from`: the
    /// file's, brought there; unknown (to be recounted) if there is none usable.
    pub fn open(path: &Path, log: &Arc<CommitLog>, replay_from: u64) -> Self {
        let loaded = std::fs::read(path).ok().and_then(|bytes| decode(&bytes));
        let mut state = State {
            through: replay_from,
            by_topic: HashMap::new(),
            dirty: true,
            known: false,
            recounting: true,
        };
        match loaded {
            Some((through, by_topic)) => match bring_to(log, through, replay_from, by_topic) {
                Ok(by_topic) => state = State { by_topic, known: true, recounting: false, ..state },
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "pending counts per topic: recounting")
                }
            },
            None => tracing::info!(file = %path.display(), "no pending counts per topic: recounting"),
        }
        Self { path: path.to_path_buf(), state: Mutex::new(state) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Whether the counts must be recounted before the dispatcher starts.
    pub fn recounting(&self) -> bool {
        self.lock().recounting
    }

    /// The records up to `end` changed `topic`'s count by `delta`: timed
    /// messages (+1 each) and the records that settled them (-1 each).
    fn add(&self, topic: &str, delta: i64, end: u64) {
        let mut state = self.lock();
        if delta > 0 {
            match state.by_topic.get_mut(topic) {
                Some(count) => *count += delta.unsigned_abs(),
                None => drop(state.by_topic.insert(topic.to_string(), delta.unsigned_abs())),
            }
        } else {
            for _ in 0..delta.unsigned_abs() {
                settle(&mut state.by_topic, topic);
            }
        }
        state.counted_to(end);
    }

    /// Every record below `offset` is counted.
    pub fn counted_below(&self, offset: u64) {
        let mut state = self.lock();
        debug_assert!(offset >= state.through, "the counts never go back");
        state.through = offset;
    }

    /// The `n` topics with the most pending timers (most first) and the sum
    /// of the others; `None` until the counts are known.
    pub fn top(&self, n: usize) -> Option<(Vec<(String, u64)>, u64)> {
        let state = self.lock();
        if !state.known {
            return None;
        }
        let mut heap = BinaryHeap::with_capacity(n + 1);
        let mut total = 0u64;
        for (topic, &count) in &state.by_topic {
            total += count;
            // The smallest count, then the greatest name, goes first.
            heap.push(Reverse((count, Reverse(topic.as_str()))));
            if heap.len() > n {
                heap.pop();
            }
        }
        let mut top: Vec<(String, u64)> =
            heap.into_iter().map(|Reverse((count, Reverse(topic)))| (topic.to_string(), count)).collect();
        top.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let named: u64 = top.iter().map(|(_, c)| c).sum();
        Some((top, total - named))
    }

    /// Writes the file if the counts changed since it was last written.
    pub fn persist(&self) -> Result<()> {
        let bytes = {
            let mut state = self.lock();
            if !state.known || !state.dirty {
                return Ok(());
            }
            state.dirty = false;
            encode(state.through, &state.by_topic)
        };
        crate::fs::write_atomically(&self.path, &bytes)
    }

    /// Recounts from the log, on the dispatcher's thread before it
    /// dispatches anything from `replay_from` (see [`recount`]). A failure
    /// is logged, and leaves the counts unknown: `Stats` then names no topic.
    pub fn recount(&self, log: &Arc<CommitLog>, scheduler: &dyn SchedulerFront, replay_from: u64) {
        let counted = recount(log, scheduler, replay_from);
        let mut state = self.lock();
        state.recounting = false;
        match counted {
            Ok(by_topic) => {
                *state = State { through: replay_from, by_topic, dirty: true, known: true, recounting: false }
            }
            Err(e) => tracing::error!(error = %e, "could not count the pending timers per topic"),
        }
    }
}

/// The dispatcher's side: what the records of one topic in a row did,
/// summed before the shared counts are touched (a burst to one topic then
/// costs a comparison per record, not a lock and a hash). The shared counts
/// never include a record past the offset they say they are counted to.
#[derive(Default)]
pub(crate) struct CountBuffer {
    topic: String,
    delta: i64,
    /// The end of the last record summed in `delta`.
    end: u64,
    /// What the record being indexed does, once it is indexed.
    noted: i64,
}

impl CountBuffer {
    /// The record being indexed is a timed message of `topic` (`+1`) or
    /// settles one (`-1`).
    pub fn note(&mut self, counts: &TopicCounts, topic: &str, sign: i64) {
        if self.topic != topic {
            self.flush(counts);
            self.topic.clear();
            self.topic.push_str(topic);
        }
        self.noted = sign;
    }

    /// The record being indexed, ending at `end`, is indexed.
    pub fn indexed(&mut self, end: u64) {
        if self.noted != 0 {
            self.delta += std::mem::take(&mut self.noted);
            self.end = end;
        }
    }

    /// The record being indexed failed: it will be indexed again.
    pub fn discard(&mut self) {
        self.noted = 0;
    }

    /// Adds what was summed to the shared counts.
    pub fn flush(&mut self, counts: &TopicCounts) {
        if self.delta != 0 {
            counts.add(&self.topic, std::mem::take(&mut self.delta), self.end);
        }
    }
}

impl State {
    fn counted_to(&mut self, end: u64) {
        debug_assert!(end >= self.through, "records are counted in log order");
        self.through = end;
        self.dirty = true;
    }
}

fn settle(by_topic: &mut HashMap<String, u64>, topic: &str) {
    let Some(count) = by_topic.get_mut(topic) else {
        debug_assert!(false, "a timer of topic {topic:?} settled that was not counted");
        return;
    };
    *count -= 1;
    if *count == 0 {
        by_topic.remove(topic);
    }
}

/// What the record at `offset` does to the counts (the dispatcher's rules).
fn effect(kind: RecordKind, bytes: &[u8]) -> Effect {
    match kind {
        RecordKind::Message => match MessageView::parse(bytes) {
            Ok(view) if view.timer_deliver_at_ms().is_some() => Effect::Timed(view.topic.to_string()),
            _ => Effect::None,
        },
        RecordKind::Delivery => {
            DeliveryView::parse(bytes).map_or(Effect::None, |d| Effect::Settles(d.message_offset))
        }
        RecordKind::Deliveries => DeliveriesView::parse(bytes)
            .map_or(Effect::None, |d| Effect::SettlesAll(d.timers().map(|(timer, _)| timer).collect())),
        RecordKind::Cancel => {
            CancelView::parse(bytes).map_or(Effect::None, |c| Effect::Settles(c.message_offset))
        }
        _ => Effect::None,
    }
}

/// The message a timer belongs to, and its topic: the record at
/// `timer_offset` is the message or a reschedule record naming it. `None`
/// if it cannot be read (retention deleted it): the dispatcher skipped it too.
pub(crate) fn message_of(log: &mut LogReader, timer_offset: u64) -> Option<(u64, String)> {
    let mut at = timer_offset;
    for _ in 0..2 {
        let (next, _) = log
            .visit_trusted(at, |_, kind, bytes| match kind {
                RecordKind::Message => MessageView::parse(bytes).ok().map(|v| Ok(v.topic.to_string())),
                RecordKind::Reschedule => RescheduleView::parse(bytes).ok().map(|r| Err(r.message_offset)),
                _ => None,
            })
            .ok()?;
        match next? {
            Ok(topic) => return Some((at, topic)),
            Err(message) => at = message,
        }
    }
    None
}

/// `by_topic`, counted below `through`, brought to `to` by applying the
/// records in between (or taking them back).
fn bring_to(
    log: &Arc<CommitLog>,
    through: u64,
    to: u64,
    mut by_topic: HashMap<String, u64>,
) -> Result<HashMap<String, u64>> {
    let (from, end, forward) = if through <= to { (through, to, true) } else { (to, through, false) };
    if from < log.start() || end > log.write_end() {
        let why = format!("counted to {through}, the log holds {}..{}", log.start(), log.write_end());
        return Err(Error::invalid("topic counts", why));
    }
    // Reads the messages the settling records name.
    let mut named = LogReader::new(Arc::clone(log));
    let mut at = from;
    let mut apply = |topic: String, up: bool| -> Result<()> {
        match up {
            true => *by_topic.entry(topic).or_default() += 1,
            false if by_topic.contains_key(&topic) => settle(&mut by_topic, &topic),
            false => {
                return Err(Error::invalid(
                    "topic counts",
                    format!("topic {topic:?} would count below zero"),
                ));
            }
        }
        Ok(())
    };
    while at < end {
        let (effect, next) = log.visit_trusted(at, |_, kind, bytes| effect(kind, bytes))?;
        match effect {
            Effect::Timed(topic) => apply(topic, forward)?,
            Effect::Settles(timer) => {
                if let Some((_, topic)) = message_of(&mut named, timer) {
                    apply(topic, !forward)?;
                }
            }
            Effect::SettlesAll(timers) => {
                for timer in timers {
                    if let Some((_, topic)) = message_of(&mut named, timer) {
                        apply(topic, !forward)?;
                    }
                }
            }
            Effect::None => {}
        }
        at = next;
    }
    Ok(by_topic)
}

/// Counts from the log what the dispatcher would have counted below
/// `replay_from`, with the ticking thread running and the dispatcher and
/// retention not yet (retention waits for the counts: a segment it deleted
/// during the count would hide timers from it).
///
/// The timed messages and settling records of the log count as they come.
/// A relocated copy's timed message lies below the oldest segment, so its
/// +1 is not in the log any more: it counts if the wheel says it is pending
/// now, or if a record in the log settles it (that record counts -1 now, or
/// in the replay). One whose settling record was deleted counts neither.
/// The wheel is asked before the log's end is read, so a timer that fires
/// after the answer was pending in it, and one that fired before has its
/// delivery record below that end.
fn recount(
    log: &Arc<CommitLog>,
    scheduler: &dyn SchedulerFront,
    replay_from: u64,
) -> Result<HashMap<String, u64>> {
    let _span = tracing::info_span!("recount_topic_pending", replay_from).entered();
    let area = log.relocated();
    let mut relocated = Vec::new();
    for i in 0..area.entries() {
        let copy = area.entry(i)?;
        let timed = log.visit_trusted(copy.original_offset, |_, kind, bytes| match kind {
            RecordKind::Message => MessageView::parse(bytes)
                .ok()
                .and_then(|v| v.timer_deliver_at_ms().map(|at| (at, v.topic.to_string()))),
            _ => None,
        });
        if let Ok((Some((deliver_at_ms, topic)), _)) = timed {
            relocated.push((Timer { deliver_at_ms, message_offset: copy.original_offset }, topic));
        }
    }
    let timers: Vec<Timer> = relocated.iter().map(|(t, _)| *t).collect();
    let pending = scheduler.pending_of(timers)?;
    // Signed while counting: a settling record may come before the relocated
    // copy it settles is counted.
    let mut by_topic: HashMap<String, i64> = HashMap::new();
    let mut settled_in_log = HashSet::new();
    let mut named = LogReader::new(Arc::clone(log));
    let (mut at, end) = (log.start(), log.write_end());
    while at < end {
        let (effect, next) = log.visit_trusted(at, |_, kind, bytes| effect(kind, bytes))?;
        let mut settles = |timer: u64| {
            if let Some((message, topic)) = message_of(&mut named, timer) {
                if message < log.start() {
                    settled_in_log.insert(message);
                }
                if at < replay_from {
                    *by_topic.entry(topic).or_default() -= 1;
                }
            }
        };
        match effect {
            Effect::Timed(topic) if at < replay_from => *by_topic.entry(topic).or_default() += 1,
            Effect::Settles(timer) => settles(timer),
            Effect::SettlesAll(timers) => timers.into_iter().for_each(settles),
            _ => {}
        }
        at = next;
    }
    for ((timer, topic), pending) in relocated.into_iter().zip(pending) {
        if pending.is_some() || settled_in_log.contains(&timer.message_offset) {
            *by_topic.entry(topic).or_default() += 1;
        }
    }
    let mut counts = HashMap::with_capacity(by_topic.len());
    for (topic, count) in by_topic {
        match u64::try_from(count) {
            Ok(0) => {}
            Ok(count) => drop(counts.insert(topic, count)),
            Err(_) => {
                return Err(Error::invalid(
                    "topic counts",
                    format!("the recount of topic {topic:?} is {count}"),
                ));
            }
        }
    }
    Ok(counts)
}
