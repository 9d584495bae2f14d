//! Records that change a pending timer: a cancel and a reschedule.

use super::{FLAGS_OFFSET, RECORD_HEADER_LEN, RecordKind, seal, write_header};
use crate::error::CorruptionKind;
use crate::format::{get_u16, get_u64, put_u16, put_u64};

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
// An occurrence's reschedule record carries one more field.
const S_FIRED: usize = RESCHEDULE_LEN;
/// Length of a reschedule record of a schedule's occurrence ([`FLAG_OCCURRENCE`]).
pub const OCCURRENCE_LEN: usize = S_FIRED + 8;

/// Reschedule flag: the record moves a recurring schedule's timer to its
/// next occurrence, and carries how many occurrences were delivered.
pub const FLAG_OCCURRENCE: u16 = 1;
/// Reschedule flag (with [`FLAG_OCCURRENCE`]): the record also delivers the
/// occurrence of the timer it replaces, which fired. The dispatcher gives
/// it a queue entry as it does a delivery record: the occurrence's
/// delivery and the arming of the next are one record, so a torn tail
/// keeps both or neither.
pub const FLAG_DELIVERS: u16 = 2;

/// What a reschedule record of a schedule's occurrence adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OccurrenceFields {
    /// Occurrences of the schedule delivered so far, this record's included:
    /// the occurrence its own timer delivers is number `fired + 1`.
    pub fired: u64,
    /// Whether it delivers the occurrence of the timer it replaces (a
    /// missed occurrence the schedule skips is replaced without one).
    pub delivers: bool,
}

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
    /// A schedule's occurrence: how many were delivered, and whether this
    /// record delivers one.
    pub occurrence: Option<OccurrenceFields>,
}

impl RescheduleView {
    /// The record's length.
    pub fn record_len(&self) -> usize {
        if self.occurrence.is_some() { OCCURRENCE_LEN } else { RESCHEDULE_LEN }
    }

    /// Writes the record at log `offset` into `buf` ([`record_len`](Self::record_len) bytes).
    pub fn encode(&self, buf: &mut [u8], offset: u64) {
        let len = self.record_len();
        debug_assert_eq!(buf.len(), len);
        write_header(buf, RecordKind::Reschedule, len);
        put_u64(buf, S_RESCHEDULED_AT, self.rescheduled_at_ms);
        put_u64(buf, S_MESSAGE_OFFSET, self.message_offset);
        put_u64(buf, S_FROM_TIMER, self.from_timer);
        put_u64(buf, S_FROM_DELIVER_AT, self.from_deliver_at_ms);
        put_u64(buf, S_DELIVER_AT, self.deliver_at_ms);
        if let Some(occurrence) = self.occurrence {
            let delivers = if occurrence.delivers { FLAG_DELIVERS } else { 0 };
            put_u16(buf, FLAGS_OFFSET, FLAG_OCCURRENCE | delivers);
            put_u64(buf, S_FIRED, occurrence.fired);
        }
        seal(buf, offset, len);
    }

    /// Decodes a reschedule record whose frame and CRC were checked.
    pub fn parse(record: &[u8]) -> Result<Self, CorruptionKind> {
        let bad = |why: String| CorruptionKind::BadFrame(format!("reschedule record {why}"));
        let flags = record.get(FLAGS_OFFSET..FLAGS_OFFSET + 2).map_or(0, |_| get_u16(record, FLAGS_OFFSET));
        let occurrence = flags & FLAG_OCCURRENCE != 0;
        // A delivery belongs to an occurrence; no other flag is defined.
        if flags & !(FLAG_OCCURRENCE | FLAG_DELIVERS) != 0 || (!occurrence && flags != 0) {
            return Err(bad(format!("with flags {flags:#x}")));
        }
        let len = if occurrence { OCCURRENCE_LEN } else { RESCHEDULE_LEN };
        if record.len() != len {
            return Err(bad(format!("of {} bytes (flags {flags:#x})", record.len())));
        }
        Ok(Self {
            rescheduled_at_ms: get_u64(record, S_RESCHEDULED_AT),
            message_offset: get_u64(record, S_MESSAGE_OFFSET),
            from_timer: get_u64(record, S_FROM_TIMER),
            from_deliver_at_ms: get_u64(record, S_FROM_DELIVER_AT),
            deliver_at_ms: get_u64(record, S_DELIVER_AT),
            occurrence: occurrence.then(|| OccurrenceFields {
                fired: get_u64(record, S_FIRED),
                delivers: flags & FLAG_DELIVERS != 0,
            }),
        })
    }

    /// Whether it delivers a schedule's occurrence (see [`FLAG_DELIVERS`]).
    pub fn delivers(&self) -> bool {
        self.occurrence.is_some_and(|o| o.delivers)
    }
}
