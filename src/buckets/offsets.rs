//! The bucket scheduler's progress: for each level, the index of the first
//! entry of its queue not yet delivered (RocketMQ's `delayOffset.json`).
//! Written whole (temp file, fsync, rename, directory fsync); it is state, not
//! data: losing it makes the buckets deliver their queues again from the start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{CorruptionKind, Error, Result};
use crate::fs::write_atomically;

const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct OffsetsFile {
    version: u32,
    /// Level (1-based) → next queue index to deliver.
    offsets: BTreeMap<u16, u64>,
}

/// The persisted offset table, `schedule/delay_offsets.json`.
pub(crate) struct DelayOffsets {
    path: PathBuf,
    /// The offsets as last written, so an unchanged table is not rewritten.
    written: BTreeMap<u16, u64>,
}

impl DelayOffsets {
    /// Reads the table in `dir` (empty if there is none yet).
    pub fn open(dir: &Path) -> Result<Self> {
        crate::fs::create_dir(dir)?;
        let path = dir.join(crate::format::layout::DELAY_OFFSETS_FILE);
        let written = match std::fs::read(&path) {
            Ok(bytes) => parse(&path, &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        Ok(Self { path, written })
    }

    /// The persisted offset of `level`, 0 if none.
    pub fn get(&self, level: u16) -> u64 {
        self.written.get(&level).copied().unwrap_or(0)
    }

    /// Persists `offsets` (level `i + 1` at index `i`) if they changed.
    pub fn persist(&mut self, offsets: &[u64]) -> Result<()> {
        let table: BTreeMap<u16, u64> = (1u16..).zip(offsets.iter().copied()).collect();
        if table == self.written {
            return Ok(());
        }
        let file = OffsetsFile { version: VERSION, offsets: table };
        let bytes = serde_json::to_vec_pretty(&file).expect("offsets always serialise");
        write_atomically(&self.path, &bytes)?;
        self.written = file.offsets;
        Ok(())
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<BTreeMap<u16, u64>> {
    let file: OffsetsFile = serde_json::from_slice(bytes).map_err(|e| {
        let why = format!("not a delay-offsets file: {e}");
        Error::corruption(path, e.column() as u64, CorruptionKind::BadFrame(why))
    })?;
    if file.version != VERSION {
        return Err(Error::UnsupportedVersion {
            file: path.to_path_buf(),
            found: file.version,
            supported: VERSION,
        });
    }
    Ok(file.offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut offsets = DelayOffsets::open(dir.path()).unwrap();
        assert_eq!(offsets.get(3), 0);
        offsets.persist(&[5, 0, 7]).unwrap();
        let again = DelayOffsets::open(dir.path()).unwrap();
        assert_eq!((again.get(1), again.get(2), again.get(3), again.get(4)), (5, 0, 7, 0));
    }

    #[test]
    fn a_damaged_table_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("delay_offsets.json"), b"{\"version\": 1, \"offsets\": [").unwrap();
        let err = DelayOffsets::open(dir.path()).err().unwrap();
        assert!(err.to_string().contains("delay_offsets.json"), "{err}");
    }
}
