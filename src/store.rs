//! The façade: `Store` offers put, cancel, consumers, stats, reclaim and
//! close. Opening (recovery, construction, starting the threads) is
//! `open.rs`; the layout of a store directory is `format/layout.rs`.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::commitlog::{CommitLog, RecoveryReport};
use crate::config::{Config, FlushMode};
use crate::consume_queue::QueueRegistry;
use crate::consumer::Consumer;
use crate::durable::FlushSignal;
use crate::error::{Error, Result};
use crate::format::record::{MessageView, RecordKind, Timing, encode_message};
use crate::message::{CancelOutcome, Handle, Message, Receipt, RescheduleOutcome, Written, validate_topic};
use crate::offsets::{OffsetStore, POSITIONS_TOPIC};
use crate::retention::{ReclaimReport, Retainer};
use crate::scheduler::SchedulerFront;
use crate::sealed::SealedHandle;
use crate::stats::RetentionCounters;
use crate::sync::ReadWrite;
use crate::threads::Threads;
use crate::timer::Timer;
use crate::timer::levels::DelayLevels;
use crate::timer::tick::WheelShared;

mod dedup;
mod puts;
mod queries;
mod schedules;

pub use schedules::SCHEDULES_SCANNED;

/// The consumer group of [`Store::consumer`].
pub const DEFAULT_GROUP: &str = "default";

/// An open store. Dropping it stops its threads; [`close`](Store::close) also reports errors.
pub struct Store {
    pub(crate) config: Config,
    pub(crate) levels: DelayLevels,
    pub(crate) log: Arc<CommitLog>,
    pub(crate) queues: Arc<QueueRegistry>,
    /// Timed messages by topic and key (see [`pending_by_key`](Self::pending_by_key)),
    /// messages by topic and dedup key (see `dedup.rs`).
    pub(crate) keys: Arc<crate::key_index::KeyIndexes>,
    /// What the dedup index may not hold yet, and the dedup window.
    pub(crate) dedup: crate::dedup::Dedup,
    /// Pending timers per topic (the wheel scheduler only).
    pub(crate) topics: Option<Arc<crate::topic_counts::TopicCounts>>,
    pub(crate) offsets: Arc<OffsetStore>,
    pub(crate) wheel: Arc<WheelShared>,
    /// `true` while puts are accepted; puts hold it shared, close takes it exclusively.
    pub(crate) accepting: RwLock<bool>,
    pub(crate) wakes: Wakes,
    /// The wheel or the buckets: cancels go through it, and its counters come from it.
    pub(crate) scheduler: Arc<dyn SchedulerFront>,
    pub(crate) dispatched: Arc<AtomicU64>,
    pub(crate) threads: Option<Threads>,
    pub(crate) recovery: RecoveryReport,
    /// Deletes old segments (wheel scheduler only; the bucket baseline keeps all).
    pub(crate) retainer: Option<Arc<Retainer>>,
    pub(crate) retention: Arc<RetentionCounters>,
    /// Threads waiting for disk space: `put` answers `DiskFull` meanwhile.
    pub(crate) stall: Arc<crate::stall::Stall>,
    pub(crate) _lock: crate::fs::DirLock,
}

/// Senders that wake background threads (each a channel of capacity 1).
pub(crate) struct Wakes {
    pub dispatch: Sender<()>,
    pub prefault: Sender<()>,
    pub flush: Sender<FlushSignal>,
    /// The committer: sync the log now (see `committer.rs`).
    pub commit: Sender<()>,
    pub retention: Sender<()>,
}

impl Store {
    /// Cancels the timer `handle` names. `Cancelled`: it will never fire (a
    /// cancel record is in the commit log), also when asked again, at any
    /// later time; `AlreadyDelivered`: it has fired; `NotFound`: no timed
    /// message with that deliver time is at that offset.
    ///
    /// In sync flush mode `Cancelled` is answered once the cancel record is
    /// on disk, so a power loss cannot bring the timer back.
    ///
    /// Errors: [`Error::Closed`] after close; [`Error::TickerBusy`] if the
    /// ticking thread did not answer within the put timeout (waiting for disk
    /// space, say: retry); [`Error::Poisoned`] after a failed
    /// flush; an I/O error if the cancel record could not be written. In
    /// sync mode, [`Error::NotYetDurable`] if the cancel record was not on
    /// disk within the put timeout: the timer will not fire, unless a power
    /// loss takes the cancel record first (cancelling again is harmless).
    pub fn cancel(&self, handle: Handle) -> Result<CancelOutcome> {
        let outcome = self.cancel_unsynced(handle)?;
        if outcome == CancelOutcome::Cancelled && self.config.flush_mode == FlushMode::Sync {
            // The cancel record is appended: the answer holds once it is durable.
            self.wait_durable_for(self.log.write_end(), Written::Cancel(handle))?;
        }
        Ok(outcome)
    }

    /// [`cancel`](Self::cancel) for many timers, answered in order. In sync
    /// mode the call waits once, for all the cancel records together (as
    /// [`put_batch`](Self::put_batch) does for messages), instead of once per
    /// timer, and the ticking thread decides them all in one go. An error
    /// (the store closing) may leave some cancelled: cancelling again is harmless.
    ///
    /// Errors: those of `cancel`.
    pub fn cancel_batch(&self, handles: &[Handle]) -> Result<Vec<CancelOutcome>> {
        if !*self.accepting.reading() {
            return Err(Error::Closed);
        }
        let found: Vec<bool> = handles.iter().map(|&handle| self.is_timer(handle)).collect();
        let timers: Vec<Timer> = (handles.iter().zip(&found))
            .filter(|(_, found)| **found)
            .map(|(h, _)| Timer { deliver_at_ms: h.deliver_at_ms, message_offset: h.offset })
            .collect();
        // The ticking thread decides them all before the first answer is awaited.
        let mut decided = self.scheduler.cancel_many(&timers)?.into_iter();
        let outcomes: Vec<CancelOutcome> = found
            .iter()
            .map(|found| match found {
                true => decided.next().expect("one answer per timer"),
                false => CancelOutcome::NotFound,
            })
            .collect();
        let last_cancelled =
            handles.iter().zip(&outcomes).rev().find(|(_, o)| **o == CancelOutcome::Cancelled);
        if let (Some((&handle, _)), FlushMode::Sync) = (last_cancelled, self.config.flush_mode) {
            self.wait_durable_for(self.log.write_end(), Written::Cancel(handle))?;
        }
        Ok(outcomes)
    }

    /// A cancel whose record is appended, not yet waited for.
    fn cancel_unsynced(&self, handle: Handle) -> Result<CancelOutcome> {
        if !*self.accepting.reading() {
            return Err(Error::Closed);
        }
        if !self.is_timer(handle) {
            return Ok(CancelOutcome::NotFound);
        }
        let timer = Timer { deliver_at_ms: handle.deliver_at_ms, message_offset: handle.offset };
        self.scheduler.cancel(timer)
    }

    /// Moves the timer `handle` names to `deliver_at_ms` (epoch ms; a time in
    /// the past means now). `Rescheduled`: it fires once, at the new time,
    /// and never at the old one, on whatever wheel level the new time falls;
    /// the handle stays valid (a later cancel or reschedule takes the same
    /// handle). The payload is not rewritten: a 52-byte reschedule record
    /// goes to the commit log, as a cancel record does, and it alone decides
    /// which schedule holds after a crash (the old one if it is lost, the
    /// new one if it is there; never both, never neither).
    /// `AlreadyDelivered` and `Cancelled` change nothing; `NotFound`: no
    /// timed message with that deliver time is at that offset.
    ///
    /// ```
    /// # use delaywheel::{Config, Message, RescheduleOutcome, Store};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let deadline = store.put(Message::new("orders", "cancel if unpaid").delay(Duration::from_secs(1800)))?;
    /// let handle = deadline.handle().expect("a timer");
    /// // The customer asked for ten more minutes.
    /// let later = handle.deliver_at_ms + 600_000;
    /// assert_eq!(store.reschedule(handle, later)?, RescheduleOutcome::Rescheduled);
    /// assert_eq!(store.pending(later..later + 1, 1)?[0].deliver_at_ms, later);
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// In sync flush mode `Rescheduled` is answered once the record is on disk.
    ///
    /// Errors: [`Error::Invalid`] naming `deliver_at_ms` past the end of the
    /// year 9999, or with the bucket scheduler (it cannot reschedule), or
    /// naming `handle` for a recurring schedule's (see [`Store::schedule`]); else
    /// those of [`cancel`](Self::cancel), with [`Written::Reschedule`].
    pub fn reschedule(&self, handle: Handle, deliver_at_ms: u64) -> Result<RescheduleOutcome> {
        if !*self.accepting.reading() {
            return Err(Error::Closed);
        }
        if deliver_at_ms > crate::message::MAX_DELIVER_AT_MS {
            let why = format!("{deliver_at_ms} ms is past the clock's range (the end of year 9999)");
            return Err(Error::invalid("deliver_at_ms", why));
        }
        match self.timer_named(handle) {
            None => return Ok(RescheduleOutcome::NotFound),
            Some(true) => {
                let why = "names a recurring schedule: its occurrences follow its recurrence, not one by one";
                return Err(Error::invalid("handle", why));
            }
            Some(false) => {}
        }
        let timer = Timer { deliver_at_ms: handle.deliver_at_ms, message_offset: handle.offset };
        let outcome = self.scheduler.reschedule(timer, deliver_at_ms)?;
        if outcome == RescheduleOutcome::Rescheduled && self.config.flush_mode == FlushMode::Sync {
            self.wait_durable_for(self.log.write_end(), Written::Reschedule(handle))?;
        }
        Ok(outcome)
    }

    /// [`reschedule`](Self::reschedule) to `delay` from now (the store's clock).
    pub fn reschedule_in(&self, handle: Handle, delay: Duration) -> Result<RescheduleOutcome> {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.reschedule(handle, self.config.clock.now_ms().saturating_add(delay_ms))
    }

    /// Waits until the message of `receipt` is on disk, at most `timeout`:
    /// what to do after [`Error::NotYetDurable`], or in async flush mode to
    /// know a put survives a power loss (it asks the flusher to sync now).
    ///
    /// Errors: [`Error::NotYetDurable`] if `timeout` passes first (the
    /// message still stands); [`Error::Poisoned`] if a flush failed, after
    /// which nothing not yet durable can be vouched for.
    pub fn wait_durable(&self, receipt: &Receipt, timeout: Duration) -> Result<()> {
        // The durable end is a record boundary: past the offset, past the record.
        self.wait_durable_until(receipt.offset + 1, Written::Put(*receipt), timeout)
    }

    /// Wakes the committer and waits, up to the put timeout, until the log is
    /// durable to `end`, where the record of `written` ends.
    fn wait_durable_for(&self, end: u64, written: Written) -> Result<()> {
        self.wait_durable_until(end, written, self.config.put_timeout)
    }

    fn wait_durable_until(&self, end: u64, written: Written, timeout: Duration) -> Result<()> {
        let started = std::time::Instant::now();
        let _ = self.wakes.commit.try_send(());
        if self.log.wait_durable(end, timeout)? {
            return Ok(());
        }
        Err(Error::NotYetDurable { written, waited_ms: started.elapsed().as_millis() as u64 })
    }

    /// Seals `handle` with the key from [`Config::with_handle_key`], for
    /// handing to a client that may cancel it with
    /// [`cancel_sealed`](Self::cancel_sealed) (and make up no other).
    ///
    /// Errors: [`Error::Invalid`] if the store has no handle key.
    pub fn seal(&self, handle: Handle) -> Result<SealedHandle> {
        Ok(crate::sealed::seal(self.handle_key()?, handle))
    }

    /// [`cancel`](Self::cancel) for a handle from [`seal`](Self::seal):
    /// cancelled only if the tag was made with this store's key.
    ///
    /// Errors: [`Error::Invalid`] naming the sealed handle's tag if it does
    /// not match (nothing is cancelled), or if the store has no handle key;
    /// else those of `cancel`.
    pub fn cancel_sealed(&self, sealed: SealedHandle) -> Result<CancelOutcome> {
        self.cancel(crate::sealed::unseal(self.handle_key()?, sealed)?)
    }

    /// The handle `sealed` seals, if its tag was made with this store's key:
    /// for [`reschedule`](Self::reschedule) or anything else a client may
    /// ask of a timer it names.
    ///
    /// Errors: those of [`cancel_sealed`](Self::cancel_sealed) for a bad tag.
    pub fn unseal(&self, sealed: SealedHandle) -> Result<Handle> {
        crate::sealed::unseal(self.handle_key()?, sealed)
    }

    fn handle_key(&self) -> Result<&[u8; 32]> {
        let key = self.config.handle_key.as_ref().map(|k| &k.0);
        key.ok_or_else(|| {
            Error::invalid("handle key", "the store was opened without Config::with_handle_key")
        })
    }

    /// Whether a timed message due at `handle.deliver_at_ms` is at `handle.offset`
    /// (or, once retention deleted its segment, its relocated copy).
    /// A handle is user input: anything unreadable there is simply not found.
    fn is_timer(&self, handle: Handle) -> bool {
        self.timer_named(handle).is_some()
    }

    /// Whether `handle` names a timed message's timer (`Some(false)`) or a
    /// recurring schedule's (`Some(true)`), by reading the record it names.
    fn timer_named(&self, handle: Handle) -> Option<bool> {
        if handle.offset >= self.log.write_end() {
            return None;
        }
        let found = self.log.visit_checked(handle.offset, |at, kind, bytes| {
            if at != handle.offset || kind != RecordKind::Message {
                return None;
            }
            let view = MessageView::parse(bytes).ok()?;
            (view.timer_deliver_at_ms() == Some(handle.deliver_at_ms)).then_some(view.schedule)
        });
        found.ok().and_then(|(schedule, _)| schedule)
    }

    /// `Ok` while the store works. Once a background failure stopped it (a
    /// failed flush, a thread that met an error it cannot recover from),
    /// [`Error::Poisoned`] with the reason: nothing more is delivered or
    /// accepted until the store is reopened. Operators' tools poll this so a
    /// wait for deliveries does not outlive the store.
    pub fn health(&self) -> Result<()> {
        self.log.check_poison()?;
        match self.threads.as_ref().and_then(Threads::stopped_early) {
            Some(name) => Err(Error::Poisoned { reason: format!("the dw-{name} thread stopped") }),
            None => Ok(()),
        }
    }

    /// The queues of every topic ([`Config::with_queues_per_topic`]).
    pub fn queues_per_topic(&self) -> u32 {
        self.config.queues_per_topic
    }

    /// The largest body a put accepts ([`Config::with_max_body_bytes`]).
    pub fn max_body_bytes(&self) -> usize {
        self.config.max_body_bytes()
    }

    /// How long a put waits for its record to be durable, or for room
    /// ([`Config::with_put_timeout`]): for a caller that waits on
    /// [`PutTicket`](crate::PutTicket)s itself, as `put` would.
    pub fn put_timeout(&self) -> Duration {
        self.config.put_timeout
    }

    /// Makes every consumer offset committed before the call durable before
    /// it returns (the flusher otherwise checkpoints them with its next
    /// cycle): they are appended to the commit log as a positions message
    /// and made durable by the committer's next sync, which every put and
    /// cancel waiting meanwhile shares. Whatever was appended before them is
    /// durable with them, so they never count a message a power loss could
    /// take back. A server that hands a message out and must never hand it
    /// out again after a crash calls this in between.
    ///
    /// Errors: [`Error::Io`] naming a segment; [`Error::NotYetDurable`]
    /// ([`Written::Positions`]) if the sync took longer than the put
    /// timeout; [`Error::Poisoned`] after a failed flush.
    pub fn sync_offsets(&self) -> Result<()> {
        let end = self.offsets.record(|body| self.append_positions(body))?;
        self.wait_durable_for(end, Written::Positions)
    }

    /// Appends one positions message (see [`sync_offsets`](Self::sync_offsets));
    /// returns where its record ends. Like cancels, it may exceed the size cap.
    fn append_positions(&self, body: &[u8]) -> Result<u64> {
        let message = Message::new(POSITIONS_TOPIC, body.to_vec()).queue_id(0);
        let fields = message.fields(0, self.config.clock.now_ms(), Timing::default());
        let len = fields.record_len();
        let (offset, prefault) = self.log.append_reserved(len, |buf, at| encode_message(buf, at, &fields))?;
        self.wake_after_append(prefault);
        Ok(offset + len as u64)
    }

    /// Runs one retention pass now (the retention thread also runs one every
    /// check interval): deletes the segments the policy allows, relocating
    /// their pending timers first, and the relocation windows whose timers
    /// have fired. The bucket scheduler keeps every segment.
    pub fn reclaim(&self) -> Result<ReclaimReport> {
        match &self.retainer {
            Some(retainer) => retainer.pass(),
            None => Ok(ReclaimReport::default()),
        }
    }

    /// The topics the store has queues for: those of the messages indexed
    /// into a queue (a timed message's once it fired) and those a consumer
    /// was made for, in no particular order.
    pub fn topics(&self) -> Vec<String> {
        self.queues.topics()
    }

    /// A consumer of `topic`'s queue `queue_id` in the [`DEFAULT_GROUP`]; see
    /// [`consumer_in_group`](Self::consumer_in_group).
    pub fn consumer(&self, topic: &str, queue_id: u32) -> Result<Consumer> {
        self.consumer_in_group(DEFAULT_GROUP, topic, queue_id)
    }

    /// A consumer of `topic`'s queue `queue_id` that commits offsets for
    /// `group`. It starts at the group's committed offset (0 if none) and
    /// sees every message indexed into the queue, timed ones once they fire.
    /// Errors: [`Error::Invalid`] for a topic `put` would refuse or a queue id
    /// not below the configured queues per topic.
    pub fn consumer_in_group(&self, group: &str, topic: &str, queue_id: u32) -> Result<Consumer> {
        validate_topic(topic)?;
        if queue_id >= self.config.queues_per_topic {
            let why =
                format!("{queue_id} is not below the {} queues of a topic", self.config.queues_per_topic);
            return Err(Error::invalid("queue id", why));
        }
        let queue = self.queues.get_or_create(topic, queue_id);
        Ok(Consumer::new(
            Arc::clone(&self.log),
            queue,
            Arc::clone(&self.offsets),
            group,
            Arc::clone(&self.retention),
        ))
    }

    /// The configured delay-level table.
    pub fn delay_levels(&self) -> &DelayLevels {
        &self.levels
    }

    /// What recovery found when this store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Bytes on disk of every file the store writes (see [`Stats::disk`](crate::Stats::disk)).
    pub fn disk_bytes(&self) -> u64 {
        self.stats().disk_bytes
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// Stops accepting puts, indexes everything put, syncs the wheel, writes a
    /// clean checkpoint and joins the threads. Pending timers stay pending and
    /// fire after the next open; deliveries made while closing are indexed
    /// into their queues at the next open.
    ///
    /// Errors: the final flush's failure, [`Error::Poisoned`] if an earlier
    /// flush failed (what was acknowledged before it is on disk), or
    /// [`Error::Invalid`] naming a background thread that panicked.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        let Some(threads) = self.threads.take() else {
            return Ok(());
        };
        *self.accepting.writing() = false;
        // Retention first (it appends relocation records and deletes files),
        // then the dispatcher (it feeds the ticker), the buckets' poller, the
        // ticker (it appends deliveries), then the log, and the final flush.
        let mut spares = Ok(());
        let stopped = threads.stop_all(|name| match name {
            "tick" => self.log.close(),
            // Nothing appends to a queue any more: the files made ahead of
            // need go (after a crash, recovery removes them).
            "prefault" => spares = self.queues.discard_spares(),
            _ => {}
        });
        stopped?;
        spares?;
        self.log.check_poison()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "store did not close cleanly");
        }
    }
}

#[cfg(test)]
mod tests;
