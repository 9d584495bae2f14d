//! The cancel ledger: one small entry per cancel the store answered
//! `Cancelled` and per reschedule, in commit-log order of their records. It
//! is how a repeated cancel still answers `Cancelled` once the timer's second
//! has passed, also after a restart: the wheel forgets a second once it is
//! handed out, and the commit log holds the answer but only a scan of it
//! could find it again. And it is where a handle finds its timer once it was
//! rescheduled: the handle names the message, the timer is named by the
//! latest reschedule record of that message.
//!
//! The ledger is an index of the commit log's cancel and reschedule records.
//! Its files have the timer log's layout (see `log.rs`) under the magic
//! `DWCNCL`; `prev` holds the record's offset. A cancel entry holds the
//! cancelled timer (its record's offset and deliver time) with the cancel bit
//! set; a reschedule entry the message's offset and the new deliver time,
//! without it. Record offsets grow from entry to entry, so the entries of
//! records made after a message was put are found by a binary search, then
//! read in order.
//!
//! A lookup would read every cancel made since the message was put, and a
//! cancel of a timer that fired (common: the order was paid just too late)
//! asks exactly that. So each file gets a Bloom filter of the messages its
//! entries name, built the first time a lookup reaches it (about 80 KiB
//! per 65,536 cancels, in memory only): a lookup reads the entries of the
//! files that may hold its message, about 1 in 100 of the others.
//!
//! Recovery: entries whose cancel record lies at or after the recovery's scan
//! start are cut (they may not have been synced), and the scan appends every
//! cancel record it reads, in log order. Entries below it were synced with the
//! checkpoint the scan start comes from.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bloomfilter::Bloom;

use crate::durable::{Pin, Pins, PinsRead};
use crate::error::Result;
use crate::format::CANCEL_LEDGER_MAGIC;
use crate::format::layout::{CANCEL_LEDGER_DIR, PINS_FILE};
use crate::format::timer_entry::TimerEntry;
use crate::mmap::Mapped;
use crate::timer::Timer;
use crate::timer::log::TimerLog;

/// Entries per ledger file (64 Ki entries, 1.75 MiB): retention deletes whole files.
pub const LEDGER_ENTRIES_PER_FILE: u64 = 1 << 16;

/// One cancel the store answered `Cancelled`, or one reschedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LedgerEntry {
    /// A cancel: the timer cancelled. A reschedule: the message and the new deliver time.
    pub timer: Timer,
    /// The commit-log offset of the cancel or reschedule record.
    pub record_offset: u64,
    pub kind: LedgerKind,
}

/// What a ledger entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LedgerKind {
    Cancel,
    Reschedule,
}

impl LedgerEntry {
    /// The entry of a cancel record at `record_offset`.
    pub fn cancel(timer: Timer, record_offset: u64) -> Self {
        Self { timer, record_offset, kind: LedgerKind::Cancel }
    }

    /// The entry of a reschedule record at `record_offset` of the message at
    /// `message_offset`, to `deliver_at_ms`.
    pub fn reschedule(message_offset: u64, deliver_at_ms: u64, record_offset: u64) -> Self {
        Self { timer: Timer { deliver_at_ms, message_offset }, record_offset, kind: LedgerKind::Reschedule }
    }

    /// The timer the record of a reschedule entry makes.
    pub fn rescheduled_timer(&self) -> Timer {
        debug_assert_eq!(self.kind, LedgerKind::Reschedule);
        Timer { deliver_at_ms: self.timer.deliver_at_ms, message_offset: self.record_offset }
    }
}

/// False positives a file's filter allows.
const FILTER_FALSE_POSITIVES: f64 = 0.01;
/// The filters' hash key: fixed, so no random source is needed (the keys are
/// this store's own log offsets, not chosen by an adversary).
const FILTER_SEED: [u8; 32] = *b"delaywheel cancel ledger filter!";

pub(crate) struct CancelLedger {
    log: TimerLog,
    /// Per file (by its first entry index): a filter of the message offsets
    /// of its entries below `covered`, built when a lookup first needs it.
    filters: RefCell<BTreeMap<u64, FileFilter>>,
    /// The latest reschedule entry of every rescheduled message the ledger
    /// names (see `durable/pins.rs`), read whole by [`load_pins`](Self::load_pins),
    /// then kept up to date: every cancel asks for it, and a lookup in the
    /// files cost as much as the cancel itself (measured).
    pins: Arc<Pins>,
    /// `timer/pins`, the reschedule entries folded up to an index (see `pins_snapshot.rs`).
    snapshot: std::path::PathBuf,
    /// Entries read, for tests of what a lookup costs.
    #[cfg(test)]
    entries_read: std::cell::Cell<u64>,
}

struct FileFilter {
    messages: Bloom<u64>,
    /// The entries below this index are in the filter.
    covered: u64,
}

impl CancelLedger {
    /// Opens the ledger in `timer_dir`, keeping only the entries of cancel
    /// records below `scan_from` (the caller appends the rest again).
    pub fn open(timer_dir: &Path, scan_from: u64) -> Result<Self> {
        let dir = timer_dir.join(CANCEL_LEDGER_DIR);
        let log = TimerLog::open_with_magic(&dir, CANCEL_LEDGER_MAGIC, LEDGER_ENTRIES_PER_FILE, None)?;
        let mut ledger = Self {
            log,
            filters: RefCell::new(BTreeMap::new()),
            pins: Arc::default(),
            snapshot: timer_dir.join(PINS_FILE),
            #[cfg(test)]
            entries_read: std::cell::Cell::new(0),
        };
        let keep = ledger.first_entry_at_or_after(scan_from)?;
        ledger.log.cut_to(keep)?;
        Ok(ledger)
    }

    /// Records a cancel or a reschedule. Records must come in commit-log order.
    pub fn record(&mut self, entry: LedgerEntry) -> Result<()> {
        debug_assert!(entry.record_offset > entry.timer.message_offset, "a record follows what it names");
        let entry = TimerEntry {
            message_offset: entry.timer.message_offset,
            deliver_at_ms: entry.timer.deliver_at_ms,
            prev: entry.record_offset,
            cancel: entry.kind == LedgerKind::Cancel,
        };
        self.log.append(&entry)?;
        if !entry.cancel {
            let pin = Pin { timer: entry.prev, deliver_at_ms: entry.deliver_at_ms };
            self.pins.set(entry.message_offset, pin);
        }
        Ok(())
    }

    /// Whether a cancel of the timer of the record at `timer_offset` (a
    /// message, or a reschedule record) was recorded.
    pub fn contains(&self, timer_offset: u64) -> Result<bool> {
        Ok(self.last_of(timer_offset, LedgerKind::Cancel)?.is_some())
    }

    /// The offset of the cancel record of the timer of the record at
    /// `timer_offset`, if a cancel of it was recorded.
    pub fn cancel_record_of(&self, timer_offset: u64) -> Result<Option<u64>> {
        Ok(self.last_of(timer_offset, LedgerKind::Cancel)?.map(|entry| entry.record_offset))
    }

    /// The latest reschedule of the message at `message_offset`, if any: its
    /// record names the message's timer now (see `latest`).
    pub fn latest_reschedule(&self, message_offset: u64) -> Result<Option<LedgerEntry>> {
        if !self.pins.ready() {
            self.load_pins()?;
        }
        Ok(self
            .pins
            .get(message_offset)
            .map(|pin| LedgerEntry::reschedule(message_offset, pin.deliver_at_ms, pin.timer)))
    }

    /// Reads the pins: from the snapshot and the entries after it, or, if
    /// the snapshot does not belong to this ledger, from every reschedule
    /// entry (each message's latest).
    pub fn load_pins(&self) -> Result<()> {
        let started = std::time::Instant::now();
        let mut pins = PinsRead::default();
        let from = match self.read_snapshot(&mut pins)? {
            Some(covered) => covered,
            None => {
                pins = PinsRead::default();
                self.log.first()
            }
        };
        for index in from..self.log.end() {
            if let Some(e) = self.entry(index)?.filter(|e| e.kind == LedgerKind::Reschedule) {
                let pin = Pin { timer: e.record_offset, deliver_at_ms: e.timer.deliver_at_ms };
                pins.set(e.timer.message_offset, pin);
            }
        }
        self.pins.replace_all(pins);
        let entries = self.log.end() - from;
        tracing::info!(
            entries,
            from_snapshot = from > self.log.first(),
            ms = started.elapsed().as_millis() as u64,
            "pins read"
        );
        Ok(())
    }

    /// Reads the snapshot's pins into `pins` and returns the index it
    /// covers to, if it is whole and this ledger's: the entry before that
    /// index is still here and reads as its fingerprint. Its pins of
    /// entries retention has deleted since are left out, as a full read
    /// would not find them.
    fn read_snapshot(&self, pins: &mut PinsRead) -> Result<Option<u64>> {
        let Some((covers, mut decoder)) = crate::timer::pins_snapshot::open(&self.snapshot) else {
            return Ok(None);
        };
        let (first, end) = (self.log.first(), self.log.end());
        let last = covers.covered.checked_sub(1).filter(|&last| last >= first && last < end);
        let Some(last) = last else { return Ok(None) };
        if self.log.read(last)?.map(|e| e.encode(last)) != Some(covers.fingerprint) {
            tracing::info!(file = %self.snapshot.display(), "the pins snapshot is of another ledger: the whole ledger is read");
            return Ok(None);
        }
        let kept_from = self.entry(first)?.map_or(0, |e| e.record_offset);
        loop {
            match decoder.next_pin() {
                Ok(Some(pin)) if pin.timer >= kept_from => {
                    pins.set(pin.message, Pin { timer: pin.timer, deliver_at_ms: pin.deliver_at_ms })
                }
                Ok(Some(_)) => {}
                Ok(None) => return Ok(Some(covers.covered)),
                Err(kind) => {
                    tracing::warn!(file = %self.snapshot.display(), %kind, "the pins snapshot is damaged: the whole ledger is read");
                    return Ok(None);
                }
            }
        }
    }

    /// The pins this ledger keeps, to share with retention.
    pub fn pins(&self) -> Arc<Pins> {
        Arc::clone(&self.pins)
    }

    /// Keeps `pins` (those retention reads) up to date from now on, in place
    /// of this ledger's own: after a rebuild, the new ledger's.
    pub fn share_pins(&mut self, pins: Arc<Pins>) -> Result<()> {
        self.pins = pins;
        self.load_pins()
    }

    /// The last entry of `kind` naming `offset`. Its record lies after
    /// `offset`, so only the entries from the first record after it are
    /// read, and of those only the ones in files whose filter may hold it.
    fn last_of(&self, offset: u64, kind: LedgerKind) -> Result<Option<LedgerEntry>> {
        let (mut index, end) = (self.first_entry_at_or_after(offset + 1)?, self.log.end());
        let mut last = None;
        while index < end {
            let file_start = index - index % LEDGER_ENTRIES_PER_FILE;
            let file_end = (file_start + LEDGER_ENTRIES_PER_FILE).min(end);
            if self.file_may_hold(file_start, file_end, offset)? {
                for i in index..file_end {
                    match self.entry(i)? {
                        Some(e) if e.timer.message_offset == offset && e.kind == kind => last = Some(e),
                        _ => {}
                    }
                }
            }
            index = file_end;
        }
        Ok(last)
    }

    /// Whether the file starting at entry `file_start` may name the message,
    /// by its filter, brought up to `file_end` first.
    fn file_may_hold(&self, file_start: u64, file_end: u64, message_offset: u64) -> Result<bool> {
        let mut filters = self.filters.borrow_mut();
        let filter = match filters.entry(file_start) {
            std::collections::btree_map::Entry::Occupied(f) => f.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => v.insert(FileFilter::new()),
        };
        let from = filter.covered.max(file_start).max(self.log.first());
        for index in from..file_end {
            if let Some(e) = self.entry(index)? {
                filter.messages.set(&e.timer.message_offset);
            }
            filter.covered = index + 1;
        }
        Ok(filter.messages.check(&message_offset))
    }

    /// The first entry whose record lies at or after `offset` (binary
    /// search: record offsets grow from entry to entry).
    fn first_entry_at_or_after(&self, offset: u64) -> Result<u64> {
        let (mut lo, mut hi) = (self.log.first(), self.log.end());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.entry(mid)? {
                Some(e) if e.record_offset < offset => lo = mid + 1,
                _ => hi = mid,
            }
        }
        Ok(lo)
    }

    fn entry(&self, index: u64) -> Result<Option<LedgerEntry>> {
        #[cfg(test)]
        self.entries_read.set(self.entries_read.get() + 1);
        Ok(self.log.read(index)?.map(|e| LedgerEntry {
            timer: Timer { deliver_at_ms: e.deliver_at_ms, message_offset: e.message_offset },
            record_offset: e.prev,
            kind: if e.cancel { LedgerKind::Cancel } else { LedgerKind::Reschedule },
        }))
    }

    /// Entries recorded and still on disk.
    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.log.end() - self.log.first()
    }

    /// Deletes the files (never the newest) whose every entry is of use to no
    /// handle any more: each names a message below `log_start` (its segment is
    /// gone) whose timer was due before `relocated_from_ms` (no relocated
    /// copy of it can exist). Returns how many.
    pub fn reclaim(&mut self, log_start: u64, relocated_from_ms: u64) -> Result<u64> {
        let mut first_needed = self.log.first();
        while first_needed < self.log.end() {
            match self.entry(first_needed)? {
                Some(e) if e.record_offset < log_start && e.timer.deliver_at_ms < relocated_from_ms => {
                    first_needed += 1;
                }
                _ => break,
            }
        }
        let deleted = self.log.delete_files_below(first_needed)?;
        if deleted > 0
            && let Some(first) = self.entry(self.log.first())?
        {
            // The pins of the deleted entries go with them: their records lie
            // below the first entry's. (Reading the pins again would hold the
            // ticking thread for as long as a restart reads them.)
            self.pins.forget_timers_below(first.record_offset);
        }
        let first = self.log.first();
        self.filters.borrow_mut().retain(|&file_start, _| file_start + LEDGER_ENTRIES_PER_FILE > first);
        Ok(deleted)
    }

    /// The ledger's files, for a checkpoint to sync.
    pub fn files(&self) -> Vec<(Arc<Mapped>, usize)> {
        self.log.written_files()
    }

    pub fn disk_bytes(&self) -> u64 {
        self.log.disk_bytes()
    }
}

impl FileFilter {
    fn new() -> Self {
        let messages = Bloom::new_for_fp_rate_with_seed(
            LEDGER_ENTRIES_PER_FILE as usize,
            FILTER_FALSE_POSITIVES,
            &FILTER_SEED,
        )
        .expect("a valid entry count and rate");
        Self { messages, covered: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn timer(message_offset: u64) -> Timer {
        Timer { deliver_at_ms: 1_700_000_000_000 + message_offset, message_offset }
    }

    #[test]
    fn golden_bytes_match_wheel_format_md() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = CancelLedger::open(dir.path(), 0).unwrap();
        let cancelled = Timer { deliver_at_ms: 1_700_000_001_000, message_offset: 32 };
        ledger.record(LedgerEntry::cancel(cancelled, 4096)).unwrap();
        drop(ledger);
        let file =
            std::fs::read(dir.path().join(CANCEL_LEDGER_DIR).join(crate::format::numbered_file_name(0)))
                .unwrap();
        assert_eq!(&file[..8], b"DWCNCL\0\0");
        let entry = &file[crate::format::FILE_HEADER_LEN + 28..][..24];
        let want = concat!("2000000000000000", "e86be5cf8b010080", "0010000000000000");
        assert_eq!(crate::format::hex(entry), want);
    }

    #[test]
    fn a_recorded_cancel_is_found_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = CancelLedger::open(dir.path(), 0).unwrap();
        for (message, cancel) in [(100, 500), (40, 600), (700, 800)] {
            ledger.record(LedgerEntry::cancel(timer(message), cancel)).unwrap();
        }
        for message in [100, 40, 700] {
            assert!(ledger.contains(message).unwrap(), "{message}");
        }
        for message in [0, 41, 500, 800, 900] {
            assert!(!ledger.contains(message).unwrap(), "{message}");
        }
    }

    /// Once a lookup has built the files' filters, a lookup of a message
    /// with no entry reads about 1 in 100 files' entries, not all of them;
    /// entries recorded after a filter was built are still found.
    #[test]
    fn a_lookup_reads_only_the_files_whose_filter_may_hold_the_message() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = CancelLedger::open(dir.path(), 0).unwrap();
        let n = LEDGER_ENTRIES_PER_FILE * 3;
        for i in 0..n {
            ledger.record(LedgerEntry::cancel(timer(i * 10), i * 10 + 5)).unwrap();
        }
        assert!(ledger.contains(10 * (n / 2)).unwrap());
        assert!(!ledger.contains(3).unwrap(), "builds every file's filter");
        ledger.entries_read.set(0);
        for absent in (0..100).map(|i| i * 1_000 + 7) {
            assert!(!ledger.contains(absent).unwrap());
        }
        let per_lookup = ledger.entries_read.get() / 100;
        assert!(per_lookup < LEDGER_ENTRIES_PER_FILE / 4, "read {per_lookup} entries per lookup");
        ledger.record(LedgerEntry::cancel(timer(3), n * 10 + 5)).unwrap();
        assert!(ledger.contains(3).unwrap(), "an entry recorded after the filters were built");
    }

    #[test]
    fn the_latest_reschedule_names_the_timer_and_is_no_cancel() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = CancelLedger::open(dir.path(), 0).unwrap();
        ledger.record(LedgerEntry::reschedule(100, 5_000, 200)).unwrap();
        ledger.record(LedgerEntry::cancel(timer(150), 250)).unwrap();
        ledger.record(LedgerEntry::reschedule(100, 9_000, 300)).unwrap();
        let latest = ledger.latest_reschedule(100).unwrap().unwrap();
        assert_eq!(latest.rescheduled_timer(), Timer { deliver_at_ms: 9_000, message_offset: 300 });
        assert!(!ledger.contains(100).unwrap(), "a reschedule is not a cancel");
        assert_eq!(ledger.latest_reschedule(150).unwrap(), None, "a cancel is not a reschedule");
        ledger.record(LedgerEntry::cancel(Timer { deliver_at_ms: 9_000, message_offset: 300 }, 400)).unwrap();
        assert!(ledger.contains(300).unwrap(), "the rescheduled timer is cancelled by its record's offset");
        drop(ledger);
        let ledger = CancelLedger::open(dir.path(), 300).unwrap();
        assert_eq!(
            ledger.latest_reschedule(100).unwrap().map(|e| e.record_offset),
            Some(200),
            "cut from 300"
        );
    }

    #[test]
    fn reopening_cuts_the_entries_the_recovery_scan_reads_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = CancelLedger::open(dir.path(), 0).unwrap();
        ledger.record(LedgerEntry::cancel(timer(10), 100)).unwrap();
        ledger.record(LedgerEntry::cancel(timer(20), 200)).unwrap();
        ledger.record(LedgerEntry::cancel(timer(30), 300)).unwrap();
        drop(ledger);
        let ledger = CancelLedger::open(dir.path(), 200).unwrap();
        assert_eq!(ledger.len(), 1);
        assert!(ledger.contains(10).unwrap());
        assert!(!ledger.contains(20).unwrap(), "cut: the scan from 200 records it again");
    }

    #[test]
    fn reclaim_keeps_what_a_handle_may_still_ask_about() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = CancelLedger::open(dir.path(), 0).unwrap();
        let per_file = LEDGER_ENTRIES_PER_FILE;
        for i in 0..per_file * 2 {
            ledger.record(LedgerEntry::cancel(timer(i * 10), i * 10 + 5)).unwrap();
        }
        let far_future = u64::MAX;
        // Index 0 is never used, so the first file holds records 0..=per_file - 2.
        let last_of_first = per_file - 2;
        let past_it = last_of_first * 10 + 6;
        assert_eq!(
            ledger.reclaim(past_it - 1, far_future).unwrap(),
            0,
            "its last cancel is not below the log start"
        );
        let due = timer(last_of_first * 10).deliver_at_ms;
        assert_eq!(ledger.reclaim(past_it, due).unwrap(), 0, "a relocated copy of its last timer may exist");
        assert_eq!(ledger.reclaim(past_it, far_future).unwrap(), 1);
        assert!(!ledger.contains(0).unwrap());
        assert!(ledger.contains((last_of_first + 1) * 10).unwrap());
        assert_eq!(ledger.reclaim(u64::MAX, far_future).unwrap(), 1, "never the newest file");
        assert!(ledger.contains((per_file * 2 - 1) * 10).unwrap());
    }

    /// Deleting a file forgets the pins of its entries in memory, as a
    /// fresh read would not find them, without reading the ledger again.
    #[test]
    fn reclaim_forgets_the_pins_of_the_entries_it_deletes_without_reading_the_ledger_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = CancelLedger::open(dir.path(), 0).unwrap();
        let per_file = LEDGER_ENTRIES_PER_FILE;
        // Each message once in the first file (entries 1..per_file); the
        // second pins messages 1..=1000 again.
        for i in 1..per_file * 2 {
            let message = if i < per_file { i } else { i % 1000 + 1 };
            ledger.record(LedgerEntry::reschedule(message, 1, per_file + i * 10)).unwrap();
        }
        ledger.load_pins().unwrap();
        let before = ledger.pins().due_from(0..u64::MAX, 0).len();
        ledger.entries_read.set(0);
        // The log starts at the second file's first record: its scan stops there.
        assert_eq!(ledger.reclaim(per_file + per_file * 10, u64::MAX).unwrap(), 1);
        assert!(ledger.entries_read.get() <= per_file + 1, "read {} entries", ledger.entries_read.get());
        let after = ledger.pins().due_from(0..u64::MAX, 0);
        drop(ledger);
        assert_eq!(after, pins_read(dir.path()).0, "what a fresh read finds");
        assert_eq!((after.len(), before), (1_000, per_file as usize - 1));
    }

    /// The pins every read of `dir`'s ledger gives, and how many entries the read took.
    fn pins_read(dir: &Path) -> (Vec<(u64, Pin)>, u64) {
        let ledger = CancelLedger::open(dir, u64::MAX).unwrap();
        ledger.entries_read.set(0);
        ledger.load_pins().unwrap();
        let pins = ledger.pins().due_from(0..u64::MAX, 0);
        (pins, ledger.entries_read.get())
    }

    fn floor_at(offset: u64) -> Arc<crate::durable::Floor> {
        let floor = Arc::new(crate::durable::Floor::default());
        let counts = Arc::new(crate::durable::SegmentCounts::new(1 << 20));
        for tick_second in [1, 2] {
            let cp = crate::format::checkpoint::Checkpoint {
                log_durable: offset,
                dispatched: offset,
                delivery_scan_from: offset,
                tick_second,
                ..Default::default()
            };
            floor.record(&cp, offset, Arc::clone(&counts));
        }
        floor
    }

    /// A restart reads the snapshot and the entries after it, and finds
    /// the pins a read of the whole ledger finds; a snapshot that is
    /// damaged, or of a ledger since replaced, costs a whole read, never a pin.
    #[test]
    fn the_pins_snapshot_spares_a_restart_the_entries_it_folds_and_no_pin() {
        use crate::timer::pins_snapshot::{PinsSnapshotter, SnapshotGate};
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = CancelLedger::open(dir.path(), 0).unwrap();
        let mut rng = fastrand::Rng::with_seed(11);
        let record = std::cell::Cell::new(1_000u64);
        let mut write = |ledger: &mut CancelLedger, n: u64| {
            for _ in 0..n {
                let record = record.replace(record.get() + 100) + 100;
                let message = rng.u64(0..500) * 2;
                let entry = match rng.u8(0..8) {
                    0 => LedgerEntry::cancel(timer(message), record),
                    _ => LedgerEntry::reschedule(message, record * 3, record),
                };
                ledger.record(entry).unwrap();
            }
        };
        write(&mut ledger, 20_000);
        // Every entry so far lies below the floor; none after.
        let mut snapshotter = PinsSnapshotter::new(
            dir.path().into(),
            floor_at(record.get() + 1),
            Arc::new(SnapshotGate::default()),
            Duration::from_secs(1),
        );
        assert!(!snapshotter.round().unwrap(), "nothing is left for another round");
        assert!(dir.path().join(PINS_FILE).exists(), "a snapshot is published");
        write(&mut ledger, 300);
        drop(ledger);
        let (pins, read) = pins_read(dir.path());
        assert_eq!(read, 301, "the first entry (retention's mark) and the 300 after the snapshot");
        let snapshot = dir.path().join(PINS_FILE);
        let bytes = std::fs::read(&snapshot).unwrap();
        std::fs::remove_file(&snapshot).unwrap();
        let (all, read) = pins_read(dir.path());
        assert!(read >= 20_300, "{read}");
        assert_eq!(pins, all, "the snapshot and the tail give what the whole ledger gives");
        let mut damaged = bytes.clone();
        damaged[200] ^= 1;
        std::fs::write(&snapshot, &damaged).unwrap();
        assert_eq!(pins_read(dir.path()).0, all, "a damaged snapshot is passed over");
        // A ledger built afresh with other entries: the fingerprint no longer matches.
        std::fs::write(&snapshot, &bytes).unwrap();
        std::fs::remove_dir_all(dir.path().join(CANCEL_LEDGER_DIR)).unwrap();
        let mut ledger = CancelLedger::open(dir.path(), 0).unwrap();
        write(&mut ledger, 20_300);
        drop(ledger);
        std::fs::write(&snapshot, &bytes).unwrap();
        let (pins, read) = pins_read(dir.path());
        std::fs::remove_file(&snapshot).unwrap();
        assert!(read >= 20_300, "{read}");
        assert_eq!(pins, pins_read(dir.path()).0);
    }

    /// Rounds fold the ledger a bounded batch at a time into the file they
    /// rewrite; the result is the whole ledger's pins.
    #[test]
    fn successive_rounds_merge_into_one_file() {
        use crate::timer::pins_snapshot::{PinsSnapshotter, SnapshotGate};
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = CancelLedger::open(dir.path(), 0).unwrap();
        let gate = Arc::new(SnapshotGate::default());
        let mut record = 1_000u64;
        for round in 0..4u64 {
            for i in 0..5_000u64 {
                record += 10;
                ledger.record(LedgerEntry::reschedule((i * 7 + round) % 9_000, record * 2, record)).unwrap();
            }
            let mut snapshotter = PinsSnapshotter::new(
                dir.path().into(),
                floor_at(record + 1),
                Arc::clone(&gate),
                Duration::from_secs(1),
            );
            assert!(!snapshotter.round().unwrap(), "round {round} folds every entry");
        }
        record += 10;
        ledger.record(LedgerEntry::reschedule(1, record * 2, record)).unwrap();
        drop(ledger);
        let (pins, read) = pins_read(dir.path());
        assert_eq!(read, 2, "the first entry (retention's mark), then the one after the snapshot");
        std::fs::remove_file(dir.path().join(PINS_FILE)).unwrap();
        assert_eq!(pins, pins_read(dir.path()).0);
    }
}
