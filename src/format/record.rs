//! Record framing: every record in the commit log is
//! `crc32c | len | kind | version | flags | body`, little-endian.
//!
//! The CRC covers the record's absolute offset followed by bytes `[4, len)`,
//! so it also guards the length and binds the record to its place.
//! `wheel-format.md` ("Commit log records") is the byte ruler.
//!
//! This module is the frame every record shares, the kinds, and the
//! [`Record`] a checked record decodes to; each kind's body layout and
//! codec is a module of its own (`message`, `delivery`, `cancel` with the
//! reschedule, `relocation`), re-exported here.

use crate::error::CorruptionKind;
use crate::format::{FILE_HEADER_LEN, crc_at, get_u32, get_u64, put_u16, put_u32};

mod cancel;
mod delivery;
mod message;
mod occurrences;
mod relocation;

pub use cancel::{
    CANCEL_LEN, CancelView, OCCURRENCE_LEN, OccurrenceFields, RESCHEDULE_LEN, RescheduleView, encode_cancel,
};
pub use delivery::{
    DELIVERIES_MAX, DELIVERY_LEN, DeliveriesView, DeliveryView, deliveries_count, deliveries_len,
    deliveries_timer, encode_deliveries, encode_delivery,
};
/// For tools only: the crate itself uses it inside `message`.
#[cfg(feature = "internals")]
pub use message::MESSAGE_FIXED_LEN;
pub use message::{
    DEDUP_PROPERTY, MAX_FIXED_MESSAGE_LEN, MAX_KEY_LEN, MAX_PROPERTIES_LEN, MAX_TAGS_LEN, MAX_TOPIC_LEN,
    MessageFields, MessageView, REPLACES_PROPERTY, Timing, dedup_property_len, encode_message,
    encode_rescheduled, properties_len,
};
pub use occurrences::{
    OCCURRENCE_ENTRY_LEN, OCCURRENCES_MAX, OccurrencesView, containing_record, encode_occurrences,
    entry_fits, entry_name, occurrences_len,
};
pub use relocation::{RELOCATION_LEN, RelocationView};

/// Bytes in every record's frame header.
pub const RECORD_HEADER_LEN: usize = 12;
/// The record format version written by this build.
pub const RECORD_VERSION: u8 = 1;

const CRC_OFFSET: usize = 0;
const LEN_OFFSET: usize = CRC_OFFSET + 4;
const KIND_OFFSET: usize = LEN_OFFSET + 4;
const VERSION_OFFSET: usize = KIND_OFFSET + 1;
const FLAGS_OFFSET: usize = VERSION_OFFSET + 1;
const _: () = assert!(FLAGS_OFFSET + 2 == RECORD_HEADER_LEN);

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// A message with its body: the only record that carries a payload.
    Message = 1,
    /// A timer's delivery: names the message record it makes visible.
    Delivery = 2,
    /// A timer's cancellation: names the message record it cancels.
    Cancel = 3,
    /// Retention moved a segment's pending timers to the relocation area and deleted it.
    Relocation = 4,
    /// Damaged bytes lenient recovery found between two valid records, left
    /// in place and skipped: the next record follows this one's length.
    Skipped = 5,
    /// A timer's new deliver time: the timer it names no longer fires, and
    /// this record's own timer (of the same message) fires at the new time.
    Reschedule = 6,
    /// A run of timers that fired together into one queue: names each
    /// timer's record and carries what the queue entry needs (topic, queue,
    /// tags), so indexing it reads no message. Only in segments of version 2.
    Deliveries = 7,
    /// Occurrences of schedules that fired together: each delivers one and
    /// arms its schedule's next, as an occurrence's reschedule record does,
    /// in a 24-byte entry whose own offset names the timer it arms. Only in
    /// segments of version 3.
    Occurrences = 8,
    /// Filler from here to the end of the segment; the next record starts the next segment.
    Padding = 0xFF,
}

impl RecordKind {
    /// Whether the record's CRC covers only its header: the rest of it is
    /// unwritten space (padding) or damaged bytes (skipped).
    pub fn is_filler(self) -> bool {
        matches!(self, Self::Padding | Self::Skipped)
    }
}

impl RecordKind {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Message),
            2 => Some(Self::Delivery),
            3 => Some(Self::Cancel),
            4 => Some(Self::Relocation),
            5 => Some(Self::Skipped),
            6 => Some(Self::Reschedule),
            7 => Some(Self::Deliveries),
            8 => Some(Self::Occurrences),
            0xFF => Some(Self::Padding),
            _ => None,
        }
    }
}

/// A checked frame: the record's kind and total length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// What the record is.
    pub kind: RecordKind,
    /// Its total length, frame included (a padding record runs to the segment's end).
    pub len: usize,
}

/// Why bytes at an offset are not a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Nothing has been written here (an all-zero header): the normal end of the log.
    Empty,
    /// Something is here but it is not a valid record.
    Invalid(CorruptionKind),
}

/// Checks the frame header at the start of `bytes`: `bytes` runs from the
/// record's offset to the end of its segment, and the record must fit in it.
/// The CRC is checked over the whole record.
pub fn check_frame(bytes: &[u8], offset: u64) -> Result<Frame, FrameError> {
    let frame = check_header(bytes)?;
    // Padding covers unwritten space and a skipped record damaged bytes, so
    // their CRC covers only their own header.
    let covered = if frame.kind.is_filler() { RECORD_HEADER_LEN } else { frame.len };
    let stored = get_u32(bytes, CRC_OFFSET);
    let computed = crc_at(offset, &bytes[LEN_OFFSET..covered]);
    if stored != computed {
        return Err(FrameError::Invalid(CorruptionKind::ChecksumMismatch { stored, computed }));
    }
    Ok(frame)
}

/// Where a damaged stretch of the log ends: the first position from `from`
/// on in `segment` (the bytes of the segment that starts at log offset
/// `base`) where a record checks out, frame and CRC at its own offset, or
/// `None` if none does before the end of `segment`. Recovery, every reader
/// that walks the log, and `wheel-dump` find it with this one search; it
/// costs a few comparisons per byte, and only damage makes it run. The CRC
/// covers the record's offset, so a copy of a record elsewhere (a message
/// body holding one) does not check out.
pub fn next_valid_record(segment: &[u8], base: u64, from: usize) -> Option<usize> {
    let last = segment.len().checked_sub(RECORD_HEADER_LEN)?;
    (from..last).find(|&local| {
        let bytes = &segment[local..];
        plausible_header(bytes) && check_frame(bytes, base + local as u64).is_ok()
    })
}

/// A cheap filter before a CRC: a known kind, this version, a length that fits.
fn plausible_header(bytes: &[u8]) -> bool {
    let len = get_u32(bytes, LEN_OFFSET) as usize;
    (RECORD_HEADER_LEN..=bytes.len()).contains(&len)
        && bytes[VERSION_OFFSET] == RECORD_VERSION
        && check_header(bytes).is_ok()
}

/// Where the record at or after log offset `offset` starts: an offset
/// inside a segment's header moves past it, and the few bytes at the end of
/// a segment that cannot hold a record header are skipped (the next record
/// starts the next segment). A log end, a durable mark or a checkpoint's
/// offsets compare equal once both sides went through this.
pub fn record_start(offset: u64, segment_size: u64) -> u64 {
    let local = offset % segment_size;
    let base = offset - local;
    if local < FILE_HEADER_LEN as u64 {
        base + FILE_HEADER_LEN as u64
    } else if segment_size - local < RECORD_HEADER_LEN as u64 {
        base + segment_size + FILE_HEADER_LEN as u64
    } else {
        offset
    }
}

/// Checks the CRC of a record whose frame header was already checked.
pub fn check_crc(record: &[u8], offset: u64) -> Result<(), CorruptionKind> {
    let stored = get_u32(record, CRC_OFFSET);
    let computed = crc_at(offset, &record[LEN_OFFSET..]);
    if stored != computed {
        return Err(CorruptionKind::ChecksumMismatch { stored, computed });
    }
    Ok(())
}

/// Checks the frame header alone (kind, version, length), not the CRC: for
/// records whose checksum this process already knows to be good.
pub fn check_header(bytes: &[u8]) -> Result<Frame, FrameError> {
    check_header_in(bytes, bytes.len())
}

/// [`check_header`] for a reader that holds only the start of the record:
/// `room` is how many bytes run from the record's offset to the end of its segment.
pub fn check_header_in(bytes: &[u8], room: usize) -> Result<Frame, FrameError> {
    let invalid = |why: String| FrameError::Invalid(CorruptionKind::BadFrame(why));
    let Some(header) = bytes.get(..RECORD_HEADER_LEN).filter(|_| room >= RECORD_HEADER_LEN) else {
        return Err(invalid("header runs past the end of the segment".into()));
    };
    if header.iter().all(|&b| b == 0) {
        return Err(FrameError::Empty);
    }
    let len = get_u32(header, LEN_OFFSET) as usize;
    let kind = RecordKind::from_byte(header[KIND_OFFSET])
        .ok_or_else(|| invalid(format!("unknown kind {}", header[KIND_OFFSET])))?;
    if header[VERSION_OFFSET] != RECORD_VERSION {
        return Err(invalid(format!("unknown record version {}", header[VERSION_OFFSET])));
    }
    if len < RECORD_HEADER_LEN || len > room {
        return Err(invalid(format!("length {len} does not fit the segment")));
    }
    Ok(Frame { kind, len })
}

fn write_header(buf: &mut [u8], kind: RecordKind, len: usize) {
    put_u32(buf, LEN_OFFSET, len as u32);
    buf[KIND_OFFSET] = kind as u8;
    buf[VERSION_OFFSET] = RECORD_VERSION;
    put_u16(buf, FLAGS_OFFSET, 0);
}

/// Stores the CRC of a record at `offset` over bytes `[4, covered)`.
fn seal(buf: &mut [u8], offset: u64, covered: usize) {
    let crc = crc_at(offset, &buf[LEN_OFFSET..covered]);
    put_u32(buf, CRC_OFFSET, crc);
}

/// Writes a padding record filling `buf` (the rest of a segment, at least a header long).
pub fn encode_padding(buf: &mut [u8], offset: u64) {
    let len = buf.len();
    write_header(buf, RecordKind::Padding, len);
    seal(buf, offset, RECORD_HEADER_LEN);
}

/// Writes the header of a skipped record over the first bytes of `buf`, the
/// damaged stretch (at least a header long) it marks; the rest is left as it is.
pub fn encode_skipped(buf: &mut [u8], offset: u64) {
    let len = buf.len();
    write_header(buf, RecordKind::Skipped, len);
    seal(buf, offset, RECORD_HEADER_LEN);
}

/// The time every record but padding carries first in its body: a message's
/// store time, a delivery's, a cancel's or a relocation's time.
pub fn record_time_ms(kind: RecordKind, record: &[u8]) -> Option<u64> {
    (!kind.is_filler() && record.len() >= RECORD_HEADER_LEN + 8).then(|| get_u64(record, RECORD_HEADER_LEN))
}

/// A decoded, checksummed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// A message, with its body.
    Message(MessageView<'a>),
    /// A timer's delivery.
    Delivery(DeliveryView),
    /// A run of timers' deliveries into one queue.
    Deliveries(DeliveriesView<'a>),
    /// A timer's cancellation.
    Cancel(CancelView),
    /// Retention relocated a segment's pending timers.
    Relocation(RelocationView),
    /// A timer's new deliver time.
    Reschedule(RescheduleView),
    /// Schedules' occurrences that fired together.
    Occurrences(OccurrencesView<'a>),
    /// Damaged bytes lenient recovery left in place, skipped.
    Skipped,
    /// Filler to the end of a segment.
    Padding,
}

impl<'a> Record<'a> {
    /// Checks the CRC of the record at log `offset` whose frame was checked
    /// (`frame`), and decodes it. `bytes` holds the record's `frame.len`
    /// bytes; for padding its header is enough (its CRC covers only that).
    /// A message's properties must be well-formed too. (Whether its topic is
    /// one `put` accepts is the caller's check: `message::validate_topic`.)
    pub fn decode(bytes: &'a [u8], offset: u64, frame: Frame) -> Result<Self, CorruptionKind> {
        let covered = if frame.kind.is_filler() { RECORD_HEADER_LEN } else { frame.len };
        let record = bytes.get(..covered).ok_or_else(|| {
            CorruptionKind::BadFrame(format!("record of {} bytes, {} available", covered, bytes.len()))
        })?;
        check_crc(record, offset)?;
        Ok(match frame.kind {
            RecordKind::Message => {
                let view = MessageView::parse(record)?;
                view.properties()?;
                Record::Message(view)
            }
            RecordKind::Delivery => Record::Delivery(DeliveryView::parse(record)?),
            RecordKind::Deliveries => Record::Deliveries(DeliveriesView::parse(record)?),
            RecordKind::Cancel => Record::Cancel(CancelView::parse(record)?),
            RecordKind::Relocation => Record::Relocation(RelocationView::parse(record)?),
            RecordKind::Reschedule => Record::Reschedule(RescheduleView::parse(record)?),
            RecordKind::Occurrences => Record::Occurrences(OccurrencesView::parse(record, offset)?),
            RecordKind::Skipped => Record::Skipped,
            RecordKind::Padding => Record::Padding,
        })
    }

    /// The time the record carries first in its body (see [`record_time_ms`]).
    pub fn time_ms(&self) -> Option<u64> {
        match self {
            Record::Message(m) => Some(m.store_time_ms),
            Record::Delivery(d) => Some(d.delivered_at_ms),
            Record::Deliveries(d) => Some(d.delivered_at_ms),
            Record::Cancel(c) => Some(c.cancelled_at_ms),
            Record::Relocation(r) => Some(r.relocated_at_ms),
            Record::Reschedule(r) => Some(r.rescheduled_at_ms),
            Record::Occurrences(o) => Some(o.delivered_at_ms),
            Record::Skipped | Record::Padding => None,
        }
    }
}

#[cfg(test)]
mod tests;
