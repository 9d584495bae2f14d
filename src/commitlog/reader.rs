//! A reader with its own copy of the segment table.
//!
//! [`CommitLog::read`] looks a segment up in the shared table under a lock and
//! clones its `Arc`: two atomic writes to cache lines every reading thread
//! shares. At a million random reads a second (the dispatcher and a consumer
//! following deliveries to their messages) that ping-pong between cores was
//! the largest cost of a burst of deliveries. A `LogReader` keeps a private
//! copy of the table and re-copies it only when a segment has been added or
//! deleted, which one atomic load tells.
//!
//! A copy may briefly hold a segment that retention has just deleted. Its map
//! stays valid while held, and records never change once published, so what
//! is read there is what the relocation area or the segment would have said.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{CommitLog, Record, RecordKind, Verify};
use crate::error::Result;
use crate::mmap::Mapped;

/// How much of a record [`LogReader::touch`] loads: a typical message.
const TOUCHED: usize = 256;
const CACHE_LINE: usize = 64;

/// Reads the commit log through a private copy of its segment table.
pub(crate) struct LogReader {
    log: Arc<CommitLog>,
    /// The table version the copy was made at (`None`: never made).
    version: Option<u64>,
    /// The segments by base offset, oldest first.
    segments: Vec<(u64, Arc<Mapped>)>,
}

impl LogReader {
    pub fn new(log: Arc<CommitLog>) -> Self {
        Self { log, version: None, segments: Vec::new() }
    }

    /// Like [`CommitLog::read`].
    pub fn read(&mut self, offset: u64) -> Result<Record> {
        self.refresh();
        let segments = &self.segments;
        self.log.read_in(offset, |base| find(segments, base).cloned())
    }

    /// Like [`CommitLog::visit_trusted`].
    pub fn visit_trusted<R>(
        &mut self,
        offset: u64,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        self.visit(offset, Verify::HeaderOnly, f)
    }

    /// Like [`CommitLog::visit_checked`].
    pub fn visit_checked<R>(
        &mut self,
        offset: u64,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        self.visit(offset, Verify::Checksum, f)
    }

    fn visit<R>(
        &mut self,
        offset: u64,
        verify: Verify,
        f: impl FnOnce(u64, RecordKind, &[u8]) -> R,
    ) -> Result<(R, u64)> {
        self.refresh();
        let at = self.log.normalize(offset);
        let seg = find(&self.segments, self.log.base_of(at));
        self.log.visit_in(seg, at, verify, f)
    }

    /// Loads the first bytes of the record at `offset`, if it is in a loaded
    /// segment, and returns one of them. A reader about to follow many
    /// references to random places touches them all first: independent loads
    /// let the CPU wait for many cache and TLB misses at once, where reading
    /// record after record would wait for each in turn.
    pub fn touch(&mut self, offset: u64) -> u8 {
        self.refresh();
        let at = self.log.normalize(offset);
        let Some(seg) = find(&self.segments, self.log.base_of(at)) else { return 0 };
        let local = (at - self.log.base_of(at)) as usize;
        let visible = seg.published().saturating_sub(local).min(TOUCHED);
        let Some(bytes) = seg.read(local, visible) else { return 0 };
        bytes.iter().step_by(CACHE_LINE).fold(0, |acc, b| acc ^ b)
    }

    /// Re-copies the table if a segment was added or deleted since the last copy.
    fn refresh(&mut self) {
        let version = self.log.table_version.load(Ordering::Acquire);
        if self.version == Some(version) {
            return;
        }
        // Read the version before the table: a change in between only makes
        // the next call copy again.
        let table = self.log.segments.read().unwrap_or_else(|e| e.into_inner());
        self.segments = table.iter().map(|(&base, seg)| (base, Arc::clone(seg))).collect();
        self.version = Some(version);
    }
}

fn find(segments: &[(u64, Arc<Mapped>)], base: u64) -> Option<&Arc<Mapped>> {
    segments.binary_search_by_key(&base, |(b, _)| *b).ok().map(|i| &segments[i].1)
}
