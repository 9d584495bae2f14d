//! Pending timers per topic, for [`Stats::pending_by_topic`](crate::Stats::pending_by_topic),
//! and the active and paused recurring schedules, for [`Stats::schedules`](crate::Stats::schedules).
//!
//! The dispatcher counts them as it reads the log: +1 for a timed message,
//! -1 for the delivery or the cancel record that settles it (a reschedule
//! changes nothing: its message stays pending). A schedule's record counts
//! an active schedule too, and the record that settles its timer takes it
//! back; an occurrence record that pauses it counts a paused one, and the
//! occurrence record that resumes it, or a cancel of its paused timer,
//! takes that back. So the counts are a pure
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
use crate::format::topic_counts::{TopicPendingFile, decode, encode};
use crate::schedule::{PAUSED_AT_MS, Replaced, replaced_by};
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
    schedules: ScheduleCounts,
    /// Changed since the last write of the file.
    dirty: bool,
    /// `false` until a recount (see [`recount`]) has made them.
    known: bool,
    /// A recount is still to run (it may fail: then they stay unknown).
    recounting: bool,
}

/// The recurring schedules counted: active (created, not over, not
/// cancelled), and of those the paused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScheduleCounts {
    /// Schedules with an occurrence still to come, paused or not.
    pub active: u64,
    /// Paused ones among them.
    pub paused: u64,
}

/// What a run of records did to the schedules counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ScheduleDelta {
    pub active: i64,
    pub paused: i64,
}

impl ScheduleDelta {
    fn is_zero(self) -> bool {
        self == Self::default()
    }

    fn add(&mut self, other: Self) {
        self.active += other.active;
        self.paused += other.paused;
    }
}

impl ScheduleCounts {
    /// The counts after `delta`; a count that would go below zero is
    /// `None` (the records do not add up).
    fn after(self, delta: ScheduleDelta) -> Option<Self> {
        Some(Self {
            active: self.active.checked_add_signed(delta.active)?,
            paused: self.paused.checked_add_signed(delta.paused)?,
        })
    }
}

/// What one record does to the counts.
enum Effect {
    /// A timed message of this topic (a schedule's record if `schedule`;
    /// an update's if it `replaces` a schedule's armed timer, which it settles).
    Timed {
        topic: String,
        schedule: bool,
        replaces: Option<Replaced>,
    },
    /// Settles the timer named by the record at this offset (a paused
    /// schedule's if `paused`).
    Settles {
        timer: u64,
        paused: bool,
    },
    /// Settles the timers of these records (a deliveries record).
    SettlesAll(Vec<u64>),
    /// Pauses a schedule (`sign` +1) or resumes one (-1, the paused
    /// timer named by the record at `from_timer`).
    Pauses {
        sign: i64,
        from_timer: u64,
    },
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
            schedules: ScheduleCounts::default(),
            dirty: true,
            known: false,
            recounting: true,
        };
        match loaded {
            Some(TopicPendingFile { schedules: None, .. }) => {
                tracing::info!(file = %path.display(), "pending counts without the schedules': recounting")
            }
            Some(TopicPendingFile { through, by_topic, schedules: Some(schedules) }) => {
                match bring_to(log, replay_from, Counted { through, by_topic, schedules }) {
                    Ok(Counted { by_topic, schedules, .. }) => {
                        state = State { by_topic, schedules, known: true, recounting: false, ..state }
                    }
                    Err(e) => {
                        tracing::warn!(file = %path.display(), error = %e, "pending counts per topic: recounting")
                    }
                }
            }
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

    /// The records up to `end` changed `topic`'s count by `delta` (timed
    /// messages +1 each, the records that settled them -1 each) and the
    /// schedules' by `schedules`.
    fn add(&self, topic: &str, delta: i64, schedules: ScheduleDelta, end: u64) {
        let mut state = self.lock();
        match state.schedules.after(schedules) {
            Some(counts) => state.schedules = counts,
            None => debug_assert!(false, "schedules settled that were not counted: {schedules:?}"),
        }
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
        // Written again although no count changed: a restart brings the
        // file forward from its `through` (a million schedules' occurrences,
        // each arming what it settles, left it 467 MB behind after 90 s).
        if offset > state.through {
            state.counted_to(offset);
        }
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

    /// The schedules counted; `None` until the counts are known.
    pub fn schedules(&self) -> Option<ScheduleCounts> {
        let state = self.lock();
        state.known.then_some(state.schedules)
    }

    /// Writes the file if the counts changed since it was last written.
    pub fn persist(&self) -> Result<()> {
        let bytes = {
            let mut state = self.lock();
            if !state.known || !state.dirty {
                return Ok(());
            }
            state.dirty = false;
            encode(state.through, &state.by_topic, state.schedules)
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
            Ok(Counted { by_topic, schedules, .. }) => {
                *state = State {
                    through: replay_from,
                    by_topic,
                    schedules,
                    dirty: true,
                    known: true,
                    recounting: false,
                }
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
    /// The schedules' part, of any topic.
    schedules: ScheduleDelta,
    /// The end of the last record summed in `delta` or `schedules`.
    end: u64,
    /// What the record being indexed does, once it is indexed.
    noted: (i64, ScheduleDelta),
}

impl CountBuffer {
    /// The record being indexed is a timed message of `topic` (`sign`
    /// `+1`) or settles one (`-1`), and does `schedules` to the schedules.
    pub fn note(&mut self, counts: &TopicCounts, topic: &str, sign: i64, schedules: ScheduleDelta) {
        if sign != 0 && self.topic != topic {
            self.flush(counts);
            self.topic.clear();
            self.topic.push_str(topic);
        }
        self.noted = (sign, schedules);
    }

    /// The record being indexed, ending at `end`, is indexed.
    pub fn indexed(&mut self, end: u64) {
        let (sign, schedules) = std::mem::take(&mut self.noted);
        if sign != 0 || !schedules.is_zero() {
            self.delta += sign;
            self.schedules.add(schedules);
            self.end = end;
        }
    }

    /// The record being indexed failed: it will be indexed again.
    pub fn discard(&mut self) {
        self.noted = Default::default();
    }

    /// Adds what was summed to the shared counts.
    pub fn flush(&mut self, counts: &TopicCounts) {
        if self.delta != 0 || !self.schedules.is_zero() {
            let schedules = std::mem::take(&mut self.schedules);
            counts.add(&self.topic, std::mem::take(&mut self.delta), schedules, self.end);
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
            Ok(view) if view.timer_deliver_at_ms().is_some() => Effect::Timed {
                topic: view.topic.to_string(),
                schedule: view.schedule,
                replaces: replaced_by(&view),
            },
            _ => Effect::None,
        },
        RecordKind::Delivery => DeliveryView::parse(bytes)
            .map_or(Effect::None, |d| Effect::Settles { timer: d.message_offset, paused: false }),
        RecordKind::Deliveries => DeliveriesView::parse(bytes)
            .map_or(Effect::None, |d| Effect::SettlesAll(d.timers().map(|(timer, _)| timer).collect())),
        RecordKind::Cancel => CancelView::parse(bytes).map_or(Effect::None, |c| Effect::Settles {
            timer: c.message_offset,
            paused: c.deliver_at_ms == PAUSED_AT_MS,
        }),
        RecordKind::Reschedule => match RescheduleView::parse(bytes) {
            Ok(r) if pauses(&r) != 0 => Effect::Pauses { sign: pauses(&r), from_timer: r.from_timer },
            _ => Effect::None,
        },
        _ => Effect::None,
    }
}

/// What the reschedule record `r` does to the paused schedules: an
/// occurrence record to the paused instant pauses one (`+1`), one from it
/// resumes one (`-1`).
pub(crate) fn pauses(r: &RescheduleView) -> i64 {
    if r.occurrence.is_none() {
        return 0;
    }
    i64::from(r.deliver_at_ms == PAUSED_AT_MS) - i64::from(r.from_deliver_at_ms == PAUSED_AT_MS)
}

/// The message a timer belongs to: the record at `timer_offset` is the
/// message or a reschedule record naming it.
pub(crate) struct Named {
    pub offset: u64,
    pub topic: String,
    /// The message is a recurring schedule's record.
    pub schedule: bool,
}

/// The message a timer belongs to, its topic, and whether it is a
/// schedule's. `None` if it cannot be read (retention deleted it): the
/// dispatcher skipped it too.
pub(crate) fn message_of(log: &mut LogReader, timer_offset: u64) -> Option<Named> {
    let mut at = timer_offset;
    for _ in 0..2 {
        // A lookup, not a walk: a timer may be named by an occurrences
        // record's entry, which a lookup reads as the record it stands for.
        let (next, _) = log
            .visit_checking(at, false, |_, kind, bytes| match kind {
                RecordKind::Message => {
                    MessageView::parse(bytes).ok().map(|v| Ok((v.topic.to_string(), v.schedule)))
                }
                RecordKind::Reschedule => RescheduleView::parse(bytes).ok().map(|r| Err(r.message_offset)),
                _ => None,
            })
            .ok()?;
        match next? {
            Ok((topic, schedule)) => return Some(Named { offset: at, topic, schedule }),
            Err(message) => at = message,
        }
    }
    None
}

/// What the settling of a timer of `named` (paused if `paused`) takes from the schedules.
pub(crate) fn settled_schedule(named: &Named, paused: bool) -> ScheduleDelta {
    match named.schedule {
        true => ScheduleDelta { active: -1, paused: -i64::from(paused) },
        false => ScheduleDelta::default(),
    }
}

/// The counts below one offset, as the file keeps them.
pub(crate) struct Counted {
    pub through: u64,
    pub by_topic: HashMap<String, u64>,
    pub schedules: ScheduleCounts,
}

/// `counted`, brought to `to` by applying the records in between (or
/// taking them back).
fn bring_to(log: &Arc<CommitLog>, to: u64, counted: Counted) -> Result<Counted> {
    let Counted { through, mut by_topic, mut schedules } = counted;
    let (from, end, forward) = if through <= to { (through, to, true) } else { (to, through, false) };
    if from < log.start() || end > log.write_end() {
        let why = format!("counted to {through}, the log holds {}..{}", log.start(), log.write_end());
        return Err(Error::invalid("topic counts", why));
    }
    let below_zero = |what: &str| Error::invalid("topic counts", format!("{what} would count below zero"));
    // Reads the messages the settling records name.
    let mut named = LogReader::new(Arc::clone(log));
    let mut at = from;
    let mut apply = |topic: Option<String>, sign: i64, delta: ScheduleDelta| -> Result<()> {
        let sign = if forward { sign } else { -sign };
        let delta = match forward {
            true => delta,
            false => ScheduleDelta { active: -delta.active, paused: -delta.paused },
        };
        schedules = schedules.after(delta).ok_or_else(|| below_zero("a schedule count"))?;
        match (topic, sign) {
            (Some(topic), 1) => *by_topic.entry(topic).or_default() += 1,
            (Some(topic), -1) if by_topic.contains_key(&topic) => settle(&mut by_topic, &topic),
            (Some(topic), -1) => return Err(below_zero(&format!("topic {topic:?}"))),
            _ => {}
        }
        Ok(())
    };
    while at < end {
        let (effect, next) = log.visit_trusted(at, |_, kind, bytes| effect(kind, bytes))?;
        match effect {
            Effect::Timed { topic, schedule, replaces } => {
                apply(Some(topic), 1, ScheduleDelta { active: i64::from(schedule), paused: 0 })?;
                if let Some(r) = replaces
                    && let Some(message) = message_of(&mut named, r.timer_offset)
                {
                    let delta = settled_schedule(&message, r.deliver_at_ms == PAUSED_AT_MS);
                    apply(Some(message.topic), -1, delta)?;
                }
            }
            Effect::Settles { timer, paused } => {
                if let Some(message) = message_of(&mut named, timer) {
                    let delta = settled_schedule(&message, paused);
                    apply(Some(message.topic), -1, delta)?;
                }
            }
            Effect::SettlesAll(timers) => {
                for timer in timers {
                    if let Some(message) = message_of(&mut named, timer) {
                        apply(Some(message.topic), -1, ScheduleDelta::default())?;
                    }
                }
            }
            Effect::Pauses { sign, .. } => apply(None, 0, ScheduleDelta { active: 0, paused: sign })?,
            Effect::None => {}
        }
        at = next;
    }
    Ok(Counted { through: to, by_topic, schedules })
}

/// A relocated copy that may count: a timed message (its topic, and
/// whether it is a schedule's), or a paused schedule's occurrence record.
enum Relocated {
    Timed { topic: String, schedule: bool },
    Paused,
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
/// A relocated paused schedule's occurrence record counts a paused
/// schedule by the same rule. The wheel is asked before the log's end is
/// read, so a timer that fires after the answer was pending in it, and one
/// that fired before has its delivery record below that end.
fn recount(log: &Arc<CommitLog>, scheduler: &dyn SchedulerFront, replay_from: u64) -> Result<Counted> {
    let _span = tracing::info_span!("recount_topic_pending", replay_from).entered();
    let area = log.relocated();
    let mut relocated = Vec::new();
    for i in 0..area.entries() {
        let copy = area.entry(i)?;
        let counts = log.visit_trusted(copy.original_offset, |_, kind, bytes| match kind {
            RecordKind::Message => MessageView::parse(bytes).ok().and_then(|v| {
                let timed = Relocated::Timed { topic: v.topic.to_string(), schedule: v.schedule };
                v.timer_deliver_at_ms().map(|at| (at, timed))
            }),
            RecordKind::Reschedule => RescheduleView::parse(bytes)
                .ok()
                .filter(|r| r.occurrence.is_some() && r.deliver_at_ms == PAUSED_AT_MS)
                .map(|r| (r.deliver_at_ms, Relocated::Paused)),
            _ => None,
        });
        if let Ok((Some((deliver_at_ms, counts)), _)) = counts {
            relocated.push((Timer { deliver_at_ms, message_offset: copy.original_offset }, counts));
        }
    }
    let timers: Vec<Timer> = relocated.iter().map(|(t, _)| *t).collect();
    let pending = scheduler.pending_of(timers)?;
    // Signed while counting: a settling record may come before the relocated
    // copy it settles is counted.
    let mut by_topic: HashMap<String, i64> = HashMap::new();
    let mut schedules = ScheduleDelta::default();
    // The relocated records a record in the log settles.
    let mut settled_in_log = HashSet::new();
    let mut named = LogReader::new(Arc::clone(log));
    let (mut at, end) = (log.start(), log.write_end());
    while at < end {
        let (effect, next) = log.visit_trusted(at, |_, kind, bytes| effect(kind, bytes))?;
        let counted = at < replay_from;
        let mut settles = |timer: u64, paused: bool| {
            if let Some(message) = message_of(&mut named, timer) {
                if message.offset < log.start() {
                    settled_in_log.insert(message.offset);
                }
                if timer < log.start() {
                    settled_in_log.insert(timer);
                }
                if counted {
                    *by_topic.entry(message.topic.clone()).or_default() -= 1;
                    schedules.add(settled_schedule(&message, paused));
                }
            }
        };
        match effect {
            Effect::Timed { topic, schedule, replaces } => {
                if let Some(r) = replaces {
                    settles(r.timer_offset, r.deliver_at_ms == PAUSED_AT_MS);
                }
                if counted {
                    *by_topic.entry(topic).or_default() += 1;
                    schedules.add(ScheduleDelta { active: i64::from(schedule), paused: 0 });
                }
            }
            Effect::Settles { timer, paused } => settles(timer, paused),
            Effect::SettlesAll(timers) => timers.into_iter().for_each(|timer| settles(timer, false)),
            Effect::Pauses { sign, from_timer } => {
                if sign < 0 && from_timer < log.start() {
                    settled_in_log.insert(from_timer);
                }
                if counted {
                    schedules.add(ScheduleDelta { active: 0, paused: sign });
                }
            }
            _ => {}
        }
        at = next;
    }
    for ((timer, counts), pending) in relocated.into_iter().zip(pending) {
        if pending.is_none() && !settled_in_log.contains(&timer.message_offset) {
            continue;
        }
        match counts {
            Relocated::Timed { topic, schedule } => {
                *by_topic.entry(topic).or_default() += 1;
                schedules.add(ScheduleDelta { active: i64::from(schedule), paused: 0 });
            }
            Relocated::Paused => schedules.add(ScheduleDelta { active: 0, paused: 1 }),
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
    let schedules = ScheduleCounts::default().after(schedules).ok_or_else(|| {
        Error::invalid("topic counts", format!("the recount of the schedules is {schedules:?}"))
    })?;
    Ok(Counted { through: replay_from, by_topic: counts, schedules })
}
