//! The wheel's side of the scheduler seam: timers, progress and cancels go
//! to the ticking thread over its command channel; the thread alone decides
//! what fires.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, Sender};

use crate::consume_queue::ConsumeQueue;
use crate::error::{Error, Result};
use crate::format::record::{MessageView, RescheduleView};
use crate::message::{CancelOutcome, RescheduleOutcome};
use crate::scheduler::SchedulerFront;
use crate::stats::TimerStats;
use crate::timer::Timer;
use crate::timer::tick::{Control, WheelCommand, WheelShared};
use crate::timer::window::PendingEntry;

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
        self.send(command(reply)).map_err(|_| Error::Closed)?;
        answer.recv_timeout(self.timeout).map_err(|e| unanswered(e, self.timeout))
    }
}

/// What a call the ticking thread did not answer means: the thread is gone
/// ([`Error::Closed`]), or it has not answered yet ([`Error::TickerBusy`]:
/// stalled on a full disk, say, and the caller may wait; this used to be
/// `Closed` too, and `delaywheel drain` gave up at once on a full disk).
fn unanswered(e: RecvTimeoutError, waited: Duration) -> Error {
    match e {
        RecvTimeoutError::Timeout => Error::TickerBusy { waited_ms: waited.as_millis() as u64 },
        RecvTimeoutError::Disconnected => Error::Closed,
    }
}

impl SchedulerFront for WheelFront {
    fn index(&self, offset: u64, _len: usize, view: &MessageView<'_>) -> Result<Option<Arc<ConsumeQueue>>> {
        let timer = Timer { deliver_at_ms: view.timing.deliver_at_ms, message_offset: offset };
        self.send(WheelCommand::Insert(timer))?;
        Ok(None)
    }

    fn index_rescheduled(&self, offset: u64, view: &RescheduleView) -> Result<()> {
        let timer = Timer { deliver_at_ms: view.deliver_at_ms, message_offset: offset };
        // Its message is pinned by the record's ledger entry (see `durable/pins.rs`).
        self.send(WheelCommand::Insert(timer))
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

    fn reschedule(&self, timer: Timer, deliver_at_ms: u64) -> Result<RescheduleOutcome> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Reschedule(deliver_at_ms, reply)))?
    }

    fn stats(&self) -> TimerStats {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
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

    fn pending_counts(&self, bounds_ms: Vec<u64>) -> Result<Vec<u64>> {
        self.ask(|reply| WheelCommand::PendingCounts { bounds_ms, reply })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticker_that_does_not_answer_yet_is_busy_and_one_that_is_gone_is_closed() {
        let wait = Duration::from_millis(20);
        let (reply, answer) = crossbeam_channel::bounded::<()>(1);
        let late = answer.recv_timeout(wait).map_err(|e| unanswered(e, wait));
        assert!(matches!(late, Err(Error::TickerBusy { waited_ms: 20 })), "{late:?}");
        drop(reply);
        let gone = answer.recv_timeout(wait).map_err(|e| unanswered(e, wait));
        assert!(matches!(gone, Err(Error::Closed)), "{gone:?}");
    }
}
