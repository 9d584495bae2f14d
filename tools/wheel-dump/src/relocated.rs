//! The relocation area (`commitlog/relocated/`), read-only.
//!
//! When retention deletes a commit-log segment, the records a timer still
//! needs (pending timers' messages and cancels of timers not yet due) are
//! first copied byte for byte into window files, and the index says where
//! each copy is (`wheel-format.md`, "Retention and the relocation area"). A
//! copy's CRC still covers its original log offset, so it is checked with the
//! same decoder as a record in a segment.
//!
//! What a reader of a store with retention sees:
//! * the commit log starts at the oldest segment on disk, not at offset 0;
//! * delivery and cancel records, timer-log entries and consume-queue entries
//!   may name offsets below it: the record was relocated (the index has it),
//!   or it was deleted (a timer that fired, a message past the retention time);
//! * index entries at or after the oldest segment belong to a relocation pass
//!   that did not finish (a live store, or a crash): the next open cuts them;
//! * a window file whose window has passed is deleted whole, while its index
//!   entries stay: such a copy is gone, and no longer needed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use delaywheel::CorruptionKind;
use delaywheel::internals;
use delaywheel::internals::record::{self, Frame, Record};
use delaywheel::internals::relocation::{self, IndexEntry};

use crate::commitlog::{CommitLog, LogFacts, decode_record, frame_at};
use crate::error::{DumpError, Result};
use crate::indexes::CheckpointFile;
use crate::store_files::{DataFile, FileKind, StoreFiles};
use crate::wheel_view::Resume;

/// The index file, every whole entry decoded (or why not).
pub struct RelocationIndex {
    pub path: PathBuf,
    /// Every whole entry in file order: (byte position, the entry or why it does not check out).
    pub entries: Vec<(u64, Result<IndexEntry, CorruptionKind>)>,
    /// Bytes after the last whole entry (an append that was cut short).
    pub partial: u64,
}

impl RelocationIndex {
    /// Reads the index; `None` if the store has none (one never opened by a
    /// version with retention). Its header must check out.
    pub fn read(files: &StoreFiles) -> Result<Option<Self>> {
        if !files.relocation_index.is_file() {
            return Ok(None);
        }
        let file = DataFile::open(&files.relocation_index)?;
        let header = file.header(FileKind::RelocationIndex)?;
        file.expect_field("entry length", header.a, relocation::INDEX_ENTRY_LEN as u64)?;
        file.expect_field("window length", header.b, relocation::WINDOW_SECS)?;
        let start = internals::FILE_HEADER_LEN as u64;
        let entry_len = relocation::INDEX_ENTRY_LEN as u64;
        let body = file.len.saturating_sub(start);
        let bytes = file.read(start, (body / entry_len * entry_len) as usize)?;
        let entries = bytes
            .chunks_exact(relocation::INDEX_ENTRY_LEN)
            .enumerate()
            .map(|(i, chunk)| {
                let position = start + i as u64 * entry_len;
                (position, relocation::IndexEntry::decode(chunk, position))
            })
            .collect();
        Ok(Some(Self { path: file.path, entries, partial: body % entry_len }))
    }
}

/// The window files, opened (and their headers checked) as copies are read.
pub struct Windows<'a> {
    files: &'a StoreFiles,
    open: HashMap<u64, Option<DataFile>>,
    /// Window files whose header was checked.
    pub headers_checked: u64,
}

/// A copy read back: its bytes, checked as the record at its original offset.
pub struct CopyRead {
    pub path: PathBuf,
    bytes: Vec<u8>,
    frame: Frame,
    original_offset: u64,
}

impl CopyRead {
    /// The record the copy holds (checked when it was read).
    pub fn record(&self) -> Record<'_> {
        decode_record(&self.bytes, self.original_offset, self.frame).expect("checked when read")
    }
}

impl<'a> Windows<'a> {
    pub fn new(files: &'a StoreFiles) -> Self {
        Self { files, open: HashMap::new(), headers_checked: 0 }
    }

    /// Checks the header of every window file listed (also those no entry names).
    pub fn check_all(&mut self) -> Result<()> {
        for &window in self.files.relocation_windows.keys() {
            self.file(window)?;
        }
        Ok(())
    }

    /// The window file of `window`, header checked; `None` if it does not exist.
    fn file(&mut self, window: u64) -> Result<Option<&DataFile>> {
        if !self.open.contains_key(&window) {
            let path = self.files.relocation_window(window);
            let file = match DataFile::open(&path) {
                Ok(file) => {
                    let header = file.header(FileKind::RelocationWindow)?;
                    file.expect_field("window length", header.a, relocation::WINDOW_SECS)?;
                    file.expect_field("window", header.b, window)?;
                    self.headers_checked += 1;
                    Some(file)
                }
                Err(DumpError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            self.open.insert(window, file);
        }
        Ok(self.open[&window].as_ref())
    }

    /// The copy `entry` names, decoded and checked against its original
    /// offset; `None` if its window file does not exist (deleted once its
    /// window passed). A copy that does not check out is a corruption naming
    /// the window file and the copy's position.
    pub fn read(&mut self, entry: &IndexEntry) -> Result<Option<CopyRead>> {
        let Some(file) = self.file(entry.window())? else { return Ok(None) };
        let corrupt = |kind| DumpError::corruption(&file.path, entry.position, kind);
        let len = entry.len as usize;
        if entry.position < internals::FILE_HEADER_LEN as u64 || len < record::RECORD_HEADER_LEN {
            let why = format!("a copy of {len} bytes at {} cannot be a record", entry.position);
            return Err(corrupt(CorruptionKind::BadReference(why)));
        }
        let bytes = file.read(entry.position, len)?;
        let frame = match frame_at(&bytes, len).map_err(corrupt)? {
            Some(frame) => frame,
            None => {
                return Err(corrupt(CorruptionKind::BadFrame("zero bytes where a copy should be".into())));
            }
        };
        if frame.len != len {
            let why = format!("a copy of {len} bytes holds a record of {}", frame.len);
            return Err(corrupt(CorruptionKind::BadFrame(why)));
        }
        decode_record(&bytes, entry.original_offset, frame).map_err(corrupt)?;
        Ok(Some(CopyRead { path: file.path.clone(), bytes, frame, original_offset: entry.original_offset }))
    }
}

/// What the copy of a relocated record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// A timer's message (added to [`LogFacts`] as a timed message).
    Timer,
    /// A cancel of a timer not yet due when it was copied.
    Cancel,
    /// A reschedule record whose timer was not yet due when it was copied.
    Reschedule,
    /// Unknown: its window file was deleted (its window passed).
    WindowDeleted,
    /// Unknown: the copy does not check out (lenient reading only).
    Damaged,
}

/// A relocated cancel record: where its copy is and what it names.
#[derive(Debug, Clone)]
pub struct CancelCopy {
    pub original_offset: u64,
    pub message_offset: u64,
    pub deliver_at_ms: u64,
    pub path: PathBuf,
    pub position: u64,
}

/// What the relocation index holds for one deleted segment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SegmentCopies {
    pub entries: u64,
    pub bytes: u64,
    pub timers: u64,
    pub cancels: u64,
    /// Copies not read: their window file was deleted.
    pub unread: u64,
}

/// Everything the relocation area says, from one read of the index and of
/// every copy whose window file exists.
#[derive(Debug, Default)]
pub struct Relocated {
    /// The first offset of the oldest segment: copies of records below it are
    /// the only bytes of those records.
    pub log_start: u64,
    /// The commit-log end when the store last compacted the index
    /// (`relocated/compacted`; 0 if never): relocation records below it may
    /// name copies the index no longer holds.
    pub compacted_at: u64,
    pub index_exists: bool,
    /// Whole entries in the index.
    pub index_entries: u64,
    /// Valid entries at or after `log_start`: an unfinished pass (cut at the next open).
    pub unfinished: u64,
    /// Entries (or a partial entry) at the tail of a store not closed cleanly
    /// that fail their checksum: a pass that was cut short (cut at the next open).
    pub torn: u64,
    /// Entries or copies that do not check out (lenient reading; `verify` stops at the first).
    pub damaged: u64,
    /// Window files whose header was checked.
    pub window_files: u64,
    /// Copies read and checked.
    pub copies: u64,
    pub timers: u64,
    pub cancels: u64,
    /// Entries whose window file was deleted.
    pub window_deleted: u64,
    /// Entries below `log_start` by original offset: what their copy is.
    pub by_offset: HashMap<u64, CopyKind>,
    pub cancel_copies: Vec<CancelCopy>,
    /// Entries below `log_start`, per segment start offset.
    pub per_segment: BTreeMap<u64, SegmentCopies>,
    /// The first torn tail entry, to name if the relocation records disagree with the index.
    pub first_torn: Option<(PathBuf, u64, CorruptionKind)>,
}

impl Relocated {
    /// Reads the index and every copy it names. Relocated timers are added
    /// to `facts` as timed messages. `strict`: the first entry or copy that
    /// does not check out is the error (`verify`); otherwise it is counted in
    /// `damaged` and left out.
    pub fn gather(
        files: &StoreFiles,
        log: &CommitLog,
        facts: &mut LogFacts,
        clean: bool,
        strict: bool,
    ) -> Result<Self> {
        // Missing, or unreadable as a number: treated as compacted at the very end (lenient).
        let compacted_at = match std::fs::read_to_string(&files.relocation_compacted) {
            Ok(text) => text.trim().parse().unwrap_or(u64::MAX),
            Err(_) => 0,
        };
        let mut r = Self { log_start: log.start(), compacted_at, ..Self::default() };
        let mut windows = Windows::new(files);
        let index = match RelocationIndex::read(files) {
            Ok(index) => index,
            Err(e) => {
                r.check(strict, e)?;
                None
            }
        };
        if strict {
            windows.check_all()?;
        }
        if let Some(index) = index {
            let mut reading =
                Reading { files, facts, windows: &mut windows, clean, strict, tick_second: None };
            reading.entries(&mut r, &index, log.segment_size.max(1))?;
        }
        r.window_files = windows.headers_checked;
        Ok(r)
    }

    /// `e` is a problem: the error if `strict`, else counted as damage.
    fn check(&mut self, strict: bool, e: DumpError) -> Result<()> {
        if strict {
            return Err(e);
        }
        self.damaged += 1;
        Ok(())
    }

    /// Counts a relocated entry's copy, of `kind`, in its segment.
    fn count_relocated(&mut self, entry: &IndexEntry, kind: CopyKind, segment_size: u64) {
        self.by_offset.insert(entry.original_offset, kind);
        let base = entry.original_offset - entry.original_offset % segment_size;
        let s = self.per_segment.entry(base).or_default();
        s.entries += 1;
        s.bytes += u64::from(entry.len);
        match kind {
            CopyKind::Timer | CopyKind::Reschedule => s.timers += 1,
            CopyKind::Cancel => s.cancels += 1,
            CopyKind::WindowDeleted | CopyKind::Damaged => s.unread += 1,
        }
    }
}

/// One read of the relocation index's entries and the copies they name.
struct Reading<'a, 'w> {
    files: &'a StoreFiles,
    facts: &'w mut LogFacts,
    windows: &'w mut Windows<'a>,
    clean: bool,
    strict: bool,
    /// The trusted checkpoint's tick second, read once a window is found missing.
    tick_second: Option<Option<u64>>,
}

impl Reading<'_, '_> {
    /// Reads every entry of `index` and its copy into `r`.
    fn entries(&mut self, r: &mut Relocated, index: &RelocationIndex, segment_size: u64) -> Result<()> {
        r.index_exists = true;
        r.index_entries = index.entries.len() as u64;
        // The tail a recovery would cut: entries that fail their checksum or
        // whose original still lies in a segment on disk.
        let tail_start = index
            .entries
            .iter()
            .rposition(|(_, e)| {
                e.as_ref().is_ok_and(|e| !relocation::is_unfinished(e.original_offset, r.log_start))
            })
            .map_or(0, |i| i + 1);
        if index.partial > 0 {
            let position = internals::FILE_HEADER_LEN as u64
                + index.entries.len() as u64 * relocation::INDEX_ENTRY_LEN as u64;
            let kind = CorruptionKind::BadFrame(format!("a partial entry of {} bytes", index.partial));
            self.torn_or_damaged(r, &index.path, position, kind)?;
        }
        let mut previous: Option<u64> = None;
        let mut placed: BTreeMap<u64, Vec<(u64, u64, u64)>> = BTreeMap::new();
        for (i, (position, decoded)) in index.entries.iter().enumerate() {
            let position = *position;
            let entry = match decoded {
                Ok(entry) => *entry,
                Err(kind) if i >= tail_start => {
                    self.torn_or_damaged(r, &index.path, position, kind.clone())?;
                    continue;
                }
                Err(kind) => {
                    r.check(self.strict, DumpError::corruption(&index.path, position, kind.clone()))?;
                    continue;
                }
            };
            if let Some(prev) = previous.filter(|&p| entry.original_offset <= p) {
                let why = format!(
                    "original offset {} is not after the previous entry's {prev}",
                    entry.original_offset
                );
                r.check(self.strict, DumpError::bad_reference(&index.path, position, why))?;
                continue;
            }
            previous = Some(entry.original_offset);
            placed.entry(entry.window()).or_default().push((entry.position, u64::from(entry.len), position));
            let relocated = !relocation::is_unfinished(entry.original_offset, r.log_start);
            if !relocated {
                r.unfinished += 1;
            }
            let Some(kind) = self.copy(r, &index.path, position, &entry, relocated)? else {
                // Unreadable: no copy to count in its segment.
                if relocated {
                    r.by_offset.insert(entry.original_offset, CopyKind::Damaged);
                }
                continue;
            };
            if kind != CopyKind::WindowDeleted && kind != CopyKind::Damaged {
                r.copies += 1;
            }
            if relocated {
                r.count_relocated(&entry, kind, segment_size);
            }
        }
        check_no_overlaps(r, self.strict, &index.path, placed)
    }

    /// A torn entry at the tail of a store not closed cleanly (a pass cut
    /// short, which the open cuts), or damage in a clean one.
    fn torn_or_damaged(
        &mut self,
        r: &mut Relocated,
        path: &Path,
        position: u64,
        kind: CorruptionKind,
    ) -> Result<()> {
        if self.clean {
            return r.check(self.strict, DumpError::corruption(path, position, kind));
        }
        r.torn += 1;
        r.first_torn.get_or_insert((path.to_path_buf(), position, kind));
        Ok(())
    }

    /// What the copy `entry` names is, read and checked (`Damaged` if it
    /// does not check out); `None` if it could not be read.
    fn copy(
        &mut self,
        r: &mut Relocated,
        index_path: &Path,
        position: u64,
        entry: &IndexEntry,
        relocated: bool,
    ) -> Result<Option<CopyKind>> {
        match self.windows.read(entry) {
            Ok(None) => self.missing_window(r, index_path, position, entry).map(Some),
            Ok(Some(copy)) => self.read_copy(r, &copy, entry, relocated).map(Some),
            Err(e) => r.check(self.strict, e).map(|()| None),
        }
    }

    /// The copy's window file is gone: what retention does once a window
    /// ends at or before the time every timer before which has fired (at
    /// most the tick second of the checkpoints written by then).
    fn missing_window(
        &mut self,
        r: &mut Relocated,
        index_path: &Path,
        position: u64,
        entry: &IndexEntry,
    ) -> Result<CopyKind> {
        let window_end = entry.window().saturating_add(relocation::WINDOW_SECS);
        // The checkpoint is read after the window was found missing (again
        // before blaming it), so a live store cannot have deleted it on the
        // word of a newer checkpoint than ours.
        let files = self.files;
        let mut tick = *self.tick_second.get_or_insert_with(|| newest_tick_second(files));
        if tick.is_some_and(|tick| window_end > tick) {
            tick = newest_tick_second(files);
            self.tick_second = Some(tick);
        }
        if let Some(tick) = tick.filter(|&tick| window_end > tick) {
            let why = format!(
                "the copy of log offset {} due at {} is in window file {}, which is missing, \
                 but that window ends at second {window_end}, after the checkpoint's tick second {tick}",
                entry.original_offset,
                entry.deliver_at_ms,
                files.relocation_window(entry.window()).display()
            );
            r.check(self.strict, DumpError::bad_reference(index_path, position, why))?;
        }
        r.window_deleted += 1;
        Ok(CopyKind::WindowDeleted)
    }

    /// The record a copy holds, judged against its index entry; relocated
    /// timers and reschedules are added to the facts.
    fn read_copy(
        &mut self,
        r: &mut Relocated,
        copy: &CopyRead,
        entry: &IndexEntry,
        relocated: bool,
    ) -> Result<CopyKind> {
        let wrong = |what: String| {
            let why = format!(
                "the copy of log offset {} is {what}, where the index says a timer or a cancel due at {}",
                entry.original_offset, entry.deliver_at_ms
            );
            DumpError::bad_reference(&copy.path, entry.position, why)
        };
        let problem = match &copy.record() {
            // The copy of a rescheduled timer's message is filed by its new
            // deliver time, later than its own.
            Record::Message(m) if m.timer_deliver_at_ms().is_some_and(|own| own <= entry.deliver_at_ms) => {
                if relocated {
                    self.facts.add_relocated_timer(entry.original_offset, entry.len as usize, m);
                }
                r.timers += 1;
                return Ok(CopyKind::Timer);
            }
            Record::Cancel(c)
                if c.deliver_at_ms == entry.deliver_at_ms && c.message_offset < entry.original_offset =>
            {
                r.cancels += 1;
                if relocated {
                    r.cancel_copies.push(CancelCopy {
                        original_offset: entry.original_offset,
                        message_offset: c.message_offset,
                        deliver_at_ms: c.deliver_at_ms,
                        path: copy.path.clone(),
                        position: entry.position,
                    });
                }
                return Ok(CopyKind::Cancel);
            }
            Record::Reschedule(s)
                if s.deliver_at_ms == entry.deliver_at_ms && s.message_offset < entry.original_offset =>
            {
                if relocated {
                    self.facts.reschedules.insert(entry.original_offset, *s);
                }
                r.timers += 1;
                return Ok(CopyKind::Reschedule);
            }
            // Copied whole while any entry's timer was pending, filed by the latest.
            Record::Occurrences(o)
                if o.entries().map(|(_, s)| s.deliver_at_ms).max() == Some(entry.deliver_at_ms)
                    && o.entries().all(|(_, s)| s.message_offset < entry.original_offset) =>
            {
                for (name, s) in o.entries() {
                    if relocated {
                        self.facts.reschedules.insert(name, s);
                    }
                    // A timer named by an entry is found by its name.
                    r.by_offset.insert(name, CopyKind::Reschedule);
                }
                r.timers += 1;
                return Ok(CopyKind::Reschedule);
            }
            Record::Message(m) if m.timer_deliver_at_ms().is_some() => {
                wrong(format!("a timer message due at {}", m.timing.deliver_at_ms))
            }
            Record::Message(_) => wrong("a message that is not a timer".into()),
            Record::Cancel(c) => {
                wrong(format!("a cancel of log offset {} due at {}", c.message_offset, c.deliver_at_ms))
            }
            other => wrong(format!("a {} record", record_name(other))),
        };
        r.check(self.strict, problem)?;
        Ok(CopyKind::Damaged)
    }
}

/// Copies never overlap: each pass appends after what is in the file.
fn check_no_overlaps(
    r: &mut Relocated,
    strict: bool,
    index_path: &Path,
    placed: BTreeMap<u64, Vec<(u64, u64, u64)>>,
) -> Result<()> {
    for (window, mut copies) in placed {
        copies.sort_unstable();
        for pair in copies.windows(2) {
            let ((a_at, a_len, _), (b_at, _, b_position)) = (pair[0], pair[1]);
            if b_at < a_at + a_len {
                let why = format!(
                    "its copy at {b_at} of window file {window:020} overlaps the copy at {a_at} ({a_len} bytes)"
                );
                r.check(strict, DumpError::bad_reference(index_path, b_position, why))?;
            }
        }
    }
    Ok(())
}

/// The tick second of the checkpoint a store would trust, read now.
fn newest_tick_second(files: &StoreFiles) -> Option<u64> {
    let checkpoint = CheckpointFile::read(files).ok()?;
    Resume::new(files, &checkpoint).ok()?.checkpoint.map(|(_, cp)| cp.tick_second)
}

/// What a record is, in words.
pub fn record_name(record: &Record<'_>) -> &'static str {
    match record {
        Record::Message(_) => "message",
        Record::Delivery(_) => "delivery",
        Record::Deliveries(_) => "deliveries",
        Record::Cancel(_) => "cancel",
        Record::Relocation(_) => "relocation",
        Record::Reschedule(_) => "reschedule",
        Record::Occurrences(_) => "occurrences",
        Record::Skipped => "skipped (damaged) record",
        Record::Padding => "padding",
    }
}
