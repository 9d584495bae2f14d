//! The `dw-prefault` thread: gets the writers' next pages and files
//! ready before they need them, so a burst of appends copies into pages that
//! are already there instead of waiting on page faults and file creation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::commitlog::CommitLog;
use crate::consume_queue::QueueRegistry;
use crate::error::Result;
use crate::threads::StopFlag;
use crate::timer::log::FaultAhead;

/// How often the thread repeats that it cannot make queue files ahead.
const WARNING_INTERVAL: Duration = Duration::from_secs(60);
/// How long it sleeps with nothing to do, unless woken.
const IDLE: Duration = Duration::from_millis(100);

/// Faults in commit-log pages ahead of the writer, timer-log pages ahead of
/// the ticking thread, and makes each consume queue's next file ahead of the
/// dispatcher.
pub(crate) struct Prefaulter {
    pub log: Arc<CommitLog>,
    pub queues: Arc<QueueRegistry>,
    pub timer_logs: [Arc<FaultAhead>; 2],
}

impl Prefaulter {
    /// The thread's body. Failing to make a queue file ahead is only logged
    /// (once a minute): the dispatcher makes the file itself when it gets there.
    pub fn run(self, wake: Receiver<()>, stop: StopFlag) -> Result<()> {
        let mut warned: Option<Instant> = None;
        while !stop.is_set() {
            if let Err(e) = self.queues.prepare_next_files()
                && warned.is_none_or(|at| at.elapsed() >= WARNING_INTERVAL)
            {
                tracing::warn!(error = %e, "could not make a consume-queue file ahead of need");
                warned = Some(Instant::now());
            }
            self.timer_logs.iter().for_each(|log| log.fault_in());
            if !self.log.prefault_ahead() {
                let _ = wake.recv_timeout(IDLE);
            }
        }
        Ok(())
    }
}
