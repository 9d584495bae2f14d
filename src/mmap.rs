//! Memory-mapped data files: the only module allowed to use `unsafe`.
//!
//! # Soundness contract
//! A [`Mapped`] file is shared (`Arc`) by readers and owned for writing by one
//! [`MapWriter`]. The bytes are split by a `published` watermark:
//!
//! * below it, bytes are immutable: readers get `&[u8]` and zero-copy
//!   [`Bytes`] only there, and the writer refuses to touch them;
//! * at or above it, only the writer reads or writes, through `&mut self`, so
//!   no reference to those bytes exists in any other thread.
//!
//! The watermark only grows (`publish` is `Release`, readers load `Acquire`), so
//! a slice handed out below it never overlaps a later write. Outside this
//! process the contract holds because the store locks its directory exclusively
//! (one writer process), readers such as `wheel-dump` use plain `pread`, and a
//! mapped file is never truncated (deleting a mapped file is fine on Linux; the
//! pages live until the last map goes). One gap is left to the caller: a
//! `Bytes` handed out by a closed store still maps its file, so reopening the
//! same directory in the same process must not rewrite published bytes while
//! such views live (recovery only rewrites bytes past the recovered end, which a
//! clean close never leaves behind). Space is reserved with `fallocate`
//! before a file is mapped, so a full disk is an error at creation, never a
//! `SIGBUS` on a later write. A *growing* file ([`Mapped::create_growing`]:
//! a consume queue's, which may never hold more than a few entries) is
//! reserved in steps instead: its writer reserves each stretch before it
//! writes there ([`MapWriter::reserve_to`]), and asserts so on every write.
#![allow(unsafe_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::FallocateFlags;

use crate::error::{CorruptionKind, Error, Result};
use crate::fs::{sync_parent_dir, write_all_at};
#[cfg(test)]
use crate::sync::Locked;

/// A mapped, fixed-size data file, shared by its readers.
pub(crate) struct Mapped {
    path: PathBuf,
    /// No file descriptor is kept: the mapping holds the file, and a store
    /// with many queue and timer-log files must not run out of descriptors.
    map: MmapRaw,
    published: AtomicUsize,
    /// Pages below this position have been faulted in writable.
    prefaulted: AtomicUsize,
    /// Bytes below this position have disk space reserved: the whole file,
    /// except for a growing one. Nothing is written or faulted in past it.
    reserved: AtomicUsize,
}

/// The one writer of a [`Mapped`] file.
pub(crate) struct MapWriter {
    shared: Arc<Mapped>,
}

/// How far ahead of a write pages are faulted in, in one call. Faulting a
/// chunk with `MADV_POPULATE_WRITE` measured about 8x faster here than taking
/// one page fault per 4 KiB page on first write (fresh extents of a
/// preallocated ext4 file: 3.4 GB/s against 0.41-0.45 GB/s of memcpy into the map).
pub(crate) const PREFAULT_CHUNK: usize = 2 << 20;
/// The page size assumed for [`Mapped::unmap_pages`]: where pages are larger,
/// the call is refused by the kernel and changes nothing.
pub(crate) const PAGE: usize = 4096;

/// The least a growing file reserves at a time.
pub(crate) const GROWTH_MIN: usize = 64 << 10;

impl Mapped {
    /// Creates `path` with `len` bytes reserved on disk, written first under a
    /// temporary name and renamed into place so a crash never leaves a short file.
    pub fn create(path: &Path, len: u64, header: &[u8]) -> Result<MapWriter> {
        Self::create_reserving(path, len, header, len)
    }

    /// Creates `path` as [`create`](Self::create) does, `len` bytes long,
    /// with space reserved for its first [`GROWTH_MIN`] bytes only: the rest
    /// is reserved as the writer gets there ([`MapWriter::reserve_to`]).
    pub fn create_growing(path: &Path, len: u64, header: &[u8]) -> Result<MapWriter> {
        Self::create_reserving(path, len, header, len.min(GROWTH_MIN as u64))
    }

    fn create_reserving(path: &Path, len: u64, header: &[u8], reserve_len: u64) -> Result<MapWriter> {
        let tmp = path.with_extension("tmp");
        let file = crate::fs::file_options(&tmp)
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| Error::io("create", &tmp, e))?;
        // The length first: a growing file's unreserved rest is a hole.
        let sized = file.set_len(len).map_err(|e| Error::io("set the length of", &tmp, e));
        let reserved = sized.and_then(|()| reserve(&file, path, 0, reserve_len));
        if let Err(e) = reserved {
            // A half-made file would only confuse the next open.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        write_all_at(&file, header, 0).map_err(|e| Error::io("write header of", &tmp, e))?;
        crate::fs::sync_all(&file, &tmp)?;
        crate::fs::rename(&tmp, path)?;
        sync_parent_dir(path)?;
        let writer = Self::map(path.to_path_buf(), file, reserve_len as usize)?;
        writer.shared.published.store(header.len(), Ordering::Release);
        Ok(writer)
    }

    /// Opens an existing file that must be exactly `len` bytes long.
    pub fn open(path: &Path, len: u64) -> Result<MapWriter> {
        Self::open_reserved(path, len, len as usize)
    }

    /// Opens an existing file that must be `len` bytes long, but may have
    /// been cut short (damage): the missing end is reserved again (zeros,
    /// synced) and its old length returned, for the caller to judge what was
    /// lost. A longer file is refused like a wrong size.
    pub fn open_restoring(path: &Path, len: u64) -> Result<(MapWriter, Option<u64>)> {
        let (file, found) = open_existing(path)?;
        if found > len {
            return Err(Error::corruption(path, 0, CorruptionKind::WrongSize { expected: len, found }));
        }
        let short = (found < len).then_some(found);
        if short.is_some() {
            file.set_len(len).map_err(|e| Error::io("set the length of", path, e))?;
            reserve(&file, path, found, len)?;
            crate::fs::sync_all(&file, path)?;
        }
        Ok((Self::map(path.to_path_buf(), file, len as usize)?, short))
    }

    /// Opens an existing growing file (see [`create_growing`](Self::create_growing)):
    /// what is reserved past its entries is not known, so its writer
    /// reserves again from the start (`fallocate` of reserved space is cheap).
    pub fn open_growing(path: &Path, len: u64) -> Result<MapWriter> {
        Self::open_reserved(path, len, 0)
    }

    fn open_reserved(path: &Path, len: u64, reserved: usize) -> Result<MapWriter> {
        let (file, found) = open_existing(path)?;
        if found != len {
            return Err(Error::corruption(path, 0, CorruptionKind::WrongSize { expected: len, found }));
        }
        Self::map(path.to_path_buf(), file, reserved)
    }

    fn map(path: PathBuf, file: File, reserved: usize) -> Result<MapWriter> {
        let map = MmapOptions::new().map_raw(&file).map_err(|e| Error::io("mmap", &path, e))?;
        drop(file);
        let shared = Arc::new(Mapped {
            path,
            map,
            published: AtomicUsize::new(0),
            prefaulted: AtomicUsize::new(0),
            reserved: AtomicUsize::new(reserved),
        });
        Ok(MapWriter { shared })
    }

    fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn published(&self) -> usize {
        self.published.load(Ordering::Acquire)
    }

    /// The published bytes `[offset, offset + len)`, or `None` if any of them is not published.
    pub fn read(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.published() {
            return None;
        }
        // SAFETY: `[offset, end)` lies below the published watermark, which only
        // grows; the writer never writes below it (see the module contract), and
        // the map lives as long as `self`.
        Some(unsafe { std::slice::from_raw_parts(self.map.as_mut_ptr().add(offset), len) })
    }

    /// A zero-copy `Bytes` over published bytes; keeps the map alive.
    pub fn bytes(self: &Arc<Self>, offset: usize, len: usize) -> Option<Bytes> {
        self.read(offset, len)?;
        Some(Bytes::from_owner(PublishedSlice { map: Arc::clone(self), offset, len }))
    }

    /// Position below which pages were faulted in writable (an append-only
    /// file's may have been unmapped since by [`flush_appended`](Self::flush_appended)).
    pub fn prefaulted(&self) -> usize {
        self.prefaulted.load(Ordering::Acquire)
    }

    /// Faults in writable pages up to `end` (clamped to the file), so the
    /// copies that follow run at memory speed instead of taking one fault per
    /// page. Content is untouched, so any thread may call this while the writer
    /// writes. Without `MADV_POPULATE_WRITE` (old kernels) pages just fault on
    /// first write as usual.
    pub fn prefault_to(&self, end: usize) {
        // Faulting in a hole would allocate it, unreserved: a SIGBUS on a full disk.
        let end = end.min(self.map.len()).min(self.reserved());
        let from = self.prefaulted();
        if end > from {
            let _ = self.map.advise_range(memmap2::Advice::PopulateWrite, from, end - from);
            self.prefaulted.fetch_max(end, Ordering::AcqRel);
        }
    }

    /// Drops this process's page-table entries for the whole pages inside
    /// `[offset, offset + len)`, leaving the pages in the page cache, dirty or
    /// not. Why: `msync` must write-protect every writable, dirty entry it
    /// finds, one TLB shootdown (an interrupt to every other core running
    /// this process) per page; dropping the entries of a written stretch first
    /// costs one shootdown for the whole stretch. A later read maps the page
    /// again, read-only.
    pub fn unmap_pages(&self, offset: usize, len: usize) {
        let page = PAGE;
        let start = offset.next_multiple_of(page);
        let end = (offset + len).min(self.map.len()) / page * page;
        if end > start {
            // SAFETY: this is a shared mapping of a file: MADV_DONTNEED only
            // drops page-table entries, and the next access maps the same
            // page-cache page again, so every byte reads as before (unlike a
            // private or anonymous mapping, whose pages it would discard).
            // A store another thread makes meanwhile lands in that same page
            // (the page cache holds it), before or after the entry is dropped.
            let _ = unsafe {
                self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }

    /// [`flush`](Self::flush) of a range of a file that is only appended to:
    /// its page-table entries are dropped first (see
    /// [`unmap_pages`](Self::unmap_pages)), so the sync sends one TLB
    /// shootdown for the range instead of one per page. Its pages are read
    /// later, if at all, through read-only entries; only a page still being
    /// appended to takes a write fault again. (A file written in place, like
    /// the wheel's slots, would take one per write: use `flush` there.)
    pub fn flush_appended(&self, offset: usize, len: usize) -> Result<()> {
        self.unmap_pages(offset - offset % PAGE, len + offset % PAGE);
        self.flush(offset, len)
    }

    /// `msync` of a range: returns once those bytes are on disk.
    pub fn flush(&self, offset: usize, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        #[cfg(test)]
        if FAIL_FLUSH.applies_to(&self.path) {
            return Err(Error::io("msync", &self.path, std::io::Error::other("injected flush failure")));
        }
        self.map.flush_range(offset, len).map_err(|e| Error::io("msync", &self.path, e))?;
        #[cfg(feature = "crash-recorder")]
        crate::recorder::synced_range(&self.path, offset, len);
        Ok(())
    }
}

/// Fault injection for tests: files under the directories added fail. Each
/// test adds its own store's directory, so tests running at once do not
/// clear each other's.
#[cfg(test)]
pub(crate) struct Injected(std::sync::Mutex<Vec<std::path::PathBuf>>);

#[cfg(test)]
impl Injected {
    const fn new() -> Self {
        Self(std::sync::Mutex::new(Vec::new()))
    }

    pub fn add(&self, dir: &Path) {
        self.0.locked().push(dir.to_path_buf());
    }

    pub fn remove(&self, dir: &Path) {
        self.0.locked().retain(|d| d != dir);
    }

    pub fn applies_to(&self, path: &Path) -> bool {
        self.0.locked().iter().any(|dir| path.starts_with(dir))
    }
}

/// Every flush of a file under these directories fails.
#[cfg(test)]
pub(crate) static FAIL_FLUSH: Injected = Injected::new();

/// Every file created or grown under these directories finds the disk full.
#[cfg(test)]
pub(crate) static FAIL_RESERVE: Injected = Injected::new();

/// Files under these directories are on a file system without `fallocate`.
#[cfg(test)]
pub(crate) static NO_FALLOCATE: Injected = Injected::new();

/// `fallocate` of `file` (at `path`), or `EOPNOTSUPP` where a test says the
/// file system has none.
fn fallocate(file: &File, path: &Path, mode: FallocateFlags, from: u64, len: u64) -> rustix::io::Result<()> {
    #[cfg(test)]
    if NO_FALLOCATE.applies_to(path) {
        return Err(rustix::io::Errno::OPNOTSUPP);
    }
    let _ = path;
    rustix::fs::fallocate(file, mode, from, len)
}

/// The owner behind a zero-copy [`Bytes`]: a published range of a map.
struct PublishedSlice {
    map: Arc<Mapped>,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for PublishedSlice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `Mapped::bytes` checked the range was published before building
        // this owner; published bytes never change and `self.map` keeps the map alive.
        unsafe { std::slice::from_raw_parts(self.map.map.as_mut_ptr().add(self.offset), self.len) }
    }
}

impl MapWriter {
    pub fn shared(&self) -> &Arc<Mapped> {
        &self.shared
    }

    /// Mutable access to unpublished bytes `[offset, offset + len)`.
    ///
    /// Panics if the range reaches below the published watermark or past the
    /// end of the map: both are bugs in the caller, never a property of data on disk.
    pub fn unpublished_mut(&mut self, offset: usize, len: usize) -> &mut [u8] {
        let end = offset.checked_add(len).expect("range overflows usize");
        assert!(offset >= self.shared.published(), "write below the published watermark");
        assert!(end <= self.shared.map.len(), "write past the end of the map");
        assert!(end <= self.shared.reserved(), "write past the reserved space: reserve_to first");
        if end > self.shared.prefaulted() {
            self.shared.prefault_to(end + PREFAULT_CHUNK);
        }
        // SAFETY: the range is at or above the watermark, so no reader holds a
        // reference into it; `&mut self` makes this the only live reference the
        // writer hands out; the range is inside the map, which `self` keeps alive.
        unsafe { std::slice::from_raw_parts_mut(self.shared.map.as_mut_ptr().add(offset), len) }
    }

    /// Reads any bytes, published or not; `&self` excludes a concurrent write.
    pub fn view(&self, offset: usize, len: usize) -> &[u8] {
        let end = offset.checked_add(len).expect("range overflows usize");
        assert!(end <= self.shared.map.len(), "read past the end of the map");
        // SAFETY: readers only ever hold shared references; the writer's mutable
        // references borrow `&mut self`, which cannot coexist with this `&self`.
        unsafe { std::slice::from_raw_parts(self.shared.map.as_mut_ptr().add(offset), len) }
    }

    /// Makes `[.., end)` visible to readers. The watermark never moves back.
    pub fn publish(&mut self, end: usize) {
        assert!(end <= self.shared.map.len(), "publish past the end of the map");
        assert!(end >= self.shared.published(), "the published watermark never moves back");
        self.shared.published.store(end, Ordering::Release);
    }

    /// Reserves disk space for the bytes up to `end` before they are
    /// written (see [`Mapped::create_growing`]), doubling what is reserved,
    /// by at least [`GROWTH_MIN`], up to the file's end. A full disk is
    /// [`Error::DiskFull`], and nothing is reserved then.
    pub fn reserve_to(&mut self, end: usize) -> Result<()> {
        let reserved = self.shared.reserved();
        if end <= reserved {
            return Ok(());
        }
        let len = self.shared.map.len();
        let target = end.max(reserved * 2).max(reserved + GROWTH_MIN).next_multiple_of(PAGE).min(len);
        // Published bytes were written, so they have their space; and where
        // zeros stand in for `fallocate`, they must never be written over.
        let from = reserved.max(self.shared.published());
        if from < target {
            let path = &self.shared.path;
            let file = crate::fs::file_options(path)
                .write(true)
                .open(path)
                .map_err(|e| Error::io("open", path, e))?;
            reserve(&file, path, from as u64, target as u64)?;
        }
        self.shared.reserved.store(target, Ordering::Release);
        Ok(())
    }

    /// Zeroes the unpublished bytes from `offset` to the end of the file, so stale
    /// bytes past a recovered end can never be read as data, and syncs them.
    /// A growing file's are punched out, so that they take no space again.
    pub fn zero_tail(&mut self, offset: usize) -> Result<()> {
        // An end at or past the file's length leaves nothing to zero.
        let len = self.shared.map.len().saturating_sub(offset);
        if len == 0 {
            return Ok(());
        }
        assert!(offset >= self.shared.published(), "zeroing below the published watermark");
        let path = &self.shared.path;
        let file =
            crate::fs::file_options(path).write(true).open(path).map_err(|e| Error::io("open", path, e))?;
        let growing = self.shared.reserved() < self.shared.map.len();
        let mode = match growing {
            true => FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            false => FallocateFlags::ZERO_RANGE,
        };
        let punched = fallocate(&file, path, mode, offset as u64, len as u64);
        if growing && punched.is_ok() {
            // The punched pages are holes again: reserved no longer.
            self.shared.reserved.fetch_min(offset / PAGE * PAGE, Ordering::AcqRel);
        }
        if punched.is_ok() {
            // The zeroed range is a change of the file's extents, which an
            // msync of clean pages would not make durable: sync the file.
            return crate::fs::sync_data(&file, path);
        }
        // Not every file system can zero a range in place; write the zeros,
        // once their space is reserved (only theirs: the bytes before are data).
        reserve(&file, path, offset as u64, (offset + len) as u64)?;
        self.shared.reserved.fetch_max(offset + len, Ordering::AcqRel);
        self.unpublished_mut(offset, len).fill(0);
        self.shared.flush(offset, len)
    }
}

/// Reserves real disk space (not a sparse hole) for bytes `[from, to)` of
/// `file`, which becomes `path`. A full disk is [`Error::DiskFull`].
/// Opens an existing file of the store for reading and writing (never
/// through a symbolic link), with its length.
fn open_existing(path: &Path) -> Result<(File, u64)> {
    let file = crate::fs::file_options(path)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::io("open", path, e))?;
    let found = file.metadata().map_err(|e| Error::io("stat", path, e))?.len();
    Ok((file, found))
}

fn reserve(file: &File, path: &Path, from: u64, to: u64) -> Result<()> {
    #[cfg(test)]
    if FAIL_RESERVE.applies_to(path) {
        let full = std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
        return Err(reserve_error(path, to - from, full));
    }
    let reserved = match fallocate(file, path, FallocateFlags::empty(), from, to - from) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP) => write_zeros(file, from, to),
        Err(e) => Err(e.into()),
    };
    reserved.map_err(|e| reserve_error(path, to - from, e))
}

fn reserve_error(path: &Path, needed: u64, e: std::io::Error) -> Error {
    if crate::fs::is_no_space(&e) {
        let dir = path.parent().unwrap_or(path).to_path_buf();
        let available = crate::fs::available_bytes(&dir).unwrap_or(0);
        return Error::DiskFull { dir, needed, available };
    }
    Error::io("reserve space for", path, e)
}

fn write_zeros(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    let chunk = vec![0u8; 1 << 20];
    let mut at = from;
    while at < to {
        let n = chunk.len().min((to - at) as usize);
        write_all_at(file, &chunk[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_bytes_are_readable_and_unpublished_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut w = Mapped::create(&path, 4096, b"HEAD").unwrap();
        assert_eq!(w.shared().read(0, 4), Some(&b"HEAD"[..]));
        w.unpublished_mut(4, 3).copy_from_slice(b"abc");
        assert_eq!(w.shared().read(4, 3), None);
        w.publish(7);
        assert_eq!(w.shared().read(4, 3), Some(&b"abc"[..]));
        let b = w.shared().bytes(4, 3).unwrap();
        drop(w);
        assert_eq!(&b[..], b"abc", "a Bytes keeps the map alive");
    }

    #[test]
    #[should_panic(expected = "below the published watermark")]
    fn writing_published_bytes_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Mapped::create(&dir.path().join("f"), 4096, b"HEAD").unwrap();
        w.unpublished_mut(2, 1);
    }

    #[test]
    fn a_growing_file_reserves_in_doubling_steps_and_refuses_writes_past_them() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let len = 64 * GROWTH_MIN as u64;
        let mut w = Mapped::create_growing(&path, len, b"HEAD").unwrap();
        let allocated = || std::fs::metadata(&path).unwrap().blocks() * 512;
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "made at its full length");
        assert!(allocated() <= 2 * GROWTH_MIN as u64, "{} bytes taken", allocated());
        w.unpublished_mut(GROWTH_MIN - 8, 8).fill(1);
        w.reserve_to(GROWTH_MIN + 1).unwrap();
        assert_eq!(w.shared.reserved(), 2 * GROWTH_MIN, "doubled");
        w.reserve_to(5 * GROWTH_MIN).unwrap();
        w.unpublished_mut(5 * GROWTH_MIN - 8, 8).fill(2);
        assert!(allocated() >= 5 * GROWTH_MIN as u64 && allocated() < len);
        w.reserve_to(len as usize).unwrap();
        assert_eq!(w.shared.reserved(), len as usize, "never past the end");
        // Punched on recovery: the tail is holes again, and reserved again before use.
        drop(w);
        let mut w = Mapped::open_growing(&path, len).unwrap();
        w.zero_tail(GROWTH_MIN).unwrap();
        assert!(allocated() <= 2 * GROWTH_MIN as u64, "{} bytes after punching", allocated());
        assert!(w.view(GROWTH_MIN, 8 * GROWTH_MIN).iter().all(|&b| b == 0));
        w.reserve_to(GROWTH_MIN + 8).unwrap();
        w.unpublished_mut(GROWTH_MIN, 8).fill(3);
    }

    /// Where zeros stand in for `fallocate`, reserving and zeroing a tail
    /// write them only where nothing was written.
    #[test]
    fn without_fallocate_a_growing_file_keeps_its_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        NO_FALLOCATE.add(dir.path());
        let len = 8 * GROWTH_MIN as u64;
        let mut w = Mapped::create_growing(&path, len, b"HEAD").unwrap();
        w.unpublished_mut(4, 100).fill(7);
        w.publish(104);
        w.reserve_to(GROWTH_MIN + 10).unwrap();
        w.unpublished_mut(GROWTH_MIN, 10).fill(8);
        w.publish(GROWTH_MIN + 10);
        w.shared.flush(0, GROWTH_MIN + 10).unwrap();
        drop(w);
        let mut w = Mapped::open_growing(&path, len).unwrap();
        w.zero_tail(GROWTH_MIN + 10).unwrap();
        w.publish(GROWTH_MIN + 10);
        w.reserve_to(3 * GROWTH_MIN).unwrap();
        w.unpublished_mut(2 * GROWTH_MIN, 4).fill(9);
        NO_FALLOCATE.remove(dir.path());
        assert_eq!(w.view(0, 4), b"HEAD");
        assert!(w.view(4, 100).iter().all(|&b| b == 7), "written before the reserve");
        assert!(w.view(GROWTH_MIN, 10).iter().all(|&b| b == 8), "written before the reopen");
        assert!(w.view(GROWTH_MIN + 10, 100).iter().all(|&b| b == 0));
        assert_eq!(w.view(2 * GROWTH_MIN, 4), [9; 4]);
    }

    #[test]
    #[should_panic(expected = "write past the reserved space")]
    fn a_write_past_the_reserved_space_is_a_bug() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Mapped::create_growing(&dir.path().join("f"), 4 * GROWTH_MIN as u64, b"HEAD").unwrap();
        w.unpublished_mut(GROWTH_MIN, 1);
    }

    #[test]
    fn zero_tail_clears_stale_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut w = Mapped::create(&path, 8192, b"HEAD").unwrap();
        w.unpublished_mut(4, 8188).fill(0xAB);
        w.zero_tail(100).unwrap();
        assert!(w.view(100, 8092).iter().all(|&b| b == 0));
        assert!(w.view(4, 96).iter().all(|&b| b == 0xAB));
        drop(w);
        let on_disk = std::fs::read(&path).unwrap();
        assert!(on_disk[100..].iter().all(|&b| b == 0));
    }

    /// Dropping the page-table entries of written pages changes no byte, in
    /// the map, in a `Bytes` handed out before, or on disk, and the page
    /// still being appended to takes more writes.
    #[test]
    fn a_flush_that_unmaps_written_pages_keeps_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut w = Mapped::create(&path, 4 * PAGE as u64, b"HEAD").unwrap();
        let end = 2 * PAGE + 100;
        for (i, b) in w.unpublished_mut(4, end - 4).iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        w.publish(end);
        let handed_out = w.shared().bytes(PAGE - 2, 8).unwrap();
        let before = w.view(0, end).to_vec();
        w.shared().flush_appended(0, end).unwrap();
        assert_eq!(w.view(0, end), &before[..]);
        assert_eq!(&handed_out[..], &before[PAGE - 2..PAGE + 6]);
        w.unpublished_mut(end, 3).copy_from_slice(b"xyz");
        w.publish(end + 3);
        w.shared().flush_appended(end, 3).unwrap();
        drop((w, handed_out));
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[..end], &before[..]);
        assert_eq!(&on_disk[end..end + 3], b"xyz");
    }

    #[test]
    fn open_refuses_a_file_of_the_wrong_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        drop(Mapped::create(&path, 4096, b"HEAD").unwrap());
        let err = Mapped::open(&path, 8192).err().unwrap();
        assert!(matches!(
            err,
            Error::Corruption { kind: CorruptionKind::WrongSize { expected: 8192, found: 4096 }, .. }
        ));
    }
}
