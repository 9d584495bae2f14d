//! The wheel's side of the scheduler seam: timers, progress and cancels go
//! to the ticking thread over its command channel; the thread alone decides
//! what fires.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::consume_queue::ConsumeQueue;
use crate::error::{Error, Result};
use crate::format::record::{MessageView, RescheduleView};
use crate::message::{CancelOutcome, PauseOutcome, ReplaceAnswer, Replacement, RescheduleOutcome};
use crate::receipt::UpdateOutcome;
use crate::schedule::ScheduleUpdate;
use crate::scheduler::SchedulerFront;
use crate::stats::TimerStats;
use crate::sync::Locked;
use crate::timer::Timer;
use crate::timer::tick::{Control, WheelCommand, WheelShared};
use crate::timer::wheel::window::{PendingEntry, TimerFate};

/// The wheel's front.
pub(crate) struct WheelFront {
    pub commands: Sender<WheelCommand>,
    pub shared: Arc<WheelShared>,
    /// Commands sent to the ticking thread (it counts those it handled).
    pub sent: AtomicU64,
    /// How long a cancel or a refresh waits for the ticking thread's answer.
    pub timeout: Duration,
}

impl WheelFront {
    pub fn new(commands: Sender<WheelCommand>, shared: Arc<WheelShared>, timeout: Duration) -> Self {
        Self { commands, shared, sent: AtomicU64::new(0), timeout }
    }

    fn send(&self, command: WheelCommand) -> Result<()> {
        // Counted before it can be handled, so handled >= sent means it was.
        self.sent.fetch_add(1, Ordering::AcqRel);
        self.commands.send(command).map_err(|_| Error::invalid("dispatch", "the ticking thread has stopped"))
    }

    /// Sends a command that answers, and waits for the answer.
    fn ask<T>(&self, command: impl FnOnce(Sender<T>) -> WheelCommand) -> Result<T> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        let asked = Instant::now();
        // Only a thread that is gone refuses the question.
        self.send(command(reply)).map_err(|_| Error::Closed)?;
        answer.recv_timeout(self.timeout).map_err(|_| unanswered(asked.elapsed()))
    }
}

/// A question the ticking thread took and did not answer: it is waiting for
/// disk space, or it dropped the question because answering met damage and
/// it is rebuilding the wheel, or it is busy. The caller may ask again (a
/// thread that is gone refuses the next question with [`Error::Closed`]).
/// Both used to be `Closed`: `delaywheel drain` gave up at once on a full
/// disk, and `recover` on a timer-log entry the store repairs itself.
fn unanswered(waited: Duration) -> Error {
    Error::TickerBusy { waited_ms: waited.as_millis() as u64 }
}

impl SchedulerFront for WheelFront {
    fn index(&self, offset: u64, _len: usize, view: &MessageView<'_>) -> Result<Option<Arc<ConsumeQueue>>> {
        let timer = Timer { deliver_at_ms: view.timing.deliver_at_ms, message_offset: offset };
        self.send(if view.schedule {
            WheelCommand::InsertRecurring(timer)
        } else {
            WheelCommand::Insert(timer)
        })?;
        Ok(None)
    }

    fn index_rescheduled(&self, offset: u64, view: &RescheduleView) -> Result<()> {
        let timer = Timer { deliver_at_ms: view.deliver_at_ms, message_offset: offset };
        // Its message is pinned by the record's ledger entry (see `durable/pins.rs`).
        match view.occurrence {
            Some(_) => self.send(WheelCommand::InsertRecurring(timer)),
            None => self.send(WheelCommand::Insert(timer)),
        }
    }

    fn indexed_below(&self, offset: u64) -> Result<()> {
        self.send(WheelCommand::Progress(offset))
    }

    fn cancel(&self, timer: Timer) -> Result<CancelOutcome> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Cancel(reply)))?
    }

    fn cancel_many(&self, timers: &[Timer]) -> Result<Vec<CancelOutcome>> {
        // All asked before any answer is awaited: the ticking thread takes
        // them in one go, and the caller waits once, not once per timer.
        let answers = timers
            .iter()
            .map(|&timer| {
                let (reply, answer) = crossbeam_channel::bounded(1);
                self.send(WheelCommand::Control(timer, Control::Cancel(reply))).map_err(|_| Error::Closed)?;
                Ok(answer)
            })
            .collect::<Result<Vec<_>>>()?;
        answers
            .into_iter()
            .map(|answer| answer.recv_timeout(self.timeout).map_err(|_| Error::Closed)?)
            .collect()
    }

    fn pause_schedule(&self, timer: Timer, pause: bool) -> Result<PauseOutcome> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Pause(pause, reply)))?
    }

    fn update_schedule(&self, timer: Timer, update: ScheduleUpdate) -> Result<UpdateOutcome> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Update(Box::new(update), reply)))?
    }

    fn replace(&self, timer: Timer, replacement: Box<Replacement>) -> Result<ReplaceAnswer> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Replace(replacement, reply)))?
    }

    fn reschedule(&self, timer: Timer, deliver_at_ms: u64) -> Result<RescheduleOutcome> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Reschedule(deliver_at_ms, reply)))?
    }

    fn stats(&self) -> TimerStats {
        self.shared.stats.locked().clone()
    }

    fn held_below(&self, dispatched: u64) -> u64 {
        // Read in this order: every command sent before the dispatcher
        // published `dispatched` is counted in `sent`.
        let sent = self.sent.load(Ordering::Acquire);
        if self.shared.handled.load(Ordering::Acquire) >= sent {
            return dispatched;
        }
        self.shared.progress.load(Ordering::Acquire).min(dispatched)
    }

    fn refresh(&self) -> Result<()> {
        self.ask(WheelCommand::Refresh)
    }

    fn pending(&self, window_ms: std::ops::Range<u64>, limit: usize) -> Result<Vec<PendingEntry>> {
        self.ask(|reply| WheelCommand::Pending { window_ms, limit, reply })?
    }

    fn pending_of(&self, timers: Vec<Timer>) -> Result<Vec<Option<PendingEntry>>> {
        self.ask(|reply| WheelCommand::PendingOf { timers, reply })?
    }

    fn fate_of(&self, timer: Timer) -> Result<TimerFate> {
        self.ask(|reply| WheelCommand::FateOf { timer, reply })?
    }

    fn pending_counts(&self, bounds_ms: Vec<u64>) -> Result<Vec<u64>> {
        self.ask(|reply| WheelCommand::PendingCounts { bounds_ms, reply })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A question dropped unanswered (the thread rebuilding its wheel) or
    /// left waiting (the thread waiting for disk space) is busy, not closed.
    #[test]
    fn a_ticker_that_does_not_answer_is_busy() {
        let wait = Duration::from_millis(20);
        let (reply, answer) = crossbeam_channel::bounded::<()>(1);
        let started = Instant::now();
        let late = answer.recv_timeout(wait).map_err(|_| unanswered(started.elapsed()));
        assert!(matches!(late, Err(Error::TickerBusy { waited_ms }) if waited_ms >= 20), "{late:?}");
        drop(reply);
        let dropped = answer.recv_timeout(wait).map_err(|_| unanswered(started.elapsed()));
        assert!(matches!(dropped, Err(Error::TickerBusy { .. })), "{dropped:?}");
    }
}
