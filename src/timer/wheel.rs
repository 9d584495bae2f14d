//! The hierarchical timing wheel with one-second slots, persisted in a
//! memory-mapped wheel file whose slots head chains in the timer log.
//!
//! # Geometry
//! | level | slot covers | slots | level spans |
//! |---|---|---|---|
//! | 0 | 1 s | 2^16 | 18.2 h |
//! | 1 | 2^15 s (9.1 h) | 2^13 | 8.5 years |
//! | 2 | 2^27 s (4.25 years) | 2^11 | 8,700 years |
//!
//! Level 0 holds every timer due within 2^16 s of the next second to load, so
//! the legacy range (up to 2 h) and business delays of hours never leave it.
//! A coarser window is *cascaded* one window before it begins: window `w` of
//! level 1 is re-indexed into level 0 when second `(w - 1) * 2^15` is loaded,
//! and at that moment all of it fits level 0 (it ends before `s + 2^16`).
//! Level 2 cascades into level 1 the same way. So a timer is re-indexed at most
//! once per level it descends, and only its 28-byte timer-log entry is copied,
//! never the message. Level 2 reaches past the year 9999, the latest deliver
//! time accepted.
//!
//! Loading second `s` reads its level-0 slot chain into an in-memory heap
//! ordered by (deliver time, commit-log offset), one second ahead of the
//! clock; the heap hands out timers at their own millisecond. Slots are never
//! cleared: each records the absolute window it holds, so a slot whose window
//! has passed is stale and is simply overwritten when reused.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::path::{Path, PathBuf};

use crate::error::{CorruptionKind, Error, Result};
use crate::format::{
    FILE_HEADER_LEN, FileHeader, WHEEL_MAGIC, check_file_header, crc_at, get_u32, get_u64, put_u32, put_u64,
};
use crate::mmap::{MapWriter, Mapped};
use crate::timer::log::{TimerEntry, TimerLog};

/// One level of the wheel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Level {
    /// A slot covers `1 << window_shift` seconds.
    pub window_shift: u32,
    pub slots: u64,
}

pub(crate) const LEVELS: [Level; 3] = [
    Level { window_shift: 0, slots: 1 << 16 },
    Level { window_shift: 15, slots: 1 << 13 },
    Level { window_shift: 27, slots: 1 << 11 },
];
const L0_SPAN: u64 = LEVELS[0].slots;
const TOTAL_SLOTS: u64 = LEVELS[0].slots + LEVELS[1].slots + LEVELS[2].slots;

/// Bytes per slot record in the wheel file.
pub(crate) const SLOT_LEN: usize = 32;
const S_WINDOW: usize = 0;
const S_HEAD: usize = S_WINDOW + 8;
const S_COUNT: usize = S_HEAD + 8;
const S_LEVEL: usize = S_COUNT + 4;
const S_RESERVED: usize = S_LEVEL + 4;
const S_CRC: usize = S_RESERVED + 4;
const _: () = assert!(S_CRC + 4 == SLOT_LEN);
/// The wheel file header's `a`: which geometry the file was laid out for.
const GEOMETRY_ID: u64 = 0x0010_0F0D_1B0B;

/// A timer: the message it delivers and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Timer {
    pub deliver_at_ms: u64,
    pub message_offset: u64,
}

/// One slot record: which absolute window it holds, its chain head, and an exact count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Slot {
    pub window: u64,
    pub head: u64,
    pub count: u32,
    pub level: u32,
}

impl Slot {
    pub fn encode(&self, slot_index: u64) -> [u8; SLOT_LEN] {
        let mut out = [0u8; SLOT_LEN];
        put_u64(&mut out, S_WINDOW, self.window);
        put_u64(&mut out, S_HEAD, self.head);
        put_u32(&mut out, S_COUNT, self.count);
        put_u32(&mut out, S_LEVEL, self.level);
        let crc = crc_at(slot_index, &out[..S_CRC]);
        put_u32(&mut out, S_CRC, crc);
        out
    }

    /// An all-zero record is an empty slot.
    pub fn decode(bytes: &[u8], slot_index: u64) -> std::result::Result<Self, CorruptionKind> {
        let bytes = &bytes[..SLOT_LEN];
        if bytes.iter().all(|&b| b == 0) {
            return Ok(Self::default());
        }
        let stored = get_u32(bytes, S_CRC);
        let computed = crc_at(slot_index, &bytes[..S_CRC]);
        if stored != computed {
            return Err(CorruptionKind::ChecksumMismatch { stored, computed });
        }
        Ok(Self {
            window: get_u64(bytes, S_WINDOW),
            head: get_u64(bytes, S_HEAD),
            count: get_u32(bytes, S_COUNT),
            level: get_u32(bytes, S_LEVEL),
        })
    }
}

/// Index of the slot holding `window` of `level`, counted over all levels.
pub(crate) fn slot_index(level: usize, window: u64) -> u64 {
    let first: u64 = LEVELS[..level].iter().map(|l| l.slots).sum();
    first + window % LEVELS[level].slots
}

/// The level and window a timer due in second `sec` goes to, when `cur` is the
/// next second to load. `None`: it is due already.
pub(crate) fn place(sec: u64, cur: u64) -> Option<(usize, u64)> {
    if sec < cur {
        return None;
    }
    if sec - cur < L0_SPAN {
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
fn not_yet_cascaded(level: usize, window: u64, loaded_through: u64) -> bool {
    window > (loaded_through >> LEVELS[level].window_shift) + 1
}

/// The wheel: slots, timer log, and the loaded seconds' timers in memory.
pub(crate) struct Wheel {
    path: PathBuf,
    file: MapWriter,
    log: TimerLog,
    /// Every second up to this one has had its level-0 slot loaded into `due`.
    loaded_through: u64,
    due: BinaryHeap<Reverse<Timer>>,
    last_popped: Option<Timer>,
    /// Timers in slots not yet loaded or cascaded, per level.
    unloaded: [u64; 3],
    /// Delivered before a restart; dropped when loaded again.
    already_delivered: HashSet<u64>,
    /// Timer-log entries written by cascades (re-indexing), for stats and tests.
    reindexed: u64,
}

/// Where a wheel resumes: the first second not fully delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resume {
    pub tick_second: u64,
}

impl Wheel {
    /// Opens the wheel in `dir`. Without `resume` (a new store) it starts
    /// empty at `now_ms`; files left from an earlier wheel are reset.
    pub fn open(
        dir: &Path,
        entries_per_log_file: u64,
        now_ms: u64,
        resume: Option<Resume>,
        already_delivered: HashSet<u64>,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
        let path = dir.join("wheel");
        let log_dir = dir.join("timerlog");
        if resume.is_none() {
            // Nothing vouches for these files: start over (the commit log is the truth).
            for stale in [&path, &log_dir] {
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
        let log = TimerLog::open(&log_dir, entries_per_log_file, None)?;
        let loaded_through = resume.map_or(now_ms / 1000, |r| r.tick_second).saturating_sub(1);
        let mut wheel = Self {
            path,
            file,
            log,
            loaded_through,
            due: BinaryHeap::new(),
            last_popped: None,
            unloaded: [0; 3],
            already_delivered,
            reindexed: 0,
        };
        wheel.count_unloaded()?;
        Ok(wheel)
    }

    fn count_unloaded(&mut self) -> Result<()> {
        for (level, l) in LEVELS.iter().enumerate() {
            for i in 0..l.slots {
                let slot = self.read_slot(slot_index(level, i))?;
                if slot.count > 0 && self.is_live(level, slot.window) {
                    self.unloaded[level] += u64::from(slot.count);
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

    fn read_slot(&self, index: u64) -> Result<Slot> {
        let at = FILE_HEADER_LEN + index as usize * SLOT_LEN;
        Slot::decode(self.file.view(at, SLOT_LEN), index)
            .map_err(|kind| Error::corruption(&self.path, at as u64, kind))
    }

    fn write_slot(&mut self, index: u64, slot: &Slot) {
        let at = FILE_HEADER_LEN + index as usize * SLOT_LEN;
        self.file.unpublished_mut(at, SLOT_LEN).copy_from_slice(&slot.encode(index));
    }

    /// Indexes a timer: into a slot, or straight into the due heap if its
    /// second is already loaded.
    pub fn insert(&mut self, timer: Timer) -> Result<()> {
        let sec = timer.deliver_at_ms / 1000;
        let Some((level, window)) = place(sec, self.loaded_through + 1) else {
            self.push_due(timer);
            return Ok(());
        };
        let index = slot_index(level, window);
        let mut slot = self.read_slot(index)?;
        if slot.count == 0 || slot.window != window {
            if slot.count > 0 && self.is_live(level, slot.window) {
                let why =
                    format!("slot holds live window {} while window {window} belongs there", slot.window);
                let at = (FILE_HEADER_LEN as u64) + index * SLOT_LEN as u64;
                return Err(Error::corruption(&self.path, at, CorruptionKind::BadReference(why)));
            }
            slot = Slot { window, head: 0, count: 0, level: level as u32 };
        }
        let entry = TimerEntry {
            message_offset: timer.message_offset,
            deliver_at_ms: timer.deliver_at_ms,
            prev: slot.head,
        };
        slot.head = self.log.append(&entry)?;
        slot.count += 1;
        self.write_slot(index, &slot);
        self.unloaded[level] += 1;
        Ok(())
    }

    fn push_due(&mut self, timer: Timer) {
        if !self.already_delivered.contains(&timer.message_offset) {
            self.due.push(Reverse(timer));
        }
    }

    /// The pure step: loads slots up to one second past `now_ms` (the prefetch)
    /// and returns every timer due at or before `now_ms`, in (deliver time,
    /// commit-log offset) order. Never returns a timer early.
    pub fn tick(&mut self, now_ms: u64) -> Result<Vec<Timer>> {
        self.load_through(now_ms / 1000 + 1)?;
        let mut out = Vec::new();
        while let Some(&Reverse(top)) = self.due.peek() {
            if top.deliver_at_ms > now_ms {
                break;
            }
            self.due.pop();
            // A timer indexed twice (replay after a crash) comes out twice in a row.
            if self.last_popped != Some(top) {
                out.push(top);
                self.last_popped = Some(top);
            }
        }
        Ok(out)
    }

    /// Loads every level-0 slot up to second `target`, cascading coarser
    /// windows on the way, and skipping stretches where level 0 is empty.
    fn load_through(&mut self, target: u64) -> Result<()> {
        while self.loaded_through < target {
            let s = self.loaded_through + 1;
            for level in [2, 1] {
                if s.is_multiple_of(1 << LEVELS[level].window_shift) {
                    self.cascade(level, (s >> LEVELS[level].window_shift) + 1)?;
                }
            }
            if self.unloaded[0] == 0 {
                let next_boundary = ((s >> LEVELS[1].window_shift) + 1) << LEVELS[1].window_shift;
                self.loaded_through = (next_boundary - 1).min(target);
                continue;
            }
            let slot = self.read_slot(slot_index(0, s))?;
            if slot.count > 0 && slot.window == s {
                for timer in self.read_chain(slot_index(0, s), &slot)? {
                    self.push_due(timer);
                }
                self.unloaded[0] -= u64::from(slot.count);
            }
            self.loaded_through = s;
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
        let timers = self.read_chain(index, &slot)?;
        self.unloaded[level] -= u64::from(slot.count);
        for timer in timers {
            self.insert(timer)?;
            self.reindexed += 1;
        }
        Ok(())
    }

    /// The timers of a slot, following its chain and checking its count.
    fn read_chain(&self, index: u64, slot: &Slot) -> Result<Vec<Timer>> {
        let mut timers = Vec::with_capacity(slot.count as usize);
        let mut next = slot.head;
        while next != 0 {
            if timers.len() >= slot.count as usize {
                break;
            }
            let entry = self.log.read_linked(next)?;
            timers.push(Timer { deliver_at_ms: entry.deliver_at_ms, message_offset: entry.message_offset });
            next = entry.prev;
        }
        if timers.len() != slot.count as usize || next != 0 {
            let at = FILE_HEADER_LEN as u64 + index * SLOT_LEN as u64;
            let why = format!("slot count is {} but its chain holds {} or more", slot.count, timers.len());
            return Err(Error::corruption(&self.path, at, CorruptionKind::BadReference(why)));
        }
        timers.reverse();
        Ok(timers)
    }

    /// When the earliest loaded timer is due.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.due.peek().map(|Reverse(t)| t.deliver_at_ms)
    }

    /// The first second that may still hold undelivered timers.
    pub fn tick_second(&self) -> u64 {
        self.next_due_ms().map_or(self.loaded_through + 1, |ms| (ms / 1000).min(self.loaded_through + 1))
    }

    /// Timers indexed and not yet handed out.
    pub fn pending(&self) -> u64 {
        self.due.len() as u64 + self.unloaded.iter().sum::<u64>()
    }

    /// Pending timers per wheel level (level 0 includes the loaded heap).
    pub fn pending_per_level(&self) -> [u64; 3] {
        let mut counts = self.unloaded;
        counts[0] += self.due.len() as u64;
        counts
    }

    /// Pending timers counted by due time: `counts[i]` holds those due before
    /// `bounds_ms[i]` (and at or after the bound before it); the last count
    /// holds the rest. One pass over the slot counts: exact within level 0
    /// (18 h ahead); a coarser window counts as due at its start.
    pub fn pending_by_due_time(&self, bounds_ms: &[u64]) -> Result<Vec<u64>> {
        let mut counts = vec![0u64; bounds_ms.len() + 1];
        let bucket = |at_ms: u64| bounds_ms.iter().position(|&b| at_ms < b).unwrap_or(bounds_ms.len());
        for Reverse(t) in &self.due {
            counts[bucket(t.deliver_at_ms)] += 1;
        }
        let first = self.loaded_through + 1;
        for sec in first..first + L0_SPAN {
            let slot = self.read_slot(slot_index(0, sec))?;
            if slot.count > 0 && slot.window == sec {
                counts[bucket(sec * 1000)] += u64::from(slot.count);
            }
        }
        for level in [1, 2] {
            let shift = LEVELS[level].window_shift;
            for i in 0..LEVELS[level].slots {
                let slot = self.read_slot(slot_index(level, i))?;
                if slot.count > 0 && self.is_live(level, slot.window) {
                    counts[bucket((slot.window << shift).saturating_mul(1000))] += u64::from(slot.count);
                }
            }
        }
        Ok(counts)
    }

    pub fn reindexed(&self) -> u64 {
        self.reindexed
    }

    pub fn timer_log_end(&self) -> u64 {
        self.log.end()
    }

    /// Syncs the timer log, then the slots.
    pub fn flush(&mut self) -> Result<()> {
        self.log.flush()?;
        self.file.shared().flush(0, self.file.shared().len())
    }

    /// Bytes of the wheel file and the timer log.
    pub fn disk_bytes(&self) -> u64 {
        self.file.shared().len() as u64 + self.log.disk_bytes()
    }
}

#[cfg(test)]
mod tests;
