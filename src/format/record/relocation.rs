//! Relocation records: retention copied a segment's pending timers and
//! cancels before deleting it.

use super::{RECORD_HEADER_LEN, RecordKind, seal, write_header};
use crate::error::CorruptionKind;
use crate::format::{get_u64, put_u64};

// Relocation body layout, after the frame header.
const R_RELOCATED_AT: usize = RECORD_HEADER_LEN;
const R_SEGMENT: usize = R_RELOCATED_AT + 8;
const R_TIMERS: usize = R_SEGMENT + 8;
const R_CANCELS: usize = R_TIMERS + 8;
const R_BYTES: usize = R_CANCELS + 8;
/// Length of a relocation record.
pub const RELOCATION_LEN: usize = R_BYTES + 8;

/// A decoded relocation record: at `relocated_at_ms`, the `timers` pending
/// timers and the `cancels` cancels of timers not yet due of the segment
/// starting at `segment_base` (`bytes` of records in all) were copied to the
/// relocation area, and the segment is then deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelocationView {
    /// When the segment's records were copied.
    pub relocated_at_ms: u64,
    /// The deleted segment's start offset.
    pub segment_base: u64,
    /// Pending timers' messages copied.
    pub timers: u64,
    /// Cancels of timers not yet due copied.
    pub cancels: u64,
    /// Bytes copied.
    pub bytes: u64,
}

impl RelocationView {
    /// Writes the record at log `offset` into `buf` ([`RELOCATION_LEN`] bytes).
    pub fn encode(&self, buf: &mut [u8], offset: u64) {
        write_header(buf, RecordKind::Relocation, RELOCATION_LEN);
        put_u64(buf, R_RELOCATED_AT, self.relocated_at_ms);
        put_u64(buf, R_SEGMENT, self.segment_base);
        put_u64(buf, R_TIMERS, self.timers);
        put_u64(buf, R_CANCELS, self.cancels);
        put_u64(buf, R_BYTES, self.bytes);
        seal(buf, offset, RELOCATION_LEN);
    }

    /// Decodes a relocation record whose frame and CRC were checked.
    pub fn parse(record: &[u8]) -> Result<Self, CorruptionKind> {
        if record.len() != RELOCATION_LEN {
            return Err(CorruptionKind::BadFrame(format!("relocation record of {} bytes", record.len())));
        }
        Ok(Self {
            relocated_at_ms: get_u64(record, R_RELOCATED_AT),
            segment_base: get_u64(record, R_SEGMENT),
            timers: get_u64(record, R_TIMERS),
            cancels: get_u64(record, R_CANCELS),
            bytes: get_u64(record, R_BYTES),
        })
    }
}
