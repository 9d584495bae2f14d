//! The pins snapshot (`timer/pins`): the cancel ledger's reschedule entries
//! below some ledger index, folded into each message's latest, so a restart
//! reads the snapshot and only the ledger's entries after it.
//!
//! Without it a restart reads every reschedule entry the ledger holds, and a
//! recurring schedule adds one per occurrence: a million schedules every
//! 10 s add 100,000 a second, and reading them back grew without bound with
//! the time the store had run (2.3 s after 40 s).
//!
//! The `dw-pins` thread writes it, off the ticking thread, from the ledger's
//! files (read with `pread`, never through the ticker's maps). It folds
//! only entries whose records lie below the floor of the last two
//! checkpoints (`durable::Floor`): no recovery cuts those from the ledger,
//! so after any crash the ledger still holds exactly the entries the
//! snapshot folded, and the last of them (its fingerprint). Each round
//! merges the old file with the next entries (at most [`ROUND_ENTRIES`],
//! sorted) into a new one: temp file, fsync, rename, directory fsync.
//!
//! A restart trusts the file only if it is whole (CRC), covers no entry
//! past the ledger's end, and the ledger's entry before that index is its
//! fingerprint; anything else costs a full read of the ledger, never a pin.
//! A wheel rebuilt from the log starts a new ledger and removes the file;
//! the [`SnapshotGate`] keeps a round that began before from publishing.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::durable::Floor;
use crate::error::{Error, Result};
use crate::format::layout::{CANCEL_LEDGER_DIR, PINS_FILE};
use crate::format::pins::{Covers, Decoder, Encoder, FilePin};
use crate::format::timer_entry::{ENTRY_LEN, TimerEntry};
use crate::format::{CANCEL_LEDGER_MAGIC, FILE_HEADER_LEN, parse_numbered_file_name, recorded_per_file};
use crate::sync::Locked;
use crate::threads::StopFlag;

/// Ledger entries folded in one round at most: the round sorts them in
/// memory (24 bytes each, 6 MB).
const ROUND_ENTRIES: u64 = 1 << 18;
/// The nice value of `dw-pins` (Linux gives each thread its own).
const LOWEST_PRIORITY: i32 = 19;
/// How often the thread looks at the ledger, at most (it looks once per
/// flush interval, when checkpoints may have moved the floor).
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// A round rewrites the whole file, so it waits for a tail worth a quarter
/// of the file, or for this long.
const SMALL_TAIL_WAIT: Duration = Duration::from_secs(10);

/// Counts the wheel's rebuilds, so a snapshot of a ledger that was replaced
/// meanwhile is never published.
#[derive(Debug, Default)]
pub(crate) struct SnapshotGate(Mutex<u64>);

impl SnapshotGate {
    fn generation(&self) -> u64 {
        *self.0.locked()
    }

    /// Held while the wheel's files are replaced: no round that began
    /// before publishes, and none begins until it is dropped.
    pub fn replacing(&self) -> MutexGuard<'_, u64> {
        let mut generation = self.0.locked();
        *generation += 1;
        generation
    }

    /// Runs `publish` unless the ledger was replaced since `generation`.
    fn publish_if(&self, generation: u64, publish: impl FnOnce() -> Result<()>) -> Result<bool> {
        let current = self.0.locked();
        if *current != generation {
            return Ok(false);
        }
        publish()?;
        Ok(true)
    }
}

/// The file at `path`, opened and its header read; `None` (and why,
/// logged) if there is none or it does not start like one.
pub(crate) fn open(path: &Path) -> Option<(Covers, Decoder<BufReader<File>>)> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "the pins snapshot cannot be opened: the whole ledger is read");
            return None;
        }
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    match Decoder::open(BufReader::with_capacity(1 << 16, file), len) {
        Ok(opened) => Some(opened),
        Err(kind) => {
            tracing::warn!(file = %path.display(), %kind, "the pins snapshot is damaged: the whole ledger is read");
            None
        }
    }
}

/// The ledger's files, read by position; the ticking thread appends to them
/// meanwhile and retention deletes the oldest.
struct LedgerFiles {
    dir: PathBuf,
    per_file: u64,
    files: BTreeMap<u64, File>,
}

impl LedgerFiles {
    fn open(dir: &Path) -> Result<Option<Self>> {
        let Some(per_file) = recorded_per_file(dir, CANCEL_LEDGER_MAGIC) else { return Ok(None) };
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))? {
            let entry = entry.map_err(|e| Error::io("list", dir, e))?;
            let Some(first) = parse_numbered_file_name(&entry.file_name().to_string_lossy()) else {
                continue;
            };
            match File::open(entry.path()) {
                Ok(file) => drop(files.insert(first / per_file, file)),
                // Deleted by retention since the listing.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("open", entry.path(), e)),
            }
        }
        Ok(Some(Self { dir: dir.to_path_buf(), per_file, files }))
    }

    /// The oldest entry's index (index 0 is never used).
    fn first(&self) -> Option<u64> {
        self.files.keys().next().map(|&no| (no * self.per_file).max(1))
    }

    /// One past the last entry the files can hold.
    fn capacity_end(&self) -> u64 {
        self.files.keys().next_back().map_or(0, |&no| (no + 1) * self.per_file)
    }

    /// Entry `index`'s bytes; zeros if its file is not there.
    fn raw(&self, index: u64) -> Result<[u8; ENTRY_LEN]> {
        let mut bytes = [0u8; ENTRY_LEN];
        if let Some(file) = self.files.get(&(index / self.per_file)) {
            let at = (FILE_HEADER_LEN as u64) + (index % self.per_file) * ENTRY_LEN as u64;
            file.read_exact_at(&mut bytes, at).map_err(|e| Error::io("read", self.path(index), e))?;
        }
        Ok(bytes)
    }

    fn path(&self, index: u64) -> PathBuf {
        self.dir.join(crate::format::numbered_file_name(index - index % self.per_file))
    }

    /// Entry `index`, if it is written and checks out (one being written
    /// right now may not yet).
    fn entry(&self, index: u64) -> Result<Option<TimerEntry>> {
        Ok(TimerEntry::decode(&self.raw(index)?, index).ok().flatten())
    }

    /// The first index from `from` whose entry is not a whole one of a
    /// record below `floor` (binary search: the entries below the floor are
    /// a prefix, written and synced; record offsets grow).
    fn end_below(&self, from: u64, floor: u64) -> Result<u64> {
        let (mut lo, mut hi) = (from, self.capacity_end().max(from));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.entry(mid)? {
                Some(e) if e.prev < floor => lo = mid + 1,
                _ => hi = mid,
            }
        }
        Ok(lo)
    }

    /// The latest reschedule of each message among entries `from..to`
    /// (all below the floor), sorted by message.
    fn latest_reschedules(&self, from: u64, to: u64) -> Result<Vec<FilePin>> {
        let mut read = Vec::with_capacity((to - from) as usize);
        for index in from..to {
            let entry = TimerEntry::decode(&self.raw(index)?, index)
                .map_err(|kind| Error::corruption(self.path(index), index, kind))?;
            match entry {
                Some(e) if !e.cancel => read.push(FilePin {
                    message: e.message_offset,
                    timer: e.prev,
                    deliver_at_ms: e.deliver_at_ms,
                }),
                Some(_) => {}
                None => {
                    let why = format!("ledger entry {index} below the floor is not written");
                    return Err(Error::corruption(
                        self.path(index),
                        index,
                        crate::error::CorruptionKind::BadReference(why),
                    ));
                }
            }
        }
        // Stable, so of a message's entries the latest comes last, and is
        // kept: moved down in place over the earlier ones.
        read.sort_by_key(|pin| pin.message);
        let mut kept = 0usize;
        for at in 0..read.len() {
            let pin = read[at];
            match kept.checked_sub(1) {
                Some(last) if read[last].message == pin.message => read[last] = pin,
                _ => {
                    read[kept] = pin;
                    kept += 1;
                }
            }
        }
        read.truncate(kept);
        Ok(read)
    }
}

/// What the file on disk covers, as far as this thread knows.
#[derive(Debug, Clone, Copy)]
struct Written {
    covered: u64,
    pins: u64,
}

/// The `dw-pins` thread.
pub(crate) struct PinsSnapshotter {
    timer_dir: PathBuf,
    floor: Arc<Floor>,
    gate: Arc<SnapshotGate>,
    generation: u64,
    written: Option<Written>,
    last_round: Instant,
    look_every: Duration,
}

impl PinsSnapshotter {
    /// The thread of the store whose timer directory is `timer_dir`, which
    /// checkpoints every `flush_interval`.
    pub fn new(
        timer_dir: PathBuf,
        floor: Arc<Floor>,
        gate: Arc<SnapshotGate>,
        flush_interval: Duration,
    ) -> Self {
        let generation = gate.generation();
        let look_every = flush_interval.min(LOOK_EVERY);
        Self { timer_dir, floor, gate, generation, written: None, last_round: Instant::now(), look_every }
    }

    /// Looks at the ledger every flush interval until told to stop. A round that
    /// fails is logged and tried again: the snapshot only saves a restart time.
    pub fn run(mut self, wake: Receiver<()>, stop: StopFlag) -> Result<()> {
        // The lowest priority: a round rewrites the whole file, and the
        // ticking thread must never wait for a core while it does.
        if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), LOWEST_PRIORITY)
        {
            tracing::warn!(error = %e, "the pins snapshot's thread keeps its priority");
        }
        let mut behind = false;
        while !stop.is_set() {
            if !behind {
                let _ = wake.recv_timeout(self.look_every);
            }
            if stop.is_set() {
                break;
            }
            behind = self.round().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "writing the pins snapshot failed; trying again");
                self.written = None;
                false
            });
        }
        Ok(())
    }

    fn path(&self) -> PathBuf {
        self.timer_dir.join(PINS_FILE)
    }

    /// Folds the next entries below the floor into a new snapshot, if
    /// enough wait. Returns whether more than a round's worth still wait
    /// (a ledger written before snapshots were: the next round goes at once).
    pub(crate) fn round(&mut self) -> Result<bool> {
        let generation = self.gate.generation();
        if generation != self.generation {
            (self.generation, self.written) = (generation, None);
        }
        let Some(mark) = self.floor.get() else { return Ok(false) };
        let Some(ledger) = LedgerFiles::open(&self.timer_dir.join(CANCEL_LEDGER_DIR))? else {
            return Ok(false);
        };
        let Some(first) = ledger.first() else { return Ok(false) };
        let written = match self.written {
            Some(written) => written,
            None => self.adopt(&ledger, first)?,
        };
        let from = written.covered.max(first);
        let available = ledger.end_below(from, mark.log_offset)? - from;
        let worth = ROUND_ENTRIES.min((written.pins / 4).max(1));
        if available == 0 || (available < worth && self.last_round.elapsed() < SMALL_TAIL_WAIT) {
            return Ok(false);
        }
        self.last_round = Instant::now();
        let to = from + available.min(ROUND_ENTRIES);
        let batch = ledger.latest_reschedules(from, to)?;
        let covers = Covers { covered: to, fingerprint: ledger.raw(to - 1)? };
        // Pins whose entries retention deleted: a full read would not find them either.
        let kept_from = ledger.entry(first)?.map_or(0, |e| e.prev);
        let Some(pins) = self.write(written, &covers, batch, kept_from)? else {
            self.written = None;
            return Ok(false);
        };
        let path = self.path();
        let tmp = path.with_extension("tmp");
        let published = self.gate.publish_if(generation, || {
            crate::fs::rename(&tmp, &path)?;
            crate::fs::sync_parent_dir(&path)
        })?;
        if !published {
            crate::fs::remove_file(&tmp)?;
            return Ok(false);
        }
        self.written = Some(Written { covered: to, pins });
        tracing::debug!(covered = to, pins, "pins snapshot written");
        Ok(from + available > to)
    }

    /// What the file on disk covers, if it belongs to this ledger (its
    /// fingerprint is there); otherwise a new one starts at the ledger's first entry.
    fn adopt(&self, ledger: &LedgerFiles, first: u64) -> Result<Written> {
        if let Some((covers, decoder)) = open(&self.path()) {
            let last = covers.covered.checked_sub(1).filter(|&last| last >= first);
            if let Some(last) = last
                && ledger.raw(last)? == covers.fingerprint
            {
                return Ok(Written { covered: covers.covered, pins: decoder.pins() });
            }
        }
        Ok(Written { covered: first, pins: 0 })
    }

    /// Writes the temp file: the old file's pins (from its covered index on,
    /// if `written` has one) merged with `batch`, keeping the pins of
    /// records from `kept_from`. `None` if the old file turned out damaged
    /// (it is removed, and the next round starts over).
    fn write(
        &self,
        written: Written,
        covers: &Covers,
        batch: Vec<FilePin>,
        kept_from: u64,
    ) -> Result<Option<u64>> {
        let path = self.path();
        let tmp = path.with_extension("tmp");
        let file = crate::fs::file_options(&tmp)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| Error::io("create", &tmp, e))?;
        let io = |e: std::io::Error| Error::io("write", &tmp, e);
        let mut out = Encoder::new(BufWriter::with_capacity(1 << 16, file), covers).map_err(io)?;
        let mut old = match written.pins {
            0 => None,
            _ => match open(&path) {
                Some((old_covers, decoder)) if old_covers.covered == written.covered => Some(decoder),
                _ => return self.start_over(out, &tmp),
            },
        };
        let next_of =
            |old: &mut Option<Decoder<_>>| old.as_mut().map_or(Ok(None), |d: &mut Decoder<_>| d.next_pin());
        let mut from_old = next_of(&mut old);
        let mut batch = batch.into_iter().peekable();
        loop {
            let Ok(o) = from_old else { return self.start_over(out, &tmp) };
            // The batch's pin of a message replaces the old file's.
            let pin = if let Some(b) = batch.next_if(|b| o.is_none_or(|o| b.message <= o.message)) {
                if o.is_some_and(|o| o.message == b.message) {
                    from_old = next_of(&mut old);
                }
                b
            } else if let Some(o) = o {
                from_old = next_of(&mut old);
                o
            } else {
                break;
            };
            if pin.timer >= kept_from {
                out.push(pin).map_err(io)?;
            }
        }
        let (writer, pins) = out.finish().map_err(io)?;
        let file = writer.into_inner().map_err(|e| io(e.into_error()))?;
        crate::fs::sync_all(&file, &tmp)?;
        Ok(Some(pins))
    }

    /// The old file is damaged or gone: it and the temp file are removed,
    /// and the next round starts from the ledger's first entry.
    fn start_over<W: std::io::Write>(&self, out: Encoder<W>, tmp: &Path) -> Result<Option<u64>> {
        let path = self.path();
        tracing::warn!(file = %path.display(), "the pins snapshot is damaged or gone; a new one is started");
        drop(out);
        crate::fs::remove_file(tmp)?;
        if path.exists() {
            crate::fs::remove_file(&path)?;
        }
        Ok(None)
    }
}
