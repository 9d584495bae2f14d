//! Delivery records: one fired timer (kind 2), and a tick's deliveries
//! into one queue, many timers in one record (kind 7).

use super::{RECORD_HEADER_LEN, RecordKind, seal, write_header};
use crate::error::CorruptionKind;
use crate::format::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

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
