//! The key index: where the timed messages of a topic and key are, so
//! [`Store::pending_by_key`](crate::Store::pending_by_key) finds them without
//! reading the log. The layout is in `format/key_index.rs`.
//!
//! The dispatcher adds an entry for every timed message with a key, in log
//! order, so the entries of a file, and the files, follow commit-log
//! offsets: a file is named by its first entry's message offset, and a new
//! one begins when the last is full. An entry holds only the offset and a
//! 32-bit hash: a lookup reads each message its bucket names and keeps those
//! whose topic and key match, then asks the wheel which are still pending.
//!
//! It is an index of the commit log. Recovery drops every entry of a message
//! at or after the dispatcher's replay start (the replay adds them again)
//! and rebuilds the newest file's bucket heads from its entries; the entries
//! before it were synced before the checkpoint that replay start comes
//! from. A missing index (a store made before it existed) or a damaged one
//! is rebuilt from the relocated copies and the log up to the replay start;
//! a directory with no file is an empty index, not a missing one.
//! Retention deletes a file once no copy of any message it names is left:
//! every segment it covers is deleted and no relocated copy lies in its range.
//!
//! The dedup index (`index/dedup/`, [`IndexKind::Dedup`]) is the same
//! structure over another key: every message put with a dedup key, timed or
//! not, under its topic and dedup key, with shorter chains and, in memory
//! beside each file, a [`HashFilter`] of its hashes (a put looks its key
//! up, and a key never seen is the common case; see `dedup.rs`).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::commitlog::CommitLog;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::key_index::{ENTRY_LEN, Geometry, HEAD_LEN, KeyEntry, key_hash};
use crate::format::layout::Layout;
use crate::format::record::{MessageView, RecordKind};
use crate::format::{DEDUP_INDEX_MAGIC, FILE_HEADER_LEN, FileHeader, KEY_INDEX_MAGIC, check_file_header};
use crate::format::{get_u32, put_u32};
use crate::format::{numbered_file_name, parse_numbered_file_name};
use crate::hash_filter::HashFilter;
use crate::mmap::{MapWriter, Mapped};
use crate::sync::Locked;

/// The two indexes by content of a store: by routing key and by dedup key.
pub(crate) struct KeyIndexes {
    /// Timed messages by topic and key (`index/keys/`).
    pub keys: KeyIndex,
    /// Messages by topic and dedup key (`index/dedup/`).
    pub dedup: KeyIndex,
}

impl KeyIndexes {
    /// Opens (or rebuilds) both, for a log whose indexes resume at `replay_from`.
    pub fn open(layout: &Layout, per_file: u64, log: &CommitLog, replay_from: u64) -> Result<Self> {
        Ok(Self {
            keys: KeyIndex::open(IndexKind::Keys, &layout.key_index(), per_file, log, replay_from)?,
            dedup: KeyIndex::open(IndexKind::Dedup, &layout.dedup_index(), per_file, log, replay_from)?,
        })
    }

    /// Indexes the message `view` at `offset` in each index it has a key of.
    pub fn add(&self, offset: u64, view: &MessageView<'_>) -> Result<()> {
        for index in [&self.keys, &self.dedup] {
            if let Some(key) = index.kind.key_of(view) {
                index.add(offset, view.topic, key)?;
            }
        }
        Ok(())
    }

    /// Syncs both (see [`KeyIndex::flush`]).
    pub fn flush(&self) -> Result<()> {
        self.keys.flush()?;
        self.dedup.flush()
    }

    /// Deletes the files of both that no message they name is left of; returns how many.
    pub fn delete_unneeded(&self, log: &CommitLog) -> Result<u64> {
        Ok(self.keys.delete_unneeded(log)? + self.dedup.delete_unneeded(log)?)
    }

    /// Bytes of both indexes' files.
    pub fn disk_bytes(&self) -> u64 {
        self.keys.disk_bytes() + self.dedup.disk_bytes()
    }
}

/// Which index: what it holds, and the shape of its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexKind {
    /// Timed messages by topic and routing key (`index/keys/`).
    Keys,
    /// Messages by topic and dedup key (`index/dedup/`): every put with a
    /// dedup key looks it up (see `dedup.rs`).
    Dedup,
}

impl IndexKind {
    fn magic(self) -> [u8; 8] {
        match self {
            IndexKind::Keys => KEY_INDEX_MAGIC,
            IndexKind::Dedup => DEDUP_INDEX_MAGIC,
        }
    }

    /// A filter for a new file of `per_file` entries, if this index keeps them.
    fn filter(self, per_file: u64) -> Option<HashFilter> {
        match self {
            IndexKind::Keys => None,
            IndexKind::Dedup => Some(HashFilter::with_capacity(per_file)),
        }
    }

    fn geometry(self, per_file: u64) -> Geometry {
        match self {
            IndexKind::Keys => Geometry::keys(per_file),
            IndexKind::Dedup => Geometry::dedup(per_file),
        }
    }

    /// The key the message `view` is indexed under, if any.
    pub fn key_of<'a>(self, view: &MessageView<'a>) -> Option<&'a str> {
        match self {
            IndexKind::Keys => {
                (view.timer_deliver_at_ms().is_some() && !view.key.is_empty()).then_some(view.key)
            }
            // A bucket scheduler's copy is not the message put.
            IndexKind::Dedup => view.dedup_key().filter(|_| !view.rescheduled),
        }
    }
}

/// The key index (or the dedup index) of one store.
pub(crate) struct KeyIndex {
    kind: IndexKind,
    dir: PathBuf,
    geometry: Geometry,
    /// By first message offset. One lock: the dispatcher appends an entry in
    /// a few tens of nanoseconds, a lookup walks one bucket per file.
    files: Mutex<Files>,
}

struct Files {
    by_first: BTreeMap<u64, IndexFile>,
    /// The newest message indexed: a record the dispatcher retries (after a
    /// full disk) is not indexed twice.
    last: Option<u64>,
}

struct IndexFile {
    map: MapWriter,
    /// Entries written.
    count: u64,
    /// Entries already synced.
    synced: u64,
    /// Whether the bucket heads were synced since the file filled up. The
    /// newest file's heads are never synced: recovery rebuilds them from its
    /// entries, so a cycle writes only the entries added (heads change
    /// all over the file).
    heads_synced: bool,
    /// The hashes of its entries (dedup index only): a lookup skips the
    /// file where the filter says the hash is not in it.
    filter: Option<HashFilter>,
}

impl KeyIndex {
    /// Opens the index in `dir` for a log whose indexes resume at
    /// `replay_from` (see the module docs); rebuilds it if it is missing or damaged.
    fn open(kind: IndexKind, dir: &Path, per_file: u64, log: &CommitLog, replay_from: u64) -> Result<Self> {
        let existed = dir.exists();
        crate::fs::create_dir(dir)?;
        let per_file = crate::format::adopted_per_file(dir, kind.magic(), per_file);
        let index = Self {
            kind,
            dir: dir.to_path_buf(),
            geometry: kind.geometry(per_file),
            files: Mutex::new(Files { by_first: BTreeMap::new(), last: None }),
        };
        // An index with no file is an empty one (no timed message had a key,
        // or retention deleted the files of all that had): a missing
        // directory is what calls for a rebuild.
        let opened = if existed { index.open_files(replay_from) } else { Ok(false) };
        match opened {
            Ok(true) => return Ok(index),
            Ok(false) if existed => return Ok(index),
            Ok(false) => {}
            Err(e) => {
                tracing::error!(dir = %dir.display(), error = %e, "an index is damaged: rebuilding it from the log");
                index.remove_all()?;
            }
        }
        index.rebuild(log, replay_from)?;
        Ok(index)
    }

    fn lock(&self) -> MutexGuard<'_, Files> {
        self.files.locked()
    }

    fn path(&self, first: u64) -> PathBuf {
        self.dir.join(numbered_file_name(first))
    }

    /// Opens the files, dropping entries from `replay_from` on. `Ok(false)`:
    /// there were none.
    fn open_files(&self, replay_from: u64) -> Result<bool> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| Error::io("list", &self.dir, e))? {
            let entry = entry.map_err(|e| Error::io("list", &self.dir, e))?;
            if let Some(first) = parse_numbered_file_name(&entry.file_name().to_string_lossy()) {
                found.push(first);
            }
        }
        found.sort_unstable();
        let mut files = self.lock();
        for first in found {
            let path = self.path(first);
            if first >= replay_from {
                // Every entry in it is of a record the replay indexes again.
                crate::fs::remove_file(&path)?;
                continue;
            }
            let per_file = self.geometry.per_file;
            let map = Mapped::open(&path, self.geometry.file_len())?;
            check_file_header(&path, map.view(0, FILE_HEADER_LEN), self.kind.magic(), per_file, first)?;
            // Its filter is filled below, once the newest file's count is known.
            let full = IndexFile { map, count: per_file, synced: per_file, heads_synced: true, filter: None };
            files.by_first.insert(first, full);
        }
        let Some((&first, newest)) = files.by_first.iter_mut().next_back() else { return Ok(false) };
        let path = self.path(first);
        let (count, last) = cut_point(&newest.map, &path, self.geometry, first..replay_from)?;
        newest.count = count;
        newest.synced = count;
        newest.heads_synced = count == self.geometry.per_file;
        rebuild_heads(newest, &path, self.geometry)?;
        for file in files.by_first.values_mut() {
            file.filter = self.filter_of(&file.map, file.count);
        }
        files.last = last;
        Ok(true)
    }

    /// A filter of the hashes of the first `count` entries in `map`, if
    /// this index keeps filters. An entry that does not check out is left
    /// out: a chain walk stops before it too.
    fn filter_of(&self, map: &MapWriter, count: u64) -> Option<HashFilter> {
        let mut filter = self.kind.filter(self.geometry.per_file)?;
        for number in 0..count {
            let bytes = map.view(self.geometry.entry_position(number), ENTRY_LEN);
            if let Some(entry) = KeyEntry::decode(bytes, number as u32) {
                filter.insert(entry.key_hash);
            }
        }
        Some(filter)
    }

    fn remove_all(&self) -> Result<()> {
        let mut files = self.lock();
        files.by_first.clear();
        files.last = None;
        for entry in std::fs::read_dir(&self.dir).map_err(|e| Error::io("list", &self.dir, e))? {
            let entry = entry.map_err(|e| Error::io("list", &self.dir, e))?;
            crate::fs::remove_file(&entry.path())?;
        }
        Ok(())
    }

    /// Indexes the relocated copies, then the log below `to`, in offset order.
    fn rebuild(&self, log: &CommitLog, to: u64) -> Result<()> {
        let area = log.relocated();
        let _span =
            tracing::info_span!("rebuild_index", kind = ?self.kind, copies = area.entries(), to).entered();
        let keyed = |_at: u64, kind: RecordKind, bytes: &[u8]| keyed(self.kind, kind, bytes);
        for i in 0..area.entries() {
            let copy = area.entry(i)?;
            match log.visit_checked(copy.original_offset, keyed) {
                Ok((Some((topic, key)), _)) => self.add(copy.original_offset, &topic, &key)?,
                Ok((None, _)) | Err(Error::Reclaimed { .. }) => {}
                Err(e) => {
                    tracing::warn!(offset = copy.original_offset, error = %e, "a relocated copy not indexed by key")
                }
            }
        }
        let mut at = log.start();
        while at < to.min(log.write_end()) {
            let (keyed, next) = log.visit_trusted(at, keyed)?;
            if let Some((topic, key)) = keyed {
                self.add(at, &topic, &key)?;
            }
            at = next;
        }
        self.flush()
    }

    /// Indexes the message at `message_offset` under its topic and key.
    pub fn add(&self, message_offset: u64, topic: &str, key: &str) -> Result<()> {
        let hash = key_hash(topic, key);
        let per_file = self.geometry.per_file;
        let mut files = self.lock();
        if files.last.is_some_and(|last| message_offset <= last) {
            return Ok(());
        }
        let needs_file = files.by_first.values().next_back().is_none_or(|f| f.count == per_file);
        if needs_file {
            let header = FileHeader::new(self.kind.magic(), per_file, message_offset).encode();
            let map = Mapped::create(&self.path(message_offset), self.geometry.file_len(), &header)?;
            let filter = self.kind.filter(per_file);
            let empty = IndexFile { map, count: 0, synced: 0, heads_synced: false, filter };
            files.by_first.insert(message_offset, empty);
        }
        let (_, file) = files.by_first.iter_mut().next_back().expect("just ensured");
        let number = file.count;
        let head = self.geometry.head_position(hash);
        let prev = get_u32(file.map.view(head, HEAD_LEN), 0);
        let entry = KeyEntry { message_offset, key_hash: hash, prev };
        let at = self.geometry.entry_position(number);
        file.map.unpublished_mut(at, ENTRY_LEN).copy_from_slice(&entry.encode(number as u32));
        put_u32(file.map.unpublished_mut(head, HEAD_LEN), 0, number as u32 + 1);
        if let Some(filter) = &mut file.filter {
            filter.insert(hash);
        }
        file.count += 1;
        files.last = Some(message_offset);
        Ok(())
    }

    /// The offsets of the messages indexed under a hash equal to that of
    /// `topic` and `key`, oldest first: a superset of that key's messages.
    pub fn candidates(&self, topic: &str, key: &str) -> Vec<u64> {
        self.candidates_of(key_hash(topic, key))
    }

    /// The offsets of the messages indexed under `hash`, oldest first.
    fn candidates_of(&self, hash: u32) -> Vec<u64> {
        let files = self.lock();
        let mut found = Vec::new();
        for (&first, file) in &files.by_first {
            let mut chain = self.chain_in(first, file, hash);
            chain.reverse();
            found.extend(chain);
        }
        found
    }

    /// The newest file that begins below `below` and has entries under
    /// `hash`: its first offset, and the offsets indexed under `hash` in it,
    /// newest first; `None` once no such file is left. A lookup that wants the newest
    /// message of a key asks file by file, and stops at the first that
    /// holds it: a recent key costs one file, not one per file.
    pub fn newest_candidates_below(&self, hash: u32, below: u64) -> Option<(u64, Vec<u64>)> {
        let files = self.lock();
        files.by_first.range(..below).rev().find_map(|(&first, file)| {
            let chain = self.chain_in(first, file, hash);
            (!chain.is_empty()).then_some((first, chain))
        })
    }

    /// The offsets indexed under `hash` in `file` (which begins at
    /// `first`), newest first: none where its filter says the hash is not in it.
    fn chain_in(&self, first: u64, file: &IndexFile, hash: u32) -> Vec<u64> {
        let mut chain = Vec::new();
        if file.filter.as_ref().is_some_and(|filter| !filter.may_contain(hash)) {
            return chain;
        }
        let mut next = get_u32(file.map.view(self.geometry.head_position(hash), HEAD_LEN), 0);
        while next != 0 {
            let number = next - 1;
            let at = self.geometry.entry_position(u64::from(number));
            let Some(entry) = KeyEntry::decode(file.map.view(at, ENTRY_LEN), number) else {
                tracing::warn!(file = %self.path(first).display(), offset = at,
                    "an index entry does not check out: the rest of its chain is not read");
                break;
            };
            if entry.key_hash == hash {
                chain.push(entry.message_offset);
            }
            next = entry.prev;
        }
        chain
    }

    /// Syncs the entries written since the last sync, and the bucket heads
    /// of files that filled up since. The lock is not held while syncing:
    /// the dispatcher goes on adding entries meanwhile.
    pub fn flush(&self) -> Result<()> {
        let (geometry, per_file) = (self.geometry, self.geometry.per_file);
        let to_sync: Vec<(u64, Arc<Mapped>, Range<u64>, bool)> = self
            .lock()
            .by_first
            .iter()
            .filter(|(_, f)| f.synced < f.count || (f.count == per_file && !f.heads_synced))
            .map(|(&first, f)| {
                let heads = f.count == per_file && !f.heads_synced;
                (first, Arc::clone(f.map.shared()), f.synced..f.count, heads)
            })
            .collect();
        for (first, map, entries, heads) in to_sync {
            let from = geometry.entry_position(entries.start);
            map.flush(from, geometry.entry_position(entries.end) - from)?;
            if heads {
                map.flush(FILE_HEADER_LEN, geometry.heads_len())?;
            }
            if let Some(file) = self.lock().by_first.get_mut(&first) {
                file.synced = file.synced.max(entries.end);
                file.heads_synced |= heads;
            }
        }
        Ok(())
    }

    /// Deletes the files no message they name is left of (see the module
    /// docs), never the newest; returns how many.
    pub fn delete_unneeded(&self, log: &CommitLog) -> Result<u64> {
        let mut files = self.lock();
        let firsts: Vec<u64> = files.by_first.keys().copied().collect();
        let mut deleted = 0;
        for pair in firsts.windows(2) {
            let covers = pair[0]..pair[1];
            if covers.end > log.start() {
                break;
            }
            // Files are independent: one holding a relocated timer for years
            // does not keep the ones after it.
            if log.relocated().any_copy_in(covers.clone())? {
                continue;
            }
            files.by_first.remove(&covers.start);
            let path = self.path(covers.start);
            crate::fs::remove_file(&path)?;
            tracing::info!(file = %path.display(), "deleted an index file whose messages are all gone");
            deleted += 1;
        }
        if deleted > 0 {
            crate::fs::sync_dir(&self.dir)?;
        }
        Ok(deleted)
    }

    /// Bytes of the index's files.
    pub fn disk_bytes(&self) -> u64 {
        self.lock().by_first.len() as u64 * self.geometry.file_len()
    }
}

/// The topic and key a record is indexed under by an index of `index`, if any.
fn keyed(index: IndexKind, kind: RecordKind, bytes: &[u8]) -> Option<(String, String)> {
    if kind != RecordKind::Message {
        return None;
    }
    let view = MessageView::parse(bytes).ok()?;
    index.key_of(&view).map(|key| (view.topic.to_string(), key.to_string()))
}

/// How many of the newest file's entries to keep, and the last one's
/// message: those that check out, in offset order, of messages in `kept`
/// (below the replay start). An entry
/// that checks out past the first one that does not, and still lies below
/// the replay start, means the file was damaged, not cut by a crash.
fn cut_point(
    map: &MapWriter,
    path: &Path,
    geometry: Geometry,
    kept: Range<u64>,
) -> Result<(u64, Option<u64>)> {
    let per_file = geometry.per_file;
    let read = |number: u64| {
        let bytes = map.view(geometry.entry_position(number), ENTRY_LEN);
        KeyEntry::decode(bytes, number as u32)
    };
    let mut last = None;
    let mut count = 0;
    while count < per_file {
        match read(count) {
            Some(e) if kept.contains(&e.message_offset) && last.is_none_or(|l| e.message_offset > l) => {
                last = Some(e.message_offset);
                count += 1;
            }
            _ => break,
        }
    }
    for number in count + 1..per_file {
        let bytes = map.view(geometry.entry_position(number), ENTRY_LEN);
        if bytes.iter().all(|&b| b == 0) {
            continue;
        }
        if read(number)
            .is_some_and(|e| last.is_some_and(|l| e.message_offset > l) && kept.contains(&e.message_offset))
        {
            let at = geometry.entry_position(count) as u64;
            let why = format!("entry {count} does not check out, entry {number} after it does");
            return Err(Error::corruption(path, at, CorruptionKind::BadReference(why)));
        }
    }
    Ok((count, last))
}

/// Makes the bucket heads of `file` point at its newest entries, and zeroes
/// the entries past its count.
fn rebuild_heads(file: &mut IndexFile, path: &Path, geometry: Geometry) -> Result<()> {
    file.map.zero_tail(geometry.entry_position(file.count))?;
    let heads = file.map.unpublished_mut(FILE_HEADER_LEN, geometry.heads_len());
    heads.fill(0);
    for number in 0..file.count {
        let at = geometry.entry_position(number);
        let Some(entry) = KeyEntry::decode(file.map.view(at, ENTRY_LEN), number as u32) else {
            let why = format!("entry {number} changed while the index was opened");
            return Err(Error::corruption(path, at as u64, CorruptionKind::BadReference(why)));
        };
        let head = geometry.head_position(entry.key_hash);
        put_u32(file.map.unpublished_mut(head, HEAD_LEN), 0, number as u32 + 1);
    }
    file.map.shared().flush(FILE_HEADER_LEN, geometry.heads_len())
}
