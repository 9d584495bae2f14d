//! The wheel's side of recovery: one contract, [`restart_wheel`], that the
//! store's recovery calls once the commit log is recovered.
//!
//! The commit log says what happened since the checkpoint: its delivery,
//! cancel and reschedule records settle timers (they must not fire again:
//! a reschedule record settles the timer it replaces), and the
//! dispatcher's replay of the records after the checkpoint sends their
//! timers again. A wheel resumed at the checkpoint may already hold some of
//! those (indexed after it was written, or moved by a cascade it redoes), so
//! each such insert is excused once; a timer indexed twice anyway (a late
//! timer sits in the slot of a later second) is handed out once. A wheel that
//! cannot be resumed (no trusted checkpoint, or chains a power loss tore) is
//! rebuilt from the oldest segment, plus the relocated timers retention
//! copied out of deleted ones.

use std::ops::Range;
use std::path::Path;

use crate::commitlog::CommitLog;
use crate::error::{Error, Result};
use crate::format::checkpoint::Checkpoint;
use crate::format::record::{
    CancelView, DeliveriesView, DeliveryView, MessageView, OccurrencesView, RecordKind, RescheduleView,
    check_crc,
};
use crate::schedule::replaced_by;
use crate::timer::Timer;
use crate::timer::geometry::{LEVELS, slot_index, timer_log_of};
use crate::timer::ledger::LedgerEntry;
use crate::timer::log::TimerLog;
use crate::timer::state::restart::{Resume, Settled};
use crate::timer::state::slots::SlotCount;
use crate::timer::wheel::Wheel;

/// The first entry from `from` on that a restart cannot keep: unwritten,
/// failing its checksum, or naming a record at or past `log_end`; the log's
/// end if there is none.
fn first_doubtful(log: &TimerLog, from: u64, log_end: u64) -> u64 {
    let kept = |index: &u64| matches!(log.read(*index), Ok(Some(e)) if e.message_offset < log_end);
    (from.max(log.first())..log.end()).find(|i| !kept(i)).unwrap_or(log.end())
}

impl Wheel {
    /// After a resume, notes the timers held in entries past `ends` (the
    /// timer logs' ends when the wheel had received every timer below the
    /// replay start, from the checkpoint) in slots this wheel will still load
    /// or cascade. The replay sends those timers again, and a cascade redone
    /// since the checkpoint moves some again: each such insert is skipped as
    /// often as the timer has such entries, so no timer is held twice (and
    /// counted twice as pending). Reads only the entries past `ends`.
    ///
    /// A power loss can keep a timer-log page and lose the wheel page that
    /// linked its entries, or the commit-log records they name, or keep a
    /// later page and lose an earlier one. So the entries past `ends` are
    /// read first, up to the first one this restart cannot keep: unwritten,
    /// torn, or naming a record at or past `log_end` (the recovered end of
    /// the commit log; a later put could land on the offset it names). If no
    /// live chain reaches that far the log is cut there (those entries are in
    /// no chain; the replay indexes their records again). Returns `false` if
    /// a live chain does reach it, or holds a cancel whose cancel record is
    /// not in the recovered log: the wheel must be rebuilt from the log.
    pub fn note_preindexed(&mut self, ends: [u64; 2], log_end: u64) -> Result<bool> {
        let _span = tracing::info_span!("note_preindexed", near_from = ends[0], far_from = ends[1]).entered();
        let keep = [0, 1].map(|i| first_doubtful(&self.logs[i], ends[i], log_end));
        let mut offsets = Vec::new();
        for (level, l) in LEVELS.iter().enumerate() {
            let no = timer_log_of(level);
            let (log, end) = (&self.logs[no], ends[no]);
            for i in 0..l.slots {
                let index = slot_index(level, i);
                let SlotCount { window, count, .. } = self.slot_counts.get(index);
                if count == 0 || !self.is_live(level, window) {
                    continue;
                }
                let mut at = self.read_slot(index)?.head;
                while at != 0 && at >= end {
                    if at >= keep[no] {
                        tracing::warn!(file = %log.dir().display(), level, window, entry = at, kept_below = keep[no],
                            "a live chain reaches a timer-log entry a power loss left in doubt");
                        return Ok(false);
                    }
                    let entry = log.read_linked(at)?;
                    if entry.cancel && !self.restart.cancelled_before(entry.message_offset) {
                        tracing::warn!(file = %log.dir().display(), entry = at, message = entry.message_offset,
                            "a live chain holds a cancel whose record a power loss took");
                        return Ok(false);
                    }
                    // A late timer sits in the slot of a later second (see
                    // `insert`), where a cancel would not find it: the replay
                    // indexes it again, and the copy that comes up second is dropped.
                    let late = level == 0 && entry.deliver_at_ms / 1000 != window;
                    if !entry.cancel && !late {
                        offsets.push((entry.message_offset, level));
                    }
                    at = entry.prev;
                }
            }
        }
        for (log, keep) in self.logs.iter_mut().zip(keep) {
            if keep < log.end() {
                tracing::warn!(file = %log.dir().display(), cut_from = keep, entries = log.end() - keep,
                    "timer-log entries in no chain cut: a power loss left them in doubt");
                log.cut_to(keep)?;
            }
        }
        tracing::info!(timers = offsets.len(), "timers indexed after the checkpoint found in the wheel");
        self.restart.set_preindexed(offsets);
        self.restart.set_replay_start_ends(ends);
        Ok(true)
    }

    /// Declares the commit-log range the dispatcher replays after this open.
    pub(super) fn set_replay_range(&mut self, range: Range<u64>) {
        self.restart.set_replay_range(range);
    }

    /// The timer logs' ends that go with the replay start of this open: what
    /// the checkpoint records until the first progress after it.
    pub fn replay_start_ends(&self) -> [u64; 2] {
        self.restart.replay_start_ends()
    }

    /// Whether every slot still holding timers starts a chain that exists:
    /// its head entry is below the timer log's end and passes its checksum.
    /// After a power loss the wheel file may be newer than the timer log; a
    /// broken chain cannot be followed, so the caller rebuilds the wheel.
    pub(super) fn chains_intact(&self) -> bool {
        LEVELS.iter().enumerate().all(|(level, l)| {
            (0..l.slots).all(|i| match self.read_slot(slot_index(level, i)) {
                Ok(slot) if slot.count == 0 || !self.is_live(level, slot.window) => true,
                Ok(slot) => {
                    let log = &self.logs[timer_log_of(level)];
                    slot.head != 0 && slot.head < log.end() && log.read_linked(slot.head).is_ok()
                }
                Err(_) => false,
            })
        })
    }

    /// Whether the wheel, resumed at `cp`, can be trusted: every live chain
    /// starts with an entry that exists, and no entry written after the
    /// checkpoint names a record at or past `log_end` (see
    /// [`note_preindexed`](Self::note_preindexed), which this runs). A
    /// damaged entry there counts as untrusted too.
    fn resumable(&mut self, cp: &Checkpoint, log_end: u64) -> bool {
        if !self.chains_intact() {
            tracing::warn!("a live wheel slot's chain does not start with an entry that exists");
            return false;
        }
        // A checkpoint of a build that did not record the far log's end
        // (0): every far entry may be of the replay.
        let ends = [cp.timer_log_end, cp.far_timer_log_end.max(1)];
        match self.note_preindexed(ends, log_end) {
            Ok(ahead_checked) => ahead_checked,
            Err(e) => {
                tracing::warn!(error = %e, "a timer-log entry written after the checkpoint is damaged");
                false
            }
        }
    }

    /// Enters the cancel and reschedule records recovery read into the
    /// ledger (after any relocated ones: the ledger is in log order).
    fn record_recovered_cancels(&mut self) -> Result<()> {
        for entry in self.restart.take_ledger_records() {
            self.cancels.ledger_mut().record(entry)?;
        }
        Ok(())
    }
}

/// What the wheel's restart needs to know.
pub(crate) struct RestartPlan<'a> {
    /// The recovered commit log.
    pub log: &'a CommitLog,
    /// `timer/`.
    pub dir: &'a Path,
    pub entries_per_log_file: u64,
    pub now_ms: u64,
    /// The checkpoint the indexes resume at (`None`: they are rebuilt).
    pub resume_at: Option<Checkpoint>,
    /// The newest valid checkpoint, trusted or not: its tick second vouches
    /// that every timer due before it fired.
    pub last: Option<Checkpoint>,
    /// Where the dispatcher's replay would start for a resumed wheel.
    pub replay_from: u64,
}

/// The wheel, restarted.
pub(crate) struct Restarted {
    pub wheel: Wheel,
    /// Where the dispatcher replays from (the oldest segment if the wheel was rebuilt).
    pub replay_from: u64,
    /// Where the scan for settled timers started; it stays the scan start until the ticker moves on.
    pub delivery_scan_from: u64,
    /// The wheel was built afresh (and the replay starts at the oldest segment).
    pub fresh: bool,
    /// Recurring schedules' timers restored from the relocation area: the
    /// ticking thread learns those indexed into a second already loaded,
    /// which no loading checks (see `timer/recurring.rs`).
    pub restored_schedules: Vec<Timer>,
}

/// The wheel's recovery contract: opens the wheel resumed at the plan's
/// checkpoint (or afresh), told of every timer the log settled since; falls
/// back to a rebuild if its chains are torn; restores relocated timers into
/// a rebuilt wheel; fills the cancel ledger; notes what the replay must not
/// index twice; and declares the replay range.
pub(crate) fn restart_wheel(plan: RestartPlan<'_>) -> Result<Restarted> {
    let log = plan.log;
    let scan_from =
        plan.resume_at.map_or(log.start(), |cp| cp.delivery_scan_from.min(plan.replay_from)).max(log.start());
    let resume = plan.resume_at.map(|cp| Resume { tick_second: cp.tick_second });
    let open_wheel = |resume, scan_from| -> Result<Wheel> {
        let settled = scan_settled(log, scan_from)?;
        Wheel::open(plan.dir, plan.entries_per_log_file, plan.now_ms, resume, settled, scan_from)
    };
    // Only a wheel resumed from a checkpoint can be damaged; a new one is built here.
    let resumed = match (open_wheel(resume, scan_from), plan.resume_at) {
        (Ok(wheel), None) => Some(wheel),
        (Ok(mut wheel), Some(cp)) => wheel.resumable(&cp, log.write_end()).then_some(wheel),
        (Err(Error::Corruption { .. }), Some(_)) => None,
        (Err(e), _) => return Err(e),
    };
    let (mut wheel, replay_from, scan_from, fresh) = match resumed {
        Some(wheel) => (wheel, plan.replay_from, scan_from, resume.is_none()),
        None => {
            // The wheel files are newer than what they chain to (a power loss
            // tore them): rebuild every index from the start of the log.
            tracing::warn!(dir = %plan.dir.display(), "the wheel cannot be resumed (damaged, or ahead of the log after a power loss); rebuilding the indexes from the commit log");
            (open_wheel(None, log.start())?, log.start(), log.start(), true)
        }
    };
    // A wheel built afresh knows nothing of relocated timers yet.
    let restored_schedules = match fresh {
        true => restore_relocated(&mut wheel, log, plan.last.map_or(0, |cp| cp.tick_second))?,
        false => Vec::new(),
    };
    wheel.record_recovered_cancels()?;
    wheel.set_replay_range(replay_from..log.write_end());
    Ok(Restarted { wheel, replay_from, delivery_scan_from: scan_from, fresh, restored_schedules })
}

/// Indexes, into a wheel built afresh, the relocated timers that may still
/// be pending (due at or after `tick_second`, before which the checkpoint
/// vouches every timer fired) and then their relocated cancels: the replay
/// that follows starts at the oldest segment and cannot see them. Every
/// relocated cancel goes to the cancel ledger, also of a timer that is past.
/// Returns the recurring schedules' timers it indexed.
fn restore_relocated(wheel: &mut Wheel, log: &CommitLog, tick_second: u64) -> Result<Vec<Timer>> {
    let area = log.relocated();
    let _span = tracing::info_span!("restore_relocated", copies = area.entries()).entered();
    let from_ms = tick_second.saturating_mul(1000);
    // What the cancels and reschedules settle, and their ledger entries.
    let mut settles = Vec::new();
    let mut schedules = Vec::new();
    for i in 0..area.entries() {
        let entry = area.entry(i)?;
        let record = match log.read(entry.original_offset) {
            Ok(record) => record,
            // Its window was deleted: all of its timers had fired.
            Err(Error::Reclaimed { .. }) => continue,
            Err(e) => return Err(e),
        };
        let corrupt = |k| log.corruption_at(record.offset, k);
        match record.kind {
            RecordKind::Message => {
                // The message's own timer (a pinned copy's window may be a
                // reschedule's, later: see `retention`).
                let view = MessageView::parse(&record.bytes).map_err(corrupt)?;
                let Some(deliver_at_ms) = view.timer_deliver_at_ms() else { continue };
                if deliver_at_ms >= from_ms {
                    // Not counted per segment: its segment is gone.
                    let timer = Timer { deliver_at_ms, message_offset: record.offset };
                    wheel.insert(timer)?;
                    schedules.extend(view.schedule.then_some(timer));
                }
                // An update settles the timer of the schedule it replaced.
                if let Some(r) = replaced_by(&view) {
                    let timer = Timer { deliver_at_ms: r.deliver_at_ms, message_offset: r.timer_offset };
                    settles.push((timer, LedgerEntry::cancel(timer, record.offset)));
                }
            }
            RecordKind::Cancel => {
                let cancel = CancelView::parse(&record.bytes).map_err(corrupt)?;
                let timer =
                    Timer { deliver_at_ms: cancel.deliver_at_ms, message_offset: cancel.message_offset };
                settles.push((timer, LedgerEntry::cancel(timer, record.offset)));
            }
            RecordKind::Reschedule => {
                let r = RescheduleView::parse(&record.bytes).map_err(corrupt)?;
                if r.deliver_at_ms >= from_ms {
                    let timer = Timer { deliver_at_ms: r.deliver_at_ms, message_offset: record.offset };
                    wheel.insert(timer)?;
                    schedules.extend(r.occurrence.is_some().then_some(timer));
                }
                let replaced = Timer { deliver_at_ms: r.from_deliver_at_ms, message_offset: r.from_timer };
                settles.push((
                    replaced,
                    LedgerEntry::reschedule(r.message_offset, r.deliver_at_ms, record.offset),
                ));
            }
            // Each entry as the occurrence record it stands for, named by the entry.
            RecordKind::Occurrences => {
                let view = OccurrencesView::parse(&record.bytes, record.offset).map_err(corrupt)?;
                for (name, r) in view.entries() {
                    if r.deliver_at_ms >= from_ms {
                        let timer = Timer { deliver_at_ms: r.deliver_at_ms, message_offset: name };
                        wheel.insert(timer)?;
                        schedules.push(timer);
                    }
                    settles.push(occurrence_settles((name, r)));
                }
            }
            _ => {}
        }
    }
    // The ledger is in log order; the index is in the order copies were made.
    settles.sort_unstable_by_key(|(_, entry)| entry.record_offset);
    for (timer, entry) in settles {
        if timer.deliver_at_ms >= from_ms {
            wheel.cancel(timer)?;
        }
        wheel.record_in_ledger(entry)?;
    }
    Ok(schedules)
}

/// What a record settles: a delivery (of the timer of the record at an
/// offset), or a cancel or a reschedule (of a timer, by its ledger entry).
enum Settles {
    Delivery(u64),
    /// The timers of a deliveries record, by their records' offsets.
    Deliveries(Vec<u64>),
    Cancel {
        timer: Timer,
        entry: LedgerEntry,
    },
    /// The timers an occurrences record replaced, each by its entry's ledger entry.
    Occurrences(Vec<(Timer, LedgerEntry)>),
}

/// The timer entry `name` of an occurrences record replaced, and the
/// ledger entry of the one it armed (as an occurrence record's).
fn occurrence_settles((name, r): (u64, RescheduleView)) -> (Timer, LedgerEntry) {
    let timer = Timer { deliver_at_ms: r.from_deliver_at_ms, message_offset: r.from_timer };
    (timer, LedgerEntry::reschedule(r.message_offset, r.deliver_at_ms, name))
}

/// The timers that fired or were cancelled, from the delivery and cancel
/// records after `from`: the wheel must not deliver them again.
fn scan_settled(log: &CommitLog, from: u64) -> Result<Settled> {
    let _span = tracing::info_span!("scan_settled", from).entered();
    let mut settled = Settled::default();
    let mut at = from;
    while at < log.write_end() {
        // Records below the replay start were not validated at open: the
        // deliveries and cancels relied on here have their checksums checked;
        // a damaged message is left to be reported when it is read.
        let (found, next) = log.visit_trusted(at, |offset, kind, bytes| {
            let corrupt = |kind| log.corruption_at(offset, kind);
            match kind {
                // An update or a replacing put settles the timer it replaced, as a cancel does.
                RecordKind::Message => Ok(MessageView::parse(bytes)
                    .ok()
                    .filter(|view| view.has_properties() && check_crc(bytes, offset).is_ok())
                    .and_then(|view| replaced_by(&view))
                    .map(|r| {
                        let timer = Timer { deliver_at_ms: r.deliver_at_ms, message_offset: r.timer_offset };
                        Settles::Cancel { timer, entry: LedgerEntry::cancel(timer, offset) }
                    })),
                RecordKind::Delivery => check_crc(bytes, offset)
                    .and_then(|()| DeliveryView::parse(bytes))
                    .map(|d| Some(Settles::Delivery(d.message_offset)))
                    .map_err(corrupt),
                RecordKind::Deliveries => check_crc(bytes, offset)
                    .and_then(|()| DeliveriesView::parse(bytes))
                    .map(|d| Some(Settles::Deliveries(d.timers().map(|(timer, _)| timer).collect())))
                    .map_err(corrupt),
                RecordKind::Cancel => check_crc(bytes, offset)
                    .and_then(|()| CancelView::parse(bytes))
                    .map(|c| {
                        let timer =
                            Timer { deliver_at_ms: c.deliver_at_ms, message_offset: c.message_offset };
                        Some(Settles::Cancel { timer, entry: LedgerEntry::cancel(timer, offset) })
                    })
                    .map_err(corrupt),
                RecordKind::Reschedule => check_crc(bytes, offset)
                    .and_then(|()| RescheduleView::parse(bytes))
                    .map(|r| {
                        let timer =
                            Timer { deliver_at_ms: r.from_deliver_at_ms, message_offset: r.from_timer };
                        let entry = LedgerEntry::reschedule(r.message_offset, r.deliver_at_ms, offset);
                        Some(Settles::Cancel { timer, entry })
                    })
                    .map_err(corrupt),
                RecordKind::Occurrences => check_crc(bytes, offset)
                    .and_then(|()| OccurrencesView::parse(bytes, offset))
                    .map(|view| Some(Settles::Occurrences(view.entries().map(occurrence_settles).collect())))
                    .map_err(corrupt),
                _ => Ok(None),
            }
        })?;
        match found? {
            Some(Settles::Delivery(message_offset)) => {
                settled.delivered.insert(message_offset);
            }
            Some(Settles::Deliveries(timers)) => settled.delivered.extend(timers),
            Some(Settles::Cancel { timer, entry }) => {
                settled.cancelled.insert(timer.message_offset);
                settled.ledger_records.push(entry);
            }
            Some(Settles::Occurrences(entries)) => {
                for (timer, entry) in entries {
                    settled.cancelled.insert(timer.message_offset);
                    settled.ledger_records.push(entry);
                }
            }
            None => {}
        }
        at = next;
    }
    Ok(settled)
}
