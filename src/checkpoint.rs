//! The store checkpoint: how far the log is known durable and how far the
//! indexes are built, so recovery starts there instead of at the beginning.
//!
//! It is double-buffered: two 96-byte slots at file offsets 0 and 512, written
//! alternately with a sequence number and a CRC. A torn write damages only the
//! slot being written; reading takes the valid slot with the higher sequence,
//! so the previous checkpoint is the fallback. The checkpoint is an index too:
//! losing it costs a longer replay, never data.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::checkpoint::Checkpoint;
use crate::format::checkpoint::{FILE_LEN, SLOT_LEN, SLOT_POSITIONS};
use crate::fs::{sync_parent_dir, write_all_at};

/// The checkpoint file, open for writing.
pub(crate) struct CheckpointFile {
    path: PathBuf,
    file: File,
    last: Option<Checkpoint>,
    /// The valid slots read at open, newest first.
    slots: Vec<Checkpoint>,
}

impl CheckpointFile {
    /// Opens or creates `path` and reads its valid slots, newest first;
    /// [`last`](Self::last) is the newest until recovery says which it
    /// trusts ([`trust`](Self::trust)).
    pub fn open(path: &Path) -> Result<Self> {
        let existed = path.exists();
        let file = crate::fs::file_options(path)
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io("open", path, e))?;
        if !existed {
            file.set_len(FILE_LEN).map_err(|e| Error::io("size", path, e))?;
            crate::fs::sync_all(&file, path)?;
            sync_parent_dir(path)?;
        }
        let mut slots: Vec<Checkpoint> = read_slots(&file).into_iter().map(|(_, cp)| cp).collect();
        slots.sort_by_key(|cp| std::cmp::Reverse(cp.sequence));
        let last = slots.first().copied();
        if existed && last.is_none() {
            tracing::warn!(file = %path.display(), "no valid checkpoint slot, recovering from the start of the log");
        }
        Ok(Self { path: path.to_path_buf(), file, last, slots })
    }

    pub fn last(&self) -> Option<Checkpoint> {
        self.last
    }

    /// The valid slots read at open, newest first.
    pub fn slots(&self) -> &[Checkpoint] {
        &self.slots
    }

    /// Recovery trusts `cp` (one of the candidates, or none: a full replay).
    pub fn trust(&mut self, cp: Option<Checkpoint>) {
        self.last = cp;
    }

    /// Writes `cp` (its sequence is assigned here) into the older slot and syncs it.
    pub fn write(&mut self, mut cp: Checkpoint) -> Result<Checkpoint> {
        cp.sequence = self.last.map_or(1, |last| last.sequence + 1);
        let position = SLOT_POSITIONS[(cp.sequence % 2) as usize];
        write_all_at(&self.file, &cp.encode(), position).map_err(|e| Error::io("write", &self.path, e))?;
        crate::fs::sync_data(&self.file, &self.path)?;
        self.last = Some(cp);
        Ok(cp)
    }
}

/// The valid slots of a checkpoint file, with their positions.
fn read_slots(file: &File) -> Vec<(u64, Checkpoint)> {
    SLOT_POSITIONS
        .iter()
        .filter_map(|&position| {
            let mut slot = [0u8; SLOT_LEN];
            std::os::unix::fs::FileExt::read_exact_at(file, &mut slot, position).ok()?;
            Checkpoint::decode(&slot).map(|cp| (position, cp))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_slot_falls_back_to_the_previous_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint");
        let mut file = CheckpointFile::open(&path).unwrap();
        assert_eq!(file.last(), None);
        file.write(Checkpoint { log_durable: 100, ..Default::default() }).unwrap();
        let second = file.write(Checkpoint { log_durable: 200, ..Default::default() }).unwrap();
        assert_eq!(second.sequence, 2);
        assert_eq!(CheckpointFile::open(&path).unwrap().last().unwrap().log_durable, 200);

        // Tear the newest slot (sequence 2 lives in slot 0).
        let raw = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        write_all_at(&raw, &[0xFF; 10], SLOT_POSITIONS[0] + 20).unwrap();
        let reopened = CheckpointFile::open(&path).unwrap().last().unwrap();
        assert_eq!((reopened.sequence, reopened.log_durable), (1, 100));
    }
}
