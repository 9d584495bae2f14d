//! A timer-log entry (28 bytes): one timer (or one cancel) in a wheel
//! slot's chain, and, under its own magic, one cancel-ledger entry.
//!
//! `message_offset u64 | deliver_at_ms u64 | prev u64 | crc32c u32`, the CRC
//! over the entry's 8-byte index followed by bytes 0..24. The top bit of
//! `deliver_at_ms` marks a cancel entry. `wheel-format.md` is the byte ruler.

use crate::error::CorruptionKind;
use crate::format::{crc_at, get_u32, get_u64, put_u32, put_u64};

/// Entries per timer-log file by default (2 Mi entries, 56 MiB).
pub const DEFAULT_ENTRIES_PER_FILE: u64 = 1 << 21;

/// Bytes per timer-log entry.
pub const ENTRY_LEN: usize = 28;
const MESSAGE_OFFSET: usize = 0;
const DELIVER_AT: usize = MESSAGE_OFFSET + 8;
const PREV: usize = DELIVER_AT + 8;
const CRC: usize = PREV + 8;
const _: () = assert!(CRC + 4 == ENTRY_LEN);

/// The bit of the stored deliver time that marks a cancel entry (deliver times
/// are below 2^48, so it is free).
const CANCEL_BIT: u64 = 1 << 63;

/// One timer-log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerEntry {
    /// The message record in the commit log.
    pub message_offset: u64,
    /// When the timer is due (epoch ms).
    pub deliver_at_ms: u64,
    /// Index of the previous entry of the same slot, 0 for none.
    pub prev: u64,
    /// A cancel entry: the timer of `message_offset` is cancelled.
    pub cancel: bool,
}

impl TimerEntry {
    /// The entry's 28 bytes, its CRC bound to entry `index`.
    pub fn encode(&self, index: u64) -> [u8; ENTRY_LEN] {
        let mut out = [0u8; ENTRY_LEN];
        put_u64(&mut out, MESSAGE_OFFSET, self.message_offset);
        put_u64(&mut out, DELIVER_AT, self.deliver_at_ms | if self.cancel { CANCEL_BIT } else { 0 });
        put_u64(&mut out, PREV, self.prev);
        let crc = crc_at(index, &out[..CRC]);
        put_u32(&mut out, CRC, crc);
        out
    }

    /// `None` for an all-zero (unwritten) entry.
    pub fn decode(bytes: &[u8], index: u64) -> std::result::Result<Option<Self>, CorruptionKind> {
        let bytes = bytes
            .get(..ENTRY_LEN)
            .ok_or(CorruptionKind::WrongSize { expected: ENTRY_LEN as u64, found: bytes.len() as u64 })?;
        if bytes.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let stored = get_u32(bytes, CRC);
        let computed = crc_at(index, &bytes[..CRC]);
        if stored != computed {
            return Err(CorruptionKind::ChecksumMismatch { stored, computed });
        }
        let deliver_at = get_u64(bytes, DELIVER_AT);
        Ok(Some(Self {
            message_offset: get_u64(bytes, MESSAGE_OFFSET),
            deliver_at_ms: deliver_at & !CANCEL_BIT,
            prev: get_u64(bytes, PREV),
            cancel: deliver_at & CANCEL_BIT != 0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::hex;

    #[test]
    fn golden_bytes_match_wheel_format_md() {
        let e = TimerEntry { message_offset: 32, deliver_at_ms: 1_700_000_001_000, prev: 0, cancel: false };
        let bytes = e.encode(1);
        assert_eq!(&hex(&bytes)[..48], concat!("2000000000000000", "e86be5cf8b010000", "0000000000000000"));
        assert_eq!(TimerEntry::decode(&bytes, 1), Ok(Some(e)));
        assert!(TimerEntry::decode(&bytes, 2).is_err(), "bound to its index");
        let cancel = TimerEntry { cancel: true, ..e };
        let bytes = cancel.encode(1);
        assert_eq!(&hex(&bytes)[16..32], "e86be5cf8b010080", "the top bit marks a cancel");
        assert_eq!(TimerEntry::decode(&bytes, 1), Ok(Some(cancel)));
    }
}
