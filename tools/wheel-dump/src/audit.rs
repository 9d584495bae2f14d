//! `audit`: the fate of every timed message in the commit log.
//!
//! For each message record with a deliver time, in this order:
//! * **delivered**: at least one delivery record names it; more than one
//!   makes it **duplicated**, one whose delivered-at is before the deliver
//!   time makes it **early**;
//! * **cancelled**: a cancel record names it (or a cancel entry in a live slot does);
//! * a **rescheduled** message (one or more reschedule records name it) is
//!   judged by its timers: the message's own and each reschedule record's
//!   (named by the record's offset); the last one is the timer that counts
//!   for cancelled and pending, deliveries of any of them count together for
//!   delivered and duplicated, each is early against its own deliver time,
//!   and a delivery of a replaced timer (the message fired at an old time)
//!   counts as **fired after reschedule**;
//! * **pending**: the store will still deliver it: its timer is in a live
//!   wheel slot (see `wheel_view`; level-0 chains are read from the near
//!   timer log, level-1 and level-2 chains from the far one), or its record
//!   lies at or after the checkpoint's `dispatched` offset, so the next open
//!   replays it into the wheel (with no checkpoint to resume from, the next
//!   open rebuilds the wheel from the whole log, and every unsettled timer
//!   is pending);
//! * **lost**: none of these, and due more than [`GRACE_MS`] before the
//!   reference time: the latest time written in the commit log (the newest
//!   store, delivery or cancel time), so the answer depends on the store
//!   alone, not on when the audit runs;
//! * otherwise **unsettled**: not accounted for but not overdue yet (the
//!   human output lists them; a healthy store has none).
//!
//! A store with retention: messages whose segments were deleted are not in
//! the audit, except the timers relocated with them (`commitlog/relocated/`),
//! which are audited like the others by the delivery and cancel records of
//! the retained log (relocated cancels count as cancel records). Such a timer
//! that is neither delivered, cancelled nor pending, and was due before the
//! time of the oldest retained record (give or take [`GRACE_MS`]: a record's
//! time is read from the clock before it is appended, so a put racing a
//! delivery may carry an earlier time than the delivery record before it),
//! fired and its delivery record was deleted with its segment:
//! **reclaimed**, not lost. The store rebuilding
//! its wheel (no checkpoint to resume from) indexes only the copies due at or
//! after the checkpoint's tick second, so only those are pending then.
//! Two delivery records naming a message retention deleted still make a
//! duplicate.
//!
//! A timer indexed twice (replay after a crash, or a cascade that copied it
//! to a finer slot) is still one message: duplicates are counted only from
//! delivery records.

use std::collections::HashMap;

use delaywheel::internals::{MISSED_AFTER_MS, PAUSED_AT_MS};
use serde::Serialize;

use crate::commitlog::{CommitLog, LogEnd, LogFacts};
use crate::error::{DumpError, Result};
use crate::indexes::{CheckpointFile, TimerLogs, WheelFile};
use crate::output::{SCHEMA_VERSION, Table, thousands};
use crate::relocated::{CopyKind, Relocated};
use crate::store_files::StoreFiles;
use crate::time::utc_ms;
use crate::wheel_view::{Membership, Resume};

/// How long past its deliver time an undelivered timer counts as lost.
pub const GRACE_MS: u64 = 60_000;

/// The `--json` document: exactly these keys.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct AuditCounts {
    pub schema_version: u32,
    pub timer_messages: u64,
    pub delivered: u64,
    pub cancelled: u64,
    pub pending: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub early: u64,
    /// Relocated timers that fired and whose delivery record retention deleted.
    pub reclaimed: u64,
    /// Damaged stretches of the commit log the audit could not read (the
    /// store skips them too): the timers in them cannot be accounted for.
    pub unreadable_log_stretches: u64,
    /// Their bytes.
    pub unreadable_log_bytes: u64,
    /// Timer messages with at least one reschedule record.
    pub rescheduled: u64,
    /// Rescheduled messages delivered by a timer a reschedule had replaced.
    pub fired_after_reschedule: u64,
    /// Recurring schedules (of the timer messages): each of their timers
    /// delivers an occurrence, and a schedule's fate is its last timer's.
    pub schedules: u64,
    /// Occurrences the schedules delivered.
    pub occurrences_delivered: u64,
    /// Deliveries of an occurrence after its first.
    pub occurrences_duplicated: u64,
    /// Occurrences delivered before their instant.
    pub occurrences_early: u64,
    /// Occurrences due before the store's last close never delivered where
    /// the missed-run policy does not excuse it: skipped though on time, or
    /// a schedule's armed timer overdue, not delivered, cancelled or pending.
    pub occurrences_missing: u64,
}

impl AuditCounts {
    pub fn failed(&self) -> bool {
        self.lost > 0
            || self.duplicated > 0
            || self.early > 0
            || self.fired_after_reschedule > 0
            || self.unreadable_log_stretches > 0
            || self.occurrences_missing > 0
    }
}

/// The counts and the details people need to follow a problem up.
pub struct Audit {
    pub counts: AuditCounts,
    pub reference_ms: u64,
    /// Pending because the next open replays their records (not yet in a live slot).
    pub pending_by_replay: u64,
    pub unsettled: Vec<Example>,
    pub lost: Vec<Example>,
    pub duplicated: Vec<Example>,
    pub fired_after_reschedule: Vec<Example>,
    pub early: Vec<Example>,
    /// Both delivered and cancelled (the store writes one or the other).
    pub delivered_and_cancelled: Vec<Example>,
    /// Why the wheel was not used, if it could not be read.
    pub wheel_note: Option<String>,
    /// The oldest segment's start offset: records below it were deleted by retention.
    pub log_start: u64,
    /// Timer messages known by their relocated copies (their segments were deleted).
    pub relocated_timers: u64,
    /// Of those, pending.
    pub relocated_pending: u64,
    /// Relocation index entries whose window file was deleted (not audited).
    pub window_deleted: u64,
    /// Relocation index entries or copies that do not check out (not audited; `verify` names them).
    pub damaged_copies: u64,
    /// The pending timers: their messages' offsets, ascending, and when each is due now.
    pub pending: Vec<(u64, u64)>,
    /// The unreadable stretches of the log, each named by file and position.
    pub unreadable: Vec<String>,
}

/// One message worth naming.
pub struct Example {
    pub offset: u64,
    pub topic: String,
    pub deliver_at_ms: u64,
    pub note: String,
}

/// How many messages each problem list names in the text output.
const EXAMPLES: usize = 10;

pub fn audit(files: &StoreFiles) -> Result<Audit> {
    audit_with_facts(files, false).map(|(audit, _)| audit)
}

/// [`audit`], also answering what the commit log says of each message (with
/// the timed messages' keys if `keep_keys`).
pub fn audit_with_facts(files: &StoreFiles, keep_keys: bool) -> Result<(Audit, LogFacts)> {
    let marker = files.dir.join("schedule");
    if marker.exists() {
        return Err(DumpError::BucketStore { dir: files.dir.clone(), marker });
    }
    let checkpoint = CheckpointFile::read(files)?;
    let resume = Resume::new(files, &checkpoint)?;
    let durable = resume.checkpoint.map_or(0, |(_, cp)| cp.log_durable);
    let log = CommitLog::open(files)?.with_durable(durable);
    let mut facts = if keep_keys { LogFacts::gather_with_keys(&log)? } else { LogFacts::gather(&log)? };
    let clean = resume.checkpoint.is_some_and(|(_, cp)| cp.clean);
    let relocated = Relocated::gather(files, &log, &mut facts, clean, false)?;
    let log_start = relocated.log_start;
    let mut deliveries: HashMap<u64, Vec<u64>> = HashMap::new();
    for &(_, delivered_at, message) in &facts.deliveries {
        deliveries.entry(message).or_default().push(delivered_at);
    }
    let mut cancelled: std::collections::HashSet<u64> = facts.cancels.iter().map(|&(_, m, _)| m).collect();
    cancelled.extend(relocated.cancel_copies.iter().map(|c| c.message_offset));
    let (membership, wheel_note) = wheel_membership(files, &resume);
    // Records the next open replays into the wheel.
    let replay_from = resume.checkpoint.filter(|_| resume.resumes).map_or(0, |(_, cp)| cp.dispatched);
    // A wheel built afresh gets the relocated timers due from the checkpoint's tick second on.
    let restored_from_ms = resume.checkpoint.map_or(0, |(_, cp)| cp.tick_second.saturating_mul(1000));
    // A relocated timer due before this with no delivery record fired long
    // ago: its delivery record went with a deleted segment.
    let oldest_time_ms = facts.oldest_time_ms.unwrap_or(facts.newest_time_ms);

    let mut timed: Vec<(&u64, &crate::commitlog::MessageFacts)> =
        facts.messages.iter().filter(|(_, m)| m.deliver_at_ms != 0).collect();
    timed.sort_unstable_by_key(|(offset, _)| **offset);
    let mut a = Audit {
        counts: AuditCounts { schema_version: SCHEMA_VERSION, ..Default::default() },
        reference_ms: facts.newest_time_ms,
        pending_by_replay: 0,
        unsettled: Vec::new(),
        lost: Vec::new(),
        duplicated: Vec::new(),
        fired_after_reschedule: Vec::new(),
        early: Vec::new(),
        delivered_and_cancelled: Vec::new(),
        wheel_note,
        log_start,
        relocated_timers: 0,
        relocated_pending: 0,
        window_deleted: relocated.window_deleted,
        damaged_copies: relocated.damaged,
        pending: Vec::new(),
        unreadable: Vec::new(),
    };
    note_unreadable(&mut a, &facts, durable);
    // Each rescheduled message's timers after its own: (record offset, deliver time), in log order.
    let mut reschedules: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    for (&record, r) in &facts.reschedules {
        reschedules.entry(r.message_offset).or_default().push((record, r.deliver_at_ms));
    }
    // Schedules' timers an occurrence record moved on without delivering
    // them: timer → whether that is excused (a missed occurrence the policy
    // skipped, more than a slot late; a pause; a resume).
    let skipped: HashMap<u64, bool> = facts
        .reschedules
        .values()
        .filter(|r| r.occurrence.is_some_and(|o| !o.delivers))
        .map(|r| {
            let late = r.rescheduled_at_ms.saturating_sub(r.from_deliver_at_ms) > MISSED_AFTER_MS;
            let pause = r.deliver_at_ms == PAUSED_AT_MS || r.from_deliver_at_ms == PAUSED_AT_MS;
            (r.from_timer, late || pause)
        })
        .collect();
    for (&offset, m) in timed {
        a.counts.timer_messages += 1;
        let is_relocated = offset < log_start;
        a.relocated_timers += u64::from(is_relocated);
        // The message's timers, its own first: the last one is the one that counts.
        let mut timers = vec![(offset, m.deliver_at_ms)];
        timers.extend(reschedules.get(&offset).into_iter().flatten().copied());
        a.counts.rescheduled += u64::from(timers.len() > 1 && !m.schedule);
        let (current, due) = *timers.last().expect("the message's own timer");
        let example =
            |note: String| Example { offset, topic: facts.topic(m).to_string(), deliver_at_ms: due, note };
        let fired_by = |timers: &[(u64, u64)]| -> Vec<(u64, u64, u64)> {
            timers
                .iter()
                .flat_map(|&(timer, due)| {
                    deliveries.get(&timer).into_iter().flatten().map(move |&t| (timer, due, t))
                })
                .collect()
        };
        if m.schedule {
            audit_occurrences(&mut a.counts, &timers, &deliveries, &skipped);
        }
        // A schedule's earlier timers were judged above.
        let fired = if m.schedule { fired_by(&timers[timers.len() - 1..]) } else { fired_by(&timers) };
        if !fired.is_empty() {
            a.counts.delivered += 1;
            if fired.len() > 1 && !m.schedule {
                a.counts.duplicated += 1;
                a.duplicated.push(example(format!("{} delivery records", fired.len())));
            }
            if let Some(&(_, due, first_early)) = fired.iter().find(|&&(_, due, t)| t < due && !m.schedule) {
                a.counts.early += 1;
                a.early.push(example(format!(
                    "delivered at {} ({} ms early)",
                    utc_ms(first_early),
                    due - first_early
                )));
            }
            if fired.iter().any(|&(timer, _, _)| timer != current) {
                a.counts.fired_after_reschedule += 1;
                a.fired_after_reschedule.push(example("delivered by a timer a reschedule replaced".into()));
            }
            if cancelled.contains(&current) {
                a.delivered_and_cancelled.push(example("a delivery and a cancel record".into()));
            }
        } else if cancelled.contains(&current)
            || membership.as_ref().is_some_and(|w| w.cancel_entries.contains(&current))
        {
            a.counts.cancelled += 1;
        } else if current >= log_start && current >= replay_from {
            a.counts.pending += 1;
            a.pending_by_replay += 1;
            a.pending.push((offset, due));
        } else if match &membership {
            Some(w) => w.pending(current),
            // Without a readable wheel the store rebuilds it from the log at the next open.
            None => current >= log_start || due >= restored_from_ms,
        } {
            a.counts.pending += 1;
            a.relocated_pending += u64::from(is_relocated);
            a.pending.push((offset, due));
        } else if is_relocated && due < oldest_time_ms.saturating_add(GRACE_MS) {
            a.counts.reclaimed += 1;
        } else if due.saturating_add(GRACE_MS) < a.reference_ms {
            a.counts.occurrences_missing += u64::from(m.schedule);
            a.counts.lost += 1;
            a.lost.push(example("not delivered, not cancelled, in no live slot".into()));
        } else {
            a.unsettled.push(example("in no live slot, not overdue yet".into()));
        }
    }
    // Deliveries of messages retention deleted (no readable copy): not timer
    // messages of the audit, but a second delivery is still a duplicate.
    let mut deleted: Vec<(&u64, &Vec<u64>)> = deliveries
        .iter()
        .filter(|(offset, times)| {
            times.len() > 1
                && **offset < log_start
                && !matches!(relocated.by_offset.get(offset), Some(CopyKind::Timer))
        })
        .collect();
    deleted.sort_unstable();
    for (&offset, times) in deleted {
        a.counts.duplicated += 1;
        a.duplicated.push(Example {
            offset,
            topic: "?".into(),
            deliver_at_ms: 0,
            note: format!("{} delivery records of a message retention deleted", times.len()),
        });
    }
    Ok((a, facts))
}

/// A schedule's timers (its own first, then each occurrence record's, in
/// log order): each one but the last fired when the next was armed, so it
/// delivered its occurrence once, never early, or was skipped as missed
/// (more than a slot late: the policy's call), paused or resumed. The last decides the
/// schedule's fate, as a timer message's does.
fn audit_occurrences(
    counts: &mut AuditCounts,
    timers: &[(u64, u64)],
    deliveries: &HashMap<u64, Vec<u64>>,
    skipped: &HashMap<u64, bool>,
) {
    counts.schedules += 1;
    let (mut duplicated, mut early) = (false, false);
    for (i, &(timer, due)) in timers.iter().enumerate() {
        let times = deliveries.get(&timer).map_or(&[][..], Vec::as_slice);
        counts.occurrences_delivered += times.len() as u64;
        counts.occurrences_duplicated += times.len().saturating_sub(1) as u64;
        let early_here = times.iter().filter(|&&t| t < due).count() as u64;
        counts.occurrences_early += early_here;
        duplicated |= times.len() > 1;
        early |= early_here > 0;
        let replaced = i + 1 < timers.len();
        let excused = skipped.get(&timer).copied().unwrap_or(false);
        if replaced && times.is_empty() && !excused {
            counts.occurrences_missing += 1;
        }
    }
    counts.duplicated += u64::from(duplicated);
    counts.early += u64::from(early);
}

/// The stretches of the log the scan stepped over, and a log that ends in
/// damage below the checkpoint's `log durable` (nothing readable after it).
fn note_unreadable(a: &mut Audit, facts: &LogFacts, durable: u64) {
    for d in &facts.damaged {
        a.counts.unreadable_log_bytes += d.len;
        a.unreadable.push(format!(
            "{} at offset {}: {} bytes ({})",
            d.file.display(),
            d.position,
            d.len,
            d.kind
        ));
    }
    if let LogEnd::Invalid { offset, file, position, kind } = &facts.end
        && *offset < durable
    {
        a.counts.unreadable_log_bytes += durable - offset;
        a.unreadable.push(format!(
            "{} at offset {position}: {} bytes to the checkpoint's log durable ({kind})",
            file.display(),
            durable - offset
        ));
    }
    a.counts.unreadable_log_stretches = a.unreadable.len() as u64;
}

/// Which timers the live slots hold; `None` (with why) if the next open
/// rebuilds the wheel anyway: no wheel, no checkpoint to resume from, or a
/// wheel that does not check out (the store then rebuilds it from the log).
fn wheel_membership(files: &StoreFiles, resume: &Resume) -> (Option<Membership>, Option<String>) {
    if !resume.resumes {
        return (
            None,
            Some("no checkpoint to resume from: the next open rebuilds the wheel from the log".into()),
        );
    }
    let read = || -> Result<Option<Membership>> {
        let Some(wheel) = WheelFile::read(files)? else { return Ok(None) };
        let logs = TimerLogs::open(files)?.load([u64::MAX; 2])?;
        Ok(Some(Membership::of(files, &wheel, &logs, resume)?))
    };
    match read() {
        Ok(Some(m)) => (Some(m), None),
        Ok(None) => (None, Some("no wheel file: the next open rebuilds it from the log".into())),
        Err(e) => (
            None,
            Some(format!("the wheel does not check out ({e}): the next open rebuilds it from the log")),
        ),
    }
}

impl Audit {
    pub fn render(&self) -> String {
        let c = &self.counts;
        let mut t = Table::new(&["timed messages", ">count"]);
        for (name, n) in [
            ("timer messages", c.timer_messages),
            ("delivered", c.delivered),
            ("cancelled", c.cancelled),
            ("pending", c.pending),
            ("  of which awaiting replay", self.pending_by_replay),
            ("lost", c.lost),
            ("duplicated", c.duplicated),
            ("early", c.early),
            ("unsettled, not overdue", self.unsettled.len() as u64),
        ] {
            t.row(vec![name.into(), thousands(n)]);
        }
        if c.rescheduled > 0 || c.fired_after_reschedule > 0 {
            for (name, n) in [
                ("rescheduled (among the above)", c.rescheduled),
                ("fired after reschedule", c.fired_after_reschedule),
            ] {
                t.row(vec![name.into(), thousands(n)]);
            }
        }
        if c.schedules > 0 {
            for (name, n) in [
                ("recurring schedules (among the above)", c.schedules),
                ("  occurrences delivered", c.occurrences_delivered),
                ("  occurrences duplicated", c.occurrences_duplicated),
                ("  occurrences early", c.occurrences_early),
                ("  occurrences missing", c.occurrences_missing),
            ] {
                t.row(vec![name.into(), thousands(n)]);
            }
        }
        let retention = self.log_start > 0 || self.relocated_timers > 0 || c.reclaimed > 0;
        if retention {
            for (name, n) in [
                ("reclaimed (fired, record deleted)", c.reclaimed),
                ("relocated timers (among the above)", self.relocated_timers),
                ("  of which pending", self.relocated_pending),
            ] {
                t.row(vec![name.into(), thousands(n)]);
            }
        }
        let mut out = t.render(0);
        out += &format!(
            "reference time {} (the latest time in the commit log); lost = due over {} s before it\n",
            utc_ms(self.reference_ms),
            GRACE_MS / 1000
        );
        if let Some(note) = &self.wheel_note {
            out += &format!("note: {note}\n");
        }
        if self.log_start > 0 {
            out += &format!(
                "note: retention deleted the segments below log offset {}: messages whose records went with \
                 them are not audited, except the {} timers relocated before their segment was deleted\n",
                self.log_start, self.relocated_timers
            );
        }
        if self.window_deleted > 0 {
            out += &format!(
                "note: {} relocated copies are gone with their window file (their window passed, their timers \
                 were due long ago): not audited\n",
                self.window_deleted
            );
        }
        if !self.unreadable.is_empty() {
            out += &format!(
                "\nunreadable: {} damaged stretches of the commit log ({} bytes); the timers in them cannot \
                 be accounted for (the store skips them: they are lost)\n",
                self.unreadable.len(),
                thousands(c.unreadable_log_bytes)
            );
            for line in self.unreadable.iter().take(EXAMPLES) {
                out += &format!("  {line}\n");
            }
        }
        if self.damaged_copies > 0 {
            out += &format!(
                "note: {} relocation index entries or copies do not check out and are left out: run verify\n",
                self.damaged_copies
            );
        }
        for (what, list) in [
            ("lost", &self.lost),
            ("duplicated", &self.duplicated),
            ("early", &self.early),
            ("fired after reschedule", &self.fired_after_reschedule),
            ("delivered and cancelled", &self.delivered_and_cancelled),
            ("unsettled", &self.unsettled),
        ] {
            if list.is_empty() {
                continue;
            }
            out += &format!("\n{what} ({}; the first {} shown)\n", list.len(), list.len().min(EXAMPLES));
            let mut t = Table::new(&[">message offset", "topic", "deliver at (UTC)", "what"]);
            for e in list.iter().take(EXAMPLES) {
                let due = if e.deliver_at_ms == 0 { "?".to_string() } else { utc_ms(e.deliver_at_ms) };
                t.row(vec![e.offset.to_string(), e.topic.clone(), due, e.note.clone()]);
            }
            out += &t.render(2);
        }
        out += if c.failed() { "\nAUDIT FAILED\n" } else { "\naudit ok\n" };
        out
    }
}
