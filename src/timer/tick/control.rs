//! The ticking thread's answers to cancel and reschedule: besides delivery,
//! the one place that decides a timer's fate, so the answer and the record
//! in the log agree.

use std::fmt::Write as _;

use crossbeam_channel::Sender;

use super::{Control, Ticker};
use crate::error::{Error, Result};
use crate::format::record::{CANCEL_LEN, RESCHEDULE_LEN, RescheduleView, encode_cancel, encode_message};
use crate::message::{CancelOutcome, Receipt, ReplaceAnswer, Replacement, RescheduleOutcome};
use crate::retention::is_size_cap;
use crate::timer::Timer;
use crate::timer::ledger::LedgerEntry;
use crate::timer::state::cancels::{CancelState, CancelTarget};

impl Ticker {
    /// Cancels or reschedules the timer a handle names: the message's own,
    /// or its latest reschedule's. Waits (deferred) until the dispatcher has
    /// sent that timer. The ticking thread is the only place that delivers,
    /// cancels or reschedules, so the answer and the record agree.
    pub(super) fn control(&mut self, handle: Timer, control: Control) -> Result<()> {
        let timer = match self.wheel.current_timer(handle) {
            Ok(timer) => timer,
            Err(e) => {
                tracing::error!(error = %e, "could not tell which timer a handle names now");
                control.fail(e);
                return Ok(());
            }
        };
        if timer.message_offset >= self.indexed {
            self.deferred.push((handle, control));
            return Ok(());
        }
        match control {
            Control::Cancel(reply) => self.cancel(timer, reply),
            Control::Reschedule(deliver_at_ms, reply) => {
                self.reschedule(handle.message_offset, timer, deliver_at_ms, reply)
            }
            Control::Pause(pause, reply) => self.pause(timer, pause, reply),
            Control::Update(update, reply) => self.update(timer, *update, reply),
            Control::Replace(replacement, reply) => self.replace(timer, replacement, reply),
        }
    }

    /// Writes `replacement` in place of `timer` if it is pending, by one
    /// record (the message's, naming the timer), which settles it as a
    /// cancel record would; answers its receipt, or hands `replacement` back
    /// if the timer was not pending or the log is at its size cap (nothing
    /// written). What else cannot be read or written is this
    /// caller's answer, and the wheel goes on; a failure after the record was
    /// written stops it (as for a cancel).
    fn replace(
        &mut self,
        timer: Timer,
        replacement: Box<Replacement>,
        reply: Sender<Result<ReplaceAnswer>>,
    ) -> Result<()> {
        let _span = tracing::debug_span!("replace", offset = timer.message_offset).entered();
        let Some(target) = self.locate_or_answer(timer, &reply) else { return Ok(()) };
        if matches!(target, CancelTarget::AlreadyDelivered | CancelTarget::AlreadyCancelled) {
            let _ = reply.send(Ok(ReplaceAnswer::NotPending(replacement)));
            return Ok(());
        }
        let store_time_ms = self.clock.now_ms();
        // Two u64s and an `@`: sized once, not grown digit by digit.
        let mut replaced = String::with_capacity(2 * 20 + 1);
        let _ = write!(replaced, "{}@{}", timer.message_offset, timer.deliver_at_ms);
        let fields = replacement.fields(store_time_ms, &replaced);
        let written =
            self.log.append(fields.record_len(), |buf, offset| encode_message(buf, offset, &fields));
        let offset = match written {
            Ok((offset, _)) => offset,
            Err(e) if is_size_cap(&e) => {
                let _ = reply.send(Ok(ReplaceAnswer::OverSizeCap(replacement, e)));
                return Ok(());
            }
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(());
            }
        };
        // The record decides: the caller is answered before the wheel
        // settles the old timer (this thread handles no other command in
        // between, and a failure to settle stops the wheel).
        let deliver_at_ms = Some(replacement.timing.deliver_at_ms);
        let queue_id = replacement.queue_id;
        let receipt = Receipt { offset, queue_id, store_time_ms, deliver_at_ms, duplicate: false };
        let _ = reply.send(Ok(ReplaceAnswer::Written(receipt, replacement)));
        self.settle_replaced(timer, target, offset)
    }

    /// Decides a timer's fate.
    fn cancel(&mut self, timer: Timer, reply: Sender<Result<CancelOutcome>>) -> Result<()> {
        let _span = tracing::debug_span!("cancel", offset = timer.message_offset).entered();
        self.answer("cancel", timer, reply, |ticker, target| match target {
            CancelTarget::AlreadyDelivered => Ok(CancelOutcome::AlreadyDelivered),
            CancelTarget::AlreadyCancelled => Ok(CancelOutcome::Cancelled),
            target => ticker.record_and_apply_cancel(timer, target),
        })
    }

    /// Finds where `timer` is, has `decide` act on it, and sends the answer.
    /// A failed lookup (reading the cancel ledger) is this caller's answer
    /// and changes nothing, so the wheel goes on; a record that could not be
    /// written stops the wheel (`run` poisons the log).
    fn answer<T>(
        &mut self,
        what: &'static str,
        timer: Timer,
        reply: Sender<Result<T>>,
        decide: impl FnOnce(&mut Self, CancelTarget) -> Result<T>,
    ) -> Result<()> {
        let target = match self.wheel.locate_for_cancel(&timer) {
            Ok(target) => target,
            Err(e) => {
                tracing::error!(error = %e, "could not tell whether a timer was cancelled");
                let _ = reply.send(Err(e));
                return Ok(());
            }
        };
        let outcome = decide(self, target);
        let failed = outcome.is_err();
        let _ = reply.send(outcome);
        if failed {
            return Err(Error::invalid(what, format!("the wheel could not record a {what}")));
        }
        Ok(())
    }

    /// Writes the cancel record, then changes the wheel: a cancel that could
    /// not be recorded changes nothing.
    pub(super) fn record_and_apply_cancel(
        &mut self,
        timer: Timer,
        target: CancelTarget,
    ) -> Result<CancelOutcome> {
        let now_ms = self.clock.now_ms();
        let (cancel_offset, _) = self.log.append_reserved(CANCEL_LEN, |buf, offset| {
            encode_cancel(buf, offset, now_ms, timer.message_offset, timer.deliver_at_ms);
        })?;
        let state = self.wheel.apply_cancel(timer, target)?;
        if state == CancelState::Cancelled {
            // The timer is cancelled either way; without its ledger entry only
            // a repeated cancel after its time would answer wrong.
            if let Err(e) = self.wheel.record_cancel(timer, cancel_offset) {
                tracing::error!(error = %e, offset = timer.message_offset, "could not enter a cancel in the ledger");
            }
            self.count_cancel(timer, cancel_offset);
            self.wake_indexers();
        }
        Ok(match state {
            CancelState::Cancelled => CancelOutcome::Cancelled,
            CancelState::AlreadyDelivered => CancelOutcome::AlreadyDelivered,
        })
    }

    /// A cancel settles its timer, and its record stays of use until the
    /// timer's time has passed: retention relocates such a cancel (a timer
    /// relocated with its cancelled message must not fire from a rebuilt wheel).
    pub(super) fn count_cancel(&mut self, timer: Timer, cancel_offset: u64) {
        self.counts.settled(timer.message_offset);
        self.counts.cancel_recorded(cancel_offset, timer.deliver_at_ms);
    }

    /// Moves `timer` (of the message at `message_offset`) to `deliver_at_ms`.
    fn reschedule(
        &mut self,
        message_offset: u64,
        timer: Timer,
        deliver_at_ms: u64,
        reply: Sender<Result<RescheduleOutcome>>,
    ) -> Result<()> {
        let _span =
            tracing::debug_span!("reschedule", offset = timer.message_offset, deliver_at_ms).entered();
        self.answer("reschedule", timer, reply, |ticker, target| match target {
            CancelTarget::AlreadyDelivered => Ok(RescheduleOutcome::AlreadyDelivered),
            CancelTarget::AlreadyCancelled => Ok(RescheduleOutcome::Cancelled),
            target => ticker.record_and_apply_reschedule(message_offset, timer, deliver_at_ms, target),
        })
    }

    /// Writes the reschedule record, then takes the old timer out of the
    /// wheel (as a cancel does); the new one is the record's, indexed when
    /// the dispatcher reaches it. A reschedule that could not be recorded
    /// changes nothing.
    fn record_and_apply_reschedule(
        &mut self,
        message_offset: u64,
        timer: Timer,
        deliver_at_ms: u64,
        target: CancelTarget,
    ) -> Result<RescheduleOutcome> {
        let view = RescheduleView {
            rescheduled_at_ms: self.clock.now_ms(),
            message_offset,
            from_timer: timer.message_offset,
            from_deliver_at_ms: timer.deliver_at_ms,
            deliver_at_ms,
            occurrence: None,
        };
        let (record, _) = self.log.append_reserved(RESCHEDULE_LEN, |buf, offset| view.encode(buf, offset))?;
        let state = self.wheel.apply_cancel(timer, target)?;
        debug_assert_eq!(state, CancelState::Cancelled, "located as pending");
        let entry = LedgerEntry::reschedule(message_offset, deliver_at_ms, record);
        // Without its ledger entry, the handle would name the old timer again:
        // the ledger is then unreliable, and the wheel is rebuilt.
        self.wheel.record_in_ledger(entry)?;
        self.armed_ahead.armed(entry.rescheduled_timer());
        self.counts.settled(timer.message_offset);
        self.wake_indexers();
        Ok(RescheduleOutcome::Rescheduled)
    }
}
