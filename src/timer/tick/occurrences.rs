//! Firing a recurring schedule's timer: one record delivers the occurrence
//! and arms the next (a reschedule record with the occurrence flags), so a
//! torn tail keeps both or neither and every occurrence is delivered once.
//! The last occurrence is a delivery record; a schedule whose missed
//! occurrences are skipped to its end closes with a cancel record. Pausing
//! and resuming a schedule are occurrence records that deliver nothing; an
//! update is the new schedule's record, naming the old one's armed timer,
//! which it settles as a cancel record would.

use crossbeam_channel::Sender;

use super::{Ticker, check_timer_record};
use crate::commitlog::Planned;
use crate::error::{Error, Result};
use crate::format::record::{
    CANCEL_LEN, DELIVERY_LEN, OCCURRENCES_MAX, OccurrenceFields, RescheduleView, encode_cancel,
    encode_delivery, encode_occurrences, entry_fits, entry_name, occurrences_len,
};
use crate::format::record::{Timing, encode_message};
use crate::message::PauseOutcome;
use crate::receipt::{Receipt, ScheduleReceipt, UpdateOutcome};
use crate::schedule::{PAUSED_AT_MS, Plan, Replaced, ScheduleUpdate, plan_of};
use crate::sync::Locked;
use crate::timer::Timer;
use crate::timer::ledger::LedgerEntry;
use crate::timer::state::cancels::{CancelState, CancelTarget};

/// A schedule's timer, as its records say: the schedule (its record's
/// offset), the occurrences it delivered before this timer's, its plan.
struct Armed {
    schedule: u64,
    fired: u64,
    plan: Plan,
}

/// The record a fired schedule timer is written as.
enum Written {
    /// Delivers it (or skips it) and arms the next occurrence.
    Occurrence(RescheduleView),
    /// Delivers the last occurrence.
    Last(u64),
    /// Skips the last: the schedule ends without delivering it.
    Closed(Timer),
}

impl Written {
    /// The occurrence's record (only asked of one planned into an occurrences record).
    fn occurrence(&self) -> RescheduleView {
        match self {
            Written::Occurrence(view) => *view,
            _ => unreachable!("only occurrences are planned into an occurrences record"),
        }
    }

    fn len(&self) -> usize {
        match self {
            Written::Occurrence(view) => view.record_len(),
            Written::Last(_) => DELIVERY_LEN,
            Written::Closed(_) => CANCEL_LEN,
        }
    }
}

impl Ticker {
    /// Writes the records of the schedules' timers among `due` (fired at
    /// `now_ms`) and returns the other timers, for their delivery records.
    pub(super) fn fire_occurrences(&mut self, due: Vec<Timer>, now_ms: u64) -> Result<Vec<Timer>> {
        if self.recurring.is_empty() || due.is_empty() {
            return Ok(due);
        }
        let mut plain = Vec::with_capacity(due.len());
        let mut fired = Vec::new();
        for timer in due {
            match self.recurring.take(&timer).then(|| self.read_armed(timer)).flatten() {
                Some(schedule) => fired.push((timer, written(&schedule, timer, now_ms))),
                None => plain.push(timer),
            }
        }
        for chunk in fired.chunks(super::DELIVERY_CHUNK) {
            self.write_occurrences(chunk, now_ms)?;
        }
        Ok(plain)
    }

    /// Appends one chunk's records under one lock, then enters each in the
    /// ledger and the counts as a reschedule, a delivery or a cancel is.
    fn write_occurrences(&mut self, chunk: &[(Timer, Written)], now_ms: u64) -> Result<()> {
        let batched = self.log.holds_occurrences();
        let (plan, offsets, _) = self.log.append_batch_planned(
            |first| ChunkPlan::new(chunk, first, batched),
            |plan, i, buf, offset| plan.encode(chunk, i, buf, offset, now_ms),
        )?;
        let mut stats = self.shared.stats.locked();
        // In the order of their names: the ledger and the timers armed ahead are kept so.
        for (k, offset) in plan.names(&offsets) {
            let (timer, written) = &chunk[k];
            debug_assert!(timer.deliver_at_ms <= now_ms, "a timer fired before its time");
            let delivered = match written {
                Written::Occurrence(view) => {
                    // The handle finds the schedule's timer by it, as after a reschedule.
                    let entry = LedgerEntry::reschedule(view.message_offset, view.deliver_at_ms, offset);
                    self.wheel.record_in_ledger(entry)?;
                    self.armed_ahead.armed(entry.rescheduled_timer());
                    view.delivers()
                }
                Written::Last(_) => true,
                Written::Closed(timer) => {
                    if let Err(e) = self.wheel.record_cancel(*timer, offset) {
                        tracing::error!(error = %e, offset, "could not enter a schedule's end in the ledger");
                    }
                    self.counts.cancel_recorded(offset, timer.deliver_at_ms);
                    false
                }
            };
            self.counts.settled(timer.message_offset);
            if delivered {
                stats.record_lateness(now_ms, now_ms - timer.deliver_at_ms, 1);
                stats.delivered += 1;
                stats.occurrences_delivered += 1;
            }
        }
        drop(stats);
        self.wake_indexers();
        Ok(())
    }
}

/// How a chunk of fired schedule timers is written: the delivering
/// occurrences whose entries [fit](entry_fits) in one occurrences record
/// (kind 8), first, then each of the others in a record of its own.
struct ChunkPlan {
    /// The chunk's indexes of the occurrences the occurrences record holds, in entry order.
    batched: Vec<usize>,
    /// The chunk's indexes of the others, in order.
    single: Vec<usize>,
    lens: Vec<usize>,
}

impl ChunkPlan {
    /// The plan for `chunk` written from log offset `first`; `batched`:
    /// whether an occurrences record may be written (the tail segment is of version 3).
    fn new(chunk: &[(Timer, Written)], first: u64, batched: bool) -> Self {
        let mut plan = Self { batched: Vec::new(), single: Vec::new(), lens: Vec::new() };
        for (k, (_, written)) in chunk.iter().enumerate() {
            match written {
                // Names only grow with the index, so a later entry never fits where this one did not.
                Written::Occurrence(view)
                    if batched && entry_fits(view, entry_name(first, plan.batched.len())) =>
                {
                    plan.batched.push(k)
                }
                _ => plan.single.push(k),
            }
        }
        debug_assert!(plan.batched.len() <= OCCURRENCES_MAX, "a chunk is at most one record's entries");
        plan.lens.extend((!plan.batched.is_empty()).then(|| occurrences_len(plan.batched.len())));
        plan.lens.extend(plan.single.iter().map(|&k| chunk[k].1.len()));
        plan
    }

    /// Whether the first record is the occurrences record.
    fn has_batch(&self) -> bool {
        !self.batched.is_empty()
    }

    /// Writes record `i` of the plan at `offset`.
    fn encode(&self, chunk: &[(Timer, Written)], i: usize, buf: &mut [u8], offset: u64, now_ms: u64) {
        if self.has_batch() && i == 0 {
            let views: Vec<RescheduleView> = self.batched.iter().map(|&k| chunk[k].1.occurrence()).collect();
            return encode_occurrences(buf, offset, now_ms, &views);
        }
        match &chunk[self.single[i - usize::from(self.has_batch())]].1 {
            Written::Occurrence(view) => view.encode(buf, offset),
            Written::Last(timer) => encode_delivery(buf, offset, now_ms, *timer),
            Written::Closed(timer) => {
                encode_cancel(buf, offset, now_ms, timer.message_offset, timer.deliver_at_ms)
            }
        }
    }

    /// Each fired timer's chunk index and the name of what was written for
    /// it (an entry's offset, or its record's), given the records' `offsets`:
    /// in increasing name order.
    fn names<'a>(&'a self, offsets: &'a [u64]) -> impl Iterator<Item = (usize, u64)> + 'a {
        let batch = self.batched.iter().enumerate().map(|(j, &k)| (k, entry_name(offsets[0], j)));
        let singles =
            self.single.iter().zip(&offsets[usize::from(self.has_batch())..]).map(|(&k, &o)| (k, o));
        batch.chain(singles)
    }
}

impl Planned for ChunkPlan {
    fn lens(&self) -> &[usize] {
        &self.lens
    }
}

/// What firing `timer` of the schedule `armed` at `now_ms` writes.
fn written(armed: &Armed, timer: Timer, now_ms: u64) -> Written {
    let firing = armed.plan.on_fire(timer.deliver_at_ms, now_ms, armed.fired);
    match (firing.next, firing.deliver) {
        (Some(next), deliver) => Written::Occurrence(RescheduleView {
            rescheduled_at_ms: now_ms,
            message_offset: armed.schedule,
            from_timer: timer.message_offset,
            from_deliver_at_ms: timer.deliver_at_ms,
            deliver_at_ms: next,
            occurrence: Some(OccurrenceFields {
                fired: armed.fired.saturating_add(u64::from(deliver)),
                delivers: deliver,
            }),
        }),
        (None, true) => Written::Last(timer.message_offset),
        (None, false) => Written::Closed(timer),
    }
}

impl Ticker {
    /// Pauses (`pause`) or resumes the schedule whose armed timer is
    /// `timer`, by one occurrence record that delivers nothing: to
    /// [`PAUSED_AT_MS`] (no occurrence is due then), or from there to the
    /// first occurrence from now (a resume after its end closes it).
    pub(super) fn pause(
        &mut self,
        timer: Timer,
        pause: bool,
        reply: Sender<Result<PauseOutcome>>,
    ) -> Result<()> {
        let _span = tracing::debug_span!("pause", offset = timer.message_offset, pause).entered();
        // What cannot be read is this caller's answer, and the wheel goes on;
        // a record that could not be written stops it (as for a cancel).
        let Some(target) = self.locate_or_answer(timer, &reply) else { return Ok(()) };
        let outcome = match target {
            CancelTarget::AlreadyDelivered => Ok(PauseOutcome::Over),
            CancelTarget::AlreadyCancelled => Ok(PauseOutcome::Cancelled),
            _ if (timer.deliver_at_ms == PAUSED_AT_MS) == pause => Ok(PauseOutcome::Unchanged),
            target => match self.read_schedule(timer) {
                Err(e) => {
                    let _ = reply.send(Err(e));
                    return Ok(());
                }
                Ok(None) => Ok(PauseOutcome::NotFound),
                Ok(Some(schedule)) => self.record_and_apply_pause(timer, pause, target, schedule),
            },
        };
        let failed = outcome.is_err();
        let _ = reply.send(outcome);
        if failed {
            return Err(Error::invalid("pause", "the wheel could not record a pause"));
        }
        Ok(())
    }

    fn record_and_apply_pause(
        &mut self,
        timer: Timer,
        pause: bool,
        target: CancelTarget,
        (schedule, fired, plan): (u64, u64, Plan),
    ) -> Result<PauseOutcome> {
        let now_ms = self.clock.now_ms();
        let next = if pause { Some(PAUSED_AT_MS) } else { plan.resume_at(now_ms, fired) };
        let Some(next) = next else {
            // Resumed after its end: the schedule closes, as a cancel would.
            self.record_and_apply_cancel(timer, target)?;
            return Ok(PauseOutcome::Over);
        };
        let view = RescheduleView {
            rescheduled_at_ms: now_ms,
            message_offset: schedule,
            from_timer: timer.message_offset,
            from_deliver_at_ms: timer.deliver_at_ms,
            deliver_at_ms: next,
            occurrence: Some(OccurrenceFields { fired, delivers: false }),
        };
        let (record, _) =
            self.log.append_reserved(view.record_len(), |buf, offset| view.encode(buf, offset))?;
        let state = self.wheel.apply_cancel(timer, target)?;
        debug_assert_eq!(state, CancelState::Cancelled, "located as pending");
        let entry = LedgerEntry::reschedule(schedule, next, record);
        self.wheel.record_in_ledger(entry)?;
        self.armed_ahead.armed(entry.rescheduled_timer());
        self.counts.settled(timer.message_offset);
        self.wake_indexers();
        Ok(if pause { PauseOutcome::Paused } else { PauseOutcome::Resumed })
    }

    /// Where `timer` is; `None` once a failure to tell (reading the ledger)
    /// was answered on `reply`: it is this caller's, and the wheel goes on.
    pub(super) fn locate_or_answer<T>(
        &mut self,
        timer: Timer,
        reply: &Sender<Result<T>>,
    ) -> Option<CancelTarget> {
        match self.wheel.locate_for_cancel(&timer) {
            Ok(target) => Some(target),
            Err(e) => {
                let _ = reply.send(Err(e));
                None
            }
        }
    }

    /// Replaces the schedule whose armed timer is `timer` by `update`: one
    /// record, the new schedule's, naming `timer`, which it cancels. What
    /// cannot be read or written is this caller's answer (nothing was
    /// written), and the wheel goes on; a failure after the record was
    /// written stops it (as for a cancel).
    pub(super) fn update(
        &mut self,
        timer: Timer,
        update: ScheduleUpdate,
        reply: Sender<Result<UpdateOutcome>>,
    ) -> Result<()> {
        let _span = tracing::debug_span!("update_schedule", offset = timer.message_offset).entered();
        let Some(target) = self.locate_or_answer(timer, &reply) else { return Ok(()) };
        let outcome = match target {
            CancelTarget::AlreadyDelivered => Ok(UpdateOutcome::Over),
            CancelTarget::AlreadyCancelled => Ok(UpdateOutcome::Cancelled),
            target => match self.read_schedule(timer) {
                Ok(Some(_)) => match self.write_update(timer, &update) {
                    Ok(receipt) => {
                        self.settle_replaced(timer, target, receipt.offset)?;
                        Ok(UpdateOutcome::Updated(ScheduleReceipt { receipt }))
                    }
                    Err(e) => Err(e),
                },
                Ok(None) => Ok(UpdateOutcome::NotFound),
                Err(e) => Err(e),
            },
        };
        let _ = reply.send(outcome);
        Ok(())
    }

    /// Appends the update's record; returns its receipt.
    fn write_update(&mut self, timer: Timer, update: &ScheduleUpdate) -> Result<Receipt> {
        let replaced = Replaced { timer_offset: timer.message_offset, deliver_at_ms: timer.deliver_at_ms };
        let message = update.record(replaced)?;
        let store_time_ms = self.clock.now_ms();
        let timing = Timing { deliver_at_ms: update.first_ms, delay_level: 0 };
        let fields = message.fields(update.queue_id, store_time_ms, timing);
        let (offset, _) =
            self.log.append(fields.record_len(), |buf, offset| encode_message(buf, offset, &fields))?;
        let deliver_at_ms = Some(update.first_ms);
        Ok(Receipt { offset, queue_id: update.queue_id, store_time_ms, deliver_at_ms, duplicate: false })
    }

    /// The replaced `timer` (a schedule's armed timer, or a timer a
    /// replacing put took the place of) is settled by the record at
    /// `offset`, as by a cancel record there.
    pub(super) fn settle_replaced(&mut self, timer: Timer, target: CancelTarget, offset: u64) -> Result<()> {
        let state = self.wheel.apply_cancel(timer, target)?;
        debug_assert_eq!(state, CancelState::Cancelled, "located as pending");
        self.recurring.take(&timer);
        if let Err(e) = self.wheel.record_cancel(timer, offset) {
            tracing::error!(error = %e, offset, "could not enter a schedule's update in the ledger");
        }
        self.count_cancel(timer, offset);
        self.wake_indexers();
        Ok(())
    }

    /// The schedule of `timer`, a timer learnt as a schedule's as it was
    /// loaded. One whose records no longer check out, or whose spec does not
    /// read, is logged: it then fires as a timed message's, once.
    fn read_armed(&mut self, timer: Timer) -> Option<Armed> {
        match self.read_schedule(timer) {
            Ok(Some((schedule, fired, plan))) => return Some(Armed { schedule, fired, plan }),
            Ok(None) => tracing::error!(
                message = timer.message_offset,
                "a schedule's timer no longer names a schedule: it fires once, as a timed message's"
            ),
            Err(e) => tracing::error!(
                message = timer.message_offset,
                error = %e,
                "a schedule's record does not read: its timer fires once, as a timed message's"
            ),
        }
        None
    }

    /// The schedule whose timer `timer` is: its record's offset, the
    /// occurrences it delivered, its plan; `None` if it is not a schedule's.
    fn read_schedule(&mut self, timer: Timer) -> Result<Option<(u64, u64, Plan)>> {
        let mut found = None;
        let checked = check_timer_record(&mut self.reader, timer, |view, message, fired| {
            if view.schedule {
                found = Some(plan_of(view).map(|plan| (message, fired, plan)));
            }
        });
        self.reader.release();
        checked?;
        match found {
            Some(Ok(schedule)) => Ok(Some(schedule)),
            Some(Err(why)) => Err(Error::invalid("schedule", why)),
            None => Ok(None),
        }
    }
}
