//! Records that change a pending timer: a cancel and a reschedule.

use super::{RECORD_HEADER_LEN, RecordKind, seal, write_header};
use crate::error::CorruptionKind;
use crate::format::{get_u64, put_u64};

// Cancel body layout, after the frame header.
const C_CANCELLED_AT: usize = RECORD_HEADER_LEN;
const C_MESSAGE_OFFSET: usize = C_CANCELLED_AT + 8;
const C_DELIVER_AT: usize = C_MESSAGE_OFFSET + 8;
/// Length of a cancel record.
pub const CANCEL_LEN: usize = C_DELIVER_AT + 8;

/// Encodes a cancel record: the timer of the message at `message_offset`
/// (due at `deliver_at_ms`) was cancelled at `cancelled_at_ms`.
pub fn encode_cancel(
    buf: &mut [u8],
    offset: u64,
    cancelled_at_ms: u64,
    message_offset: u64,
    deliver_at_ms: u64,
) {
    write_header(buf, RecordKind::Cancel, CANCEL_LEN);
    put_u64(buf, C_CANCELLED_AT, cancelled_at_ms);
    put_u64(buf, C_MESSAGE_OFFSET, message_offset);
    put_u64(buf, C_DELIVER_AT, deliver_at_ms);
    seal(buf, offset, CANCEL_LEN);
}

/// A decoded cancel record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelView {
    /// When the cancel was recorded (epoch ms).
    pub cancelled_at_ms: u64,
    /// The timed message record it cancels.
    pub message_offset: u64,
    /// That timer's deliver time: with the offset, the handle.
    pub deliver_at_ms: u64,
}

impl CancelView {
    /// Decodes a cancel record whose frame and CRC were checked.
    pub fn parse(record: &[u8]) -> Result<Self, CorruptionKind> {
        if record.len() != CANCEL_LEN {
            return Err(CorruptionKind::BadFrame(format!("cancel record of {} bytes", record.len())));
        }
        Ok(Self {
            cancelled_at_ms: get_u64(record, C_CANCELLED_AT),
            message_offset: get_u64(record, C_MESSAGE_OFFSET),
            deliver_at_ms: get_u64(record, C_DELIVER_AT),
        })
    }
}

// Reschedule body layout, after the frame header.
const S_RESCHEDULED_AT: usize = RECORD_HEADER_LEN;
const S_MESSAGE_OFFSET: usize = S_RESCHEDULED_AT + 8;
const S_FROM_TIMER: usize = S_MESSAGE_OFFSET + 8;
const S_FROM_DELIVER_AT: usize = S_FROM_TIMER + 8;
const S_DELIVER_AT: usize = S_FROM_DELIVER_AT + 8;
/// Length of a reschedule record.
pub const RESCHEDULE_LEN: usize = S_DELIVER_AT + 8;

/// A decoded reschedule record: at `rescheduled_at_ms`, the timer of the
/// message at `message_offset` that was due at `from_deliver_at_ms` (the
/// message's own timer if `from_timer` is the message's offset, else the
/// timer of the reschedule record at `from_timer`) was moved to
/// `deliver_at_ms`. That timer no longer fires; this record's own does:
/// a timer is named by the offset of the record that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RescheduleView {
    /// When the reschedule was recorded (epoch ms).
    pub rescheduled_at_ms: u64,
    /// The timed message record: the payload, never rewritten.
    pub message_offset: u64,
    /// The record whose timer is replaced: the message, or an earlier reschedule record.
    pub from_timer: u64,
    /// When that timer was due.
    pub from_deliver_at_ms: u64,
    /// When this record's timer is due.
    pub deliver_at_ms: u64,
}

impl RescheduleView {
    /// Writes the record at log `offset` into `buf` ([`RESCHEDULE_LEN`] bytes).
    pub fn encode(&self, buf: &mut [u8], offset: u64) {
        write_header(buf, RecordKind::Reschedule, RESCHEDULE_LEN);
        put_u64(buf, S_RESCHEDULED_AT, self.rescheduled_at_ms);
        put_u64(buf, S_MESSAGE_OFFSET, self.message_offset);
        put_u64(buf, S_FROM_TIMER, self.from_timer);
        put_u64(buf, S_FROM_DELIVER_AT, self.from_deliver_at_ms);
        put_u64(buf, S_DELIVER_AT, self.deliver_at_ms);
        seal(buf, offset, RESCHEDULE_LEN);
    }

    /// Decodes a reschedule record whose frame and CRC were checked.
    pub fn parse(record: &[u8]) -> Result<Self, CorruptionKind> {
        if record.len() != RESCHEDULE_LEN {
            return Err(CorruptionKind::BadFrame(format!("reschedule record of {} bytes", record.len())));
        }
        Ok(Self {
            rescheduled_at_ms: get_u64(record, S_RESCHEDULED_AT),
            message_offset: get_u64(record, S_MESSAGE_OFFSET),
            from_timer: get_u64(record, S_FROM_TIMER),
            from_deliver_at_ms: get_u64(record, S_FROM_DELIVER_AT),
            deliver_at_ms: get_u64(record, S_DELIVER_AT),
        })
    }
}
