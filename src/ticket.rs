//! A put that does not wait for the disk: [`Store::submit`](crate::Store::submit)
//! appends the record and hands back a [`PutTicket`] that tells when it is
//! durable. A producer keeps as many in flight as it likes; the committer
//! (`committer.rs`) syncs whatever is appended when it wakes, so one sync
//! serves every ticket of every producer below it (group commit).
//!
//! The ticket is a [`Future`] as well as a blocking [`wait`](PutTicket::wait):
//! async code awaits it on any executor, without a thread per put and
//! without the store depending on an async runtime: the sync that makes
//! the log durable past the record wakes the task.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::commitlog::CommitLog;
use crate::error::{Error, Result};
use crate::message::{Receipt, Written};

/// A message appended to the commit log, on its way to the disk. It stands
/// (and is delivered) whatever the ticket is used for: dropping the ticket
/// changes nothing.
#[must_use = "a ticket tells when the put is durable"]
pub struct PutTicket {
    receipt: Receipt,
    /// Just past the record.
    end: u64,
    log: Arc<CommitLog>,
}

impl PutTicket {
    pub(crate) fn new(receipt: Receipt, end: u64, log: Arc<CommitLog>) -> Self {
        Self { receipt, end, log }
    }

    /// The put's receipt: its offset, and for a timer the handle that cancels it.
    pub fn receipt(&self) -> Receipt {
        self.receipt
    }

    /// Whether the record is on disk now. Errors: [`Error::Poisoned`] if a
    /// flush failed before it was (what was not durable then cannot be
    /// vouched for).
    pub fn is_durable(&self) -> Result<bool> {
        if self.log.durable_end() >= self.end {
            return Ok(true);
        }
        self.log.check_poison().map(|()| false)
    }

    /// Blocks until the record is on disk, at most `timeout`, and returns
    /// the receipt. Errors: [`Error::NotYetDurable`] if `timeout` passes
    /// first (the message still stands); [`Error::Poisoned`] if a flush failed.
    pub fn wait(&self, timeout: Duration) -> Result<Receipt> {
        let started = Instant::now();
        if self.log.wait_durable(self.end, timeout)? {
            return Ok(self.receipt);
        }
        let waited_ms = started.elapsed().as_millis() as u64;
        Err(Error::NotYetDurable { written: Written::Put(self.receipt), waited_ms })
    }

    fn ready(&self) -> Option<Result<Receipt>> {
        match self.is_durable() {
            Ok(true) => Some(Ok(self.receipt)),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// Resolves once the record is on disk (or with [`Error::Poisoned`]).
impl Future for PutTicket {
    type Output = Result<Receipt>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(done) = self.ready() {
            return Poll::Ready(done);
        }
        self.log.wake_when_durable(self.end, cx.waker());
        // Looked at again after registering: a flush in between woke nobody.
        self.ready().map_or(Poll::Pending, Poll::Ready)
    }
}

impl std::fmt::Debug for PutTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutTicket").field("receipt", &self.receipt).field("end", &self.end).finish()
    }
}
