//! One commit-log segment file: a fixed-size, preallocated, mapped file named
//! by the 20-digit offset of its first byte, starting with a [`FileHeader`].

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::format::{COMMITLOG_MAGIC, FILE_HEADER_LEN, FileHeader, check_file_header, numbered_file_name};
use crate::mmap::{MapWriter, Mapped};

pub(crate) fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(numbered_file_name(base))
}

/// Creates the segment starting at `base`, with its space reserved on disk.
pub(crate) fn create(dir: &Path, base: u64, segment_size: u64) -> Result<MapWriter> {
    let header = FileHeader::new(COMMITLOG_MAGIC, segment_size, base).encode();
    Mapped::create(&segment_path(dir, base), segment_size, &header)
}

/// The format version of a segment whose header was checked (see `open`).
pub(crate) fn version(writer: &MapWriter) -> u32 {
    crate::format::get_u32(writer.view(0, FILE_HEADER_LEN), 8)
}

/// Opens an existing segment and checks its size and header against `base` and `segment_size`.
pub(crate) fn open(dir: &Path, base: u64, segment_size: u64) -> Result<MapWriter> {
    let path = segment_path(dir, base);
    let writer = Mapped::open(&path, segment_size)?;
    check_file_header(&path, writer.view(0, FILE_HEADER_LEN), COMMITLOG_MAGIC, segment_size, base)?;
    Ok(writer)
}
