//! The bucket scheduler's thread (`dw-schedule`): one poll task per
//! level every [`POLL_INTERVAL`], each delivering its queue's head while it is
//! due; cancels are decided here too, so a timer gets one fate.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::{DelayOffsets, POLL_INTERVAL};
use crate::clock::Clock;
use crate::commitlog::CommitLog;
use crate::consume_queue::ConsumeQueue;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::record::{
    CANCEL_LEN, CancelView, MessageView, RecordKind, check_crc, encode_cancel, encode_rescheduled,
};
use crate::message::CancelOutcome;
use crate::stats::TimerStats;
use crate::sync::Locked;
use crate::threads::StopFlag;
use crate::timer::Timer;

/// What the store asks of the poller.
pub(crate) enum ScheduleCommand {
    /// Cancel this timer (waiting in `level`'s queue) and answer what became of it.
    Cancel { timer: Timer, level: u16, reply: Sender<Result<CancelOutcome>> },
}

/// The poller's state: one queue and one offset per level.
pub(crate) struct Poller {
    pub log: Arc<CommitLog>,
    /// Level `i + 1`'s queue, with the index of its first undelivered entry.
    pub queues: Vec<(Arc<ConsumeQueue>, u64)>,
    pub offsets: DelayOffsets,
    pub clock: Arc<dyn Clock>,
    pub stats: Arc<Mutex<TimerStats>>,
    /// Woken after copies are appended.
    pub dispatch_wake: Sender<()>,
    /// Sync flush mode: the flusher, woken after copies are appended (the
    /// dispatcher indexes only what is durable).
    pub commit_wake: Option<Sender<()>>,
    /// The dispatcher's progress, and the log end at open: nothing is polled
    /// until the replay has rebuilt the level queues.
    pub dispatched: Arc<AtomicU64>,
    pub replay_end: u64,
    /// Offsets of cancelled messages still in their queue.
    pub cancelled: HashSet<u64>,
    pub persist_interval: Duration,
    /// `false`: index only, deliver nothing (`delaywheel recover`).
    pub deliver: bool,
}

impl Poller {
    /// The thread's body: runs until `stop` is set, then persists the offsets.
    pub fn run(mut self, commands: Receiver<ScheduleCommand>, stop: StopFlag) -> Result<()> {
        if let Err(e) = self.run_inner(&commands, &stop) {
            tracing::error!(error = %e, "the schedule thread stopped");
            self.log.poison(&format!("bucket scheduler: {e}"));
        }
        Ok(())
    }

    fn run_inner(&mut self, commands: &Receiver<ScheduleCommand>, stop: &StopFlag) -> Result<()> {
        if !self.wait_for_replay(stop) {
            return Ok(());
        }
        self.restore()?;
        let mut last_persist = Instant::now();
        loop {
            let cycle = Instant::now();
            for command in commands.try_iter() {
                self.handle(command)?;
            }
            if stop.is_set() {
                return self.persist();
            }
            if self.deliver {
                self.poll_all()?;
            }
            if last_persist.elapsed() >= self.persist_interval {
                self.persist()?;
                last_persist = Instant::now();
            }
            self.publish_stats();
            // A cycle longer than the interval polls again at once.
            match commands.recv_timeout(POLL_INTERVAL.saturating_sub(cycle.elapsed())) {
                Ok(command) => self.handle(command)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return self.persist(),
            }
        }
    }

    /// Waits until the dispatcher has replayed the log written before open.
    /// Returns `false` if asked to stop first.
    fn wait_for_replay(&self, stop: &StopFlag) -> bool {
        while self.dispatched.load(Ordering::Acquire) < self.replay_end {
            if stop.is_set() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Clamps each restored offset into its queue and rebuilds the cancelled
    /// set from the cancel records after the oldest pending message.
    fn restore(&mut self) -> Result<()> {
        let _span = tracing::info_span!("restore_buckets").entered();
        let mut oldest_pending = u64::MAX;
        for (level, (queue, next)) in (1u16..).zip(self.queues.iter_mut()) {
            let persisted = *next;
            *next = persisted.min(queue.len());
            if *next != persisted {
                tracing::warn!(level, persisted, clamped = *next, "delay offset past its queue's end");
            }
            if *next < queue.len() {
                oldest_pending = oldest_pending.min(queue.read(*next)?.log_offset);
            }
        }
        self.cancelled = scan_cancels(&self.log, oldest_pending)?;
        tracing::info!(cancelled = self.cancelled.len(), "bucket offsets restored");
        Ok(())
    }

    fn handle(&mut self, command: ScheduleCommand) -> Result<()> {
        let ScheduleCommand::Cancel { timer, level, reply } = command;
        let outcome = self.cancel(timer, level);
        let failed = outcome.is_err();
        let _ = reply.send(outcome);
        if failed {
            return Err(Error::invalid("cancel", "the bucket scheduler could not record a cancel"));
        }
        Ok(())
    }

    /// A queue's entries are in commit-log order, so the message is still
    /// pending exactly when it is at or after its queue's head.
    fn cancel(&mut self, timer: Timer, level: u16) -> Result<CancelOutcome> {
        if self.cancelled.contains(&timer.message_offset) {
            return Ok(CancelOutcome::Cancelled);
        }
        let Some((queue, next)) = self.queues.get(usize::from(level) - 1) else {
            return Ok(CancelOutcome::NotFound);
        };
        let pending = *next < queue.len() && queue.read(*next)?.log_offset <= timer.message_offset;
        if !pending {
            return Ok(CancelOutcome::AlreadyDelivered);
        }
        let now_ms = self.clock.now_ms();
        self.log.append_reserved(CANCEL_LEN, |buf, offset| {
            encode_cancel(buf, offset, now_ms, timer.message_offset, timer.deliver_at_ms);
        })?;
        self.cancelled.insert(timer.message_offset);
        Ok(CancelOutcome::Cancelled)
    }

    /// One pass over every level: deliver each head while it is due.
    fn poll_all(&mut self) -> Result<()> {
        let now_ms = self.clock.now_ms();
        let mut delivered = 0;
        for index in 0..self.queues.len() {
            delivered += self.poll_level(index, now_ms)?;
        }
        if delivered > 0 {
            if let Some(commit) = &self.commit_wake {
                let _ = commit.try_send(());
            }
            let _ = self.dispatch_wake.try_send(());
        }
        Ok(())
    }

    /// Delivers level `index + 1`'s due head entries; stops at the first that is not due.
    fn poll_level(&mut self, index: usize, now_ms: u64) -> Result<usize> {
        let (queue, mut next) = (Arc::clone(&self.queues[index].0), self.queues[index].1);
        let mut delivered = 0;
        while next < queue.len() {
            let entry = queue.read(next)?;
            if entry.time_ms > now_ms {
                break;
            }
            if !self.cancelled.remove(&entry.log_offset) {
                let _span =
                    tracing::trace_span!("deliver", level = index + 1, offset = entry.log_offset).entered();
                self.deliver_copy(entry.log_offset, now_ms)?;
                delivered += 1;
            }
            next += 1;
            self.queues[index].1 = next;
        }
        Ok(delivered)
    }

    /// Writes the message at `offset` again, flagged as delivered, for the
    /// dispatcher to index into its real topic.
    fn deliver_copy(&mut self, offset: u64, now_ms: u64) -> Result<()> {
        let original = self.log.read(offset)?;
        let deliver_at_ms = match original.kind {
            RecordKind::Message => {
                MessageView::parse(&original.bytes)
                    .map_err(|kind| self.log.corruption_at(offset, kind))?
                    .timing
                    .deliver_at_ms
            }
            kind => {
                let why = format!("a schedule queue names a {kind:?} record");
                return Err(self.log.corruption_at(offset, CorruptionKind::BadReference(why)));
            }
        };
        self.log.append_reserved(original.bytes.len(), |buf, at| {
            encode_rescheduled(buf, at, &original.bytes, now_ms);
        })?;
        let mut stats = self.stats.locked();
        stats.delivered += 1;
        if now_ms < deliver_at_ms {
            stats.early += 1;
        }
        // Early (counted above) is no lateness.
        stats.record_lateness(now_ms, now_ms.saturating_sub(deliver_at_ms), 1);
        Ok(())
    }

    fn persist(&mut self) -> Result<()> {
        let offsets: Vec<u64> = self.queues.iter().map(|(_, next)| *next).collect();
        self.offsets.persist(&offsets)
    }

    fn publish_stats(&self) {
        let waiting: u64 = (self.queues.iter())
            .map(|(queue, next)| {
                debug_assert!(*next <= queue.len(), "the poller is past its queue's end");
                queue.len() - next
            })
            .sum();
        let mut stats = self.stats.locked();
        // Saturating: restored from the oldest queue's position, the set may
        // also hold cancels of messages another queue has already passed.
        stats.pending = waiting.saturating_sub(self.cancelled.len() as u64);
        stats.refreshes += 1;
    }
}

/// The messages named by the cancel records from `from` to the log's end.
fn scan_cancels(log: &CommitLog, from: u64) -> Result<HashSet<u64>> {
    let mut cancelled = HashSet::new();
    let mut at = from.max(log.start());
    while at < log.write_end() {
        let (found, next) = log.visit_trusted(at, |offset, kind, bytes| {
            if kind != RecordKind::Cancel {
                return Ok(None);
            }
            check_crc(bytes, offset)
                .and_then(|()| CancelView::parse(bytes))
                .map(|c| Some(c.message_offset))
                .map_err(|kind| log.corruption_at(offset, kind))
        })?;
        if let Some(message_offset) = found? {
            cancelled.insert(message_offset);
        }
        at = next;
    }
    Ok(cancelled)
}
