//! `verify`: every checksum and cross-reference, stopping at the first
//! problem, which it names by file and byte offset.
//!
//! Order (the first problem in this order is the one reported):
//! 1. the checkpoint file: size, and each written slot's magic, CRC, version;
//! 2. the commit log: segment headers, sizes and sequence, then every record's
//!    frame and CRC up to the end of the log; a bad record below the
//!    checkpoint's `log durable` is damage, one at or past it a torn tail
//!    (the end of the log, as for the store);
//! 3. the relocation area (a store with retention): the index header and
//!    every entry's CRC, original offsets strictly increasing, copies that do
//!    not overlap; every window file's header; every copy whose window file
//!    exists is a record that checks out against its *original* offset and is
//!    a timer message (or a cancel) due when the entry says; a missing window
//!    file must have ended by the checkpoint's tick second; each relocation
//!    record in the log agrees with the index entries of its segment; and the
//!    segment counts (`timer/segment_pending`) and the pins snapshot
//!    (`timer/pins`) pass their checksums;
//! 4. delivery and cancel records (and relocated cancels): each names an
//!    earlier timed message record, in the log or relocated (a cancel also its
//!    deliver time), or an offset below the oldest segment with no readable
//!    copy (retention deleted it after it fired);
//! 5. the timer logs, near (`timer/timerlog/`) then far (`timer/timerlog-far/`):
//!    headers (both logs' files of one size), every entry's CRC, and each
//!    entry names a timed message record with that deliver time (or one
//!    retention deleted); a log's files may start past index 0 (the store
//!    deletes its oldest files once no live chain reaches them);
//!
//!    5b. the cancel ledger (`timer/cancelled/`): headers (65,536 entries per
//!    file, first index), every entry's CRC and cancel bit, cancel-record
//!    offsets strictly increasing, and each entry's cancel record, if it lies
//!    in the retained log, is a cancel record naming the entry's message and
//!    deliver time (one below the oldest segment was deleted by retention:
//!    counted). A cancel record need not have an entry: the cancels of a
//!    store written before the ledger existed have none;
//! 6. the wheel: header and size, every slot's CRC, level and window; each
//!    live slot's chain (as of the checkpoint's tick second), through the log
//!    of its level: exactly `count` entries, `cancels` of them cancel entries,
//!    each due in the slot's window (level 0: in or before its second); and
//!    `timer/tails`: header and size, every record passes its CRC (in a store
//!    not closed cleanly a failing one is counted as torn: the next open
//!    resets it), and a live slot's record, if it is for the slot's window,
//!    names the chain's oldest entry (a record for another window only means
//!    the start is unknown). Stale
//!    slots' chains are not followed: they may lead into deleted files;
//! 7. the consume queues: headers, every entry's CRC, each entry points at a
//!    record of its queue (an ordinary message, or a delivery of a timer of
//!    that topic and queue) with the right length, time and tag hash, in log
//!    order, and every such record below the checkpoint's `dispatched` has
//!    exactly one entry (when the next open resumes at the checkpoint); an
//!    entry pointing below the oldest segment names a deleted record (counted);
//! 8. the checkpoint against the file ends, and neither slot needs a record
//!    below the oldest segment;
//! 9. the key index, `index/topic_pending` and `consumer_offsets.json`
//!    (see `side_indexes.rs`).
//!
//! A store that was not closed cleanly (crashed, lost power, or running)
//! holds what the next open's normal recovery deals with; that is reported
//! as such (`needs_recovery`, exit 0), not as a problem: a timer-log entry
//! that does not check out at or past the end of its log the checkpoint
//! vouches for ends that log (the open cuts it); a live slot whose chain
//! starts past that end, or runs into such a torn end, and does not read
//! (the wheel file was synced with a head its timer log had not: the open
//! rebuilds the wheel from the log); a cancel-ledger entry that does not
//! check out ends the ledger (the open cuts it, or rebuilds the wheel's
//! files). The same found below what the checkpoint vouches for, or after a
//! clean close, is damage.
//!
//! A store that was not closed cleanly may be running: index entries that
//! point at records past the end of the log as read here (cancel-ledger
//! entries by their cancel record) are then written after the scan, and
//! are skipped (and counted), not reported; so are relocation index
//! entries at its tail that belong to an unfinished pass, and live chains
//! that reach deleted timer-log files when a newer checkpoint has made
//! their slot stale meanwhile.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use delaywheel::CorruptionKind;
use delaywheel::internals::timer_entry::TimerEntry;
use delaywheel::internals::{self, geometry, pins, queue_entry, record, segment_counts, tail};
use serde::Serialize;

use crate::commitlog::{CommitLog, LogEnd, LogFacts, MessageFacts};
use crate::error::{DumpError, Result};
use crate::indexes::{
    CancelLedger, CheckpointFile, CheckpointSlot, ConsumeQueue, LoadedLog, LoadedLogs, LogSide, PlacedSlot,
    TailsFile, TimerLogs, WheelFile,
};
use crate::relocated::{CopyKind, Relocated};
use crate::store_files::{DataFile, FileKind, StoreFiles};
use crate::wheel_view::{LiveChains, Resume};

/// What was checked, for the report.
#[derive(Debug, Default, Serialize)]
pub struct Checked {
    pub checkpoint_slots: u64,
    pub file_headers: u64,
    pub records: u64,
    pub messages: u64,
    pub timed_messages: u64,
    /// Timers delivered (by delivery and deliveries records).
    pub deliveries: u64,
    /// Deliveries records among the records: each delivers a run of timers.
    #[serde(skip_serializing_if = "is_zero")]
    pub delivery_runs: u64,
    pub cancels: u64,
    /// Stretches of damaged bytes lenient recovery left in place and every reader skips.
    #[serde(skip_serializing_if = "is_zero")]
    pub skipped_records: u64,
    pub log_end: u64,
    /// The end of the log is a record that does not check out, at or past `log durable`.
    pub torn_tail: Option<String>,
    /// Entries of both timer logs (CRC and references checked).
    pub timer_log_entries: u64,
    /// Of those, in the near log (`timer/timerlog/`, level-0 chains).
    pub near_timer_log_entries: u64,
    /// Of those, in the far log (`timer/timerlog-far/`, level-1 and level-2 chains).
    pub far_timer_log_entries: u64,
    /// The first entry of each timer log on disk (near, far; `None`: no
    /// files): the store deleted the files below.
    pub timer_log_first_entries: [Option<u64>; 2],
    /// Entries of the cancel ledger (`timer/cancelled/`), checked.
    pub cancel_ledger_entries: u64,
    /// Of those, entries whose cancel record lies below the oldest segment
    /// (retention deleted it; its message went before it).
    pub cancel_ledger_deleted: u64,
    /// The first entry of the cancel ledger on disk (`None`: no files): the
    /// store deleted the files below.
    pub cancel_ledger_first_entry: Option<u64>,
    pub wheel_slots: u64,
    pub non_empty_slots: u64,
    /// Live slots (as of the checkpoint's tick second) whose chains were walked.
    pub chains_walked: u64,
    pub chain_entries: u64,
    /// Live slots a running store made stale while we read (by a newer
    /// checkpoint), their chains deleted in part.
    pub chains_gone_stale: u64,
    /// Live slots whose `timer/tails` record is for their window and names
    /// their chain's oldest entry.
    pub chain_starts: u64,
    /// Live slots with no `timer/tails` record for their window: the store
    /// keeps the whole timer log for them.
    pub chain_starts_unknown: u64,
    /// `timer/tails` records failing their checksum in a store not closed
    /// cleanly: torn by the crash (or damaged since the last open); the next
    /// open resets them to unknown. In a cleanly closed store each is a problem.
    #[serde(skip_serializing_if = "is_zero")]
    pub chain_starts_torn: u64,
    /// Timer-log entries (near, far) that end their log failing their
    /// checksum at or past the checkpoint's end of that log, in a store not
    /// closed cleanly: torn by the crash; the next open cuts them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timer_log_torn_at: Option<[Option<u64>; 2]>,
    /// What the store's next open does about what a crash left, in a store
    /// not closed cleanly: not damage, the normal recovery (empty otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub needs_recovery: Vec<String>,
    pub consume_queues: u64,
    pub queue_entries: u64,
    /// Entries of the key index (`index/keys/`), checked.
    pub key_index_entries: u64,
    pub dedup_index_entries: u64,
    /// Topics counted in `index/topic_pending`.
    pub topic_pending_topics: u64,
    /// Positions in `consumer_offsets.json`.
    pub consumer_offsets: u64,
    /// Index entries naming records past the log end read (a live store appending).
    pub past_log_end: u64,
    /// Start offset of the oldest segment: retention deleted every record below it.
    pub oldest_segment: u64,
    /// Relocation records in the log (each a segment retention deleted).
    pub relocation_records: u64,
    /// Entries in `commitlog/relocated/index`.
    pub relocation_index_entries: u64,
    /// Of those, entries at or after the oldest segment: a relocation pass
    /// that did not finish (a live store, or a crash); the next open cuts them.
    pub relocation_unfinished: u64,
    /// Of those, entries failing their checksum at the tail of a store not
    /// closed cleanly: a pass cut short; the next open cuts them.
    pub relocation_torn: u64,
    /// Relocation window files (headers checked).
    pub relocation_window_files: u64,
    /// Copies read back and checked against their original offsets.
    pub relocated_copies: u64,
    pub relocated_timers: u64,
    pub relocated_cancels: u64,
    /// Index entries whose window file was deleted (its window passed).
    pub relocated_window_deleted: u64,
    /// Delivery and cancel records and timer-log entries naming a relocated copy.
    pub named_relocated: u64,
    /// Delivery and cancel records and timer-log entries naming a record
    /// below the oldest segment with no readable copy (deleted after it fired).
    pub named_deleted: u64,
    /// Consume-queue entries pointing below the oldest segment (deleted records).
    pub queue_entries_deleted: u64,
    /// Segments holding pending timers by `timer/segment_pending`, if it exists.
    pub segment_counts: Option<u64>,
    /// Pins in `timer/pins`, if it exists.
    pub snapshot_pins: Option<u64>,
}

/// What a delivery, a cancel or a timer-log entry names.
enum Named<'a> {
    /// A timer: of a timed message record (in the log or relocated), or of
    /// a reschedule record of one; with its message and when it is due.
    Timer(&'a MessageFacts, u64),
    /// An offset below the oldest segment with no readable copy: retention
    /// deleted the record (its timer had fired, or its copy's window passed).
    Deleted,
    /// Anything else: a problem.
    Not,
}

fn named<'a>(facts: &'a LogFacts, relocated: &Relocated, timer: u64) -> Named<'a> {
    if let Some(r) = facts.reschedules.get(&timer) {
        return match named_message(facts, relocated, r.message_offset) {
            Named::Timer(m, _) if r.message_offset < timer => Named::Timer(m, r.deliver_at_ms),
            Named::Deleted => Named::Deleted,
            _ => Named::Not,
        };
    }
    named_message(facts, relocated, timer)
}

fn named_message<'a>(facts: &'a LogFacts, relocated: &Relocated, message: u64) -> Named<'a> {
    if let Some(m) = facts.timed(message) {
        return Named::Timer(m, m.deliver_at_ms);
    }
    if message >= relocated.log_start {
        return Named::Not;
    }
    match relocated.by_offset.get(&message) {
        None | Some(CopyKind::WindowDeleted | CopyKind::Damaged) => Named::Deleted,
        Some(CopyKind::Timer | CopyKind::Cancel | CopyKind::Reschedule) => Named::Not,
    }
}

/// Runs every check; `Err` is the first problem.
pub fn verify(files: &StoreFiles) -> Result<Checked> {
    let mut checked = Checked::default();
    let checkpoint = check_checkpoint_file(files, &mut checked)?;
    let resume = Resume::new(files, &checkpoint)?;
    let newest = resume.checkpoint.map(|(_, cp)| cp);
    let clean = newest.is_some_and(|cp| cp.clean);

    let durable = newest.map_or(0, |cp| cp.log_durable);
    let log = CommitLog::open(files)?.with_durable(durable);
    checked.file_headers += log.segments().count() as u64;
    let mut facts = LogFacts::gather(&log)?;
    check_log_end(&log, &facts, durable, &mut checked)?;
    let relocated = Relocated::gather(files, &log, &mut facts, clean, true)?;
    note_relocated(&relocated, &facts, &mut checked);
    check_relocation_records(&log, &facts, &relocated)?;
    check_segment_counts(files, &mut checked)?;
    check_pins_snapshot(files, &mut checked)?;
    check_settling_records(&log, &facts, &relocated, &mut checked)?;

    // The wheel is read before the timer log: a live store appends an entry
    // before the slot that points at it, so every chain read is complete.
    let wheel = WheelFile::read(files)?;
    let timer_logs = TimerLogs::open(files)?;
    check_log_files(&timer_logs, &mut checked)?;
    let doubtful_from = doubtful_timer_entries(newest.filter(|cp| !cp.clean).as_ref());
    let logs = timer_logs.load(doubtful_from)?;
    let torn = logs.0.each_ref().map(|log| log.torn_at());
    if torn.iter().any(Option::is_some) {
        checked.timer_log_torn_at = Some(torn);
    }
    for log in &logs.0 {
        check_timer_entries(&timer_logs, log, &facts, &relocated, clean, &mut checked)?;
    }
    check_cancel_ledger(files, &facts, log.start(), clean, &mut checked)?;
    if let Some(wheel) = &wheel {
        checked.file_headers += 1;
        let tails = TailsFile::read(files)?;
        checked.file_headers += u64::from(tails.is_some());
        if let Some(tails) = &tails {
            check_tails(tails, clean, &mut checked)?;
        }
        let doubtful = (!clean).then_some(doubtful_from);
        check_wheel(files, &resume, wheel, (&logs, &relocated), tails.as_ref(), doubtful, &mut checked)?;
    }
    let dispatched = newest.filter(|_| resume.resumes).map(|cp| cp.dispatched);
    check_queues(files, &log, &facts, &relocated, dispatched, clean, &mut checked)?;
    // Retention deletes only what neither of the last two checkpoints needs
    // (a torn newest one falls back to the other). The checkpoint is read
    // again: a live store may have deleted segments since it was first read,
    // on the word of newer checkpoints.
    let now = CheckpointFile::read(files)?;
    for (position, slot) in &now.slots {
        let CheckpointSlot::Valid(cp) = slot else { continue };
        for (name, value) in [("dispatched", cp.dispatched), ("delivery scan from", cp.delivery_scan_from)] {
            if value < log.start() {
                let why = format!(
                    "{name} {value} lies below the oldest segment, which starts at {}: retention deleted records this checkpoint needs",
                    log.start()
                );
                return Err(DumpError::bad_reference(&now.path, *position, why));
            }
        }
    }
    if let Some((position, cp)) = resume.checkpoint {
        let bad = |why: String| DumpError::bad_reference(&checkpoint.path, position, why);
        let log_end = facts.end.offset();
        for (name, value) in [("dispatched", cp.dispatched), ("delivery scan from", cp.delivery_scan_from)] {
            if value > log_end {
                return Err(bad(format!("{name} {value} lies past the end of the commit log at {log_end}")));
            }
        }
        // A close may end the log in the last bytes of a segment, which
        // readers skip: the end is then the next segment's first record.
        let closed_at = internals::record::record_start(cp.log_durable, log.segment_size.max(1));
        if clean && closed_at != log_end {
            return Err(bad(format!(
                "a clean close at log offset {} but the log ends at {log_end}",
                cp.log_durable
            )));
        }
        // Each log's end is unknown without files; a far end of 0 was not recorded.
        for (name, cp_end, log) in
            [("near", cp.timer_log_end, &logs.0[0]), ("far", cp.far_timer_log_end, &logs.0[1])]
        {
            let timer_end = log.end().unwrap_or(u64::MAX);
            if resume.resumes && cp_end > timer_end {
                return Err(bad(format!(
                    "{name} timer-log end {cp_end} lies past the timer log's end {timer_end}"
                )));
            }
        }
    }
    crate::side_indexes::check(files, &facts, log.start(), clean, &mut checked)?;
    Ok(checked)
}

/// Where each timer log's entries stop being vouched for (near, far): at
/// the ends the checkpoint of a store not closed cleanly records, which were
/// synced before it was written (a far end of 0 was not recorded: from entry
/// 1). What lies past them a power loss may have torn or lost, and the
/// store's open cuts it or rebuilds the wheel (`note_preindexed`,
/// `chains_intact` in `src/timer/wheel/restart.rs`). Nothing is in doubt after a
/// clean close, or without a checkpoint (the wheel is rebuilt then).
fn doubtful_timer_entries(unclean: Option<&internals::checkpoint::Checkpoint>) -> [u64; 2] {
    unclean.map_or([u64::MAX; 2], |cp| [cp.timer_log_end, cp.far_timer_log_end.max(1)])
}

fn check_checkpoint_file(files: &StoreFiles, checked: &mut Checked) -> Result<CheckpointFile> {
    let file = CheckpointFile::read(files)?;
    // No segment either: a first open that did not finish, which the store opens afresh.
    if !file.exists && files.segments.is_empty() {
        return Ok(file);
    }
    if !file.exists {
        return Err(DumpError::corruption(&file.path, 0, delaywheel::CorruptionKind::MissingFile));
    }
    if file.len != internals::checkpoint::FILE_LEN {
        let kind = delaywheel::CorruptionKind::WrongSize {
            expected: internals::checkpoint::FILE_LEN,
            found: file.len,
        };
        return Err(DumpError::corruption(&file.path, 0, kind));
    }
    for (position, slot) in &file.slots {
        checked.checkpoint_slots += 1;
        if let CheckpointSlot::Invalid(kind) = slot {
            return Err(DumpError::corruption(&file.path, *position, kind.clone()));
        }
    }
    // A valid slot the store passes over, by the library's own rule, is damage too.
    if let Some((position, why)) = file.judge(&CommitLog::open(files)?)?.passed_over.into_iter().next() {
        let why = format!("a slot the store cannot have written, which it passes over: {why}");
        return Err(DumpError::bad_reference(&file.path, position, why));
    }
    Ok(file)
}

/// Where the log ends: below `log durable` that is damage, as for the store.
fn check_log_end(log: &CommitLog, facts: &LogFacts, durable: u64, checked: &mut Checked) -> Result<()> {
    let c = facts.counts;
    (checked.messages, checked.timed_messages, checked.deliveries, checked.cancels) =
        (c.messages, c.timed, c.deliveries, c.cancels);
    checked.delivery_runs = facts.runs.len() as u64;
    checked.records = c.messages + c.delivery_records + c.cancels;
    checked.skipped_records = c.skipped;
    for &(at, len) in &facts.skipped {
        let (file, position) = log.locate(at);
        eprintln!(
            "note: {} at offset {position}: {len} damaged bytes that lenient recovery left in place (skipped)",
            file.display()
        );
    }
    if let Some(d) = facts.damaged.first() {
        let why = format!(
            "{} ({} damaged bytes, {} stretches in all; the store skips them and their records are lost)",
            d.kind,
            d.len,
            facts.damaged.len()
        );
        return Err(DumpError::corruption(&d.file, d.position, CorruptionKind::BadFrame(why)));
    }
    checked.log_end = facts.end.offset();
    match &facts.end {
        LogEnd::Invalid { offset, file, position, kind } if *offset < durable => {
            Err(DumpError::corruption(file, *position, kind.clone()))
        }
        LogEnd::Invalid { offset, kind, .. } => {
            checked.torn_tail = Some(format!("at log offset {offset}: {kind}"));
            Ok(())
        }
        LogEnd::Clean { offset } if *offset < durable => {
            let (file, position) = log.locate(*offset);
            Err(DumpError::bad_reference(
                file,
                position,
                format!("the log ends here, below the checkpoint's log durable {durable}"),
            ))
        }
        LogEnd::Clean { .. } => Ok(()),
    }
}

fn note_relocated(r: &Relocated, facts: &LogFacts, checked: &mut Checked) {
    checked.oldest_segment = r.log_start;
    checked.relocation_records = facts.relocations.len() as u64;
    checked.relocation_index_entries = r.index_entries;
    checked.relocation_unfinished = r.unfinished;
    checked.relocation_torn = r.torn;
    checked.relocation_window_files = r.window_files;
    checked.relocated_copies = r.copies;
    checked.relocated_timers = r.timers;
    checked.relocated_cancels = r.cancels;
    checked.relocated_window_deleted = r.window_deleted;
    checked.file_headers += u64::from(r.index_exists) + r.window_files;
}

/// Each relocation record of a deleted segment agrees with the index: as
/// many entries (and bytes) for that segment as it says it copied, and as
/// many timers and cancels among the copies still readable. A record written
/// before the index was last compacted (`relocated/compacted` holds the log
/// end then) may name more: compaction drops the entries of deleted windows.
/// A segment relocated twice (a crash before its deletion) counts by its last record.
fn check_relocation_records(log: &CommitLog, facts: &LogFacts, relocated: &Relocated) -> Result<()> {
    let size = log.segment_size.max(1);
    let mut last = std::collections::BTreeMap::new();
    for &(at, record) in &facts.relocations {
        if record.segment_base % size != 0 || record.segment_base >= at {
            let (file, position) = log.locate(at);
            let why = format!(
                "relocation record names segment {}, not an earlier segment start",
                record.segment_base
            );
            return Err(DumpError::bad_reference(file, position, why));
        }
        last.insert(record.segment_base, (at, record));
    }
    for (base, (at, record)) in last {
        if base >= relocated.log_start {
            continue; // still on disk: its pass did not finish, or a live store is about to delete it
        }
        let s = relocated.per_segment.get(&base).copied().unwrap_or_default();
        let total = record.timers + record.cancels;
        let (entries_agree, kinds_agree) = if at < relocated.compacted_at {
            let kinds = s.unread > 0 || (s.timers <= record.timers && s.cancels <= record.cancels);
            (s.entries <= total && s.bytes <= record.bytes, kinds)
        } else {
            let kinds = s.unread > 0 || (s.timers, s.cancels) == (record.timers, record.cancels);
            (s.entries == total && s.bytes == record.bytes, kinds)
        };
        if entries_agree && kinds_agree {
            continue;
        }
        // A pass cut short at the index's tail is the likelier culprit.
        if let Some((path, position, kind)) = &relocated.first_torn {
            return Err(DumpError::corruption(path, *position, kind.clone()));
        }
        let (file, position) = log.locate(at);
        let why = format!(
            "relocation record says {} timers and {} cancels ({} bytes) of segment {base} were copied, \
             the relocation index holds {} entries ({} bytes) for it: {} timers, {} cancels, {} unread",
            record.timers, record.cancels, record.bytes, s.entries, s.bytes, s.timers, s.cancels, s.unread
        );
        return Err(DumpError::bad_reference(file, position, why));
    }
    Ok(())
}

/// `timer/segment_pending`, an index written whole: its header and checksum.
fn check_segment_counts(files: &StoreFiles, checked: &mut Checked) -> Result<()> {
    if !files.segment_pending.is_file() {
        return Ok(());
    }
    let file = DataFile::open(&files.segment_pending)?;
    file.header(FileKind::SegmentPending)?;
    checked.file_headers += 1;
    let bytes = file.read(0, file.len as usize)?;
    let counts = segment_counts::decode(&bytes).ok_or_else(|| {
        let kind =
            CorruptionKind::BadFrame("segment counts that fail their checksum or do not fit the file".into());
        DumpError::corruption(&file.path, internals::FILE_HEADER_LEN as u64, kind)
    })?;
    // Segments listed hold pending timers (or cancels of timers not yet due).
    checked.segment_counts = Some(counts.counts.values().filter(|p| p.count > 0).count() as u64);
    Ok(())
}

/// `timer/pins`, an index written whole: read through to its checksum,
/// pins in order. (Whether it still matches the cancel ledger is the
/// store's call at open: a stale one is passed over, not damage.)
fn check_pins_snapshot(files: &StoreFiles, checked: &mut Checked) -> Result<()> {
    if !files.pins.is_file() {
        return Ok(());
    }
    let file = std::fs::File::open(&files.pins).map_err(|e| DumpError::io("read", &files.pins, e))?;
    let len = file.metadata().map_err(|e| DumpError::io("read", &files.pins, e))?.len();
    let damaged = |kind| DumpError::corruption(&files.pins, 0, kind);
    let (_, mut decoder) = pins::Decoder::open(std::io::BufReader::new(file), len).map_err(damaged)?;
    let mut count = 0;
    while decoder.next_pin().map_err(damaged)?.is_some() {
        count += 1;
    }
    checked.file_headers += 1;
    checked.snapshot_pins = Some(count);
    Ok(())
}

/// Each delivery and cancel record (and each relocated cancel) names an
/// earlier timed message record, or one retention deleted.
fn check_settling_records(
    log: &CommitLog,
    facts: &LogFacts,
    relocated: &Relocated,
    checked: &mut Checked,
) -> Result<()> {
    // (what, record offset, message offset, the cancel's deliver time, where to blame)
    let mut check =
        |what: &str, record: u64, message: u64, deliver_at: Option<u64>, place: (PathBuf, u64)| {
            let bad = |why: String| DumpError::bad_reference(&place.0, place.1, why);
            let due = match named(facts, relocated, message) {
                Named::Timer(_, due) if message < record => due,
                Named::Deleted if message < record => {
                    checked.named_deleted += 1;
                    return Ok(());
                }
                _ => {
                    return Err(bad(format!(
                        "{what} names log offset {message}, not an earlier timed message record"
                    )));
                }
            };
            if message < relocated.log_start {
                checked.named_relocated += 1;
            }
            match deliver_at {
                Some(at) if at != due => {
                    Err(bad(format!("{what} says deliver at {at}, the timer says {due}")))
                }
                _ => Ok(()),
            }
        };
    for &(record, _, message) in &facts.deliveries {
        check("delivery record", record, message, None, log.locate(record))?;
    }
    for &(record, message, deliver_at) in &facts.cancels {
        check("cancel record", record, message, Some(deliver_at), log.locate(record))?;
    }
    for (&record, r) in &facts.reschedules {
        let place = if record < relocated.log_start {
            (PathBuf::from("commitlog/relocated"), record)
        } else {
            log.locate(record)
        };
        check("reschedule record", record, r.from_timer, Some(r.from_deliver_at_ms), place)?;
    }
    for c in &relocated.cancel_copies {
        let place = (c.path.clone(), c.position);
        check("relocated cancel record", c.original_offset, c.message_offset, Some(c.deliver_at_ms), place)?;
    }
    Ok(())
}

/// Both timer logs' files: counted, and of one size (the store makes them alike).
fn check_log_files(logs: &TimerLogs, checked: &mut Checked) -> Result<()> {
    for log in &logs.0 {
        checked.file_headers += log.files().count() as u64;
    }
    let [near, far] = &logs.0;
    if let (Some(a), Some(b)) = (near.entries_per_file(), far.entries_per_file())
        && a != b
        && let Some(f) = far.files().next()
    {
        let why = format!("header says {b} entries per file, the near timer log's files say {a}");
        return Err(DumpError::bad_reference(&f.file.path, 0, why));
    }
    Ok(())
}

/// Each entry of timer log `log` names a timed message record due at the entry's time.
fn check_timer_entries(
    logs: &TimerLogs,
    log: &LoadedLog,
    facts: &LogFacts,
    relocated: &Relocated,
    clean: bool,
    checked: &mut Checked,
) -> Result<()> {
    checked.timer_log_first_entries[log.side.index()] = log.first();
    for (index, e) in log.iter() {
        checked.timer_log_entries += 1;
        match log.side {
            LogSide::Near => checked.near_timer_log_entries += 1,
            LogSide::Far => checked.far_timer_log_entries += 1,
        }
        if !clean && e.message_offset >= facts.end.offset() {
            checked.past_log_end += 1;
            continue;
        }
        let matches = match named(facts, relocated, e.message_offset) {
            Named::Timer(_, due) => {
                checked.named_relocated += u64::from(e.message_offset < relocated.log_start);
                due == e.deliver_at_ms
            }
            Named::Deleted => {
                checked.named_deleted += 1;
                true
            }
            Named::Not => false,
        };
        if !matches {
            let (_, path, position) = logs.get(log.side).locate(index);
            let why = format!(
                "entry {index} names log offset {} due at {}, which is not a timed message record due then",
                e.message_offset, e.deliver_at_ms
            );
            return Err(DumpError::bad_reference(path, position, why));
        }
    }
    Ok(())
}

/// Step 5b: the cancel ledger's entries, in log order of their records,
/// each naming its cancel or reschedule record (one in the retained log is checked).
fn check_cancel_ledger(
    files: &StoreFiles,
    facts: &LogFacts,
    log_start: u64,
    clean: bool,
    checked: &mut Checked,
) -> Result<()> {
    let ledger = CancelLedger::open(files)?;
    checked.file_headers += ledger.file_count() as u64;
    checked.cancel_ledger_first_entry = ledger.first();
    let mut last = None;
    let (_, torn_at) = ledger.scan(!clean, |index, path, position, e| {
        checked.cancel_ledger_entries += 1;
        let bad = |why: String| DumpError::bad_reference(path, position, format!("entry {index}: {why}"));
        // A ledger entry has the timer-log layout: `prev` holds its record's
        // offset; the cancel bit is set on a cancel's, clear on a reschedule's.
        let cancel = e.prev;
        // The store binary-searches by record: out of order, a handle finds the wrong answer.
        if let Some(last) = last.filter(|&last| cancel <= last) {
            return Err(bad(format!(
                "record at log offset {cancel} is not after the previous entry's {last}"
            )));
        }
        last = Some(cancel);
        if !clean && cancel >= facts.end.offset() {
            checked.past_log_end += 1;
            return Ok(());
        }
        if cancel < log_start {
            checked.cancel_ledger_deleted += 1;
            return Ok(());
        }
        ledger_entry_matches(facts, &e).map_err(bad)
    })?;
    if let Some(at) = torn_at {
        // The open cuts the ledger from the first entry of a record it
        // replays, or rebuilds the wheel's files if its search meets this one.
        checked.needs_recovery.push(format!(
            "the cancel ledger ends at entry {at}, which does not check out: the next open cuts it there \
             or rebuilds the wheel's files from the log"
        ));
    }
    Ok(())
}

/// Whether the cancel record a ledger entry names (in the retained log)
/// cancels the entry's timer, or the reschedule record it names moves the
/// entry's message to the entry's deliver time.
fn ledger_entry_matches(facts: &LogFacts, e: &TimerEntry) -> Result<(), String> {
    let at = e.prev;
    if !e.cancel {
        let Some(r) = facts.reschedules.get(&at) else {
            return Err(format!(
                "a reschedule entry (bit 63 clear), but log offset {at} is not a reschedule record"
            ));
        };
        if (r.message_offset, r.deliver_at_ms) != (e.message_offset, e.deliver_at_ms) {
            return Err(format!(
                "names log offset {} to {}, its reschedule record at log offset {at} moves log offset {} to {}",
                e.message_offset, e.deliver_at_ms, r.message_offset, r.deliver_at_ms
            ));
        }
        return Ok(());
    }
    // `facts.cancels` is in log order, so sorted by record offset.
    let Ok(i) = facts.cancels.binary_search_by_key(&at, |&(record, _, _)| record) else {
        return Err(format!("log offset {at} is not a cancel record"));
    };
    let (_, message, deliver_at) = facts.cancels[i];
    if (message, deliver_at) != (e.message_offset, e.deliver_at_ms) {
        return Err(format!(
            "names log offset {} due at {}, its cancel record at log offset {at} cancels log offset {message} due at {deliver_at}",
            e.message_offset, e.deliver_at_ms
        ));
    }
    Ok(())
}

/// Every `timer/tails` record's checksum, live slot or not: the store
/// resets a failing one at open, so one on disk is damage, or in a store not
/// closed cleanly possibly torn by the crash (counted).
fn check_tails(tails: &TailsFile, clean: bool, checked: &mut Checked) -> Result<()> {
    for index in 0..geometry::TOTAL_SLOTS {
        match tails.record(index) {
            Err(_) if !clean => checked.chain_starts_torn += 1,
            other => drop(other?),
        }
    }
    Ok(())
}

/// Every slot record; the chains of live slots and their chain starts.
fn check_wheel(
    files: &StoreFiles,
    resume: &Resume,
    wheel: &WheelFile,
    (logs, relocated): (&LoadedLogs, &Relocated),
    tails: Option<&TailsFile>,
    doubtful: Option<[u64; 2]>,
    checked: &mut Checked,
) -> Result<()> {
    let mut chains = LiveChains::new(files, resume);
    for index in 0..geometry::TOTAL_SLOTS {
        checked.wheel_slots += 1;
        let Some(slot) = wheel.slot(index)? else { continue };
        checked.non_empty_slots += 1;
        if slot.slot.count == 0 || !resume.is_live(&slot) {
            continue; // stale: its chain may lead into deleted timer-log files
        }
        let chain = match chains.chain(wheel, &slot, logs) {
            Ok(chain) => chain,
            Err(e) => match slot_in_doubt(&slot, logs, doubtful) {
                Some(end) => {
                    // The wheel file was synced with a head the timer log had not: normal after a crash.
                    checked.needs_recovery.push(format!(
                        "slot {index}'s chain starts at entry {} of {}, past the {end} entries the checkpoint vouches for, \
                         and does not read ({e}): the next open rebuilds the wheel from the log",
                        slot.slot.head,
                        LogSide::of_level(slot.level).name()
                    ));
                    return Ok(());
                }
                None => return Err(e),
            },
        };
        let Some(chain) = chain else {
            checked.chains_gone_stale += 1;
            continue;
        };
        checked.chains_walked += 1;
        checked.chain_entries += chain.len() as u64;
        for &(entry, e) in &chain {
            let second = e.deliver_at_ms / 1000;
            // Level 0 also takes timers that were due when indexed (in the newest loaded second).
            let fits = match slot.level {
                0 => second <= slot.slot.window,
                level => geometry::window_of(level, second) == slot.slot.window,
            };
            if !fits {
                let why = format!(
                    "its chain holds timer-log entry {entry}, due in second {second}, outside its window"
                );
                return Err(DumpError::bad_reference(
                    &wheel.path,
                    internals::slot::slot_position(index),
                    why,
                ));
            }
            // A pending timer whose segment retention deleted must have a
            // copy: of its message, or of the reschedule record that names
            // it now (the store restores either as a timer).
            let copied = matches!(
                relocated.by_offset.get(&e.message_offset),
                Some(CopyKind::Timer | CopyKind::Reschedule)
            );
            if !e.cancel && e.message_offset < relocated.log_start && !copied {
                let why = format!(
                    "slot {index} holds a pending timer (timer-log entry {entry}) of log offset {}, \
                     whose segment was deleted without a readable copy",
                    e.message_offset
                );
                return Err(DumpError::bad_reference(
                    &wheel.path,
                    internals::slot::slot_position(index),
                    why,
                ));
            }
        }
        let oldest = chain.last().map_or(0, |&(oldest, _)| oldest);
        // A failing record was checked above: torn by the crash, so unknown.
        match tails.and_then(|t| t.record(index).ok()).flatten() {
            Some(record) if record.window == slot.slot.window => {
                if record.first_entry != oldest {
                    let side = LogSide::of_level(slot.level);
                    let why = format!(
                        "the record of slot {index} says its chain for window {} starts at entry {} of {}, \
                         the chain's oldest entry is {oldest}",
                        record.window,
                        record.first_entry,
                        side.name()
                    );
                    let path = tails.map(|t| t.path.clone()).unwrap_or_default();
                    return Err(DumpError::bad_reference(path, tail::tail_position(index), why));
                }
                checked.chain_starts += 1;
            }
            // Written for another window (torn apart by a power loss) or never: unknown.
            _ => checked.chain_starts_unknown += 1,
        }
    }
    Ok(())
}

/// For a live slot whose chain does not read, in a store not closed cleanly
/// (`doubtful`: see [`doubtful_timer_entries`]): the end of its timer log
/// the checkpoint vouches for, if the chain starts at or past it or runs
/// into the log's torn end. `None`: the chain broke where nothing was in doubt.
fn slot_in_doubt(slot: &PlacedSlot, logs: &LoadedLogs, doubtful: Option<[u64; 2]>) -> Option<u64> {
    let side = LogSide::of_level(slot.level);
    let end = doubtful?[side.index()];
    let torn = logs.get(side).torn_at().is_some();
    (slot.slot.head >= end || torn).then_some(end)
}

fn check_queues(
    files: &StoreFiles,
    log: &CommitLog,
    facts: &LogFacts,
    relocated: &Relocated,
    dispatched: Option<u64>,
    clean: bool,
    checked: &mut Checked,
) -> Result<()> {
    // Delivery records (kind 2) by offset; deliveries records are
    // `facts.runs`, occurrences records `facts.occurrence_runs`.
    let deliveries: HashMap<u64, (u64, u64)> = facts
        .deliveries
        .iter()
        .filter(|(at, _, _)| !facts.runs.contains_key(at) && !facts.occurrence_runs.contains_key(at))
        .map(|&(at, when, m)| (at, (when, m)))
        .collect();
    // Records that must be in a queue: ordinary messages and deliveries,
    // by (offset, index of the timer in a deliveries record).
    let mut referenced: HashSet<(u64, usize)> = HashSet::new();
    let mut stretches: HashMap<(&str, u32), DumpError> = HashMap::new();
    for q in &files.queues {
        let queue = ConsumeQueue::open(q)?;
        checked.consume_queues += 1;
        checked.file_headers += queue.file_count() as u64;
        let mut last = (0, 0);
        let end = queue.scan(|index, path, position, e| {
            checked.queue_entries += 1;
            let bad = |why: String| DumpError::bad_reference(path, position, format!("entry {index}: {why}"));
            if !clean && e.log_offset >= facts.end.offset() {
                checked.past_log_end += 1;
                return Ok(());
            }
            // Strictly after the previous one: the timers of a deliveries
            // record share its offset, in the record's order.
            let at = (e.log_offset, e.batch_index().unwrap_or(0));
            if at <= last {
                let why = format!("log offset {} (timer {}) is not after the previous entry's {} ({})", at.0, at.1, last.0, last.1);
                return Err(bad(why));
            }
            last = at;
            if e.log_offset < relocated.log_start {
                // Its record was deleted by retention; the queue file goes once all of its entries do.
                checked.queue_entries_deleted += 1;
                return Ok(());
            }
            if q.topic == delaywheel::SCHEDULE_TOPIC {
                return check_schedule_entry(facts, &e, bad);
            }
            // The message the entry makes visible (`None`: a timer's message
            // retention deleted), with the time it became visible.
            let (message, visible_ms, len) = if let Some(i) = e.batch_index()
                && let Some(run) = facts.occurrence_runs.get(&e.log_offset)
            {
                let &timer = run.fired.get(i).ok_or_else(|| bad(format!("names entry {i} of an occurrences record of {}", run.fired.len())))?;
                let message = match named(facts, relocated, timer) {
                    Named::Timer(m, _) => Some(m),
                    Named::Deleted => None,
                    Named::Not => return Err(bad(format!("entry {i} of its occurrences record names no timed message"))),
                };
                (message, run.delivered_at_ms, run.len)
            } else if let Some(i) = e.batch_index() {
                let run = facts.runs.get(&e.log_offset).ok_or_else(|| bad(format!("log offset {} is not a deliveries record", e.log_offset)))?;
                let &(timer, tag_hash) = run.timers.get(i).ok_or_else(|| bad(format!("names timer {i} of a deliveries record of {}", run.timers.len())))?;
                if run.topic != q.topic || run.queue_id != q.queue_id || tag_hash != e.tag_hash {
                    let why = format!("the deliveries record names {} queue {} tag hash {tag_hash:#x} for it", run.topic, run.queue_id);
                    return Err(bad(why));
                }
                let message = match named(facts, relocated, timer) {
                    Named::Timer(m, _) => Some(m),
                    Named::Deleted => None,
                    Named::Not => return Err(bad(format!("timer {i} of its deliveries record names no timed message"))),
                };
                (message, run.delivered_at_ms, run.len)
            } else if e.timer_delivery() {
                let (when, m) = deliveries.get(&e.log_offset).copied().ok_or_else(|| bad(format!("log offset {} is not a delivery record", e.log_offset)))?;
                let message = match named(facts, relocated, m) {
                    Named::Timer(m, _) => Some(m),
                    Named::Deleted => None,
                    Named::Not => return Err(bad("its delivery record names no timed message".into())),
                };
                // A schedule's occurrence record delivers too, and is longer.
                let len = facts.reschedules.get(&e.log_offset).map_or(record::DELIVERY_LEN, |r| r.record_len());
                (message, when, len as u32)
            } else {
                let m = facts.messages.get(&e.log_offset).filter(|m| m.deliver_at_ms == 0);
                let m = m.ok_or_else(|| bad(format!("log offset {} is not an ordinary message record", e.log_offset)))?;
                (Some(m), m.store_time_ms, m.len)
            };
            if let Some(m) = message.filter(|m| facts.topic(m) != q.topic || m.queue_id != q.queue_id) {
                return Err(bad(format!("the record belongs to {} queue {}", facts.topic(m), m.queue_id)));
            }
            let tag_hash = message.map_or(e.tag_hash, |m| m.tag_hash);
            let flags = match e.batch_index() {
                Some(i) => queue_entry::batch_flags(i),
                None => u32::from(e.timer_delivery()),
            };
            if e.record_len != len || e.time_ms != visible_ms || e.tag_hash != tag_hash || e.flags != flags {
                let why = format!(
                    "length {}, time {}, tag hash {:#x}, flags {:#x} where the record says {len}, {visible_ms}, {tag_hash:#x}, {flags:#x}",
                    e.record_len, e.time_ms, e.tag_hash, e.flags
                );
                return Err(bad(why));
            }
            if !referenced.insert(at) {
                return Err(bad(format!("a second entry for the record at log offset {} (timer {})", at.0, at.1)));
            }
            Ok(())
        })?;
        if let Some(stretch) = zeroed_stretch(&queue, end)? {
            // Every entry is synced by a clean close; after a crash it may
            // be entries the power loss took past `dispatched` (see below).
            if clean {
                return Err(stretch);
            }
            stretches.insert((q.topic.as_str(), q.queue_id), stretch);
        }
    }
    let Some(dispatched) = dispatched else { return Ok(()) };
    // The library's rule: which message records get an entry where they lie.
    let indexed = |m: &&MessageFacts| queue_entry::indexed_as_sent(facts.topic(m), m.deliver_at_ms != 0);
    let mut needed: Vec<(u64, usize)> =
        facts.messages.iter().filter(|(_, m)| indexed(m)).map(|(&at, _)| (at, 0)).collect();
    needed.extend(deliveries.keys().map(|&at| (at, 0)));
    needed.extend(facts.runs.iter().flat_map(|(&at, run)| (0..run.timers.len()).map(move |i| (at, i))));
    needed.extend(
        facts.occurrence_runs.iter().flat_map(|(&at, run)| (0..run.fired.len()).map(move |i| (at, i))),
    );
    needed.sort_unstable();
    if let Some(&(missing, timer)) = needed.iter().find(|&&at| at.0 < dispatched && !referenced.contains(&at))
    {
        // Its entry lay in a zeroed stretch of its queue: name the queue.
        if let Some(stretch) = queue_of(facts, relocated, missing, timer).and_then(|q| stretches.remove(&q)) {
            return Err(stretch);
        }
        let (file, position) = log.locate(missing);
        let why =
            format!("below the checkpoint's dispatched {dispatched} but no consume-queue entry points at it");
        return Err(DumpError::bad_reference(file, position, why));
    }
    Ok(())
}

/// The entries of a queue are dense: an unwritten entry at `end` (where
/// the scan stopped) followed by a written one is a zeroed stretch, named by
/// the queue file and position. In a store not closed cleanly it is damage
/// only if a record below the checkpoint's `dispatched` lost its entry to
/// it: past `dispatched` it is what the power loss took, which the open cuts
/// and the replay writes again.
fn zeroed_stretch(queue: &ConsumeQueue, end: u64) -> Result<Option<DumpError>> {
    let Some((written, path, position)) = queue.written_after(end)? else { return Ok(None) };
    let why = format!(
        "entry {end} is unwritten (all zeros) but entry {written} after it is written: a stretch of the queue was zeroed \
         (a consumer that meets it gets its entries made again from the log)"
    );
    Ok(Some(DumpError::bad_reference(path, position, why)))
}

/// The queue (topic, queue id) whose entry the record at `at` (timer
/// `timer` of a deliveries record) makes, where the facts tell.
fn queue_of<'a>(facts: &'a LogFacts, relocated: &Relocated, at: u64, timer: usize) -> Option<(&'a str, u32)> {
    if let Some(run) = facts.runs.get(&at) {
        return run.timers.get(timer).map(|_| (run.topic.as_str(), run.queue_id));
    }
    if let Some(run) = facts.occurrence_runs.get(&at) {
        let message = match named(facts, relocated, *run.fired.get(timer)?) {
            Named::Timer(m, _) => m,
            _ => return None,
        };
        return Some((facts.topic(message), message.queue_id));
    }
    let message = match facts.deliveries.iter().find(|(d, _, _)| *d == at) {
        Some(&(_, _, timer)) => match named(facts, relocated, timer) {
            Named::Timer(m, _) => m,
            _ => return None,
        },
        None => facts.messages.get(&at)?,
    };
    Some((facts.topic(message), message.queue_id))
}

/// An entry of the bucket scheduler's level queues (`SCHEDULE_TOPIC_XXXX`):
/// it must point at a timed message, with that record's length and tag hash.
/// Its time is the level's due time, which needs the store's level table to
/// check, so it is only checked not to be before the message was stored.
fn check_schedule_entry(
    facts: &LogFacts,
    e: &queue_entry::Entry,
    bad: impl Fn(String) -> DumpError,
) -> Result<()> {
    let m = facts
        .timed(e.log_offset)
        .ok_or_else(|| bad(format!("log offset {} is not a timed message record", e.log_offset)))?;
    if e.record_len != m.len || e.tag_hash != m.tag_hash || e.flags != 0 || e.time_ms < m.store_time_ms {
        let why = format!(
            "length {}, time {}, tag hash {:#x}, flags {} where the record says {}, stored at {}, {:#x}, 0",
            e.record_len, e.time_ms, e.tag_hash, e.flags, m.len, m.store_time_ms, m.tag_hash
        );
        return Err(bad(why));
    }
    Ok(())
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
