//! Small file-system steps every file kind shares: positioned writes,
//! durable directory changes, and whole-file replacement.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

/// Writes all of `bytes` at `offset` (a positioned write: no seek, no shared cursor).
pub(crate) fn write_all_at(file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, bytes, offset)
}

/// `fsync` of the directory holding `path`, so a create, rename or delete is durable.
pub(crate) fn sync_parent_dir(path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    sync_dir(dir)
}

/// `fsync` of a directory: its entries (files created, renamed or removed) are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io("fsync directory", dir, e))
}

/// Temp file, fsync, rename, directory fsync: the file is either old or new, never torn.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut file = File::create(&tmp)?;
        std::io::Write::write_all(&mut file, bytes)?;
        file.sync_all()
    };
    write().map_err(|e| Error::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io("rename", &tmp, e))?;
    sync_parent_dir(path)
}
