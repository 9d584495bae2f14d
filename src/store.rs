//! The façade: `Store` offers put, cancel, consumers, stats, reclaim and
//! close. Opening (recovery, construction, starting the threads) is
//! `open.rs`; the layout of a store directory is `format/layout.rs`.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::buckets::SCHEDULE_TOPIC;
use crate::commitlog::{CommitLog, RecoveryReport};
use crate::config::{Config, FlushMode};
use crate::consume_queue::QueueRegistry;
use crate::consumer::{Consumer, OffsetStore};
use crate::durable::FlushSignal;
use crate::error::{Error, Result};
use crate::format::record::{MessageView, RecordKind, Timing, encode_message};
use crate::message::{CancelOutcome, Handle, Message, Receipt, RescheduleOutcome, Written, validate_topic};
use crate::pending::MAX_COUNT_BOUNDS;
use crate::pending::PendingTimer;
use crate::retention::{ReclaimReport, Retainer, is_size_cap};
use crate::scheduler::SchedulerFront;
use crate::sealed::SealedHandle;
use crate::stats::{DiskUsage, Lateness, RetentionCounters, RetentionStats, Stats};
use crate::threads::Threads;
use crate::ticket::PutTicket;
use crate::timer::Timer;
use crate::timer::levels::DelayLevels;
use crate::timer::tick::WheelShared;

/// The consumer group of [`Store::consumer`].
pub const DEFAULT_GROUP: &str = "default";

/// An open store. Dropping it stops its threads; [`close`](Store::close) also reports errors.
pub struct Store {
    pub(crate) config: Config,
    pub(crate) levels: DelayLevels,
    pub(crate) log: Arc<CommitLog>,
    pub(crate) queues: Arc<QueueRegistry>,
    /// Timed messages by topic and key (see [`pending_by_key`](Self::pending_by_key)).
    pub(crate) keys: Arc<crate::key_index::KeyIndex>,
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
    pub(crate) _lock: crate::open::DirLock,
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
    /// Appends a message. In async flush mode it returns once the message is in
    /// the page cache (a killed process loses nothing); in sync mode once it is
    /// on disk. A timed message is delivered into its topic when due, never
    /// before; its receipt's [`handle`](Receipt::handle) cancels it.
    ///
    /// Errors, with nothing written: [`Error::Invalid`] naming the field of a
    /// message that is not acceptable (topic, body, key, tags, properties,
    /// timing, queue id); [`Error::Busy`] if the indexes stayed behind for the
    /// put timeout; [`Error::DiskFull`] or [`Error::SizeCap`] when a new
    /// segment does not fit; [`Error::Closed`] after close;
    /// [`Error::Poisoned`] after a failed flush (reopen the store).
    ///
    /// One error means the message *was* written: in sync mode, a record
    /// appended but not yet on disk when the put timeout passes answers
    /// [`Error::NotYetDurable`] with the receipt. The message stands and is
    /// delivered (unless a power loss takes it first): do not put it again;
    /// [`wait_durable`](Self::wait_durable) waits for it.
    pub fn put(&self, message: Message) -> Result<Receipt> {
        let (receipt, end) = self.append_message(&message)?;
        if self.config.flush_mode == FlushMode::Sync {
            self.wait_durable_for(end, Written::Put(receipt))?;
        }
        Ok(receipt)
    }

    /// Appends a message and returns at once, with a ticket that resolves
    /// once it is on disk (see [`PutTicket`]): a producer keeps many puts in
    /// flight, and each sync of the log covers all of them. In sync flush
    /// mode the committer is woken now; in async mode the ticket resolves at
    /// the next periodic flush. The message stands as soon as this returns:
    /// it is delivered, and its handle cancels it, whatever becomes of the ticket.
    ///
    /// It never waits for the disk, but like `put` it waits (up to the put
    /// timeout) while the indexes lag: async code that must never block
    /// calls it from `spawn_blocking`, and awaits the ticket anywhere.
    ///
    /// Errors, with nothing written: those of [`put`](Self::put), but never
    /// [`Error::NotYetDurable`] (the ticket tells).
    ///
    /// ```
    /// use std::time::Duration;
    /// use delaywheel::{Config, FlushMode, Message, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()).with_flush_mode(FlushMode::Sync))?;
    /// // Thousands in flight from one thread; every sync covers all appended so far.
    /// let tickets: Vec<_> = (0..1_000)
    ///     .map(|i| store.submit(Message::new("Retry", format!("job-{i}")).delay(Duration::from_secs(5))))
    ///     .collect::<Result<_, _>>()?;
    /// for ticket in &tickets {
    ///     ticket.wait(Duration::from_secs(10))?; // or `ticket.await` in async code
    /// }
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit(&self, message: Message) -> Result<PutTicket> {
        let (receipt, end) = self.append_message(&message)?;
        if self.config.flush_mode == FlushMode::Sync {
            let _ = self.wakes.commit.try_send(());
        }
        Ok(PutTicket::new(receipt, end, Arc::clone(&self.log)))
    }

    /// Checks and appends one message; returns its receipt and where its record ends.
    fn append_message(&self, message: &Message) -> Result<(Receipt, u64)> {
        let queue_id = self.check_message(message)?;
        self.wait_for_indexes()?;
        let accepting = self.accepting.read().unwrap_or_else(|e| e.into_inner());
        if !*accepting {
            return Err(Error::Closed);
        }
        let store_time_ms = self.config.clock.now_ms();
        let (deliver_at_ms, delay_level) = message.resolve_timing(store_time_ms, &self.levels)?;
        let fields = message.fields(queue_id, store_time_ms, Timing { deliver_at_ms, delay_level });
        let len = fields.record_len();
        let append = || self.log.append(len, |buf, offset| encode_message(buf, offset, &fields));
        let (offset, prefault) = match append() {
            Err(e) if is_size_cap(&e) => self.wait_for_retention(append, e)?,
            appended => appended?,
        };
        drop(accepting);
        self.wake_after_append(prefault);
        let deliver_at_ms = (deliver_at_ms != 0).then_some(deliver_at_ms);
        Ok((Receipt { offset, queue_id, store_time_ms, deliver_at_ms }, offset + len as u64))
    }

    /// Appends a batch of messages together: all of them or none. In sync
    /// flush mode it returns once the whole batch is on disk, made durable
    /// by one sync (shared, like every sync, with whatever else was put
    /// meanwhile). Receipts come in input order; the records lie one after
    /// the other in the commit log, in one segment.
    ///
    /// Errors, with nothing of the batch written: [`Error::InBatch`] naming
    /// the position of the first message that is not acceptable and why;
    /// [`Error::Invalid`] (`"batch"`) for a batch larger than a segment;
    /// else those of [`put`](Self::put). [`Error::NotYetDurable`] carries
    /// every receipt ([`Written::Batch`]): the batch stands.
    ///
    /// ```
    /// use delaywheel::{Config, FlushMode, Message, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()).with_flush_mode(FlushMode::Sync))?;
    /// let orders = (0..100).map(|i| Message::new("OrderTimeout", format!("order-{i}")).delay_level(16));
    /// let receipts = store.put_batch(orders)?; // on disk, all 100, after one sync
    /// assert_eq!(receipts.len(), 100);
    /// store.cancel(receipts[42].handle().expect("a timer"))?; // order-42 was paid
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn put_batch(&self, messages: impl IntoIterator<Item = Message>) -> Result<Vec<Receipt>> {
        let (receipts, end) = self.append_batch(messages.into_iter().collect())?;
        if self.config.flush_mode == FlushMode::Sync && !receipts.is_empty() {
            self.wait_durable_for(end, Written::Batch(receipts.clone()))?;
        }
        Ok(receipts)
    }

    /// Appends a batch like [`put_batch`](Self::put_batch) and returns at
    /// once, with one ticket per message, in input order (see
    /// [`submit`](Self::submit)): all of the batch stands, and one sync makes
    /// all of it durable.
    ///
    /// Errors, with nothing of the batch written: those of `put_batch`, but
    /// never [`Error::NotYetDurable`] (the tickets tell).
    pub fn submit_batch(&self, messages: impl IntoIterator<Item = Message>) -> Result<Vec<PutTicket>> {
        let (receipts, end) = self.append_batch(messages.into_iter().collect())?;
        if self.config.flush_mode == FlushMode::Sync && !receipts.is_empty() {
            let _ = self.wakes.commit.try_send(());
        }
        // Every ticket waits for the batch's end: the batch is synced as one.
        let tickets = receipts.into_iter().map(|r| PutTicket::new(r, end, Arc::clone(&self.log)));
        Ok(tickets.collect())
    }

    /// Checks and appends a batch, all or nothing; returns the receipts and
    /// where the batch's last record ends (0 for an empty batch).
    fn append_batch(&self, messages: Vec<Message>) -> Result<(Vec<Receipt>, u64)> {
        let in_batch = |index: usize| move |e: Error| Error::InBatch { index, source: Box::new(e) };
        let queue_ids = (messages.iter().enumerate())
            .map(|(i, m)| self.check_message(m).map_err(in_batch(i)))
            .collect::<Result<Vec<u32>>>()?;
        if messages.is_empty() {
            return Ok((Vec::new(), 0));
        }
        self.wait_for_indexes()?;
        let accepting = self.accepting.read().unwrap_or_else(|e| e.into_inner());
        if !*accepting {
            return Err(Error::Closed);
        }
        let store_time_ms = self.config.clock.now_ms();
        let timings = (messages.iter().enumerate())
            .map(|(i, m)| m.resolve_timing(store_time_ms, &self.levels).map_err(in_batch(i)))
            .collect::<Result<Vec<(u64, u16)>>>()?;
        let fields: Vec<_> = (messages.iter().zip(&queue_ids).zip(&timings))
            .map(|((m, &queue_id), &(deliver_at_ms, delay_level))| {
                m.fields(queue_id, store_time_ms, Timing { deliver_at_ms, delay_level })
            })
            .collect();
        let lens: Vec<usize> = fields.iter().map(|f| f.record_len()).collect();
        let append =
            || self.log.append_batch(&lens, |i, buf, offset| encode_message(buf, offset, &fields[i]));
        let (offsets, prefault) = match append() {
            Err(e) if is_size_cap(&e) => self.wait_for_retention(append, e)?,
            appended => appended?,
        };
        drop(accepting);
        self.wake_after_append(prefault);
        let receipts: Vec<Receipt> = (offsets.iter().zip(&queue_ids).zip(&timings))
            .map(|((&offset, &queue_id), &(deliver_at_ms, _))| Receipt {
                offset,
                queue_id,
                store_time_ms,
                deliver_at_ms: (deliver_at_ms != 0).then_some(deliver_at_ms),
            })
            .collect();
        let end = offsets[offsets.len() - 1] + lens[lens.len() - 1] as u64;
        Ok((receipts, end))
    }

    /// Checks a message before it is put: its fields, its topic, its queue.
    fn check_message(&self, message: &Message) -> Result<u32> {
        message.validate(self.config.max_body_bytes())?;
        if message.topic() == SCHEDULE_TOPIC {
            return Err(Error::invalid(
                "topic",
                format!("{SCHEDULE_TOPIC} is reserved for the bucket scheduler"),
            ));
        }
        message.resolve_queue(self.config.queues_per_topic)
    }

    /// After an append: the dispatcher indexes it, the prefaulter keeps ahead.
    fn wake_after_append(&self, prefault: bool) {
        let _ = self.wakes.dispatch.try_send(());
        if prefault {
            let _ = self.wakes.prefault.try_send(());
        }
    }

    /// Cancels the timer `handle` names. `Cancelled`: it will never fire (a
    /// cancel record is in the commit log), also when asked again, at any
    /// later time; `AlreadyDelivered`: it has fired; `NotFound`: no timed
    /// message with that deliver time is at that offset.
    ///
    /// In sync flush mode `Cancelled` is answered once the cancel record is
    /// on disk, so a power loss cannot bring the timer back.
    ///
    /// Errors: [`Error::Closed`] after close (or if the ticking thread did
    /// not answer within the put timeout); [`Error::Poisoned`] after a failed
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
        if !*self.accepting.read().unwrap_or_else(|e| e.into_inner()) {
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
        if !*self.accepting.read().unwrap_or_else(|e| e.into_inner()) {
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
    /// year 9999, or with the bucket scheduler (it cannot reschedule); else
    /// those of [`cancel`](Self::cancel), with [`Written::Reschedule`].
    pub fn reschedule(&self, handle: Handle, deliver_at_ms: u64) -> Result<RescheduleOutcome> {
        if !*self.accepting.read().unwrap_or_else(|e| e.into_inner()) {
            return Err(Error::Closed);
        }
        if deliver_at_ms > crate::message::MAX_DELIVER_AT_MS {
            let why = format!("{deliver_at_ms} ms is past the clock's range (the end of year 9999)");
            return Err(Error::invalid("deliver_at_ms", why));
        }
        if !self.is_timer(handle) {
            return Ok(RescheduleOutcome::NotFound);
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
        if handle.offset >= self.log.write_end() {
            return false;
        }
        let found = self.log.visit_checked(handle.offset, |at, kind, bytes| {
            at == handle.offset
                && kind == RecordKind::Message
                && MessageView::parse(bytes)
                    .is_ok_and(|v| v.timer_deliver_at_ms() == Some(handle.deliver_at_ms))
        });
        matches!(found, Ok((true, _)))
    }

    /// Back-pressure: waits while the indexes are more than the configured lag
    /// behind the commit log, up to the put timeout, then answers `Busy`
    /// (or `DiskFull` at once if an index waits for room). The lag is the
    /// dispatcher's, which hands timers on to the wheel through a queue of
    /// up to 65,536; while a full disk stalls an index it runs to what the
    /// wheel holds, so a wheel stopped for want of room stops puts too.
    /// (Counting the wheel's queue always cost a fifth of the async put
    /// rate on the 1 M burst.)
    ///
    /// In sync flush mode the indexes take only what is on disk, so the lag
    /// runs from the durable end: records not yet synced are the committer's
    /// to catch up (pipelined puts keep many in flight), not the indexes'.
    fn wait_for_indexes(&self) -> Result<()> {
        let indexable = || match self.config.flush_mode {
            FlushMode::Sync => self.log.durable_end(),
            FlushMode::Async => self.log.write_end(),
        };
        let indexed = || match self.stall.is_stalled() {
            true => self.indexed_below(),
            false => self.dispatched.load(Ordering::Acquire),
        };
        let lag = || indexable().saturating_sub(indexed());
        if lag() <= self.config.max_index_lag {
            return Ok(());
        }
        let started = std::time::Instant::now();
        while lag() > self.config.max_index_lag {
            self.stall.check()?;
            if started.elapsed() >= self.config.put_timeout {
                let waited_ms = started.elapsed().as_millis() as u64;
                return Err(Error::Busy { lag_bytes: lag(), waited_ms });
            }
            self.log.check_poison()?;
            let _ = self.wakes.dispatch.try_send(());
            std::thread::sleep(Duration::from_micros(500));
        }
        Ok(())
    }

    /// Back-pressure at the size cap: wakes retention and retries `append`
    /// until it fits or the put timeout passes, then returns the cap error.
    fn wait_for_retention<T>(&self, append: impl Fn() -> Result<T>, mut last: Error) -> Result<T> {
        let started = std::time::Instant::now();
        while started.elapsed() < self.config.put_timeout {
            let _ = self.wakes.retention.try_send(());
            std::thread::sleep(Duration::from_millis(2));
            match append() {
                Err(e) if is_size_cap(&e) => last = e,
                appended => return appended,
            }
        }
        Err(last)
    }

    /// `Ok` while the store works. Once a background failure stopped it (a
    /// failed flush, a thread that met an error it cannot recover from),
    /// [`Error::Poisoned`] with the reason: nothing more is delivered or
    /// accepted until the store is reopened. Operators' tools poll this so a
    /// wait for deliveries does not outlive the store.
    pub fn health(&self) -> Result<()> {
        self.log.check_poison()?;
        match self.threads.as_ref().and_then(Threads::stopped_early) {
            Some(name) => Err(Error::Poisoned { reason: format!("the delaywheel-{name} thread stopped") }),
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

    /// Makes every consumer offset committed before the call durable before
    /// it returns (the flusher otherwise writes them with its next cycle).
    /// The log is synced first, so the offsets never count a message a power
    /// loss could take back. A server that hands a message out and must
    /// never hand it out again after a crash calls this in between.
    ///
    /// Errors: [`Error::Io`] naming the offsets file or a segment.
    pub fn sync_offsets(&self) -> Result<()> {
        self.offsets.sync(|| self.log.flush().map(drop))
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

    /// Everything below this offset is indexed: in its consume queue, or
    /// held by the scheduler.
    fn indexed_below(&self) -> u64 {
        self.scheduler.held_below(self.dispatched.load(Ordering::Acquire))
    }

    /// [`stats`](Self::stats) as of now: waits until every record put before
    /// the call is indexed (its queue entry written, its timer held by the
    /// wheel), has the ticking thread refresh its gauges, and returns them.
    /// For code that checks a count right after an action: `stats()` costs
    /// nothing but its wheel gauges (`pending`, the per-level and per-horizon
    /// counts, `reindexed`, `timer_log_entries`) are up to a second old. With
    /// the bucket scheduler the gauges are as of its last poll (100 ms).
    ///
    /// The wheel's gauges add slot counts: after a crash they may count a
    /// timer the crash delivered, or one the replay indexed twice, until its
    /// second is loaded. A store opened [without
    /// delivery](crate::Config::with_delivery) counts exactly instead (it
    /// reads every live chain, O(pending)), which is what `delaywheel
    /// recover` prints.
    ///
    /// Errors: [`Error::Busy`] if the indexes do not catch up within the put
    /// timeout; [`Error::Closed`] if the ticking thread does not answer in
    /// that time; the poison if the store is poisoned.
    pub fn fresh_stats(&self) -> Result<Stats> {
        self.wait_indexed_to(self.log.write_end())?;
        self.wait_topics_counted()?;
        self.scheduler.refresh()?;
        Ok(self.stats())
    }

    /// Waits, up to the put timeout, until the recount of the pending timers
    /// per topic an open may need has run (the dispatcher runs it first).
    fn wait_topics_counted(&self) -> Result<()> {
        let started = std::time::Instant::now();
        while self.topics.as_ref().is_some_and(|t| t.recounting()) {
            self.health()?;
            if started.elapsed() >= self.config.put_timeout {
                // The recount reads the log: that is how far behind it is at most.
                let lag_bytes = self.log.write_end() - self.log.start();
                return Err(Error::Busy { lag_bytes, waited_ms: started.elapsed().as_millis() as u64 });
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(())
    }

    /// Waits, up to the put timeout, until every record below `end` is indexed.
    fn wait_indexed_to(&self, end: u64) -> Result<()> {
        let started = std::time::Instant::now();
        let _ = self.wakes.dispatch.try_send(());
        while self.indexed_below() < end {
            self.health()?;
            if started.elapsed() >= self.config.put_timeout {
                let lag_bytes = end - self.indexed_below().min(end);
                return Err(Error::Busy { lag_bytes, waited_ms: started.elapsed().as_millis() as u64 });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// The first `limit` pending timers due in `window_ms` (epoch ms,
    /// half-open), by deliver time (then by offset): every timer put before
    /// the call that has not fired and is not cancelled, with its topic,
    /// queue and key. The wheel's slots and timer logs are read, never the
    /// whole commit log: the cost is that of the timers in the window, plus
    /// one read of each answered timer's message.
    ///
    /// The answer is taken at one instant on the ticking thread: each timer
    /// in it had not fired at that instant (it may fire right after).
    ///
    /// ```
    /// # use delaywheel::{Config, Message, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let due = 4_000_000_000_000; // 2096
    /// let r = store.put(Message::new("orders", "pay?").key("order-42").deliver_at_ms(due))?;
    /// let soon = store.pending(due..due + 300_000, 100)?;
    /// assert_eq!(soon[0].key.as_deref(), Some("order-42"));
    /// assert_eq!(Some(soon[0].handle), r.handle());
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Errors: [`Error::Busy`] if the indexes do not take in what was put
    /// before the call within the put timeout; [`Error::Closed`] if the
    /// ticking thread does not answer in that time; a corruption error if a
    /// slot's chain does not check out; [`Error::Invalid`] with the bucket
    /// scheduler, which cannot list its timers.
    pub fn pending(&self, window_ms: std::ops::Range<u64>, limit: usize) -> Result<Vec<PendingTimer>> {
        self.wait_indexed_to(self.log.write_end())?;
        let entries = self.scheduler.pending(window_ms, limit)?;
        Ok(crate::pending::describe(&self.log, entries))
    }

    /// The pending timers counted by due time, for a chart: `counts[0]` is
    /// due before `bounds_ms[0]`, `counts[i]` from `bounds_ms[i - 1]` up to
    /// `bounds_ms[i]`, and the last count from the last bound on, so there is
    /// one count more than bounds and they add up to all pending timers. Read
    /// from the wheel's slot counts, never by listing timers: with bounds on
    /// whole seconds the counts are exact within the next 18 hours (level 0's
    /// one-second slots); further ahead a slot covers 9.1 hours (level 1) or
    /// 4.25 years (level 2) and its timers count as due at its start.
    /// Cancelled timers are not counted. Taken at one instant on the ticking
    /// thread, after everything put before the call is indexed.
    ///
    /// ```
    /// # use delaywheel::{Clock, Config, Message, Store, SystemClock};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let minute = (SystemClock.now_ms() / 1_000 + 60) * 1_000; // a whole second, a minute ahead
    /// store.put(Message::new("orders", "pay?").deliver_at_ms(minute + 250))?;
    /// assert_eq!(store.pending_counts(&[minute, minute + 1_000])?, [0, 1, 0]);
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Errors: [`Error::Invalid`] (`"bounds"`) unless the bounds ascend
    /// strictly and number at most [`MAX_COUNT_BOUNDS`]; else those of
    /// [`pending`](Self::pending).
    pub fn pending_counts(&self, bounds_ms: &[u64]) -> Result<Vec<u64>> {
        if bounds_ms.len() > MAX_COUNT_BOUNDS {
            let why = format!("{} bounds, at most {MAX_COUNT_BOUNDS}", bounds_ms.len());
            return Err(Error::invalid("bounds", why));
        }
        if let Some(w) = bounds_ms.windows(2).find(|w| w[0] >= w[1]) {
            return Err(Error::invalid("bounds", format!("{} is not before {}: bounds ascend", w[0], w[1])));
        }
        self.wait_indexed_to(self.log.write_end())?;
        self.scheduler.pending_counts(bounds_ms.to_vec())
    }

    /// The pending timers of the messages put with `topic` and `key`, by
    /// deliver time: "is the timeout of order-42 still pending?". The key
    /// index (`index/keys/`, kept by the dispatcher for every timed message
    /// with a key) names the candidates, each candidate's message is read to
    /// compare its topic and key, and the ticking thread says which of them
    /// are pending, at one instant (as for [`pending`](Self::pending)). A
    /// rescheduled timer is answered with its new time and its unchanged handle.
    ///
    /// ```
    /// # use delaywheel::{Config, Message, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let due = 4_000_000_000_000; // 2096
    /// let r = store.put(Message::new("orders", "cancel if unpaid").key("order-42").deliver_at_ms(due))?;
    /// let pending = store.pending_by_key("orders", "order-42")?;
    /// assert_eq!(pending.len(), 1);
    /// assert_eq!(Some(pending[0].handle), r.handle());
    /// store.cancel(r.handle().unwrap())?;
    /// assert!(store.pending_by_key("orders", "order-42")?.is_empty());
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Errors: as for [`pending`](Self::pending); a candidate whose message
    /// does not check out is left out with a warning.
    pub fn pending_by_key(&self, topic: &str, key: &str) -> Result<Vec<PendingTimer>> {
        self.wait_indexed_to(self.log.write_end())?;
        let timers = crate::pending::timers_with_key(&self.log, self.keys.candidates(topic, key), topic, key);
        if timers.is_empty() {
            return Ok(Vec::new());
        }
        let mut entries: Vec<_> = self.scheduler.pending_of(timers)?.into_iter().flatten().collect();
        entries.sort_unstable_by_key(|e| e.timer);
        Ok(crate::pending::describe(&self.log, entries))
    }

    /// Counters and gauges: pending timers (per level and per coming horizon),
    /// deliveries and their lateness, disk use. The wheel's gauges are
    /// refreshed by the ticking thread about once a second (see [`Stats`]);
    /// [`fresh_stats`](Self::fresh_stats) waits for fresh ones.
    pub fn stats(&self) -> Stats {
        let timers = self.scheduler.stats();
        let wheel_files = self.wheel.stats.lock().unwrap_or_else(|e| e.into_inner()).disk_bytes;
        let disk = DiskUsage {
            commit_log: self.log.disk_bytes(),
            relocated: self.log.relocated().disk_bytes().unwrap_or(0),
            consume_queues: self.queues.disk_bytes(),
            timer_index: wheel_files,
            key_index: self.keys.disk_bytes(),
        };
        let counter = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let retention = RetentionStats {
            oldest_retained_offset: self.log.start(),
            segments_deleted: counter(&self.retention.segments_deleted),
            relocated_timers: counter(&self.retention.relocated_timers),
            relocated_bytes: counter(&self.retention.relocated_bytes),
            windows_deleted: counter(&self.retention.windows_deleted),
            queue_files_deleted: counter(&self.retention.queue_files_deleted),
            deleted_unread: counter(&self.retention.deleted_unread),
            pending_by_segment: self
                .wheel
                .synced
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .1
                .iter()
                .collect(),
            consumer_skipped: counter(&self.retention.consumer_skipped),
        };
        let (pending_by_topic, pending_other_topics) =
            self.topics.as_ref().and_then(|t| t.top(crate::stats::STATS_TOPICS)).unwrap_or_default();
        Stats {
            pending: timers.pending,
            pending_per_level: timers.pending_per_level,
            pending_by_horizon: timers.pending_by_horizon,
            pending_by_topic,
            pending_other_topics,
            delivered: timers.delivered,
            early: timers.early,
            reindexed: timers.reindexed,
            lateness_ms: Lateness::from_histogram(&timers.lateness_ms),
            recent_lateness_ms: timers.recent_lateness_ms.summary(self.config.clock.now_ms()),
            disk_bytes: disk.commit_log
                + disk.relocated
                + disk.consume_queues
                + disk.timer_index
                + disk.key_index,
            timer_log_entries: timers.timer_log_entries,
            log_bytes: self.log.write_end().saturating_sub(self.log.start()),
            // Read after the end: the dispatcher may have passed the end read first.
            dispatch_lag_bytes: self.log.write_end().saturating_sub(self.indexed_below()),
            quarantined: self.retention.quarantined.load(Ordering::Relaxed),
            refreshes: timers.refreshes,
            wheel_rebuilds: timers.rebuilds,
            disk,
            retention,
        }
    }

    /// The configured delay-level table.
    pub fn delay_levels(&self) -> &DelayLevels {
        &self.levels
    }

    /// What recovery found when this store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Bytes on disk of every file the store writes (see [`Stats::disk`]).
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
        *self.accepting.write().unwrap_or_else(|e| e.into_inner()) = false;
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
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::mmap::FAIL_FLUSH;

    /// Every outstanding ticket fails once a flush fails: blocking, as a
    /// future, and in a batch of thousands in flight.
    #[test]
    fn a_failed_flush_fails_every_outstanding_ticket() {
        let dir = tempfile::tempdir().unwrap();
        let config =
            Config::new(dir.path()).with_segment_size(1 << 20).with_flush_interval(Duration::from_secs(3600));
        let store = Store::open(config).unwrap();
        let early = store.submit(Message::new("T", "early")).unwrap();
        store.wait_durable(&early.receipt(), Duration::from_secs(5)).unwrap();
        let tickets: Vec<PutTicket> =
            (0..2_000).map(|i| store.submit(Message::new("T", format!("{i}"))).unwrap()).collect();
        let mut future = std::pin::pin!(store.submit(Message::new("T", "awaited")).unwrap());
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        assert!(future.as_mut().poll(&mut cx).is_pending(), "async mode: not durable before a flush");
        FAIL_FLUSH.add(dir.path());
        let err = store.wait_durable(&tickets[0].receipt(), Duration::from_secs(5)).unwrap_err();
        FAIL_FLUSH.remove(dir.path());
        assert!(matches!(err, Error::Poisoned { .. }), "{err}");
        for ticket in &tickets {
            assert!(matches!(ticket.wait(Duration::from_secs(1)), Err(Error::Poisoned { .. })));
            assert!(ticket.is_durable().is_err());
        }
        assert!(matches!(future.as_mut().poll(&mut cx), std::task::Poll::Ready(Err(Error::Poisoned { .. }))));
        assert_eq!(early.wait(Duration::ZERO).unwrap(), early.receipt(), "on disk before the failure");
        assert!(early.is_durable().unwrap());
        assert!(store.close().is_err(), "close reports the poisoning");
    }

    #[test]
    fn a_failed_flush_poisons_the_store_until_it_is_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let config = || Config::new(dir.path()).with_segment_size(1 << 20).with_flush_mode(FlushMode::Sync);
        let store = Store::open(config()).unwrap();
        store.put(Message::new("T", "before")).unwrap();
        assert!(store.health().is_ok());

        FAIL_FLUSH.add(dir.path());
        let err = store.put(Message::new("T", "during")).unwrap_err();
        assert!(matches!(err, Error::Poisoned { .. }), "{err}");
        assert!(err.to_string().contains("injected flush failure"), "{err}");
        let err = store.put(Message::new("T", "after")).unwrap_err();
        assert!(matches!(err, Error::Poisoned { .. }), "writes stay refused: {err}");
        let health = store.health().unwrap_err();
        assert!(health.to_string().contains("injected flush failure"), "health names the reason: {health}");
        FAIL_FLUSH.remove(dir.path());
        assert!(store.close().is_err(), "close reports the poisoning");

        let store = Store::open(config()).unwrap();
        store.put(Message::new("T", "reopened")).unwrap();
        let mut consumer = store.consumer("T", 0).unwrap();
        let mut bodies = Vec::new();
        while let Ok(batch) = consumer.poll(10, Duration::from_millis(300)) {
            if batch.is_empty() {
                break;
            }
            bodies.extend(batch.iter().map(|m| String::from_utf8(m.body().to_vec()).unwrap()));
        }
        // "during" reached the page cache before its flush failed: it was not
        // acknowledged, and it may or may not be there; the others must be.
        bodies.retain(|b| b != "during");
        assert_eq!(bodies, ["before", "reopened"]);
    }

    /// Polls `consumer` until `n` messages came or `wait` passed.
    fn bodies_of(consumer: &mut crate::Consumer, n: usize, wait: Duration) -> Vec<String> {
        let started = std::time::Instant::now();
        let mut bodies = Vec::new();
        while bodies.len() < n && started.elapsed() < wait {
            let batch = consumer.poll(100, Duration::from_millis(100)).unwrap();
            bodies.extend(batch.iter().map(|m| String::from_utf8(m.body().to_vec()).unwrap()));
        }
        bodies
    }

    /// Puts until one is refused, for at most 10 s; returns the refusal.
    fn put_until_refused(store: &Store, message: impl Fn(usize) -> Message) -> (usize, Error) {
        let started = std::time::Instant::now();
        for i in 0.. {
            match store.put(message(i)) {
                Ok(_) => assert!(started.elapsed() < Duration::from_secs(10), "never refused"),
                Err(e) => return (i, e),
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        unreachable!()
    }

    /// Puts `message`, retrying while a full disk refuses it: each stalled
    /// thread sees the room at its next retry.
    fn put_once_there_is_room(store: &Store, message: Message) {
        let started = std::time::Instant::now();
        while let Err(e) = store.put(message.clone()) {
            assert!(matches!(e, Error::DiskFull { .. }), "{e}");
            assert!(started.elapsed() < Duration::from_secs(5), "still refused once room is back: {e}");
            std::thread::sleep(crate::stall::RETRY);
        }
    }

    /// A batch that needs a new segment the disk has no room for fails
    /// whole (its first messages would have fitted in the old one), and the
    /// store reopens with nothing of it.
    #[test]
    fn a_full_disk_at_the_roll_fails_a_batch_whole() {
        use crate::mmap::FAIL_RESERVE;
        let dir = tempfile::tempdir().unwrap();
        let config =
            || Config::new(dir.path()).with_segment_size(crate::MIN_SEGMENT_SIZE).with_queues_per_topic(1);
        let store = Store::open(config()).unwrap();
        let batch = |tag: &str| -> Vec<Message> {
            (0..38).map(|i| Message::new("B", format!("{tag}{i:04}{}", "z".repeat(1000)))).collect()
        };
        store.put_batch(batch("a")).unwrap();
        let full = dir.path().join("commitlog");
        FAIL_RESERVE.add(&full);
        let err = store.put_batch(batch("b"));
        FAIL_RESERVE.remove(&full);
        assert!(matches!(err, Err(Error::DiskFull { .. })), "{err:?}");
        store.put(Message::new("B", "after")).unwrap();
        store.close().unwrap();
        let store = Store::open(config()).unwrap();
        let mut consumer = store.consumer("B", 0).unwrap();
        let got = bodies_of(&mut consumer, 40, Duration::from_secs(2));
        assert_eq!(got.len(), 39, "the first batch and the put after: {:?}", got.len());
        assert!(got.iter().all(|b| !b.starts_with('b')), "nothing of the failed batch");
        store.close().unwrap();
    }

    #[test]
    fn a_full_disk_for_a_queue_file_is_back_pressure_not_poison() {
        use crate::mmap::FAIL_RESERVE;
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path())
            .with_segment_size(1 << 20)
            .with_queues_per_topic(1)
            .with_max_index_lag(1)
            .with_put_timeout(Duration::from_secs(5));
        let store = Store::open(config).unwrap();
        let full = dir.path().join("consumequeue").join("U");
        FAIL_RESERVE.add(&full);
        let (accepted, err) = put_until_refused(&store, |i| Message::new("U", format!("u{i}")));
        assert!(matches!(err, Error::DiskFull { .. }), "{err}");
        store.health().unwrap();
        FAIL_RESERVE.remove(&full);
        let mut consumer = store.consumer("U", 0).unwrap();
        let want: Vec<String> = (0..accepted).map(|i| format!("u{i}")).collect();
        assert_eq!(
            bodies_of(&mut consumer, accepted, Duration::from_secs(10)),
            want,
            "every acknowledged put, once room is back"
        );
        put_once_there_is_room(&store, Message::new("U", "after"));
        assert_eq!(bodies_of(&mut consumer, 1, Duration::from_secs(10)), ["after"]);
        store.close().unwrap();
    }

    #[test]
    fn a_full_disk_for_a_timer_log_file_is_back_pressure_not_poison() {
        use crate::mmap::FAIL_RESERVE;
        const T0: u64 = 1_700_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::ManualClock::new(T0);
        let config = Config::new(dir.path())
            .with_segment_size(1 << 20)
            .with_queues_per_topic(1)
            .with_timer_log_file_entries(8)
            .with_max_index_lag(1)
            .with_put_timeout(Duration::from_secs(5))
            .with_clock(clock.clone());
        let store = Store::open(config).unwrap();
        let timer = |i| Message::new("T", format!("t{i}")).deliver_at_ms(T0 + 10_000);
        // The first timer makes the first timer-log file (8 entries, the first one unused).
        store.put(timer(0)).unwrap();
        assert_eq!(store.fresh_stats().unwrap().pending, 1);
        let full = dir.path().join("timer");
        FAIL_RESERVE.add(&full);
        let (refused_at, err) = put_until_refused(&store, |i| timer(i + 1));
        let accepted = 1 + refused_at;
        // Refused once the wheel, out of room, stops taking timers: not
        // thousands of puts later, held in the dispatcher's queue to it.
        assert!((2..=16).contains(&accepted), "refused after {accepted} timers");
        assert!(matches!(err, Error::DiskFull { .. }), "{err}");
        store.health().unwrap();
        FAIL_RESERVE.remove(&full);
        put_once_there_is_room(&store, timer(accepted));
        clock.set_ms(T0 + 11_000);
        let mut consumer = store.consumer("T", 0).unwrap();
        let mut got = bodies_of(&mut consumer, accepted + 1, Duration::from_secs(10));
        got.sort_by_key(|b| b[1..].parse::<usize>().unwrap());
        let want: Vec<String> = (0..=accepted).map(|i| format!("t{i}")).collect();
        assert_eq!(got, want, "every acknowledged timer fires once, once room is back");
        assert!(bodies_of(&mut consumer, 1, Duration::from_millis(500)).is_empty(), "and none twice");
        store.health().unwrap();
        store.close().unwrap();
    }
}
