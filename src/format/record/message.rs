//! Message records: the fields a message is stored with, its encoding,
//! the rescheduled copy, and the view that decodes one.

use super::{CRC_OFFSET, FLAGS_OFFSET, LEN_OFFSET, RECORD_HEADER_LEN, RecordKind, seal, write_header};
use crate::error::CorruptionKind;
use crate::format::{crc_at, get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

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

/// The largest topic name in bytes (its length is one byte in the record).
pub const MAX_TOPIC_LEN: usize = 127;
/// Longest message key, in bytes.
pub const MAX_KEY_LEN: usize = 1024;
/// Longest tags string, in bytes.
pub const MAX_TAGS_LEN: usize = 1024;
/// Largest encoded property block, in bytes.
pub const MAX_PROPERTIES_LEN: usize = 16 * 1024;
/// Bytes of a message record other than its body, at the largest topic, key, tags and properties.
pub const MAX_FIXED_MESSAGE_LEN: usize =
    MESSAGE_FIXED_LEN + MAX_TOPIC_LEN + MAX_KEY_LEN + MAX_TAGS_LEN + MAX_PROPERTIES_LEN;

/// The timing fields a message record carries (zero for an ordinary message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timing {
    /// When the timer is due (epoch ms); 0 for an ordinary message.
    pub deliver_at_ms: u64,
    /// The legacy delay level it was put with, 0 for none.
    pub delay_level: u16,
}

/// The property that holds a message's dedup key (`Message::dedup_key`):
/// reserved, hidden from consumers, who read it as `ConsumedMessage::dedup_key`.
pub const DEDUP_PROPERTY: &str = "dw.dedup_key";

/// The property of a message put by `Store::put_replacing` in place of a
/// pending timer: `offset@deliver_at_ms` of that timer, which the record
/// settles as a cancel record would. Reserved, hidden from consumers.
pub const REPLACES_PROPERTY: &str = "dw.replaces";

/// Encoded size of a property list: `u16 name_len | name | u16 value_len | value` per pair.
pub fn properties_len(props: &[(String, String)]) -> usize {
    props.iter().map(|(k, v)| 4 + k.len() + v.len()).sum()
}

/// Encoded size of the dedup key's property (none for an empty key).
pub fn dedup_property_len(dedup_key: &str) -> usize {
    if dedup_key.is_empty() { 0 } else { 4 + DEDUP_PROPERTY.len() + dedup_key.len() }
}

/// Encoded size of the store's own properties: the dedup key's, then the replaced timer's.
fn own_properties_len(dedup_key: &str, replaces: &str) -> usize {
    let replaces_len = if replaces.is_empty() { 0 } else { 4 + REPLACES_PROPERTY.len() + replaces.len() };
    dedup_property_len(dedup_key) + replaces_len
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
    /// The dedup key, empty if none: written as the first property, [`DEDUP_PROPERTY`].
    pub dedup_key: &'a str,
    /// The timer it replaces (`offset@deliver_at_ms`), empty if none:
    /// written next, [`REPLACES_PROPERTY`].
    pub replaces: &'a str,
    /// The body.
    pub body: &'a [u8],
    /// The queue of its topic.
    pub queue_id: u32,
    /// When it was appended (epoch ms).
    pub store_time_ms: u64,
    /// When it is due.
    pub timing: Timing,
    /// A recurring schedule's record ([`FLAG_SCHEDULE`]).
    pub schedule: bool,
}

impl MessageFields<'_> {
    /// Size of the message record.
    pub fn record_len(&self) -> usize {
        MESSAGE_FIXED_LEN
            + self.topic.len()
            + self.key.len()
            + self.tags.len()
            + self.properties_len()
            + self.body.len()
    }

    /// Size of the properties block, the dedup key's included.
    pub fn properties_len(&self) -> usize {
        own_properties_len(self.dedup_key, self.replaces) + properties_len(self.properties)
    }
}

/// Encodes a message record into `buf`, which is exactly
/// [`MessageFields::record_len`] long.
pub fn encode_message(buf: &mut [u8], offset: u64, m: &MessageFields<'_>) {
    let len = buf.len();
    debug_assert_eq!(len, m.record_len());
    write_header(buf, RecordKind::Message, len);
    if m.schedule {
        put_u16(buf, FLAGS_OFFSET, FLAG_SCHEDULE);
    }
    put_u64(buf, M_STORE_TIME, m.store_time_ms);
    put_u64(buf, M_DELIVER_AT, m.timing.deliver_at_ms);
    put_u32(buf, M_QUEUE_ID, m.queue_id);
    put_u16(buf, M_DELAY_LEVEL, m.timing.delay_level);
    buf[M_TOPIC_LEN] = m.topic.len() as u8;
    buf[M_RESERVED] = 0;
    put_u16(buf, M_KEY_LEN, m.key.len() as u16);
    put_u16(buf, M_TAGS_LEN, m.tags.len() as u16);
    put_u32(buf, M_PROPS_LEN, m.properties_len() as u32);
    put_u32(buf, M_BODY_LEN, m.body.len() as u32);
    let mut at = MESSAGE_FIXED_LEN;
    let mut push = |bytes: &[u8]| {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    push(m.topic.as_bytes());
    push(m.key.as_bytes());
    push(m.tags.as_bytes());
    let own = [(DEDUP_PROPERTY, m.dedup_key), (REPLACES_PROPERTY, m.replaces)];
    let own = own.into_iter().filter(|(_, value)| !value.is_empty());
    let properties = m.properties.iter().map(|(name, value)| (name.as_str(), value.as_str()));
    for (name, value) in own.chain(properties) {
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

/// Message flag: this record is a recurring schedule. Its timer is the
/// first occurrence; its properties hold the schedule's spec (see
/// `schedule/spec.rs`); each occurrence delivers it, and the occurrence
/// records (reschedule records with [`FLAG_OCCURRENCE`](super::FLAG_OCCURRENCE)) arm the next.
pub const FLAG_SCHEDULE: u16 = 2;

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
    /// A recurring schedule ([`FLAG_SCHEDULE`]).
    pub schedule: bool,
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
            schedule: get_u16(record, FLAGS_OFFSET) & FLAG_SCHEDULE != 0,
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

    /// Its dedup key: `None` if it has none, or if its properties do not
    /// read (the record's checksum held, so a writer's bug, logged where the
    /// properties are read whole).
    pub fn dedup_key(&self) -> Option<&'a str> {
        if self.props.is_empty() {
            return None;
        }
        self.property(DEDUP_PROPERTY).ok().flatten().filter(|key| !key.is_empty())
    }

    /// Whether it carries any properties.
    pub fn has_properties(&self) -> bool {
        !self.props.is_empty()
    }

    /// The value of the property `name` (the first of that name), read in
    /// place: the others are stepped over, nothing is allocated. Malformed
    /// blocks up to it are corruption.
    pub fn property(&self, name: &str) -> Result<Option<&'a str>, CorruptionKind> {
        let bad = || CorruptionKind::BadFrame("message record: malformed properties".into());
        let take = |rest: &mut &'a [u8]| -> Result<&'a [u8], CorruptionKind> {
            let (len, tail) = rest.split_first_chunk::<2>().ok_or_else(bad)?;
            let (s, after) = tail.split_at_checked(u16::from_le_bytes(*len) as usize).ok_or_else(bad)?;
            *rest = after;
            Ok(s)
        };
        let mut rest = self.props;
        while !rest.is_empty() {
            let (key, value) = (take(&mut rest)?, take(&mut rest)?);
            if key == name.as_bytes() {
                return std::str::from_utf8(value).map(Some).map_err(|_| bad());
            }
        }
        Ok(None)
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
