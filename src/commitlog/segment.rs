//! One commit-log segment file: a fixed-size, preallocated, mapped file named
//! by the 20-digit offset of its first byte, starting with a [`FileHeader`].

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
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

/// The format version field of a segment's header (checked by `open`, or
/// not: a damaged header's field is read as it is).
pub(crate) fn version(writer: &MapWriter) -> u32 {
    crate::format::get_u32(writer.view(0, FILE_HEADER_LEN), 8)
}

/// Opens an existing segment of the right size; the second result is the
/// check of its header against `base` and `segment_size` (its version, or
/// why it does not check out: recovery decides what that costs).
pub(crate) fn open_unchecked(dir: &Path, base: u64, segment_size: u64) -> Result<(MapWriter, Result<u32>)> {
    let path = segment_path(dir, base);
    let writer = Mapped::open(&path, segment_size)?;
    let header =
        check_file_header(&path, writer.view(0, FILE_HEADER_LEN), COMMITLOG_MAGIC, segment_size, base);
    Ok((writer, header))
}

/// Makes the segment at `base` whole again if it was cut short (lenient
/// recovery): its missing end reads as zeros, which recovery and the
/// readers judge as damage or a torn tail, so the records past its old end
/// are lost and what follows is kept. Returns whether it was short.
pub(crate) fn restore_if_short(dir: &Path, base: u64, segment_size: u64) -> Result<bool> {
    let path = segment_path(dir, base);
    // Only a segment whose own header says it is of this size was cut short;
    // any other is a store opened with the wrong size, refused as such.
    let file =
        crate::fs::file_options(&path).read(true).open(&path).map_err(|e| Error::io("open", &path, e))?;
    let found = file.metadata().map_err(|e| Error::io("stat", &path, e))?.len();
    let mut header = [0u8; FILE_HEADER_LEN];
    let recorded = file
        .read_exact_at(&mut header, 0)
        .ok()
        .and_then(|()| FileHeader::decode(&header, COMMITLOG_MAGIC).ok());
    if found >= segment_size || recorded.is_none_or(|h| h.a != segment_size || h.b != base) {
        return Ok(false);
    }
    let (_, short) = Mapped::open_restoring(&path, segment_size)?;
    if let Some(found) = short {
        tracing::error!(file = %path.display(), found, expected = segment_size,
            "a segment cut short was made whole again: the records past its old end are lost");
    }
    Ok(short.is_some())
}

/// Writes a damaged header again, synced, before anything is published:
/// all it holds is known without it (the magic, the size the file has, the
/// base its name says, and `version`, the format of the segments beside it).
pub(crate) fn rewrite_header(
    writer: &mut MapWriter,
    base: u64,
    segment_size: u64,
    version: u32,
) -> Result<()> {
    let header = FileHeader { magic: COMMITLOG_MAGIC, version, a: segment_size, b: base }.encode();
    writer.unpublished_mut(0, FILE_HEADER_LEN).copy_from_slice(&header);
    writer.shared().flush(0, FILE_HEADER_LEN)
}
