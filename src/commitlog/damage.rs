//! Damaged stretches of the log, met by the readers that walk it.
//!
//! Recovery validates the log from the checkpoint on; older records are
//! checked when they are read. A reader walking records (the dispatcher's
//! replay, the scan for settled timers, the rebuilds of the indexes) that
//! meets a frame that does not check out below the recovered end cannot step
//! over it by its length. In lenient mode (the default) the stretch from
//! there to the next record that checks out
//! ([`next_valid_record`](crate::format::record::next_valid_record)), or to
//! the end of its segment's records, is damage: it is visited as a skipped
//! record, logged once with its file, offset and length, and counted. Every
//! walker finds the same stretch, so all of them agree on what the log holds
//! after it (`wheel-dump` uses the same search). In strict mode the walker
//! gets the corruption error.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::config::RecoveryMode;
use crate::format::FILE_HEADER_LEN;
use crate::format::record::next_valid_record;
use crate::mmap::Mapped;
use crate::sync::Locked;

/// A damaged stretch: its length, and where the next record starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    pub len: usize,
    pub next: u64,
}

/// The damaged stretches found so far, and whether walkers step over them.
pub(super) struct DamagedSpans {
    lenient: bool,
    /// By start offset: every walker of a stretch gets the first answer, and
    /// the byte-by-byte search runs once per stretch.
    found: Mutex<BTreeMap<u64, Span>>,
}

impl DamagedSpans {
    pub fn new(mode: RecoveryMode) -> Self {
        Self { lenient: mode == RecoveryMode::Lenient, found: Mutex::new(BTreeMap::new()) }
    }

    /// The damaged stretch starting at log offset `at`, a record that did not
    /// check out in the published bytes of `seg` (the segment at `base`, of
    /// `size` bytes); `None` in strict mode or past the published bytes.
    pub fn span(&self, seg: &Mapped, base: u64, size: u64, at: u64) -> Option<Span> {
        let local = (at - base) as usize;
        let published = seg.published();
        if !self.lenient || local >= published {
            return None;
        }
        let mut found = self.found.locked();
        if let Some(&span) = found.get(&at) {
            return Some(span);
        }
        let bytes = seg.read(0, published)?;
        let span = match next_valid_record(bytes, base, local + 1) {
            Some(valid) => Span { len: valid - local, next: base + valid as u64 },
            // A sealed segment's records end at its end; the tail's at the end of the log.
            None if published as u64 == size => {
                Span { len: published - local, next: base + size + FILE_HEADER_LEN as u64 }
            }
            None => Span { len: published - local, next: base + published as u64 },
        };
        tracing::error!(
            file = %seg.path().display(),
            offset = local,
            len = span.len,
            next_record = span.next,
            "damaged bytes in the commit log skipped: the records in them are lost"
        );
        found.insert(at, span);
        Some(span)
    }

    /// How many damaged stretches were found since open, and their bytes.
    pub fn totals(&self) -> (u64, u64) {
        let found = self.found.locked();
        (found.len() as u64, found.values().map(|s| s.len as u64).sum())
    }
}
