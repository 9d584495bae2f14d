//! The one face both schedulers show the rest of the store: the dispatcher
//! hands every timed message to it, the store cancels through it and reads
//! its counters. [`WheelScheduling`] fronts the timing wheel's ticking thread
//! (`src/timer/`); `schedule::BucketScheduling` fronts the RocketMQ 4.x
//! baseline (`src/schedule/`). Which one a store uses is
//! [`Config::with_scheduler`](crate::Config::with_scheduler).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::consume_queue::ConsumeQueue;
use crate::error::{Error, Result};
use crate::format::record::MessageView;
use crate::message::CancelOutcome;
use crate::stats::TimerStats;
use crate::timer::tick::WheelCommand;
use crate::timer::wheel::Timer;

/// Where timed messages wait until they are due.
pub(crate) trait Scheduling: Send + Sync {
    /// Indexes the timed message record at `offset`, `len` bytes long. Called
    /// by the dispatcher in commit-log order; returns the consume queue it
    /// appended to, if any.
    fn index(&self, offset: u64, len: usize, view: &MessageView<'_>) -> Result<Option<Arc<ConsumeQueue>>>;

    /// Decides the fate of `timer` (a timed message record the caller checked):
    /// `Cancelled` once a cancel record is in the log, or `AlreadyDelivered`.
    fn cancel(&self, timer: Timer) -> Result<CancelOutcome>;

    /// The scheduler's latest counters and gauges.
    fn stats(&self) -> TimerStats;
}

/// The wheel's front: timers and cancels go to the ticking thread over its
/// command channel; the thread alone decides what fires.
pub(crate) struct WheelScheduling {
    pub commands: Sender<WheelCommand>,
    pub stats: Arc<Mutex<TimerStats>>,
    /// How long a cancel waits for the ticking thread's answer.
    pub timeout: Duration,
}

impl Scheduling for WheelScheduling {
    fn index(&self, offset: u64, _len: usize, view: &MessageView<'_>) -> Result<Option<Arc<ConsumeQueue>>> {
        let timer = Timer { deliver_at_ms: view.timing.deliver_at_ms, message_offset: offset };
        self.commands
            .send(WheelCommand::Insert(timer))
            .map_err(|_| Error::invalid("dispatch", "the ticking thread has stopped"))?;
        Ok(None)
    }

    fn cancel(&self, timer: Timer) -> Result<CancelOutcome> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.commands.send(WheelCommand::Cancel(timer, reply)).map_err(|_| Error::Closed)?;
        answer.recv_timeout(self.timeout).map_err(|_| Error::Closed)?
    }

    fn stats(&self) -> TimerStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
