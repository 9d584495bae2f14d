//! The hierarchical timing wheel with one-second slots, persisted in a
//! memory-mapped wheel file whose slots head chains in the timer log.
//!
//! # Geometry
//! | level | slot covers | slots | level spans |
//! |---|---|---|---|
//! | 0 | 1 s | 2^16 + 64 | 18.2 h |
//! | 1 | 2^15 s (9.1 h) | 2^13 | 8.5 years |
//! | 2 | 2^27 s (4.25 years) | 2^11 | 8,700 years |
//!
//! Level 0 holds every timer due within about 2^16 s (18.2 h) of the oldest
//! second still holding undelivered timers, so the legacy range (up to 2 h)
//! and business delays of hours never leave it; the slot of such a second is
//! never reused for a later one (see `place`).
//! A coarser window is *cascaded* one window before it begins: window `w` of
//! level 1 is re-indexed into level 0 when second `(w - 1) * 2^15` is loaded,
//! and at that moment all of it fits level 0 (it ends before `s + 2^16`).
//! Level 2 cascades into level 1 the same way. So a timer is re-indexed at most
//! once per level it descends, and only its 28-byte timer-log entry is copied,
//! never the message. Level 2 reaches past the year 9999, the latest deliver
//! time accepted.
//!
//! Loading second `s` reads its level-0 slot chain (a bounded number of entries
//! per tick) into memory one second ahead of the clock, sorted once by
//! (deliver time, commit-log offset); timers are handed out at their own
//! millisecond. Slots are never cleared: each records the absolute window it
//! holds, so a slot whose window has passed is stale and is simply overwritten
//! when reused.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{CorruptionKind, Error, Result};
use crate::format::slot::{SLOT_LEN, Slot};
use crate::format::timer_entry::TimerEntry;
use crate::format::{FILE_HEADER_LEN, FileHeader, WHEEL_MAGIC, check_file_header};
use crate::mmap::{MapWriter, Mapped};
use crate::timer::ledger::{CancelLedger, LEDGER_DIR, LedgerEntry};
use crate::timer::loaded::Loaded;
use crate::timer::log::TimerLog;
use crate::timer::tails::Tails;

/// One level of the wheel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Level {
    /// A slot covers `1 << window_shift` seconds.
    pub window_shift: u32,
    pub slots: u64,
}

pub(crate) const LEVELS: [Level; 3] = [
    Level { window_shift: 0, slots: (1 << 16) + LOAD_AHEAD },
    Level { window_shift: 15, slots: 1 << 13 },
    Level { window_shift: 27, slots: 1 << 11 },
];
/// How many seconds the wheel may load past the oldest second still holding
/// undelivered timers (its tick second).
const LOAD_AHEAD: u64 = 64;
/// Level 0 takes a timer due before `tick second + L0_SPAN`: its slot count,
/// so no slot of a second that may still hold undelivered timers (or be
/// reloaded after a restart) is reused for a later second. A level-1 window
/// cascaded one window early, with the tick second at most `LOAD_AHEAD`
/// behind, fits whole.
const L0_SPAN: u64 = LEVELS[0].slots;
pub(crate) const TOTAL_SLOTS: u64 = LEVELS[0].slots + LEVELS[1].slots + LEVELS[2].slots;

/// The wheel file header's `a`: which geometry the file was laid out for.
pub(crate) const GEOMETRY_ID: u64 = 0x0210_0F0D_1B0B;

/// A timer: the message it delivers and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Timer {
    pub deliver_at_ms: u64,
    pub message_offset: u64,
}

/// Index of the slot holding `window` of `level`, counted over all levels.
pub(crate) fn slot_index(level: usize, window: u64) -> u64 {
    let first: u64 = LEVELS[..level].iter().map(|l| l.slots).sum();
    first + window % LEVELS[level].slots
}

/// The level and window a timer due in second `sec` goes to, when `cur` is the
/// next second to load and `tick` the oldest second that may hold undelivered
/// timers. `None`: it is due already.
pub(crate) fn place(sec: u64, cur: u64, tick: u64) -> Option<(usize, u64)> {
    if sec < cur {
        return None;
    }
    if sec < tick.min(cur) + L0_SPAN {
        return Some((0, sec));
    }
    let (w1, c1) = (sec >> LEVELS[1].window_shift, cur >> LEVELS[1].window_shift);
    if w1 - c1 < LEVELS[1].slots {
        return Some((1, w1));
    }
    Some((2, sec >> LEVELS[2].window_shift))
}

/// Whether `window` of `level` (1 or 2) still waits to be cascaded, once
/// every second up to `loaded_through` is loaded.
pub(crate) fn not_yet_cascaded(level: usize, window: u64, loaded_through: u64) -> bool {
    window > (loaded_through >> LEVELS[level].window_shift) + 1
}

/// Pending timers per level from the entries of unloaded slots (`entries`)
/// and how many of them are cancel entries (`cancels`).
pub(crate) fn net_pending(entries: [u64; 3], cancels: [u64; 3]) -> [u64; 3] {
    // Cancel entries are not timers, and each removes one timer on its own
    // level or a coarser one (where the timer waits to cascade).
    let mut counts = entries;
    let mut carry = 0;
    for (count, cancels) in counts.iter_mut().zip(cancels) {
        *count = count.saturating_sub(cancels);
        let remove = cancels + carry;
        let taken = remove.min(*count);
        *count -= taken;
        carry = remove - taken;
    }
    counts
}

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

/// A level-0 slot being read into memory, a bounded number of entries per tick.
struct Prefetch {
    second: u64,
    slot: u64,
    cursor: u64,
    remaining: u32,
    timers: Vec<Timer>,
    /// Messages whose timers a cancel entry in this slot removes.
    cancels: HashSet<u64>,
    /// Cancel entries the slot record counts.
    cancel_entries: u32,
}

/// The wheel: slots, timer log, and the loaded seconds' timers in memory.
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
    /// Timers in slots not yet loaded or cascaded, per level.
    unloaded: [u64; 3],
    /// Delivered or cancelled before a restart (from the commit log's records
    /// after the checkpoint); dropped when loaded again.
    settled: Settled,
    /// Cancelled timers still ahead: loaded ones (dropped when they come
    /// up), or dropped by a cascade before their second is loaded. Each is
    /// forgotten once its second is behind; the cancel ledger answers then.
    cancelled: HashSet<u64>,
    /// The timers a cascade dropped with their cancel entries, by second:
    /// forgotten from `cancelled` once that second is loaded.
    cancelled_ahead: BTreeMap<u64, Vec<u64>>,
    /// Cancel entries in slots not yet loaded, per level (for the pending count).
    cancel_entries: [u64; 3],
    /// Every cancel answered `Cancelled`, on disk: answers a repeated cancel
    /// once the timer's second is handed out and forgotten (also after a restart).
    ledger: CancelLedger,
    /// Timers cancelled by an entry in a slot not yet loaded (a second cancel is a no-op).
    slot_cancels: HashSet<u64>,
    /// Loaded timers cancelled and not yet come up (still counted by `loaded`).
    cancelled_loaded: u64,
    /// Commit-log offsets the dispatcher replays after a restart: their timers
    /// may be indexed twice, in slots of different seconds (a late timer sits
    /// in the slot of a later second), so the copies need not come up together.
    replay_range: std::ops::Range<u64>,
    /// Timers of the replay range handed out so far: a second copy is dropped.
    replay_seen: HashSet<u64>,
    /// Timers a resumed wheel already holds in entries the replay (or a
    /// redone cascade) would write again: such an insert is skipped.
    preindexed: Preindexed,
    /// The timer logs' ends that go with the replay start (see [`note_preindexed`](Self::note_preindexed)).
    replay_start_ends: [u64; 2],
    /// Seconds up to this one may have been loaded before the last restart.
    reloaded_through: u64,
    /// The mark given at open.
    open_mark: u64,
    /// Timer-log entries written by cascades (re-indexing), for stats and tests.
    reindexed: u64,
    /// Each slot's window and count, as last written: the once-a-second
    /// gauges read these instead of decoding and checksumming 75,840 slot
    /// records on the ticking thread (measured: 31-46 ms a second, the
    /// ticker's worst lateness tail).
    slot_counts: Vec<SlotCount>,
    /// Chains of slots reused for a new window since this open: (level, old
    /// window, first entry). A restart from an older checkpoint may still
    /// read the old chain (a power loss can leave the slot's old record on
    /// disk), so its timer-log files are kept until that window has passed.
    retired: Vec<(usize, u64, u64)>,
}

/// A slot's window and count, mirrored in memory.
#[derive(Debug, Clone, Copy, Default)]
struct SlotCount {
    window: u64,
    count: u32,
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

/// Timers known to have fired or been cancelled, by message offset.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settled {
    pub delivered: HashSet<u64>,
    pub cancelled: HashSet<u64>,
    /// The cancel records read, in log order, for the cancel ledger.
    pub cancel_records: Vec<LedgerEntry>,
}

impl Settled {
    fn contains(&self, offset: &u64) -> bool {
        self.delivered.contains(offset) || self.cancelled.contains(offset)
    }
}

/// Where a cancel finds its timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelTarget {
    AlreadyCancelled,
    AlreadyDelivered,
    /// In a slot not loaded yet: a cancel entry goes there.
    Slot,
    /// In the second being read in.
    Prefetching,
    /// Loaded in memory, not yet handed out.
    Loaded,
}

/// What [`Wheel::cancel`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelState {
    Cancelled,
    AlreadyDelivered,
}

/// Where a wheel resumes: the first second not fully delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resume {
    pub tick_second: u64,
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
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
        let path = dir.join("wheel");
        let log_dir = dir.join("timerlog");
        let far_log_dir = dir.join(FAR_LOG_DIR);
        let tails_path = dir.join("tails");
        let ledger_dir = dir.join(LEDGER_DIR);
        if resume.is_none() {
            // Nothing vouches for these files: start over (the commit log is the truth).
            for stale in [&path, &log_dir, &far_log_dir, &tails_path, &ledger_dir] {
                let _ = std::fs::remove_file(stale);
                let _ = std::fs::remove_dir_all(stale);
            }
        }
        let size = FILE_HEADER_LEN as u64 + TOTAL_SLOTS * SLOT_LEN as u64;
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
            TimerLog::open(&log_dir, entries_per_log_file, None)?,
            TimerLog::open(&far_log_dir, entries_per_log_file, None)?,
        ];
        let tails = Tails::open(dir, TOTAL_SLOTS)?;
        let ledger = CancelLedger::open(dir, mark)?;
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
            unloaded: [0; 3],
            settled,
            cancelled: HashSet::new(),
            cancelled_ahead: BTreeMap::new(),
            cancel_entries: [0; 3],
            ledger,
            slot_cancels: HashSet::new(),
            cancelled_loaded: 0,
            replay_range: 0..0,
            replay_seen: HashSet::new(),
            preindexed: Preindexed::default(),
            replay_start_ends: [0; 2],
            // Before a restart the wheel loaded at most one second past the
            // clock (a clock that moved back since may have let it load more).
            reloaded_through: if resume.is_some() { now_ms / 1000 + 2 } else { 0 },
            open_mark: mark,
            reindexed: 0,
            slot_counts: vec![SlotCount::default(); TOTAL_SLOTS as usize],
            retired: Vec::new(),
        };
        wheel.count_unloaded()?;
        wheel.replay_start_ends = wheel.timer_log_ends();
        Ok(wheel)
    }

    /// After a resume, notes the timers held in entries past `ends` (the
    /// timer logs' ends when the wheel had received every timer below the
    /// replay start, from the checkpoint) in slots this wheel will still load
    /// or cascade. The replay sends those timers again, and a cascade redone
    /// since the checkpoint moves some again: each such insert is skipped as
    /// often as the timer has such entries, so no timer is held twice (and
    /// counted twice as pending). Reads only the entries past `ends`.
    pub fn note_preindexed(&mut self, ends: [u64; 2]) -> Result<()> {
        let _span = tracing::info_span!("note_preindexed", near_from = ends[0], far_from = ends[1]).entered();
        let mut offsets = Vec::new();
        for (level, l) in LEVELS.iter().enumerate() {
            let (log, end) = (&self.logs[log_of(level)], ends[log_of(level)]);
            for i in 0..l.slots {
                let index = slot_index(level, i);
                let SlotCount { window, count } = self.slot_counts[index as usize];
                if count == 0 || !self.is_live(level, window) {
                    continue;
                }
                let mut at = self.read_slot(index)?.head;
                while at != 0 && at >= end {
                    let entry = log.read_linked(at)?;
                    // A late timer sits in the slot of a later second (see
                    // `insert`), where a cancel would not find it: the replay
                    // indexes it again, and the copy that comes up second is dropped.
                    let late = level == 0 && entry.deliver_at_ms / 1000 != window;
                    if !entry.cancel && !late {
                        offsets.push((entry.message_offset, level));
                    }
                    at = entry.prev;
                }
            }
        }
        tracing::info!(timers = offsets.len(), "timers indexed after the checkpoint found in the wheel");
        self.preindexed = Preindexed::new(offsets);
        self.replay_start_ends = ends;
        Ok(())
    }

    /// The timer logs' ends that go with the replay start of this open: what
    /// the checkpoint records until the first progress after it.
    pub fn replay_start_ends(&self) -> [u64; 2] {
        self.replay_start_ends
    }

    /// The near and far timer logs' ends (next entry indexes).
    pub fn timer_log_ends(&self) -> [u64; 2] {
        [self.logs[0].end(), self.logs[1].end()]
    }

    /// Whether every slot still holding timers starts a chain that exists:
    /// its head entry is below the timer log's end and passes its checksum.
    /// After a power loss the wheel file may be newer than the timer log; a
    /// broken chain cannot be followed, so the caller rebuilds the wheel.
    pub fn chains_intact(&self) -> bool {
        LEVELS.iter().enumerate().all(|(level, l)| {
            (0..l.slots).all(|i| match self.read_slot(slot_index(level, i)) {
                Ok(slot) if slot.count == 0 || !self.is_live(level, slot.window) => true,
                Ok(slot) => {
                    let log = &self.logs[log_of(level)];
                    slot.head != 0 && slot.head < log.end() && log.read_linked(slot.head).is_ok()
                }
                Err(_) => false,
            })
        })
    }

    fn count_unloaded(&mut self) -> Result<()> {
        for (level, l) in LEVELS.iter().enumerate() {
            for i in 0..l.slots {
                let index = slot_index(level, i);
                let slot = self.read_slot(index)?;
                self.slot_counts[index as usize] = SlotCount { window: slot.window, count: slot.count };
                if slot.count > 0 && self.is_live(level, slot.window) {
                    self.unloaded[level] += u64::from(slot.count);
                    self.cancel_entries[level] += u64::from(slot.cancels);
                }
            }
        }
        Ok(())
    }

    /// Whether a slot holding `window` of `level` still holds unloaded timers.
    fn is_live(&self, level: usize, window: u64) -> bool {
        match level {
            0 => window > self.loaded_through,
            _ => not_yet_cascaded(level, window, self.loaded_through),
        }
    }

    fn slot_offset(index: u64) -> usize {
        FILE_HEADER_LEN + index as usize * SLOT_LEN
    }

    fn read_slot(&self, index: u64) -> Result<Slot> {
        let at = Self::slot_offset(index);
        Slot::decode(self.file.view(at, SLOT_LEN), index)
            .map_err(|kind| Error::corruption(&self.path, at as u64, kind))
    }

    fn write_slot(&mut self, index: u64, slot: &Slot) {
        let at = Self::slot_offset(index);
        self.file.unpublished_mut(at, SLOT_LEN).copy_from_slice(&slot.encode(index));
        self.slot_counts[index as usize] = SlotCount { window: slot.window, count: slot.count };
    }

    fn slot_error(&self, index: u64, why: String) -> Error {
        Error::corruption(&self.path, Self::slot_offset(index) as u64, CorruptionKind::BadReference(why))
    }

    /// Declares the commit-log range the dispatcher replays after this open.
    pub fn set_replay_range(&mut self, range: std::ops::Range<u64>) {
        self.replay_range = range;
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
        if self.settled.contains(&timer.message_offset) {
            // Fired or cancelled before a restart: the replay sends it again.
            return Ok(false);
        }
        if self.preindexed.take(timer.message_offset, level) {
            return Ok(true);
        }
        let sec = timer.deliver_at_ms / 1000;
        if sec <= self.loaded_through {
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
            return Ok(true);
        }
        if let Some(prefetch) = &mut self.prefetch
            && prefetch.second == sec
        {
            // The walk started below this entry, so it is not read twice.
            prefetch.timers.push(timer);
            return self.append_to_slot(0, sec, timer, false).map(|()| true);
        }
        let (level, window) = self.place(sec).expect("a second not yet loaded");
        self.append_to_slot(level, window, timer, false)?;
        self.unloaded[level] += 1;
        Ok(true)
    }

    fn place(&self, sec: u64) -> Option<(usize, u64)> {
        place(sec, self.loaded_through + 1, self.tick_second())
    }

    /// Cancels a pending timer. Not yet loaded: a cancel entry goes to the
    /// slot its second maps to now, which is where the timer is or will be
    /// cascaded to, so one lookup suffices whatever the level (never
    /// O(pending)). Loaded: it is dropped when it comes up. A timer of a
    /// second already handed out answers `AlreadyDelivered`, unless the cancel
    /// ledger has it. The cancel record and the ledger entry are the caller's
    /// (see [`record_cancel`](Self::record_cancel)).
    pub fn cancel(&mut self, timer: Timer) -> Result<CancelState> {
        let where_ = self.locate_for_cancel(&timer)?;
        self.apply_cancel(timer, where_)
    }

    /// What cancelling `timer` would answer, without changing anything: the
    /// caller writes the cancel record before [`apply_cancel`](Self::apply_cancel).
    pub fn locate_for_cancel(&self, timer: &Timer) -> Result<CancelTarget> {
        let offset = timer.message_offset;
        if self.settled.cancelled.contains(&offset)
            || self.cancelled.contains(&offset)
            || self.slot_cancels.contains(&offset)
        {
            return Ok(CancelTarget::AlreadyCancelled);
        }
        if self.settled.delivered.contains(&offset) {
            return Ok(CancelTarget::AlreadyDelivered);
        }
        let sec = timer.deliver_at_ms / 1000;
        if self.prefetch.as_ref().is_some_and(|p| p.second == sec) {
            return Ok(CancelTarget::Prefetching);
        }
        if sec > self.loaded_through {
            return Ok(CancelTarget::Slot);
        }
        // Loaded: pending exactly if not yet handed out (a replayed copy may have been).
        if self.loaded.contains(timer) && !self.replay_seen.contains(&offset) {
            return Ok(CancelTarget::Loaded);
        }
        // Handed out or dropped: only the ledger still knows which (read only
        // here, where the memory of this session has nothing to say).
        if self.ledger.contains(offset)? {
            return Ok(CancelTarget::AlreadyCancelled);
        }
        Ok(CancelTarget::AlreadyDelivered)
    }

    /// Enters a cancel the store answered `Cancelled` in the ledger, with
    /// its cancel record's commit-log offset (records come in log order).
    pub fn record_cancel(&mut self, timer: Timer, cancel_offset: u64) -> Result<()> {
        self.ledger.record(timer, cancel_offset)
    }

    /// Enters the cancel records recovery read into the ledger (after any
    /// relocated ones: the ledger is in log order).
    pub fn record_recovered_cancels(&mut self) -> Result<()> {
        for entry in std::mem::take(&mut self.settled.cancel_records) {
            self.ledger.record(entry.timer, entry.cancel_offset)?;
        }
        Ok(())
    }

    /// Deletes the ledger files no handle can ask about any more (see [`CancelLedger::reclaim`]).
    pub fn reclaim_ledger(&mut self, log_start: u64, relocated_from_ms: u64) -> Result<u64> {
        self.ledger.reclaim(log_start, relocated_from_ms)
    }

    /// Carries out a cancel located by [`locate_for_cancel`](Self::locate_for_cancel).
    pub fn apply_cancel(&mut self, timer: Timer, target: CancelTarget) -> Result<CancelState> {
        let offset = timer.message_offset;
        let sec = timer.deliver_at_ms / 1000;
        match target {
            CancelTarget::AlreadyCancelled => {}
            CancelTarget::AlreadyDelivered => return Ok(CancelState::AlreadyDelivered),
            CancelTarget::Slot => {
                let (level, window) = self.place(sec).expect("a second not yet loaded");
                self.append_to_slot(level, window, timer, true)?;
                self.unloaded[level] += 1;
                self.cancel_entries[level] += 1;
                self.slot_cancels.insert(offset);
            }
            CancelTarget::Prefetching => {
                // Being read in: the walk started below any entry appended now,
                // so the cancel entry is for a restart, the walk's set for now.
                self.append_to_slot(0, sec, timer, true)?;
                if let Some(prefetch) = &mut self.prefetch {
                    prefetch.cancels.insert(offset);
                }
                self.cancelled.insert(offset);
            }
            CancelTarget::Loaded => {
                self.cancelled.insert(offset);
                self.cancelled_loaded += 1;
            }
        }
        Ok(CancelState::Cancelled)
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
                let first = self.tails.get(index, slot.window).unwrap_or(1);
                self.retired.push((level, slot.window, first));
            }
            slot = Slot { window, head: 0, count: 0, level: level as u32, cancels: 0 };
        }
        let entry = TimerEntry {
            message_offset: timer.message_offset,
            deliver_at_ms: timer.deliver_at_ms,
            prev: slot.head,
            cancel,
        };
        slot.head = self.logs[log_of(level)].append(&entry)?;
        if new_chain {
            self.tails.set(index, window, slot.head);
        }
        slot.count += 1;
        slot.cancels += u32::from(cancel);
        self.write_slot(index, &slot);
        Ok(())
    }

    /// The pure step: loads slots up to one second past `now_ms` (the prefetch,
    /// spread over calls) and returns the timers due at or before `now_ms`, in
    /// (deliver time, commit-log offset) order, at most [`MAX_PER_TICK`] per
    /// call. Never returns a timer early. `mark` is the caller's current mark
    /// (the commit-log end): seconds loaded now remember it.
    pub fn tick(&mut self, now_ms: u64, mark: u64) -> Result<Vec<Timer>> {
        self.last_mark = mark;
        let mut out = Vec::new();
        loop {
            self.advance(now_ms / 1000, mark)?;
            let mut popped = false;
            while out.len() < MAX_PER_TICK {
                match self.loaded.peek() {
                    Some(top) if top.deliver_at_ms <= now_ms => {
                        self.loaded.pop();
                        popped = true;
                        // A timer indexed twice (a cascade redone after a crash)
                        // comes out twice in a row; one from the replay, at any time.
                        let repeat = self.last_popped == Some(top)
                            || (self.replay_range.contains(&top.message_offset)
                                && !self.replay_seen.insert(top.message_offset));
                        if self.cancelled.remove(&top.message_offset) {
                            // A later copy of it is a repeat, and the ledger answers a repeated cancel.
                            if !repeat {
                                self.cancelled_loaded = self.cancelled_loaded.saturating_sub(1);
                            }
                        } else if !repeat {
                            out.push(top);
                        }
                        self.last_popped = Some(top);
                    }
                    _ => break,
                }
            }
            // Popping may have made room to load the next seconds.
            if !popped || out.len() >= MAX_PER_TICK {
                self.forget_cancelled_behind();
                if self.loaded_through > self.reloaded_through && !self.preindexed.is_empty() {
                    // Every cascade the wheel may have done before the restart is redone.
                    self.preindexed = Preindexed::default();
                }
                return Ok(out);
            }
        }
    }

    /// Forgets the cascade-dropped cancelled timers whose second is loaded:
    /// they can no longer be in a slot, and the ledger answers for them.
    fn forget_cancelled_behind(&mut self) {
        while let Some(entry) = self.cancelled_ahead.first_entry()
            && *entry.key() <= self.loaded_through
        {
            for offset in entry.remove() {
                self.forget_cancelled(offset);
            }
        }
    }

    /// Forgets a cancelled timer that can no longer come up from where it
    /// was. The replay may have indexed it a second time, in another second's
    /// slot: that copy counts as handed out already, so it is dropped when it
    /// comes up.
    fn forget_cancelled(&mut self, offset: u64) {
        self.cancelled.remove(&offset);
        if self.replay_range.contains(&offset) {
            self.replay_seen.insert(offset);
        }
    }

    /// Loads level-0 slots up to `now_sec + 1`, cascading coarser windows on the
    /// way and skipping stretches where level 0 is empty. A second not yet due
    /// is read [`PREFETCH_BUDGET`] entries per call; a due one is read at once.
    fn advance(&mut self, now_sec: u64, mark: u64) -> Result<()> {
        loop {
            if let Some(mut prefetch) = self.prefetch.take() {
                let budget = if prefetch.second <= now_sec { u32::MAX } else { PREFETCH_BUDGET };
                self.read_prefetch(&mut prefetch, budget)?;
                if prefetch.remaining > 0 {
                    self.prefetch = Some(prefetch);
                    return Ok(());
                }
                if prefetch.cursor != 0 {
                    return Err(
                        self.slot_error(prefetch.slot, "the chain is longer than the slot count".into())
                    );
                }
                let mark = self.mark_for(prefetch.second, mark);
                let mut timers = prefetch.timers;
                self.cancel_entries[0] =
                    self.cancel_entries[0].saturating_sub(u64::from(prefetch.cancel_entries));
                if !prefetch.cancels.is_empty() {
                    timers.retain(|t| !prefetch.cancels.contains(&t.message_offset));
                    // Applied: from now on the ledger answers a repeated cancel.
                    for offset in &prefetch.cancels {
                        self.slot_cancels.remove(offset);
                        self.forget_cancelled(*offset);
                    }
                }
                // A second left empty (all cancelled, or fired before a
                // restart) is not kept: it would only take a loading place.
                if !timers.is_empty() {
                    self.loaded.push(prefetch.second, mark, timers);
                }
                self.loaded_through = prefetch.second;
                self.loaded_through_mark = mark;
                continue;
            }
            if self.loaded_through > now_sec
                || self.loaded.len() >= MAX_LOADED
                || self.loaded_through + 1 >= self.tick_second() + LOAD_AHEAD
            {
                return Ok(());
            }
            let s = self.loaded_through + 1;
            for level in [2, 1] {
                if s.is_multiple_of(1 << LEVELS[level].window_shift) {
                    self.cascade(level, (s >> LEVELS[level].window_shift) + 1)?;
                }
            }
            if self.unloaded[0] == 0 {
                let next_boundary = ((s >> LEVELS[1].window_shift) + 1) << LEVELS[1].window_shift;
                // With nothing undelivered loaded, no slot needs protecting.
                let holding = self.loaded.len() > 0 || self.prefetch.is_some();
                let limit = if holding {
                    (now_sec + 1).min(self.tick_second() + LOAD_AHEAD - 1)
                } else {
                    now_sec + 1
                };
                self.loaded_through = (next_boundary - 1).min(limit).max(self.loaded_through);
                self.loaded_through_mark = self.mark_for(self.loaded_through, mark);
                continue;
            }
            let index = slot_index(0, s);
            let slot = self.read_slot(index)?;
            if slot.count > 0 && slot.window == s {
                self.unloaded[0] -= u64::from(slot.count);
                let timers = Vec::with_capacity(slot.count as usize);
                self.prefetch = Some(Prefetch {
                    second: s,
                    slot: index,
                    cursor: slot.head,
                    remaining: slot.count,
                    timers,
                    cancels: HashSet::new(),
                    cancel_entries: slot.cancels,
                });
            } else {
                self.loaded_through = s;
                self.loaded_through_mark = self.mark_for(s, mark);
            }
        }
    }

    /// The mark a second loaded now gets. A second the wheel may already have
    /// loaded before the last restart keeps the open-time mark: deliveries
    /// of its timers from before the restart lie after that mark, not after now.
    fn mark_for(&self, second: u64, mark: u64) -> u64 {
        if second <= self.reloaded_through { self.open_mark } else { mark }
    }

    /// Reads up to `budget` entries of a prefetching slot's chain.
    fn read_prefetch(&mut self, prefetch: &mut Prefetch, budget: u32) -> Result<()> {
        for _ in 0..budget.min(prefetch.remaining) {
            if prefetch.cursor == 0 {
                return Err(self.slot_error(prefetch.slot, "the chain is shorter than the slot count".into()));
            }
            let entry = self.logs[0].read_linked(prefetch.cursor)?;
            if entry.cancel {
                prefetch.cancels.insert(entry.message_offset);
            } else if !self.settled.contains(&entry.message_offset) {
                prefetch
                    .timers
                    .push(Timer { deliver_at_ms: entry.deliver_at_ms, message_offset: entry.message_offset });
            }
            prefetch.cursor = entry.prev;
            prefetch.remaining -= 1;
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
        self.unloaded[level] -= u64::from(slot.count);
        // A timer and its cancel entry cancel out here; a cancel entry whose
        // timer is still coarser moves down with it to the same slot.
        let cancels: HashSet<u64> = entries.iter().filter(|e| e.cancel).map(|e| e.message_offset).collect();
        let timers: HashSet<u64> = entries.iter().filter(|e| !e.cancel).map(|e| e.message_offset).collect();
        for entry in entries {
            let timer = Timer { deliver_at_ms: entry.deliver_at_ms, message_offset: entry.message_offset };
            if entry.cancel {
                self.cancel_entries[level] = self.cancel_entries[level].saturating_sub(1);
                self.slot_cancels.remove(&entry.message_offset);
                if timers.contains(&entry.message_offset) {
                    // Applied here: remember it until its second is loaded, so a
                    // later cancel still answers Cancelled (and adds no entry).
                    self.cancelled.insert(entry.message_offset);
                    let second = entry.deliver_at_ms / 1000;
                    self.cancelled_ahead.entry(second).or_default().push(entry.message_offset);
                } else {
                    self.cancel(timer)?;
                }
            } else if !cancels.contains(&entry.message_offset) {
                self.insert_below(timer, level)?;
                self.reindexed += 1;
            }
        }
        Ok(())
    }

    /// The entries of a slot, oldest first, following its chain and checking its count.
    fn read_chain(&self, index: u64, slot: &Slot) -> Result<Vec<TimerEntry>> {
        let mut timers = Vec::with_capacity(slot.count as usize);
        let mut next = slot.head;
        let log = &self.logs[log_of(slot.level as usize)];
        while next != 0 && timers.len() < slot.count as usize {
            let entry = log.read_linked(next)?;
            timers.push(entry);
            next = entry.prev;
        }
        if timers.len() != slot.count as usize || next != 0 {
            return Err(self.slot_error(
                index,
                format!("slot count is {} but its chain holds {} or more", slot.count, timers.len()),
            ));
        }
        timers.reverse();
        Ok(timers)
    }

    /// When the earliest loaded timer is due.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.loaded.peek().map(|t| t.deliver_at_ms)
    }

    /// Whether a second not yet due is being read in, a budget per `tick`.
    pub fn prefetching(&self) -> bool {
        self.prefetch.is_some()
    }

    /// The first second that may still hold undelivered timers: a restart
    /// reloads every level-0 slot from here.
    pub fn tick_second(&self) -> u64 {
        match (self.loaded.oldest(), &self.prefetch) {
            (Some((second, _)), _) => second,
            (None, Some(prefetch)) => prefetch.second,
            (None, None) => self.loaded_through + 1,
        }
    }

    /// A mark before which no delivery of a timer from [`tick_second`](Self::tick_second) on lies.
    pub fn resume_mark(&self) -> u64 {
        self.loaded.oldest().map_or(self.last_mark, |(_, mark)| mark)
    }

    /// Timers indexed and not yet handed out.
    pub fn pending(&self) -> u64 {
        self.pending_per_level().iter().sum()
    }

    /// Pending timers per wheel level (level 0 includes the loaded seconds). A
    /// cancel not yet applied is subtracted from the level its entry is on.
    pub fn pending_per_level(&self) -> [u64; 3] {
        let mut counts = net_pending(self.unloaded, self.cancel_entries);
        counts[0] += (self.loaded.pending() as u64).saturating_sub(self.cancelled_loaded);
        if let Some(prefetch) = &self.prefetch {
            counts[0] += prefetch.timers.len() as u64 + u64::from(prefetch.remaining);
        }
        counts
    }

    /// Pending timers counted by due time: `counts[i]` holds those due before
    /// `bounds_ms[i]` (and at or after the bound before it); the last count
    /// holds the rest. Exact within level 0 (18 h ahead); a coarser window
    /// counts as due at its start.
    ///
    /// The ticking thread runs this every second between deliveries, so it
    /// must be quick: level-0 slots are read only up to the last bound inside
    /// level 0's span (past it, every slot falls in the same count, which is
    /// what the running total of unloaded timers leaves), and loaded seconds
    /// are counted a second at a time.
    pub fn pending_by_due_time(&self, bounds_ms: &[u64]) -> Result<Vec<u64>> {
        let mut counts = vec![0u64; bounds_ms.len() + 1];
        let bucket = |at_ms: u64| bounds_ms.iter().position(|&b| at_ms < b).unwrap_or(bounds_ms.len());
        self.loaded.count_by_due_time(bucket, &mut counts);
        if let Some(p) = &self.prefetch {
            counts[bucket(p.second * 1000)] += p.timers.len() as u64 + u64::from(p.remaining);
        }
        let first = self.loaded_through + 1;
        let span_end_ms = (first + L0_SPAN).saturating_mul(1000);
        let cutoff_ms = bounds_ms.iter().copied().filter(|&b| b < span_end_ms).max().unwrap_or(0);
        let mut counted = 0;
        for sec in (first..first + L0_SPAN).take_while(|sec| sec * 1000 < cutoff_ms) {
            let slot = self.slot_counts[slot_index(0, sec) as usize];
            let prefetching = self.prefetch.as_ref().is_some_and(|p| p.second == sec);
            if slot.count > 0 && slot.window == sec && !prefetching {
                counts[bucket(sec * 1000)] += u64::from(slot.count);
                counted += u64::from(slot.count);
            }
        }
        // No bound lies between the cutoff and the end of the span.
        counts[bucket(cutoff_ms.max(first * 1000))] += self.unloaded[0].saturating_sub(counted);
        self.count_coarse_by_due_time(bucket, &mut counts);
        Ok(counts)
    }

    /// Adds the timers of levels 1 and 2 to `counts[bucket(window start)]`.
    fn count_coarse_by_due_time(&self, bucket: impl Fn(u64) -> usize, counts: &mut [u64]) {
        for level in [1, 2] {
            let shift = LEVELS[level].window_shift;
            for i in 0..LEVELS[level].slots {
                let slot = self.slot_counts[slot_index(level, i) as usize];
                if slot.count > 0 && self.is_live(level, slot.window) {
                    counts[bucket((slot.window << shift).saturating_mul(1000))] += u64::from(slot.count);
                }
            }
        }
    }

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
        appended.extend(self.ledger.files());
        let in_place = vec![Arc::clone(self.tails.shared()), Arc::clone(self.file.shared())];
        FilesToSync { appended, in_place }
    }

    /// Bytes of the wheel file, the tails file, the timer logs and the cancel ledger.
    pub fn disk_bytes(&self) -> u64 {
        let logs: u64 = self.logs.iter().map(TimerLog::disk_bytes).sum();
        self.file.shared().len() as u64 + self.tails.shared().len() as u64 + logs + self.ledger.disk_bytes()
    }

    /// The oldest entry of each timer log that a wheel resumed at
    /// `tick_second` may read: the first entry of every chain it would still
    /// load or cascade. 1 (keep everything) where such a chain's start is unknown.
    pub fn first_needed_entries(&self, tick_second: u64) -> [u64; 2] {
        let loaded_through = tick_second.saturating_sub(1);
        // A resumed wheel appends late timers to the chain of second
        // `loaded_through` (see `insert`), so that chain stays readable too.
        let needed = |level: usize, window: u64| match level {
            0 => window >= loaded_through,
            _ => not_yet_cascaded(level, window, loaded_through),
        };
        let mut first = [self.logs[0].end(), self.logs[1].end()];
        for &(level, window, start) in &self.retired {
            if needed(level, window) {
                first[log_of(level)] = first[log_of(level)].min(start);
            }
        }
        for (level, l) in LEVELS.iter().enumerate() {
            for i in 0..l.slots {
                let index = slot_index(level, i);
                let SlotCount { window, count } = self.slot_counts[index as usize];
                if count > 0 && needed(level, window) {
                    let start = self.tails.get(index, window).unwrap_or(1);
                    first[log_of(level)] = first[log_of(level)].min(start);
                }
            }
        }
        first
    }

    /// Deletes the timer-log files no chain of a wheel resumed at
    /// `tick_second` would read (`tick_second` must be one a checkpoint on
    /// disk vouches for). Returns how many.
    pub fn reclaim_timer_logs(&mut self, tick_second: u64) -> Result<u64> {
        let first = self.first_needed_entries(tick_second);
        let loaded_through = tick_second.saturating_sub(1);
        self.retired.retain(|&(level, window, _)| match level {
            0 => window >= loaded_through,
            _ => not_yet_cascaded(level, window, loaded_through),
        });
        let near = self.logs[0].delete_files_below(first[0])?;
        Ok(near + self.logs[1].delete_files_below(first[1])?)
    }
}

/// Which timer log a slot of `level` chains through.
fn log_of(level: usize) -> usize {
    usize::from(level > 0)
}

/// The far timers' log, beside `timer/timerlog`.
pub(crate) const FAR_LOG_DIR: &str = "timerlog-far";

#[cfg(test)]
mod tests;
