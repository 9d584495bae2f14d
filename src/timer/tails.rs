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
use crate::format::layout::TAILS_FILE;
use crate::format::tail::{TAIL_LEN, decode, decode_record, encode, tail_position};
use crate::format::{FILE_HEADER_LEN, FileHeader, TAILS_MAGIC, check_file_header};
use crate::mmap::{MapWriter, Mapped};

/// The mapped `timer/tails` file.
pub(crate) struct Tails {
    file: MapWriter,
}

impl Tails {
    /// Opens (or creates, all unknown) the file for `slots` slots in `dir`.
    pub fn open(dir: &Path, slots: u64) -> Result<Self> {
        let path = dir.join(TAILS_FILE);
        let size = FILE_HEADER_LEN as u64 + slots * TAIL_LEN as u64;
        let file = if path.exists() {
            let file = Mapped::open(&path, size)?;
            check_file_header(&path, file.view(0, FILE_HEADER_LEN), TAILS_MAGIC, TAIL_LEN as u64, slots)?;
            file
        } else {
            Mapped::create(&path, size, &FileHeader::new(TAILS_MAGIC, TAIL_LEN as u64, slots).encode())?
        };
        let mut tails = Self { file };
        tails.reset_damaged(&path, slots);
        Ok(tails)
    }

    /// Resets every record failing its CRC to never written (unknown).
    fn reset_damaged(&mut self, path: &Path, slots: u64) {
        for index in 0..slots {
            if decode_record(self.file.view(Self::at(index), TAIL_LEN), index).is_err() {
                tracing::warn!(file = %path.display(), offset = tail_position(index), slot = index,
                    "a chain-start record fails its checksum (torn by a power loss, or damaged): reset to unknown");
                self.file.unpublished_mut(Self::at(index), TAIL_LEN).fill(0);
            }
        }
    }

    fn at(index: u64) -> usize {
        tail_position(index) as usize
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

    #[test]
    fn a_record_failing_its_checksum_is_reset_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut tails = Tails::open(dir.path(), 8).unwrap();
        tails.set(3, 100, 7);
        tails.set(4, 100, 9);
        drop(tails);
        let path = dir.path().join(TAILS_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[tail_position(3) as usize] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let tails = Tails::open(dir.path(), 8).unwrap();
        assert_eq!(tails.get(3, 100), None);
        assert_eq!(tails.get(4, 100), Some(9));
        let at = tail_position(3) as usize;
        assert!(tails.file.view(at, TAIL_LEN).iter().all(|&b| b == 0), "reset to never written");
    }
}
