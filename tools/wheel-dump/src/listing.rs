//! The listings: `slots`, `slot T`, `log` (near or far timer log) and `checkpoint`.

use std::collections::HashMap;
use std::io::Write;

use delaywheel::internals::timer_entry::TimerEntry;
use delaywheel::internals::{geometry, slot};
use serde::Serialize;

use crate::commitlog::{CommitLog, LogFacts};
use crate::error::Result;
use crate::indexes::{
    CheckpointFile, CheckpointSlot, LogSide, PlacedSlot, TimerLog, TimerLogs, WheelFile, read_chain,
};
use crate::output::{SCHEMA_VERSION, Table, json_line, thousands};
use crate::relocated::Relocated;
use crate::store_files::StoreFiles;
use crate::summary::{CheckpointJson, render_checkpoint};
use crate::time::{utc_ms, utc_second};
use crate::wheel_view::{LiveChains, Resume};

/// How a listing is printed.
#[derive(Clone, Copy)]
pub enum Format {
    Text,
    JsonLines,
}

#[derive(Serialize)]
struct Header<'a> {
    schema_version: u32,
    listing: &'a str,
    /// The tick second live slots are judged by (`None`: no checkpoint the next open resumes from).
    tick_second: Option<u64>,
}

/// A listing as JSON lines: the header line, then one line per item.
fn json_lines(
    out: &mut impl Write,
    listing: &str,
    tick_second: Option<u64>,
    lines: &[impl Serialize],
) -> std::io::Result<()> {
    json_line(out, &Header { schema_version: SCHEMA_VERSION, listing, tick_second })?;
    lines.iter().try_for_each(|line| json_line(out, line))
}

// --------------------------------------------------------------------- slots

#[derive(Serialize)]
struct SlotLine {
    level: usize,
    slot: u64,
    /// Byte position of the slot record in `timer/wheel`.
    position: u64,
    window: u64,
    start_second: u64,
    start_utc: String,
    seconds: u64,
    count: u32,
    cancels: u32,
    live: bool,
}

/// The non-empty slots whose window overlaps `[from, to]` (epoch seconds),
/// ordered by window start, then level.
pub fn slots(
    files: &StoreFiles,
    from: Option<u64>,
    to: Option<u64>,
    format: Format,
    out: &mut impl Write,
) -> Result<()> {
    let resume = Resume::new(files, &CheckpointFile::read(files)?)?;
    let mut slots = Vec::new();
    if let Some(wheel) = WheelFile::read(files)? {
        for slot in wheel.slots() {
            let slot = slot?;
            let last = slot.start_second().saturating_add(slot.seconds() - 1);
            if slot.slot.count > 0
                && from.is_none_or(|f| last >= f)
                && to.is_none_or(|t| slot.start_second() <= t)
            {
                slots.push(slot);
            }
        }
    }
    slots.sort_by_key(|s| (s.start_second(), s.level));
    let lines: Vec<SlotLine> = slots.iter().map(|s| slot_line(s, resume.is_live(s))).collect();
    match format {
        Format::JsonLines => json_lines(out, "slots", resume.tick_second(), &lines)?,
        Format::Text => {
            let mut t = Table::new(&[
                "level",
                ">slot",
                ">window",
                ">start (epoch s)",
                "start (UTC)",
                ">seconds",
                ">count",
                ">cancels",
                "state",
            ]);
            for l in &lines {
                t.row(vec![
                    l.level.to_string(),
                    l.slot.to_string(),
                    l.window.to_string(),
                    l.start_second.to_string(),
                    l.start_utc.clone(),
                    thousands(l.seconds),
                    thousands(l.count.into()),
                    thousands(l.cancels.into()),
                    if l.live { "live" } else { "stale" }.into(),
                ]);
            }
            write!(out, "{}", t.render(0))?;
            let live = lines.iter().filter(|l| l.live).count();
            writeln!(out, "{} non-empty slots, {live} live{}", lines.len(), tick_note(&resume))?;
        }
    }
    Ok(())
}

fn slot_line(s: &PlacedSlot, live: bool) -> SlotLine {
    SlotLine {
        level: s.level,
        slot: s.index - geometry::slot_index(s.level, 0),
        position: slot::slot_position(s.index),
        window: s.slot.window,
        start_second: s.start_second(),
        start_utc: utc_second(s.start_second()),
        seconds: s.seconds(),
        count: s.slot.count,
        cancels: s.slot.cancels,
        live,
    }
}

fn tick_note(resume: &Resume) -> String {
    match resume.tick_second() {
        Some(tick) => {
            format!(" (live: not yet loaded at the checkpoint's tick second {tick}, {})", utc_second(tick))
        }
        None => " (no checkpoint to resume from: the next open rebuilds the wheel)".into(),
    }
}

// ---------------------------------------------------------------------- slot

#[derive(Serialize)]
struct EntryLine {
    level: usize,
    /// Index of the entry in the timer log of its level (level 0: the near
    /// log `timer/timerlog/`; levels 1 and 2: the far log `timer/timerlog-far/`).
    entry: u64,
    /// `timer`, or `cancel` for a cancel entry.
    kind: &'static str,
    deliver_at_ms: u64,
    deliver_at_utc: String,
    message_offset: u64,
    topic: Option<String>,
    delay_level: Option<u16>,
    /// pending, cancelled, delivered, cascaded (a stale coarse slot whose timers
    /// moved to finer slots), missed (a stale level-0 slot and no delivery
    /// record: a problem), retention-deleted (a stale level-0 slot, and the
    /// message lies below the oldest segment: its delivery record, if any,
    /// was deleted with its segment), rescheduled (a reschedule record
    /// replaced it by its own timer), or cancel-entry.
    state: String,
}

/// Every timer due in epoch second `second`: the whole chain of its level-0
/// slot (if that slot holds this second; it may also hold timers of earlier
/// seconds that were due when indexed), and the entries of this second in
/// the level-1 and level-2 slots whose windows hold it. A stale slot's chain
/// is listed as far as the timer log still holds it.
pub fn slot(files: &StoreFiles, second: u64, format: Format, out: &mut impl Write) -> Result<()> {
    let resume = Resume::new(files, &CheckpointFile::read(files)?)?;
    let wheel = WheelFile::read(files)?;
    let logs = TimerLogs::open(files)?;
    let mut chains = LiveChains::new(files, &resume);
    let mut notes = Vec::new();
    let commit_log = CommitLog::open(files)?;
    let mut facts = LogFacts::gather(&commit_log)?;
    // Relocated timers are known by their copies (leniently: `verify` checks them).
    let clean = resume.checkpoint.is_some_and(|(_, cp)| cp.clean);
    let relocated = Relocated::gather(files, &commit_log, &mut facts, clean, false)?;
    let mut delivered: HashMap<u64, u32> = HashMap::new();
    for &(_, _, message) in &facts.deliveries {
        *delivered.entry(message).or_default() += 1;
    }
    let mut cancelled: std::collections::HashSet<u64> = facts.cancels.iter().map(|&(_, m, _)| m).collect();
    cancelled.extend(relocated.cancel_copies.iter().map(|c| c.message_offset));
    let replaced: std::collections::HashSet<u64> = facts.reschedules.values().map(|r| r.from_timer).collect();
    let mut lines = Vec::new();
    if let Some(wheel) = wheel {
        for level in 0..geometry::LEVEL_COUNT {
            let window = geometry::window_of(level, second);
            let Some(slot) = wheel.slot(geometry::slot_index(level, window))? else { continue };
            if slot.slot.window != window {
                continue;
            }
            let live_chain = if resume.is_live(&slot) { chains.chain(&wheel, &slot, &logs)? } else { None };
            // Live (read whole), or stale: as far as the log holds it.
            let live = live_chain.is_some();
            let entries = match live_chain {
                Some(entries) => entries,
                None => {
                    let chain = read_chain(&wheel, &slot, &logs)?;
                    if let Some(at) = chain.deleted_from {
                        notes.push(format!(
                            "the stale level-{level} slot's chain goes on at entry {at} of {}, in a file deleted \
                             once no live chain reached it",
                            LogSide::of_level(level).name()
                        ));
                    }
                    chain.entries
                }
            };
            let in_chain_cancels: Vec<u64> =
                entries.iter().filter(|(_, e)| e.cancel).map(|(_, e)| e.message_offset).collect();
            for (index, e) in entries.iter().rev() {
                if level > 0 && e.deliver_at_ms / 1000 != second {
                    continue;
                }
                let state = if e.cancel {
                    "cancel-entry".to_string()
                } else if let Some(n) = delivered.get(&e.message_offset) {
                    if *n == 1 { "delivered".into() } else { format!("delivered x{n}") }
                } else if replaced.contains(&e.message_offset) {
                    // A reschedule record replaced it by its own timer (and
                    // took it out with a cancel entry, if its second was not loaded).
                    "rescheduled".into()
                } else if cancelled.contains(&e.message_offset)
                    || in_chain_cancels.contains(&e.message_offset)
                {
                    "cancelled".into()
                } else if live {
                    "pending".into()
                } else if level > 0 {
                    "cascaded".into()
                } else if e.message_offset < relocated.log_start {
                    // Its delivery record (if any) went with a deleted segment.
                    "retention-deleted".into()
                } else {
                    "missed".into()
                };
                // A rescheduled timer is named by its reschedule record, which names the message.
                let message = facts.timed(e.message_offset).or_else(|| {
                    facts.reschedules.get(&e.message_offset).and_then(|r| facts.timed(r.message_offset))
                });
                lines.push(EntryLine {
                    level,
                    entry: *index,
                    kind: if e.cancel { "cancel" } else { "timer" },
                    deliver_at_ms: e.deliver_at_ms,
                    deliver_at_utc: utc_ms(e.deliver_at_ms),
                    message_offset: e.message_offset,
                    topic: message.map(|m| facts.topic(m).to_string()),
                    delay_level: message.map(|m| m.delay_level),
                    state,
                });
            }
        }
    }
    match format {
        Format::JsonLines => json_lines(out, "slot", resume.tick_second(), &lines)?,
        Format::Text => {
            writeln!(out, "second {second}  {}", utc_second(second))?;
            let mut t = Table::new(&[
                "level",
                ">entry",
                "kind",
                ">deliver at (ms)",
                "deliver at (UTC)",
                ">message offset",
                "topic",
                ">delay level",
                "state",
            ]);
            for l in &lines {
                t.row(vec![
                    l.level.to_string(),
                    l.entry.to_string(),
                    l.kind.into(),
                    l.deliver_at_ms.to_string(),
                    l.deliver_at_utc.clone(),
                    l.message_offset.to_string(),
                    l.topic.clone().unwrap_or_else(|| "?".into()),
                    l.delay_level.map_or("?".into(), |d| d.to_string()),
                    l.state.clone(),
                ]);
            }
            write!(out, "{}", t.render(0))?;
            writeln!(out, "{} entries", lines.len())?;
            for note in &notes {
                writeln!(out, "note: {note}")?;
            }
        }
    }
    Ok(())
}

// ----------------------------------------------------------------------- log

#[derive(Serialize)]
struct LogLine {
    index: u64,
    kind: &'static str,
    message_offset: u64,
    deliver_at_ms: u64,
    deliver_at_utc: String,
    /// The previous entry of the same slot, `0` = none.
    prev: u64,
}

/// Entries of the near timer log (or with `far` the far one) in order from
/// index `from`, streamed.
pub fn log(files: &StoreFiles, from: u64, far: bool, format: Format, out: &mut impl Write) -> Result<()> {
    let side = if far { LogSide::Far } else { LogSide::Near };
    let log = TimerLog::open(files, side)?;
    // The store deletes a log's oldest files: the listing starts at the first entry on disk.
    let first = log.first().unwrap_or(1);
    let line = |index, e: TimerEntry| LogLine {
        index,
        kind: if e.cancel { "cancel" } else { "timer" },
        message_offset: e.message_offset,
        deliver_at_ms: e.deliver_at_ms,
        deliver_at_utc: utc_ms(e.deliver_at_ms),
        prev: e.prev,
    };
    match format {
        Format::JsonLines => {
            #[derive(Serialize)]
            struct LogHeader {
                schema_version: u32,
                listing: &'static str,
                from: u64,
            }
            let listing = if far { "far-log" } else { "log" };
            json_line(
                out,
                &LogHeader { schema_version: SCHEMA_VERSION, listing, from: from.max(1).max(first) },
            )?;
            log.scan(from, |index, e| Ok(json_line(out, &line(index, e))?))?;
        }
        Format::Text => {
            if from.max(1) < first {
                writeln!(
                    out,
                    "entries below {first} were in files deleted once no live chain reached them: from {first}"
                )?;
            }
            // Columns have fixed widths so the listing can stream.
            writeln!(
                out,
                "{:>10}  {:<6}  {:>16}  {:>15}  {:<24}  {:>10}",
                "index", "kind", "message offset", "deliver at (ms)", "deliver at (UTC)", "prev"
            )?;
            let end = log.scan(from, |index, e| {
                let l = line(index, e);
                writeln!(
                    out,
                    "{:>10}  {:<6}  {:>16}  {:>15}  {:<24}  {:>10}",
                    l.index, l.kind, l.message_offset, l.deliver_at_ms, l.deliver_at_utc, l.prev
                )?;
                Ok(())
            })?;
            match side {
                LogSide::Near => writeln!(out, "end of the timer log at index {end}")?,
                LogSide::Far => writeln!(out, "end of the far timer log ({}) at index {end}", side.name())?,
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- checkpoint

#[derive(Serialize)]
struct CheckpointDoc {
    schema_version: u32,
    path: String,
    exists: bool,
    bytes: u64,
    slots: Vec<SlotDoc>,
    /// Byte position of the newest valid slot, if any.
    newest: Option<u64>,
    /// Byte position of the slot a store would trust and use (by the
    /// library's rule: the newest that nothing contradicts and whose
    /// `dispatched` the log's records lead to), if any.
    trusted: Option<u64>,
}

#[derive(Serialize)]
struct SlotDoc {
    position: u64,
    /// `valid`, `empty` or `invalid`.
    state: &'static str,
    problem: Option<String>,
    checkpoint: Option<CheckpointJson>,
}

/// Both checkpoint slots, every field, and which one a store would use.
pub fn checkpoint(files: &StoreFiles, json: bool, out: &mut impl Write) -> Result<()> {
    let file = CheckpointFile::read(files)?;
    let newest = file.newest().map(|(position, _)| position);
    let trusted = file.trusted(&CommitLog::open(files)?)?.map(|(position, _)| position);
    let slots: Vec<SlotDoc> = file
        .slots
        .iter()
        .map(|(position, slot)| {
            let (state, problem, checkpoint) = match slot {
                CheckpointSlot::Empty => ("empty", None, None),
                CheckpointSlot::Valid(cp) => ("valid", None, Some(CheckpointJson::new(*position, cp))),
                CheckpointSlot::Invalid(kind) => ("invalid", Some(kind.to_string()), None),
            };
            SlotDoc { position: *position, state, problem, checkpoint }
        })
        .collect();
    let doc = CheckpointDoc {
        schema_version: SCHEMA_VERSION,
        path: files.relative(&file.path),
        exists: file.exists,
        bytes: file.len,
        slots,
        newest,
        trusted,
    };
    if json {
        return Ok(json_line(out, &doc)?);
    }
    if !doc.exists {
        writeln!(out, "{}: missing (the next open writes a new one and rebuilds every index)", doc.path)?;
        return Ok(());
    }
    writeln!(out, "{}  {} bytes", doc.path, thousands(doc.bytes))?;
    for slot in &doc.slots {
        let mark = match (Some(slot.position) == doc.trusted, Some(slot.position) == doc.newest) {
            (true, _) => "  (trusted: the one a store uses)",
            (false, true) => "  (newest valid, not trusted: a store passes it over)",
            (false, false) => "",
        };
        writeln!(out, "\nslot at {}: {}{mark}", slot.position, slot.state)?;
        if let Some(problem) = &slot.problem {
            writeln!(out, "  {problem}")?;
        }
        if let Some(cp) = &slot.checkpoint {
            write!(out, "{}", render_checkpoint(cp))?;
        }
    }
    if doc.trusted.is_none() {
        writeln!(out, "\nno slot a store trusts: the next open rebuilds every index from the commit log")?;
    }
    Ok(())
}
