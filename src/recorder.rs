//! The crash recorder (feature `crash-recorder`, for tests): records every
//! durability point of the stores under an armed directory and builds the
//! disk images a power loss at one of them could leave.
//!
//! # The model
//! The store's files live in the page cache; only a sync makes bytes
//! durable. The recorder is told of every sync the library makes (`msync` of
//! a mapped range, `fsync`/`fdatasync` of a file, `fsync` of a directory)
//! and of every rename and unlink, and keeps the *durable state*: for each
//! file (by inode) the bytes as of its last sync, and for each directory the
//! names (and their inodes) as of its last sync. Event `n` is the `n`-th of
//! these points; arming a recording with a crash point freezes, at that
//! event, the durable state and a snapshot of every file as the page cache
//! holds it then (the *live* state, read while the other threads go on).
//!
//! An image of a power loss at that point is the durable state, plus what
//! writeback may have written meanwhile: each 4 KiB page whose live bytes
//! differ from the durable ones is taken from the live snapshot with
//! probability `p`, independently, and so is a file's growth past its
//! durable size; renames and unlinks not yet made durable by a directory
//! sync happen with probability `p` each, in order; files created and not
//! yet made durable appear (with a random subset of their pages) with
//! probability `p`.
//!
//! # Limits
//! A real disk may also tear a page (write part of it), reorder a journal
//! commit across files, lose a sync it acknowledged (a lying cache), or
//! return an I/O error; none of that is simulated. Pages are 4 KiB, and a
//! page taken from the live snapshot has its content as of the snapshot, not
//! of some earlier moment between the two. Only syncs the library makes are
//! seen: a sync by another process of the same files is not.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::sync::Locked;

/// The page size of the model.
pub const PAGE: usize = 4096;

/// Every armed recording, by the directory it watches.
static ARMED: Mutex<Vec<Arc<Recording>>> = Mutex::new(Vec::new());

/// The recording of the stores under one directory.
pub struct Recording {
    root: PathBuf,
    /// Freeze at this event (`u64::MAX`: never).
    crash_at: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    events: u64,
    /// Durable content by inode.
    files: HashMap<u64, Vec<u8>>,
    /// Durable directory listings: name and inode of each entry (`None`: a directory).
    dirs: HashMap<PathBuf, BTreeMap<OsString, Entry>>,
    /// Renames and unlinks since the directory they touch was last synced.
    pending: Vec<Pending>,
    /// The commit log's durable end, as its flushes reported it.
    log_durable_end: u64,
    frozen: Option<Arc<Frozen>>,
}

/// A directory entry in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    File(u64),
    Dir,
}

/// A namespace change not yet made durable.
#[derive(Clone, Debug)]
enum Pending {
    Rename { from: PathBuf, to: PathBuf, ino: u64 },
    Unlink { path: PathBuf },
}

/// The state frozen at the crash point.
pub struct Frozen {
    root: PathBuf,
    /// The event the crash happened at.
    pub event: u64,
    /// The commit log's durable end at the crash point.
    pub log_durable_end: u64,
    files: HashMap<u64, Vec<u8>>,
    dirs: HashMap<PathBuf, BTreeMap<OsString, Entry>>,
    pending: Vec<Pending>,
    /// The page cache at the crash point: every file under the root, by path, with its inode.
    live: BTreeMap<PathBuf, (u64, Vec<u8>)>,
}

impl Recording {
    /// Starts recording the stores under `root` (created empty if missing),
    /// to freeze at event `crash_at` (`u64::MAX`: never). The directory must
    /// be empty: everything in it is then made under the recorder's eyes.
    pub fn arm(root: &Path, crash_at: u64) -> Arc<Self> {
        std::fs::create_dir_all(root).expect("create the recorded directory");
        let root = root.canonicalize().expect("canonical root");
        let mut state = State::default();
        state.dirs.insert(root.clone(), BTreeMap::new());
        let recording = Arc::new(Self { root, crash_at, state: Mutex::new(state) });
        lock(&ARMED).push(Arc::clone(&recording));
        recording
    }

    /// Durability points seen so far.
    pub fn events(&self) -> u64 {
        lock(&self.state).events
    }

    /// The frozen state, once the crash point has passed.
    pub fn frozen(&self) -> Option<Arc<Frozen>> {
        lock(&self.state).frozen.clone()
    }

    /// Stops recording.
    pub fn disarm(self: &Arc<Self>) {
        lock(&ARMED).retain(|r| !Arc::ptr_eq(r, self));
    }

    fn covers(&self, path: &Path) -> bool {
        path.starts_with(&self.root)
    }

    /// One durability point: `apply` updates the durable state, then the
    /// crash point may freeze it.
    fn event(&self, apply: impl FnOnce(&mut State)) {
        let mut state = lock(&self.state);
        if state.frozen.is_some() {
            return;
        }
        apply(&mut state);
        state.events += 1;
        if state.events == self.crash_at {
            let frozen = Frozen {
                root: self.root.clone(),
                event: state.events,
                log_durable_end: state.log_durable_end,
                files: state.files.clone(),
                dirs: state.dirs.clone(),
                pending: state.pending.clone(),
                live: snapshot(&self.root),
            };
            state.frozen = Some(Arc::new(frozen));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.locked()
}

/// The recordings that watch `path` (canonical paths compare; a path that
/// no longer exists is taken as given).
fn recordings(path: &Path) -> Vec<Arc<Recording>> {
    let armed = lock(&ARMED);
    if armed.is_empty() {
        return Vec::new();
    }
    let path = canonical(path);
    armed.iter().filter(|r| r.covers(&path)).cloned().collect()
}

/// `path` made canonical through its parent (the file itself may be gone).
fn canonical(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            parent.canonicalize().map_or_else(|_| path.to_path_buf(), |p| p.join(name))
        }
        _ => path.to_path_buf(),
    }
}

fn inode(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path).ok().map(|m| m.ino())
}

/// The bytes `[offset, offset + len)` of a mapped file were synced.
pub(crate) fn synced_range(path: &Path, offset: usize, len: usize) {
    for r in recordings(path) {
        let Some(ino) = inode(path) else { continue };
        let Ok(bytes) = std::fs::read(path) else { continue };
        r.event(|state| {
            let durable = state.files.entry(ino).or_insert_with(|| vec![0; bytes.len()]);
            durable.resize(bytes.len().max(durable.len()), 0);
            let end = (offset + len).min(bytes.len());
            if offset < end {
                durable[offset..end].copy_from_slice(&bytes[offset..end]);
            }
        });
    }
}

/// A whole file (its size and every byte) was synced.
pub(crate) fn synced_file(path: &Path) {
    for r in recordings(path) {
        let (Some(ino), Ok(bytes)) = (inode(path), std::fs::read(path)) else { continue };
        r.event(|state| {
            state.files.insert(ino, bytes);
        });
    }
}

/// A directory's entries were synced: its listing is durable, and so are
/// the renames and unlinks in it.
pub(crate) fn synced_dir(dir: &Path) {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    for r in recordings(&dir.join("x")) {
        let listing = listing(&dir);
        r.event(|state| {
            state.pending.retain(|p| match p {
                Pending::Rename { from, to, .. } => from.parent() != Some(&dir) && to.parent() != Some(&dir),
                Pending::Unlink { path } => path.parent() != Some(&dir),
            });
            state.dirs.insert(dir.clone(), listing);
        });
    }
}

/// `from` was renamed to `to` (not yet durable).
pub(crate) fn renamed(from: &Path, to: &Path) {
    for r in recordings(to) {
        let Some(ino) = inode(to) else { continue };
        let (from, to) = (canonical(from), canonical(to));
        r.event(|state| state.pending.push(Pending::Rename { from, to, ino }));
    }
}

/// `path` was unlinked (not yet durable).
pub(crate) fn unlinked(path: &Path) {
    for r in recordings(path) {
        let path = canonical(path);
        r.event(|state| state.pending.push(Pending::Unlink { path }));
    }
}

/// The commit log is durable below `end`.
pub(crate) fn log_durable(dir: &Path, end: u64) {
    for r in recordings(&dir.join("x")) {
        let mut state = lock(&r.state);
        if state.frozen.is_none() {
            state.log_durable_end = state.log_durable_end.max(end);
        }
    }
}

fn listing(dir: &Path) -> BTreeMap<OsString, Entry> {
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeMap::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let meta = std::fs::symlink_metadata(e.path()).ok()?;
            let entry = if meta.is_dir() { Entry::Dir } else { Entry::File(meta.ino()) };
            Some((e.file_name(), entry))
        })
        .collect()
}

/// Every file under `root` as the page cache holds it now.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => dirs.push(path),
                Ok(meta) => {
                    if let Ok(bytes) = std::fs::read(&path) {
                        out.insert(path, (meta.ino(), bytes));
                    }
                }
                Err(_) => {}
            }
        }
    }
    out
}

/// A small deterministic generator (splitmix64), so an image is named by its seed.
struct Coin(u64);

impl Coin {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn flip(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

impl Frozen {
    /// Writes into `to` (empty) the disk a power loss at the crash point may
    /// leave: the durable state, with each change not yet durable applied
    /// with probability `p` (see the module docs), drawn from `seed`.
    /// Returns how many pages (and namespace changes) were taken from the
    /// live state.
    pub fn write_image(&self, to: &Path, seed: u64, p: f64) -> std::io::Result<usize> {
        let mut coin = Coin(seed);
        let mut taken = 0;
        // The durable namespace, then the pending changes that happen to reach the disk.
        let mut names: BTreeMap<PathBuf, Entry> = BTreeMap::new();
        for (dir, listing) in &self.dirs {
            for (name, entry) in listing {
                names.insert(dir.join(name), *entry);
            }
        }
        for pending in &self.pending {
            if !coin.flip(p) {
                continue;
            }
            taken += 1;
            match pending {
                Pending::Rename { from, to, ino } => {
                    names.remove(from);
                    names.insert(to.clone(), Entry::File(*ino));
                }
                Pending::Unlink { path } => {
                    names.remove(path);
                }
            }
        }
        // Files the live state has that no durable name holds: created, not yet durable.
        for (path, (ino, _)) in &self.live {
            if !names.contains_key(path) && !self.renamed_away(path) && coin.flip(p) {
                names.insert(path.clone(), Entry::File(*ino));
                taken += 1;
            }
        }
        for (path, entry) in &names {
            if !self.reachable(path, &names) {
                continue;
            }
            let target = to.join(path.strip_prefix(&self.root).expect("under the root"));
            match entry {
                Entry::Dir => std::fs::create_dir_all(&target)?,
                Entry::File(ino) => {
                    let bytes = self.file_image(*ino, path, &mut coin, p, &mut taken);
                    std::fs::create_dir_all(target.parent().expect("a parent"))?;
                    std::fs::write(&target, bytes)?;
                }
            }
        }
        Ok(taken)
    }

    /// Whether `path` is the source of a pending rename (its live name is elsewhere).
    fn renamed_away(&self, path: &Path) -> bool {
        self.pending.iter().any(|p| matches!(p, Pending::Rename { from, .. } if from == path))
    }

    /// Whether every directory above `path` exists in the image.
    fn reachable(&self, path: &Path, names: &BTreeMap<PathBuf, Entry>) -> bool {
        let mut at = path.parent();
        while let Some(dir) = at {
            if dir == self.root {
                return true;
            }
            if names.get(dir) != Some(&Entry::Dir) {
                return false;
            }
            at = dir.parent();
        }
        false
    }

    /// The bytes of inode `ino` (at `path`) in the image: durable pages, and
    /// the live page where they differ with probability `p`.
    fn file_image(&self, ino: u64, path: &Path, coin: &mut Coin, p: f64, taken: &mut usize) -> Vec<u8> {
        let durable = self.files.get(&ino).cloned().unwrap_or_default();
        // Its live bytes are at `path`, or where a rename not yet durable
        // took it. Never another file's that holds the inode number now: a
        // file's inode is reused once it is gone (the pins snapshot's old
        // file, replaced by a rename, is freed and its number given to the
        // next file made), and a disk never shows the new file's pages
        // under the old name.
        let renamed_to = self.pending.iter().find_map(|p| match p {
            Pending::Rename { from, to, ino: moved } if from == path && *moved == ino => Some(to),
            _ => None,
        });
        let live = [Some(path), renamed_to.map(PathBuf::as_path)]
            .into_iter()
            .flatten()
            .find_map(|at| self.live.get(at).filter(|(live_ino, _)| *live_ino == ino))
            .map(|(_, bytes)| bytes.as_slice());
        let Some(live) = live else { return durable };
        let mut out = durable;
        if live.len() > out.len() && coin.flip(p) {
            out.resize(live.len(), 0);
            *taken += 1;
        }
        for start in (0..out.len().min(live.len())).step_by(PAGE) {
            let end = (start + PAGE).min(out.len()).min(live.len());
            if out[start..end] != live[start..end] && coin.flip(p) {
                out[start..end].copy_from_slice(&live[start..end]);
                *taken += 1;
            }
        }
        out
    }
}
