//! Recurring schedules: creating one (one record, its first occurrence its
//! timer) and cancelling it. Firing them is the ticking thread's
//! (`timer/tick/occurrences.rs`).

use super::Store;
use crate::config::{FlushMode, Scheduler};
use crate::error::{Error, Result};
use crate::format::record::MessageView;
use crate::message::{CancelOutcome, Handle, PauseOutcome, Written};
use crate::pending::PendingTimer;
use crate::receipt::ScheduleReceipt;
use crate::schedule::{PAUSED_AT_MS, SPEC_PROPERTY, Schedule, plan_of};
use crate::sync::ReadWrite;
use crate::timer::Timer;

/// Pending timers [`Store::schedules`] reads at most.
pub const SCHEDULES_SCANNED: usize = 1_000_000;

impl Store {
    /// Creates a recurring schedule: one record in the commit log, the
    /// template's body never copied. Each occurrence is delivered into the
    /// template's topic, read like a timed message whose
    /// [`deliver_at_ms`](crate::ConsumedMessage::deliver_at_ms) is the
    /// occurrence's instant, with [`occurrence`](crate::ConsumedMessage::occurrence)
    /// saying which it is and when the next is due. Each occurrence is
    /// delivered once: its delivery and the arming of the next are one
    /// record (see `wheel-format.md`, "Schedules"). Durable as a put is.
    ///
    /// Errors, with nothing written: [`Error::Invalid`] naming the field of
    /// a schedule that is not acceptable (`cron`, `time_zone`, `every`,
    /// `start_at_ms`, `end_at_ms`, `limit`, or `template`, also for a
    /// template that would be refused as a message or that carries the
    /// property `dw.schedule`, or `scheduler` with the bucket scheduler);
    /// else those of [`put`](Self::put).
    ///
    /// ```
    /// use std::time::Duration;
    /// use delaywheel::{Config, Message, Recurrence, Schedule, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let report = Schedule::new(
    ///     Message::new("Reports", "settlement"),
    ///     Recurrence::cron("0 0 9 * * MON-FRI").in_time_zone("Asia/Shanghai"),
    /// );
    /// let receipt = store.schedule(report)?;
    /// store.cancel_schedule(receipt.handle())?;
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn schedule(&self, schedule: Schedule) -> Result<ScheduleReceipt> {
        if self.config.scheduler != Scheduler::Wheel {
            return Err(Error::invalid("scheduler", "recurring schedules need the wheel scheduler"));
        }
        if schedule.template().properties.iter().any(|(name, _)| name == SPEC_PROPERTY) {
            let why = format!("the property {SPEC_PROPERTY:?} is the store's own: it holds the schedule");
            return Err(Error::invalid("template", why));
        }
        let created_ms = self.config.clock.now_ms();
        let plan = schedule.plan(created_ms)?;
        let first =
            plan.first(created_ms).ok_or_else(|| Error::invalid("schedule", "no first occurrence"))?;
        let spec = schedule.spec(created_ms)?.encode()?;
        let mut message = schedule.template().clone().property(SPEC_PROPERTY, spec).deliver_at_ms(first);
        message.schedule = true;
        let receipt = self.put(message).map_err(|e| match e {
            // The template's own fields are checked as a message's are.
            Error::Invalid { what, reason } if what != "timing" => {
                Error::invalid("template", format!("{what}: {reason}"))
            }
            other => other,
        })?;
        Ok(ScheduleReceipt { receipt })
    }

    /// Pauses a recurring schedule: no occurrence is delivered until
    /// [`resume_schedule`](Self::resume_schedule); the occurrences that fall
    /// meanwhile are not missed, they are not the schedule's. One record,
    /// durable as a cancel is. `Paused`, or `Unchanged` if it was paused,
    /// `Over`, `Cancelled`, or `NotFound` if the handle names no schedule.
    ///
    /// Errors: those of [`cancel`](Self::cancel).
    pub fn pause_schedule(&self, handle: Handle) -> Result<PauseOutcome> {
        self.pause_or_resume(handle, true)
    }

    /// Resumes a paused schedule: its next occurrence is the first of its
    /// recurrence from now (one whose end passed meanwhile is `Over`).
    /// `Resumed`, or `Unchanged` if it was not paused, and as
    /// [`pause_schedule`](Self::pause_schedule) answers.
    pub fn resume_schedule(&self, handle: Handle) -> Result<PauseOutcome> {
        self.pause_or_resume(handle, false)
    }

    fn pause_or_resume(&self, handle: Handle, pause: bool) -> Result<PauseOutcome> {
        if !*self.accepting.reading() {
            return Err(Error::Closed);
        }
        if self.timer_named(handle) != Some(true) {
            return Ok(PauseOutcome::NotFound);
        }
        let timer = Timer { deliver_at_ms: handle.deliver_at_ms, message_offset: handle.offset };
        let outcome = self.scheduler.pause_schedule(timer, pause)?;
        if matches!(outcome, PauseOutcome::Paused | PauseOutcome::Resumed | PauseOutcome::Over)
            && self.config.flush_mode == FlushMode::Sync
        {
            self.wait_durable_for(self.log.write_end(), Written::Cancel(handle))?;
        }
        Ok(outcome)
    }

    /// The active recurring schedules (of `topic`, if given), the first
    /// `limit` by next occurrence, paused ones last: each a pending timer
    /// (its handle the schedule's, its deliver time the next occurrence's)
    /// with [`schedule`](crate::PendingTimer::schedule) set. Read from the
    /// wheel as [`pending`](Self::pending) reads it, over the first
    /// [`SCHEDULES_SCANNED`] pending timers of every kind: a store with more
    /// pending timers than that may not list every schedule
    /// (`delaywheel schedules` reads the whole log instead).
    ///
    /// Errors: those of [`pending`](Self::pending).
    pub fn schedules(&self, topic: Option<&str>, limit: usize) -> Result<Vec<PendingTimer>> {
        let timers = self.pending(0..PAUSED_AT_MS + 1, SCHEDULES_SCANNED)?;
        let wanted = |t: &PendingTimer| t.schedule.is_some() && topic.is_none_or(|topic| *t.topic == *topic);
        Ok(timers.into_iter().filter(wanted).take(limit).collect())
    }

    /// The active schedule `handle` names, as [`schedules`](Self::schedules)
    /// lists it: its next occurrence (the timer's deliver time), the
    /// occurrences delivered, whether it is paused. `None` if it names no
    /// schedule, or one that is over or cancelled. Taken at one instant on
    /// the ticking thread, after everything written before the call is indexed.
    ///
    /// Errors: those of [`pending`](Self::pending).
    pub fn schedule_of(&self, handle: Handle) -> Result<Option<PendingTimer>> {
        if self.timer_named(handle) != Some(true) {
            return Ok(None);
        }
        self.wait_indexed_to(self.log.write_end())?;
        let own = Timer { deliver_at_ms: handle.deliver_at_ms, message_offset: handle.offset };
        let entries = self.scheduler.pending_of(vec![own])?.into_iter().flatten().collect();
        Ok(crate::pending::describe(&self.log, entries).pop())
    }

    /// The first `limit` active schedules whose template has `topic` and
    /// `key`, by next occurrence: "is the daily report of desk 7 scheduled?"
    /// Found by the key index, as [`pending_by_key`](Self::pending_by_key) finds timers.
    ///
    /// Errors: those of `pending_by_key`.
    pub fn schedules_by_key(&self, topic: &str, key: &str, limit: usize) -> Result<Vec<PendingTimer>> {
        let mut found = self.pending_by_key(topic, key, usize::MAX)?;
        found.retain(|timer| timer.schedule.is_some());
        found.truncate(limit);
        Ok(found)
    }

    /// A preview: the next `n` occurrences (epoch ms) of the active schedule
    /// `handle` names, from the one armed now, as its recurrence, end and
    /// limit give them with the store open throughout. Empty if the handle
    /// names no active schedule, or a paused one (resuming it picks the
    /// first occurrence from then). [`Schedule::next_occurrences`] previews
    /// a schedule before it is created.
    ///
    /// Errors: [`Error::Invalid`] naming `schedule` if its record's spec
    /// does not read; else those of [`schedule_of`](Self::schedule_of).
    pub fn next_occurrences(&self, handle: Handle, n: usize) -> Result<Vec<u64>> {
        let Some(armed) = self.schedule_of(handle)? else { return Ok(Vec::new()) };
        let Some(state) = armed.schedule.filter(|state| !state.paused) else { return Ok(Vec::new()) };
        let (plan, _) = self.log.visit_checked(handle.offset, |_, _, bytes| {
            MessageView::parse(bytes).map_err(|e| e.to_string()).and_then(|view| plan_of(&view))
        })?;
        let plan = plan.map_err(|why| Error::invalid("schedule", why))?;
        let mut occurrences = Vec::with_capacity(n.min(1024));
        let (mut next, mut fired) = (Some(armed.deliver_at_ms), state.fired);
        while let Some(at) = next
            && occurrences.len() < n
        {
            occurrences.push(at);
            fired = fired.saturating_add(1);
            next = plan.after(at, fired);
        }
        Ok(occurrences)
    }

    /// Cancels a recurring schedule: no occurrence after this one is
    /// delivered (one already delivered stays so). `Cancelled`, or
    /// `AlreadyDelivered` if the schedule was over, or `NotFound` if the
    /// handle names no schedule. A cancel record, durable as a cancel is.
    ///
    /// Errors: those of [`cancel`](Self::cancel).
    pub fn cancel_schedule(&self, handle: Handle) -> Result<CancelOutcome> {
        match self.timer_named(handle) {
            Some(true) => self.cancel(handle),
            _ => Ok(CancelOutcome::NotFound),
        }
    }
}
