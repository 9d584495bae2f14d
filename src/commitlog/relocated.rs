//! The relocation area: where retention moves the pending timers of a
//! commit-log segment it is about to delete. It is part of the commit log,
//! hence truth, not an index: after the segment is gone these copies are the
//! only bytes of those messages.
//!
//! ```text
//! relocated/index                  entries sorted by original offset
//! relocated/<window start second>  the copies of timers due in that window
//! ```
//!
//! A copy is the original record byte for byte, so its checksum still binds
//! it to its original commit-log offset: the message keeps its identity (its
//! offset), its handle and its `deliver_at_ms`, and every reader checks it
//! exactly as it checked the original. Copies are grouped in windows of
//! [`WINDOW_SECS`] by deliver time, so a copy is never moved again: a window
//! file is deleted whole once its window has passed (plus the retention
//! time, for slow consumers).
//!
//! The index holds one 32-byte entry per copy,
//! `original_offset u64 | deliver_at_ms u64 | position u64 | len u32 | crc32c u32`
//! (the CRC over the entry's byte position followed by bytes 0..28), appended
//! in original-offset order: segments are relocated oldest first, each in
//! record order, so a lookup is a binary search. Recovery rule: an entry
//! whose original offset lies in a segment that still exists belongs to a
//! relocation that did not finish (the segment is deleted only after its
//! copies are synced and the relocation record is durable); such entries are
//! cut from the tail of the index, and the next pass copies that segment
//! again. Bytes after the last indexed copy in a window file are such
//! leftovers too; they are never read.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use bytes::Bytes;

use crate::error::{CorruptionKind, Error, Result};
use crate::format::layout::{RELOCATION_COMPACTED_FILE, RELOCATION_INDEX_FILE};
use crate::format::record::{RECORD_HEADER_LEN, check_header_in};
use crate::format::relocation::{INDEX_ENTRY_LEN, IndexEntry, WINDOW_SECS, is_unfinished, window_of};
use crate::format::{
    FILE_HEADER_LEN, FileHeader, RELOCATED_MAGIC, RELOCATION_INDEX_MAGIC, check_file_header, get_u32,
    numbered_file_name, parse_numbered_file_name,
};
use crate::fs::{sync_dir, write_atomically};
use crate::sync::{Locked, ReadWrite};

/// The relocation area of one store.
pub(crate) struct RelocationArea {
    dir: PathBuf,
    /// The index file and how many of its bytes (header included) readers
    /// may search; replaced whole when the index is compacted.
    index: RwLock<IndexFile>,
    /// Serialises relocation passes, window deletions and compactions.
    writer: Mutex<()>,
}

/// The open index file and its searchable length.
struct IndexFile {
    file: File,
    len: u64,
}

impl IndexFile {
    fn read_entry(&self, path: &Path, at: u64) -> Result<IndexEntry> {
        let mut bytes = [0u8; INDEX_ENTRY_LEN];
        self.file.read_exact_at(&mut bytes, at).map_err(|e| Error::io("read", path, e))?;
        IndexEntry::decode(&bytes, at).map_err(|kind| Error::corruption(path, at, kind))
    }

    fn entries(&self) -> u64 {
        (self.len - FILE_HEADER_LEN as u64) / INDEX_ENTRY_LEN as u64
    }

    fn entry(&self, path: &Path, i: u64) -> Result<IndexEntry> {
        self.read_entry(path, FILE_HEADER_LEN as u64 + i * INDEX_ENTRY_LEN as u64)
    }
}

/// A copy in a window file that no index entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unindexed {
    pub file: PathBuf,
    pub position: u64,
    /// The record's stored checksum: bound to its original offset, so equal
    /// only to the original's (or, by chance, one in 2^32).
    pub crc: u32,
    pub len: usize,
}

/// What one relocation pass copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Copied {
    /// Messages of pending timers.
    pub timers: u64,
    /// Cancel records of timers not yet due.
    pub cancels: u64,
    /// Bytes of both.
    pub bytes: u64,
}

/// A pass in progress: copies buffered per window, index entries in order.
pub(crate) struct Pass<'a> {
    area: &'a RelocationArea,
    windows: BTreeMap<u64, (BufWriter<File>, u64)>,
    entries: Vec<IndexEntry>,
    copied: Copied,
}

impl RelocationArea {
    /// Opens (creating) the area in `dir`. `log_start` is the first offset of
    /// the oldest segment still on disk: index entries at or after it are
    /// leftovers of an unfinished pass and are cut.
    pub fn open(dir: &Path, log_start: u64) -> Result<Self> {
        Self::open_with(dir, log_start, false).map(|(area, _)| area)
    }

    /// [`open`](Self::open), writing the index's header again if it does not
    /// check out (lenient recovery): everything in it is a constant of the
    /// format, so nothing is lost. Also answers whether it did.
    pub fn open_repairing(dir: &Path, log_start: u64) -> Result<(Self, bool)> {
        Self::open_with(dir, log_start, true)
    }

    fn open_with(dir: &Path, log_start: u64, repair: bool) -> Result<(Self, bool)> {
        crate::fs::create_dir(dir)?;
        let path = dir.join(RELOCATION_INDEX_FILE);
        let index = crate::fs::file_options(&path)
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        let len = index.metadata().map_err(|e| Error::io("stat", &path, e))?.len();
        let header = FileHeader::new(RELOCATION_INDEX_MAGIC, INDEX_ENTRY_LEN as u64, WINDOW_SECS).encode();
        let mut repaired = false;
        if len < FILE_HEADER_LEN as u64 {
            index.write_all_at(&header, 0).map_err(|e| Error::io("write", &path, e))?;
            index.set_len(FILE_HEADER_LEN as u64).map_err(|e| Error::io("truncate", &path, e))?;
            crate::fs::sync_all(&index, &path)?;
            sync_dir(dir)?;
        } else {
            let mut found = [0u8; FILE_HEADER_LEN];
            index.read_exact_at(&mut found, 0).map_err(|e| Error::io("read", &path, e))?;
            match check_file_header(
                &path,
                &found,
                RELOCATION_INDEX_MAGIC,
                INDEX_ENTRY_LEN as u64,
                WINDOW_SECS,
            ) {
                Ok(_) => {}
                Err(problem @ Error::Corruption { .. }) if repair => {
                    tracing::error!(file = %path.display(), %problem, "a damaged relocation index header was written again");
                    index.write_all_at(&header, 0).map_err(|e| Error::io("write", &path, e))?;
                    crate::fs::sync_all(&index, &path)?;
                    repaired = true;
                }
                Err(e) => return Err(e),
            }
        }
        let area = Self {
            dir: dir.to_path_buf(),
            index: RwLock::new(IndexFile { file: index, len: FILE_HEADER_LEN as u64 }),
            writer: Mutex::new(()),
        };
        area.cut_unfinished(len.max(FILE_HEADER_LEN as u64), log_start)?;
        Ok((area, repaired))
    }

    pub fn index_path(&self) -> PathBuf {
        self.dir.join(RELOCATION_INDEX_FILE)
    }

    fn window_path(&self, window: u64) -> PathBuf {
        self.dir.join(numbered_file_name(window))
    }

    /// Path of the window file that starts at second `window`.
    pub fn window_file(&self, window: u64) -> PathBuf {
        self.window_path(window)
    }

    /// Walks back from the index's end over unwritten entries and entries of
    /// segments that still exist, and cuts them: only the last pass can have
    /// left any, so this reads a few entries, not the whole index. An entry
    /// that is written but fails its CRC is damage, not a torn write (entries
    /// are 32-byte aligned, so a write torn at sector granularity leaves
    /// whole entries or zeros): refused, since cutting it would lose a timer.
    fn cut_unfinished(&self, file_len: u64, log_start: u64) -> Result<()> {
        let mut index = self.index.writing();
        let header = FILE_HEADER_LEN as u64;
        let whole = header + (file_len - header) / INDEX_ENTRY_LEN as u64 * INDEX_ENTRY_LEN as u64;
        let path = self.index_path();
        let mut end = whole;
        while end > header {
            let at = end - INDEX_ENTRY_LEN as u64;
            let mut bytes = [0u8; INDEX_ENTRY_LEN];
            index.file.read_exact_at(&mut bytes, at).map_err(|e| Error::io("read", &path, e))?;
            if bytes.iter().all(|&b| b == 0) {
                end = at;
                continue;
            }
            match IndexEntry::decode(&bytes, at) {
                Ok(entry) if !is_unfinished(entry.original_offset, log_start) => break,
                Ok(_) => end = at,
                Err(kind) => return Err(Error::corruption(&path, at, kind)),
            }
        }
        if end != file_len {
            tracing::warn!(
                index = %self.index_path().display(),
                cut_bytes = file_len - end,
                "cutting index entries of an unfinished relocation"
            );
            index.file.set_len(end).map_err(|e| Error::io("truncate", &path, e))?;
            crate::fs::sync_all(&index.file, &path)?;
        }
        index.len = end;
        Ok(())
    }

    fn index(&self) -> std::sync::RwLockReadGuard<'_, IndexFile> {
        self.index.reading()
    }

    /// Number of copies indexed (fired ones included, until their window goes).
    pub fn entries(&self) -> u64 {
        self.index().entries()
    }

    /// The `i`-th index entry, in original-offset order.
    pub fn entry(&self, i: u64) -> Result<IndexEntry> {
        self.index().entry(&self.index_path(), i)
    }

    /// The original offset of the newest copy indexed, if any.
    pub fn last_original_offset(&self) -> Result<Option<u64>> {
        let index = self.index();
        match index.entries() {
            0 => Ok(None),
            n => index.entry(&self.index_path(), n - 1).map(|e| Some(e.original_offset)),
        }
    }

    /// The index entry of the copy of the record at `original_offset`, if any.
    pub fn find(&self, original_offset: u64) -> Result<Option<IndexEntry>> {
        // One guard for the whole search: a compaction cannot move entries under it.
        let index = self.index();
        let path = self.index_path();
        let (mut lo, mut hi) = (0, index.entries());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let entry = index.entry(&path, mid)?;
            match entry.original_offset.cmp(&original_offset) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(Some(entry)),
            }
        }
        Ok(None)
    }

    /// The index entry of the copy of the record that holds log offset
    /// `inside` past its start (an occurrences record's entry), if any.
    pub fn find_containing(&self, inside: u64) -> Result<Option<IndexEntry>> {
        let index = self.index();
        let path = self.index_path();
        // The last copy starting at or before `inside`.
        let (mut lo, mut hi) = (0, index.entries());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if index.entry(&path, mid)?.original_offset <= inside { lo = mid + 1 } else { hi = mid }
        }
        if lo == 0 {
            return Ok(None);
        }
        let entry = index.entry(&path, lo - 1)?;
        Ok((inside < entry.original_offset + u64::from(entry.len)).then_some(entry))
    }

    /// Whether a copy of a record in `originals` is indexed (its window may
    /// have been deleted since: compaction drops such entries).
    pub fn any_copy_in(&self, originals: std::ops::Range<u64>) -> Result<bool> {
        let index = self.index();
        let path = self.index_path();
        let (mut lo, mut hi) = (0, index.entries());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if index.entry(&path, mid)?.original_offset < originals.start { lo = mid + 1 } else { hi = mid }
        }
        if lo == index.entries() {
            return Ok(false);
        }
        Ok(index.entry(&path, lo)?.original_offset < originals.end)
    }

    /// The bytes of the copy `entry` names, or `None` if its window file was
    /// deleted (its window passed more than the retention time ago).
    pub fn read(&self, entry: &IndexEntry) -> Result<Option<Bytes>> {
        let path = self.window_path(entry.window());
        let file = match crate::fs::file_options(&path).read(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("open", &path, e)),
        };
        // The length comes from the index: checked against the window file
        // before anything is allocated for it.
        let file_len = file.metadata().map_err(|e| Error::io("stat", &path, e))?.len();
        if entry.position.checked_add(u64::from(entry.len)).is_none_or(|end| end > file_len) {
            let why =
                format!("a copy of {} bytes runs past the end of the file ({file_len} bytes)", entry.len);
            return Err(Error::corruption(&path, entry.position, CorruptionKind::BadReference(why)));
        }
        let mut bytes = vec![0u8; entry.len as usize];
        file.read_exact_at(&mut bytes, entry.position).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                let why = format!("a copy of {} bytes runs past the end of the file", entry.len);
                Error::corruption(&path, entry.position, CorruptionKind::BadReference(why))
            } else {
                Error::io("read", &path, e)
            }
        })?;
        Ok(Some(Bytes::from(bytes)))
    }

    /// Starts a relocation pass. Only one runs at a time.
    pub fn begin(&self) -> (std::sync::MutexGuard<'_, ()>, Pass<'_>) {
        let guard = self.writer.locked();
        let pass =
            Pass { area: self, windows: BTreeMap::new(), entries: Vec::new(), copied: Copied::default() };
        (guard, pass)
    }

    /// The copies in window files that no index entry names: walked from
    /// the end of each window's last indexed copy while the bytes hold a
    /// record's frame header (a torn or never-finished write ends the walk:
    /// nothing is lost there, nothing reads it). A leftover of a pass that
    /// did not finish is a copy of a record still in the log; anything else
    /// means index entries are missing, which the copies cannot restore
    /// (a copy does not record its original offset), so the caller refuses.
    pub fn unindexed_copies(&self) -> Result<Vec<Unindexed>> {
        let mut indexed_end: BTreeMap<u64, u64> = BTreeMap::new();
        {
            let index = self.index();
            let path = self.index_path();
            for i in 0..index.entries() {
                let e = index.entry(&path, i)?;
                let end = indexed_end.entry(e.window()).or_insert(FILE_HEADER_LEN as u64);
                *end = (*end).max(e.position + u64::from(e.len));
            }
        }
        let mut out = Vec::new();
        for (window, len) in self.windows()? {
            let from = indexed_end.get(&window).copied().unwrap_or(FILE_HEADER_LEN as u64);
            if len > from {
                self.frames_from(window, from, len, &mut out)?;
            }
        }
        Ok(out)
    }

    fn frames_from(&self, window: u64, mut at: u64, len: u64, out: &mut Vec<Unindexed>) -> Result<()> {
        let path = self.window_path(window);
        let file =
            crate::fs::file_options(&path).read(true).open(&path).map_err(|e| Error::io("open", &path, e))?;
        let mut header = [0u8; RECORD_HEADER_LEN];
        while at + RECORD_HEADER_LEN as u64 <= len {
            file.read_exact_at(&mut header, at).map_err(|e| Error::io("read", &path, e))?;
            let Ok(frame) = check_header_in(&header, (len - at) as usize) else { break };
            out.push(Unindexed {
                file: path.clone(),
                position: at,
                crc: get_u32(&header, 0),
                len: frame.len,
            });
            at += frame.len as u64;
        }
        Ok(())
    }

    /// Window files and their sizes, oldest window first.
    pub fn windows(&self) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        let entries = std::fs::read_dir(&self.dir).map_err(|e| Error::io("list", &self.dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("list", &self.dir, e))?;
            if let Some(window) = parse_numbered_file_name(&entry.file_name().to_string_lossy()) {
                let len = entry.metadata().map_err(|e| Error::io("stat", entry.path(), e))?.len();
                out.push((window, len));
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Deletes the window files whose whole window ends at or before
    /// `before_sec`, then compacts the index; `log_end` is the commit log's
    /// end now (see [`RELOCATION_COMPACTED_FILE`]). Returns how many files and their bytes.
    pub fn delete_windows_before(&self, before_sec: u64, log_end: u64) -> Result<(u64, u64)> {
        let _guard = self.writer.locked();
        let mut deleted = (0, 0);
        for (window, len) in self.windows()? {
            if window + WINDOW_SECS > before_sec {
                break;
            }
            let path = self.window_path(window);
            crate::fs::remove_file(&path)?;
            tracing::info!(file = %path.display(), "deleted a relocation window whose timers have all fired");
            deleted = (deleted.0 + 1, deleted.1 + len);
        }
        if deleted.0 > 0 {
            sync_dir(&self.dir)?;
            self.compact(log_end)?;
        }
        Ok(deleted)
    }

    /// Rewrites the index without the entries whose window file is gone
    /// (temporary file, fsync, rename, directory fsync), so the index holds
    /// only copies that can still be read. Called under the writer lock.
    /// First records `log_end` in [`RELOCATION_COMPACTED_FILE`]: relocation records
    /// below it may name more copies than the index still holds.
    fn compact(&self, log_end: u64) -> Result<()> {
        write_atomically(&self.dir.join(RELOCATION_COMPACTED_FILE), format!("{log_end}\n").as_bytes())?;
        let live: std::collections::HashSet<u64> = self.windows()?.into_iter().map(|(w, _)| w).collect();
        let path = self.index_path();
        let kept: Vec<IndexEntry> = {
            let index = self.index();
            (0..index.entries()).map(|i| index.entry(&path, i)).collect::<Result<Vec<_>>>()?
        }
        .into_iter()
        .filter(|entry| live.contains(&entry.window()))
        .collect();
        let mut bytes =
            FileHeader::new(RELOCATION_INDEX_MAGIC, INDEX_ENTRY_LEN as u64, WINDOW_SECS).encode().to_vec();
        for entry in &kept {
            let at = bytes.len() as u64;
            bytes.extend_from_slice(&entry.encode(at));
        }
        let tmp = path.with_extension("tmp");
        let write = || -> std::io::Result<File> {
            let mut file = crate::fs::file_options(&tmp)
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            file.write_all(&bytes)?;
            Ok(file)
        };
        let file = write().map_err(|e| Error::io("write", &tmp, e))?;
        crate::fs::sync_all(&file, &tmp)?;
        let mut index = self.index.writing();
        crate::fs::rename(&tmp, &path)?;
        sync_dir(&self.dir)?;
        tracing::info!(
            removed = index.entries() - kept.len() as u64,
            kept = kept.len(),
            "compacted the relocation index"
        );
        *index = IndexFile { file, len: bytes.len() as u64 };
        Ok(())
    }

    /// Bytes of the area on disk: window files and the index.
    pub fn disk_bytes(&self) -> Result<u64> {
        let windows: u64 = self.windows()?.iter().map(|(_, len)| len).sum();
        Ok(windows + self.index().len)
    }
}

impl Pass<'_> {
    /// Copies one record (`bytes`, found at `original_offset`, due at `deliver_at_ms`):
    /// a pending timer's message, or (`cancel`) the cancel of one.
    pub fn copy(
        &mut self,
        original_offset: u64,
        cancel: bool,
        deliver_at_ms: u64,
        bytes: &[u8],
    ) -> Result<()> {
        let window = window_of(deliver_at_ms);
        let (writer, position) = match self.windows.entry(window) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                let opened = self.area.open_window(window)?;
                v.insert(opened)
            }
        };
        let path = self.area.window_path(window);
        writer.write_all(bytes).map_err(|e| Error::io("write", &path, e))?;
        self.entries.push(IndexEntry {
            original_offset,
            deliver_at_ms,
            position: *position,
            len: bytes.len() as u32,
        });
        *position += bytes.len() as u64;
        if cancel {
            self.copied.cancels += 1;
        } else {
            self.copied.timers += 1;
        }
        self.copied.bytes += bytes.len() as u64;
        Ok(())
    }

    /// Makes the copies durable and indexes them; the caller may then write
    /// the relocation record and delete the segment.
    pub fn finish(self) -> Result<Copied> {
        for (window, (writer, _)) in self.windows {
            let path = self.area.window_path(window);
            let file = writer.into_inner().map_err(|e| Error::io("write", &path, e.into_error()))?;
            crate::fs::sync_all(&file, &path)?;
        }
        sync_dir(&self.area.dir)?;
        let path = self.area.index_path();
        let mut index = self.area.index.writing();
        let from = index.len;
        let mut at = from;
        let mut bytes = Vec::with_capacity(self.entries.len() * INDEX_ENTRY_LEN);
        for entry in &self.entries {
            bytes.extend_from_slice(&entry.encode(at));
            at += INDEX_ENTRY_LEN as u64;
        }
        index.file.write_all_at(&bytes, from).map_err(|e| Error::io("write", &path, e))?;
        crate::fs::sync_data(&index.file, &path)?;
        index.len = at;
        Ok(self.copied)
    }
}

impl RelocationArea {
    /// Opens a window file for appending, creating it with its header; returns
    /// it and the position the next copy lands at.
    fn open_window(&self, window: u64) -> Result<(BufWriter<File>, u64)> {
        let path = self.window_path(window);
        let mut file = crate::fs::file_options(&path)
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        let mut len = file.metadata().map_err(|e| Error::io("stat", &path, e))?.len();
        if len == 0 {
            let header = FileHeader::new(RELOCATED_MAGIC, WINDOW_SECS, window).encode();
            file.write_all(&header).map_err(|e| Error::io("write", &path, e))?;
            len = FILE_HEADER_LEN as u64;
        } else {
            let mut header = [0u8; FILE_HEADER_LEN];
            file.read_exact_at(&mut header, 0).map_err(|e| Error::io("read", &path, e))?;
            check_file_header(&path, &header, RELOCATED_MAGIC, WINDOW_SECS, window)?;
        }
        Ok((BufWriter::with_capacity(1 << 20, file), len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_found_by_original_offset_and_unfinished_passes_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        let area = RelocationArea::open(dir.path(), 0).unwrap();
        let (guard, mut pass) = area.begin();
        pass.copy(100, false, 5_000_000_000, b"first").unwrap();
        pass.copy(200, false, 9_000_000_000_000, b"second").unwrap();
        assert_eq!(pass.finish().unwrap(), Copied { timers: 2, cancels: 0, bytes: 11 });
        drop(guard);
        let found = area.find(200).unwrap().unwrap();
        assert_eq!(area.read(&found).unwrap().unwrap().as_ref(), b"second");
        assert_eq!(area.find(150).unwrap(), None);

        // Reopened with the segment of offset 200 still present: its copy is cut.
        drop(area);
        let area = RelocationArea::open(dir.path(), 150).unwrap();
        assert_eq!(area.entries(), 1);
        assert!(area.find(200).unwrap().is_none());
        assert!(area.find(100).unwrap().is_some());

        // A window that has passed is deleted, and the index forgets its copies.
        let entry = area.find(100).unwrap().unwrap();
        let (files, _) = area.delete_windows_before(window_of(9_000_000_000_000) / 2, 1_000).unwrap();
        assert_eq!(files, 1);
        assert_eq!(area.read(&entry).unwrap(), None);
        assert_eq!(area.find(100).unwrap(), None, "compacted away");
        assert_eq!(area.entries(), 0, "only the copy of 200 was left, and that pass was cut");
        drop(area);
        let area = RelocationArea::open(dir.path(), 150).unwrap();
        assert_eq!(area.entries(), 0);
    }

    #[test]
    fn compaction_keeps_the_copies_of_windows_still_there() {
        let dir = tempfile::tempdir().unwrap();
        let area = RelocationArea::open(dir.path(), 0).unwrap();
        let (guard, mut pass) = area.begin();
        pass.copy(100, false, 1_000_000, b"early").unwrap();
        pass.copy(200, false, 9_000_000_000_000, b"late").unwrap();
        pass.copy(300, true, 1_000_001, b"early cancel").unwrap();
        pass.finish().unwrap();
        drop(guard);
        let (files, _) = area.delete_windows_before(window_of(1_000_000) + WINDOW_SECS, 1_000).unwrap();
        let compacted = std::fs::read_to_string(dir.path().join(RELOCATION_COMPACTED_FILE)).unwrap();
        assert_eq!(compacted, "1000\n");
        assert_eq!(files, 1);
        assert_eq!(area.entries(), 1);
        let late = area.find(200).unwrap().expect("still indexed");
        assert_eq!(area.read(&late).unwrap().unwrap().as_ref(), b"late");
        drop(area);
        let area = RelocationArea::open(dir.path(), 1_000).unwrap();
        assert_eq!(area.find(200).unwrap(), Some(late), "the compacted index reopens");
    }

    #[test]
    fn a_damaged_last_entry_is_refused_at_open_and_zeros_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        let area = RelocationArea::open(dir.path(), 0).unwrap();
        let (guard, mut pass) = area.begin();
        for offset in [100, 200] {
            pass.copy(offset, false, 5_000_000_000, b"x").unwrap();
        }
        pass.finish().unwrap();
        drop(guard);
        drop(area);
        let path = dir.path().join("index");
        let clean = std::fs::read(&path).unwrap();

        let mut torn = clean.clone();
        torn.extend_from_slice(&[0u8; INDEX_ENTRY_LEN + 5]);
        std::fs::write(&path, &torn).unwrap();
        let area = RelocationArea::open(dir.path(), 1_000).unwrap();
        assert_eq!(area.entries(), 2, "unwritten entries and a partial one are cut");
        drop(area);

        let mut damaged = clean;
        damaged[FILE_HEADER_LEN + INDEX_ENTRY_LEN + 9] ^= 0x10;
        std::fs::write(&path, &damaged).unwrap();
        let err = RelocationArea::open(dir.path(), 1_000).err().expect("damage is refused").to_string();
        assert!(err.contains("index") && err.contains("offset 64"), "{err}");
    }

    #[test]
    fn a_flipped_bit_in_the_index_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let area = RelocationArea::open(dir.path(), 0).unwrap();
        let (guard, mut pass) = area.begin();
        for offset in [100, 200, 300] {
            pass.copy(offset, false, 5_000_000_000, b"x").unwrap();
        }
        pass.finish().unwrap();
        drop(guard);
        let path = dir.path().join("index");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[FILE_HEADER_LEN + INDEX_ENTRY_LEN + 3] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = area.find(200).unwrap_err().to_string();
        assert!(err.contains("index") && err.contains("offset 64"), "{err}");
    }
}
