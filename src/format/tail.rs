//! A `timer/tails` record (24 bytes): where a wheel slot's chain for one
//! window begins, `window u64 | first entry u64 | crc32c u32 | 0 u32`, the
//! CRC over the slot index then bytes 0..16. `wheel-format.md` is the byte ruler.

use crate::error::CorruptionKind;
use crate::format::{FILE_HEADER_LEN, crc_at, get_u32, get_u64, put_u32, put_u64};

/// Bytes per slot record.
pub const TAIL_LEN: usize = 24;
const T_WINDOW: usize = 0;
const T_FIRST: usize = T_WINDOW + 8;
const T_CRC: usize = T_FIRST + 8;
const _: () = assert!(T_CRC + 8 == TAIL_LEN);

/// Encodes the record of slot `index`: its chain for `window` starts at entry `first`.
pub fn encode(index: u64, window: u64, first: u64) -> [u8; TAIL_LEN] {
    let mut out = [0u8; TAIL_LEN];
    put_u64(&mut out, T_WINDOW, window);
    put_u64(&mut out, T_FIRST, first);
    let crc = crc_at(index, &out[..T_CRC]);
    put_u32(&mut out, T_CRC, crc);
    out
}

/// One `timer/tails` record: the slot's chain for `window` starts at entry
/// `first_entry` of the slot's timer log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailRecord {
    /// The window whose chain it records.
    pub window: u64,
    /// The chain's first (oldest) entry.
    pub first_entry: u64,
}

/// Decodes the record of slot `index`: `Ok(None)` if it is all zero (never
/// written), an error if it fails its CRC (which binds it to its slot).
pub fn decode_record(bytes: &[u8], index: u64) -> Result<Option<TailRecord>, CorruptionKind> {
    let bytes = bytes
        .get(..TAIL_LEN)
        .ok_or(CorruptionKind::WrongSize { expected: TAIL_LEN as u64, found: bytes.len() as u64 })?;
    if bytes.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let (stored, computed) = (get_u32(bytes, T_CRC), crc_at(index, &bytes[..T_CRC]));
    if stored != computed {
        return Err(CorruptionKind::ChecksumMismatch { stored, computed });
    }
    Ok(Some(TailRecord { window: get_u64(bytes, T_WINDOW), first_entry: get_u64(bytes, T_FIRST) }))
}

/// The first entry of slot `index`'s chain if `bytes` records one for
/// `window`; anything else (another window's record, a damaged one) is unknown.
pub fn decode(bytes: &[u8], index: u64, window: u64) -> Option<u64> {
    let record = decode_record(bytes, index).ok()??;
    (record.window == window && record.first_entry != 0).then_some(record.first_entry)
}

/// Byte position of slot `index`'s record in `timer/tails`.
pub fn tail_position(index: u64) -> u64 {
    FILE_HEADER_LEN as u64 + index * TAIL_LEN as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_match_wheel_format_md() {
        let bytes = encode(5, 1_700_000_000, 42);
        assert_eq!(
            crate::format::hex(&bytes[..16]),
            concat!("00f1536500000000", "2a00000000000000"),
            "the same hex stands in wheel-format.md"
        );
        assert_eq!(decode(&bytes, 5, 1_700_000_000), Some(42));
        assert_eq!(decode(&bytes, 6, 1_700_000_000), None, "bound to its slot");
        assert_eq!(decode(&bytes, 5, 1_700_000_001), None, "another window's chain");
    }
}
