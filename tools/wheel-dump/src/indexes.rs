//! Reading the index files read-only: the checkpoint, the wheel, the two
//! timer logs, the chain starts (`timer/tails`), the cancel ledger
//! (`timer/cancelled/`) and the consume queues. Each
//! reader checks file headers and sizes when it opens; entries are decoded
//! by the store's own codecs (`delaywheel::internals`).

use std::path::{Path, PathBuf};

use delaywheel::CorruptionKind;
use delaywheel::internals::chain::{self, Chain, Lookup, WalkError};
use delaywheel::internals::checkpoint::Checkpoint;
use delaywheel::internals::slot::Slot;
use delaywheel::internals::timer_entry::{self, TimerEntry};
use delaywheel::internals::{self, geometry, queue_entry, tail};

use crate::commitlog::CommitLog;
use crate::error::{DumpError, Result};
use crate::store_files::{
    ChunkReader, DataFile, FileKind, QueueFiles, SequenceFile, StoreFiles, open_sequence,
};

// ------------------------------------------------------- fixed-size entries

/// How a sequence of files lays out fixed-size entries: `per_file` entries
/// of `len` bytes after each file's header.
#[derive(Clone, Copy)]
struct EntryLayout {
    per_file: u64,
    len: usize,
}

/// Visits the entries of `files` in order from index `from` to the first
/// unwritten one (or a missing file: entries are dense), with the file and
/// byte position of each; returns the index past the last.
fn scan_entries<E>(
    files: &[SequenceFile],
    layout: EntryLayout,
    from: u64,
    decode: impl Fn(&[u8], u64) -> std::result::Result<Option<E>, CorruptionKind>,
    mut visit: impl FnMut(u64, &Path, u64, E) -> Result<()>,
) -> Result<u64> {
    let mut index = from;
    for f in files.iter().filter(|f| f.first + layout.per_file > from) {
        if f.first > index {
            break;
        }
        let mut reader = ChunkReader::new(&f.file);
        while index < f.first + layout.per_file {
            let position = internals::FILE_HEADER_LEN as u64 + (index - f.first) * layout.len as u64;
            let bytes = reader.get(position, layout.len)?;
            let entry =
                decode(bytes, index).map_err(|kind| DumpError::corruption(&f.file.path, position, kind))?;
            let Some(entry) = entry else { return Ok(index) };
            visit(index, &f.file.path, position, entry)?;
            index += 1;
        }
    }
    Ok(index)
}

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

/// Which slot a store trusts, and those it passes over.
pub struct Judged {
    /// (position, checkpoint).
    pub trusted: Option<(u64, Checkpoint)>,
    /// (position, why), in the order the rule met them.
    pub passed_over: Vec<(u64, String)>,
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
        for position in internals::checkpoint::SLOT_POSITIONS {
            // A short file leaves a slot short: decoding says so.
            let available = file.len.saturating_sub(position).min(internals::checkpoint::SLOT_LEN as u64);
            let bytes = file.read(position, available as usize)?;
            let slot = match Checkpoint::decode_slot(&bytes) {
                Ok(None) => CheckpointSlot::Empty,
                Ok(Some(cp)) => CheckpointSlot::Valid(cp),
                Err(kind) => CheckpointSlot::Invalid(kind),
            };
            slots.push((position, slot));
        }
        Ok(Self { path, exists: true, len: file.len, slots })
    }

    /// The slot a store opening `log` trusts, by the library's own rule
    /// ([`internals::checkpoint::trusted`]): the newest valid one that
    /// nothing contradicts and whose `dispatched` the log's records lead to
    /// from the previous one's. (position, checkpoint); `None` if none stands.
    pub fn trusted(&self, log: &CommitLog) -> Result<Option<(u64, Checkpoint)>> {
        Ok(self.judge(log)?.trusted)
    }

    /// [`trusted`](Self::trusted), and the valid slots the store passes
    /// over on the way, with the library's reason: (position, why).
    pub fn judge(&self, log: &CommitLog) -> Result<Judged> {
        let valid: Vec<Checkpoint> = self.valid().map(|(_, cp)| cp).collect();
        let mut passed_over = Vec::new();
        let trusted = internals::checkpoint::trusted(
            &valid,
            (log.files_end(), log.segment_size),
            |from, to| log.leads_to(from, to),
            |cp, why| passed_over.push((cp.sequence, why.to_string())),
        )?;
        let position = |sequence: u64| self.valid().find(|(_, cp)| cp.sequence == sequence);
        let passed_over = (passed_over.into_iter())
            .filter_map(|(sequence, why)| position(sequence).map(|(at, _)| (at, why)))
            .collect();
        Ok(Judged { trusted: trusted.and_then(|t| position(t.sequence)), passed_over })
    }

    /// The valid slots: (position, checkpoint).
    pub fn valid(&self) -> impl Iterator<Item = (u64, Checkpoint)> + '_ {
        self.slots.iter().filter_map(|(position, slot)| match slot {
            CheckpointSlot::Valid(cp) => Some((*position, *cp)),
            _ => None,
        })
    }

    /// The valid slot with the highest sequence, as the store reads it: (position, checkpoint).
    pub fn newest(&self) -> Option<(u64, Checkpoint)> {
        self.valid().max_by_key(|(_, cp)| cp.sequence)
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
    pub slot: Slot,
}

impl PlacedSlot {
    /// First epoch second the slot's window covers.
    pub fn start_second(&self) -> u64 {
        geometry::window_start(self.level, self.slot.window)
    }

    /// Seconds the window covers.
    pub fn seconds(&self) -> u64 {
        1 << geometry::LEVELS[self.level].window_shift
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
        file.expect_field("geometry id", header.a, geometry::GEOMETRY_ID)?;
        file.expect_field("b", header.b, 0)?;
        file.expect_len(geometry::WHEEL_FILE_LEN)?;
        let header_len = internals::FILE_HEADER_LEN as u64;
        let slots = file.read(header_len, (geometry::WHEEL_FILE_LEN - header_len) as usize)?;
        Ok(Some(Self { path: file.path, slots }))
    }

    /// Slot `index`: `Ok(None)` if never used. Checks its CRC, and that its
    /// level field and window belong to this slot.
    pub fn slot(&self, index: u64) -> Result<Option<PlacedSlot>> {
        let at = index as usize * internals::slot::SLOT_LEN;
        let position = internals::slot::slot_position(index);
        let corrupt = |kind| DumpError::corruption(&self.path, position, kind);
        let bytes = self.slots.get(at..at + internals::slot::SLOT_LEN).unwrap_or(&[]);
        let Some(slot) = Slot::decode_record(bytes, index).map_err(corrupt)? else { return Ok(None) };
        let (level, _) = geometry::slot_level(index).expect("index below the slot count");
        if slot.level as usize != level || geometry::slot_index(level, slot.window) != index {
            let why =
                format!("slot says level {} window {}, which belong elsewhere", slot.level, slot.window);
            return Err(DumpError::bad_reference(&self.path, position, why));
        }
        Ok(Some(PlacedSlot { index, level, slot }))
    }

    /// Every non-empty slot, in file order; stops at the first that does not check out.
    pub fn slots(&self) -> impl Iterator<Item = Result<PlacedSlot>> + '_ {
        (0..geometry::TOTAL_SLOTS).filter_map(|index| self.slot(index).transpose())
    }
}

// ---------------------------------------------------------------- timer logs

/// One of the two timer logs: `timer/timerlog/` holds the chains of level-0
/// slots, `timer/timerlog-far/` those of level-1 and level-2 slots. Each has
/// its own entry indexes: a slot's `head` and every `prev` in its chain index
/// the log of the slot's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSide {
    Near,
    Far,
}

impl LogSide {
    /// The log the chains of `level`'s slots run through.
    pub fn of_level(level: usize) -> Self {
        if geometry::timer_log_of(level) == 0 { Self::Near } else { Self::Far }
    }

    /// `0` near, `1` far (as [`geometry::timer_log_of`]).
    pub fn index(self) -> usize {
        match self {
            Self::Near => 0,
            Self::Far => 1,
        }
    }

    /// The log's directory relative to the store, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Near => "timer/timerlog/",
            Self::Far => "timer/timerlog-far/",
        }
    }
}

/// One timer log's files, headers checked; entries are read on demand. Open
/// it after reading the wheel: a live store appends an entry before it
/// writes the slot that points at it, so every chain read is then complete.
///
/// The store deletes a log's oldest files once no chain a restart could read
/// reaches into them, so the files may start past index 0: entries below the
/// first file simply are not there.
pub struct TimerLog {
    pub side: LogSide,
    dir: PathBuf,
    files: Vec<SequenceFile>,
    per_file: u64,
    /// The files' entries per file (`None`: no files).
    entries_per_file: Option<u64>,
}

impl TimerLog {
    pub fn open(files: &StoreFiles, side: LogSide) -> Result<Self> {
        let entry = timer_entry::ENTRY_LEN as u64;
        let header = internals::FILE_HEADER_LEN as u64;
        let (list, per_file) = open_sequence(
            &files.timer_log_now(side.index())?,
            FileKind::TimerLog,
            |a| a,
            |a| a.saturating_mul(entry).saturating_add(header),
        )?;
        Ok(Self {
            side,
            dir: files.timer_log_dir(side.index()),
            files: list,
            per_file: per_file.unwrap_or(1),
            entries_per_file: per_file,
        })
    }

    pub fn files(&self) -> impl Iterator<Item = &SequenceFile> {
        self.files.iter()
    }

    /// The entries per file its headers say (`None`: no files).
    pub fn entries_per_file(&self) -> Option<u64> {
        self.entries_per_file
    }

    /// The first entry its files hold (`None`: it has no files). Entries
    /// below it were in files the store deleted.
    pub fn first(&self) -> Option<u64> {
        self.files.first().map(|f| f.first.max(1))
    }

    /// The file and byte position of entry `index` (the file may not exist).
    pub fn locate(&self, index: u64) -> (Option<&DataFile>, PathBuf, u64) {
        let first = index - index % self.per_file;
        let position =
            internals::FILE_HEADER_LEN as u64 + (index % self.per_file) * timer_entry::ENTRY_LEN as u64;
        match self.files.iter().find(|f| f.first == first) {
            Some(f) => (Some(&f.file), f.file.path.clone(), position),
            None => (None, self.dir.join(format!("{first:020}")), position),
        }
    }

    /// Entry `index`: `Ok(None)` if unwritten (or its file does not exist).
    pub fn entry(&self, index: u64) -> Result<Option<TimerEntry>> {
        let (file, path, position) = self.locate(index);
        let Some(file) = file else { return Ok(None) };
        let bytes = file.read(position, timer_entry::ENTRY_LEN)?;
        TimerEntry::decode(&bytes, index).map_err(|kind| DumpError::corruption(path, position, kind))
    }

    /// Visits entries in order from `from` (at least 1: index 0 is never
    /// used; at least the first entry on disk) to the first unwritten one;
    /// returns the index past the last.
    pub fn scan(&self, from: u64, mut visit: impl FnMut(u64, TimerEntry) -> Result<()>) -> Result<u64> {
        let from = from.max(1).max(self.first().unwrap_or(1));
        let layout = EntryLayout { per_file: self.per_file, len: timer_entry::ENTRY_LEN };
        scan_entries(&self.files, layout, from, TimerEntry::decode, |index, _, _, entry| visit(index, entry))
    }

    /// The index the next entry gets (`None`: no files): entries are dense,
    /// so a binary search in the last file. Reads no checksum.
    pub fn end(&self) -> Result<Option<u64>> {
        let Some(last) = self.files.last() else { return Ok(None) };
        let written = |i: u64| -> Result<bool> {
            let position = internals::FILE_HEADER_LEN as u64 + i * timer_entry::ENTRY_LEN as u64;
            let bytes = last.file.read(position, timer_entry::ENTRY_LEN)?;
            Ok(bytes.iter().any(|&b| b != 0))
        };
        // Index 0 is never used: file 0's first entry is index 1.
        let (mut lo, mut hi) = (u64::from(last.first == 0), self.per_file);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if written(mid)? { lo = mid + 1 } else { hi = mid }
        }
        Ok(Some(last.first + lo))
    }

    /// Every written entry, CRCs checked, up to the first that does not
    /// check out at or past `doubtful_from`: there the log ends, torn (the
    /// store's open cuts an entry a power loss left in doubt; see
    /// [`LoadedLog::torn_at`]). Below it such an entry is an error.
    pub fn load(&self, doubtful_from: u64) -> Result<LoadedLog> {
        let start = self.first().unwrap_or(1);
        let from = start.max(1);
        let layout = EntryLayout { per_file: self.per_file, len: timer_entry::ENTRY_LEN };
        let torn_at = std::cell::Cell::new(None);
        let decode = |bytes: &[u8], index: u64| match TimerEntry::decode(bytes, index) {
            Err(_) if index >= doubtful_from => {
                torn_at.set(Some(index));
                Ok(None)
            }
            decoded => decoded,
        };
        let mut entries = Vec::new();
        scan_entries(&self.files, layout, from, decode, |_, _, _, entry| {
            entries.push(entry);
            Ok(())
        })?;
        let has_files = !self.files.is_empty();
        Ok(LoadedLog { side: self.side, start, entries, has_files, torn_at: torn_at.get() })
    }
}

/// A timer log read whole into memory.
pub struct LoadedLog {
    pub side: LogSide,
    /// The index of `entries[0]`: the first entry on disk.
    start: u64,
    entries: Vec<TimerEntry>,
    has_files: bool,
    torn_at: Option<u64>,
}

impl LoadedLog {
    /// The entry the log was read to that did not check out (at or past
    /// where [`TimerLog::load`] was told entries may be in doubt), if any.
    pub fn torn_at(&self) -> Option<u64> {
        self.torn_at
    }

    pub fn get(&self, index: u64) -> Option<TimerEntry> {
        index.checked_sub(self.start).and_then(|i| self.entries.get(i as usize)).copied()
    }

    /// The first entry on disk (`None`: no files).
    pub fn first(&self) -> Option<u64> {
        self.has_files.then_some(self.start)
    }

    /// The index past the last entry (`None`: no files).
    pub fn end(&self) -> Option<u64> {
        self.has_files.then_some(self.start + self.entries.len() as u64)
    }

    /// (index, entry) in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &TimerEntry)> {
        (self.start..).zip(&self.entries)
    }
}

/// Both timer logs, by [`LogSide::index`].
pub struct TimerLogs(pub [TimerLog; 2]);

impl TimerLogs {
    pub fn open(files: &StoreFiles) -> Result<Self> {
        Ok(Self([TimerLog::open(files, LogSide::Near)?, TimerLog::open(files, LogSide::Far)?]))
    }

    pub fn get(&self, side: LogSide) -> &TimerLog {
        &self.0[side.index()]
    }

    /// Both logs, each read as [`TimerLog::load`] with its `doubtful_from`.
    pub fn load(&self, doubtful_from: [u64; 2]) -> Result<LoadedLogs> {
        Ok(LoadedLogs([self.0[0].load(doubtful_from[0])?, self.0[1].load(doubtful_from[1])?]))
    }
}

/// Both timer logs in memory, by [`LogSide::index`].
pub struct LoadedLogs(pub [LoadedLog; 2]);

impl LoadedLogs {
    pub fn get(&self, side: LogSide) -> &LoadedLog {
        &self.0[side.index()]
    }
}

/// Where chains are read from: both timer logs, on disk or in memory.
pub trait Entries {
    /// Entry `index` of log `side`: `Ok(None)` if it is not there.
    fn entry(&self, side: LogSide, index: u64) -> Result<Option<TimerEntry>>;
    /// The first entry of log `side` on disk (`None`: no files).
    fn first(&self, side: LogSide) -> Option<u64>;
}

impl Entries for TimerLogs {
    fn entry(&self, side: LogSide, index: u64) -> Result<Option<TimerEntry>> {
        self.get(side).entry(index)
    }

    fn first(&self, side: LogSide) -> Option<u64> {
        self.get(side).first()
    }
}

impl Entries for LoadedLogs {
    fn entry(&self, side: LogSide, index: u64) -> Result<Option<TimerEntry>> {
        Ok(self.get(side).get(index))
    }

    fn first(&self, side: LogSide) -> Option<u64> {
        self.get(side).first()
    }
}

/// The chain of `slot`, newest first, through the log of its level, as far
/// as that log's files go, walked and checked by the store's own walk (see
/// [`chain::walk`]): it must link backwards and, read whole, hold exactly
/// the slot's counts. Only the chains of live slots are sure to be read
/// whole: the store deletes timer-log files that only stale chains reach.
pub fn read_chain(wheel: &WheelFile, slot: &PlacedSlot, logs: &impl Entries) -> Result<Chain> {
    let side = LogSide::of_level(slot.level);
    let lookup = |at: u64| -> Result<Lookup> {
        if logs.first(side).is_none_or(|first| at < first) {
            return Ok(Lookup::Deleted);
        }
        Ok(logs.entry(side, at)?.map_or(Lookup::Unwritten, Lookup::Entry))
    };
    chain::walk(&slot.slot, lookup).map_err(|e| match e {
        WalkError::Read(e) => e,
        WalkError::Broken(why) => {
            let position = internals::slot::slot_position(slot.index);
            DumpError::bad_reference(&wheel.path, position, format!("{why}, in {}", side.name()))
        }
    })
}

/// The whole chain; one that reaches a deleted file is an error (for a live slot).
pub fn whole_chain(
    chain: Chain,
    wheel: &WheelFile,
    slot: &PlacedSlot,
    logs: &impl Entries,
) -> Result<Vec<(u64, TimerEntry)>> {
    let Some(index) = chain.deleted_from else { return Ok(chain.entries) };
    let side = LogSide::of_level(slot.level);
    let files = match logs.first(side) {
        Some(first) => format!("its files start at entry {first}"),
        None => "it has no files".into(),
    };
    let why = format!(
        "the chain of a live slot reaches entry {index} of {}, whose file was deleted ({files})",
        side.name()
    );
    Err(DumpError::bad_reference(&wheel.path, internals::slot::slot_position(slot.index), why))
}

// -------------------------------------------------------------- chain starts

/// `timer/tails`, read whole (1.8 MB), its header and size checked.
pub struct TailsFile {
    pub path: PathBuf,
    records: Vec<u8>,
}

impl TailsFile {
    /// `Ok(None)` if there is no such file (a store written before it existed).
    pub fn read(files: &StoreFiles) -> Result<Option<Self>> {
        if !files.tails.exists() {
            return Ok(None);
        }
        let file = DataFile::open(&files.tails)?;
        let header = file.header(FileKind::Tails)?;
        file.expect_field("a (record length)", header.a, tail::TAIL_LEN as u64)?;
        file.expect_field("b (slots)", header.b, geometry::TOTAL_SLOTS)?;
        file.expect_len(geometry::TAILS_FILE_LEN)?;
        let header_len = internals::FILE_HEADER_LEN as u64;
        let records = file.read(header_len, (geometry::TAILS_FILE_LEN - header_len) as usize)?;
        Ok(Some(Self { path: file.path, records }))
    }

    /// Slot `index`'s record: `Ok(None)` if never written; an error if it fails its CRC.
    pub fn record(&self, index: u64) -> Result<Option<tail::TailRecord>> {
        let at = index as usize * tail::TAIL_LEN;
        let bytes = self.records.get(at..at + tail::TAIL_LEN).unwrap_or(&[]);
        tail::decode_record(bytes, index)
            .map_err(|kind| DumpError::corruption(&self.path, tail::tail_position(index), kind))
    }
}

// ------------------------------------------------------------- cancel ledger

/// The cancel ledger's files (`timer/cancelled/`), headers checked: the
/// timer-log layout under its own magic, with a fixed number of entries per
/// file. Open it after scanning the commit log: a live store enters a cancel
/// after writing its record, so entries naming records past the log end read
/// are the live store's newest. Retention deletes the oldest files.
pub struct CancelLedger {
    files: Vec<SequenceFile>,
}

impl CancelLedger {
    pub fn open(files: &StoreFiles) -> Result<Self> {
        const PER_FILE: u64 = internals::LEDGER_ENTRIES_PER_FILE;
        let file_len = internals::FILE_HEADER_LEN as u64 + PER_FILE * timer_entry::ENTRY_LEN as u64;
        // The format fixes the file size: a wrong `a` is reported as such, not as a wrong size.
        let (list, a) =
            open_sequence(&files.cancel_ledger_now()?, FileKind::CancelLedger, |_| PER_FILE, |_| file_len)?;
        if let (Some(a), Some(first)) = (a, list.first()) {
            first.file.expect_field("entries per file", a, PER_FILE)?;
            // The store finds entry `i` in the file of `i / PER_FILE`.
            first.file.expect_field("first index", first.first, first.first - first.first % PER_FILE)?;
        }
        Ok(Self { files: list })
    }

    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// The first entry its files hold (`None`: no files). Entries below it
    /// were in files the store deleted.
    pub fn first(&self) -> Option<u64> {
        self.files.first().map(|f| f.first.max(1))
    }

    /// Visits entries in order, with the file and byte position of each, to
    /// the first unwritten one, or if `torn_ends` to the first that does not
    /// check out; returns the index past the last, and the entry that did
    /// not check out if the scan ended there.
    pub fn scan(
        &self,
        torn_ends: bool,
        visit: impl FnMut(u64, &Path, u64, TimerEntry) -> Result<()>,
    ) -> Result<(u64, Option<u64>)> {
        let layout =
            EntryLayout { per_file: internals::LEDGER_ENTRIES_PER_FILE, len: timer_entry::ENTRY_LEN };
        let from = self.first().unwrap_or(1);
        let torn_at = std::cell::Cell::new(None);
        let decode = |bytes: &[u8], index: u64| match TimerEntry::decode(bytes, index) {
            Err(_) if torn_ends => {
                torn_at.set(Some(index));
                Ok(None)
            }
            decoded => decoded,
        };
        let end = scan_entries(&self.files, layout, from, decode, visit)?;
        Ok((end, torn_at.get()))
    }
}

// ------------------------------------------------------------- consume queue

/// One consume queue's files, headers checked.
pub struct ConsumeQueue {
    files: Vec<SequenceFile>,
    per_file: u64,
}

impl ConsumeQueue {
    pub fn open(queue: &QueueFiles) -> Result<Self> {
        let entry = queue_entry::ENTRY_LEN as u64;
        let header = internals::FILE_HEADER_LEN as u64;
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
    pub fn scan(&self, visit: impl FnMut(u64, &Path, u64, queue_entry::Entry) -> Result<()>) -> Result<u64> {
        let layout = EntryLayout { per_file: self.per_file, len: queue_entry::ENTRY_LEN };
        let from = self.files.first().map_or(0, |f| f.first);
        scan_entries(&self.files, layout, from, queue_entry::decode_entry, visit)
    }

    /// The first written entry from `from` on, if any, with where entry
    /// `from` is (file and byte position): a written entry after an
    /// unwritten one means a stretch of the queue was zeroed.
    pub fn written_after(&self, from: u64) -> Result<Option<(u64, PathBuf, u64)>> {
        let len = queue_entry::ENTRY_LEN as u64;
        let position =
            |f: &SequenceFile, index: u64| internals::FILE_HEADER_LEN as u64 + (index - f.first) * len;
        let Some(at) = self.files.iter().find(|f| (f.first..f.first + self.per_file).contains(&from)) else {
            return Ok(None);
        };
        let (path, from_position) = (at.file.path.clone(), position(at, from));
        for f in self.files.iter().filter(|f| f.first + self.per_file > from) {
            let mut reader = ChunkReader::new(&f.file);
            for index in from.max(f.first)..f.first + self.per_file {
                if reader.get(position(f, index), len as usize)?.iter().any(|&b| b != 0) {
                    return Ok(Some((index, path, from_position)));
                }
            }
        }
        Ok(None)
    }

    /// The number of entries: entries are dense, so a binary search in the
    /// last file holding any. Files after it are spares the store made ahead
    /// of need (empty; the store's recovery removes them).
    pub fn len(&self) -> Result<u64> {
        for (i, file) in self.files.iter().enumerate().rev() {
            let written = |n: u64| -> Result<bool> {
                let position = internals::FILE_HEADER_LEN as u64 + n * queue_entry::ENTRY_LEN as u64;
                let bytes = file.file.read(position, queue_entry::ENTRY_LEN)?;
                Ok(bytes.iter().any(|&b| b != 0))
            };
            let (mut lo, mut hi) = (0, self.per_file);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if written(mid)? { lo = mid + 1 } else { hi = mid }
            }
            if lo > 0 || i == 0 {
                return Ok(file.first + lo);
            }
        }
        Ok(0)
    }
}
