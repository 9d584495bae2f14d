//! The one seam between the store and whichever scheduler holds its timed
//! messages ([`Config::with_scheduler`](crate::Config::with_scheduler)): the
//! dispatcher hands it every timed message and its progress, the store
//! cancels through it and reads its counters. [`WheelFront`](crate::timer::WheelFront)
//! fronts the timing wheel's ticking thread (`src/timer/`);
//! [`BucketFront`](crate::buckets::BucketFront) the RocketMQ 4.x baseline (`src/buckets/`).

use std::sync::Arc;

use crate::consume_queue::ConsumeQueue;
use crate::error::Result;
use crate::format::record::{MessageView, RescheduleView};
use crate::message::{CancelOutcome, PauseOutcome, RescheduleOutcome};
use crate::receipt::UpdateOutcome;
use crate::schedule::ScheduleUpdate;
use crate::stats::TimerStats;
use crate::timer::Timer;
use crate::timer::wheel::window::PendingEntry;

/// Where timed messages wait until they are due.
pub(crate) trait SchedulerFront: Send + Sync {
    /// Indexes the timed message `record` at `offset` (its frame checked,
    /// not its checksum: see `CommitLog::visit_trusted`), read as `view`.
    /// Called by the dispatcher in commit-log order; returns the consume
    /// queue it appended to, if any.
    fn index(&self, offset: u64, record: &[u8], view: &MessageView<'_>) -> Result<Option<Arc<ConsumeQueue>>>;

    /// Indexes the timer of the reschedule record at `offset` (in commit-log
    /// order, like [`index`](Self::index)).
    fn index_rescheduled(&self, offset: u64, view: &RescheduleView) -> Result<()>;

    /// Sends on whatever [`index`](Self::index) and
    /// [`index_rescheduled`](Self::index_rescheduled) held back to send
    /// together. The dispatcher calls it before it publishes how far it
    /// indexed, so whoever reads that progress finds the timers below it
    /// sent (a refresh after it sees them).
    fn hand_over(&self) -> Result<()> {
        Ok(())
    }

    /// Every timed record below `offset` has been handed to [`index`](Self::index):
    /// what a checkpoint may vouch for on the scheduler's behalf.
    fn indexed_below(&self, offset: u64) -> Result<()>;

    /// Decides the fate of `timer` (a timed message record the caller checked):
    /// `Cancelled` once a cancel record is in the log, or `AlreadyDelivered`.
    fn cancel(&self, timer: Timer) -> Result<CancelOutcome>;

    /// [`cancel`](Self::cancel) for each of `timers`, answered in order.
    fn cancel_many(&self, timers: &[Timer]) -> Result<Vec<CancelOutcome>> {
        timers.iter().map(|&timer| self.cancel(timer)).collect()
    }

    /// Pauses (`pause`) or resumes the recurring schedule whose record's
    /// own timer is `timer` (the caller checked it is a schedule's). Only
    /// the wheel fires schedules.
    fn pause_schedule(&self, _timer: Timer, _pause: bool) -> Result<PauseOutcome> {
        Err(crate::error::Error::invalid("scheduler", "recurring schedules need the wheel scheduler"))
    }

    /// Replaces the recurring schedule whose record's own timer is `timer`
    /// (the caller checked it is a schedule's) by `update`, by one record.
    fn update_schedule(&self, _timer: Timer, _update: ScheduleUpdate) -> Result<UpdateOutcome> {
        Err(crate::error::Error::invalid("scheduler", "recurring schedules need the wheel scheduler"))
    }

    /// Writes `replacement` in place of the timer a handle names (`timer`:
    /// the message's own), if it is pending, by one record; hands it back
    /// if it was not (nothing written).
    fn replace(
        &self,
        _timer: Timer,
        _replacement: Box<crate::message::Replacement>,
    ) -> Result<crate::message::ReplaceAnswer> {
        Err(crate::error::Error::invalid("scheduler", "replacing by key needs the wheel scheduler"))
    }

    /// Moves `timer` (a timed message record the caller checked, or the
    /// latest reschedule of it) to `deliver_at_ms`, once a reschedule record is in the log.
    fn reschedule(&self, timer: Timer, deliver_at_ms: u64) -> Result<RescheduleOutcome>;

    /// The scheduler's latest counters and gauges.
    fn stats(&self) -> TimerStats;

    /// The commit-log offset below which the scheduler holds the timer of
    /// every timed record, given the dispatcher's progress `dispatched`
    /// (the scheduler may still be taking in what it was handed).
    fn held_below(&self, dispatched: u64) -> u64;

    /// Returns once everything handed to the scheduler before the call is
    /// taken in and its gauges are refreshed.
    fn refresh(&self) -> Result<()>;

    /// The first `limit` pending timers due in `window_ms`, by deliver time,
    /// each as it stood at one instant (none of them had fired then).
    fn pending(&self, window_ms: std::ops::Range<u64>, limit: usize) -> Result<Vec<PendingEntry>>;

    /// Whether each of `timers` (messages' own timers) is pending, as the
    /// timer that counts now (its latest reschedule's), at one instant: one
    /// answer per timer, in order.
    fn pending_of(&self, timers: Vec<Timer>) -> Result<Vec<Option<PendingEntry>>>;

    /// What became of `timer` (a message's own timer), as the timer that
    /// counts for its message now, at one instant.
    fn fate_of(&self, timer: Timer) -> Result<crate::timer::wheel::window::TimerFate>;

    /// The pending timers counted by due time between `bounds_ms`
    /// (ascending): one count before the first bound, one per interval, one
    /// from the last bound on.
    fn pending_counts(&self, bounds_ms: Vec<u64>) -> Result<Vec<u64>>;
}
