//! The hierarchical timing wheel with one-second slots, persisted in a
//! memory-mapped wheel file whose slots head chains in the timer logs. The
//! geometry (levels, placement, cascades) is `geometry.rs`; the wheel's
//! parts (slot counts, the second being read in, the loaded seconds, what
//! it knows of cancels and of the time before a restart) are `state/`.
//! Here: open, insert, tick, load and cascade. Beside it, each a question
//! put to the wheel: `cancel.rs` (how a cancel finds its timer),
//! `restart.rs` (the recovery contract), `reclaim.rs` (the files it may
//! delete), `gauges.rs` and `census.rs` (pending counts), `window.rs` (the
//! timers due in a window).
//!
//! Loading second `s` reads its level-0 slot chain (a bounded number of entries
//! per tick) into memory one second ahead of the clock, sorted once by
//! (deliver time, commit-log offset); timers are handed out at their own
//! millisecond. Slots are never cleared: each records the absolute window it
//! holds, so a slot whose window has passed is stale and is simply overwritten
//! when reused. A coarser window is cascaded into finer slots one window
//! before it begins; only its 28-byte timer-log entries are copied, never the
//! message.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{CorruptionKind, Error, Result};
use crate::format::chain::{self, Chain, Lookup, WalkError};
use crate::format::layout::{
    CANCEL_LEDGER_DIR, FAR_TIMER_LOG_DIR, PINS_FILE, TAILS_FILE, TIMER_LOG_DIR, WHEEL_FILE,
};
use crate::format::slot::{SLOT_LEN, Slot, slot_position};
use crate::format::timer_entry::TimerEntry;
use crate::format::{FILE_HEADER_LEN, FileHeader, WHEEL_MAGIC, check_file_header};
use crate::mmap::{MapWriter, Mapped};
use crate::timer::Timer;
use crate::timer::geometry::{
    GEOMETRY_ID, LEVELS, TOTAL_SLOTS, WHEEL_FILE_LEN, not_yet_cascaded, place, slot_index, timer_log_of,
    window_of,
};
use crate::timer::ledger::CancelLedger;
use crate::timer::log::{FaultAhead, TimerLog};
use crate::timer::state::cancels::Cancels;
use crate::timer::state::loaded::Loaded;
use crate::timer::state::prefetch::Prefetch;
use crate::timer::state::restart::{Restart, Resume, Settled};
use crate::timer::state::slots::{RetiredChains, SlotCounts};
use crate::timer::tails::Tails;

mod cancel;
mod census;
mod gauges;
mod reclaim;
pub(crate) mod restart;
pub(crate) mod window;

/// Timer-log entries read per `tick` while prefetching a second that is not
/// due yet: about a millisecond of reading, so timers due meanwhile wait about
/// that long (the ticking thread does not sleep while prefetching). The one
/// step that is not spread is sorting the second once it is read: tens of
/// milliseconds for a million timers, before the second begins.
const PREFETCH_BUDGET: u32 = 1_024;
/// Seconds kept loaded at most (the oldest undelivered and those prefetched after it).
const MAX_LOADED: usize = 3;
/// Timers handed out by one `tick` at most, so the caller can interleave other work.
const MAX_PER_TICK: usize = 65_536;

/// What [`Wheel::tick_checked`] runs over a second's timers as it is loaded
/// (the second, and a stretch of its timers).
pub(crate) type Check<'a> = &'a mut dyn FnMut(u64, &mut Vec<Timer>);

/// The wheel: slots, timer logs, and the loaded seconds' timers in memory.
pub(crate) struct Wheel {
    path: PathBuf,
    file: MapWriter,
    /// The timer logs the slots chain through: `[0]` for level 0, whose
    /// chains are read within a day, and `[1]` for levels 1 and 2 (far
    /// timers, whose chains live until they cascade). Kept apart so the near
    /// log's files can be deleted a day after they fill, while far timers
    /// keep only their own files alive.
    logs: [TimerLog; 2],
    /// Where each slot's chain begins, so old timer-log files can be deleted.
    tails: Tails,
    /// Every second up to this one has been loaded into `loaded` (or was empty).
    loaded_through: u64,
    /// The caller's mark when `loaded_through` was loaded.
    loaded_through_mark: u64,
    /// The mark given to the latest `tick`.
    last_mark: u64,
    loaded: Loaded,
    prefetch: Option<Prefetch>,
    last_popped: Option<Timer>,
    /// What the wheel knows of cancels, and the cancel ledger.
    cancels: Cancels,
    /// What the commit log said of the time before this open.
    restart: Restart,
    /// Timer-log entries written by cascades (re-indexing), for stats and tests.
    reindexed: u64,
    /// Each slot's window and count as last written, and the entries in
    /// slots not yet loaded or cascaded, per level.
    slot_counts: SlotCounts,
    /// Chains of slots reused for a new window since this open (see `reclaim.rs`).
    retired: RetiredChains,
    /// The oldest tick second a restart may resume at: that of the older of
    /// the last two checkpoints on disk (see [`set_durable_tick`](Self::set_durable_tick)).
    durable_tick: u64,
    /// A cascade is re-indexing a window (see [`place`](Self::place)).
    cascading: bool,
    /// The slot last written, as written: the next timer of a burst goes to
    /// the same slot, and reading it back from the file (decoded, its
    /// checksum checked) cost every insert. Every write of the file goes
    /// through [`write_slot`](Self::write_slot), which keeps it.
    last_written: Option<(u64, Slot)>,
}

/// The wheel's files a checkpoint syncs.
pub(crate) struct FilesToSync {
    /// Only appended to (timer logs, cancel ledger), with how many bytes of
    /// each hold entries: synced with [`Mapped::flush_appended`], which drops
    /// their page-table entries first (not those of the pages faulted in
    /// ahead of the writer, past the written bytes).
    pub appended: Vec<(Arc<Mapped>, usize)>,
    /// Written in place again and again (wheel slots, chain starts).
    pub in_place: Vec<Arc<Mapped>>,
}

impl Wheel {
    /// Opens the wheel in `dir`. Without `resume` (a new store) it starts
    /// empty at `now_ms`; files left from an earlier wheel are reset. `mark`
    /// is the caller's mark (a commit-log offset) before which no delivery of
    /// a pending timer lies.
    pub fn open(
        dir: &Path,
        entries_per_log_file: u64,
        now_ms: u64,
        resume: Option<Resume>,
        settled: Settled,
        mark: u64,
    ) -> Result<Self> {
        crate::fs::create_dir(dir)?;
        let path = dir.join(WHEEL_FILE);
        if resume.is_none() {
            // Nothing vouches for these files: start over (the commit log is the truth).
            // The pins snapshot goes with the ledger it folds.
            for stale in
                [WHEEL_FILE, TIMER_LOG_DIR, FAR_TIMER_LOG_DIR, TAILS_FILE, CANCEL_LEDGER_DIR, PINS_FILE]
            {
                crate::fs::remove_all(&dir.join(stale))?;
            }
            crate::fs::sync_dir(dir)?;
        }
        let size = WHEEL_FILE_LEN;
        let file = if path.exists() {
            let file = Mapped::open(&path, size)?;
            check_file_header(&path, file.view(0, FILE_HEADER_LEN), WHEEL_MAGIC, GEOMETRY_ID, 0)?;
            file
        } else {
            Mapped::create(&path, size, &FileHeader::new(WHEEL_MAGIC, GEOMETRY_ID, 0).encode())?
        };
        // Entries past the last checkpoint are kept: the replay that follows
        // may index some timers again, and duplicates are dropped when they come due.
        let logs = [
            TimerLog::open(&dir.join(TIMER_LOG_DIR), entries_per_log_file, None)?,
            TimerLog::open(&dir.join(FAR_TIMER_LOG_DIR), entries_per_log_file, None)?,
        ];
        let tails = Tails::open(dir, TOTAL_SLOTS)?;
        let ledger = CancelLedger::open(dir, mark)?;
        // Saturating: a wheel starting at second 0 has loaded nothing.
        let loaded_through = resume.map_or(now_ms / 1000, |r| r.tick_second).saturating_sub(1);
        let mut wheel = Self {
            path,
            file,
            logs,
            tails,
            loaded_through,
            loaded_through_mark: mark,
            last_mark: mark,
            loaded: Loaded::default(),
            prefetch: None,
            last_popped: None,
            cancels: Cancels::new(ledger),
            restart: Restart::new(resume, now_ms, settled, mark),
            reindexed: 0,
            slot_counts: SlotCounts::new(),
            retired: RetiredChains::default(),
            durable_tick: loaded_through + 1,
            cascading: false,
            last_written: None,
        };
        wheel.count_unloaded()?;
        let ends = wheel.timer_log_ends();
        wheel.restart.set_replay_start_ends(ends);
        Ok(wheel)
    }

    /// The near and far timer logs' ends (next entry indexes).
    pub fn timer_log_ends(&self) -> [u64; 2] {
        [self.logs[0].end(), self.logs[1].end()]
    }

    fn count_unloaded(&mut self) -> Result<()> {
        for (level, l) in LEVELS.iter().enumerate() {
            for i in 0..l.slots {
                let index = slot_index(level, i);
                let slot = self.read_slot(index)?;
                self.slot_counts.set(index, &slot);
                if slot.count > 0 && self.is_live(level, slot.window) {
                    self.slot_counts.add_unloaded(level, u64::from(slot.count));
                    self.cancels.count_entries(level, u64::from(slot.cancels));
                }
            }
        }
        Ok(())
    }

    /// Whether a slot holding `window` of `level` still holds unloaded timers.
    fn is_live(&self, level: usize, window: u64) -> bool {
        crate::timer::geometry::is_live(level, window, self.loaded_through)
    }

    fn read_slot(&self, index: u64) -> Result<Slot> {
        if let Some((written, slot)) = self.last_written
            && written == index
        {
            return Ok(slot);
        }
        let at = slot_position(index) as usize;
        Slot::decode(self.file.view(at, SLOT_LEN), index)
            .map_err(|kind| Error::corruption(&self.path, at as u64, kind))
    }

    fn write_slot(&mut self, index: u64, slot: &Slot) {
        let at = slot_position(index) as usize;
        self.file.unpublished_mut(at, SLOT_LEN).copy_from_slice(&slot.encode(index));
        self.slot_counts.set(index, slot);
        self.last_written = Some((index, *slot));
    }

    fn slot_error(&self, index: u64, why: String) -> Error {
        Error::corruption(&self.path, slot_position(index), CorruptionKind::BadReference(why))
    }

    /// Indexes a timer. A timer due in a second already loaded is recorded in
    /// the newest loaded second's slot (so a restart finds it again) and handed
    /// to the loaded timers at once. Returns `false` if it was not indexed:
    /// it fired or was cancelled before a restart.
    pub fn insert(&mut self, timer: Timer) -> Result<bool> {
        self.insert_below(timer, LEVELS.len())
    }

    /// [`insert`](Self::insert), skipped if the timer was indexed before a
    /// restart on a level below `level`, in a slot still to be loaded or
    /// cascaded. A cascade from `level` passes its own level: its slot's own
    /// entries excuse nothing.
    fn insert_below(&mut self, timer: Timer, level: usize) -> Result<bool> {
        if let Some(indexed) = self.restart.excuses(timer.message_offset, level) {
            return Ok(indexed);
        }
        let sec = timer.deliver_at_ms / 1000;
        if sec <= self.loaded_through {
            self.insert_late(timer)?;
            return Ok(true);
        }
        if let Some(prefetch) = &mut self.prefetch
            && prefetch.second() == sec
        {
            // The walk started below this entry, so it is not read twice.
            prefetch.add_indexed(timer);
            return self.append_to_slot(0, sec, timer, false).map(|()| true);
        }
        let (level, window) = self.place(sec).expect("a second not yet loaded");
        self.append_to_slot(level, window, timer, false)?;
        self.slot_counts.add_unloaded(level, 1);
        Ok(true)
    }

    /// Indexes a timer due in a second already loaded: in the newest loaded
    /// second's slot, and into memory to be handed out at once.
    fn insert_late(&mut self, timer: Timer) -> Result<()> {
        let second = self.loaded_through;
        let slot = self.read_slot(slot_index(0, second))?;
        if slot.count > 0 && slot.window != second && self.is_live(0, slot.window) {
            // After a restart the slot may already hold a second the wheel
            // reached before it. The timer is due now: it is handed out in
            // this tick, before the next checkpoint could skip its replay.
            tracing::debug!(second, "late timer kept in memory: its slot holds a later second");
        } else {
            self.append_to_slot(0, second, timer, false)?;
        }
        self.loaded.add_late(second, self.loaded_through_mark, timer);
        Ok(())
    }

    /// Where a timer (or a cancel entry) due in second `sec` goes.
    ///
    /// A level-0 slot is reused for a later second once this wheel has
    /// handed out the second it holds. A restart at a checkpoint on disk
    /// from before that second (its deliveries lost to a power loss) would
    /// reload it and find the later second there instead: its timers would
    /// never fire. So a fresh entry whose slot holds such a second goes to
    /// its level-1 window instead, to come down when that window cascades,
    /// after the next checkpoints. (A cascade itself reuses the slot: a
    /// restart redoes the cascade from the coarser chain, and the slot's
    /// old second is in doubt only while the checkpoints lag a cascade
    /// window behind, when catching up after downtime or a clock jump.)
    fn place(&self, sec: u64) -> Option<(usize, u64)> {
        let (level, window) = place(sec, self.loaded_through + 1, self.tick_second())?;
        if level == 0 && !self.cascading && self.slot_in_doubt(window) {
            let w1 = window_of(1, sec);
            if not_yet_cascaded(1, w1, self.loaded_through) {
                return Some((1, w1));
            }
        }
        Some((level, window))
    }

    /// Whether the level-0 slot of `window` holds another second that a
    /// restart from the checkpoints on disk could still reload.
    fn slot_in_doubt(&self, window: u64) -> bool {
        let held = self.slot_counts.get(slot_index(0, window));
        held.count > 0 && held.window != window && held.window >= self.durable_tick
    }

    /// Tells the wheel the oldest tick second the checkpoints on disk may
    /// resume at, as checkpoints are written (it only grows).
    pub fn set_durable_tick(&mut self, second: u64) {
        self.durable_tick = self.durable_tick.max(second);
    }

    /// Like [`set_durable_tick`](Self::set_durable_tick), at open: a
    /// checkpoint older than this wheel (one a rebuilt wheel starts after)
    /// may be what a restart resumes at.
    pub fn lower_durable_tick(&mut self, second: u64) {
        self.durable_tick = self.durable_tick.min(second);
    }

    /// Appends a timer-log entry (a timer, or a cancel) to the chain of `window`'s slot on `level`.
    fn append_to_slot(&mut self, level: usize, window: u64, timer: Timer, cancel: bool) -> Result<()> {
        let index = slot_index(level, window);
        let mut slot = self.read_slot(index)?;
        let new_chain = slot.count == 0 || slot.window != window;
        if new_chain {
            if slot.count > 0 && self.is_live(level, slot.window) {
                return Err(self.slot_error(
                    index,
                    format!("slot holds live window {} while window {window} belongs there", slot.window),
                ));
            }
            if slot.count > 0 {
                self.retire(level, index, slot.window);
            }
            slot = Slot { window, head: 0, count: 0, level: level as u32, cancels: 0 };
        }
        let entry = TimerEntry {
            message_offset: timer.message_offset,
            deliver_at_ms: timer.deliver_at_ms,
            prev: slot.head,
            cancel,
        };
        slot.head = self.logs[timer_log_of(level)].append(&entry)?;
        if new_chain {
            self.tails.set(index, window, slot.head);
        }
        slot.count += 1;
        slot.cancels += u32::from(cancel);
        self.write_slot(index, &slot);
        Ok(())
    }

    /// [`tick_checked`](Self::tick_checked) with nothing to check (the unit tests).
    #[cfg(test)]
    pub fn tick(&mut self, now_ms: u64, mark: u64) -> Result<Vec<Timer>> {
        self.tick_checked(now_ms, mark, &mut |_, _| {})
    }

    /// The pure step: loads slots up to one second past `now_ms` (the prefetch,
    /// spread over calls) and returns the timers due at or before `now_ms`, in
    /// (deliver time, commit-log offset) order, at most [`MAX_PER_TICK`] per
    /// call. Never returns a timer early. `mark` is the caller's current mark
    /// (the commit-log end): seconds loaded now remember it. `check` runs
    /// over each second's timers as the second is loaded (before any of them
    /// is due) and removes those it does not vouch for; timers indexed into a
    /// second already loaded or being read in come from the dispatcher, which
    /// checked their records.
    pub fn tick_checked(&mut self, now_ms: u64, mark: u64, check: Check<'_>) -> Result<Vec<Timer>> {
        self.last_mark = mark;
        let mut out = Vec::new();
        loop {
            self.advance(now_ms / 1000, mark, check)?;
            let popped = self.pop_due(now_ms, &mut out);
            // Popping may have made room to load the next seconds.
            if !popped || out.len() >= MAX_PER_TICK {
                self.forget_cancelled_behind();
                self.restart.note_loaded_through(self.loaded_through);
                return Ok(out);
            }
        }
    }

    /// Loads what [`tick`](Self::tick) would, handing nothing out: a store
    /// opened without delivery (`delaywheel recover`) reads the seconds it
    /// resumes at, so the timers the recovery scan found fired are dropped
    /// from the counts as loading drops them.
    pub fn load_without_delivering(&mut self, now_ms: u64, mark: u64) -> Result<()> {
        self.last_mark = mark;
        self.advance(now_ms / 1000, mark, &mut |_, _| {})?;
        self.restart.note_loaded_through(self.loaded_through);
        Ok(())
    }

    /// Moves the loaded timers due at `now_ms` to `out` (up to
    /// [`MAX_PER_TICK`]), dropping cancelled ones and second copies. Returns
    /// whether it took any.
    fn pop_due(&mut self, now_ms: u64, out: &mut Vec<Timer>) -> bool {
        let mut popped = false;
        while out.len() < MAX_PER_TICK
            && let Some(top) = self.loaded.pop_due(now_ms)
        {
            popped = true;
            // A timer indexed twice (a cascade redone after a crash)
            // comes out twice in a row; one from the replay, at any time.
            let repeat = self.last_popped == Some(top) || self.restart.seen_again(top.message_offset);
            if self.cancels.take_cancelled(top.message_offset, repeat) {
                // Dropped; a later copy of it is a repeat, and the ledger answers a repeated cancel.
            } else if !repeat {
                out.push(top);
            }
            self.last_popped = Some(top);
        }
        popped
    }

    /// Loads level-0 slots up to `now_sec + 1`, cascading coarser windows on the
    /// way and skipping stretches where level 0 is empty. A second not yet due
    /// is read [`PREFETCH_BUDGET`] entries per call; a due one is read at once.
    fn advance(&mut self, now_sec: u64, mark: u64, check: Check<'_>) -> Result<()> {
        loop {
            if let Some(prefetch) = self.prefetch.take() {
                if !self.continue_prefetch(prefetch, now_sec, mark, check)? {
                    return Ok(());
                }
                continue;
            }
            if self.loaded_through > now_sec
                || self.loaded.len() >= MAX_LOADED
                || self.loaded_through + 1 >= self.tick_second() + crate::timer::geometry::LOAD_AHEAD
            {
                return Ok(());
            }
            self.load_next(now_sec, mark)?;
        }
    }

    /// Reads on in the second being prefetched; once it is read whole, it
    /// is loaded. Returns `false` if the budget ran out first.
    fn continue_prefetch(
        &mut self,
        mut prefetch: Prefetch,
        now_sec: u64,
        mark: u64,
        check: Check<'_>,
    ) -> Result<bool> {
        let budget = if prefetch.second() <= now_sec { u32::MAX } else { PREFETCH_BUDGET };
        self.read_prefetch(&mut prefetch, budget)?;
        // Checked as read, so the cost is spread over the second before.
        prefetch.check_new(check);
        if !prefetch.is_read() {
            self.prefetch = Some(prefetch);
            return Ok(false);
        }
        if prefetch.unread().0 != 0 {
            return Err(self.slot_error(prefetch.slot(), "the chain is longer than the slot count".into()));
        }
        let second = prefetch.second();
        let mark = self.restart.mark_for(second, mark);
        let timers = self.cancels.apply_at_loading(prefetch, &mut self.restart);
        // A second left empty (all cancelled, or fired before a restart) is
        // not kept: it would only take a loading place.
        if !timers.is_empty() {
            self.loaded.push(second, mark, timers);
        }
        self.loaded_through = second;
        self.loaded_through_mark = mark;
        Ok(true)
    }

    /// Loads the next second: cascades the coarser windows that begin one
    /// window after it, then starts reading its slot (or skips ahead to the
    /// next level-1 boundary if level 0 is empty).
    fn load_next(&mut self, now_sec: u64, mark: u64) -> Result<()> {
        let s = self.loaded_through + 1;
        for level in [2, 1] {
            if s.is_multiple_of(1 << LEVELS[level].window_shift) {
                self.cascade(level, (s >> LEVELS[level].window_shift) + 1)?;
            }
        }
        if self.slot_counts.unloaded()[0] == 0 {
            let next_boundary = ((s >> LEVELS[1].window_shift) + 1) << LEVELS[1].window_shift;
            // With nothing undelivered loaded, no slot needs protecting.
            let holding = self.loaded.len() > 0 || self.prefetch.is_some();
            let limit = if holding {
                (now_sec + 1).min(self.tick_second() + crate::timer::geometry::LOAD_AHEAD - 1)
            } else {
                now_sec + 1
            };
            self.loaded_through = (next_boundary - 1).min(limit).max(self.loaded_through);
            self.loaded_through_mark = self.restart.mark_for(self.loaded_through, mark);
            return Ok(());
        }
        let index = slot_index(0, s);
        let slot = self.read_slot(index)?;
        if slot.count > 0 && slot.window == s {
            self.slot_counts.take_unloaded(0, u64::from(slot.count));
            self.prefetch = Some(Prefetch::new(s, index, &slot));
        } else {
            self.loaded_through = s;
            self.loaded_through_mark = self.restart.mark_for(s, mark);
        }
        Ok(())
    }

    /// Reads up to `budget` entries of a prefetching slot's chain.
    fn read_prefetch(&mut self, prefetch: &mut Prefetch, budget: u32) -> Result<()> {
        for _ in 0..budget {
            let Some(at) = prefetch.next_to_read() else { break };
            if at == 0 {
                return Err(
                    self.slot_error(prefetch.slot(), "the chain is shorter than the slot count".into())
                );
            }
            let entry = self.logs[0].read_linked(at)?;
            let settled = !entry.cancel && self.restart.settled_before(entry.message_offset);
            prefetch.read(entry, settled);
        }
        Ok(())
    }

    /// Re-indexes every timer of `window` of `level` one level (or more) down.
    fn cascade(&mut self, level: usize, window: u64) -> Result<()> {
        let index = slot_index(level, window);
        let slot = self.read_slot(index)?;
        if slot.count == 0 || slot.window != window {
            return Ok(());
        }
        let _span = tracing::debug_span!("cascade", level, window, timers = slot.count).entered();
        let entries = self.read_chain(index, &slot)?;
        self.slot_counts.take_unloaded(level, u64::from(slot.count));
        // A timer and its cancel entry cancel out here; a cancel entry whose
        // timer is still coarser moves down with it to the same slot.
        let cancels: HashSet<u64> = entries.iter().filter(|e| e.cancel).map(|e| e.message_offset).collect();
        let timers: HashSet<u64> = entries.iter().filter(|e| !e.cancel).map(|e| e.message_offset).collect();
        self.cascading = true;
        let moved = self.move_down(level, entries, &cancels, &timers);
        self.cascading = false;
        moved
    }

    /// Re-indexes a cascading window's entries below `level`.
    fn move_down(
        &mut self,
        level: usize,
        entries: Vec<TimerEntry>,
        cancels: &HashSet<u64>,
        timers: &HashSet<u64>,
    ) -> Result<()> {
        for entry in entries {
            let timer = Timer { deliver_at_ms: entry.deliver_at_ms, message_offset: entry.message_offset };
            if entry.cancel {
                self.cascade_cancel(level, timer, timers.contains(&entry.message_offset))?;
            } else if !cancels.contains(&entry.message_offset) {
                self.insert_below(timer, level)?;
                self.reindexed += 1;
            }
        }
        Ok(())
    }

    /// The entries of a slot, oldest first, following its chain and checking
    /// it against the slot's counts.
    fn read_chain(&self, index: u64, slot: &Slot) -> Result<Vec<TimerEntry>> {
        let log = &self.logs[timer_log_of(slot.level as usize)];
        let lookup = |at: u64| -> Result<Lookup> {
            Ok(match log.read(at)? {
                Some(entry) => Lookup::Entry(entry),
                None if at < log.first() => Lookup::Deleted,
                None => Lookup::Unwritten,
            })
        };
        match chain::walk(slot, lookup) {
            Ok(Chain { entries, deleted_from: None }) => {
                Ok(entries.into_iter().rev().map(|(_, e)| e).collect())
            }
            Ok(Chain { deleted_from: Some(at), .. }) => {
                Err(self.slot_error(index, format!("the chain reaches entry {at}, whose file was deleted")))
            }
            Err(WalkError::Read(e)) => Err(e),
            Err(WalkError::Broken(why)) => Err(self.slot_error(index, why.to_string())),
        }
    }

    /// When the earliest loaded timer is due.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.loaded.peek().map(|t| t.deliver_at_ms)
    }

    /// Whether a second not yet due is being read in, a budget per `tick`.
    pub fn prefetching(&self) -> bool {
        self.prefetch.is_some()
    }

    /// Whether `timer`'s second is loaded: indexed now, it is handed out
    /// without the check its second's loading gives the timers read then.
    pub fn is_loaded(&self, timer: &Timer) -> bool {
        timer.deliver_at_ms / 1000 <= self.loaded_through
    }

    /// Has `ahead` fault in the timer logs' pages ahead of their appends
    /// (the near log's and the far log's, in that order).
    pub fn fault_ahead_with(&mut self, ahead: &[Arc<FaultAhead>; 2]) {
        for (log, ahead) in self.logs.iter_mut().zip(ahead) {
            log.fault_ahead_with(Arc::clone(ahead));
        }
    }

    /// Whether the slot of `second` is still to be read into memory: not
    /// loaded, nor being read. A timer indexed into such a second is among
    /// those checked as it loads.
    pub fn not_yet_read(&self, second: u64) -> bool {
        second > self.loaded_through && self.prefetch.as_ref().is_none_or(|p| p.second() != second)
    }

    /// The loaded second a timer indexed late is held in (see `insert_late`):
    /// it is handed out before the wheel's tick second passes this one.
    pub fn newest_loaded_second(&self) -> u64 {
        self.loaded_through
    }

    /// The first second that may still hold undelivered timers: a restart
    /// reloads every level-0 slot from here.
    pub fn tick_second(&self) -> u64 {
        match (self.loaded.oldest(), &self.prefetch) {
            (Some((second, _)), _) => second,
            (None, Some(prefetch)) => prefetch.second(),
            (None, None) => self.loaded_through + 1,
        }
    }

    /// A mark before which no delivery of a timer from [`tick_second`](Self::tick_second) on lies.
    pub fn resume_mark(&self) -> u64 {
        self.loaded.oldest().map_or(self.last_mark, |(_, mark)| mark)
    }

    /// Timer-log entries written by cascades since open.
    pub fn reindexed(&self) -> u64 {
        self.reindexed
    }

    /// Timer-log entries written so far, near and far.
    pub fn timer_log_entries(&self) -> u64 {
        self.logs.iter().map(|log| log.end() - 1).sum()
    }

    /// The mapped files to sync for a checkpoint. Syncing them from another
    /// thread is safe (`msync` does not touch content), so the ticking thread
    /// never waits for the disk.
    pub fn files_to_sync(&self) -> FilesToSync {
        let mut appended = self.logs[0].written_files();
        appended.extend(self.logs[1].written_files());
        appended.extend(self.cancels.ledger().files());
        let in_place = vec![Arc::clone(self.tails.shared()), Arc::clone(self.file.shared())];
        FilesToSync { appended, in_place }
    }

    /// Bytes of the wheel file, the tails file, the timer logs and the cancel ledger.
    pub fn disk_bytes(&self) -> u64 {
        let logs: u64 = self.logs.iter().map(TimerLog::disk_bytes).sum();
        self.file.shared().len() as u64
            + self.tails.shared().len() as u64
            + logs
            + self.cancels.ledger().disk_bytes()
    }
}

#[cfg(test)]
mod tests;
