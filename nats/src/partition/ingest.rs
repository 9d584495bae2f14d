//! Reading the partition: every timer its consumer hands out, checked,
//! deduplicated and put into the local store.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::Message as JsMessage;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::message::StreamMessage;
use bytes::Bytes;
use delaywheel::{Handle, MAX_DELIVER_AT_MS, MAX_PROPERTIES_LEN, Message, Store};
use futures::StreamExt;

use crate::headers::{deliver_at, header_pairs, owned_pairs, target_of, value_of};
use crate::nats_schedule::NatsSchedule;
use crate::target::TargetPolicy;
use crate::wire::{self, TimerHandle};
use crate::{Result, TierError};

use super::{
    BY_REFERENCE, FIRE_TOPIC, MAX_MSG_ID_LEN, PARTITION_SEGMENT_BYTES, Part, PendingTimer, Presence,
    SUBJECT_PROPERTY, Settled, acknowledge, consumer_name, producer_msg_id,
};

/// The most bytes of timers one local batch put holds (about): a batch must
/// fit in one segment, and 1,024 timers of up to 4 MiB each would not.
const PUT_BATCH_BYTES: usize = (PARTITION_SEGMENT_BYTES / 4) as usize;
/// Timers read from the stream per local batch put.
const INGEST_BATCH: usize = 1024;
/// Timers one pull request of the ingest asks for, unless the consumer's
/// `max_batch` (a server limit) is lower. async-nats asks for 200, and a
/// node taking a partition over re-reads every pending timer: with 16,384,
/// 1 M were read in 14.5 s instead of 28.3 s (`tools/nats-takeover.sh`, one
/// run each, alternating; the README has the table).
const INGEST_PULL: usize = 16384;
/// Bytes one pull request asks for at most (or the consumer's `max_bytes`,
/// if lower): async-nats asks again at half of it, so a partition of large
/// timers holds at most about 1.5 times this in the client, not 24,576 of
/// them.
const INGEST_PULL_BYTES: usize = 64 << 20;
/// Lookups of settled `Nats-Msg-Id`s a batch read from the stream makes at once.
const SETTLED_LOOKUPS: usize = 64;
/// How long the stream waits for a timer's acknowledgement before handing it
/// out again: longer than any timer waits, so never.
const HOLD_UNTIL_FIRED: Duration = Duration::from_secs(100 * 365 * 86_400);
/// How often an owner handed nothing for that long asks the partition's
/// consumer whether it handed timers to another's pull request (see [`Seen`]).
const ELSEWHERE_CHECK: Duration = Duration::from_secs(5);

/// The last delivery of the partition's consumer this owner was handed:
/// its consumer sequence (one per delivery, whichever pull request it
/// went to) and the highest stream sequence handed out so far.
///
/// A delivery whose consumer sequence skips went to another's pull
/// request: an earlier owner that stalled past its lease and then pulled
/// once more, from the consumer this owner kept (or made anew under the
/// same name). Those timers would be held by a node that never fires
/// them; this owner reads them from the stream instead, as it reads the
/// tail after a checkpoint (a timer that one fired and acknowledged after
/// all has left the stream and is passed over). A skip after the last
/// delivery is seen by asking the consumer once nothing came for
/// [`ELSEWHERE_CHECK`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Seen {
    pub consumer: u64,
    pub stream: u64,
}

impl Seen {
    /// Takes in a delivery to this owner; the stream sequences after which
    /// and up to which the consumer handed timers to another before it, if any.
    fn handed(&mut self, consumer: u64, stream: u64) -> Option<(u64, u64)> {
        let skipped = consumer > self.consumer + 1 && stream > self.stream + 1;
        let elsewhere = skipped.then_some((self.stream, stream - 1));
        self.consumer = self.consumer.max(consumer);
        self.stream = self.stream.max(stream);
        elsewhere
    }

    /// Takes in the consumer's last delivery, as its info says; the stream
    /// sequences it handed to another since this owner's last, if any.
    fn delivered(&mut self, consumer: u64, stream: u64) -> Option<(u64, u64)> {
        let elsewhere = (consumer > self.consumer && stream > self.stream).then_some((self.stream, stream));
        self.consumer = self.consumer.max(consumer);
        self.stream = self.stream.max(stream);
        elsewhere
    }
}

/// A timer as read from the stream: handed out by the partition's
/// consumer, or got by its sequence (a taken-over partition's, see
/// `checkpoint.rs`).
pub(super) struct Read<'a> {
    sequence: u64,
    published: time::OffsetDateTime,
    subject: &'a str,
    headers: Option<&'a HeaderMap>,
    payload: &'a Bytes,
    /// The subject that acknowledges it on the partition's consumer.
    ack: Option<async_nats::Subject>,
}

impl<'a> Read<'a> {
    /// A timer the partition's consumer handed out, with its consumer
    /// sequence. A message whose sequence does not read fails the read: a
    /// read counted past it would have passed over a timer.
    fn handed_out(message: &'a JsMessage) -> Result<(Self, u64)> {
        let info = message.info().map_err(|e| TierError::nats("read a message's sequence", e))?;
        let read = Read {
            sequence: info.stream_sequence,
            published: info.published,
            subject: message.subject.as_str(),
            headers: message.headers.as_ref(),
            payload: &message.payload,
            ack: message.reply.clone(),
        };
        Ok((read, info.consumer_sequence))
    }

    /// A timer got from the stream that the consumer `consumer` handed out
    /// (to an earlier owner): acknowledged on it by its sequence.
    pub(super) fn got(message: &'a StreamMessage, stream: &str, consumer: &str) -> Self {
        Read {
            sequence: message.sequence,
            published: message.time,
            subject: message.subject.as_str(),
            headers: Some(&message.headers),
            payload: &message.payload,
            ack: Some(wire::ack_subject(stream, consumer, message.sequence)),
        }
    }
}

/// A timer read from the stream, checked.
struct Indexed {
    sequence: u64,
    deliver_at_ms: u64,
    ack: async_nats::Subject,
    /// What the local store keeps: the message itself, or (when its headers
    /// or payload are too large for a local record) only its sequence.
    local: Message,
    /// Its producer's `Nats-Msg-Id`, if it had one.
    msg_id: Option<Box<str>>,
    /// The timer it replaces, for a rescheduled timer's copy: that timer
    /// holds the same `Nats-Msg-Id` without making the copy a duplicate.
    replaces: Option<u64>,
    /// See [`PendingTimer::origin`].
    origin: Option<u64>,
    presence: Presence,
}

/// A timer read from the stream that will not be indexed.
struct Reject {
    sequence: u64,
    /// The dead letter's reason label: `malformed` or `refused` (its target).
    kind: &'static str,
    error: TierError,
}

impl Part {
    /// Reads the partition, and puts each timer as a timer into the local
    /// store: from the previous owner's checkpoint and the stream after it
    /// if there is a sound one, else from its first pending timer on.
    pub(super) async fn ingest(self) {
        let mut resume = true;
        loop {
            match self.ingest_once(resume).await {
                Ok(()) => tracing::warn!("the stream's consumer ended; reading again"),
                Err(err) => tracing::warn!(%err, "reading the partition failed; reading again"),
            }
            resume = false;
            tokio::time::sleep(Duration::from_millis(200)).await;
            // A new read starts from the beginning, with the consumer made
            // anew: drop what was indexed (timers indexed twice would fire
            // twice).
            self.forget_all().await;
        }
    }

    async fn ingest_once(&self, resume: bool) -> Result<()> {
        let resumed = match resume {
            true => self.resume().await,
            false => None,
        };
        let (consumer, mut seen) = match resumed {
            Some(resumed) => resumed,
            None => (self.fresh_consumer().await?, Seen::default()),
        };
        // The server's limits on one pull request (0 or -1: none) are the
        // consumer's: a request over them is refused, every time.
        let limits = &consumer.cached_info().config;
        let below = |ours: usize, limit: i64| {
            usize::try_from(limit).ok().filter(|&l| l > 0).map_or(ours, |l| ours.min(l))
        };
        let messages = consumer
            .stream()
            .max_messages_per_batch(below(INGEST_PULL, limits.max_batch))
            .max_bytes_per_batch(below(INGEST_PULL_BYTES, limits.max_bytes))
            // async-nats's default for `messages()`: a shorter one would turn a
            // busy moment into a missed heartbeat, an error, and a re-read.
            .heartbeat(Duration::from_secs(15))
            .messages()
            .await
            .map_err(|e| TierError::nats("read the partition", e))?;
        let mut chunks = messages.ready_chunks(INGEST_BATCH);
        let first_check = tokio::time::Instant::now() + ELSEWHERE_CHECK;
        let mut check = tokio::time::interval_at(first_check, ELSEWHERE_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen_at_check = seen;
        loop {
            tokio::select! {
                // Deliveries first: a check is made only with none waiting.
                biased;
                chunk = chunks.next() => {
                    let Some(chunk) = chunk else { return Ok(()) };
                    let chunk: Vec<JsMessage> = chunk
                        .into_iter()
                        .collect::<std::result::Result<_, _>>()
                        .map_err(|e| TierError::nats("read the partition", e))?;
                    let mut elsewhere = Vec::new();
                    let mut reads = Vec::with_capacity(chunk.len());
                    for message in &chunk {
                        let (read, consumer_sequence) = Read::handed_out(message)?;
                        elsewhere.extend(seen.handed(consumer_sequence, read.sequence));
                        reads.push(read);
                    }
                    for (after, up_to) in elsewhere {
                        self.read_handed_elsewhere(after, up_to).await?;
                    }
                    self.take_in(reads, Presence::Held).await?;
                }
                _ = check.tick() => {
                    // Only when nothing came since the last check: else the
                    // consumer's count may be of deliveries on their way here.
                    if seen == seen_at_check {
                        let info = consumer
                            .get_info()
                            .await
                            .map_err(|e| TierError::nats("read the partition's consumer", e))?;
                        let last = info.delivered;
                        let elsewhere = seen.delivered(last.consumer_sequence, last.stream_sequence);
                        if let Some((after, up_to)) = elsewhere {
                            self.read_handed_elsewhere(after, up_to).await?;
                        }
                    }
                    seen_at_check = seen;
                }
            }
        }
    }

    /// Reads the timers after `after` up to `up_to` that the partition's
    /// consumer handed to another's pull request (see [`Seen`]).
    async fn read_handed_elsewhere(&self, after: u64, up_to: u64) -> Result<()> {
        tracing::warn!(
            after,
            up_to,
            "the partition's consumer handed timers to another's pull request: reading them from the stream"
        );
        metrics::counter!("delaytier_handed_elsewhere_total").increment(1);
        self.read_tail(after, up_to, &consumer_name(self.partition)).await
    }

    /// The partition's consumer, made afresh: it hands out every timer not
    /// yet acknowledged, including those an earlier owner held.
    async fn fresh_consumer(&self) -> Result<PullConsumer> {
        let config = &self.shared.config;
        let name = consumer_name(self.partition);
        let stream = &self.delay_stream().stream;
        let _ = stream.delete_consumer(&name).await;
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(name),
                filter_subject: wire::partition_filter(&config.prefix, self.partition),
                ack_policy: AckPolicy::Explicit,
                ack_wait: HOLD_UNTIL_FIRED,
                max_ack_pending: -1,
                ..Default::default()
            })
            .await
            .map_err(|e| TierError::nats("create the partition's consumer", e))?;
        // Nothing is indexed yet, so a checkpoint from here on is sound.
        let created = consumer.cached_info().created.unix_timestamp_nanos();
        self.pending.lock().expect("index lock").consumer_created_ns = Some(created);
        Ok(consumer)
    }

    /// Checks timers read from the stream, puts those to index into the
    /// local store (by reference, from a checkpoint), moves the others to
    /// the dead letter, and then counts them all read.
    pub(super) async fn take_in(&self, reads: Vec<Read<'_>>, presence: Presence) -> Result<()> {
        let max_body = self.store.max_body_bytes();
        let mut timers = Vec::with_capacity(reads.len());
        let mut rejected = Vec::new();
        let mut read_up_to = 0;
        for read in reads {
            match index(&read, self.partition, max_body, &self.shared.policy, presence) {
                Ok(timer) => {
                    read_up_to = read_up_to.max(timer.sequence);
                    timers.push(timer);
                }
                Err(reject) => {
                    read_up_to = read_up_to.max(reject.sequence);
                    rejected.push((read, reject));
                }
            }
        }
        self.put(timers).await?;
        for (read, reject) in rejected {
            self.reject(&read, reject).await;
        }
        // Only now: a checkpoint counts every timer up to here indexed, left
        // or gone.
        let mut index = self.pending.lock().expect("index lock");
        index.read_up_to = index.read_up_to.max(read_up_to);
        index.changes += 1;
        Ok(())
    }

    /// A timer that will never be indexed: moves it to the dead letter and
    /// removes it from the stream; if that fails now, it stays in the stream
    /// (counted, as the sweep expects) until the partition is read again.
    async fn reject(&self, read: &Read<'_>, reject: Reject) {
        let Reject { sequence, kind, error } = reject;
        if kind == "malformed" {
            metrics::counter!("delaytier_malformed_total").increment(1);
        }
        tracing::warn!(sequence, %error, "timer not indexed: moving it to the dead letter");
        let buried = match &read.ack {
            Some(ack) => {
                let source = read.headers.map(owned_pairs).unwrap_or_default();
                let payload = read.payload.clone();
                let settled = Settled { sequence, msg_id: None };
                self.bury(settled, &source, payload, ack.clone(), kind, &error.to_string()).await
            }
            None => Err(error),
        };
        if let Err(err) = buried {
            self.pending.lock().expect("index lock").left.insert(sequence);
            tracing::warn!(sequence, %err, "timer left in the stream, not indexed");
        }
    }

    /// Puts timers into the local store, holding the index so a timer that
    /// fires at once is known before it is looked up; drops the duplicates.
    async fn put(&self, timers: Vec<Indexed>) -> Result<()> {
        let settled = self.settled_ids_of(&timers).await;
        let (store, pending) = (self.store.clone(), self.pending.clone());
        let count = timers.len() as u64;
        let duplicates = tokio::task::spawn_blocking(move || {
            let mut index = pending.lock().expect("index lock");
            // A timer with the Nats-Msg-Id of a pending one (an earlier
            // sequence, or an earlier timer of this batch), or of one that
            // settled within the window (itself too: it was fired, and its
            // acknowledgement lost), never fires. A rescheduled timer's copy
            // is not a duplicate of the timer it replaces.
            let mut duplicates = Vec::new();
            let mut claimed: HashMap<Box<str>, u64> = HashMap::new();
            let mut kept = Vec::with_capacity(timers.len());
            for timer in timers {
                // Indexed already (from a checkpoint, or handed out again
                // after the consumer's leader changed): one local timer each.
                if index.timers.contains_key(&timer.sequence) {
                    continue;
                }
                if let Some(id) = timer.msg_id.as_deref() {
                    let held = index
                        .holder_of(id, timer.sequence)
                        .or_else(|| claimed.get(id).copied())
                        .or_else(|| index.recently_settled.get(id))
                        .or_else(|| settled.get(id).copied());
                    if is_duplicate(held, &timer) {
                        duplicates.push((timer.sequence, timer.ack));
                        continue;
                    }
                    claimed.insert(id.into(), timer.sequence);
                }
                kept.push(timer);
            }
            let (messages, timers): (Vec<Message>, Vec<_>) = kept
                .into_iter()
                .map(|t| (t.local, (t.sequence, t.deliver_at_ms, t.ack, t.msg_id, t.origin, t.presence)))
                .unzip();
            let receipts = put_in_batches(&store, messages)?;
            for ((sequence, deliver_at_ms, ack, msg_id, origin, presence), receipt) in
                timers.into_iter().zip(receipts)
            {
                let handle = receipt.handle().ok_or_else(|| TierError::BadTimer {
                    sequence,
                    problem: "the local store took it as an untimed message".into(),
                })?;
                debug_assert_eq!(handle.deliver_at_ms, deliver_at_ms.max(1), "0 is kept as 1");
                if let Some(id) = &msg_id {
                    index.by_msg_id.insert(id.clone(), sequence);
                }
                if let Some(origin) = origin {
                    index.by_origin.insert(origin, sequence);
                }
                index.insert(sequence, PendingTimer { handle, ack, msg_id, origin, presence });
            }
            index.changes += 1;
            Ok::<_, TierError>(duplicates)
        })
        .await
        .expect("a local put does not panic")?;
        metrics::counter!("delaytier_indexed_total").increment(count - duplicates.len() as u64);
        self.drop_duplicates(duplicates).await;
        Ok(())
    }

    /// The ids of `timers` that the settled-ids bucket holds, with the
    /// sequence of the timer that settled; asked only for the ids no pending
    /// timer holds and this partition did not settle lately (most asked are
    /// not there: a new timer).
    async fn settled_ids_of(&self, timers: &[Indexed]) -> HashMap<Box<str>, u64> {
        let to_ask: Vec<Box<str>> = {
            let index = self.pending.lock().expect("index lock");
            let mut ids: Vec<Box<str>> = timers
                .iter()
                .filter_map(|t| Some((t.msg_id.as_ref()?, t.sequence)))
                .filter(|(id, sequence)| {
                    index.holder_of(id, *sequence).is_none() && index.recently_settled.get(id).is_none()
                })
                .map(|(id, _)| id.clone())
                .collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let lookups = to_ask.into_iter().map(|id| async move {
            let sequence = self.settled_id(&id).await;
            sequence.map(|s| (id, s))
        });
        let found: Vec<Option<(Box<str>, u64)>> =
            futures::stream::iter(lookups).buffer_unordered(SETTLED_LOOKUPS).collect().await;
        found.into_iter().flatten().collect()
    }

    /// The settled timer of `msg_id`, asked until the bucket answers: a
    /// failed lookup holds up this read of the partition, not the timers
    /// already indexed, which go on firing.
    async fn settled_id(&self, msg_id: &str) -> Option<u64> {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.shared.settled_ids.settled(self.partition, msg_id).await {
                Ok(sequence) => return sequence,
                Err(err) => {
                    metrics::counter!("delaytier_settled_id_errors_total").increment(1);
                    tracing::warn!(%err, "cannot look up a Nats-Msg-Id; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Removes from the stream timers whose Nats-Msg-Id a pending timer of
    /// the partition holds: they never fire. One that cannot be removed now
    /// stays in the stream and is found a duplicate again when the partition
    /// is read again (in sequence order, so the first one is kept).
    async fn drop_duplicates(&self, duplicates: Vec<(u64, async_nats::Subject)>) {
        for (sequence, ack) in duplicates {
            metrics::counter!("delaytier_duplicates_total").increment(1);
            tracing::debug!(sequence, "a timer with the Nats-Msg-Id of an earlier one: dropped");
            if let Err(err) = acknowledge(&self.shared.client, sequence, ack).await {
                self.pending.lock().expect("index lock").left.insert(sequence);
                tracing::warn!(sequence, %err, "a duplicate timer stays in the stream for now");
            }
        }
    }

    pub(super) async fn forget_all(&self) {
        let (store, pending) = (self.store.clone(), self.pending.clone());
        let _ = tokio::task::spawn_blocking(move || {
            let mut index = pending.lock().expect("index lock");
            index.read_up_to = 0;
            index.left.clear();
            index.consumer_created_ns = None;
            index.by_msg_id.clear();
            index.by_origin.clear();
            index.unconfirmed = 0;
            let handles: Vec<Handle> = index.timers.drain().map(|(_, t)| t.handle).collect();
            store.cancel_batch(&handles)
        })
        .await;
    }
}

/// Whether a timer whose `Nats-Msg-Id` the timer `held` holds (a pending
/// one, one of the same batch, or one settled within the window) is a
/// duplicate. A rescheduled timer's copy is no duplicate of the timer it
/// replaces. A recurring schedule's next timer is no duplicate of an
/// earlier timer of its schedule either, which may settle after it (its
/// firing was retried), but is one of a later timer (a second copy,
/// published again by an owner that died) or of itself (fired, its
/// acknowledgement lost).
fn is_duplicate(held: Option<u64>, timer: &Indexed) -> bool {
    let Some(held) = held else { return false };
    let next_of_schedule = timer.origin.is_some_and(|origin| origin != timer.sequence);
    match timer.replaces {
        Some(replaces) if next_of_schedule => held > replaces,
        replaces => Some(held) != replaces,
    }
}

/// Puts `messages` in the local store, in batches of about
/// [`PUT_BATCH_BYTES`] at most (one message more, if alone); their receipts,
/// in order.
pub(super) fn put_in_batches(
    store: &Store,
    messages: Vec<Message>,
) -> delaywheel::Result<Vec<delaywheel::Receipt>> {
    // A record's fixed part and its key are well under a kilobyte.
    let size = |m: &Message| m.body().len() + m.properties_len() + 1024;
    let mut receipts = Vec::with_capacity(messages.len());
    let (mut batch, mut bytes) = (Vec::new(), 0);
    for message in messages {
        if !batch.is_empty() && bytes + size(&message) > PUT_BATCH_BYTES {
            receipts.extend(store.put_batch(std::mem::take(&mut batch))?);
            bytes = 0;
        }
        bytes += size(&message);
        batch.push(message);
    }
    if !batch.is_empty() {
        receipts.extend(store.put_batch(batch)?);
    }
    Ok(receipts)
}

/// Checks a timer read from the stream and makes its local record.
fn index(
    read: &Read<'_>,
    partition: u32,
    max_body: usize,
    policy: &TargetPolicy,
    presence: Presence,
) -> std::result::Result<Indexed, Reject> {
    let (sequence, stored) = (read.sequence, read.published);
    let bad = |problem: &str| Reject {
        sequence,
        kind: "malformed",
        error: TierError::BadTimer { sequence, problem: problem.to_string() },
    };
    let headers = read.headers.ok_or_else(|| bad("no headers"))?;
    let pairs: Vec<(&str, &str)> = header_pairs(headers).collect();
    let target =
        target_of(sequence, &pairs).map_err(|error| Reject { sequence, kind: "malformed", error })?;
    let schedule = NatsSchedule::read(&pairs).map_err(|problem| bad(&problem))?;
    let deliver_at_ms = match (deliver_at(headers), &schedule) {
        // A schedule's next timers, and a rescheduled one, say when.
        (Some(deliver_at_ms), _) => deliver_at_ms,
        (None, Some(schedule)) => {
            let stored_ms = u64::try_from(stored.unix_timestamp_nanos() / 1_000_000).unwrap_or_default();
            schedule.first(stored_ms).map_err(|problem| bad(&problem))?
        }
        (None, None) => {
            let problem =
                format!("no {} header in ms since the epoch, nor a {}", wire::DELIVER_AT, wire::SCHEDULE);
            return Err(bad(&problem));
        }
    };
    if deliver_at_ms > MAX_DELIVER_AT_MS {
        return Err(bad(&format!("{} {deliver_at_ms} is past the end of year 9999", wire::DELIVER_AT)));
    }
    policy.check(target).map_err(|reason| Reject {
        sequence,
        kind: "refused",
        error: TierError::BadTarget { header: wire::TARGET, reason },
    })?;
    let origin = match schedule.as_ref().filter(|s| s.repeats()) {
        None => None,
        Some(_) => match value_of(&pairs, wire::SCHEDULE_HANDLE).map_err(|problem| bad(&problem))? {
            None => Some(sequence),
            // A schedule's first timer is earlier in the same partition: a
            // handle naming another would let cancels of it reach this one.
            Some(first) => match first.parse::<TimerHandle>() {
                Ok(handle) if handle.partition == partition && handle.sequence < sequence => {
                    Some(handle.sequence)
                }
                _ => {
                    let why = "is not the handle of an earlier timer of this partition";
                    return Err(bad(&format!("{} {first:?} {why}", wire::SCHEDULE_HANDLE)));
                }
            },
        },
    };
    let ack = read.ack.clone().ok_or_else(|| bad("delivered without an acknowledgement subject"))?;
    let subject = schedule.is_some().then_some((SUBJECT_PROPERTY, read.subject));
    let header_bytes: usize = pairs.iter().chain(&subject).map(|(n, v)| n.len() + v.len() + 8).sum();
    // What a checkpoint's owner got may leave the stream before it fires:
    // it is read again then (see `Source`).
    let copied =
        presence == Presence::Held && header_bytes <= MAX_PROPERTIES_LEN && read.payload.len() <= max_body;
    let local = if copied {
        let copy = Message::new(FIRE_TOPIC, read.payload.clone());
        pairs.iter().chain(&subject).fold(copy, |m, (n, v)| m.property(*n, *v))
    } else {
        Message::new(FIRE_TOPIC, Bytes::new()).tags(BY_REFERENCE)
    };
    let local = local.deliver_at_ms(deliver_at_ms).key(sequence.to_string());
    // The producer's id holds beyond JetStream's own duplicate window while
    // the timer is pending (see `Part::put`).
    let msg_id: Option<Box<str>> = producer_msg_id(headers).map(Box::from);
    let replaces = headers.get(wire::REPLACES).and_then(|r| r.as_str().parse().ok());
    if msg_id.as_ref().is_some_and(|id| id.len() > MAX_MSG_ID_LEN) {
        return Err(bad(&format!("{} longer than {MAX_MSG_ID_LEN} bytes", wire::MSG_ID)));
    }
    Ok(Indexed { sequence, deliver_at_ms, ack, local, msg_id, replaces, origin, presence })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{now_ms, partition_store_config};

    /// A skip in the consumer's deliveries names the stream sequences
    /// between this owner's last and the next (others' partitions' timers
    /// lie between a partition's own: a stream sequence skip alone is none);
    /// a redelivery of an older timer moves neither back; the consumer's
    /// info names everything handed out after this owner's last.
    #[test]
    fn deliveries_to_another_pull_request_are_seen_by_the_skip_in_their_count() {
        let mut seen = Seen::default();
        assert_eq!(seen.handed(1, 3), None);
        assert_eq!(seen.handed(2, 9), None, "other partitions' timers lie between");
        assert_eq!(seen.handed(5, 20), Some((9, 19)), "deliveries 3 and 4 went elsewhere");
        assert_eq!(seen, Seen { consumer: 5, stream: 20 });
        assert_eq!(seen.handed(6, 4), None, "a redelivery");
        assert_eq!(seen, Seen { consumer: 6, stream: 20 });
        assert_eq!(seen.handed(8, 21), None, "a skip with nothing between: redeliveries");
        assert_eq!(seen.delivered(8, 21), None, "nothing since");
        assert_eq!(seen.delivered(11, 40), Some((21, 40)));
        assert_eq!(seen.handed(12, 41), None);
    }

    fn read(sequence: u64, replaces: Option<u64>, origin: Option<u64>) -> Indexed {
        let local = Message::new(FIRE_TOPIC, Bytes::new());
        let ack = async_nats::Subject::from("ack");
        let msg_id = Some("id".into());
        Indexed { sequence, deliver_at_ms: 1, ack, local, msg_id, replaces, origin, presence: Presence::Held }
    }

    /// A timer holding an id drops a later one with it, but not its own
    /// rescheduled copy; a schedule's next timer (20, replacing 10) is kept
    /// whatever earlier timer of its schedule holds the id (one whose firing
    /// was retried settles after its next: 5), and dropped when a later one
    /// does (its second copy, or itself fired).
    #[test]
    fn which_timers_with_a_held_id_are_duplicates() {
        assert!(!is_duplicate(None, &read(20, None, None)));
        assert!(is_duplicate(Some(10), &read(20, None, None)), "a retried put");
        assert!(!is_duplicate(Some(10), &read(20, Some(10), None)), "a rescheduled copy");
        assert!(is_duplicate(Some(12), &read(20, Some(10), None)), "a copy of a timer that moved on");
        let next = |held| is_duplicate(Some(held), &read(20, Some(10), Some(1)));
        assert!(!next(10) && !next(5) && !next(1), "its schedule's earlier timers");
        assert!(next(21) && next(20), "a later timer of its schedule, or itself");
        assert!(is_duplicate(Some(10), &read(20, None, Some(20))), "a schedule made again by a replica");
    }

    /// Timers read together whose copies would not fit in one segment (32
    /// of 900 KB against 16 MiB) go into the local store in several batches:
    /// one batch was refused, and the partition read the same timers again
    /// and again, firing none.
    #[test]
    fn timers_too_big_for_one_batch_are_put_in_several() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(partition_store_config(dir.path())).unwrap();
        let due = now_ms() + 3_600_000;
        let messages: Vec<Message> = (0..32u64)
            .map(|i| Message::new(FIRE_TOPIC, vec![b'b'; 900_000]).deliver_at_ms(due).key(i.to_string()))
            .collect();
        let receipts = put_in_batches(&store, messages).unwrap();
        assert_eq!(receipts.len(), 32);
        assert!(receipts.windows(2).all(|w| w[0].offset() < w[1].offset()), "in the order read");
        store.close().unwrap();
    }
}
