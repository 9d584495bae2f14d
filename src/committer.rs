//! The committer: the one thread that makes the commit log durable when
//! something waits for it (a sync-mode put or cancel, a ticket, the ticking
//! thread's deliveries in sync mode). Each wake-up syncs everything
//! appended until then, so one sync serves every waiter (group commit). It
//! is apart from the flusher, whose periodic cycle also syncs the wheel's
//! files, the consume queues and the checkpoint: a put never waits behind
//! those.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::commitlog::CommitLog;
use crate::error::Result;
use crate::threads::StopFlag;

pub(crate) struct Committer {
    pub log: Arc<CommitLog>,
    /// Woken after each sync: in sync flush mode the dispatcher indexes only what is durable.
    pub dispatch_wake: Sender<()>,
}

impl Committer {
    /// The thread's body: syncs the log at each wake-up until `stop` is set
    /// (the flusher's final cycle syncs what is left). A failed sync has
    /// poisoned the log and woken every waiter; the thread goes on so
    /// later waiters learn of it too.
    pub fn run(self, wakes: Receiver<()>, stop: StopFlag) -> Result<()> {
        while wakes.recv().is_ok() && !stop.is_set() {
            if self.log.flush().is_ok() {
                let _ = self.dispatch_wake.try_send(());
            }
        }
        Ok(())
    }
}
