//! The dispatcher: the one thread that turns commit-log records into index
//! entries. It tails the log from the checkpoint's `dispatched` offset, so
//! after a crash it simply replays what the indexes may have missed.
//!
//! * an ordinary message → an entry in its consume queue;
//! * a timed message → the scheduler (a timer sent to the wheel's thread, or
//!   an entry in a level queue of the buckets);
//! * a delivery → an entry in the real topic's consume queue pointing at the
//!   delivery record, which names the original message record (the body is
//!   never copied); a deliveries record → one such entry per timer it
//!   names, in the queue it names, without reading the messages;
//! * a reschedule → its timer to the scheduler; a schedule's occurrence
//!   (a reschedule that delivers) also an entry in the schedule's queue;
//! * the buckets' copy of a delivered message → an entry in its real topic.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::commitlog::{CommitLog, LogReader};
use crate::consume_queue::{ConsumeQueue, QueueRegistry};
use crate::error::{CorruptionKind, Error, Result};
use crate::format::queue_entry::{self, Entry, FLAG_TIMER_DELIVERY, batch_flags, tag_hash};
use crate::format::record::{
    CancelView, DELIVERY_LEN, DeliveriesView, DeliveryView, MessageView, OccurrencesView, RecordKind,
    RescheduleView,
};
use crate::key_index::KeyIndexes;
use crate::message::validate_topic;
use crate::schedule::{PAUSED_AT_MS, replaced_by};
use crate::scheduler::SchedulerFront;
use crate::stall::{RETRY, Stall};
use crate::threads::StopFlag;
use crate::topic_counts::{CountBuffer, ScheduleDelta, TopicCounts, message_of, pauses, settled_schedule};

/// How many records the dispatcher looks ahead to touch the messages that
/// deliveries name: enough for the loads to overlap, few enough that the
/// touched lines are still cached when they are read.
const TOUCH_AHEAD: usize = 256;

/// Routes records to the indexes.
pub(crate) struct Dispatcher {
    log: Arc<CommitLog>,
    /// Reads the log's tail in order.
    tail: RefCell<LogReader>,
    /// Reads the messages that deliveries name, in any order.
    originals: RefCell<LogReader>,
    queues: Arc<QueueRegistry>,
    /// Timed messages by topic and key.
    keys: Arc<KeyIndexes>,
    /// Pending timers per topic (the wheel scheduler only).
    topics: Option<Arc<TopicCounts>>,
    /// What the records indexed did to their topics' counts, not yet added.
    count: RefCell<CountBuffer>,
    /// The wheel or the buckets: timed messages and the dispatcher's progress go there.
    scheduler: Arc<dyn SchedulerFront>,
    next: u64,
    queues_per_topic: u32,
    /// Every record below this offset is indexed (read by the flusher for checkpoints).
    progress: Arc<AtomicU64>,
    /// The records below this offset have had their deliveries' messages touched.
    touched_to: u64,
    /// Deliveries not re-indexed because retention deleted their messages, in this batch.
    reclaimed_deliveries: Cell<u64>,
    /// Sync flush mode: index only records already durable, so no consumer
    /// acts on a message, and no timer fires for one, that a power loss
    /// could still erase.
    durable_only: bool,
    /// The log's end at open: a delivery before it names a message this
    /// process has not checked (its checksum is checked when read); every
    /// message the ticking thread delivers was checked in this process, by
    /// the ticker as its second loaded or by the wheel's front as it was
    /// indexed (see `timer/routes.rs`).
    replay_end: u64,
    /// Damaged records skipped (see [`quarantine`](Self::quarantine)).
    quarantined: Arc<AtomicU64>,
    /// Where the dispatcher says it waits for disk space.
    stall: Arc<Stall>,
    /// Queues a record indexed besides the one it answers (an occurrences
    /// record's entries go to their schedules' queues): woken with it.
    touched_too: RefCell<Vec<Arc<ConsumeQueue>>>,
}

/// What the dispatcher writes to: the consume queues, the key index, the
/// pending counts per topic, and the scheduler.
pub(crate) type Indexes =
    (Arc<QueueRegistry>, Arc<KeyIndexes>, Option<Arc<TopicCounts>>, Arc<dyn SchedulerFront>);

/// Where a dispatcher starts and how it indexes.
pub(crate) struct DispatchPlan {
    /// The first record to index.
    pub from: u64,
    pub queues_per_topic: u32,
    /// See [`Dispatcher::durable_only`].
    pub durable_only: bool,
    /// See [`Dispatcher::replay_end`].
    pub replay_end: u64,
}

impl Dispatcher {
    pub fn new(
        log: Arc<CommitLog>,
        (queues, keys, topics, scheduler): Indexes,
        plan: DispatchPlan,
        progress: Arc<AtomicU64>,
        (quarantined, stall): (Arc<AtomicU64>, Arc<Stall>),
    ) -> Self {
        let DispatchPlan { from, queues_per_topic, durable_only, replay_end } = plan;
        progress.store(from, Ordering::Release);
        Self {
            tail: RefCell::new(LogReader::new(Arc::clone(&log))),
            originals: RefCell::new(LogReader::new(Arc::clone(&log))),
            log,
            queues,
            keys,
            topics,
            count: RefCell::new(CountBuffer::default()),
            scheduler,
            next: from,
            touched_to: from,
            queues_per_topic,
            progress,
            reclaimed_deliveries: Cell::new(0),
            durable_only,
            replay_end,
            quarantined,
            stall,
            touched_too: RefCell::new(Vec::new()),
        }
    }

    /// Skips a record that does not check out instead of stopping: one
    /// damaged byte must not keep the store from indexing everything after
    /// it (and a reopen would replay it again). It is logged with its file
    /// and offset, counted in `Stats::quarantined`, and `wheel-dump verify`
    /// reports it.
    fn quarantine(&self, record: u64, e: Error) -> Result<Option<Arc<ConsumeQueue>>> {
        tracing::error!(record, error = %e, "skipping a record that does not check out");
        self.quarantined.fetch_add(1, Ordering::Relaxed);
        Ok(None)
    }

    /// Where the records this dispatcher may index end now.
    fn visible_end(&self) -> u64 {
        if self.durable_only { self.log.durable_end() } else { self.log.write_end() }
    }

    /// Indexes every record published so far. Returns how many records it indexed.
    pub fn dispatch_available(&mut self) -> Result<usize> {
        let end = self.visible_end();
        let mut touched: Vec<Arc<ConsumeQueue>> = Vec::new();
        let mut count = 0;
        let result = loop {
            if self.next >= end {
                break Ok(count);
            }
            if self.next >= self.touched_to {
                self.touched_to = self.touch_ahead(self.next, end);
            }
            let indexed = self
                .tail
                .borrow_mut()
                .visit_trusted(self.next, |offset, kind, bytes| self.index(offset, kind, bytes));
            let (queue, next) = match indexed {
                Ok((Ok(queue), next)) => (queue, next),
                Ok((Err(e), _)) | Err(e) => {
                    self.count.get_mut().discard();
                    break Err(e);
                }
            };
            self.count.get_mut().indexed(next);
            for queue in queue.into_iter().chain(self.touched_too.get_mut().drain(..)) {
                if !touched.iter().any(|q| Arc::ptr_eq(q, &queue)) {
                    touched.push(queue);
                }
            }
            self.next = next;
            count += 1;
        };
        // The wheel has every timer indexed before anyone learns they are.
        self.scheduler.hand_over()?;
        let reclaimed = self.reclaimed_deliveries.replace(0);
        if reclaimed > 0 {
            tracing::warn!(reclaimed, "deliveries whose messages retention deleted were not re-indexed");
        }
        if count == 0 {
            // Idle: hold no segment retention may want to delete. (A busy
            // dispatcher follows every new table; letting go after every pass
            // made each pass take the table again, which cost a burst of
            // deliveries measurably.)
            self.tail.get_mut().release();
            self.originals.get_mut().release();
        }
        // Wake consumers for what was indexed, even if a later record failed.
        if let Some(topics) = &self.topics {
            self.count.get_mut().flush(topics);
            topics.counted_below(self.next);
        }
        self.progress.store(self.next, Ordering::Release);
        touched.iter().for_each(|q| q.notify());
        if count > 0 {
            self.scheduler.indexed_below(self.next)?;
        }
        result
    }

    /// Touches the messages named by the deliveries among the next
    /// [`TOUCH_AHEAD`] records (see `LogReader::touch`): a burst of deliveries
    /// names messages all over the log, and reading them one after another
    /// would wait for each cache miss in turn. Returns where it stopped.
    fn touch_ahead(&self, from: u64, end: u64) -> u64 {
        let mut tail = self.tail.borrow_mut();
        let mut originals = self.originals.borrow_mut();
        let (mut at, mut touched) = (from, 0u8);
        for _ in 0..TOUCH_AHEAD {
            if at >= end {
                break;
            }
            let visited = tail.visit_trusted(at, |_, kind, bytes| {
                (kind == RecordKind::Delivery).then(|| DeliveryView::parse(bytes).ok()).flatten()
            });
            // A record it cannot read is left for the real pass to report.
            let Ok((delivery, next)) = visited else { break };
            if let Some(delivery) = delivery {
                touched ^= originals.touch(delivery.message_offset);
            }
            at = next;
        }
        std::hint::black_box(touched);
        at
    }

    /// Indexes one record; returns the consume queue it went to, if any.
    fn index(&self, offset: u64, kind: RecordKind, bytes: &[u8]) -> Result<Option<Arc<ConsumeQueue>>> {
        match kind {
            RecordKind::Message => {
                let view = match self.message(offset, bytes) {
                    Ok(view) => view,
                    Err(e @ Error::Corruption { .. }) => return self.quarantine(offset, e),
                    Err(e) => return Err(e),
                };
                self.keys.add(offset, &view)?;
                if view.timer_deliver_at_ms().is_some() {
                    let queue = self.scheduler.index(offset, bytes, &view)?;
                    match replaced_by(&view) {
                        // An update: the schedule it replaces (of the same topic) is settled.
                        Some(replaced) => {
                            let paused = -i64::from(replaced.deliver_at_ms == PAUSED_AT_MS);
                            self.note_count(view.topic, 0, ScheduleDelta { active: 0, paused });
                        }
                        None => {
                            let schedules = ScheduleDelta { active: i64::from(view.schedule), paused: 0 };
                            self.note_count(view.topic, 1, schedules);
                        }
                    }
                    return Ok(queue);
                }
                if !queue_entry::indexed_as_sent(view.topic, false) {
                    return Ok(None);
                }
                self.append_entry(&view, offset, bytes.len(), view.store_time_ms, 0).map(Some)
            }
            RecordKind::Delivery => {
                let delivery =
                    DeliveryView::parse(bytes).map_err(|kind| self.log.corruption_at(offset, kind))?;
                match self.index_delivery(offset, delivery) {
                    Ok(queue) => Ok(Some(queue)),
                    // Only a rebuild of the indexes from the oldest segment
                    // meets this: the timer fired long ago and retention has
                    // since deleted its message (retention keeps every message
                    // whose delivery is not indexed yet). Its queue entry cannot
                    // be made again: the topic was in the deleted record.
                    Err(Error::Reclaimed { offset: message }) => {
                        tracing::debug!(
                            delivery = offset,
                            message,
                            "delivery of a deleted message not re-indexed"
                        );
                        self.reclaimed_deliveries.set(self.reclaimed_deliveries.get() + 1);
                        Ok(None)
                    }
                    // Its message is damaged: the timer cannot be delivered.
                    Err(e @ Error::Corruption { .. }) => self.quarantine(offset, e),
                    Err(e) => Err(e),
                }
            }
            RecordKind::Deliveries => match self.deliveries(offset, bytes) {
                Ok(view) => self.index_deliveries(offset, bytes.len(), &view).map(Some),
                Err(e @ Error::Corruption { .. }) => self.quarantine(offset, e),
                Err(e) => Err(e),
            },
            RecordKind::Reschedule => match RescheduleView::parse(bytes) {
                // The ticker replaced the old timer when it wrote the record;
                // the new one is indexed here, in log order, like a message's.
                Ok(view) if view.delivers() => {
                    // The entry first: a retry after a full disk appends it
                    // once (the queue's last entry says), and sends the timer once.
                    let queue = match self.index_occurrence(offset, bytes.len(), &view, None) {
                        Ok(queue) => Some(queue),
                        Err(Error::Reclaimed { .. }) => {
                            self.reclaimed_deliveries.set(self.reclaimed_deliveries.get() + 1);
                            None
                        }
                        Err(e @ Error::Corruption { .. }) => return self.quarantine(offset, e),
                        Err(e) => return Err(e),
                    };
                    self.scheduler.index_rescheduled(offset, &view).map(|()| queue)
                }
                Ok(view) => {
                    self.note_count("", 0, ScheduleDelta { active: 0, paused: pauses(&view) });
                    self.scheduler.index_rescheduled(offset, &view).map(|()| None)
                }
                Err(kind) => self.quarantine(offset, self.log.corruption_at(offset, kind)),
            },
            RecordKind::Occurrences => match OccurrencesView::parse(bytes, offset) {
                Ok(view) => self.index_occurrences(offset, bytes.len(), &view),
                Err(kind) => self.quarantine(offset, self.log.corruption_at(offset, kind)),
            },
            // Cancels were applied by the ticker that wrote them; here they
            // only settle their message's topic count (and its schedule's).
            RecordKind::Cancel => {
                if let (Some(_), Ok(cancel)) = (&self.topics, CancelView::parse(bytes))
                    && let Some(named) = message_of(&mut self.originals.borrow_mut(), cancel.message_offset)
                {
                    let schedules = settled_schedule(&named, cancel.deliver_at_ms == PAUSED_AT_MS);
                    self.note_count(&named.topic, -1, schedules);
                }
                Ok(None)
            }
            // Padding is skipped; a relocation changes where a message's
            // bytes are, not its timer.
            RecordKind::Relocation | RecordKind::Skipped | RecordKind::Padding => Ok(None),
        }
    }

    /// Indexes the delivery record at `offset` into the queue of the message
    /// it delivers: the record it names is the message, or a reschedule
    /// record that names it. The entry points at the delivery record, so a
    /// queue's entries stay in commit-log order (recovery relies on it);
    /// consumers follow the delivery record to the message.
    fn index_delivery(&self, offset: u64, delivery: DeliveryView) -> Result<Arc<ConsumeQueue>> {
        // A delivery of this session's ticker names a record checked in this session.
        let checksum = offset < self.replay_end;
        let mut originals = self.originals.borrow_mut();
        let mut named = delivery.message_offset;
        loop {
            let (step, _) = originals.visit_checking(named, checksum, |at, kind, record| match kind {
                RecordKind::Message => {
                    let view = self.message(at, record)?;
                    let queue = self.queues.get_or_create(view.topic, view.queue_id);
                    queue.append(&delivery_entry(&view, offset, &delivery))?;
                    // A schedule's last occurrence ends it.
                    self.note_count(
                        view.topic,
                        -1,
                        ScheduleDelta { active: -i64::from(view.schedule), paused: 0 },
                    );
                    Ok(Ok(queue))
                }
                RecordKind::Reschedule if named == delivery.message_offset => RescheduleView::parse(record)
                    .map(|r| Err(r.message_offset))
                    .map_err(|kind| self.log.corruption_at(at, kind)),
                _ => {
                    let why = format!("delivery at {offset} names a {kind:?} record");
                    Err(self.log.corruption_at(at, CorruptionKind::BadReference(why)))
                }
            })?;
            match step? {
                Ok(queue) => return Ok(queue),
                Err(message) => named = message,
            }
        }
    }

    /// Indexes the occurrence record at `offset` (`len` bytes), a reschedule
    /// record that also delivers a schedule's occurrence, into the
    /// schedule's queue: the entry points at the record, as a delivery
    /// record's does, and consumers follow it to the timer it replaced and
    /// on to the schedule's record. The schedule stays pending (its next
    /// occurrence is this record's timer), so its topic's count is unchanged.
    ///
    /// `batch`: the entry's index, for an entry of an occurrences record.
    fn index_occurrence(
        &self,
        offset: u64,
        len: usize,
        view: &RescheduleView,
        batch: Option<usize>,
    ) -> Result<Arc<ConsumeQueue>> {
        let checksum = offset < self.replay_end;
        let mut originals = self.originals.borrow_mut();
        let (queue, _) = originals.visit_checking(view.message_offset, checksum, |at, kind, record| {
            let schedule = match kind {
                RecordKind::Message => self.message(at, record)?,
                _ => {
                    let why = format!("occurrence at {offset} names a {kind:?} record");
                    return Err(self.log.corruption_at(at, CorruptionKind::BadReference(why)));
                }
            };
            if !schedule.schedule {
                let why = format!("occurrence at {offset} names a message that is not a schedule");
                return Err(self.log.corruption_at(at, CorruptionKind::BadReference(why)));
            }
            let queue = self.queues.get_or_create(schedule.topic, schedule.queue_id);
            // A retry after a full disk: the queue's last entry says whether it was appended.
            let appended =
                queue.last().is_some_and(|last| last.log_offset == offset && last.batch_index() >= batch);
            if !appended {
                let flags = batch.map_or(FLAG_TIMER_DELIVERY, batch_flags);
                queue.append(&message_entry(&schedule, offset, len, view.rescheduled_at_ms, flags))?;
            }
            Ok(queue)
        })?;
        queue
    }

    /// Indexes the occurrences record at `offset` (`len` bytes): each entry
    /// as the delivering occurrence record it stands for (see
    /// [`index_occurrence`](Self::index_occurrence)), its queue entry naming
    /// it by index, and its timer (named by the entry's offset) sent on. An
    /// entry whose schedule is damaged is quarantined alone. The record goes
    /// to several queues: they are noted in `touched_too`.
    fn index_occurrences(
        &self,
        offset: u64,
        len: usize,
        view: &OccurrencesView<'_>,
    ) -> Result<Option<Arc<ConsumeQueue>>> {
        // The entries first, then the timers: a retry after a full disk
        // appends each entry once, and sends each timer once.
        let mut indexed = Vec::with_capacity(view.len());
        for (i, (name, entry)) in view.entries().enumerate() {
            match self.index_occurrence(offset, len, &entry, Some(i)) {
                Ok(queue) => {
                    let mut touched = self.touched_too.borrow_mut();
                    if !touched.iter().any(|q| Arc::ptr_eq(q, &queue)) {
                        touched.push(queue);
                    }
                    indexed.push((name, entry));
                }
                Err(Error::Reclaimed { .. }) => {
                    self.reclaimed_deliveries.set(self.reclaimed_deliveries.get() + 1);
                    indexed.push((name, entry));
                }
                Err(e @ Error::Corruption { .. }) => drop(self.quarantine(name, e)?),
                Err(e) => return Err(e),
            }
        }
        for (name, entry) in indexed {
            self.scheduler.index_rescheduled(name, &entry)?;
        }
        Ok(None)
    }

    /// Indexes the deliveries record at `offset` (`len` bytes): one entry per
    /// timer, each pointing at the record and naming its timer by index;
    /// consumers follow it to the timer's record and on to the message.
    ///
    /// No message is read: retention keeps every message whose delivery is
    /// not indexed yet. Only a record written before this open may name a
    /// message retention has deleted since (a rebuild of the indexes from the
    /// oldest segment): those timers are left out, as a delivery record's are.
    ///
    /// A retry after a failure part way (a full disk) appends only the
    /// entries not appended yet: the queue's last entry says how far it got.
    fn index_deliveries(
        &self,
        offset: u64,
        len: usize,
        view: &DeliveriesView<'_>,
    ) -> Result<Arc<ConsumeQueue>> {
        let queue = self.queues.get_or_create(view.topic, view.queue_id);
        let appended = queue.last().filter(|e| e.log_offset == offset).and_then(|e| e.batch_index());
        let replayed = offset < self.replay_end;
        let mut kept = 0;
        let entries = view.timers().enumerate().filter_map(|(i, (timer, tag_hash))| {
            if replayed && !self.replayed_timer_readable(offset, timer) {
                return None;
            }
            kept += 1;
            let entry = deliveries_entry(offset, len, view, i, tag_hash);
            appended.is_none_or(|last| i > last).then_some(entry)
        });
        queue.append_all(entries)?;
        self.note_count(view.topic, -kept, ScheduleDelta::default());
        Ok(queue)
    }

    /// Whether the message of a timer in the deliveries record at `offset`,
    /// written before this open, is there to be read, checksum checked (the
    /// checks a delivery record's message gets when it is indexed): one
    /// retention deleted is counted and left out, a damaged one quarantined.
    fn replayed_timer_readable(&self, offset: u64, timer: u64) -> bool {
        let mut originals = self.originals.borrow_mut();
        let mut named = timer;
        for _ in 0..2 {
            let step = originals.visit_checking(named, true, |at, kind, record| match kind {
                RecordKind::Message => self.message(at, record).map(|_| None),
                RecordKind::Reschedule if named == timer => RescheduleView::parse(record)
                    .map(|r| Some(r.message_offset))
                    .map_err(|kind| self.log.corruption_at(at, kind)),
                _ => {
                    let why = format!("deliveries record at {offset} names a {kind:?} record");
                    Err(self.log.corruption_at(at, CorruptionKind::BadReference(why)))
                }
            });
            match step.and_then(|(step, _)| step) {
                Ok(None) => return true,
                Ok(Some(message)) => named = message,
                Err(Error::Reclaimed { .. }) => {
                    self.reclaimed_deliveries.set(self.reclaimed_deliveries.get() + 1);
                    return false;
                }
                Err(e) => {
                    let _ = self.quarantine(offset, e);
                    return false;
                }
            }
        }
        false
    }

    /// Parses a deliveries record and checks the queue it names, like a message's.
    fn deliveries<'a>(&self, offset: u64, bytes: &'a [u8]) -> Result<DeliveriesView<'a>> {
        let view = DeliveriesView::parse(bytes).map_err(|kind| self.log.corruption_at(offset, kind))?;
        if validate_topic(view.topic).is_err() || view.queue_id >= self.queues_per_topic {
            let why = format!("deliveries record names topic {:?} queue {}", view.topic, view.queue_id);
            return Err(self.log.corruption_at(offset, CorruptionKind::BadFrame(why)));
        }
        Ok(view)
    }

    /// Notes what the record being indexed does to `topic`'s count (`sign`:
    /// +1 for a timed message, -1 for a record that settles one) and to the
    /// schedules counted.
    fn note_count(&self, topic: &str, sign: i64, schedules: ScheduleDelta) {
        if let Some(topics) = &self.topics {
            self.count.borrow_mut().note(topics, topic, sign, schedules);
        }
    }

    /// Parses a message record and checks what it names, since the topic
    /// becomes a directory name.
    fn message<'a>(&self, offset: u64, bytes: &'a [u8]) -> Result<MessageView<'a>> {
        let view = MessageView::parse(bytes).map_err(|kind| self.log.corruption_at(offset, kind))?;
        if validate_topic(view.topic).is_err() || view.queue_id >= self.queues_per_topic {
            let why = format!("message record names topic {:?} queue {}", view.topic, view.queue_id);
            return Err(self.log.corruption_at(offset, CorruptionKind::BadFrame(why)));
        }
        Ok(view)
    }

    fn append_entry(
        &self,
        view: &MessageView<'_>,
        log_offset: u64,
        record_len: usize,
        time_ms: u64,
        flags: u32,
    ) -> Result<Arc<ConsumeQueue>> {
        let queue = self.queues.get_or_create(view.topic, view.queue_id);
        queue.append(&message_entry(view, log_offset, record_len, time_ms, flags))?;
        Ok(queue)
    }

    /// The `dw-dispatch` thread's body: indexes whatever is appended,
    /// until `stop` is set and everything appended before it is indexed. A
    /// full disk makes it wait and retry the record it stopped at (see
    /// `stall.rs`); any other failure poisons the log: the indexes cannot
    /// follow it any more.
    pub fn run(mut self, wake: Receiver<()>, stop: StopFlag) -> Result<()> {
        if let Some(topics) = self.topics.as_ref().filter(|t| t.recounting()) {
            topics.recount(&self.log, self.scheduler.as_ref(), self.next);
        }
        loop {
            match self.dispatch_available() {
                Ok(_) => self.stall.release("dispatch"),
                Err(e) if self.stall.hold("dispatch", &e) => {
                    if stop.is_set() {
                        return Ok(()); // the replay at the next open indexes the rest
                    }
                    std::thread::sleep(RETRY);
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "dispatcher stopped");
                    self.log.poison(&format!("dispatcher: {e}"));
                    return Ok(());
                }
            }
            // Stop only once everything appended before close is indexed.
            if stop.is_set() && self.next >= self.log.write_end() {
                return Ok(());
            }
            if stop.is_set() && self.durable_only {
                // What is left was appended by the store itself (deliveries,
                // cancels): make it durable rather than wait for the next flush.
                if self.log.flush().is_err() {
                    return Ok(());
                }
                continue;
            }
            let _ = wake.recv_timeout(Duration::from_millis(100));
        }
    }
}

/// The entry of the message `view`, made visible by the record at
/// `log_offset` of `record_len` bytes (the message itself, or a delivery
/// record) at `time_ms`.
pub(crate) fn message_entry(
    view: &MessageView<'_>,
    log_offset: u64,
    record_len: usize,
    time_ms: u64,
    flags: u32,
) -> Entry {
    Entry { log_offset, record_len: record_len as u32, tag_hash: tag_hash(view.tags), time_ms, flags }
}

/// The entry of the delivery record `delivery` at `offset`, which makes the
/// message `view` visible.
pub(crate) fn delivery_entry(view: &MessageView<'_>, offset: u64, delivery: &DeliveryView) -> Entry {
    message_entry(view, offset, DELIVERY_LEN, delivery.delivered_at_ms, FLAG_TIMER_DELIVERY)
}

/// The entry of timer `i` (whose tags hash to `tag_hash`) of the deliveries
/// record `view` at `offset` (`len` bytes).
pub(crate) fn deliveries_entry(
    offset: u64,
    len: usize,
    view: &DeliveriesView<'_>,
    i: usize,
    tag_hash: u32,
) -> Entry {
    Entry {
        log_offset: offset,
        record_len: len as u32,
        tag_hash,
        time_ms: view.delivered_at_ms,
        flags: batch_flags(i),
    }
}
