//! The timer log: an append-only sequence of small fixed-size entries, one per
//! timer placed in a wheel slot. Each entry points back to the previous entry
//! of its slot, so a slot is read by following its chain from the head the
//! wheel file stores, without scanning anything else. The timer log is an
//! index: recovery can rebuild it from the commit log.
//!
//! Entry (28 bytes): `message_offset u64 | deliver_at_ms u64 | prev u64 | crc32c u32`,
//! the CRC over the entry's 8-byte index followed by bytes 0..24. The top bit
//! of `deliver_at_ms` marks a cancel entry: it removes the timer of the same
//! message from the slot it lands in.
//! Files hold `per_file` entries after the 32-byte header and are named by the
//! 20-digit index of their first entry. Index 0 is never used: 0 means "none".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{CorruptionKind, Error, Result};
use crate::format::timer_entry::{ENTRY_LEN, TimerEntry};
use crate::format::{
    FILE_HEADER_LEN, FileHeader, TIMER_LOG_MAGIC, check_file_header, numbered_file_name,
    parse_numbered_file_name,
};
use crate::mmap::{MapWriter, Mapped};
use crate::sync::Locked;

/// How far ahead of a timer log's last entry `dw-prefault` keeps its file's
/// pages faulted in (about 300,000 entries).
const FAULT_AHEAD: usize = 8 << 20;

/// A timer log's file being appended to, and how far: for the `dw-prefault`
/// thread to fault its pages in ahead of the ticking thread. A first write
/// to a page costs a page fault and the kernel's zeroing of the page (a
/// tenth of the ticker's work per timer inserted on this machine); the
/// ticker faults in the pages itself only if the prefault thread lags.
pub(crate) struct FaultAhead {
    file: std::sync::Mutex<Option<(std::sync::Arc<Mapped>, usize)>>,
    wake: crossbeam_channel::Sender<()>,
}

impl FaultAhead {
    pub fn new(wake: crossbeam_channel::Sender<()>) -> Self {
        Self { file: std::sync::Mutex::new(None), wake }
    }

    /// Asks for the pages of `file` from `at` on.
    fn ask(&self, file: &std::sync::Arc<Mapped>, at: usize) {
        *self.file.locked() = Some((std::sync::Arc::clone(file), at));
        let _ = self.wake.try_send(());
    }

    /// Faults in what was asked for (the prefault thread), a chunk at a
    /// time as the commit log's prefault does: one `madvise` over megabytes
    /// holds the process's mmap lock for as long, and a thread mapping a
    /// file meanwhile (a new consume-queue file) waits behind it.
    pub fn fault_in(&self) {
        let asked = self.file.locked().take();
        if let Some((file, at)) = asked {
            let target = (at + FAULT_AHEAD).min(file.len());
            let mut done = file.prefaulted();
            while done < target {
                done = (done + crate::mmap::PREFAULT_CHUNK).min(target);
                file.prefault_to(done);
            }
        }
    }
}

/// The timer log, owned by the wheel.
pub(crate) struct TimerLog {
    dir: PathBuf,
    /// `DWTLOG` for the timer logs; the cancel ledger uses the same layout under its own magic.
    magic: [u8; 8],
    per_file: u64,
    files: BTreeMap<u64, MapWriter>,
    /// Index the next entry gets.
    end: u64,
    /// Who faults the pages ahead of the appends, if anyone, and the byte
    /// of the newest file at which to ask again.
    ahead: Option<(std::sync::Arc<FaultAhead>, usize)>,
}

impl TimerLog {
    /// Opens the log in `dir`. Its end is `end` if given (from a checkpoint),
    /// otherwise the first unwritten entry; entries past the end are zeroed.
    pub fn open(dir: &Path, per_file: u64, end: Option<u64>) -> Result<Self> {
        Self::open_with_magic(dir, TIMER_LOG_MAGIC, per_file, end)
    }

    /// Like [`open`](Self::open), for a log of the same layout with its own file magic.
    pub fn open_with_magic(dir: &Path, magic: [u8; 8], per_file: u64, end: Option<u64>) -> Result<Self> {
        crate::fs::create_dir(dir)?;
        let per_file = crate::format::adopted_per_file(dir, magic, per_file);
        let mut log =
            Self { dir: dir.to_path_buf(), magic, per_file, files: BTreeMap::new(), end: 1, ahead: None };
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))? {
            let entry = entry.map_err(|e| Error::io("list", dir, e))?;
            let Some(first) = parse_numbered_file_name(&entry.file_name().to_string_lossy()) else {
                continue;
            };
            let path = entry.path();
            let writer = Mapped::open(&path, log.file_size())?;
            check_file_header(&path, writer.view(0, FILE_HEADER_LEN), magic, per_file, first)?;
            log.files.insert(first / per_file, writer);
        }
        log.end = match end {
            Some(end) => end.max(1),
            None => log.scan_end()?,
        };
        log.cut_after_end()?;
        Ok(log)
    }

    fn file_size(&self) -> u64 {
        FILE_HEADER_LEN as u64 + self.per_file * ENTRY_LEN as u64
    }

    fn path(&self, file_no: u64) -> PathBuf {
        self.dir.join(numbered_file_name(file_no * self.per_file))
    }

    fn position(&self, index: u64) -> (u64, usize) {
        (index / self.per_file, FILE_HEADER_LEN + (index % self.per_file) as usize * ENTRY_LEN)
    }

    /// The first index whose entry is unwritten: entries are dense, so a binary search.
    fn scan_end(&self) -> Result<u64> {
        let Some(&last) = self.files.keys().next_back() else { return Ok(1) };
        let (mut lo, mut hi) = (1u64.max(last * self.per_file), (last + 1) * self.per_file);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.read(mid)?.is_some() { lo = mid + 1 } else { hi = mid }
        }
        Ok(lo)
    }

    /// Zeroes everything past the end, and removes files wholly past it.
    fn cut_after_end(&mut self) -> Result<()> {
        let (end_file, at) = self.position(self.end);
        let past: Vec<u64> = self.files.range(end_file + 1..).map(|(&no, _)| no).collect();
        for file_no in past {
            self.files.remove(&file_no);
            let path = self.path(file_no);
            crate::fs::remove_file(&path)?;
        }
        if let Some(writer) = self.files.get_mut(&end_file) {
            writer.zero_tail(at)?;
        }
        Ok(())
    }

    /// The directory of the log's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The index the next append gets.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Index of the oldest entry still on disk (the end if there is none).
    pub fn first(&self) -> u64 {
        self.files.keys().next().map_or(self.end, |&no| (no * self.per_file).max(1))
    }

    /// Drops every entry from `end` on (zeroed; files wholly past it removed).
    pub fn cut_to(&mut self, end: u64) -> Result<()> {
        self.end = end.clamp(self.first(), self.end);
        self.cut_after_end()
    }

    /// Has `ahead` fault in the pages ahead of the appends from now on.
    pub fn fault_ahead_with(&mut self, ahead: std::sync::Arc<FaultAhead>) {
        self.ahead = Some((ahead, 0));
    }

    /// Appends an entry and returns its index.
    pub fn append(&mut self, entry: &TimerEntry) -> Result<u64> {
        let index = self.end;
        let (file_no, at) = self.position(index);
        if !self.files.contains_key(&file_no) {
            let header = FileHeader::new(self.magic, self.per_file, file_no * self.per_file).encode();
            let writer = Mapped::create(&self.path(file_no), self.file_size(), &header)?;
            self.files.insert(file_no, writer);
            if let Some((_, ask_at)) = &mut self.ahead {
                *ask_at = 0;
            }
        }
        let writer = self.files.get_mut(&file_no).expect("just ensured");
        writer.unpublished_mut(at, ENTRY_LEN).copy_from_slice(&entry.encode(index));
        if let Some((ahead, ask_at)) = &mut self.ahead
            && at >= *ask_at
        {
            // Halfway through what was asked for last: ask for the next stretch.
            ahead.ask(writer.shared(), at);
            *ask_at = at + FAULT_AHEAD / 2;
        }
        self.end += 1;
        Ok(index)
    }

    /// Reads entry `index`: `None` if it was never written.
    pub fn read(&self, index: u64) -> Result<Option<TimerEntry>> {
        let (file_no, at) = self.position(index);
        let Some(writer) = self.files.get(&file_no) else { return Ok(None) };
        TimerEntry::decode(writer.view(at, ENTRY_LEN), index)
            .map_err(|kind| Error::corruption(self.path(file_no), at as u64, kind))
    }

    /// Reads entry `index`, which a slot chain says must exist.
    pub fn read_linked(&self, index: u64) -> Result<TimerEntry> {
        self.read(index)?.ok_or_else(|| {
            let (file_no, at) = self.position(index);
            let why = format!("a slot chain points at unwritten entry {index}");
            Error::corruption(self.path(file_no), at as u64, CorruptionKind::BadReference(why))
        })
    }

    /// Deletes the files whose entries all lie below `first_needed`, never
    /// the newest file (a reopen finds the log's end in it). Returns how many.
    pub fn delete_files_below(&mut self, first_needed: u64) -> Result<u64> {
        let Some(&newest) = self.files.keys().next_back() else { return Ok(0) };
        let dead: Vec<u64> = self
            .files
            .keys()
            .copied()
            .take_while(|&no| no < newest && (no + 1) * self.per_file <= first_needed)
            .collect();
        for &file_no in &dead {
            self.files.remove(&file_no);
            let path = self.path(file_no);
            crate::fs::remove_file(&path)?;
            tracing::info!(file = %path.display(), "deleted a timer-log file no chain reads any more");
        }
        if !dead.is_empty() {
            crate::fs::sync_dir(&self.dir)?;
        }
        Ok(dead.len() as u64)
    }

    /// Every timer-log file, oldest first, with how many of its bytes hold
    /// entries written so far (what a sync needs; the rest is zeros).
    pub fn written_files(&self) -> Vec<(std::sync::Arc<Mapped>, usize)> {
        let (end_file, end_at) = self.position(self.end);
        let written = |no: u64, w: &MapWriter| if no < end_file { w.shared().len() } else { end_at };
        self.files.iter().map(|(&no, w)| (std::sync::Arc::clone(w.shared()), written(no, w))).collect()
    }

    /// Bytes of the timer-log files.
    pub fn disk_bytes(&self) -> u64 {
        self.files.len() as u64 * self.file_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ticking thread asks the prefault thread for the pages ahead of
    /// its appends, once per half window, and again in each new file.
    #[test]
    fn appends_ask_for_the_pages_ahead_once_per_half_window() {
        let dir = tempfile::tempdir().unwrap();
        // A file of one window: asked at its start and halfway.
        let per_file = (FAULT_AHEAD / ENTRY_LEN) as u64;
        let mut log = TimerLog::open(dir.path(), per_file, None).unwrap();
        let (wake, woken) = crossbeam_channel::unbounded();
        let ahead = std::sync::Arc::new(FaultAhead::new(wake));
        log.fault_ahead_with(std::sync::Arc::clone(&ahead));
        let entry = |i: u64| TimerEntry { message_offset: i, deliver_at_ms: 1_000, prev: 0, cancel: false };
        log.append(&entry(1)).unwrap();
        assert_eq!(woken.try_iter().count(), 1, "asked at the first append");
        let file = std::sync::Arc::clone(log.files.values().next().unwrap().shared());
        ahead.fault_in();
        assert!(file.prefaulted() >= FAULT_AHEAD.min(file.len()), "faulted in {} bytes", file.prefaulted());
        for i in 2..per_file {
            log.append(&entry(i)).unwrap();
        }
        assert_eq!(woken.try_iter().count(), 1, "asked again halfway");
        log.append(&entry(per_file)).unwrap();
        assert_eq!(woken.try_iter().count(), 1, "asked in the next file");
    }

    #[test]
    fn deleting_old_files_keeps_the_newest_so_a_reopen_finds_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = TimerLog::open(dir.path(), 4, None).unwrap();
        let entry = TimerEntry { message_offset: 32, deliver_at_ms: 1_000, prev: 0, cancel: false };
        // Entries 1..=7 fill files 0 and 1: the end, 8, lies on a file boundary.
        for _ in 1..=7 {
            log.append(&entry).unwrap();
        }
        assert_eq!(log.delete_files_below(8).unwrap(), 1, "file 0 goes, file 1 (the newest) stays");
        drop(log);
        let mut log = TimerLog::open(dir.path(), 4, None).unwrap();
        assert_eq!(log.end(), 8, "entry indexes are never reused");
        assert_eq!(log.append(&entry).unwrap(), 8);
        assert_eq!(log.read(2).unwrap(), None, "deleted entries are simply not there");
    }

    #[test]
    fn append_read_reopen_and_roll_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = TimerLog::open(dir.path(), 8, None).unwrap();
        for i in 1..=20u64 {
            let index = log
                .append(&TimerEntry { message_offset: i * 100, deliver_at_ms: i, prev: i - 1, cancel: false })
                .unwrap();
            assert_eq!(index, i);
        }
        assert_eq!(log.read_linked(13).unwrap().message_offset, 1300);
        drop(log);
        let log = TimerLog::open(dir.path(), 8, None).unwrap();
        assert_eq!(log.end(), 21);
        drop(log);
        // A checkpoint that knew only 10 entries cuts the rest.
        let mut log = TimerLog::open(dir.path(), 8, Some(11)).unwrap();
        assert_eq!(log.read(12).unwrap(), None);
        assert!(log.read_linked(12).is_err());
        assert_eq!(
            log.append(&TimerEntry { message_offset: 1, deliver_at_ms: 1, prev: 0, cancel: false }).unwrap(),
            11
        );
        assert!(!dir.path().join(numbered_file_name(16)).exists());
    }
}
