//! A `timer/tails` record (24 bytes): where a wheel slot's chain for one
//! window begins, `window u64 | first entry u64 | crc32c u32 | 0 u32`, the
//! CRC over the slot index then bytes 0..16. `wheel-format.md` is the byte ruler.

use crate::format::{crc_at, get_u32, get_u64, put_u32, put_u64};

/// Bytes per slot record.
pub(crate) const TAIL_LEN: usize = 24;
const T_WINDOW: usize = 0;
const T_FIRST: usize = T_WINDOW + 8;
const T_CRC: usize = T_FIRST + 8;
const _: () = assert!(T_CRC + 8 == TAIL_LEN);

/// Encodes the record of slot `index`: its chain for `window` starts at entry `first`.
pub(crate) fn encode(index: u64, window: u64, first: u64) -> [u8; TAIL_LEN] {
    let mut out = [0u8; TAIL_LEN];
    put_u64(&mut out, T_WINDOW, window);
    put_u64(&mut out, T_FIRST, first);
    let crc = crc_at(index, &out[..T_CRC]);
    put_u32(&mut out, T_CRC, crc);
    out
}

/// The first entry of slot `index`'s chain if `bytes` records one for `window`.
pub(crate) fn decode(bytes: &[u8], index: u64, window: u64) -> Option<u64> {
    let bytes = bytes.get(..TAIL_LEN)?;
    let valid = get_u32(bytes, T_CRC) == crc_at(index, &bytes[..T_CRC]);
    let first = get_u64(bytes, T_FIRST);
    (valid && get_u64(bytes, T_WINDOW) == window && first != 0).then_some(first)
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
