//! A relocation index entry (32 bytes): where the copy of a record that
//! retention moved out of a deleted segment is,
//! `original_offset u64 | deliver_at_ms u64 | position u64 | len u32 | crc32c u32`,
//! the CRC over the entry's byte position in the index file then bytes 0..28.
//! `wheel-format.md` ("Retention and the relocation area") is the byte ruler.

use crate::error::CorruptionKind;
use crate::format::{crc_at, get_u32, get_u64, put_u32, put_u64};

/// Seconds of deliver time one window file covers: 2^20 s, about 12 days,
/// so timers spread over 10 years fill about 300 files.
pub const WINDOW_SECS: u64 = 1 << 20;
/// Bytes per index entry.
pub const INDEX_ENTRY_LEN: usize = 32;
const I_ORIGINAL: usize = 0;
const I_DELIVER_AT: usize = I_ORIGINAL + 8;
const I_POSITION: usize = I_DELIVER_AT + 8;
const I_LEN: usize = I_POSITION + 8;
const I_CRC: usize = I_LEN + 4;
const _: () = assert!(I_CRC + 4 == INDEX_ENTRY_LEN);

/// Whether an index entry for the record at `original_offset` belongs to a
/// relocation that did not finish: its original still lies in a segment on
/// disk (at or after `log_start`, the first offset of the oldest segment),
/// since a segment is deleted only after its copies are synced and its
/// relocation record is durable. Recovery cuts such entries from the tail of
/// the index, and the next pass copies that segment again.
pub fn is_unfinished(original_offset: u64, log_start: u64) -> bool {
    original_offset >= log_start
}

/// One index entry: where the copy of the record at `original_offset` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Where the record was in the commit log (and still is named).
    pub original_offset: u64,
    /// The timer's (or the cancelled timer's) deliver time: names the window file.
    pub deliver_at_ms: u64,
    /// Byte position of the copy in its window file.
    pub position: u64,
    /// The copy's length.
    pub len: u32,
}

impl IndexEntry {
    /// Encodes the entry stored at byte `at` of the index file.
    pub fn encode(&self, at: u64) -> [u8; INDEX_ENTRY_LEN] {
        let mut out = [0u8; INDEX_ENTRY_LEN];
        put_u64(&mut out, I_ORIGINAL, self.original_offset);
        put_u64(&mut out, I_DELIVER_AT, self.deliver_at_ms);
        put_u64(&mut out, I_POSITION, self.position);
        put_u32(&mut out, I_LEN, self.len);
        let crc = crc_at(at, &out[..I_CRC]);
        put_u32(&mut out, I_CRC, crc);
        out
    }

    /// Decodes the entry at byte `at` of the index file (its CRC binds it there).
    pub fn decode(bytes: &[u8], at: u64) -> std::result::Result<Self, CorruptionKind> {
        if bytes.len() < INDEX_ENTRY_LEN {
            return Err(CorruptionKind::BadFrame(format!("index entry of {} bytes", bytes.len())));
        }
        let stored = get_u32(bytes, I_CRC);
        let computed = crc_at(at, &bytes[..I_CRC]);
        if stored != computed {
            return Err(CorruptionKind::ChecksumMismatch { stored, computed });
        }
        Ok(Self {
            original_offset: get_u64(bytes, I_ORIGINAL),
            deliver_at_ms: get_u64(bytes, I_DELIVER_AT),
            position: get_u64(bytes, I_POSITION),
            len: get_u32(bytes, I_LEN),
        })
    }

    /// The window file the copy is in.
    pub fn window(&self) -> u64 {
        window_of(self.deliver_at_ms)
    }
}

/// The start second of the window that holds timers due at `deliver_at_ms`.
pub fn window_of(deliver_at_ms: u64) -> u64 {
    let sec = deliver_at_ms / 1000;
    sec - sec % WINDOW_SECS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_entry_golden_bytes_match_wheel_format_md() {
        let entry = IndexEntry { original_offset: 0x40, deliver_at_ms: 1_000, position: 32, len: 100 };
        let bytes = entry.encode(32);
        // The same hex stands in wheel-format.md, "Retention and the relocation area".
        assert_eq!(
            crate::format::hex(&bytes[..28]),
            concat!("4000000000000000", "e803000000000000", "2000000000000000", "64000000")
        );
        assert_eq!(IndexEntry::decode(&bytes, 32), Ok(entry));
        assert!(IndexEntry::decode(&bytes, 64).is_err(), "the CRC binds the entry to its place");
    }
}
