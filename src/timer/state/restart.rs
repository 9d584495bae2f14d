//! What the wheel remembers of the time before this open: the timers the
//! commit log says fired or were cancelled since the checkpoint, the
//! commit-log range the dispatcher replays, and the timers a resumed wheel
//! already holds that the replay (or a redone cascade) sends again. The
//! restart contract that fills it is `wheel/restart.rs`.

use std::collections::HashSet;
use std::ops::Range;

use crate::timer::ledger::LedgerEntry;

/// Where a wheel resumes: the first second not fully delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resume {
    pub tick_second: u64,
}

/// Timers known to have fired or been cancelled (or replaced by a
/// reschedule), by the offset of the record that made them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settled {
    pub delivered: HashSet<u64>,
    pub cancelled: HashSet<u64>,
    /// The cancel and reschedule records read, in log order, for the cancel ledger.
    pub ledger_records: Vec<LedgerEntry>,
}

impl Settled {
    pub fn contains(&self, offset: &u64) -> bool {
        self.delivered.contains(offset) || self.cancelled.contains(offset)
    }
}

/// What the wheel remembers of the time before this open.
#[derive(Debug)]
pub(crate) struct Restart {
    /// Delivered or cancelled before a restart (from the commit log's records
    /// after the checkpoint); dropped when loaded again.
    settled: Settled,
    /// Commit-log offsets the dispatcher replays after a restart: their timers
    /// may be indexed twice, in slots of different seconds (a late timer sits
    /// in the slot of a later second), so the copies need not come up together.
    replay_range: Range<u64>,
    /// Timers of the replay range handed out so far: a second copy is dropped.
    replay_seen: HashSet<u64>,
    /// Timers a resumed wheel already holds in entries the replay (or a
    /// redone cascade) would write again: such an insert is skipped.
    preindexed: Preindexed,
    /// The timer logs' ends that go with the replay start: what the
    /// checkpoint records until the first progress after it.
    replay_start_ends: [u64; 2],
    /// Seconds up to this one may have been loaded before the last restart.
    reloaded_through: u64,
    /// The mark given at open.
    open_mark: u64,
}

impl Restart {
    /// Whether the timer of `offset` was cancelled before the restart.
    pub fn cancelled_before(&self, offset: u64) -> bool {
        self.settled.cancelled.contains(&offset)
    }

    /// Whether the timer of `offset` was delivered before the restart.
    pub fn delivered_before(&self, offset: u64) -> bool {
        self.settled.delivered.contains(&offset)
    }

    /// Whether the timer of `offset` was delivered or cancelled before the restart.
    pub fn settled_before(&self, offset: u64) -> bool {
        self.settled.contains(&offset)
    }

    pub fn new(resume: Option<Resume>, now_ms: u64, settled: Settled, mark: u64) -> Self {
        Self {
            settled,
            replay_range: 0..0,
            replay_seen: HashSet::new(),
            preindexed: Preindexed::default(),
            replay_start_ends: [0; 2],
            // Before a restart the wheel loaded at most one second past the
            // clock (a clock that moved back since may have let it load more).
            reloaded_through: if resume.is_some() { now_ms / 1000 + 2 } else { 0 },
            open_mark: mark,
        }
    }

    /// The timer logs' ends that go with the replay start.
    pub fn replay_start_ends(&self) -> [u64; 2] {
        self.replay_start_ends
    }

    /// Sets the timer logs' ends that go with the replay start.
    pub fn set_replay_start_ends(&mut self, ends: [u64; 2]) {
        self.replay_start_ends = ends;
    }

    /// Declares the commit-log range the dispatcher replays after this open.
    pub fn set_replay_range(&mut self, range: Range<u64>) {
        self.replay_range = range;
    }

    /// Notes the timers (message offset, level of the slot) a resumed wheel
    /// holds in entries the replay or a redone cascade would write again:
    /// each excuses one insert of its timer.
    pub fn set_preindexed(&mut self, entries: Vec<(u64, usize)>) {
        self.preindexed = Preindexed::new(entries);
    }

    /// The cancel and reschedule records recovery read, in log order, for
    /// the cancel ledger (taken once).
    pub fn take_ledger_records(&mut self) -> Vec<LedgerEntry> {
        std::mem::take(&mut self.settled.ledger_records)
    }

    /// Whether an insert of the timer of `offset` is already taken care of:
    /// `Some(false)` it fired or was cancelled before a restart (the replay
    /// sends it again); `Some(true)` the wheel already holds it on a level
    /// below `level`; `None` it must be indexed.
    pub fn excuses(&mut self, offset: u64, level: usize) -> Option<bool> {
        if self.settled.contains(&offset) {
            return Some(false);
        }
        self.preindexed.take(offset, level).then_some(true)
    }

    /// A timer of `offset` comes up: `true` if it is a second copy from the
    /// replay (the first was handed out already).
    pub fn seen_again(&mut self, offset: u64) -> bool {
        self.replay_range.contains(&offset) && !self.replay_seen.insert(offset)
    }

    /// Whether the record at `offset` was in the log when the store opened:
    /// only then can an earlier session have cancelled its timer.
    pub fn before_open(&self, offset: u64) -> bool {
        offset < self.replay_range.end
    }

    /// Whether a copy of the timer of `offset` from the replay was handed out.
    pub fn handed_out(&self, offset: u64) -> bool {
        self.replay_seen.contains(&offset)
    }

    /// A cancelled timer of `offset` can no longer come up from where it
    /// was: a replayed copy elsewhere counts as handed out already.
    pub fn forget(&mut self, offset: u64) {
        if self.replay_range.contains(&offset) {
            self.replay_seen.insert(offset);
        }
    }

    /// The mark a second loaded now gets. A second the wheel may already have
    /// loaded before the last restart keeps the open-time mark: deliveries
    /// of its timers from before the restart lie after that mark, not after now.
    pub fn mark_for(&self, second: u64, mark: u64) -> u64 {
        if second <= self.reloaded_through { self.open_mark } else { mark }
    }

    /// The wheel has loaded every second up to `loaded_through`: once that is
    /// past what it may have loaded before the restart, every cascade it may
    /// have done then is redone, and nothing is excused any more.
    pub fn note_loaded_through(&mut self, loaded_through: u64) {
        if loaded_through > self.reloaded_through && !self.preindexed.is_empty() {
            self.preindexed = Preindexed::default();
        }
    }
}

/// Timers a resumed wheel holds in entries written after its checkpoint,
/// each with the level of its slot, sorted; each may excuse one insert of its timer.
#[derive(Debug, Default)]
struct Preindexed {
    /// (message offset, level), sorted.
    entries: Vec<(u64, usize)>,
    used: Vec<bool>,
}

impl Preindexed {
    fn new(mut entries: Vec<(u64, usize)>) -> Self {
        entries.sort_unstable();
        let used = vec![false; entries.len()];
        Self { entries, used }
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether an entry of the timer of `offset` on a level below `below` is
    /// left to excuse an insert (and uses it, the coarsest first: a replayed
    /// timer found on two levels is the coarser one's, cascaded since).
    fn take(&mut self, offset: u64, below: usize) -> bool {
        let first = self.entries.partition_point(|&(o, _)| o < offset);
        let found = (first..self.entries.len())
            .take_while(|&i| self.entries[i].0 == offset)
            .filter(|&i| !self.used[i] && self.entries[i].1 < below)
            .last();
        if let Some(i) = found {
            self.used[i] = true;
        }
        found.is_some()
    }
}
