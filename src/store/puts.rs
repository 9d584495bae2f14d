//! Putting messages: one or a batch, waiting for durability (`put`) or
//! handing back tickets (`submit`), and the back-pressure a put meets when
//! the indexes lag or the log is at its size cap.

use std::sync::atomic::Ordering;
use std::sync::{Arc, TryLockError};
use std::time::Duration;

use super::Store;
use crate::buckets::SCHEDULE_TOPIC;
use crate::config::{FlushMode, Scheduler};
use crate::error::{Error, Result};
use crate::format::record::{MessageFields, Timing, encode_message};
use crate::message::{Message, Receipt, Written};
use crate::offsets::POSITIONS_TOPIC;
use crate::retention::is_size_cap;
use crate::sync::ReadWrite;
use crate::ticket::PutTicket;

use super::dedup::Waits;

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

    /// Checks and appends one message, unless its dedup key stands (see
    /// `dedup.rs`); returns its receipt (or the standing one's) and where
    /// that record ends.
    fn append_message(&self, message: &Message) -> Result<(Receipt, u64)> {
        match &message.dedup_key {
            Some(key) => self.append_deduplicated(message, key),
            None => self.append_new(message),
        }
    }

    /// Checks and appends one message; returns its receipt and where its record ends.
    pub(super) fn append_new(&self, message: &Message) -> Result<(Receipt, u64)> {
        let queue_id = self.check_message(message)?;
        self.wait_for_indexes()?;
        let accepting = self.accepting.reading();
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
        Ok((
            Receipt { offset, queue_id, store_time_ms, deliver_at_ms, duplicate: false },
            offset + len as u64,
        ))
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
        let messages: Vec<Message> = messages.into_iter().collect();
        let (receipts, end) = self.append_batch(&messages)?;
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
        let messages: Vec<Message> = messages.into_iter().collect();
        let (receipts, end) = self.append_batch(&messages)?;
        Ok(self.tickets(receipts, end))
    }

    /// [`submit_batch`](Self::submit_batch), but only if it takes no wait:
    /// `Ok(None)`, with nothing written, where `submit_batch` would wait —
    /// for the indexes to catch up, for another append, for a new segment to
    /// be made (file work), for close, for a put of the same dedup key, for
    /// the ticking thread to say what became of the timer of a dedup key
    /// put longer ago than the dedup window. For async code, which appends on its
    /// own thread when it can and otherwise hands the batch to one that may
    /// block (`spawn_blocking`), where `submit_batch` waits as long as it must.
    ///
    /// Errors, with nothing written: those of `submit_batch` that need no
    /// wait to find (a message not acceptable, a closed or poisoned store).
    ///
    /// ```
    /// use delaywheel::{Config, Message, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let batch = vec![Message::new("Retry", "job-1").delay_level(1)];
    /// let tickets = match store.try_submit_batch(&batch)? {
    ///     Some(tickets) => tickets,
    ///     None => store.submit_batch(batch)?, // from a thread that may block
    /// };
    /// assert_eq!(tickets.len(), 1);
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_submit_batch(&self, messages: &[Message]) -> Result<Option<Vec<PutTicket>>> {
        let queue_ids = self.check_batch(messages)?;
        if messages.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let appended = match messages.iter().any(|m| m.dedup_key.is_some()) {
            true => self.batch_deduplicated(messages, queue_ids, Waits::Never)?,
            false => self.try_append_checked_batch(messages, queue_ids)?,
        };
        Ok(appended.map(|(receipts, end)| self.tickets(receipts, end)))
    }

    /// Appends a checked batch, all or nothing, if that takes no wait: the
    /// receipts and where the batch's last record ends, or `None`, with
    /// nothing appended.
    pub(super) fn try_append_checked_batch(
        &self,
        messages: &[Message],
        queue_ids: Vec<u32>,
    ) -> Result<Option<(Vec<Receipt>, u64)>> {
        if messages.is_empty() {
            return Ok(Some((Vec::new(), 0)));
        }
        if self.index_lag() > self.config.max_index_lag {
            return Ok(None);
        }
        let accepting = match self.accepting.try_read() {
            Ok(accepting) => accepting,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(None),
        };
        if !*accepting {
            return Err(Error::Closed);
        }
        let batch = self.encode_batch(messages, queue_ids)?;
        let appended =
            self.log.try_append_batch(&batch.lens, |i, buf, at| encode_message(buf, at, &batch.fields[i]));
        drop(accepting);
        let Some((offsets, prefault)) = appended? else { return Ok(None) };
        Ok(Some(self.appended(&batch, &offsets, prefault)))
    }

    /// The tickets of a batch appended up to `end`, the committer woken.
    fn tickets(&self, receipts: Vec<Receipt>, end: u64) -> Vec<PutTicket> {
        if self.config.flush_mode == FlushMode::Sync && !receipts.is_empty() {
            let _ = self.wakes.commit.try_send(());
        }
        // Every ticket waits for the batch's end: the batch is synced as one.
        receipts.into_iter().map(|r| PutTicket::new(r, end, Arc::clone(&self.log))).collect()
    }

    /// Checks and appends a batch, all or nothing, but for the messages
    /// whose dedup key stands (see `dedup.rs`); returns the receipts and
    /// where the last record they name ends (0 for an empty batch).
    fn append_batch(&self, messages: &[Message]) -> Result<(Vec<Receipt>, u64)> {
        let queue_ids = self.check_batch(messages)?;
        if messages.iter().any(|m| m.dedup_key.is_some()) {
            let appended = self.batch_deduplicated(messages, queue_ids, Waits::AsLongAsNeeded)?;
            return Ok(appended.expect("a put that may wait always appends"));
        }
        self.append_checked_batch(messages, queue_ids)
    }

    /// Appends a checked batch, all or nothing; returns the receipts and
    /// where the batch's last record ends (0 for an empty batch).
    pub(super) fn append_checked_batch(
        &self,
        messages: &[Message],
        queue_ids: Vec<u32>,
    ) -> Result<(Vec<Receipt>, u64)> {
        if messages.is_empty() {
            return Ok((Vec::new(), 0));
        }
        self.wait_for_indexes()?;
        let accepting = self.accepting.reading();
        if !*accepting {
            return Err(Error::Closed);
        }
        let batch = self.encode_batch(messages, queue_ids)?;
        let append =
            || self.log.append_batch(&batch.lens, |i, buf, at| encode_message(buf, at, &batch.fields[i]));
        let (offsets, prefault) = match append() {
            Err(e) if is_size_cap(&e) => self.wait_for_retention(append, e)?,
            appended => appended?,
        };
        drop(accepting);
        Ok(self.appended(&batch, &offsets, prefault))
    }

    /// Each message's queue, or the first that is not acceptable ([`Error::InBatch`]).
    fn check_batch(&self, messages: &[Message]) -> Result<Vec<u32>> {
        (messages.iter().enumerate())
            .map(|(index, m)| {
                self.check_message(m).map_err(|e| Error::InBatch { index, source: Box::new(e) })
            })
            .collect()
    }

    /// A checked batch's records, ready to append: timed as of now.
    fn encode_batch<'a>(&self, messages: &'a [Message], queue_ids: Vec<u32>) -> Result<Batch<'a>> {
        let store_time_ms = self.config.clock.now_ms();
        let timings = (messages.iter().enumerate())
            .map(|(index, m)| {
                let timing = m.resolve_timing(store_time_ms, &self.levels);
                timing.map_err(|e| Error::InBatch { index, source: Box::new(e) })
            })
            .collect::<Result<Vec<(u64, u16)>>>()?;
        let fields: Vec<_> = (messages.iter().zip(&queue_ids).zip(&timings))
            .map(|((m, &queue_id), &(deliver_at_ms, delay_level))| {
                m.fields(queue_id, store_time_ms, Timing { deliver_at_ms, delay_level })
            })
            .collect();
        let lens = fields.iter().map(|f| f.record_len()).collect();
        Ok(Batch { store_time_ms, queue_ids, timings, fields, lens })
    }

    /// After a batch was appended at `offsets`: wakes the indexes; returns
    /// the receipts and where the batch ends.
    fn appended(&self, batch: &Batch<'_>, offsets: &[u64], prefault: bool) -> (Vec<Receipt>, u64) {
        debug_assert_eq!(offsets.len(), batch.lens.len());
        self.wake_after_append(prefault);
        let receipts: Vec<Receipt> = (offsets.iter().zip(&batch.queue_ids).zip(&batch.timings))
            .map(|((&offset, &queue_id), &(deliver_at_ms, _))| Receipt {
                offset,
                queue_id,
                store_time_ms: batch.store_time_ms,
                deliver_at_ms: (deliver_at_ms != 0).then_some(deliver_at_ms),
                duplicate: false,
            })
            .collect();
        let end = match (offsets.last(), batch.lens.last()) {
            (Some(&offset), Some(&len)) => offset + len as u64,
            _ => 0,
        };
        (receipts, end)
    }

    /// Checks a message before it is put: its fields, its topic, its queue.
    pub(super) fn check_message(&self, message: &Message) -> Result<u32> {
        message.validate(self.config.max_body_bytes())?;
        if message.topic() == SCHEDULE_TOPIC {
            return Err(Error::invalid(
                "topic",
                format!("{SCHEDULE_TOPIC} is reserved for the bucket scheduler"),
            ));
        }
        if message.topic() == POSITIONS_TOPIC {
            return Err(Error::invalid(
                "topic",
                format!("{POSITIONS_TOPIC} is reserved for consumer positions"),
            ));
        }
        if message.dedup_key.is_some() && self.config.scheduler != Scheduler::Wheel {
            return Err(Error::invalid(
                "dedup_key",
                "the bucket scheduler does not deduplicate; use the wheel",
            ));
        }
        message.resolve_queue(self.config.queues_per_topic)
    }

    /// After an append: the dispatcher indexes it, the prefaulter keeps ahead.
    pub(super) fn wake_after_append(&self, prefault: bool) {
        let _ = self.wakes.dispatch.try_send(());
        if prefault {
            let _ = self.wakes.prefault.try_send(());
        }
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
        let lag = || self.index_lag();
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

    /// How far the indexes are behind what they may index (see
    /// [`wait_for_indexes`](Self::wait_for_indexes)).
    fn index_lag(&self) -> u64 {
        let indexable = match self.config.flush_mode {
            FlushMode::Sync => self.log.durable_end(),
            FlushMode::Async => self.log.write_end(),
        };
        let indexed = match self.stall.is_stalled() {
            true => self.indexed_below(),
            false => self.dispatched.load(Ordering::Acquire),
        };
        // Read at two moments: the dispatcher may pass the end read first.
        indexable.saturating_sub(indexed)
    }

    /// Back-pressure at the size cap: wakes retention and retries `append`
    /// until it fits or the put timeout passes, then returns the cap error.
    fn wait_for_retention<T>(&self, append: impl Fn() -> Result<T>, mut last: Error) -> Result<T> {
        let started = std::time::Instant::now();
        while self.await_room(started) {
            match append() {
                Err(e) if is_size_cap(&e) => last = e,
                appended => return appended,
            }
        }
        Err(last)
    }

    /// Wakes retention and gives it a moment to make room under the size
    /// cap; `false`, at once, if a write refused at the cap since `started`
    /// has waited the put timeout.
    pub(super) fn await_room(&self, started: std::time::Instant) -> bool {
        if started.elapsed() >= self.config.put_timeout {
            return false;
        }
        let _ = self.wakes.retention.try_send(());
        std::thread::sleep(Duration::from_millis(2));
        true
    }
}

/// A checked batch, encoded as records to append.
struct Batch<'a> {
    store_time_ms: u64,
    queue_ids: Vec<u32>,
    /// Each message's deliver time (0 for none) and delay level.
    timings: Vec<(u64, u16)>,
    fields: Vec<MessageFields<'a>>,
    lens: Vec<usize>,
}
