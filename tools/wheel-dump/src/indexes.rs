//! Reading the index files read-only: the checkpoint, the wheel, the timer
//! log and the consume queues. Each reader checks file headers and sizes when
//! it opens; entries are decoded by `delaywheel::inspect`.

use std::path::PathBuf;

use delaywheel::inspect::{self, FileKind, QueueEntry, TimerLogEntry, WheelSlot};
use delaywheel::{Checkpoint, CorruptionKind};

use crate::error::{DumpError, Result};
use crate::store_files::{ChunkReader, DataFile, QueueFiles, SequenceFile, StoreFiles, open_sequence};

// ---------------------------------------------------------------- checkpoint

/// One of the checkpoint file's two slots.
#[derive(Debug, Clone)]
pub enum CheckpointSlot {
    /// All zero: never written.
    Empty,
    Valid(Checkpoint),
    /// Torn, damaged or of another version.
    Invalid(CorruptionKind),
}

/// Both slots of the checkpoint file.
pub struct CheckpointFile {
    pub path: PathBuf,
    pub exists: bool,
    pub len: u64,
    /// (byte position, slot).
    pub slots: Vec<(u64, CheckpointSlot)>,
}

impl CheckpointFile {
    pub fn read(files: &StoreFiles) -> Result<Self> {
        let path = files.checkpoint.clone();
        if !path.exists() {
            return Ok(Self { path, exists: false, len: 0, slots: Vec::new() });
        }
        let file = DataFile::open(&path)?;
        let mut slots = Vec::new();
        for position in inspect::CHECKPOINT_SLOT_POSITIONS {
            // A short file leaves a slot short: decoding says so.
            let available = file.len.saturating_sub(position).min(inspect::CHECKPOINT_SLOT_LEN as u64);
            let bytes = file.read(position, available as usize)?;
            let slot = match inspect::decode_checkpoint_slot(&bytes) {
                Ok(None) => CheckpointSlot::Empty,
                Ok(Some(cp)) => CheckpointSlot::Valid(cp),
                Err(kind) => CheckpointSlot::Invalid(kind),
            };
            slots.push((position, slot));
        }
        Ok(Self { path, exists: true, len: file.len, slots })
    }

    /// The valid slot with the highest sequence, as the store reads it: (position, checkpoint).
    pub fn newest(&self) -> Option<(u64, Checkpoint)> {
        self.slots
            .iter()
            .filter_map(|(position, slot)| match slot {
                CheckpointSlot::Valid(cp) => Some((*position, *cp)),
                _ => None,
            })
            .max_by_key(|(_, cp)| cp.sequence)
    }
}

// --------------------------------------------------------------------- wheel

/// The wheel file, read whole (2.4 MB).
pub struct WheelFile {
    pub path: PathBuf,
    slots: Vec<u8>,
}

/// A non-empty slot record with where it sits.
#[derive(Debug, Clone, Copy)]
pub struct PlacedSlot {
    pub index: u64,
    pub level: usize,
    pub slot: WheelSlot,
}

impl PlacedSlot {
    /// First epoch second the slot's window covers.
    pub fn start_second(&self) -> u64 {
        inspect::window_start(self.level, self.slot.window)
    }

    /// Seconds the window covers.
    pub fn seconds(&self) -> u64 {
        1 << inspect::window_shift(self.level)
    }

    /// Timers the slot still delivers, from its counts: its timer entries less
    /// those its cancel entries remove (a cancel entry removes a timer of its
    /// own slot, or of a coarser one still waiting to be cascaded into it).
    pub fn net_timers(&self) -> u32 {
        self.slot.count.saturating_sub(self.slot.cancels.saturating_mul(2))
    }
}

impl WheelFile {
    /// Opens the wheel file, checks its header and size, and reads every slot.
    pub fn read(files: &StoreFiles) -> Result<Option<Self>> {
        if !files.wheel.exists() {
            return Ok(None);
        }
        let file = DataFile::open(&files.wheel)?;
        let header = file.header(FileKind::Wheel)?;
        file.expect_field("geometry id", header.a, inspect::WHEEL_GEOMETRY_ID)?;
        file.expect_field("b", header.b, 0)?;
        file.expect_len(inspect::WHEEL_FILE_LEN)?;
        let header_len = inspect::FILE_HEADER_LEN as u64;
        let slots = file.read(header_len, (inspect::WHEEL_FILE_LEN - header_len) as usize)?;
        Ok(Some(Self { path: file.path, slots }))
    }

    /// Slot `index`: `Ok(None)` if never used. Checks its CRC, and that its
    /// level field and window belong to this slot.
    pub fn slot(&self, index: u64) -> Result<Option<PlacedSlot>> {
        let at = index as usize * inspect::WHEEL_SLOT_LEN;
        let position = inspect::slot_position(index);
        let corrupt = |kind| DumpError::corruption(&self.path, position, kind);
        let bytes = self.slots.get(at..at + inspect::WHEEL_SLOT_LEN).unwrap_or(&[]);
        let Some(slot) = inspect::decode_wheel_slot(bytes, index).map_err(corrupt)? else { return Ok(None) };
        let (level, _) = inspect::slot_level(index).expect("index below the slot count");
        if slot.level as usize != level || inspect::slot_index(level, slot.window) != index {
            let why =
                format!("slot says level {} window {}, which belong elsewhere", slot.level, slot.window);
            return Err(DumpError::bad_reference(&self.path, position, why));
        }
        Ok(Some(PlacedSlot { index, level, slot }))
    }

    /// Every non-empty slot, in file order; stops at the first that does not check out.
    pub fn slots(&self) -> impl Iterator<Item = Result<PlacedSlot>> + '_ {
        (0..inspect::WHEEL_TOTAL_SLOTS).filter_map(|index| self.slot(index).transpose())
    }
}

// ----------------------------------------------------------------- timer log

/// The timer-log files, headers checked; entries are read on demand. Open
/// it after reading the wheel: a live store appends an entry before it
/// writes the slot that points at it, so every chain read is then complete.
pub struct TimerLog {
    files: Vec<SequenceFile>,
    per_file: u64,
}

impl TimerLog {
    pub fn open(files: &StoreFiles) -> Result<Self> {
        let entry = inspect::TIMER_ENTRY_LEN as u64;
        let header = inspect::FILE_HEADER_LEN as u64;
        let (files, per_file) = open_sequence(
            &files.timer_log_now()?,
            FileKind::TimerLog,
            |a| a,
            |a| a.saturating_mul(entry).saturating_add(header),
        )?;
        Ok(Self { files, per_file: per_file.unwrap_or(1) })
    }

    pub fn files(&self) -> impl Iterator<Item = &SequenceFile> {
        self.files.iter()
    }

    /// The file and byte position of entry `index` (the file may not exist).
    pub fn locate(&self, index: u64) -> (Option<&DataFile>, PathBuf, u64) {
        let first = index - index % self.per_file;
        let position =
            inspect::FILE_HEADER_LEN as u64 + (index % self.per_file) * inspect::TIMER_ENTRY_LEN as u64;
        match self.files.iter().find(|f| f.first == first) {
            Some(f) => (Some(&f.file), f.file.path.clone(), position),
            None => {
                let dir = self.files.first().and_then(|f| f.file.path.parent().map(PathBuf::from));
                (None, dir.unwrap_or_default().join(format!("{first:020}")), position)
            }
        }
    }

    /// Entry `index`: `Ok(None)` if unwritten (or its file does not exist).
    pub fn entry(&self, index: u64) -> Result<Option<TimerLogEntry>> {
        let (file, path, position) = self.locate(index);
        let Some(file) = file else { return Ok(None) };
        let bytes = file.read(position, inspect::TIMER_ENTRY_LEN)?;
        inspect::decode_timer_entry(&bytes, index).map_err(|kind| DumpError::corruption(path, position, kind))
    }

    /// Visits entries in order from `from` (at least 1: index 0 is never
    /// used) to the first unwritten one; returns the index past the last.
    pub fn scan(&self, from: u64, mut visit: impl FnMut(u64, TimerLogEntry) -> Result<()>) -> Result<u64> {
        let mut index = from.max(1);
        let start = index;
        for f in self.files.iter().filter(|f| f.first + self.per_file > start) {
            if f.first > index {
                break; // entries are dense: a file past the end holds nothing
            }
            let mut reader = ChunkReader::new(&f.file);
            while index < f.first + self.per_file {
                let position =
                    inspect::FILE_HEADER_LEN as u64 + (index - f.first) * inspect::TIMER_ENTRY_LEN as u64;
                let bytes = reader.get(position, inspect::TIMER_ENTRY_LEN)?;
                let entry = inspect::decode_timer_entry(bytes, index)
                    .map_err(|kind| DumpError::corruption(&f.file.path, position, kind))?;
                let Some(entry) = entry else { return Ok(index) };
                visit(index, entry)?;
                index += 1;
            }
        }
        Ok(index)
    }

    /// Every written entry, indexed by position (entry 0 is never used).
    pub fn load(&self) -> Result<Vec<Option<TimerLogEntry>>> {
        let mut entries = vec![None];
        self.scan(1, |_, entry| {
            entries.push(Some(entry));
            Ok(())
        })?;
        Ok(entries)
    }
}

/// The chain of `slot`, newest first, as (entry index, entry), read through
/// `entry`. The chain must hold exactly `count` entries, `cancels` of them
/// cancel entries, each below the one before; otherwise the slot is corrupt.
pub fn chain(
    wheel: &WheelFile,
    slot: &PlacedSlot,
    mut entry: impl FnMut(u64) -> Result<Option<TimerLogEntry>>,
) -> Result<Vec<(u64, TimerLogEntry)>> {
    let position = inspect::slot_position(slot.index);
    let bad = |why: String| DumpError::bad_reference(&wheel.path, position, why);
    let mut out = Vec::with_capacity(slot.slot.count as usize);
    let mut next = slot.slot.head;
    while next != 0 && out.len() < slot.slot.count as usize {
        let Some(e) = entry(next)? else {
            return Err(bad(format!("the chain points at unwritten timer-log entry {next}")));
        };
        if e.prev >= next {
            return Err(bad(format!("timer-log entry {next} links forward to {}", e.prev)));
        }
        out.push((next, e));
        next = e.prev;
    }
    if out.len() != slot.slot.count as usize || next != 0 {
        let longer = if next != 0 { " or more" } else { "" };
        return Err(bad(format!(
            "slot count is {} but its chain holds {}{longer}",
            slot.slot.count,
            out.len()
        )));
    }
    let cancels = out.iter().filter(|(_, e)| e.cancel).count();
    if cancels != slot.slot.cancels as usize {
        return Err(bad(format!(
            "slot says {} cancel entries, its chain holds {cancels}",
            slot.slot.cancels
        )));
    }
    Ok(out)
}

// ------------------------------------------------------------- consume queue

/// One consume queue's files, headers checked.
pub struct ConsumeQueue {
    files: Vec<SequenceFile>,
    per_file: u64,
}

impl ConsumeQueue {
    pub fn open(queue: &QueueFiles) -> Result<Self> {
        let entry = inspect::QUEUE_ENTRY_LEN as u64;
        let header = inspect::FILE_HEADER_LEN as u64;
        let (files, per_file) = open_sequence(
            &queue.files,
            FileKind::ConsumeQueue,
            |a| a,
            |a| a.saturating_mul(entry).saturating_add(header),
        )?;
        Ok(Self { files, per_file: per_file.unwrap_or(1) })
    }

    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Visits entries in order to the first unwritten one; returns the queue's length.
    pub fn scan(&self, mut visit: impl FnMut(u64, &PathBuf, u64, QueueEntry) -> Result<()>) -> Result<u64> {
        let mut index = self.files.first().map_or(0, |f| f.first);
        for f in &self.files {
            let mut reader = ChunkReader::new(&f.file);
            while index < f.first + self.per_file {
                let position =
                    inspect::FILE_HEADER_LEN as u64 + (index - f.first) * inspect::QUEUE_ENTRY_LEN as u64;
                let bytes = reader.get(position, inspect::QUEUE_ENTRY_LEN)?;
                let entry = inspect::decode_queue_entry(bytes, index)
                    .map_err(|kind| DumpError::corruption(&f.file.path, position, kind))?;
                let Some(entry) = entry else { return Ok(index) };
                visit(index, &f.file.path, position, entry)?;
                index += 1;
            }
        }
        Ok(index)
    }

    /// The number of entries: entries are dense, so a binary search in the last file.
    pub fn len(&self) -> Result<u64> {
        let Some(last) = self.files.last() else { return Ok(0) };
        let written = |i: u64| -> Result<bool> {
            let position = inspect::FILE_HEADER_LEN as u64 + i * inspect::QUEUE_ENTRY_LEN as u64;
            let bytes = last.file.read(position, inspect::QUEUE_ENTRY_LEN)?;
            Ok(bytes.iter().any(|&b| b != 0))
        };
        let (mut lo, mut hi) = (0, self.per_file);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if written(mid)? { lo = mid + 1 } else { hi = mid }
        }
        Ok(last.first + lo)
    }
}
