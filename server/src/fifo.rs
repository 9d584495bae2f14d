//! FIFO: a message group's messages are handed out one at a time, in the
//! order they were sent, as RocketMQ's proxy hands out FIFO messages.
//!
//! A send puts all of a message group's messages in one queue of its topic
//! (`send.rs`), so their order is the queue's. For each consumer group, a
//! queue from which a FIFO message is out — handed out and neither acked nor
//! dead-lettered — is **blocked**: nothing more is read from it until that
//! message is acked or dead-lettered. If its invisible duration ends first,
//! it comes back through the retry queue (read before the topic's queues),
//! and the queue stays blocked by that copy: so the next message of the
//! group waits for every attempt of the one before. Like the proxy, the
//! unit is the queue, not the message group: groups that share a queue wait
//! for each other.
//!
//! The block names the invisibility timer of the message out. The timer is
//! the durable truth: a FIFO message's retry copy is keyed by a marker of
//! its origin queue ([`marker`]), and a group's readers, when made (after a
//! restart, say), find the queues still blocked by looking the markers up
//! among the pending timers of the group's retry topic. One gap is left: a
//! timer that fires in the instant the readers are made, its copy not yet in
//! the retry queue, leaves its queue unblocked, and the next message may be
//! handed out beside the copy.
//!
//! `ForwardMessageToDeadLetterQueue` (what a FIFO PushConsumer calls once
//! its own retries are spent) brings the message's timer due at once and
//! marks it, so that the group's next receive sends its copy to the
//! dead-letter topic instead of out (as it does a copy past the last
//! attempt); the mark lives in memory: after a restart the copy is handed
//! out again, as one more attempt.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use delaywheel::{Handle, Store};

/// The key of a FIFO message's retry copy: where it came from, so that the
/// pending timers of a retry topic tell which queues are blocked.
pub(crate) fn marker(queue: u32) -> String {
    format!("%FIFO%{queue}")
}

/// The blocked queues of one consumer group's readers of one topic.
#[derive(Default)]
pub(crate) struct Blocks {
    /// Queue → the invisibility timer of its FIFO message out.
    out: Mutex<HashMap<u32, Handle>>,
    /// Messages (by their timers' record offsets) to dead-letter when they come back.
    forwarded: Mutex<HashSet<u64>>,
    /// Counts releases, so a waiting receive learns that a queue opened.
    releases: AtomicU64,
    released: tokio::sync::Notify,
}

impl Blocks {
    /// The blocks the pending timers of `retry` (a group's retry topic) leave on `queues` queues.
    pub fn recovered(store: &Store, retry: &str, queues: u32) -> Result<Self, delaywheel::Error> {
        let blocks = Self::default();
        let mut out = blocks.out();
        for queue in 0..queues {
            if let Some(pending) = store.pending_by_key(retry, &marker(queue), 1)?.first() {
                out.insert(queue, pending.handle);
            }
        }
        drop(out);
        Ok(blocks)
    }

    fn out(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Handle>> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forwarded(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.forwarded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a FIFO message of `queue` is out.
    pub fn blocked(&self, queue: u32) -> bool {
        self.out().contains_key(&queue)
    }

    /// A FIFO message of `queue` went out with the invisibility timer `timer`.
    pub fn hand_out(&self, queue: u32, timer: Handle) {
        self.out().insert(queue, timer);
    }

    /// The FIFO message of `queue` went to the dead-letter topic: the queue opens.
    pub fn dead(&self, queue: u32) {
        if self.out().remove(&queue).is_some() {
            self.opened();
        }
    }

    /// The message of `timer` was acked: its queue opens, if it blocked one.
    pub fn acked(&self, timer: Handle) {
        let mut out = self.out();
        let before = out.len();
        out.retain(|_, out| *out != timer);
        if out.len() < before {
            drop(out);
            self.opened();
        }
    }

    fn opened(&self) {
        self.releases.fetch_add(1, Ordering::Release);
        self.released.notify_waiters();
    }

    /// Marks the message of `timer` for the dead-letter topic when it comes back.
    pub fn forward(&self, timer: Handle) {
        self.forwarded().insert(timer.offset);
    }

    /// Whether the message at `log_offset` was marked by [`forward`](Self::forward) (the mark is used up).
    pub fn take_forwarded(&self, log_offset: u64) -> bool {
        self.forwarded().remove(&log_offset)
    }

    /// How many times a queue opened: [`opened_since`](Self::opened_since) waits for more.
    pub fn releases(&self) -> u64 {
        self.releases.load(Ordering::Acquire)
    }

    /// Completes once a queue opened after [`releases`](Self::releases) said `seen`.
    pub async fn opened_since(&self, seen: u64) {
        let notified = self.released.notified();
        tokio::pin!(notified);
        // Registered before the look: a release between the two still wakes it.
        notified.as_mut().enable();
        if self.releases() != seen {
            return;
        }
        notified.await;
    }
}
