//! Consume queues: one index per (topic, queue id), read by consumers.
//!
//! A queue is a sequence of fixed-size 32-byte entries, each pointing at a
//! message record in the commit log. Entries live in files of
//! `entries_per_file` entries after a 32-byte header, named by the 20-digit
//! index of their first entry, under `consumequeue/<topic>/<queue id>/`.
//! The dispatcher is the only writer. A consume queue is an index: recovery
//! cuts it back to what the checkpoint vouches for and replays the commit log.
//! Files are made at full length but reserved as they fill
//! ([`Mapped::create_growing`]): a queue costs the disk what it holds.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::Waker;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::error::{CorruptionKind, Error, Result};
use crate::format::queue_entry::{ENTRY_LEN, Entry, EntryProblem};
use crate::format::{
    CONSUME_QUEUE_MAGIC, FILE_HEADER_LEN, FileHeader, check_file_header, numbered_file_name,
    parse_numbered_file_name,
};
use crate::fs::sync_dir;
use crate::mmap::{MapWriter, Mapped};
use crate::sync::{Locked, ReadWrite};

/// How far ahead of a queue's last entry the prefault thread keeps pages faulted in.
const PREFAULT_AHEAD: usize = 256 << 10;

/// One consume queue.
pub(crate) struct ConsumeQueue {
    dir: PathBuf,
    topic: String,
    queue_id: u32,
    per_file: u64,
    files: RwLock<BTreeMap<u64, Arc<Mapped>>>,
    writer: Mutex<Option<(u64, MapWriter)>>,
    /// The next file, made ahead of need by the prefault thread: making one
    /// costs two fsyncs, which the dispatcher would otherwise wait for in the
    /// middle of a burst. Whoever holds this lock decides who makes a file,
    /// so a file is never made twice.
    spare: Mutex<Option<(u64, MapWriter)>>,
    len: AtomicU64,
    flushed: Mutex<u64>,
    waiters: Mutex<Vec<Sender<()>>>,
    /// Tasks of async callers waiting for an append (see [`QueueWatch`](crate::QueueWatch)).
    wakers: Mutex<Vec<Waker>>,
    /// Entries whose bytes were damaged, made again from the log
    /// ([`repair`](Self::repair)); read only when an entry's bytes do not.
    repaired: Mutex<HashMap<u64, Entry>>,
}

impl ConsumeQueue {
    fn new(dir: PathBuf, topic: &str, queue_id: u32, per_file: u64) -> Self {
        Self {
            dir,
            topic: topic.to_string(),
            queue_id,
            per_file,
            files: RwLock::new(BTreeMap::new()),
            writer: Mutex::new(None),
            spare: Mutex::new(None),
            len: AtomicU64::new(0),
            flushed: Mutex::new(0),
            waiters: Mutex::new(Vec::new()),
            wakers: Mutex::new(Vec::new()),
            repaired: Mutex::new(HashMap::new()),
        }
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    pub fn queue_id(&self) -> u32 {
        self.queue_id
    }

    /// Number of entries readers may read.
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn file_size(&self) -> u64 {
        FILE_HEADER_LEN as u64 + self.per_file * ENTRY_LEN as u64
    }

    fn file_path(&self, file_no: u64) -> PathBuf {
        self.dir.join(numbered_file_name(file_no * self.per_file))
    }

    fn position(&self, index: u64) -> (u64, usize) {
        let file_no = index / self.per_file;
        (file_no, FILE_HEADER_LEN + (index % self.per_file) as usize * ENTRY_LEN)
    }

    /// Appends an entry (dispatcher only). Readers see it at once; call
    /// [`notify`](Self::notify) after a batch to wake waiting consumers.
    pub fn append(&self, entry: &Entry) -> Result<()> {
        self.append_all(std::iter::once(*entry))
    }

    /// Appends entries in order under one lock of the writer (a run of
    /// timers fired together into this queue). A failure (no room for the
    /// next file) leaves the entries before it appended: see
    /// [`last`](Self::last).
    pub fn append_all(&self, entries: impl IntoIterator<Item = Entry>) -> Result<()> {
        let mut slot = self.writer.locked();
        for entry in entries {
            let index = self.len();
            let (file_no, at) = self.position(index);
            if slot.as_ref().is_none_or(|(no, _)| *no != file_no) {
                *slot = Some((file_no, self.next_file(file_no)?));
            }
            let (_, writer) = slot.as_mut().expect("just ensured");
            writer.reserve_to(at + ENTRY_LEN)?;
            writer.unpublished_mut(at, ENTRY_LEN).copy_from_slice(&entry.encode(index));
            writer.publish(at + ENTRY_LEN);
            self.len.store(index + 1, Ordering::Release);
        }
        Ok(())
    }

    /// The file to append to from entry `file_no * per_file` on: the spare if
    /// it is that file, otherwise made now. Readers see it from here on.
    fn next_file(&self, file_no: u64) -> Result<MapWriter> {
        let mut spare = self.spare.locked();
        let writer = match spare.take() {
            Some((no, writer)) if no == file_no => writer,
            other => {
                *spare = other;
                self.create_file(file_no)?
            }
        };
        self.files.writing().insert(file_no, Arc::clone(writer.shared()));
        Ok(writer)
    }

    /// Gets files ready ahead of the dispatcher (prefault thread): faults in
    /// the pages just ahead of the last entry, and makes the next file once
    /// the current one is a quarter full. A first write to a page of a fresh
    /// file can wait on the file system's journal for milliseconds, and
    /// making a file costs two fsyncs; the dispatcher should wait for neither
    /// in the middle of a burst. Returns whether it made a file.
    ///
    /// A spare left unused by a crash or a close is an empty file past the
    /// queue's end: recovery removes it like any other file past the end.
    pub fn prepare_ahead(&self) -> Result<bool> {
        let (file_no, at) = self.position(self.len());
        if let Some(file) = self.file(file_no) {
            file.prefault_to(at + PREFAULT_AHEAD);
        }
        // The dispatcher takes this lock to move to another file, so while it
        // is held the file of the last entry stays the same.
        let mut spare = self.spare.locked();
        let len = self.len();
        let file_no = len / self.per_file;
        // At a file boundary the next file is the dispatcher's to make.
        let started = self.files.reading().contains_key(&file_no);
        if !started || len % self.per_file < (self.per_file / 4).max(1) {
            return Ok(false);
        }
        let next = file_no + 1;
        match spare.take() {
            Some((no, writer)) if no == next => {
                *spare = Some((no, writer));
                return Ok(false);
            }
            // Cannot happen (a spare is always the file after the last
            // entry's); if it did, that file would only ever confuse a reopen.
            Some((no, writer)) => self.remove_spare(no, writer)?,
            None => {}
        }
        let writer = self.create_file(next)?;
        writer.shared().prefault_to(FILE_HEADER_LEN + PREFAULT_AHEAD);
        *spare = Some((next, writer));
        Ok(true)
    }

    /// Removes the spare, if any (at close: nothing appends any more).
    fn discard_spare(&self) -> Result<()> {
        let spare = self.spare.locked().take();
        match spare {
            Some((file_no, writer)) => self.remove_spare(file_no, writer),
            None => Ok(()),
        }
    }

    fn remove_spare(&self, file_no: u64, writer: MapWriter) -> Result<()> {
        drop(writer);
        let path = self.file_path(file_no);
        crate::fs::remove_file(&path)?;
        sync_dir(&self.dir)
    }

    /// Makes file `file_no` on disk (not yet visible to readers).
    fn create_file(&self, file_no: u64) -> Result<MapWriter> {
        // The new topic and queue directories are made durable in their parents.
        crate::fs::create_dir(&self.dir)?;
        let header = FileHeader::new(CONSUME_QUEUE_MAGIC, self.per_file, file_no * self.per_file).encode();
        Mapped::create_growing(&self.file_path(file_no), self.file_size(), &header)
    }

    /// The last entry, if the queue has one that reads.
    pub fn last(&self) -> Option<Entry> {
        self.len().checked_sub(1).and_then(|index| self.read(index).ok())
    }

    /// Reads entry `index`, which must be below [`len`](Self::len).
    pub fn read(&self, index: u64) -> Result<Entry> {
        let (file_no, _) = self.position(index);
        self.read_in(self.file(file_no).as_ref(), index)
    }

    /// Reads entries `[from, upto)` into `out`, each as [`read`](Self::read)
    /// would, looking each file up once. Stops at the first that does not
    /// read, with its position and why; the ones before it are in `out`.
    pub fn read_batch(
        &self,
        from: u64,
        upto: u64,
        out: &mut Vec<Entry>,
    ) -> std::result::Result<(), (u64, Error)> {
        let mut file: Option<(u64, Option<Arc<Mapped>>)> = None;
        for index in from..upto {
            let (file_no, _) = self.position(index);
            if file.as_ref().is_none_or(|(no, _)| *no != file_no) {
                file = Some((file_no, self.file(file_no)));
            }
            let entry = self.read_in(file.as_ref().and_then(|(_, f)| f.as_ref()), index);
            out.push(entry.map_err(|e| (index, e))?);
        }
        Ok(())
    }

    /// Files on disk: the readable ones and the spare, if any.
    fn file_count(&self) -> u64 {
        let spare = self.spare.locked().is_some();
        self.files.reading().len() as u64 + u64::from(spare)
    }

    fn file(&self, file_no: u64) -> Option<Arc<Mapped>> {
        self.files.reading().get(&file_no).cloned()
    }

    /// Reads entry `index` from `file`, the file holding it if there is one.
    fn read_in(&self, file: Option<&Arc<Mapped>>, index: u64) -> Result<Entry> {
        let (file_no, at) = self.position(index);
        let path = || self.file_path(file_no);
        let file = file.ok_or_else(|| Error::corruption(path(), 0, CorruptionKind::MissingFile))?;
        let bytes = file.read(at, ENTRY_LEN).ok_or_else(|| {
            let why = format!("entry {index} is not written");
            Error::corruption(path(), at as u64, CorruptionKind::BadReference(why))
        })?;
        Entry::decode(bytes, index).or_else(|problem| {
            if let Some(entry) = self.repaired.locked().get(&index) {
                return Ok(*entry);
            }
            let kind = match problem {
                EntryProblem::Empty => CorruptionKind::BadFrame("empty consume-queue entry".into()),
                EntryProblem::Checksum { stored, computed } => {
                    CorruptionKind::ChecksumMismatch { stored, computed }
                }
            };
            Err(Error::corruption(path(), at as u64, kind))
        })
    }

    /// Whether `error`, from reading an entry of this queue, is damage to the
    /// entry's own bytes (not to the record it points at), which
    /// [`repair`](Self::repair) can make good.
    pub fn is_damaged_entry(&self, error: &Error) -> bool {
        matches!(
            error,
            Error::Corruption {
                file,
                kind: CorruptionKind::ChecksumMismatch { .. } | CorruptionKind::BadFrame(_),
                ..
            } if file.starts_with(&self.dir)
        )
    }

    /// Reads the entries from `from` on as `entries`, which the caller made
    /// again from the log for entries whose bytes are damaged. The bytes stay
    /// as they are (readers may hold them); after a reopen the repair is made
    /// again when the entries are met.
    pub fn repair(&self, from: u64, entries: &[Entry]) {
        let mut repaired = self.repaired.locked();
        repaired.extend((from..).zip(entries.iter().copied()));
    }

    /// Index of the oldest entry still on disk (retention deletes whole
    /// files of entries whose records it deleted).
    pub fn first_index(&self) -> u64 {
        let files = self.files.reading();
        files.keys().next().map_or(self.len(), |file_no| file_no * self.per_file)
    }

    /// Deletes the oldest files whose entries all point below `log_start`
    /// (records retention deleted), never the file being appended to.
    /// Returns how many it deleted.
    pub fn delete_files_below(&self, log_start: u64) -> Result<u64> {
        let writing = self.writer.locked().as_ref().map(|(no, _)| *no);
        let candidates: Vec<(u64, Arc<Mapped>)> = {
            let files = self.files.reading();
            files.iter().map(|(no, file)| (*no, Arc::clone(file))).collect()
        };
        let mut deleted = 0;
        for (file_no, file) in candidates {
            let last = (file_no + 1) * self.per_file - 1;
            if writing.is_none_or(|w| file_no >= w) || last >= self.len() {
                break;
            }
            let at = self.position(last).1;
            let points_below = file
                .read(at, ENTRY_LEN)
                .and_then(|bytes| Entry::decode(bytes, last).ok())
                .is_some_and(|entry| entry.log_offset < log_start);
            if !points_below {
                break;
            }
            self.files.writing().remove(&file_no);
            let path = self.file_path(file_no);
            crate::fs::remove_file(&path)?;
            deleted += 1;
        }
        if deleted > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(deleted)
    }

    /// Wakes every consumer waiting on this queue.
    pub fn notify(&self) {
        let mut waiters = self.waiters.locked();
        waiters.retain(|w| !matches!(w.try_send(()), Err(TrySendError::Disconnected(()))));
        drop(waiters);
        let woken = std::mem::take(&mut *self.wakers.locked());
        woken.into_iter().for_each(Waker::wake);
    }

    /// Wakes the task of `waker` at the next append (once).
    pub fn wake_on_append(&self, waker: &Waker) {
        let mut wakers = self.wakers.locked();
        if !wakers.iter().any(|w| w.will_wake(waker)) {
            wakers.push(waker.clone());
        }
    }

    /// A receiver that gets a token whenever entries are appended.
    pub fn subscribe(&self) -> Receiver<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.waiters.locked().push(tx);
        rx
    }

    /// Syncs entries appended since the last flush.
    pub fn flush(&self) -> Result<()> {
        let mut flushed = self.flushed.locked();
        let len = self.len();
        let mut index = *flushed;
        while index < len {
            let (file_no, at) = self.position(index);
            let in_file = (self.per_file - index % self.per_file).min(len - index);
            // Not under the table's lock: an msync can take milliseconds, and
            // the dispatcher takes the lock to add the next file.
            if let Some(file) = self.file(file_no) {
                file.flush_appended(at, in_file as usize * ENTRY_LEN)?;
            }
            index += in_file;
        }
        *flushed = len;
        Ok(())
    }

    /// Opens an existing queue directory, keeping only entries for records below
    /// `trusted_end` (the checkpoint's dispatched offset); the rest is zeroed and
    /// replayed from the commit log.
    fn recover(dir: PathBuf, topic: &str, queue_id: u32, per_file: u64, trusted_end: u64) -> Result<Self> {
        let per_file = crate::format::adopted_per_file(&dir, CONSUME_QUEUE_MAGIC, per_file);
        let queue = Self::new(dir, topic, queue_id, per_file);
        let mut writers = queue.open_files()?;
        let len = trusted_len(&writers, per_file, trusted_end);
        queue.refuse_damage_at(&writers, len)?;
        let tail_file = len / per_file;
        let mut files = BTreeMap::new();
        let mut tail = None;
        for (file_no, mut writer) in std::mem::take(&mut writers) {
            if file_no < tail_file {
                writer.publish(writer.shared().len());
                files.insert(file_no, Arc::clone(writer.shared()));
            } else if file_no == tail_file {
                let at = queue.position(len).1;
                writer.zero_tail(at)?;
                writer.publish(at);
                files.insert(file_no, Arc::clone(writer.shared()));
                tail = Some((file_no, writer));
            } else {
                let path = queue.file_path(file_no);
                crate::fs::remove_file(&path)?;
                sync_dir(&queue.dir)?;
            }
        }
        *queue.files.writing() = files;
        *queue.writer.locked() = tail;
        queue.len.store(len, Ordering::Release);
        *queue.flushed.locked() = len;
        Ok(queue)
    }

    /// The search stops at the first entry that is empty, points at or past
    /// the trusted end, or fails its checksum. The last would make everything
    /// after it look untrusted and be dropped without replay: refuse instead.
    fn refuse_damage_at(&self, writers: &BTreeMap<u64, MapWriter>, index: u64) -> Result<()> {
        let (file_no, at) = self.position(index);
        let Some(writer) = writers.get(&file_no) else { return Ok(()) };
        match Entry::decode(writer.view(at, ENTRY_LEN), index) {
            Err(EntryProblem::Checksum { stored, computed }) => Err(Error::corruption(
                self.file_path(file_no),
                at as u64,
                CorruptionKind::ChecksumMismatch { stored, computed },
            )),
            _ => Ok(()),
        }
    }

    fn open_files(&self) -> Result<BTreeMap<u64, MapWriter>> {
        let mut writers = BTreeMap::new();
        let entries = std::fs::read_dir(&self.dir).map_err(|e| Error::io("list", &self.dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("list", &self.dir, e))?;
            let name = entry.file_name();
            let Some(first) = parse_numbered_file_name(&name.to_string_lossy()) else {
                continue;
            };
            let path = entry.path();
            if first % self.per_file != 0 {
                let why = format!("first entry {first} is not a multiple of {}", self.per_file);
                return Err(Error::corruption(&path, 0, CorruptionKind::BadReference(why)));
            }
            let writer = Mapped::open_growing(&path, self.file_size())?;
            check_file_header(
                &path,
                writer.view(0, FILE_HEADER_LEN),
                CONSUME_QUEUE_MAGIC,
                self.per_file,
                first,
            )?;
            writers.insert(first / self.per_file, writer);
        }
        // Contiguous from the oldest: retention deletes files from the front only.
        let first = writers.keys().next().copied().unwrap_or(0);
        for (i, &file_no) in writers.keys().enumerate() {
            if file_no != first + i as u64 {
                return Err(Error::corruption(
                    self.file_path(first + i as u64),
                    0,
                    CorruptionKind::MissingFile,
                ));
            }
        }
        Ok(writers)
    }
}

/// The number of leading entries that point below `trusted_end`. Entries for
/// records below it were on disk when the checkpoint was written, so the
/// predicate "invalid or at/after `trusted_end`" is false then true: binary search.
fn trusted_len(writers: &BTreeMap<u64, MapWriter>, per_file: u64, trusted_end: u64) -> u64 {
    let first = writers.keys().next().map_or(0, |file_no| file_no * per_file);
    let capacity = first + writers.len() as u64 * per_file;
    let trusted = |index: u64| {
        let file = &writers[&(index / per_file)];
        let at = FILE_HEADER_LEN + (index % per_file) as usize * ENTRY_LEN;
        Entry::decode(file.view(at, ENTRY_LEN), index).is_ok_and(|e| e.log_offset < trusted_end)
    };
    let (mut lo, mut hi) = (first, capacity);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if trusted(mid) { lo = mid + 1 } else { hi = mid }
    }
    lo
}

/// Every consume queue of the store, by topic then queue id, created on first use.
pub(crate) struct QueueRegistry {
    root: PathBuf,
    per_file: u64,
    queues: RwLock<HashMap<String, BTreeMap<u32, Arc<ConsumeQueue>>>>,
}

impl QueueRegistry {
    /// Opens every queue under `root`, cut back to `trusted_end`.
    pub fn open(root: &Path, per_file: u64, trusted_end: u64) -> Result<Self> {
        let _span = tracing::info_span!("consume_queue_recovery", root = %root.display()).entered();
        crate::fs::create_dir(root)?;
        let mut queues: HashMap<String, BTreeMap<u32, Arc<ConsumeQueue>>> = HashMap::new();
        for (topic, queue_id, dir) in list_queue_dirs(root)? {
            let queue = ConsumeQueue::recover(dir, &topic, queue_id, per_file, trusted_end)?;
            queues.entry(topic).or_default().insert(queue_id, Arc::new(queue));
        }
        Ok(Self { root: root.to_path_buf(), per_file, queues: RwLock::new(queues) })
    }

    pub fn get_or_create(&self, topic: &str, queue_id: u32) -> Arc<ConsumeQueue> {
        let found = self.queues.reading().get(topic).and_then(|q| q.get(&queue_id).cloned());
        if let Some(queue) = found {
            return queue;
        }
        let mut queues = self.queues.writing();
        let dir = self.root.join(topic).join(queue_id.to_string());
        let per_file = self.per_file;
        let by_id = queues.entry(topic.to_string()).or_default();
        Arc::clone(
            by_id
                .entry(queue_id)
                .or_insert_with(|| Arc::new(ConsumeQueue::new(dir, topic, queue_id, per_file))),
        )
    }

    /// The topics that have a queue (made by a put's indexing or a consumer).
    pub fn topics(&self) -> Vec<String> {
        self.queues.reading().keys().cloned().collect()
    }

    pub fn all(&self) -> Vec<Arc<ConsumeQueue>> {
        let queues = self.queues.reading();
        queues.values().flat_map(|by_id| by_id.values().cloned()).collect()
    }

    /// Gets every queue's next pages and file ready (see
    /// [`ConsumeQueue::prepare_ahead`]). A queue that fails does not stop the
    /// others; the first error is returned.
    pub fn prepare_next_files(&self) -> Result<()> {
        let failures =
            self.all().iter().map(|q| q.prepare_ahead()).filter_map(|r| r.err()).collect::<Vec<_>>();
        failures.into_iter().next().map_or(Ok(()), Err)
    }

    /// Removes every queue's spare file (at close).
    pub fn discard_spares(&self) -> Result<()> {
        self.all().iter().try_for_each(|q| q.discard_spare())
    }

    pub fn flush_all(&self) -> Result<()> {
        self.all().iter().try_for_each(|q| q.flush())
    }

    /// Deletes, in every queue, the files whose entries all point below
    /// `log_start`. Returns how many.
    pub fn delete_files_below(&self, log_start: u64) -> Result<u64> {
        self.all().iter().try_fold(0, |sum, q| Ok(sum + q.delete_files_below(log_start)?))
    }

    /// Bytes of every queue's files on disk, spares included.
    pub fn disk_bytes(&self) -> u64 {
        let file = FILE_HEADER_LEN as u64 + self.per_file * ENTRY_LEN as u64;
        self.all().iter().map(|q| q.file_count() * file).sum()
    }
}

/// `root/<topic>/<queue id>` directories.
fn list_queue_dirs(root: &Path) -> Result<Vec<(String, u32, PathBuf)>> {
    let list = |dir: &Path| -> Result<Vec<(String, PathBuf)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))? {
            let entry = entry.map_err(|e| Error::io("list", dir, e))?;
            let kind = entry.file_type().map_err(|e| Error::io("stat", entry.path(), e))?;
            if kind.is_symlink() {
                return Err(Error::io("open", entry.path(), crate::error::symlink_refused()));
            }
            if kind.is_dir() {
                out.push((entry.file_name().to_string_lossy().into_owned(), entry.path()));
            }
        }
        Ok(out)
    };
    let mut out = Vec::new();
    for (topic, topic_dir) in list(root)? {
        for (queue, dir) in list(&topic_dir)? {
            if let Ok(queue_id) = queue.parse() {
                out.push((topic.clone(), queue_id, dir));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(log_offset: u64) -> Entry {
        Entry { log_offset, record_len: 100, tag_hash: 0, time_ms: 5, flags: 0 }
    }

    #[test]
    fn append_read_and_recover_cuts_back_to_the_trusted_end() {
        let dir = tempfile::tempdir().unwrap();
        let qdir = dir.path().join("T").join("0");
        let queue = ConsumeQueue::new(qdir.clone(), "T", 0, 4);
        for i in 1..=10u64 {
            queue.append(&entry(i * 100)).unwrap();
        }
        assert_eq!(queue.len(), 10);
        assert_eq!(queue.read(9).unwrap().log_offset, 1000);
        queue.flush().unwrap();
        drop(queue);

        // The checkpoint vouches for records below 650: entries 0..6 survive.
        let queue = ConsumeQueue::recover(qdir.clone(), "T", 0, 4, 650).unwrap();
        assert_eq!(queue.len(), 6);
        queue.append(&entry(7777)).unwrap();
        assert_eq!(queue.read(6).unwrap().log_offset, 7777);
        drop(queue);
        assert!(!qdir.join(numbered_file_name(8)).exists(), "the third file only held untrusted entries");
        let queue = ConsumeQueue::recover(qdir, "T", 0, 4, 10_000).unwrap();
        assert_eq!(queue.len(), 7, "zeroed entries are not resurrected");
    }

    #[test]
    fn the_next_file_is_made_ahead_and_a_spare_left_behind_is_removed_on_recovery() {
        let dir = tempfile::tempdir().unwrap();
        let qdir = dir.path().join("T").join("0");
        let queue = ConsumeQueue::new(qdir.clone(), "T", 0, 8);
        queue.append(&entry(100)).unwrap();
        assert!(!queue.prepare_ahead().unwrap(), "not yet a quarter full");
        queue.append(&entry(200)).unwrap();
        assert!(queue.prepare_ahead().unwrap());
        assert!(!queue.prepare_ahead().unwrap(), "made once");
        let spare = qdir.join(numbered_file_name(8));
        assert!(spare.exists(), "made before the dispatcher needs it");
        assert_eq!(queue.file_count(), 2, "the spare takes disk space too");
        let inode = |path: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap());
        let made = inode(&spare);
        for i in 3..=10u64 {
            queue.append(&entry(i * 100)).unwrap();
        }
        assert_eq!(inode(&spare), made, "the spare was used, not made again");
        assert_eq!(queue.read(9).unwrap().log_offset, 1000);
        // The spare of the third file, then a crash: recovery finds an empty file past the end.
        assert!(queue.prepare_ahead().unwrap());
        queue.flush().unwrap();
        let kept = qdir.join(numbered_file_name(16));
        drop(queue);
        assert!(qdir.join(numbered_file_name(16)).exists());
        let queue = ConsumeQueue::recover(qdir.clone(), "T", 0, 8, 10_000).unwrap();
        assert_eq!(queue.len(), 10);
        assert!(!qdir.join(numbered_file_name(16)).exists(), "an unused spare is removed");
        queue.append(&entry(1100)).unwrap();
        assert_eq!(queue.read(10).unwrap().log_offset, 1100);
        // At a close, an unused spare is removed at once.
        queue.append(&entry(1200)).unwrap();
        assert!(queue.prepare_ahead().unwrap());
        assert!(kept.exists());
        queue.discard_spare().unwrap();
        assert!(!kept.exists());
    }

    #[test]
    fn no_spare_is_made_before_the_file_it_follows() {
        let dir = tempfile::tempdir().unwrap();
        let qdir = dir.path().join("T").join("0");
        for per_file in [1, 2, 3] {
            let queue = ConsumeQueue::new(qdir.clone(), "T", 0, per_file);
            assert!(!queue.prepare_ahead().unwrap(), "{per_file} per file: nothing written yet");
            assert!(!qdir.exists() || std::fs::read_dir(&qdir).unwrap().next().is_none());
            for i in 1..=2 * per_file {
                queue.append(&entry(i * 100)).unwrap();
                queue.prepare_ahead().unwrap();
                // Files are contiguous from 0: a spare only ever follows the last entry's file.
                let files = std::fs::read_dir(&qdir).unwrap().count() as u64;
                assert!(files <= i / per_file + 2, "{per_file} per file, {i} entries: {files} files");
                assert!(qdir.join(numbered_file_name((files - 1) * per_file)).exists());
            }
            queue.discard_spare().unwrap();
            drop(queue);
            let queue = ConsumeQueue::recover(qdir.clone(), "T", 0, per_file, u64::MAX).unwrap();
            assert_eq!(queue.len(), 2 * per_file);
            drop(queue);
            std::fs::remove_dir_all(&qdir).unwrap();
        }
    }
}
