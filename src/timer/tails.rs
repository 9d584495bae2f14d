//! Where each wheel slot's chain begins: the timer-log index of its oldest
//! entry, for the window it holds. With it the timer log can be reclaimed:
//! a timer-log file wholly below the first entry of every chain a restart may
//! still read is never read again.
//!
//! `timer/tails` is a mapped file, an index of the wheel like the wheel is
//! of the commit log: a 32-byte header (magic `DWTAIL`), then one 24-byte
//! record per slot, `window u64 | first entry u64 | crc32c u32 | 0 u32`, the
//! CRC over the record's slot index then bytes 0..16. It is written beside
//! the slot and synced with the wheel. A record whose window is not the
//! slot's (written before a power loss tore them apart) or whose CRC fails
//! is unknown, and an unknown chain start keeps the whole timer log.

use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
use crate::format::{
    FILE_HEADER_LEN, FileHeader, TAILS_MAGIC, check_file_header, crc_at, get_u32, get_u64, put_u32, put_u64,
};
use crate::mmap::{MapWriter, Mapped};

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

/// The mapped `timer/tails` file.
pub(crate) struct Tails {
    file: MapWriter,
}

impl Tails {
    /// Opens (or creates, all unknown) the file for `slots` slots in `dir`.
    pub fn open(dir: &Path, slots: u64) -> Result<Self> {
        let path = dir.join("tails");
        let size = FILE_HEADER_LEN as u64 + slots * TAIL_LEN as u64;
        let file = if path.exists() {
            let file = Mapped::open(&path, size)?;
            check_file_header(&path, file.view(0, FILE_HEADER_LEN), TAILS_MAGIC, TAIL_LEN as u64, slots)?;
            file
        } else {
            Mapped::create(&path, size, &FileHeader::new(TAILS_MAGIC, TAIL_LEN as u64, slots).encode())?
        };
        Ok(Self { file })
    }

    fn at(index: u64) -> usize {
        FILE_HEADER_LEN + index as usize * TAIL_LEN
    }

    /// Records that slot `index`'s chain for `window` starts at entry `first`.
    pub fn set(&mut self, index: u64, window: u64, first: u64) {
        self.file.unpublished_mut(Self::at(index), TAIL_LEN).copy_from_slice(&encode(index, window, first));
    }

    /// Where slot `index`'s chain for `window` starts, if known.
    pub fn get(&self, index: u64, window: u64) -> Option<u64> {
        decode(self.file.view(Self::at(index), TAIL_LEN), index, window)
    }

    pub fn shared(&self) -> &Arc<Mapped> {
        self.file.shared()
    }
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

    #[test]
    fn records_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut tails = Tails::open(dir.path(), 8).unwrap();
        assert_eq!(tails.get(3, 100), None);
        tails.set(3, 100, 7);
        drop(tails);
        let tails = Tails::open(dir.path(), 8).unwrap();
        assert_eq!(tails.get(3, 100), Some(7));
        assert_eq!(tails.get(3, 101), None);
    }
}
