//! A wheel slot record (32 bytes): the absolute window a slot holds, the
//! head of its chain in the timer log, and exact counts. The CRC binds the
//! record to its slot index. `wheel-format.md` ("Wheel") is the byte ruler.

use crate::error::CorruptionKind;
use crate::format::{FILE_HEADER_LEN, crc_at, get_u32, get_u64, put_u32, put_u64};

/// Bytes per slot record in the wheel file.
pub const SLOT_LEN: usize = 32;
const S_WINDOW: usize = 0;
const S_HEAD: usize = S_WINDOW + 8;
/// Where the entry count is in a slot record.
pub const S_COUNT: usize = S_HEAD + 8;
const S_LEVEL: usize = S_COUNT + 4;
const S_CANCELS: usize = S_LEVEL + 4;
const S_CRC: usize = S_CANCELS + 4;
const _: () = assert!(S_CRC + 4 == SLOT_LEN);
/// One slot record: which absolute window it holds, its chain head, and an exact count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slot {
    /// The absolute window the slot holds: an epoch second on level 0,
    /// `second >> window_shift` above.
    pub window: u64,
    /// Timer-log index of the chain's newest entry, 0 for none.
    pub head: u64,
    /// Entries in the chain, cancel entries included.
    pub count: u32,
    /// The slot's level.
    pub level: u32,
    /// How many of the `count` entries are cancel entries.
    pub cancels: u32,
}

impl Slot {
    /// The record's 32 bytes, its CRC bound to `slot_index`.
    pub fn encode(&self, slot_index: u64) -> [u8; SLOT_LEN] {
        let mut out = [0u8; SLOT_LEN];
        put_u64(&mut out, S_WINDOW, self.window);
        put_u64(&mut out, S_HEAD, self.head);
        put_u32(&mut out, S_COUNT, self.count);
        put_u32(&mut out, S_LEVEL, self.level);
        put_u32(&mut out, S_CANCELS, self.cancels);
        let crc = crc_at(slot_index, &out[..S_CRC]);
        put_u32(&mut out, S_CRC, crc);
        out
    }

    /// Decodes slot record `slot_index`; an all-zero record is an empty slot.
    pub fn decode(bytes: &[u8], slot_index: u64) -> std::result::Result<Self, CorruptionKind> {
        Self::decode_record(bytes, slot_index).map(Option::unwrap_or_default)
    }

    /// Decodes slot record `slot_index`: `Ok(None)` if it is all zero (never
    /// used), an error if it fails its CRC (which binds it to its index) or
    /// counts more cancel entries than entries.
    pub fn decode_record(bytes: &[u8], slot_index: u64) -> std::result::Result<Option<Self>, CorruptionKind> {
        let bytes = bytes
            .get(..SLOT_LEN)
            .ok_or(CorruptionKind::WrongSize { expected: SLOT_LEN as u64, found: bytes.len() as u64 })?;
        if bytes.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let stored = get_u32(bytes, S_CRC);
        let computed = crc_at(slot_index, &bytes[..S_CRC]);
        if stored != computed {
            return Err(CorruptionKind::ChecksumMismatch { stored, computed });
        }
        let slot = Self {
            window: get_u64(bytes, S_WINDOW),
            head: get_u64(bytes, S_HEAD),
            count: get_u32(bytes, S_COUNT),
            level: get_u32(bytes, S_LEVEL),
            cancels: get_u32(bytes, S_CANCELS),
        };
        if slot.cancels > slot.count {
            let why = format!("{} cancel entries among {} entries", slot.cancels, slot.count);
            return Err(CorruptionKind::BadFrame(why));
        }
        Ok(Some(slot))
    }
}

/// Byte position of slot record `index` (counted over all levels) in the wheel file.
pub fn slot_position(index: u64) -> u64 {
    FILE_HEADER_LEN as u64 + index * SLOT_LEN as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_golden_bytes_match_wheel_format_md() {
        let slot = Slot { window: 1_700_000_000, head: 5, count: 2, level: 0, cancels: 1 };
        let bytes = slot.encode(3);
        assert_eq!(
            crate::format::hex(&bytes[..28]),
            concat!("00f1536500000000", "0500000000000000", "02000000", "00000000", "01000000")
        );
        // The CRC over the slot's index (3) and bytes 0..28, checked with an independent CRC32C.
        assert_eq!(crate::format::hex(&bytes[28..]), "ceac22ed");
        assert_eq!(Slot::decode(&bytes, 3), Ok(slot));
        assert!(Slot::decode(&bytes, 4).is_err(), "bound to its index");
        assert_eq!(Slot::decode(&[0u8; SLOT_LEN], 3), Ok(Slot::default()), "zeros are an empty slot");
        assert_eq!(slot_position(3), 32 + 3 * 32);
    }
}
