//! The commit log: the store's only truth.
//!
//! Records are appended to fixed-size segments named by their start offset.
//! An offset is global: segment `offset / segment_size`, position
//! `offset % segment_size` in its file. The first [`FILE_HEADER_LEN`] bytes of
//! every segment are its header, so the first record of a segment starts there.
//! Appends write through the map under one mutex; readers see a record once the
//! append has published it. Everything else on disk is an index rebuilt from here.

mod append;
mod damage;
mod entries;
mod reader;
mod recovery;
pub(crate) mod relocated;
mod segment;

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::task::Waker;
use std::time::Duration;

use bytes::Bytes;

use crate::config::RecoveryMode;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::record::{Frame, FrameError, RecordKind, check_frame, check_header};
use crate::format::{FILE_HEADER_LEN, get_u32};
use crate::mmap::{MapWriter, Mapped, PREFAULT_CHUNK};
use crate::sync::{Locked, ReadWrite};
use relocated::RelocationArea;

/// How far ahead of the writer the prefaulter keeps pages ready, at most
/// (see [`prefault_window`]).
const PREFAULT_AHEAD: usize = 32 << 20;

/// How far ahead of the writer the prefaulter keeps pages ready in a log
/// of `segment_size` segments: [`PREFAULT_AHEAD`], or half a segment where
/// that is less. Pages faulted ahead stay resident while the store idles,
/// and a store of small segments is one of many (each partition of the
/// NATS tier is one): 32 MiB ahead in each would be most of its memory.
fn prefault_window(segment_size: u64) -> usize {
    PREFAULT_AHEAD.min(usize::try_from(segment_size / 2).unwrap_or(usize::MAX))
}

/// How much of a record a read checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verify {
    Checksum,
    HeaderOnly,
}

/// Why a record is visited: as one step of a walk over the log, which goes
/// on past a damaged stretch (visited as a skipped record, see `damage`), or
/// as the record some index named, which must be there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    Steps,
    Lookup,
}

pub(crate) use append::Planned;
pub(crate) use reader::LogReader;
pub use recovery::RecoveryReport;
pub(crate) use recovery::{RecoveryPlan, files_end, leads_to, restore_short_segments};

pub(crate) use crate::format::record::record_start as normalize;

/// The segments by base offset, oldest first.
type SegmentList = Vec<(u64, Arc<Mapped>)>;

fn segment_list(segments: &BTreeMap<u64, Arc<Mapped>>) -> SegmentList {
    segments.iter().map(|(&base, seg)| (base, Arc::clone(seg))).collect()
}

/// The append-only, segmented commit log.
pub(crate) struct CommitLog {
    dir: PathBuf,
    segment_size: u64,
    tail: Mutex<Tail>,
    segments: RwLock<BTreeMap<u64, Arc<Mapped>>>,
    /// The same table as a list [`LogReader`]s share: replaced whole (never
    /// changed in place) whenever a segment is added or deleted.
    table: RwLock<Arc<SegmentList>>,
    /// Moves whenever `table` is replaced, so a reader knows its copy is
    /// stale with one load.
    table_version: AtomicU64,
    /// End of the last published record: readers may read everything below it.
    write_end: AtomicU64,
    /// Everything below this offset is on disk (the condition variable's
    /// side; `durable_end` mirrors it for readers that do not wait).
    durable: Mutex<u64>,
    durable_end: AtomicU64,
    durable_changed: Condvar,
    /// Tasks awaiting a durable end, by that end (see
    /// [`wake_when_durable`](Self::wake_when_durable)): a sync takes the
    /// ones it covers without looking at the others.
    durable_wakers: Mutex<BTreeMap<u64, Vec<Waker>>>,
    poisoned: AtomicBool,
    poison_reason: Mutex<String>,
    closed: AtomicBool,
    /// Bytes that must stay free beside a new segment, for the indexes.
    disk_reserve: u64,
    /// Where retention moved the pending timers of deleted segments.
    relocated: RelocationArea,
    /// Retention's cap on segments plus relocated copies, in bytes (0: none).
    size_cap: AtomicU64,
    /// Whether the tail segment is of a version that holds deliveries
    /// records (kind 7): every segment this build creates is, so it turns
    /// true at the first roll of a store written by an older build.
    holds_deliveries: AtomicBool,
    /// The tail segment is of version 3 (see `holds_occurrences`).
    holds_occurrences: AtomicBool,
    /// Damaged stretches walkers met below the recovered end.
    damage: damage::DamagedSpans,
}

/// The segment being appended to.
struct Tail {
    writer: MapWriter,
    base: u64,
    end: u64,
}

/// One record read back: its kind and its bytes (frame included), zero-copy.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub offset: u64,
    pub kind: RecordKind,
    pub bytes: Bytes,
}

impl CommitLog {
    /// Opens (recovering) or creates the log in `dir`.
    /// A new segment is only started while `disk_reserve` bytes stay free beside it.
    pub fn open(
        dir: &Path,
        segment_size: u64,
        disk_reserve: u64,
        plan: &RecoveryPlan,
    ) -> Result<(Self, RecoveryReport)> {
        crate::fs::create_dir(dir)?;
        let recovered = recovery::recover(dir, segment_size, plan)?;
        let relocated_dir = dir.join(crate::format::layout::RELOCATED_DIR);
        let mut report = recovered.report.clone();
        let relocated = match plan.mode {
            RecoveryMode::Strict => RelocationArea::open(&relocated_dir, recovered.segments_start())?,
            RecoveryMode::Lenient => {
                let (area, repaired) =
                    RelocationArea::open_repairing(&relocated_dir, recovered.segments_start())?;
                if repaired {
                    report.repaired_headers.push(area.index_path());
                }
                area
            }
        };
        let durable = plan.durable.clamp(recovered.segments_start(), recovered.end);
        let holds_deliveries = segment::version(&recovered.tail) >= 2;
        let holds_occurrences = segment::version(&recovered.tail) >= 3;
        let log = Self {
            dir: dir.to_path_buf(),
            segment_size,
            write_end: AtomicU64::new(recovered.end),
            // What recovery validated may be only in the page cache; the first flush syncs it.
            durable: Mutex::new(durable),
            durable_end: AtomicU64::new(durable),
            durable_changed: Condvar::new(),
            durable_wakers: Mutex::new(BTreeMap::new()),
            tail: Mutex::new(Tail { writer: recovered.tail, base: recovered.tail_base, end: recovered.end }),
            table: RwLock::new(Arc::new(segment_list(&recovered.segments))),
            segments: RwLock::new(recovered.segments),
            table_version: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            poison_reason: Mutex::new(String::new()),
            closed: AtomicBool::new(false),
            disk_reserve,
            relocated,
            size_cap: AtomicU64::new(0),
            holds_deliveries: AtomicBool::new(holds_deliveries),
            holds_occurrences: AtomicBool::new(holds_occurrences),
            damage: damage::DamagedSpans::new(plan.mode),
        };
        log.refuse_unindexed_copies()?;
        Ok((log, report))
    }

    /// Refuses to open if a window file holds a copy that no index entry
    /// names and that is not a leftover of an unfinished pass (a copy of a
    /// record still in the log, matched by its checksum and length): the
    /// index lost entries (deleted, or cut short), the timers they named
    /// would never fire, and the copies cannot rebuild it.
    fn refuse_unindexed_copies(&self) -> Result<()> {
        let copies = self.relocated.unindexed_copies()?;
        if copies.is_empty() {
            return Ok(());
        }
        let mut unmatched: HashMap<(u32, usize), &relocated::Unindexed> =
            copies.iter().map(|c| ((c.crc, c.len), c)).collect();
        let mut at = self.start();
        while at < self.write_end() && !unmatched.is_empty() {
            // A damaged stretch (shorter than a CRC, maybe) is no record a copy was made of.
            let (key, next) = self.visit_trusted(at, |_, kind, bytes| {
                (kind != RecordKind::Skipped).then(|| (get_u32(bytes, 0), bytes.len()))
            })?;
            if let Some(key) = key {
                unmatched.remove(&key);
            }
            at = next;
        }
        match unmatched.values().min_by_key(|c| (&c.file, c.position)) {
            None => {
                tracing::info!(
                    copies = copies.len(),
                    "relocation windows hold leftovers of an unfinished pass"
                );
                Ok(())
            }
            Some(copy) => {
                let why = format!(
                    "a copy ({} bytes) that relocated/index does not name, of no record still in the log: \
                     index entries are missing (was the index deleted or cut short?), and copies do not \
                     record their offsets to rebuild it; restore the index from a backup",
                    copy.len
                );
                Err(Error::corruption(&copy.file, copy.position, CorruptionKind::BadReference(why)))
            }
        }
    }

    /// Offset just past the last published record.
    pub fn write_end(&self) -> u64 {
        self.write_end.load(Ordering::Acquire)
    }

    /// Offset of the first record of the oldest segment.
    pub fn start(&self) -> u64 {
        let segments = self.segments.reading();
        segments.keys().next().map_or(FILE_HEADER_LEN as u64, |base| base + FILE_HEADER_LEN as u64)
    }

    pub fn durable_end(&self) -> u64 {
        self.durable_end.load(Ordering::Acquire)
    }

    /// Replaces the readers' shared table after `segments` changed (called
    /// with its write lock held, so tables are published in order).
    fn publish_table(&self, segments: &BTreeMap<u64, Arc<Mapped>>) {
        *self.table.writing() = Arc::new(segment_list(segments));
        self.table_version.fetch_add(1, Ordering::Release);
    }

    fn segment(&self, base: u64) -> Option<Arc<Mapped>> {
        self.segments.reading().get(&base).cloned()
    }

    /// Where the record at or after `offset` starts: see [`normalize`].
    fn normalize(&self, offset: u64) -> u64 {
        normalize(offset, self.segment_size)
    }

    /// Reads and checks the record at `offset`, which must be below `write_end`.
    /// Padding is followed transparently: the next record is returned.
    pub fn read(&self, offset: u64) -> Result<Record> {
        let share = |seg: &Arc<Mapped>, local, len| seg.bytes(local, len);
        self.read_in(offset, Verify::Checksum, |base| self.segment(base), share)
    }

    /// [`read`](Self::read), checking what `verify` says, finding segments
    /// with `segment_at` (the shared table, or a [`LogReader`]'s copy of it)
    /// and sharing a record's published bytes with `share` (which answers
    /// `None` for bytes not published). A relocated copy is always checked.
    fn read_in<S: Borrow<Arc<Mapped>>>(
        &self,
        offset: u64,
        verify: Verify,
        mut segment_at: impl FnMut(u64) -> Option<S>,
        mut share: impl FnMut(&Arc<Mapped>, usize, usize) -> Option<Bytes>,
    ) -> Result<Record> {
        let mut at = self.normalize(offset);
        loop {
            let seg = segment_at(self.base_of(at));
            let seg = seg.as_ref().map(Borrow::borrow);
            if let Some(resolved) = self.entry_named(seg, at, verify) {
                let bytes = Bytes::copy_from_slice(&resolved?.record);
                return Ok(Record { offset: at, kind: RecordKind::Reschedule, bytes });
            }
            let (local, frame) = match self.locate(seg, at, verify) {
                Ok(found) => found,
                Err(e) => return self.read_relocated(at, e).map(|(record, _)| record),
            };
            if frame.kind == RecordKind::Padding {
                at = self.next_segment_start(at);
                continue;
            }
            let seg = seg.expect("a located record lies in a loaded segment");
            let bytes = share(seg, local, frame.len).expect("a checked frame lies in published bytes");
            return Ok(Record { offset: at, kind: frame.kind, bytes });
        }
    }

    /// Whether a record that checks out (checksum included) starts at
    /// `offset`, in a segment on disk. An occurrences record's entry, which
    /// a lookup by its name reads as a record, does not start one.
    pub fn starts_record(&self, offset: u64) -> bool {
        let at = self.normalize(offset);
        self.locate(self.segment(self.base_of(at)).as_ref(), at, Verify::Checksum).is_ok()
    }

    /// Lends the record at `offset` (padding included) to `f` without sharing
    /// it (no allocation), checking the frame but not the checksum: for the
    /// dispatcher, which only reads records that this process appended or that
    /// recovery validated. Returns `f`'s result and the offset of the next record.
    pub fn visit_trusted<R>(
        &self,
        offset: u64,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        let at = self.normalize(offset);
        self.visit_in(self.segment(self.base_of(at)).as_ref(), at, Verify::HeaderOnly, Walk::Steps, f)
    }

    /// Like [`visit_trusted`](Self::visit_trusted), checking the checksum too:
    /// for records that may predate this process and the last recovery scan.
    pub fn visit_checked<R>(
        &self,
        offset: u64,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        let at = self.normalize(offset);
        self.visit_in(self.segment(self.base_of(at)).as_ref(), at, Verify::Checksum, Walk::Lookup, f)
    }

    /// Like [`visit_checked`](Self::visit_checked), as one step of a walk:
    /// a record that does not check out (its CRC included) starts a damaged
    /// stretch, visited as a skipped record (lenient mode), like
    /// [`visit_trusted`](Self::visit_trusted)'s. For retention's copy pass,
    /// which must not stop for good at one damaged record.
    pub fn walk_checked<R>(
        &self,
        offset: u64,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        let at = self.normalize(offset);
        self.visit_in(self.segment(self.base_of(at)).as_ref(), at, Verify::Checksum, Walk::Steps, f)
    }

    /// Visits the record at `at` (normalized) in `seg`, the segment holding it
    /// if it is loaded; otherwise its relocated copy.
    fn visit_in<R>(
        &self,
        seg: Option<&Arc<Mapped>>,
        at: u64,
        verify: Verify,
        walk: Walk,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        if walk == Walk::Lookup
            && let Some(resolved) = self.entry_named(seg, at, verify)
        {
            let resolved = resolved?;
            return Ok((f(at, RecordKind::Reschedule, &resolved.record), resolved.next));
        }
        let (local, frame) = match self.locate(seg, at, verify) {
            Ok(found) => found,
            Err(e) => {
                let base = self.base_of(at);
                if walk == Walk::Steps
                    && matches!(e, Error::Corruption { .. })
                    && let Some(seg) = seg
                    && let Some(span) = self.damage.span(seg, base, self.segment_size, at)
                {
                    let bytes =
                        seg.read((at - base) as usize, span.len).expect("a span lies in published bytes");
                    return Ok((f(at, RecordKind::Skipped, bytes), self.normalize(span.next)));
                }
                let (record, next) = self.read_relocated(at, e)?;
                return Ok((f(record.offset, record.kind, &record.bytes), next));
            }
        };
        let seg = seg.expect("a located record lies in a loaded segment");
        let bytes = seg.read(local, frame.len).expect("a checked frame lies in published bytes");
        let next = match frame.kind {
            RecordKind::Padding => self.next_segment_start(at),
            _ => self.normalize(at + frame.len as u64),
        };
        Ok((f(at, frame.kind, bytes), next))
    }

    /// After `failed` to find the record at `offset` in a segment: if retention
    /// deleted its segment, the record's relocated copy (checked against its
    /// original offset), or [`Error::Reclaimed`] if it was not pending then;
    /// with the offset of the record after it.
    fn read_relocated(&self, offset: u64, failed: Error) -> Result<(Record, u64)> {
        let at = self.normalize(offset);
        if at >= self.start() {
            return Err(failed);
        }
        let reclaimed = || Error::Reclaimed { offset: at };
        let Some(entry) = self.relocated.find(at)? else {
            // A name inside a copied record: an occurrences record's entry.
            return self.relocated_entry(at)?.ok_or_else(reclaimed);
        };
        let bytes = self.relocated.read(&entry)?.ok_or_else(reclaimed)?;
        let frame = check_frame(&bytes, at).map_err(|e| {
            let path = self.relocated.window_file(entry.window());
            let kind = match e {
                FrameError::Empty => CorruptionKind::BadFrame("zero bytes where a copy should be".into()),
                FrameError::Invalid(kind) => kind,
            };
            Error::corruption(path, entry.position, kind)
        })?;
        if frame.len != bytes.len() {
            let why = format!("copy of {} bytes holds a record of {}", bytes.len(), frame.len);
            let path = self.relocated.window_file(entry.window());
            return Err(Error::corruption(path, entry.position, CorruptionKind::BadFrame(why)));
        }
        let next = self.normalize(at + frame.len as u64);
        Ok((Record { offset: at, kind: frame.kind, bytes }, next))
    }

    /// Damaged stretches walkers stepped over since open, and their bytes.
    pub fn damaged_spans(&self) -> (u64, u64) {
        self.damage.totals()
    }

    /// The relocation area.
    pub fn relocated(&self) -> &RelocationArea {
        &self.relocated
    }

    /// Base offsets of the segments on disk, oldest first.
    pub fn segment_bases(&self) -> Vec<u64> {
        self.segments.reading().keys().copied().collect()
    }

    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    /// Base offset of the segment being appended to.
    pub fn tail_base(&self) -> u64 {
        let end = self.write_end();
        end - end % self.segment_size
    }

    /// Deletes the oldest segment, which must start at `base` and not be the
    /// one being appended to. Readers holding its map keep reading it; new
    /// reads of its records go to the relocation area.
    pub fn delete_oldest_segment(&self, base: u64) -> Result<()> {
        let _tail = self.tail.locked();
        {
            let mut segments = self.segments.writing();
            let oldest = segments.keys().next().copied();
            if oldest != Some(base) || base + self.segment_size > self.tail_base() {
                let why = format!("segment {base} is not the oldest full segment (oldest {oldest:?})");
                return Err(Error::invalid("retention", why));
            }
            // Unlink first: a failed unlink leaves the log as it was.
            let path = segment::segment_path(&self.dir, base);
            crate::fs::remove_file(&path)?;
            segments.remove(&base);
            self.publish_table(&segments);
        }
        let path = segment::segment_path(&self.dir, base);
        crate::fs::sync_dir(&self.dir)?;
        tracing::info!(segment = %path.display(), "deleted a commit-log segment");
        Ok(())
    }

    fn next_segment_start(&self, offset: u64) -> u64 {
        offset - offset % self.segment_size + self.segment_size + FILE_HEADER_LEN as u64
    }

    /// Checks the record at `at` (normalized) in `seg`, the segment holding
    /// it if it is loaded. Returns its position in the segment and its frame.
    fn locate(&self, seg: Option<&Arc<Mapped>>, at: u64, verify: Verify) -> Result<(usize, Frame)> {
        let seg = seg.ok_or_else(|| self.missing(at))?;
        let local = (at - self.base_of(at)) as usize;
        // An offset past what is published reads as missing, below.
        let visible = seg.published().saturating_sub(local);
        let bytes = seg.read(local, visible).ok_or_else(|| self.missing(at))?;
        let frame = match verify {
            Verify::Checksum => check_frame(bytes, at),
            Verify::HeaderOnly => check_header(bytes),
        };
        let frame = frame.map_err(|e| self.frame_error(seg, local, e))?;
        Ok((local, frame))
    }

    /// The base offset of the segment holding `offset`.
    fn base_of(&self, offset: u64) -> u64 {
        offset - offset % self.segment_size
    }

    /// A corruption error for the record at log `offset`, naming its segment file.
    pub fn corruption_at(&self, offset: u64, kind: CorruptionKind) -> Error {
        let base = offset - offset % self.segment_size;
        Error::corruption(segment::segment_path(&self.dir, base), offset - base, kind)
    }

    fn missing(&self, offset: u64) -> Error {
        let base = offset - offset % self.segment_size;
        let why = format!("no published record at log offset {offset}");
        Error::corruption(
            segment::segment_path(&self.dir, base),
            offset - base,
            CorruptionKind::BadReference(why),
        )
    }

    fn frame_error(&self, seg: &Mapped, local: usize, e: FrameError) -> Error {
        let kind = match e {
            FrameError::Empty => CorruptionKind::BadFrame("zero bytes where a record should be".into()),
            FrameError::Invalid(kind) => kind,
        };
        Error::corruption(seg.path(), local as u64, kind)
    }

    /// Faults in the active segment's pages ahead of the writer, so appends
    /// copy into ready pages instead of taking a page fault (and the kernel's
    /// page zeroing) every 4 KiB. Returns whether there was anything to do.
    pub fn prefault_ahead(&self) -> bool {
        let end = self.write_end();
        let base = end - end % self.segment_size;
        let Some(seg) = self.segment(base) else { return false };
        let target = (end - base) as usize + prefault_window(self.segment_size);
        if seg.prefaulted() >= target.min(seg.len()) {
            return false;
        }
        let mut at = seg.prefaulted();
        while at < target.min(seg.len()) {
            at += PREFAULT_CHUNK;
            seg.prefault_to(at);
        }
        true
    }

    /// Whether the writer is within half the prefault window of the faulted pages.
    fn needs_prefault(&self, tail: &Tail) -> bool {
        let local = (tail.end - tail.base) as usize;
        let ready = tail.writer.shared().prefaulted();
        ready < tail.writer.shared().len() && ready < local + prefault_window(self.segment_size) / 2
    }

    /// Syncs everything published so far; returns the new durable end.
    /// A failure poisons the log: the page cache's state is then unknowable.
    pub fn flush(&self) -> Result<u64> {
        self.check_poison()?;
        let end = self.write_end();
        let from = self.durable_end();
        if end > from {
            if let Err(e) = self.sync_range(from, end) {
                self.poison(&format!("flush: {e}"));
                return Err(e);
            }
            // Two flushes may overlap (the flusher's and retention's): the
            // durable end only moves forward.
            let mut durable = self.durable.locked();
            *durable = (*durable).max(end);
            self.durable_end.store(*durable, Ordering::Release);
            #[cfg(feature = "crash-recorder")]
            crate::recorder::log_durable(&self.dir, *durable);
        }
        self.durable_changed.notify_all();
        self.wake_durable(end);
        Ok(end)
    }

    /// Has `waker` woken once the log is durable to `end` (or poisoned).
    /// Register first, then look at [`durable_end`](Self::durable_end): a
    /// flush moves the durable end before it wakes, so either the look
    /// sees the new end or the flush sees the waker.
    pub fn wake_when_durable(&self, end: u64, waker: &Waker) {
        let mut wakers = self.durable_wakers.locked();
        wakers.entry(end).or_default().push(waker.clone());
    }

    /// Wakes the tasks awaiting a durable end at or below `durable`.
    fn wake_durable(&self, durable: u64) {
        let ready = {
            let mut wakers = self.durable_wakers.locked();
            let waiting = match durable.checked_add(1) {
                Some(above) => wakers.split_off(&above),
                None => BTreeMap::new(),
            };
            std::mem::replace(&mut *wakers, waiting)
        };
        ready.into_values().flatten().for_each(Waker::wake);
    }

    fn sync_range(&self, from: u64, to: u64) -> Result<()> {
        let mut at = from;
        while at < to {
            let base = at - at % self.segment_size;
            let until = to.min(base + self.segment_size);
            let seg = self.segment(base).ok_or_else(|| self.missing(at))?;
            // Every byte below `to` is published, never written again.
            seg.flush_appended((at - base) as usize, (until - at) as usize)?;
            at = until;
        }
        Ok(())
    }

    /// Blocks until `offset` is durable (group commit: one flush serves every
    /// waiter), or the log is poisoned, or `timeout` passes: `Ok(false)`.
    pub fn wait_durable(&self, offset: u64, timeout: Duration) -> Result<bool> {
        let deadline = std::time::Instant::now() + timeout;
        let mut durable = self.durable.locked();
        while *durable < offset {
            self.check_poison()?;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            durable = self.durable_changed.wait_timeout(durable, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(true)
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Refuses further appends; returns once no append is in progress.
    pub fn close(&self) {
        let _tail = self.tail.locked();
        self.closed.store(true, Ordering::Release);
    }

    pub fn poison(&self, reason: &str) {
        tracing::error!(reason, "poisoning the store: writes are refused until it is reopened");
        *self.poison_reason.locked() = reason.to_string();
        self.poisoned.store(true, Ordering::Release);
        self.durable_changed.notify_all();
        self.wake_durable(u64::MAX);
    }

    pub fn check_poison(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            let reason = self.poison_reason.locked().clone();
            return Err(Error::Poisoned { reason });
        }
        Ok(())
    }

    /// Total bytes of the segment files.
    pub fn disk_bytes(&self) -> u64 {
        self.segments.reading().len() as u64 * self.segment_size
    }
}

#[cfg(test)]
mod tests;
