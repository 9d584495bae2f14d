//! A reader with its own reference to the segment table.
//!
//! [`CommitLog::read`] looks a segment up in the shared table under a lock and
//! clones its `Arc`: two atomic writes to cache lines every reading thread
//! shares. At a million random reads a second (the dispatcher and a consumer
//! following deliveries to their messages) that ping-pong between cores was
//! the largest cost of a burst of deliveries. A `LogReader` takes the log's
//! current table (an immutable list, replaced whenever a segment is added or
//! deleted) once, and takes it again only when the table has been replaced,
//! which one atomic load tells.
//!
//! Holding a table keeps its segments mapped, including one retention has
//! just deleted: its map stays valid and its records are unchanged, but its
//! disk space is only freed once no table holds it. So a reader holds a table
//! only while it works: its owner calls [`LogReader::release`] before it
//! returns or waits (the dispatcher after each pass, a consumer after each
//! poll).
//!
//! A reader also shares out the records it reads as slices of one [`Bytes`]
//! over the published part of the segment it last read from: one reference
//! count per record, where a `Bytes` of its own would be an allocation (a
//! consumer reading a burst of a million deliveries paid a fifth of its time
//! allocating and freeing them).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{CommitLog, Record, RecordKind, SegmentList, Verify, Walk};
use crate::error::Result;
use crate::mmap::Mapped;
use crate::sync::ReadWrite;

/// How much of a record [`LogReader::touch`] loads: a typical message.
const TOUCHED: usize = 256;
const CACHE_LINE: usize = 64;

/// Reads the commit log through a shared, immutable copy of its segment table.
pub(crate) struct LogReader {
    log: Arc<CommitLog>,
    /// The table and the version it was taken at (`None`: none held).
    table: Option<(u64, Arc<SegmentList>)>,
    /// The published bytes of the segment last read from, when they were
    /// taken, and that segment's map.
    published: Option<(Arc<Mapped>, Bytes)>,
    /// The occurrences record whose checksum this reader checked last: a
    /// lookup of another of its entries checks its frame only. (A second of
    /// schedules' timers is checked as it is loaded, entry after entry of
    /// the same records: each would take the checksum of a record of up to
    /// 256 entries again.)
    checked_entries: Option<u64>,
}

impl LogReader {
    pub fn new(log: Arc<CommitLog>) -> Self {
        Self { log, table: None, published: None, checked_entries: None }
    }

    /// Lets go of the table, so the segments retention deletes meanwhile are
    /// not kept on disk by this reader.
    pub fn release(&mut self) {
        self.table = None;
        self.published = None;
        self.checked_entries = None;
    }

    /// Like [`CommitLog::read`].
    pub fn read(&mut self, offset: u64) -> Result<Record> {
        self.read_checking(offset, true)
    }

    /// [`read`](Self::read), checking the record's checksum only if
    /// `checksum` (its frame always): for a record this reader's owner
    /// checked before.
    pub fn read_checking(&mut self, offset: u64, checksum: bool) -> Result<Record> {
        let segments = current(&self.log, &mut self.table);
        let at = self.log.normalize(offset);
        let verify = if checksum { Verify::Checksum } else { Verify::HeaderOnly };
        let (verify, entry_of) =
            memo(&self.log, self.checked_entries, find(segments, self.log.base_of(at)), at, verify);
        let published = &mut self.published;
        let read = self.log.read_in(
            offset,
            verify,
            |base| find(segments, base),
            |seg, local, len| share(published, seg, local, len),
        );
        if read.is_ok() && entry_of.is_some() {
            self.checked_entries = entry_of;
        }
        read
    }

    /// Like [`CommitLog::visit_trusted`].
    pub fn visit_trusted<R>(
        &mut self,
        offset: u64,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        self.visit(offset, Verify::HeaderOnly, Walk::Steps, f)
    }

    /// [`visit_checked`](Self::visit_checked) if `checksum`, else
    /// [`visit_trusted`](Self::visit_trusted).
    pub fn visit_checking<R>(
        &mut self,
        offset: u64,
        checksum: bool,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        self.visit(offset, if checksum { Verify::Checksum } else { Verify::HeaderOnly }, Walk::Lookup, f)
    }

    /// Like [`CommitLog::visit_checked`].
    pub fn visit_checked<R>(
        &mut self,
        offset: u64,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        self.visit(offset, Verify::Checksum, Walk::Lookup, f)
    }

    fn visit<R>(
        &mut self,
        offset: u64,
        verify: Verify,
        walk: Walk,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        let segments = current(&self.log, &mut self.table);
        let at = self.log.normalize(offset);
        let seg = find(segments, self.log.base_of(at));
        let (verify, entry_of) = match walk {
            Walk::Lookup => memo(&self.log, self.checked_entries, seg, at, verify),
            Walk::Steps => (verify, None),
        };
        let visited = self.log.visit_in(seg, at, verify, walk, f);
        if visited.is_ok() && entry_of.is_some() {
            self.checked_entries = entry_of;
        }
        visited
    }

    /// Loads the first bytes of the record at `offset`, if it is in a loaded
    /// segment, and returns one of them. A reader about to follow many
    /// references to random places touches them all first: independent loads
    /// let the CPU wait for many cache and TLB misses at once, where reading
    /// record after record would wait for each in turn.
    pub fn touch(&mut self, offset: u64) -> u8 {
        let segments = current(&self.log, &mut self.table);
        let at = self.log.normalize(offset);
        let Some(seg) = find(segments, self.log.base_of(at)) else { return 0 };
        let local = (at - self.log.base_of(at)) as usize;
        // An offset past what is published (not yet appended) shows nothing.
        let visible = seg.published().saturating_sub(local).min(TOUCHED);
        let Some(bytes) = seg.read(local, visible) else { return 0 };
        bytes.iter().step_by(CACHE_LINE).fold(0, |acc, b| acc ^ b)
    }
}

/// The published bytes `[local, local + len)` of `seg`, as a slice of
/// `published` if that holds them, else of the segment's published bytes as
/// they are now, which `published` then keeps.
fn share(
    published: &mut Option<(Arc<Mapped>, Bytes)>,
    seg: &Arc<Mapped>,
    local: usize,
    len: usize,
) -> Option<Bytes> {
    let end = local.checked_add(len)?;
    let held = published.as_ref().filter(|(map, bytes)| Arc::ptr_eq(map, seg) && end <= bytes.len());
    if let Some((_, bytes)) = held {
        return Some(bytes.slice(local..end));
    }
    let whole = seg.bytes(0, seg.published())?;
    if end > whole.len() {
        return None;
    }
    let bytes = whole.slice(local..end);
    *published = Some((Arc::clone(seg), whole));
    Some(bytes)
}

/// The log's current table: the one `held` if it is still current, otherwise
/// taken afresh. The version is read before the table, so a change in between
/// only makes the next call take it again.
fn current<'a>(log: &CommitLog, held: &'a mut Option<(u64, Arc<SegmentList>)>) -> &'a SegmentList {
    let version = log.table_version.load(Ordering::Acquire);
    if held.as_ref().is_none_or(|(v, _)| *v != version) {
        let table = Arc::clone(&log.table.reading());
        *held = Some((version, table));
    }
    &held.as_ref().expect("just taken").1
}

/// How to check a lookup of `at`: if it is an entry of the occurrences
/// record `checked` (whose checksum passed), its frame only. Also the record
/// whose checksum the lookup checks, if it is an entry's.
fn memo(
    log: &CommitLog,
    checked: Option<u64>,
    seg: Option<&Arc<Mapped>>,
    at: u64,
    verify: Verify,
) -> (Verify, Option<u64>) {
    if verify != Verify::Checksum {
        return (verify, None);
    }
    match log.entry_record(seg, at) {
        Some(record) if checked == Some(record) => (Verify::HeaderOnly, None),
        record => (verify, record),
    }
}

fn find(segments: &[(u64, Arc<Mapped>)], base: u64) -> Option<&Arc<Mapped>> {
    segments.binary_search_by_key(&base, |(b, _)| *b).ok().map(|i| &segments[i].1)
}
