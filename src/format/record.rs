//! Record framing: every record in the commit log is
//! `crc32c | len | kind | version | flags | body`, little-endian.
//!
//! The CRC covers the record's absolute offset followed by bytes `[4, len)`,
//! so it also guards the length and binds the record to its place.
//! `wheel-format.md` ("Commit log records") is the byte ruler.

use crate::error::CorruptionKind;
use crate::format::{FILE_HEADER_LEN, crc_at, get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

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

// Message body layout, after the frame header.
const M_STORE_TIME: usize = RECORD_HEADER_LEN;
const M_DELIVER_AT: usize = M_STORE_TIME + 8;
const M_QUEUE_ID: usize = M_DELIVER_AT + 8;
const M_DELAY_LEVEL: usize = M_QUEUE_ID + 4;
const M_TOPIC_LEN: usize = M_DELAY_LEVEL + 2;
const M_RESERVED: usize = M_TOPIC_LEN + 1;
const M_KEY_LEN: usize = M_RESERVED + 1;
const M_TAGS_LEN: usize = M_KEY_LEN + 2;
const M_PROPS_LEN: usize = M_TAGS_LEN + 2;
const M_BODY_LEN: usize = M_PROPS_LEN + 4;
/// Where the variable part of a message record begins.
pub const MESSAGE_FIXED_LEN: usize = M_BODY_LEN + 4;

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

// Delivery body layout, after the frame header.
const D_DELIVERED_AT: usize = RECORD_HEADER_LEN;
const D_MESSAGE_OFFSET: usize = D_DELIVERED_AT + 8;
/// Length of a delivery record.
pub const DELIVERY_LEN: usize = D_MESSAGE_OFFSET + 8;

/// Encodes a delivery record: the timer of the message at `message_offset`
/// fired at `delivered_at_ms`. `buf` is exactly [`DELIVERY_LEN`] long.
pub fn encode_delivery(buf: &mut [u8], offset: u64, delivered_at_ms: u64, message_offset: u64) {
    write_header(buf, RecordKind::Delivery, DELIVERY_LEN);
    put_u64(buf, D_DELIVERED_AT, delivered_at_ms);
    put_u64(buf, D_MESSAGE_OFFSET, message_offset);
    seal(buf, offset, DELIVERY_LEN);
}

/// A decoded delivery record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryView {
    /// When the timer fired (epoch ms, the ticker's clock).
    pub delivered_at_ms: u64,
    /// The timed message record it makes visible.
    pub message_offset: u64,
}

impl DeliveryView {
    /// Decodes a delivery record whose frame and CRC were checked.
    pub fn parse(record: &[u8]) -> Result<Self, CorruptionKind> {
        if record.len() != DELIVERY_LEN {
            return Err(CorruptionKind::BadFrame(format!("delivery record of {} bytes", record.len())));
        }
        Ok(Self {
            delivered_at_ms: get_u64(record, D_DELIVERED_AT),
            message_offset: get_u64(record, D_MESSAGE_OFFSET),
        })
    }
}

// Deliveries body layout, after the frame header: the fixed part, the
// topic, then `count` timers of `TIMER_LEN` bytes each.
const B_DELIVERED_AT: usize = RECORD_HEADER_LEN;
const B_QUEUE_ID: usize = B_DELIVERED_AT + 8;
const B_COUNT: usize = B_QUEUE_ID + 4;
const B_TOPIC_LEN: usize = B_COUNT + 2;
const B_RESERVED: usize = B_TOPIC_LEN + 1;
/// Where the topic of a deliveries record begins.
const B_TOPIC: usize = B_RESERVED + 1;
/// Bytes per timer in a deliveries record: its record's offset, its tag hash.
const B_TIMER_LEN: usize = 12;
/// The most timers one deliveries record names (a queue entry keeps the
/// timer's index in 16 bits).
pub const DELIVERIES_MAX: usize = u16::MAX as usize;

/// Length of a deliveries record of `count` timers into a queue of a topic
/// of `topic_len` bytes.
pub fn deliveries_len(topic_len: usize, count: usize) -> usize {
    B_TOPIC + topic_len + count * B_TIMER_LEN
}

/// Encodes a deliveries record: the timers whose records are at `timers[i].0`
/// (their tag hashes `timers[i].1`) fired at `delivered_at_ms` into queue
/// `queue_id` of `topic`. `buf` is exactly [`deliveries_len`] long; there
/// are 1..=[`DELIVERIES_MAX`] timers and the topic is 1..=255 bytes.
pub fn encode_deliveries(
    buf: &mut [u8],
    offset: u64,
    delivered_at_ms: u64,
    topic: &str,
    queue_id: u32,
    timers: &[(u64, u32)],
) {
    debug_assert!((1..=DELIVERIES_MAX).contains(&timers.len()) && (1..=255).contains(&topic.len()));
    debug_assert_eq!(buf.len(), deliveries_len(topic.len(), timers.len()));
    write_header(buf, RecordKind::Deliveries, buf.len());
    put_u64(buf, B_DELIVERED_AT, delivered_at_ms);
    put_u32(buf, B_QUEUE_ID, queue_id);
    put_u16(buf, B_COUNT, timers.len() as u16);
    buf[B_TOPIC_LEN] = topic.len() as u8;
    buf[B_RESERVED] = 0;
    buf[B_TOPIC..B_TOPIC + topic.len()].copy_from_slice(topic.as_bytes());
    let mut at = B_TOPIC + topic.len();
    for &(timer, tag_hash) in timers {
        put_u64(buf, at, timer);
        put_u32(buf, at + 8, tag_hash);
        at += B_TIMER_LEN;
    }
    let len = buf.len();
    seal(buf, offset, len);
}

/// A decoded deliveries record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveriesView<'a> {
    /// When the timers fired (epoch ms, the ticker's clock).
    pub delivered_at_ms: u64,
    /// The queue they go to.
    pub queue_id: u32,
    /// Its topic (whether `put` accepts it is the caller's check).
    pub topic: &'a str,
    timers: &'a [u8],
}

impl<'a> DeliveriesView<'a> {
    /// Decodes a deliveries record whose frame and CRC were checked.
    pub fn parse(record: &'a [u8]) -> Result<Self, CorruptionKind> {
        let bad = |why: String| CorruptionKind::BadFrame(format!("deliveries record {why}"));
        if record.len() < B_TOPIC {
            return Err(bad(format!("of {} bytes", record.len())));
        }
        let count = get_u16(record, B_COUNT) as usize;
        let topic_len = record[B_TOPIC_LEN] as usize;
        if count == 0 || topic_len == 0 || record.len() != deliveries_len(topic_len, count) {
            return Err(bad(format!(
                "of {} bytes for {count} timers and a {topic_len}-byte topic",
                record.len()
            )));
        }
        let topic = std::str::from_utf8(&record[B_TOPIC..B_TOPIC + topic_len])
            .map_err(|_| bad("names a topic that is not UTF-8".into()))?;
        Ok(Self {
            delivered_at_ms: get_u64(record, B_DELIVERED_AT),
            queue_id: get_u32(record, B_QUEUE_ID),
            topic,
            timers: &record[B_TOPIC + topic_len..],
        })
    }

    /// How many timers it names (at least one).
    pub fn len(&self) -> usize {
        self.timers.len() / B_TIMER_LEN
    }

    /// Never: a deliveries record names at least one timer.
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
    }

    /// Timer `i` (below [`len`](Self::len)): the offset of its record (a
    /// message, or a reschedule record) and its tag hash.
    pub fn timer(&self, i: usize) -> Option<(u64, u32)> {
        deliveries_timer(self.timers, i)
    }

    /// The bytes of its timers, for [`deliveries_timer`]: a reader of a run
    /// keeps them instead of parsing the record again for each timer.
    pub fn timer_bytes(&self) -> &'a [u8] {
        self.timers
    }

    /// Every timer in order, as [`timer`](Self::timer) gives them.
    pub fn timers(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.timers.chunks_exact(B_TIMER_LEN).map(|t| (get_u64(t, 0), get_u32(t, 8)))
    }
}

/// Timer `i` of the timer bytes of a deliveries record
/// ([`DeliveriesView::timer_bytes`]), if it names that many.
pub fn deliveries_timer(timers: &[u8], i: usize) -> Option<(u64, u32)> {
    let at = i.checked_mul(B_TIMER_LEN).filter(|&at| at + B_TIMER_LEN <= timers.len())?;
    Some((get_u64(timers, at), get_u32(timers, at + 8)))
}

/// How many timers the timer bytes of a deliveries record name.
pub fn deliveries_count(timers: &[u8]) -> usize {
    timers.len() / B_TIMER_LEN
}

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

/// The time every record but padding carries first in its body: a message's
/// store time, a delivery's, a cancel's or a relocation's time.
pub fn record_time_ms(kind: RecordKind, record: &[u8]) -> Option<u64> {
    (!kind.is_filler() && record.len() >= RECORD_HEADER_LEN + 8).then(|| get_u64(record, RECORD_HEADER_LEN))
}

/// The timing fields a message record carries (zero for an ordinary message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timing {
    /// When the timer is due (epoch ms); 0 for an ordinary message.
    pub deliver_at_ms: u64,
    /// The legacy delay level it was put with, 0 for none.
    pub delay_level: u16,
}

/// Encoded size of a property list: `u16 name_len | name | u16 value_len | value` per pair.
pub fn properties_len(props: &[(String, String)]) -> usize {
    props.iter().map(|(k, v)| 4 + k.len() + v.len()).sum()
}

/// The fields of a message record, borrowed from the producer's message
/// (checked against the limits in `message.rs` before they get here).
#[derive(Debug, Clone, Copy)]
pub struct MessageFields<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The key, empty if none.
    pub key: &'a str,
    /// The tags, empty if none.
    pub tags: &'a str,
    /// The properties.
    pub properties: &'a [(String, String)],
    /// The body.
    pub body: &'a [u8],
    /// The queue of its topic.
    pub queue_id: u32,
    /// When it was appended (epoch ms).
    pub store_time_ms: u64,
    /// When it is due.
    pub timing: Timing,
}

impl MessageFields<'_> {
    /// Size of the message record.
    pub fn record_len(&self) -> usize {
        MESSAGE_FIXED_LEN
            + self.topic.len()
            + self.key.len()
            + self.tags.len()
            + properties_len(self.properties)
            + self.body.len()
    }
}

/// Encodes a message record into `buf`, which is exactly
/// [`MessageFields::record_len`] long.
pub fn encode_message(buf: &mut [u8], offset: u64, m: &MessageFields<'_>) {
    let len = buf.len();
    debug_assert_eq!(len, m.record_len());
    write_header(buf, RecordKind::Message, len);
    put_u64(buf, M_STORE_TIME, m.store_time_ms);
    put_u64(buf, M_DELIVER_AT, m.timing.deliver_at_ms);
    put_u32(buf, M_QUEUE_ID, m.queue_id);
    put_u16(buf, M_DELAY_LEVEL, m.timing.delay_level);
    buf[M_TOPIC_LEN] = m.topic.len() as u8;
    buf[M_RESERVED] = 0;
    put_u16(buf, M_KEY_LEN, m.key.len() as u16);
    put_u16(buf, M_TAGS_LEN, m.tags.len() as u16);
    put_u32(buf, M_PROPS_LEN, properties_len(m.properties) as u32);
    put_u32(buf, M_BODY_LEN, m.body.len() as u32);
    let mut at = MESSAGE_FIXED_LEN;
    let mut push = |bytes: &[u8]| {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    push(m.topic.as_bytes());
    push(m.key.as_bytes());
    push(m.tags.as_bytes());
    for (name, value) in m.properties {
        push(&(name.len() as u16).to_le_bytes());
        push(name.as_bytes());
        push(&(value.len() as u16).to_le_bytes());
        push(value.as_bytes());
    }
    // The CRC reads the body from its source, which is hot in cache, rather
    // than from the fresh map pages just written (measured: most of a 4 KiB
    // put's time went to a CRC reading back the destination).
    let meta_end = at;
    buf[meta_end..].copy_from_slice(m.body);
    debug_assert_eq!(meta_end + m.body.len(), len);
    let crc = crc32c::crc32c_append(crc_at(offset, &buf[LEN_OFFSET..meta_end]), m.body);
    put_u32(buf, CRC_OFFSET, crc);
}

/// Message flag: this record is the bucket scheduler's copy of a timed
/// message, written when it came due (RocketMQ 4.x writes the message again
/// into its real topic). Its deliver-at and level say when it was due; it is
/// indexed into its topic at once, never scheduled again.
pub const FLAG_RESCHEDULED: u16 = 1;

/// Encodes the bucket scheduler's copy of the message record `original`
/// (checked, from the log): the same bytes, stored at `stored_at_ms`, with
/// [`FLAG_RESCHEDULED`] set, sealed for its new offset. `buf` is as long as `original`.
pub fn encode_rescheduled(buf: &mut [u8], offset: u64, original: &[u8], stored_at_ms: u64) {
    buf.copy_from_slice(original);
    put_u16(buf, FLAGS_OFFSET, FLAG_RESCHEDULED);
    put_u64(buf, M_STORE_TIME, stored_at_ms);
    let len = buf.len();
    seal(buf, offset, len);
}

/// A decoded view of a message record whose frame was already checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageView<'a> {
    /// When it was appended (epoch ms).
    pub store_time_ms: u64,
    /// When it is due (zero for an ordinary message).
    pub timing: Timing,
    /// The queue of its topic.
    pub queue_id: u32,
    /// The bucket scheduler's copy of a timed message ([`FLAG_RESCHEDULED`]).
    pub rescheduled: bool,
    /// The topic.
    pub topic: &'a str,
    /// The key, empty if none.
    pub key: &'a str,
    /// The tags, empty if none.
    pub tags: &'a str,
    props: &'a [u8],
    /// Byte range of the body within the record.
    pub body: std::ops::Range<usize>,
}

impl<'a> MessageView<'a> {
    /// Parses a whole message record; every length is checked against the record.
    pub fn parse(record: &'a [u8]) -> Result<Self, CorruptionKind> {
        let bad = |why: &str| CorruptionKind::BadFrame(format!("message record: {why}"));
        if record.len() < MESSAGE_FIXED_LEN {
            return Err(bad("shorter than its fixed part"));
        }
        let lens = [
            record[M_TOPIC_LEN] as usize,
            get_u16(record, M_KEY_LEN) as usize,
            get_u16(record, M_TAGS_LEN) as usize,
            get_u32(record, M_PROPS_LEN) as usize,
            get_u32(record, M_BODY_LEN) as usize,
        ];
        let total = lens.iter().try_fold(MESSAGE_FIXED_LEN, |acc, &n| acc.checked_add(n));
        if total != Some(record.len()) {
            return Err(bad("field lengths do not add up to the record length"));
        }
        let mut at = MESSAGE_FIXED_LEN;
        let mut ranges = lens.map(|n| {
            let r = at..at + n;
            at += n;
            r
        });
        let text = |r: std::ops::Range<usize>, what: &str| {
            std::str::from_utf8(&record[r]).map_err(|_| bad(&format!("{what} is not UTF-8")))
        };
        let body = std::mem::replace(&mut ranges[4], 0..0);
        Ok(Self {
            store_time_ms: get_u64(record, M_STORE_TIME),
            timing: Timing {
                deliver_at_ms: get_u64(record, M_DELIVER_AT),
                delay_level: get_u16(record, M_DELAY_LEVEL),
            },
            queue_id: get_u32(record, M_QUEUE_ID),
            rescheduled: get_u16(record, FLAGS_OFFSET) & FLAG_RESCHEDULED != 0,
            topic: text(ranges[0].clone(), "topic")?,
            key: text(ranges[1].clone(), "key")?,
            tags: text(ranges[2].clone(), "tags")?,
            props: &record[ranges[3].clone()],
            body,
        })
    }

    /// When a timer is due: `None` for an ordinary message and for the
    /// bucket scheduler's copy of a delivered one (indexed at once).
    pub fn timer_deliver_at_ms(&self) -> Option<u64> {
        (self.timing.deliver_at_ms != 0 && !self.rescheduled).then_some(self.timing.deliver_at_ms)
    }

    /// Whether it carries any properties.
    pub fn has_properties(&self) -> bool {
        !self.props.is_empty()
    }

    /// The properties, decoded; malformed blocks are corruption.
    pub fn properties(&self) -> Result<Vec<(String, String)>, CorruptionKind> {
        let bad = || CorruptionKind::BadFrame("message record: malformed properties".into());
        let mut out = Vec::new();
        let mut rest = self.props;
        let take = |rest: &mut &'a [u8]| -> Result<String, CorruptionKind> {
            let (len, tail) = rest.split_first_chunk::<2>().ok_or_else(bad)?;
            let n = u16::from_le_bytes(*len) as usize;
            let s = tail.get(..n).ok_or_else(bad)?;
            *rest = &tail[n..];
            String::from_utf8(s.to_vec()).map_err(|_| bad())
        };
        while !rest.is_empty() {
            let name = take(&mut rest)?;
            let value = take(&mut rest)?;
            out.push((name, value));
        }
        Ok(out)
    }
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
            Record::Skipped | Record::Padding => None,
        }
    }
}

#[cfg(test)]
mod tests;
