//! Walking the commit log's frames from one record boundary toward another,
//! over whatever reads the segments: the store's maps at recovery, a tool's
//! `pread`s. It is how recovery proves a checkpoint's `dispatched` (see
//! [`checkpoint::trusted`](super::checkpoint::trusted)), so the store and
//! the tools that judge it cannot disagree about which checkpoint stands.

use std::borrow::Cow;

use crate::error::CorruptionKind;
use crate::format::FILE_HEADER_LEN;
use crate::format::record::{
    FrameError, RECORD_HEADER_LEN, RecordKind, check_header_in, next_valid_record, record_start,
};

/// Reads a segment's bytes for a walk.
pub trait SegmentReader {
    /// What a read fails with.
    type Error;
    /// `len` bytes of the segment starting at log offset `base`, from its
    /// byte `local` on (`local + len` is within the segment); `None` if the
    /// log has no such segment.
    fn read(&mut self, base: u64, local: usize, len: usize) -> Result<Option<Cow<'_, [u8]>>, Self::Error>;
}

/// Where a walk from one offset toward another ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lead {
    /// The records lead exactly to the offset (or, lenient, it lies in a
    /// damaged stretch, where nothing can be checked).
    Reached,
    /// They do not: they step past it, or the log ends before it.
    NotReached,
    /// Strict only: a frame that does not check out, followed by one that
    /// does in its segment (damage to durable records), at byte `local` of
    /// the segment starting at `base`.
    Damaged {
        /// The log offset where the segment starts.
        base: u64,
        /// The damaged frame's byte in the segment.
        local: usize,
        /// What is wrong with it.
        kind: CorruptionKind,
    },
}

/// Whether the records from `from` on, stepped over by their lengths, lead
/// exactly to `to` in a log of segments of `size` bytes: a checkpoint's
/// `dispatched` is a record boundary the log reaches, which the previous
/// checkpoint's proves. Only frame headers are checked: a record whose body
/// is damaged is still a step (recovery and the readers judge it), where a
/// failed checksum here would throw away a checkpoint that is right. A frame
/// that does not check out between the two is damage to durable records
/// (both marks lie below the newer checkpoint's `log durable`) if a record
/// that checks out follows it in its segment: [`Lead::Damaged`] if `strict`;
/// otherwise the walk steps over it as every reader does, and a `to` inside
/// the damaged stretch is taken as reached, since nothing there can be
/// checked (distrusting the checkpoint would make its durable records a torn
/// tail). With nothing valid after it, it is where the log ends.
pub fn leads_to<R: SegmentReader>(
    segments: &mut R,
    size: u64,
    from: u64,
    to: u64,
    strict: bool,
) -> Result<Lead, R::Error> {
    let (mut at, to) = (record_start(from, size), record_start(to, size));
    while at < to {
        let base = at - at % size;
        let local = (at - base) as usize;
        let room = size as usize - local;
        debug_assert!(room >= RECORD_HEADER_LEN, "record_start leaves room for a frame header");
        let Some(header) = segments.read(base, local, RECORD_HEADER_LEN)? else {
            return Ok(Lead::NotReached);
        };
        let problem = match check_header_in(&header, room) {
            Ok(frame) if frame.kind == RecordKind::Padding => {
                at = base + size + FILE_HEADER_LEN as u64;
                continue;
            }
            Ok(frame) => {
                at = record_start(at + frame.len as u64, size);
                continue;
            }
            Err(problem) => problem,
        };
        let Some(rest) = segments.read(base, local, room)? else { return Ok(Lead::NotReached) };
        // Nothing valid after it in its segment: the log's end, not damage.
        let Some(valid) = next_valid_record(&rest, at, 1) else { return Ok(Lead::NotReached) };
        if strict {
            let kind = match problem {
                FrameError::Empty => {
                    CorruptionKind::BadFrame("zeros where a durable record should be".into())
                }
                FrameError::Invalid(kind) => kind,
            };
            return Ok(Lead::Damaged { base, local, kind });
        }
        let next = at + valid as u64;
        if to < next {
            return Ok(Lead::Reached);
        }
        at = next;
    }
    Ok(if at == to { Lead::Reached } else { Lead::NotReached })
}

/// Where the log's files end, given the base of the last segment on disk:
/// past it (the first record of a segment not made yet, which a checkpoint
/// may name), or at the first record of segment 0 if there is none.
pub fn files_end(last_segment: Option<u64>, size: u64) -> u64 {
    let header = FILE_HEADER_LEN as u64;
    last_segment.map_or(header, |last| last + size + header)
}
