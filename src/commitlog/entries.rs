//! Lookups of timers named by an entry of an occurrences record (kind 8).
//!
//! A timer is named by the offset of the record that made it, and an
//! occurrences record makes one per entry, each named by the entry's own
//! offset (see `format::record::occurrences`). A lookup by such a name
//! (never a walk: walkers step from record to record and meet the whole
//! record) is answered with the occurrence record (kind 6) the entry stands
//! for, as if it had been written at the name: every reader that follows a
//! timer's name to its record, its schedule and its instant reads it as it
//! reads a kind-6 record. The bytes are made here, sealed at the name; they
//! are not on disk, and a reader must not take their length for the space
//! the record takes in the log (walkers never see them).

use std::sync::Arc;

use bytes::Bytes;

use super::{CommitLog, Record, Verify};
use crate::error::{CorruptionKind, Error, Result};
use crate::format::FILE_HEADER_LEN;
use crate::format::record::{
    OCCURRENCE_ENTRY_LEN, OCCURRENCE_LEN, OccurrencesView, RecordKind, RescheduleView, check_frame,
    containing_record,
};
use crate::mmap::Mapped;

/// Bytes from an entry's start that say it is one: its marker and index.
const MARK_LEN: usize = 10;

/// What a lookup of an entry's name finds.
pub(super) struct Resolved {
    /// The entry's record, re-encoded as a kind-6 record at the name.
    pub record: [u8; OCCURRENCE_LEN],
    /// The record after the occurrences record.
    pub next: u64,
}

impl CommitLog {
    /// If `at` (normalized, in `seg`) is an entry of an occurrences record,
    /// the record that entry stands for; `None` if the bytes at `at` are not
    /// marked as an entry (they are a record, or damage `locate` reports).
    pub(super) fn entry_named(
        &self,
        seg: Option<&Arc<Mapped>>,
        at: u64,
        verify: Verify,
    ) -> Option<Result<Resolved>> {
        let record_at = self.entry_record(seg, at)?;
        Some(self.resolve_in(seg?, record_at, at, verify))
    }

    /// Where the record starts whose entry `at` (normalized, in `seg`) is
    /// marked to be; `None` if the bytes there are not marked as an entry.
    pub(super) fn entry_record(&self, seg: Option<&Arc<Mapped>>, at: u64) -> Option<u64> {
        let seg = seg?;
        let local = (at - self.base_of(at)) as usize;
        let visible = seg.published().saturating_sub(local).min(MARK_LEN);
        containing_record(at, seg.read(local, visible)?)
    }

    /// Entry `at` of the occurrences record that should be at `record_at` in `seg`.
    fn resolve_in(&self, seg: &Arc<Mapped>, record_at: u64, at: u64, verify: Verify) -> Result<Resolved> {
        if record_at < self.base_of(at) + FILE_HEADER_LEN as u64 {
            return Err(self.corruption_at(at, not_an_entry(at, "a record before its segment's first")));
        }
        let (local, frame) = self.locate(Some(seg), record_at, verify)?;
        let bytes = seg.read(local, frame.len).expect("a checked frame lies in published bytes");
        let view = self.entry_of(record_at, frame.kind, bytes, at)?;
        Ok(Resolved { record: encoded(&view, at), next: self.normalize(record_at + frame.len as u64) })
    }

    /// The entry at `at` of the record `bytes` (of `kind`, checked) at `record_at`.
    fn entry_of(&self, record_at: u64, kind: RecordKind, bytes: &[u8], at: u64) -> Result<RescheduleView> {
        // An entry starts 24 (i + 1) bytes into its record, and lies inside it.
        let into = at.checked_sub(record_at).and_then(|d| usize::try_from(d).ok()).unwrap_or(0);
        let aligned = into >= OCCURRENCE_ENTRY_LEN && into.is_multiple_of(OCCURRENCE_ENTRY_LEN);
        if kind != RecordKind::Occurrences || !aligned || into + OCCURRENCE_ENTRY_LEN > bytes.len() {
            let why = format!("a {kind:?} record of {} bytes at {record_at}", bytes.len());
            return Err(self.corruption_at(at, not_an_entry(at, &why)));
        }
        let (name, view) = OccurrencesView::entry_at(bytes, record_at, into / OCCURRENCE_ENTRY_LEN - 1)
            .map_err(|kind| self.corruption_at(record_at, kind))?;
        if name != at {
            return Err(self.corruption_at(at, not_an_entry(at, "an entry of another name")));
        }
        Ok(view)
    }

    /// A name inside a record retention copied: the copy holding it, checked
    /// at its original offset, resolved as in a segment; with the offset of
    /// the record after it. `None` if no copy holds `at`, or the copy's
    /// bytes there are not marked as an entry of it (a name no timer has).
    pub(super) fn relocated_entry(&self, at: u64) -> Result<Option<(Record, u64)>> {
        let Some(entry) = self.relocated.find_containing(at)? else { return Ok(None) };
        let Some(bytes) = self.relocated.read(&entry)? else { return Ok(None) };
        let into = usize::try_from(at - entry.original_offset).unwrap_or(usize::MAX);
        if bytes.get(into..).and_then(|b| containing_record(at, b)) != Some(entry.original_offset) {
            return Ok(None);
        }
        let path = || self.relocated.window_file(entry.window());
        let frame = check_frame(&bytes, entry.original_offset).map_err(|e| {
            let why = format!("copy of the record holding log offset {at} does not check out: {e:?}");
            Error::corruption(path(), entry.position, CorruptionKind::BadFrame(why))
        })?;
        if frame.len != bytes.len() {
            let why = format!("copy of {} bytes holds a record of {}", bytes.len(), frame.len);
            return Err(Error::corruption(path(), entry.position, CorruptionKind::BadFrame(why)));
        }
        let view = self.entry_of(entry.original_offset, frame.kind, &bytes, at)?;
        let bytes = Bytes::copy_from_slice(&encoded(&view, at));
        let next = self.normalize(entry.original_offset + u64::from(entry.len));
        Ok(Some((Record { offset: at, kind: RecordKind::Reschedule, bytes }, next)))
    }
}

/// `view` as the kind-6 record it stands for, sealed at `at`.
fn encoded(view: &RescheduleView, at: u64) -> [u8; OCCURRENCE_LEN] {
    let mut record = [0; OCCURRENCE_LEN];
    debug_assert_eq!(view.record_len(), OCCURRENCE_LEN, "an entry stands for an occurrence's record");
    view.encode(&mut record, at);
    record
}

fn not_an_entry(at: u64, why: &str) -> CorruptionKind {
    CorruptionKind::BadReference(format!(
        "log offset {at} is marked as an occurrence's entry, but lies in {why}"
    ))
}
