//! The wheel's side of the scheduler seam: timers, progress and cancels go
//! to the ticking thread over its command channel; the thread alone decides
//! what fires.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::consume_queue::ConsumeQueue;
use crate::error::{Error, Result};
use crate::format::record::MessageView;
use crate::message::CancelOutcome;
use crate::scheduler::SchedulerFront;
use crate::stats::TimerStats;
use crate::timer::Timer;
use crate::timer::tick::WheelCommand;

/// The wheel's front.
pub(crate) struct WheelFront {
    pub commands: Sender<WheelCommand>,
    pub stats: Arc<Mutex<TimerStats>>,
    /// How long a cancel waits for the ticking thread's answer.
    pub timeout: Duration,
}

impl WheelFront {
    fn send(&self, command: WheelCommand) -> Result<()> {
        self.commands.send(command).map_err(|_| Error::invalid("dispatch", "the ticking thread has stopped"))
    }
}

impl SchedulerFront for WheelFront {
    fn index(&self, offset: u64, _len: usize, view: &MessageView<'_>) -> Result<Option<Arc<ConsumeQueue>>> {
        let timer = Timer { deliver_at_ms: view.timing.deliver_at_ms, message_offset: offset };
        self.send(WheelCommand::Insert(timer))?;
        Ok(None)
    }

    fn indexed_below(&self, offset: u64) -> Result<()> {
        self.send(WheelCommand::Progress(offset))
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
