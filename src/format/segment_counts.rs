//! `timer/segment_pending`: pending timers per commit-log segment, an index
//! (see `durable/segment_counts.rs` for what the counts mean).
//!
//! The 32-byte file header (magic `DWSPND`, `a` = the offset below which every
//! insert is counted, `b` = entries), then `unknown start u64 | unknown end u64`,
//! then per segment `base u64 | count u64 | latest due ms u64 | latest near due ms u64`,
//! then a CRC32C of everything after the header. `wheel-format.md` is the byte ruler.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::format::{FILE_HEADER_LEN, FileHeader, SEGMENT_PENDING_MAGIC, get_u64, put_u64};

/// Bytes per entry in the file: segment start, count, latest due time, latest near due time.
const ENTRY_LEN: usize = 32;

/// What one segment holds for the timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentPending {
    /// Timers indexed and not yet fired or cancelled, plus cancel records.
    pub count: u64,
    /// The latest deliver time of any timer (or cancelled timer) it holds.
    pub latest_due_ms: u64,
    /// The latest deliver time of its *near* timers, those due within the
    /// retention time of being indexed: they fire before the segment could
    /// expire, and the segment then stays until the retention time after
    /// the last of them, so consumers can read them (and they need no copy).
    pub latest_near_due_ms: u64,
}

/// A decoded counts file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// Every insert below this commit-log offset is counted.
    pub covered_below: u64,
    /// Log offsets whose segments' counts may miss inserts.
    pub unknown: Range<u64>,
    /// By segment base offset.
    pub counts: BTreeMap<u64, SegmentPending>,
}

/// The file's bytes.
pub fn encode(covered_below: u64, unknown: &Range<u64>, counts: &BTreeMap<u64, SegmentPending>) -> Vec<u8> {
    let header = FileHeader::new(SEGMENT_PENDING_MAGIC, covered_below, counts.len() as u64);
    let mut out = header.encode().to_vec();
    let mut field = |value: u64| {
        let mut bytes = [0u8; 8];
        put_u64(&mut bytes, 0, value);
        out.extend_from_slice(&bytes);
    };
    field(unknown.start);
    field(unknown.end);
    for (&base, pending) in counts {
        field(base);
        field(pending.count);
        field(pending.latest_due_ms);
        field(pending.latest_near_due_ms);
    }
    let crc = crc32c::crc32c(&out[FILE_HEADER_LEN..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a counts file; `None` if it is not a valid one.
pub fn decode(bytes: &[u8]) -> Option<Decoded> {
    let header = FileHeader::decode(bytes, SEGMENT_PENDING_MAGIC).ok()?;
    let entries = usize::try_from(header.b).ok()?;
    let body_len = entries.checked_mul(ENTRY_LEN)?.checked_add(16)?;
    let body = bytes.get(FILE_HEADER_LEN..FILE_HEADER_LEN.checked_add(body_len)?)?;
    let crc = bytes.get(FILE_HEADER_LEN + body_len..FILE_HEADER_LEN + body_len + 4)?;
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return None;
    }
    let unknown = get_u64(body, 0)..get_u64(body, 8);
    let counts = (0..entries)
        .map(|i| {
            let at = 16 + ENTRY_LEN * i;
            let pending = SegmentPending {
                count: get_u64(body, at + 8),
                latest_due_ms: get_u64(body, at + 16),
                latest_near_due_ms: get_u64(body, at + 24),
            };
            (get_u64(body, at), pending)
        })
        .collect();
    Some(Decoded { covered_below: header.a, unknown, counts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_a_flipped_bit_or_a_short_file_is_refused() {
        let near = SegmentPending { count: 1, latest_due_ms: 10, latest_near_due_ms: 10 };
        let far = SegmentPending { count: 1, latest_due_ms: 20, latest_near_due_ms: 0 };
        let counts = BTreeMap::from([(1_000, near), (5_000, far)]);
        let bytes = encode(6_000, &(0..0), &counts);
        let header = FileHeader::decode(&bytes, SEGMENT_PENDING_MAGIC).unwrap();
        assert_eq!((header.a, header.b), (6_000, 2), "wheel-format.md: a = covered below, b = entries");
        assert_eq!(decode(&bytes), Some(Decoded { covered_below: 6_000, unknown: 0..0, counts }));
        let mut flipped = bytes.clone();
        flipped[FILE_HEADER_LEN + 20] ^= 1;
        assert_eq!(decode(&flipped), None);
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
    }
}
