//! `verify`: every checksum and cross-reference, stopping at the first
//! problem, which it names by file and byte offset.
//!
//! Order (the first problem in this order is the one reported):
//! 1. the checkpoint file: size, and each written slot's magic, CRC, version;
//! 2. the commit log: segment headers, sizes and sequence, then every record's
//!    frame and CRC up to the end of the log; a bad record below the
//!    checkpoint's `log durable` is damage, one at or past it a torn tail
//!    (the end of the log, as for the store);
//! 3. delivery and cancel records: each names an earlier timed message
//!    record (a cancel also its deliver time);
//! 4. the timer log: headers, every entry's CRC, and each entry names a timed
//!    message record with that deliver time;
//! 5. the wheel: header and size, every slot's CRC, level and window, and each
//!    non-empty slot's chain: exactly `count` entries, `cancels` of them cancel
//!    entries, each due in the slot's window (level 0: in or before its second);
//! 6. the consume queues: headers, every entry's CRC, each entry points at a
//!    record of its queue (an ordinary message, or a delivery of a timer of
//!    that topic and queue) with the right length, time and tag hash, in log
//!    order, and every such record below the checkpoint's `dispatched` has
//!    exactly one entry (when the next open resumes at the checkpoint);
//! 7. the checkpoint against the file ends.
//!
//! A store that was not closed cleanly may be running: index entries that
//! point at records past the end of the log as read here are then written
//! after the scan, and are skipped (and counted), not reported.

use std::collections::{HashMap, HashSet};

use delaywheel::inspect;
use serde::Serialize;

use crate::commitlog::{CommitLog, LogEnd, LogFacts};
use crate::error::{DumpError, Result};
use crate::indexes::{CheckpointFile, CheckpointSlot, ConsumeQueue, TimerLog, WheelFile, chain};
use crate::store_files::StoreFiles;
use crate::wheel_view::Resume;

/// What was checked, for the report.
#[derive(Debug, Default, Serialize)]
pub struct Checked {
    pub checkpoint_slots: u64,
    pub file_headers: u64,
    pub records: u64,
    pub messages: u64,
    pub timed_messages: u64,
    pub deliveries: u64,
    pub cancels: u64,
    pub log_end: u64,
    /// The end of the log is a record that does not check out, at or past `log durable`.
    pub torn_tail: Option<String>,
    pub timer_log_entries: u64,
    pub wheel_slots: u64,
    pub non_empty_slots: u64,
    pub chain_entries: u64,
    pub consume_queues: u64,
    pub queue_entries: u64,
    /// Index entries naming records past the log end read (a live store appending).
    pub past_log_end: u64,
}

/// Runs every check; `Err` is the first problem.
pub fn verify(files: &StoreFiles) -> Result<Checked> {
    let mut checked = Checked::default();
    let checkpoint = check_checkpoint_file(files, &mut checked)?;
    let resume = Resume::new(files, &checkpoint);
    let newest = checkpoint.newest().map(|(_, cp)| cp);
    let clean = newest.is_some_and(|cp| cp.clean);

    let log = CommitLog::open(files)?;
    checked.file_headers += log.segments().count() as u64;
    let facts = LogFacts::gather(&log)?;
    check_log_end(&log, &facts, newest.map_or(0, |cp| cp.log_durable), &mut checked)?;
    check_settling_records(&log, &facts)?;

    // The wheel is read before the timer log: a live store appends an entry
    // before the slot that points at it, so every chain read is complete.
    let wheel = WheelFile::read(files)?;
    let timer_log = TimerLog::open(files)?;
    checked.file_headers += timer_log.files().count() as u64;
    let entries = timer_log.load()?;
    check_timer_entries(&timer_log, &entries, &facts, clean, &mut checked)?;
    if let Some(wheel) = &wheel {
        checked.file_headers += 1;
        check_wheel(wheel, &entries, &mut checked)?;
    }
    let dispatched = newest.filter(|_| resume.resumes).map(|cp| cp.dispatched);
    check_queues(files, &log, &facts, dispatched, clean, &mut checked)?;
    if let Some((position, cp)) = checkpoint.newest() {
        let bad = |why: String| DumpError::bad_reference(&checkpoint.path, position, why);
        let log_end = facts.end.offset();
        for (name, value) in [("dispatched", cp.dispatched), ("delivery scan from", cp.delivery_scan_from)] {
            if value > log_end {
                return Err(bad(format!("{name} {value} lies past the end of the commit log at {log_end}")));
            }
        }
        if clean && cp.log_durable != log_end {
            return Err(bad(format!(
                "a clean close at log offset {} but the log ends at {log_end}",
                cp.log_durable
            )));
        }
        let timer_end = entries.len() as u64;
        if resume.resumes && cp.timer_log_end > timer_end {
            return Err(bad(format!(
                "timer-log end {} lies past the timer log's end {timer_end}",
                cp.timer_log_end
            )));
        }
    }
    Ok(checked)
}

fn check_checkpoint_file(files: &StoreFiles, checked: &mut Checked) -> Result<CheckpointFile> {
    let file = CheckpointFile::read(files)?;
    if !file.exists {
        return Err(DumpError::corruption(&file.path, 0, delaywheel::CorruptionKind::MissingFile));
    }
    if file.len != inspect::CHECKPOINT_FILE_LEN {
        let kind =
            delaywheel::CorruptionKind::WrongSize { expected: inspect::CHECKPOINT_FILE_LEN, found: file.len };
        return Err(DumpError::corruption(&file.path, 0, kind));
    }
    for (position, slot) in &file.slots {
        checked.checkpoint_slots += 1;
        if let CheckpointSlot::Invalid(kind) = slot {
            return Err(DumpError::corruption(&file.path, *position, kind.clone()));
        }
    }
    Ok(file)
}

/// Where the log ends: below `log durable` that is damage, as for the store.
fn check_log_end(log: &CommitLog, facts: &LogFacts, durable: u64, checked: &mut Checked) -> Result<()> {
    let c = facts.counts;
    (checked.messages, checked.timed_messages, checked.deliveries, checked.cancels) =
        (c.messages, c.timed, c.deliveries, c.cancels);
    checked.records = c.messages + c.deliveries + c.cancels;
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

/// Each delivery and cancel record names an earlier timed message record.
fn check_settling_records(log: &CommitLog, facts: &LogFacts) -> Result<()> {
    let named = |record: u64, message: u64, what: &str| -> Result<&crate::commitlog::MessageFacts> {
        let found = facts.timed(message).filter(|_| message < record);
        found.ok_or_else(|| {
            let (file, position) = log.locate(record);
            DumpError::bad_reference(
                file,
                position,
                format!("{what} names log offset {message}, not an earlier timed message record"),
            )
        })
    };
    for &(record, _, message) in &facts.deliveries {
        named(record, message, "delivery record")?;
    }
    for &(record, message, deliver_at) in &facts.cancels {
        let m = named(record, message, "cancel record")?;
        if m.deliver_at_ms != deliver_at {
            let (file, position) = log.locate(record);
            let why =
                format!("cancel record says deliver at {deliver_at}, the message says {}", m.deliver_at_ms);
            return Err(DumpError::bad_reference(file, position, why));
        }
    }
    Ok(())
}

/// Each timer-log entry names a timed message record due at the entry's time.
fn check_timer_entries(
    log: &TimerLog,
    entries: &[Option<inspect::TimerLogEntry>],
    facts: &LogFacts,
    clean: bool,
    checked: &mut Checked,
) -> Result<()> {
    for (index, entry) in entries.iter().enumerate() {
        let Some(e) = entry else { continue };
        checked.timer_log_entries += 1;
        if !clean && e.message_offset >= facts.end.offset() {
            checked.past_log_end += 1;
            continue;
        }
        let matches = facts.timed(e.message_offset).is_some_and(|m| m.deliver_at_ms == e.deliver_at_ms);
        if !matches {
            let (_, path, position) = log.locate(index as u64);
            let why = format!(
                "entry {index} names log offset {} due at {}, which is not a timed message record due then",
                e.message_offset, e.deliver_at_ms
            );
            return Err(DumpError::bad_reference(path, position, why));
        }
    }
    Ok(())
}

fn check_wheel(
    wheel: &WheelFile,
    entries: &[Option<inspect::TimerLogEntry>],
    checked: &mut Checked,
) -> Result<()> {
    for index in 0..inspect::WHEEL_TOTAL_SLOTS {
        checked.wheel_slots += 1;
        let Some(slot) = wheel.slot(index)? else { continue };
        checked.non_empty_slots += 1;
        let chain = chain(wheel, &slot, |i| Ok(entries.get(i as usize).copied().flatten()))?;
        checked.chain_entries += chain.len() as u64;
        for (entry, e) in chain {
            let second = e.deliver_at_ms / 1000;
            // Level 0 also takes timers that were due when indexed (in the newest loaded second).
            let fits = match slot.level {
                0 => second <= slot.slot.window,
                level => inspect::window_of(level, second) == slot.slot.window,
            };
            if !fits {
                let why = format!(
                    "its chain holds timer-log entry {entry}, due in second {second}, outside its window"
                );
                return Err(DumpError::bad_reference(&wheel.path, inspect::slot_position(index), why));
            }
        }
    }
    Ok(())
}

fn check_queues(
    files: &StoreFiles,
    log: &CommitLog,
    facts: &LogFacts,
    dispatched: Option<u64>,
    clean: bool,
    checked: &mut Checked,
) -> Result<()> {
    let deliveries: HashMap<u64, (u64, u64)> =
        facts.deliveries.iter().map(|&(at, when, m)| (at, (when, m))).collect();
    // Records that must be in a queue: ordinary messages and deliveries.
    let mut referenced: HashSet<u64> = HashSet::new();
    for q in &files.queues {
        let queue = ConsumeQueue::open(q)?;
        checked.consume_queues += 1;
        checked.file_headers += queue.file_count() as u64;
        let mut last = 0;
        queue.scan(|index, path, position, e| {
            checked.queue_entries += 1;
            let bad = |why: String| DumpError::bad_reference(path, position, format!("entry {index}: {why}"));
            if !clean && e.log_offset >= facts.end.offset() {
                checked.past_log_end += 1;
                return Ok(());
            }
            if e.log_offset <= last {
                return Err(bad(format!("log offset {} is not after the previous entry's {last}", e.log_offset)));
            }
            last = e.log_offset;
            if q.topic == delaywheel::SCHEDULE_TOPIC {
                return check_schedule_entry(facts, &e, bad);
            }
            // The message the entry makes visible, with the time it became visible.
            let (message, visible_ms, len) = if e.timer_delivery {
                let (when, m) = deliveries.get(&e.log_offset).copied().ok_or_else(|| bad(format!("log offset {} is not a delivery record", e.log_offset)))?;
                (facts.timed(m), when, inspect::DELIVERY_RECORD_LEN as u32)
            } else {
                let m = facts.messages.get(&e.log_offset).filter(|m| m.deliver_at_ms == 0);
                let m = m.ok_or_else(|| bad(format!("log offset {} is not an ordinary message record", e.log_offset)))?;
                (Some(m), m.store_time_ms, m.len)
            };
            let m = message.ok_or_else(|| bad("its delivery record names no timed message".into()))?;
            if facts.topic(m) != q.topic || m.queue_id != q.queue_id {
                return Err(bad(format!("the record belongs to {} queue {}", facts.topic(m), m.queue_id)));
            }
            if e.record_len != len || e.time_ms != visible_ms || e.tag_hash != m.tag_hash || e.flags & !1 != 0 {
                let why = format!(
                    "length {}, time {}, tag hash {:#x}, flags {} where the record says {len}, {visible_ms}, {:#x}, {}",
                    e.record_len, e.time_ms, e.tag_hash, e.flags, m.tag_hash, u32::from(e.timer_delivery)
                );
                return Err(bad(why));
            }
            if !referenced.insert(e.log_offset) {
                return Err(bad(format!("a second entry for the record at log offset {}", e.log_offset)));
            }
            Ok(())
        })?;
    }
    let Some(dispatched) = dispatched else { return Ok(()) };
    let mut needed: Vec<u64> =
        facts.messages.iter().filter(|(_, m)| m.deliver_at_ms == 0).map(|(&at, _)| at).collect();
    needed.extend(facts.deliveries.iter().map(|&(at, _, _)| at));
    needed.sort_unstable();
    if let Some(&missing) = needed.iter().find(|&&at| at < dispatched && !referenced.contains(&at)) {
        let (file, position) = log.locate(missing);
        let why =
            format!("below the checkpoint's dispatched {dispatched} but no consume-queue entry points at it");
        return Err(DumpError::bad_reference(file, position, why));
    }
    Ok(())
}

/// An entry of the bucket scheduler's level queues (`SCHEDULE_TOPIC_XXXX`):
/// it must point at a timed message, with that record's length and tag hash.
/// Its time is the level's due time, which needs the store's level table to
/// check, so it is only checked not to be before the message was stored.
fn check_schedule_entry(
    facts: &LogFacts,
    e: &inspect::QueueEntry,
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
