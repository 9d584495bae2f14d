//! Recurring schedules: creating one (one record, its first occurrence its
//! timer), pausing, updating, cancelling and finding them. Firing them, and
//! writing the records of a pause or an update, is the ticking thread's
//! (`timer/tick/occurrences.rs`).

use super::Store;
use crate::config::{FlushMode, Scheduler};
use crate::error::{Error, Result};
use crate::format::record::{MessageView, RecordKind};
use crate::message::{CancelOutcome, Handle, Message, PauseOutcome, Written};
use crate::pending::PendingTimer;
use crate::receipt::{ReplaceOutcome, ScheduleReceipt, UpdateOutcome};
use crate::retention::is_size_cap;
use crate::schedule::{PAUSED_AT_MS, Replaced, SPEC_PROPERTY, Schedule, ScheduleUpdate, Spec, plan_of};
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
        let receipt = self.put(self.schedule_record(&schedule)?).map_err(as_template_error)?;
        Ok(ScheduleReceipt { receipt })
    }

    /// The record of `schedule` created now, as a message.
    fn schedule_record(&self, schedule: &Schedule) -> Result<Message> {
        let (spec, first) = self.check_schedule(schedule)?;
        let mut message =
            schedule.template().clone().property(SPEC_PROPERTY, spec.encode()?).deliver_at_ms(first);
        message.schedule = true;
        Ok(message)
    }

    /// [`update_schedule`](Self::update_schedule) of the active schedule of
    /// the template's topic and dedup key, found by that key; else
    /// [`schedule`](Self::schedule): what every replica of a service that
    /// publishes the same schedule calls, so the last one's holds, once.
    /// `Replaced` with the new schedule's receipt (its handle is the
    /// schedule's) and the old one's handle, or `Put`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use delaywheel::{Config, Message, Recurrence, ReplaceOutcome, Schedule, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let report = |cron| Schedule::new(Message::new("Reports", "settlement").dedup_key("daily-report"), Recurrence::cron(cron));
    /// assert!(matches!(store.schedule_replacing(report("0 0 9 * * *"))?, ReplaceOutcome::Put(_)));
    /// let ReplaceOutcome::Replaced { receipt, .. } = store.schedule_replacing(report("0 30 9 * * *"))? else {
    ///     unreachable!("the first is active")
    /// };
    /// assert_eq!(store.schedules(Some("Reports"), 10)?.len(), 1);
    /// # let _ = receipt;
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Errors, with nothing written: [`Error::Invalid`] naming `template`
    /// for a template without a dedup key; else those of `schedule` and
    /// `update_schedule`.
    pub fn schedule_replacing(&self, schedule: Schedule) -> Result<ReplaceOutcome> {
        let topic = schedule.template().topic();
        let Some(key) = schedule.template().dedup_key.as_deref() else {
            return Err(Error::invalid("template", "dedup_key: schedule_replacing finds the schedule by it"));
        };
        let record = self.schedule_record(&schedule)?;
        self.check_message(&record).map_err(as_template_error)?;
        let (hash, mut recent) = self.dedup_shard(topic, key)?;
        for look in 0..2 {
            if let Some((standing, Some(_))) = self.newest_keyed(topic, key, hash, &recent)? {
                let replaced = standing.receipt.handle().expect("a timed record has a handle");
                if let UpdateOutcome::Updated(new) =
                    self.update_schedule_unsynced(replaced, schedule.clone())?
                {
                    recent.push(hash, new.receipt.offset);
                    drop(recent);
                    self.wait_durable_if_sync(Written::Put(new.receipt))?;
                    return Ok(ReplaceOutcome::Replaced { receipt: new.receipt, replaced });
                }
                // Over or replaced: an update a timed-out call left with the
                // ticking thread may have written a newer one. Look again once
                // everything written is indexed.
                if look == 0 {
                    self.wait_all_indexed()?;
                    continue;
                }
            }
            break;
        }
        let (receipt, end) = self.append_new(&record).map_err(as_template_error)?;
        recent.push(hash, receipt.offset);
        drop(recent);
        if self.config.flush_mode == FlushMode::Sync {
            self.wait_durable_for(end, Written::Put(receipt))?;
        }
        Ok(ReplaceOutcome::Put(receipt))
    }

    /// Checks `schedule` as one created now: its spec and first occurrence.
    fn check_schedule(&self, schedule: &Schedule) -> Result<(Spec, u64)> {
        if self.config.scheduler != Scheduler::Wheel {
            return Err(Error::invalid("scheduler", "recurring schedules need the wheel scheduler"));
        }
        if schedule.template().properties.iter().any(|(name, _)| name == SPEC_PROPERTY) {
            let why = format!("the property {SPEC_PROPERTY:?} is the store's own: it holds the schedule");
            return Err(Error::invalid("template", why));
        }
        let created_ms = self.config.clock.now_ms();
        let (spec, plan) = schedule.checked(created_ms)?;
        let first =
            plan.first(created_ms).ok_or_else(|| Error::invalid("schedule", "no first occurrence"))?;
        Ok((spec, first))
    }

    /// Replaces the recurring schedule `handle` names by `schedule`, at
    /// once and by one record: the new schedule's, which names the old
    /// one's armed timer and settles it as a cancel record would. The old
    /// schedule delivers nothing after it (its handle then answers as a
    /// cancelled schedule's); the new one, with a handle of its own, goes on
    /// from the first occurrence of its recurrence from now, its occurrences
    /// numbered and its limit counted from the update. A crash keeps the old
    /// schedule or the new one, never both, never neither. The template may
    /// change all but its topic. Durable as a put is.
    ///
    /// `Updated` with the new schedule's receipt; `Over`, `Cancelled` or
    /// `NotFound` write nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use delaywheel::{Config, Message, Recurrence, Schedule, Store, UpdateOutcome};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let poll = |every| Schedule::new(Message::new("Poll", "order-42"), Recurrence::every(every));
    /// let old = store.schedule(poll(Duration::from_secs(10)))?.handle();
    /// let UpdateOutcome::Updated(new) = store.update_schedule(old, poll(Duration::from_secs(60)))? else {
    ///     unreachable!("the schedule is active")
    /// };
    /// assert_eq!(store.schedule_of(old)?, None);
    /// assert!(store.schedule_of(new.handle())?.is_some());
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Errors, with nothing written: those of [`schedule`](Self::schedule)
    /// for the new schedule, and [`Error::Invalid`] naming `template` for
    /// one of another topic; else those of [`put`](Self::put).
    pub fn update_schedule(&self, handle: Handle, schedule: Schedule) -> Result<UpdateOutcome> {
        let outcome = self.update_schedule_unsynced(handle, schedule)?;
        if let UpdateOutcome::Updated(receipt) = &outcome {
            self.wait_durable_if_sync(Written::Put(*receipt.receipt()))?;
        }
        Ok(outcome)
    }

    /// In sync mode, waits until everything written so far is durable.
    fn wait_durable_if_sync(&self, written: Written) -> Result<()> {
        match self.config.flush_mode {
            FlushMode::Sync => self.wait_durable_for(self.log.write_end(), written),
            FlushMode::Async => Ok(()),
        }
    }

    /// [`update_schedule`](Self::update_schedule) but for the wait for durability.
    fn update_schedule_unsynced(&self, handle: Handle, schedule: Schedule) -> Result<UpdateOutcome> {
        if !*self.accepting.reading() {
            return Err(Error::Closed);
        }
        let (spec, first_ms) = self.check_schedule(&schedule)?;
        match self.schedule_topic(handle) {
            None => return Ok(UpdateOutcome::NotFound),
            Some(topic) if topic != schedule.template().topic() => {
                let why = format!("an update keeps the schedule's topic, {topic:?}");
                return Err(Error::invalid("template", why));
            }
            Some(_) => {}
        }
        // Checked as the record will be: with the longest spec an update writes.
        let longest = Replaced { timer_offset: u64::MAX, deliver_at_ms: u64::MAX };
        let update = ScheduleUpdate { template: schedule.template().clone(), spec, first_ms, queue_id: 0 };
        let queue_id = self.check_message(&update.record(longest)?).map_err(as_template_error)?;
        let update = ScheduleUpdate { queue_id, ..update };
        let timer = Timer { deliver_at_ms: handle.deliver_at_ms, message_offset: handle.offset };
        // Nothing is written where the size cap refuses it: wait for room, as a put does.
        let started = std::time::Instant::now();
        loop {
            match self.scheduler.update_schedule(timer, update.clone()) {
                Err(e) if is_size_cap(&e) => {
                    if !self.await_room(started) {
                        return Err(e);
                    }
                }
                outcome => return outcome,
            }
        }
    }

    /// The topic of the schedule `handle` names; `None` if it names none.
    fn schedule_topic(&self, handle: Handle) -> Option<String> {
        if handle.offset >= self.log.write_end() {
            return None;
        }
        let found = self.log.visit_checked(handle.offset, |at, kind, bytes| {
            let view = MessageView::parse(bytes)
                .ok()
                .filter(|_| at == handle.offset && kind == RecordKind::Message)?;
            let named = view.schedule && view.timer_deliver_at_ms() == Some(handle.deliver_at_ms);
            named.then(|| view.topic.to_string())
        });
        found.ok().and_then(|(topic, _)| topic)
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

/// A refusal of a schedule's record as a message names the template's field.
fn as_template_error(e: Error) -> Error {
    match e {
        Error::Invalid { what, reason } if what != "timing" => {
            Error::invalid("template", format!("{what}: {reason}"))
        }
        other => other,
    }
}
