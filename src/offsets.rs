//! Committed consumer positions: kept in memory, recorded in the commit log,
//! and checkpointed in `consumer_offsets.json`.
//!
//! [`Store::sync_offsets`](crate::Store::sync_offsets) appends the positions
//! committed since the last call as *positions messages* (topic
//! [`POSITIONS_TOPIC`], never indexed into a queue) and waits for the log's
//! group commit, the same sync that makes puts and cancels durable. The
//! flusher writes the checkpoint file (temp file, fsync, rename, directory
//! fsync): every position, and the log offset below which it reflects every
//! positions message. Opening replays the positions messages from there, so
//! the file is an index of the log like every other file: lost, it is
//! rebuilt from the segments that are left.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::commitlog::CommitLog;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::consumer_offsets::{self, CommittedOffset, FILE_VERSION, OffsetsFile, OffsetsProblem};
use crate::format::record::{MessageView, RecordKind, check_crc};
use crate::fs::write_atomically;
use crate::sync::Locked;

pub use crate::format::queue_entry::POSITIONS_TOPIC;
/// Positions per message: with names of at most 127 bytes a message stays
/// far below the smallest segment.
const POSITIONS_PER_MESSAGE: usize = 32;

/// A group's position in one queue: `(group, topic, queue)`.
type Key = (String, String, u32);

/// Committed positions. Two writers share the checkpoint file (the flusher,
/// and opening): every change counts a generation, and a snapshot older than
/// the one on disk is never written, so the file only moves forward.
pub(crate) struct OffsetStore {
    path: PathBuf,
    offsets: Mutex<Offsets>,
    /// Changed since the last checkpoint snapshot.
    dirty: AtomicBool,
    /// The generation this process last wrote (none yet: what is on disk
    /// is older than anything it writes); held while writing, so writes do
    /// not overlap.
    written: Mutex<Option<u64>>,
}

#[derive(Default)]
struct Offsets {
    by_queue: BTreeMap<Key, u64>,
    /// Committed since the last positions message.
    unrecorded: BTreeSet<Key>,
    /// Where the last positions message ends: what a sync waits for.
    recorded_end: u64,
    /// Counts the changes.
    generation: u64,
}

/// The positions at one generation, serialised for the checkpoint file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct OffsetSnapshot {
    generation: u64,
    bytes: Vec<u8>,
}

/// Opens the checkpoint at `path` and replays the positions messages of
/// `log` it does not cover. A missing file is rebuilt from the whole log; a
/// version 1 file (written before positions messages existed) is taken as it
/// is. Then a checkpoint is written at once, before anything is appended,
/// so the next open replays only what comes after this one: for a version 1
/// file, after a replay that applied anything, and after reading a whole
/// log for a missing file (a fresh store, with an empty log, gets none).
///
/// Errors: [`Error::Corruption`] naming the file (unreadable JSON) or the
/// segment and offset (a positions message whose body is not positions);
/// [`Error::UnsupportedVersion`] for a file of a newer version.
pub(crate) fn open(path: &Path, log: &CommitLog) -> Result<OffsetStore> {
    let (mut store, mut covers) = OffsetStore::load(path)?;
    if let Covers::Log(from) = covers
        && !starts_a_record(log, from)
    {
        covers = garbled(path, &format!("covers_log_to {from} is not where a commit-log record starts"));
        store = OffsetStore::new(path, BTreeMap::new());
    }
    let replayed = match covers {
        Covers::Missing | Covers::Garbled => replay(log, &store, 0)?,
        Covers::Version1 => Replayed::default(),
        Covers::Log(from) => replay(log, &store, from)?,
    };
    // A new checkpoint spares the next open this replay (a fresh store's
    // empty log needs none), and replaces an older version.
    let rescan = replayed.applied > 0 || (covers == Covers::Missing && replayed.records > 0);
    if rescan || covers == Covers::Version1 || covers == Covers::Garbled {
        // What was replayed lies below the end: on disk before the file counts it.
        log.flush()?;
        store.write(&store.snapshot_now(log.write_end()))?;
    }
    Ok(store)
}

/// What the checkpoint file says about the positions messages in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Covers {
    /// No file: none is reflected.
    Missing,
    /// A file that is not a consumer-offsets file (garbled): rebuilt from
    /// every positions message in the log, like a missing one, and written
    /// again at once.
    Garbled,
    /// A version 1 file: none was written.
    Version1,
    /// Those from this offset on are not reflected.
    Log(u64),
}

/// What a replay went through.
#[derive(Debug, Default)]
struct Replayed {
    /// Records read.
    records: u64,
    /// Positions messages applied.
    applied: u64,
}

/// Applies the positions messages from `from` to the log's end, in log
/// order (the last one for a queue wins).
fn replay(log: &CommitLog, store: &OffsetStore, from: u64) -> Result<Replayed> {
    let mut replayed = Replayed::default();
    let mut at = from.max(log.start());
    while at < log.write_end() {
        let visited = log.visit_trusted(at, |offset, kind, bytes| {
            if kind != RecordKind::Message {
                return Ok(false);
            }
            // Bounds-checked on unchecked bytes; a damaged record is the dispatcher's to report.
            let Ok(view) = MessageView::parse(bytes) else { return Ok(false) };
            if view.topic != POSITIONS_TOPIC {
                return Ok(false);
            }
            check_crc(bytes, offset)
                .map_err(|kind| log.corruption_at(offset, kind))
                .and_then(|()| {
                    store.apply(&bytes[view.body.clone()]).map_err(|why| {
                        log.corruption_at(
                            offset,
                            CorruptionKind::BadFrame(format!("positions message: {why}")),
                        )
                    })
                })
                .map(|()| true)
        });
        let (found, next) = visited?;
        replayed.applied += u64::from(found?);
        replayed.records += 1;
        at = next;
    }
    Ok(replayed)
}

/// Whether a record starts at `from` (or `from` lies outside the log's
/// records): else the file's `covers_log_to` is wrong, not the log, and a
/// walk from there would take the record it cuts for damage.
fn starts_a_record(log: &CommitLog, from: u64) -> bool {
    from < log.start() || from >= log.write_end() || log.starts_record(from)
}

/// The file's bytes, never through a symbolic link (a link planted in the
/// store directory is refused, as for every other file of the store).
fn read_no_follow(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    crate::fs::file_options(path).read(true).open(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A consumer-offsets file that is not one: an index, rebuilt from the
/// positions messages in the log (positions committed only to the file since
/// the last `sync_offsets` go back to that one: their messages come again).
fn garbled(path: &Path, why: &str) -> Covers {
    tracing::warn!(file = %path.display(), why, "consumer_offsets.json is damaged; rebuilding it from the positions messages in the log");
    Covers::Garbled
}

impl OffsetStore {
    fn load(path: &Path) -> Result<(Self, Covers)> {
        let mut by_queue = BTreeMap::new();
        let covers = match read_no_follow(path) {
            Ok(bytes) => {
                let file = match consumer_offsets::decode(&bytes) {
                    Ok(file) => file,
                    Err(OffsetsProblem::Garbled(why)) => {
                        return Ok((Self::new(path, BTreeMap::new()), garbled(path, &why)));
                    }
                    Err(OffsetsProblem::UnsupportedVersion(found)) => {
                        let (file, supported) = (path.to_path_buf(), FILE_VERSION);
                        return Err(Error::UnsupportedVersion { file, found, supported });
                    }
                };
                let covers = file.covers_log_to.map_or(Covers::Version1, Covers::Log);
                for o in file.offsets {
                    by_queue.insert((o.group, o.topic, o.queue_id), o.offset);
                }
                covers
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Covers::Missing,
            Err(e) => return Err(Error::io("read", path, e)),
        };
        Ok((Self::new(path, by_queue), covers))
    }

    fn new(path: &Path, by_queue: BTreeMap<Key, u64>) -> Self {
        Self {
            path: path.to_path_buf(),
            offsets: Mutex::new(Offsets { by_queue, ..Offsets::default() }),
            dirty: AtomicBool::new(false),
            written: Mutex::new(None),
        }
    }

    pub fn get(&self, group: &str, topic: &str, queue_id: u32) -> Option<u64> {
        let key = (group.to_string(), topic.to_string(), queue_id);
        self.lock().by_queue.get(&key).copied()
    }

    pub fn set(&self, group: &str, topic: &str, queue_id: u32, offset: u64) {
        let key = (group.to_string(), topic.to_string(), queue_id);
        let mut offsets = self.lock();
        offsets.by_queue.insert(key.clone(), offset);
        offsets.unrecorded.insert(key);
        offsets.generation += 1;
        self.dirty.store(true, Ordering::Release);
    }

    fn lock(&self) -> MutexGuard<'_, Offsets> {
        self.offsets.locked()
    }

    /// Appends the positions committed since the last call with `append`
    /// (which takes a message body and returns where its record ends);
    /// returns where the last positions message ends, so that once the log
    /// is durable there, every position committed before the call is.
    ///
    /// The lock is held across the appends: positions messages lie in the
    /// log in the order their positions were taken, so on replay the last
    /// one for a queue is its newest.
    pub fn record(&self, mut append: impl FnMut(&[u8]) -> Result<u64>) -> Result<u64> {
        let mut offsets = self.lock();
        if offsets.unrecorded.is_empty() {
            return Ok(offsets.recorded_end);
        }
        let keys = std::mem::take(&mut offsets.unrecorded);
        let positions: Vec<CommittedOffset> = keys
            .iter()
            .filter_map(|key| {
                let (group, topic, queue_id) = key.clone();
                offsets.by_queue.get(key).map(|&offset| CommittedOffset { group, topic, queue_id, offset })
            })
            .collect();
        for chunk in positions.chunks(POSITIONS_PER_MESSAGE) {
            let body = serde_json::to_vec(chunk).expect("positions always serialise");
            match append(&body) {
                Ok(end) => offsets.recorded_end = end,
                Err(e) => {
                    // Recording one again later is harmless: the newest wins.
                    offsets.unrecorded.extend(keys);
                    return Err(e);
                }
            }
        }
        Ok(offsets.recorded_end)
    }

    /// Applies one positions message's body.
    fn apply(&self, body: &[u8]) -> std::result::Result<(), String> {
        let positions: Vec<CommittedOffset> = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        let mut offsets = self.lock();
        for p in positions {
            offsets.by_queue.insert((p.group, p.topic, p.queue_id), p.offset);
        }
        offsets.generation += 1;
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// The positions as committed now, if anything changed since the last
    /// snapshot, stamped with the log's end read under the same lock as the
    /// positions (`log_end`): every positions message below it is reflected.
    /// The flusher takes it *before* syncing the log, so the file it writes
    /// never counts entries whose records are not on disk.
    pub fn snapshot(&self, log_end: impl FnOnce() -> u64) -> Option<OffsetSnapshot> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return None;
        }
        let offsets = self.lock();
        Some(Self::serialise(&offsets, log_end()))
    }

    fn snapshot_now(&self, log_end: u64) -> OffsetSnapshot {
        self.dirty.store(false, Ordering::Release);
        Self::serialise(&self.lock(), log_end)
    }

    fn serialise(offsets: &Offsets, covers: u64) -> OffsetSnapshot {
        let positions = offsets
            .by_queue
            .iter()
            .map(|((group, topic, queue_id), &offset)| CommittedOffset {
                group: group.clone(),
                topic: topic.clone(),
                queue_id: *queue_id,
                offset,
            })
            .collect();
        let file = OffsetsFile { version: FILE_VERSION, covers_log_to: Some(covers), offsets: positions };
        let bytes = serde_json::to_vec_pretty(&file).expect("offsets always serialise");
        OffsetSnapshot { generation: offsets.generation, bytes }
    }

    /// Writes a snapshot unless a newer one is on disk already; on failure
    /// the positions count as changed again.
    pub fn write(&self, snapshot: &OffsetSnapshot) -> Result<()> {
        let mut written = self.written.locked();
        if written.is_some_and(|w| snapshot.generation <= w) {
            return Ok(());
        }
        let result = write_atomically(&self.path, &snapshot.bytes);
        match result {
            Ok(()) => *written = Some(snapshot.generation),
            Err(_) => self.dirty.store(true, Ordering::Release),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(path: &Path) -> OffsetStore {
        OffsetStore::load(path).unwrap().0
    }

    #[test]
    fn offsets_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("consumer_offsets.json");
        let store = load(&path);
        store.set("g", "T", 1, 42);
        store.write(&store.snapshot(|| 77).unwrap()).unwrap();
        assert_eq!(store.snapshot(|| 77), None, "nothing changed since");
        let (again, covers) = OffsetStore::load(&path).unwrap();
        assert_eq!(again.get("g", "T", 1), Some(42));
        assert_eq!(again.get("g", "T", 0), None);
        assert_eq!(covers, Covers::Log(77));
    }

    #[test]
    fn an_older_snapshot_never_overwrites_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("consumer_offsets.json");
        let store = load(&path);
        store.set("g", "T", 0, 1);
        let older = store.snapshot(|| 10).unwrap();
        store.set("g", "T", 0, 2);
        let newer = store.snapshot(|| 20).unwrap();
        store.write(&newer).unwrap();
        store.write(&older).unwrap();
        assert_eq!(load(&path).get("g", "T", 0), Some(2));
    }

    #[test]
    fn positions_are_recorded_once_and_in_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let store = load(&dir.path().join("consumer_offsets.json"));
        for queue in 0..(POSITIONS_PER_MESSAGE as u32 + 1) {
            store.set("g", "T", queue, u64::from(queue) + 100);
        }
        let mut bodies = Vec::new();
        let end = store.record(|body| {
            bodies.push(body.to_vec());
            Ok(bodies.len() as u64 * 1000)
        });
        assert_eq!(end.unwrap(), 2000, "two messages, the second ends last");
        assert_eq!(bodies.len(), 2);
        // Nothing committed since: no message, the same end to wait for.
        assert_eq!(store.record(|_| panic!("nothing to record")).unwrap(), 2000);
        let replica = load(&dir.path().join("other.json"));
        bodies.iter().for_each(|b| replica.apply(b).unwrap());
        assert_eq!(replica.get("g", "T", 32), Some(132));
        assert_eq!(replica.get("g", "T", 0), Some(100));
    }

    #[test]
    fn a_failed_append_leaves_the_positions_to_record_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = load(&dir.path().join("consumer_offsets.json"));
        store.set("g", "T", 0, 5);
        let full = || Error::Closed;
        assert!(store.record(|_| Err(full())).is_err());
        let mut recorded = 0;
        store
            .record(|_| {
                recorded += 1;
                Ok(9)
            })
            .unwrap();
        assert_eq!(recorded, 1);
    }

    #[test]
    fn a_version_1_file_opens_and_covers_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("consumer_offsets.json");
        let v1 = r#"{"version":1,"offsets":[{"group":"g","topic":"T","queue_id":0,"offset":7}]}"#;
        std::fs::write(&path, v1).unwrap();
        let (store, covers) = OffsetStore::load(&path).unwrap();
        assert_eq!((store.get("g", "T", 0), covers), (Some(7), Covers::Version1));
    }

    #[test]
    fn a_newer_version_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("consumer_offsets.json");
        std::fs::write(&path, r#"{"version":3,"covers_log_to":0,"offsets":[]}"#).unwrap();
        let err = OffsetStore::load(&path).err().unwrap();
        assert!(matches!(err, Error::UnsupportedVersion { found: 3, supported: 2, .. }), "{err}");
    }

    /// A garbled file is an index to rebuild from the log, not an outage
    /// (the open used to be refused).
    #[test]
    fn a_garbled_offsets_file_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("consumer_offsets.json");
        for garbage in [&b"{not json"[..], br#"{"version":2,"offsets":[]}"#, b"", &[0xFF; 40]] {
            std::fs::write(&path, garbage).unwrap();
            let (store, covers) = OffsetStore::load(&path).unwrap();
            assert_eq!((store.get("g", "T", 0), covers), (None, Covers::Garbled));
        }
    }

    /// A link planted where the file goes is refused, as for every other
    /// file of the store (it used to be read through).
    #[test]
    fn the_file_is_never_read_through_a_symbolic_link() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(&elsewhere, r#"{"version":2,"covers_log_to":32,"offsets":[]}"#).unwrap();
        let path = dir.path().join("consumer_offsets.json");
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let err = OffsetStore::load(&path).err().unwrap();
        assert!(err.to_string().contains("consumer_offsets.json"), "{err}");
    }
}
