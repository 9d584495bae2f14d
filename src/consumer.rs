//! Consumers: read a consume queue from an offset, wait without spinning, and
//! commit how far they got. Committed offsets survive restarts.

use std::num::{NonZeroU16, NonZeroU64};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use crossbeam_channel::Receiver;

use crate::commitlog::{CommitLog, LogReader};
use crate::consume_queue::ConsumeQueue;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::queue_entry::Entry;
use crate::format::record::{
    DEDUP_PROPERTY, DeliveriesView, DeliveryView, MessageView, OccurrencesView, REPLACES_PROPERTY,
    RecordKind, RescheduleView, deliveries_count, deliveries_timer,
};
use crate::message::{ConsumedMessage, Extras, Handle};
use crate::offsets::OffsetStore;
use crate::receipt::Occurrence;
use crate::schedule::SPEC_PROPERTY;
use crate::stats::RetentionCounters;

/// Entries whose messages are touched together before they are read: enough
/// for the cache misses to overlap, few enough that the touched lines and
/// their TLB entries are still there when the messages are read.
const TOUCH_CHUNK: usize = 256;

/// A reader of one consume queue on behalf of a consumer group, made by
/// [`Store::consumer`](crate::Store::consumer). Each message comes once per
/// position; [`commit`](Self::commit) records how far the group got, so the
/// next consumer of the group starts there (after a restart too).
pub struct Consumer {
    /// Shared by every message this consumer hands out (no allocation per message).
    topic: Arc<str>,
    log: Arc<CommitLog>,
    /// Follows entries to their records (holds the segment table only while polling).
    reader: LogReader,
    queue: Arc<ConsumeQueue>,
    offsets: Arc<OffsetStore>,
    group: String,
    next: u64,
    wake: Receiver<()>,
    /// Where skipped entries are counted.
    retention: Arc<RetentionCounters>,
    /// The deliveries or occurrences record whose checksum was checked
    /// last: its other entries' timers are read from it without checking
    /// it again.
    checked_deliveries: u64,
    /// The record a run of entries points at, kept during a poll (it holds
    /// its segment, as the reader does).
    run: Option<Run>,
    /// The entries of the chunk being read (kept to reuse the allocation).
    entries: Vec<Entry>,
}

/// The record a run of entries points at (each names its timer by index).
struct Run {
    offset: u64,
    /// A deliveries record (`bytes` are its timers) or an occurrences record (all of it).
    kind: RecordKind,
    bytes: Bytes,
}

impl Consumer {
    pub(crate) fn new(
        log: Arc<CommitLog>,
        queue: Arc<ConsumeQueue>,
        offsets: Arc<OffsetStore>,
        group: &str,
        retention: Arc<RetentionCounters>,
    ) -> Self {
        // Subscribe before reading the committed offset, so no append is missed.
        let wake = queue.subscribe();
        let next = offsets.get(group, queue.topic(), queue.queue_id()).unwrap_or(0);
        let topic = Arc::from(queue.topic());
        let reader = LogReader::new(Arc::clone(&log));
        Self {
            topic,
            log,
            reader,
            queue,
            offsets,
            group: group.to_string(),
            next,
            wake,
            retention,
            checked_deliveries: 0,
            run: None,
            entries: Vec::with_capacity(TOUCH_CHUNK),
        }
    }

    /// Up to `max` messages from the current position, in queue order,
    /// waiting at most `timeout` for the first one (sleeping, not spinning).
    /// Returns as soon as anything is available; an empty list if nothing
    /// came. Entries whose records retention deleted are skipped and counted
    /// ([`RetentionStats::consumer_skipped`](crate::RetentionStats::consumer_skipped)).
    ///
    /// Errors: [`Error::BadEntry`] for an entry, or the record it points
    /// at, that does not check out, naming its queue position and (in its
    /// source) the file and offset. The messages before it are returned
    /// first, by this poll; the error comes with the next one, and the
    /// position stays at the bad entry until the caller moves past it with
    /// `seek(position + 1)`. [`Error::Closed`] once the store is closed.
    pub fn poll(&mut self, max: usize, timeout: Duration) -> Result<Vec<ConsumedMessage>> {
        if self.log.is_closed() {
            return Err(Error::Closed);
        }
        let polled = self.poll_inner(max, timeout);
        self.release();
        polled
    }

    /// Lets go of every segment this consumer holds: between polls (and
    /// while it waits), it holds none retention may want to delete.
    fn release(&mut self) {
        self.reader.release();
        self.run = None;
    }

    fn poll_inner(&mut self, max: usize, timeout: Duration) -> Result<Vec<ConsumedMessage>> {
        let deadline = Instant::now() + timeout;
        loop {
            let available = self.queue.len();
            self.skip_deleted_files();
            if self.next < available {
                let upto = available.min(self.next.saturating_add(max as u64));
                let mut messages = Vec::with_capacity((upto - self.next) as usize);
                while self.next < upto {
                    let to = upto.min(self.next + TOUCH_CHUNK as u64);
                    let Err((index, e)) = self.read_chunk(self.next, to, &mut messages) else {
                        self.next = to;
                        continue;
                    };
                    match e {
                        Error::Reclaimed { offset } => self.skip_reclaimed(index, offset),
                        // Retention deleted its queue file since we looked.
                        _ if index < self.queue.first_index() => self.skip_reclaimed(index, 0),
                        // The entry's own bytes are damaged: the log still
                        // holds what it pointed at, so read it again, repaired.
                        e if self.queue.is_damaged_entry(&e) && self.repair_entries(index) => {
                            self.next = index;
                            continue;
                        }
                        // The good ones first; the next poll starts at the bad one.
                        e => {
                            self.next = index;
                            return if messages.is_empty() {
                                Err(self.bad_entry(index, e))
                            } else {
                                Ok(messages)
                            };
                        }
                    }
                    self.next = index + 1;
                }
                if messages.is_empty() {
                    continue;
                }
                return Ok(messages);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || max == 0 {
                return Ok(Vec::new());
            }
            // A token means entries were appended after we looked; a timeout means none were.
            self.release();
            if self.wake.recv_timeout(left).is_err() {
                return Ok(Vec::new());
            }
        }
    }

    /// Appends the messages of queue positions `[from, to)` to `messages`,
    /// up to the first position that does not read: that one's position and
    /// error. The entries are read first, then the timers they deliver, then
    /// the messages, so each step's random reads overlap.
    fn read_chunk(
        &mut self,
        from: u64,
        to: u64,
        messages: &mut Vec<ConsumedMessage>,
    ) -> std::result::Result<(), (u64, Error)> {
        let mut entries = std::mem::take(&mut self.entries);
        entries.clear();
        let unread = self.queue.read_batch(from, to, &mut entries).err();
        let (timers, untimed) = self.timers_of(from, &entries);
        // The earlier failure comes first: a timer not found stops the entries there.
        let failed = untimed.or(unread);
        let read = (from..).zip(&entries).zip(timers).try_for_each(|((index, entry), timer)| {
            messages.push(self.read(index, entry, timer).map_err(|e| (index, e))?);
            Ok(())
        });
        self.entries = entries;
        read.and(failed.map_or(Ok(()), Err))
    }

    /// Makes the damaged run of entries from `index` again from the log
    /// (see `queue_repair`); whether it could.
    fn repair_entries(&self, index: u64) -> bool {
        match crate::queue_repair::repair_run(&self.log, &self.queue, index) {
            Ok(repaired) => repaired > 0,
            Err(e) => {
                tracing::error!(topic = %self.topic, index, error = %e, "could not repair consume-queue entries");
                false
            }
        }
    }

    fn bad_entry(&self, position: u64, source: Error) -> Error {
        let (topic, queue_id) = (self.topic.to_string(), self.queue.queue_id());
        tracing::error!(%topic, queue_id, position, error = %source, "unreadable consume-queue entry");
        Error::BadEntry { topic, queue_id, position, source: Box::new(source) }
    }

    /// Retention deleted the queue's files up to the oldest entry still on
    /// disk: a consumer behind it starts there, counting what it skipped.
    fn skip_deleted_files(&mut self) {
        let first = self.queue.first_index();
        if self.next < first {
            let skipped = first - self.next;
            self.retention.consumer_skipped.fetch_add(skipped, Ordering::Relaxed);
            tracing::warn!(
                topic = %self.topic,
                queue = self.queue.queue_id(),
                from = self.next,
                to = first,
                "skipped entries whose records retention deleted"
            );
            self.next = first;
        }
    }

    /// Retention deleted the record of entry `index` before this consumer
    /// read it: the normal trade-off of a message queue. It is counted and
    /// logged, and the consumer moves on to the oldest retained entry.
    fn skip_reclaimed(&self, index: u64, offset: u64) {
        self.retention.consumer_skipped.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            topic = %self.topic,
            queue = self.queue.queue_id(),
            index,
            offset,
            "skipped an entry whose record retention deleted"
        );
    }

    /// The timer each delivery entry among `entries` (the first at queue
    /// position `from`) names ([`Self::timer_of`]; `None` for other
    /// entries), all found before any message is read, and their records
    /// touched (see [`LogReader::touch`]): they lie anywhere in the log.
    /// Stops at the first entry whose timer is not found, with its position and why.
    fn timers_of(&mut self, from: u64, entries: &[Entry]) -> (Vec<Option<u64>>, Option<(u64, Error)>) {
        let mut timers = Vec::with_capacity(entries.len());
        let mut failed = None;
        for (index, entry) in (from..).zip(entries) {
            if !entry.timer_delivery() {
                timers.push(None);
                continue;
            }
            match self.timer_of(index, entry) {
                Ok(timer) => timers.push(Some(timer)),
                Err(e) => {
                    failed = Some((index, e));
                    break;
                }
            }
        }
        let touched = timers.iter().flatten().fold(0u8, |acc, &timer| acc ^ self.reader.touch(timer));
        std::hint::black_box(touched);
        (timers, failed)
    }

    /// The record of the timer whose delivery entry `entry` (at queue
    /// position `index`) is: named by the delivery record it points at, or by
    /// the deliveries record, at the index the entry gives. A deliveries
    /// record's checksum is checked once for the run of entries that point at
    /// it, and its timers are kept while this poll reads them.
    fn timer_of(&mut self, index: u64, entry: &Entry) -> Result<u64> {
        let Some(i) = entry.batch_index() else { return self.delivered_timer(index, entry) };
        let run = match self.run.take() {
            Some(run) if run.offset == entry.log_offset => run,
            _ => self.read_run(index, entry)?,
        };
        let timer = match run.kind {
            RecordKind::Occurrences => OccurrencesView::entry_at(&run.bytes, run.offset, i)
                .map(|(_, occurrence)| occurrence.from_timer)
                .map_err(|kind| self.log.corruption_at(run.offset, kind)),
            _ => deliveries_timer(&run.bytes, i).map(|(timer, _)| timer).ok_or_else(|| {
                let why =
                    format!("names timer {i} of a deliveries record of {}", deliveries_count(&run.bytes));
                bad_reference(&self.log, index, entry, &why)
            }),
        };
        self.run = Some(run);
        timer
    }

    /// The record of the run of entries `entry` (at queue position `index`)
    /// is in: the timers of a deliveries record, or an occurrences record,
    /// its checksum checked unless this consumer checked it before (a run
    /// may span polls).
    fn read_run(&mut self, index: u64, entry: &Entry) -> Result<Run> {
        let checksum = self.checked_deliveries != entry.log_offset;
        let record = self.reader.read_checking(entry.log_offset, checksum)?;
        let batch = matches!(record.kind, RecordKind::Deliveries | RecordKind::Occurrences);
        if record.offset != entry.log_offset || !batch {
            let why = "does not point at a deliveries or occurrences record";
            return Err(bad_reference(&self.log, index, entry, why));
        }
        if record.bytes.len() != entry.record_len as usize {
            return Err(bad_reference(&self.log, index, entry, "does not match the length of its record"));
        }
        let bytes = match record.kind {
            RecordKind::Deliveries => {
                let view = DeliveriesView::parse(&record.bytes)
                    .map_err(|k| self.log.corruption_at(record.offset, k))?;
                record.bytes.slice_ref(view.timer_bytes())
            }
            _ => record.bytes,
        };
        self.checked_deliveries = entry.log_offset;
        Ok(Run { offset: record.offset, kind: record.kind, bytes })
    }

    /// The record of the timer whose delivery record entry `entry` (at
    /// queue position `index`) points at.
    fn delivered_timer(&mut self, index: u64, entry: &Entry) -> Result<u64> {
        let log = &self.log;
        let named = |at: u64, kind: RecordKind, bytes: &[u8]| -> Result<u64> {
            if at != entry.log_offset || !matches!(kind, RecordKind::Delivery | RecordKind::Reschedule) {
                return Err(bad_reference(log, index, entry, "does not point at a delivery record"));
            }
            if bytes.len() != entry.record_len as usize {
                return Err(bad_reference(log, index, entry, "does not match the length of its record"));
            }
            if kind == RecordKind::Delivery {
                return DeliveryView::parse(bytes)
                    .map(|d| d.message_offset)
                    .map_err(|k| log.corruption_at(at, k));
            }
            // A schedule's occurrence: the record delivers the timer it replaces.
            match RescheduleView::parse(bytes).map_err(|k| log.corruption_at(at, k))? {
                r if r.delivers() => Ok(r.from_timer),
                _ => Err(bad_reference(log, index, entry, "points at a reschedule that delivers nothing")),
            }
        };
        self.reader.visit_checked(entry.log_offset, named)?.0
    }

    /// The message of the entry at queue position `index`: for a timer's
    /// delivery, `timer` is the record [`Self::timers_of`] found it names.
    fn read(&mut self, index: u64, entry: &Entry, timer: Option<u64>) -> Result<ConsumedMessage> {
        let bad = |log: &CommitLog, why: &str| bad_reference(log, index, entry, why);
        let mut rescheduled_to = None;
        // Occurrences delivered before this timer's, if it is a schedule's.
        let mut fired_before = 0;
        let record = match timer {
            // A timer's entry points at its delivery (or deliveries) record,
            // which names the record of the timer: the message, or a
            // reschedule record that names the message.
            Some(timer) => {
                let mut record = self.reader.read(timer)?;
                if record.kind == RecordKind::Reschedule {
                    let r = RescheduleView::parse(&record.bytes)
                        .map_err(|kind| self.log.corruption_at(record.offset, kind))?;
                    rescheduled_to = NonZeroU64::new(r.deliver_at_ms);
                    fired_before = r.occurrence.map_or(0, |o| o.fired);
                    record = self.reader.read(r.message_offset)?;
                }
                if record.kind != RecordKind::Message {
                    return Err(bad(&self.log, "names a delivery of something that is not a message"));
                }
                record
            }
            None => {
                let record = self.reader.read(entry.log_offset)?;
                if record.kind != RecordKind::Message {
                    return Err(bad(&self.log, "does not point at a message or a delivery record"));
                }
                if record.bytes.len() != entry.record_len as usize {
                    return Err(bad(&self.log, "does not match the length of its record"));
                }
                record
            }
        };
        let corrupt = |kind| self.log.corruption_at(record.offset, kind);
        let view = MessageView::parse(&record.bytes).map_err(corrupt)?;
        let extras = match (view.key, view.tags, view.has_properties()) {
            ("", "", false) => None,
            (key, tags, _) => {
                let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
                let mut properties = view.properties().map_err(corrupt)?;
                let mut occurrence = None;
                let dedup_key = view.dedup_key().map(str::to_string);
                // The store's own: the dedup key is its own field, the replaced timer is settled.
                properties.retain(|(name, _)| name != DEDUP_PROPERTY && name != REPLACES_PROPERTY);
                if view.schedule
                    && let Some(timer) = timer
                {
                    // The spec is the store's; the consumer gets the occurrence.
                    properties.retain(|(name, _)| name != SPEC_PROPERTY);
                    let schedule = Handle { offset: record.offset, deliver_at_ms: view.timing.deliver_at_ms };
                    let next_at_ms = self.next_occurrence(entry, timer)?;
                    occurrence =
                        Some(Occurrence { schedule, number: fired_before.saturating_add(1), next_at_ms });
                }
                let (key, tags) = (non_empty(key), non_empty(tags));
                Some(Box::new(Extras { key, tags, properties, dedup_key, occurrence }))
            }
        };
        let (body_at, queue_id, store_time_ms, timing) =
            (view.body.start, view.queue_id, view.store_time_ms, view.timing);
        debug_assert_eq!(view.body.end, record.bytes.len(), "a message record ends with its body");
        let mut body = record.bytes;
        body.advance(body_at);
        Ok(ConsumedMessage {
            topic: Arc::clone(&self.topic),
            body,
            extras,
            queue_offset: index,
            log_offset: record.offset,
            store_time_ms,
            visible_at_ms: entry.time_ms,
            // A rescheduled message was due at its new time.
            deliver_at_ms: rescheduled_to.or(NonZeroU64::new(timing.deliver_at_ms)),
            queue_id,
            delay_level: NonZeroU16::new(timing.delay_level),
        })
    }

    /// When the occurrence after the one the entry delivers (of `timer`) is
    /// due: the entry's record arms it, unless it is a delivery record (the
    /// schedule's last occurrence).
    fn next_occurrence(&mut self, entry: &Entry, timer: u64) -> Result<Option<u64>> {
        // The run read for this entry's timer, if a later one did not take its place.
        let kept = self.run.as_ref().filter(|run| run.offset == entry.log_offset);
        let (kind, bytes) = match kept.map(|run| (run.kind, run.bytes.clone())) {
            Some(kept) => kept,
            None => {
                let record = self.reader.read(entry.log_offset)?;
                (record.kind, record.bytes)
            }
        };
        let corrupt = |kind| self.log.corruption_at(entry.log_offset, kind);
        let next = match (kind, entry.batch_index()) {
            (RecordKind::Occurrences, Some(i)) => {
                OccurrencesView::entry_at(&bytes, entry.log_offset, i).map_err(corrupt)?.1
            }
            (RecordKind::Reschedule, None) => RescheduleView::parse(&bytes).map_err(corrupt)?,
            _ => return Ok(None),
        };
        debug_assert_eq!(next.from_timer, timer, "an occurrence's entry names the timer it replaced");
        Ok(Some(next.deliver_at_ms))
    }

    /// The queue offset the next `poll` starts at.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Moves the read position (clamped to the queue's end).
    pub fn seek(&mut self, offset: u64) {
        self.next = offset.min(self.queue.len());
    }

    /// Commits the current position for this consumer's group. Committed
    /// offsets reach the disk with the next flush and at close.
    pub fn commit(&self) {
        self.offsets.set(&self.group, self.queue.topic(), self.queue.queue_id(), self.next);
    }

    /// The number of entries in the queue.
    pub fn queue_len(&self) -> u64 {
        self.queue.len()
    }

    /// The topic this consumer reads.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The queue this consumer reads.
    pub fn queue_id(&self) -> u32 {
        self.queue.queue_id()
    }

    /// A watch on this consumer's queue, for a caller that waits without a
    /// thread (an async long poll) while the consumer itself is elsewhere.
    pub fn watch(&self) -> QueueWatch {
        QueueWatch { queue: Arc::clone(&self.queue) }
    }
}

/// Tells a caller without the [`Consumer`] when its queue grows: an async
/// task registers its waker, and the next append wakes it. No thread waits.
#[derive(Clone)]
pub struct QueueWatch {
    queue: Arc<ConsumeQueue>,
}

impl QueueWatch {
    /// Entries in the queue now (a consumer's position runs up to this).
    pub fn entries(&self) -> u64 {
        self.queue.len()
    }

    /// Wakes `waker`'s task once, at the next append. Look at
    /// [`entries`](Self::entries) after registering, so that an append in
    /// between is not missed.
    pub fn wake_on_append(&self, waker: &std::task::Waker) {
        self.queue.wake_on_append(waker);
    }
}

/// The error for consume-queue entry `entry`, at queue position `index`, that
/// does not point where it should (`why`), naming the record it points at.
fn bad_reference(log: &CommitLog, index: u64, entry: &Entry, why: &str) -> Error {
    let why = format!("consume-queue entry {index} {why}");
    log.corruption_at(entry.log_offset, CorruptionKind::BadReference(why))
}

/// Up to `max` messages from any of `consumers`, taken in their order (the
/// first consumer's first), waiting at most `timeout` for the first one
/// (sleeping on all the queues at once, not spinning). Each message names
/// its topic and queue, so the caller knows whose position moved.
///
/// Errors: those of [`Consumer::poll`], for the first consumer that meets one.
pub fn poll_any(consumers: &mut [Consumer], max: usize, timeout: Duration) -> Result<Vec<ConsumedMessage>> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut messages = Vec::new();
        for consumer in consumers.iter_mut() {
            if messages.len() >= max {
                break;
            }
            messages.extend(consumer.poll(max - messages.len(), Duration::ZERO)?);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if !messages.is_empty() || left.is_zero() || max == 0 || consumers.is_empty() {
            return Ok(messages);
        }
        // A token on any queue means entries were appended after we looked.
        let mut select = crossbeam_channel::Select::new();
        for consumer in consumers.iter() {
            select.recv(&consumer.wake);
        }
        match select.select_timeout(left) {
            Ok(ready) => {
                let index = ready.index();
                let _ = ready.recv(&consumers[index].wake);
            }
            Err(_) => return Ok(Vec::new()),
        }
    }
}
