//! `index/topic_pending`: pending timers per topic, an index (see
//! `topic_counts.rs` for what the counts mean).
//!
//! The 32-byte file header (magic `DWTOPC`, `a` = the offset below which
//! every record is counted, `b` = entries), then per topic
//! `topic length u16 | topic bytes | count u64`, then the schedules
//! `active u64 | paused u64`, then a CRC32C of everything after the header.
//! `wheel-format.md` is the byte ruler.

use std::collections::HashMap;

use crate::format::record::MAX_TOPIC_LEN;
use crate::format::{FILE_HEADER_LEN, FileHeader, TOPIC_PENDING_MAGIC, get_u64};
use crate::topic_counts::ScheduleCounts;

/// What a counts file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPendingFile {
    /// Every record below this offset is counted.
    pub through: u64,
    /// Pending timers per topic.
    pub by_topic: HashMap<String, u64>,
    /// The schedules counted; `None` in a file written before they were
    /// (without their 16 bytes): the store counts again.
    pub schedules: Option<ScheduleCounts>,
}

/// The file's bytes.
pub fn encode(through: u64, by_topic: &HashMap<String, u64>, schedules: ScheduleCounts) -> Vec<u8> {
    let mut out = FileHeader::new(TOPIC_PENDING_MAGIC, through, by_topic.len() as u64).encode().to_vec();
    for (topic, count) in by_topic {
        out.extend_from_slice(&(topic.len() as u16).to_le_bytes());
        out.extend_from_slice(topic.as_bytes());
        out.extend_from_slice(&count.to_le_bytes());
    }
    out.extend_from_slice(&schedules.active.to_le_bytes());
    out.extend_from_slice(&schedules.paused.to_le_bytes());
    let crc = crc32c::crc32c(&out[FILE_HEADER_LEN..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a counts file; `None` if it is not a valid one.
pub fn decode(bytes: &[u8]) -> Option<TopicPendingFile> {
    let header = FileHeader::decode(bytes, TOPIC_PENDING_MAGIC).ok()?;
    let (body, crc) =
        bytes.get(FILE_HEADER_LEN..)?.split_at_checked(bytes.len().checked_sub(FILE_HEADER_LEN + 4)?)?;
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return None;
    }
    // Each entry takes at least 11 bytes: the count cannot ask for more room than the file has.
    let entries = usize::try_from(header.b).ok().filter(|&n| n <= body.len() / 11)?;
    let mut by_topic = HashMap::with_capacity(entries);
    let mut at = 0;
    for _ in 0..entries {
        let len = usize::from(u16::from_le_bytes(body.get(at..at + 2)?.try_into().ok()?));
        if len == 0 || len > MAX_TOPIC_LEN {
            return None;
        }
        let topic = std::str::from_utf8(body.get(at + 2..at + 2 + len)?).ok()?;
        let count = get_u64(body.get(at + 2 + len..at + 10 + len)?, 0);
        by_topic.insert(topic.to_string(), count);
        at += 10 + len;
    }
    let schedules = match &body[at..] {
        [] => None,
        rest if rest.len() == 16 => {
            Some(ScheduleCounts { active: get_u64(rest, 0), paused: get_u64(rest, 8) })
        }
        _ => return None,
    };
    Some(TopicPendingFile { through: header.a, by_topic, schedules })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_a_flipped_bit_or_a_short_file_is_refused() {
        let counts = HashMap::from([("orders".to_string(), 3), ("payments".to_string(), 1)]);
        let schedules = ScheduleCounts { active: 5, paused: 2 };
        let bytes = encode(6_000, &counts, schedules);
        let header = FileHeader::decode(&bytes, TOPIC_PENDING_MAGIC).unwrap();
        assert_eq!((header.a, header.b), (6_000, 2), "wheel-format.md: a = counted below, b = entries");
        assert_eq!(bytes.len(), 32 + (2 + 6 + 8) + (2 + 8 + 8) + 16 + 4);
        assert_eq!(
            &bytes[bytes.len() - 20..bytes.len() - 4],
            [5, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
        );
        let decoded = decode(&bytes).unwrap();
        assert_eq!(
            decoded,
            TopicPendingFile { through: 6_000, by_topic: counts.clone(), schedules: Some(schedules) }
        );
        let mut flipped = bytes.clone();
        flipped[FILE_HEADER_LEN + 3] ^= 1;
        assert!(decode(&flipped).is_none());
        assert!(decode(&bytes[..bytes.len() - 1]).is_none());
        assert!(decode(&bytes[..10]).is_none());
        // A file written before schedules were counted reads without them.
        let mut before = bytes[..bytes.len() - 20].to_vec();
        before.extend_from_slice(&crc32c::crc32c(&before[FILE_HEADER_LEN..]).to_le_bytes());
        assert_eq!(decode(&before).unwrap().schedules, None);
    }
}
