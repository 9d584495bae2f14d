//! One partition while this node holds its lease: a local store rebuilt from
//! the stream, and four tasks (ingest, fire, sweep, answer cancels) that stop with
//! the lease.
//!
//! The stream holds exactly the pending timers, so the local store is an
//! index made fresh on every acquisition: a node never trusts timers it
//! indexed under an earlier lease, since another node may have fired them
//! meanwhile.
//!
//! The delay stream is a work queue: each partition has one durable consumer,
//! which its owner deletes and makes again on taking the partition, so every
//! timer not yet acknowledged is delivered to the new owner. Its
//! acknowledgement wait is a century: a timer is held unacknowledged until it
//! fires, however far ahead it is.
//!
//! Firing a timer: publish the copy the local store kept (headers and
//! payload; a timer whose headers are too large is kept by reference and
//! read from the stream) to its target with the deduplication id
//! `<stream>-<sequence>`, wait for the publish acknowledgement, then
//! acknowledge the source, which removes it from the stream. A node dying
//! between the publish and that acknowledgement leaves the source, so the
//! next owner publishes it again under the same id, and the target stream
//! drops it if that is inside its duplicate window. (Acknowledging is what
//! makes this fast: deleting each fired message by sequence through the
//! JetStream API ran at about 200 a second here, see the README.)

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::stream::{DirectGetErrorKind, Stream};
use async_nats::jetstream::{self, Message as JsMessage};
use bytes::Bytes;
use delaywheel::{
    CancelOutcome, ConsumedMessage, Handle, MAX_DELIVER_AT_MS, MAX_PROPERTIES_LEN, Message, Store,
};
use futures::StreamExt;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::wire::{self, CancelAnswer};
use crate::{Result, TierConfig, TierError};

/// The local store's one topic.
const FIRE_TOPIC: &str = "fire";
/// Timers read from the stream per local batch put.
const INGEST_BATCH: usize = 1024;
/// Fired timers published at once.
const FIRE_CONCURRENCY: usize = 128;
/// How often the sweep looks for fired timers still in the stream.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// A fired timer's acknowledgement has surely been applied after this.
const ACK_SETTLES: Duration = Duration::from_secs(5);
/// Fired timers remembered for the sweep, at most.
const MAX_REMEMBERED: usize = 1 << 20;
/// How long a cancel of a timer not read yet waits for this node to read it.
const CANCEL_WAITS_FOR_INGEST: Duration = Duration::from_secs(2);
/// How long the stream waits for a timer's acknowledgement before handing it
/// out again: longer than any timer waits, so never.
const HOLD_UNTIL_FIRED: Duration = Duration::from_secs(100 * 365 * 86_400);

/// What the partitions of one node share.
pub(crate) struct Shared {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub stream: Stream,
    pub config: TierConfig,
}

/// A timer indexed and not yet removed from the stream.
#[derive(Clone)]
struct PendingTimer {
    /// Its timer in the local store, for cancels.
    handle: Handle,
    /// The subject that acknowledges its delivery, removing it from the stream.
    ack: async_nats::Subject,
}

/// What the partition's tasks share about the timers read so far.
#[derive(Default)]
struct Index {
    /// The timers indexed and not yet removed from the stream, by sequence.
    timers: HashMap<u64, PendingTimer>,
    /// The highest sequence the partition's consumer has handed out (the
    /// stream hands a partition's timers out in sequence order).
    read_up_to: u64,
    /// Timers read and left unacknowledged in the stream (malformed).
    malformed: usize,
    /// Timers fired lately, with when: the sweep checks they left the stream.
    fired: VecDeque<(Instant, u64)>,
}

type Pending = Arc<Mutex<Index>>;

/// A partition this node owns.
pub(crate) struct OwnedPartition {
    partition: u32,
    store: Arc<Store>,
    dir: PathBuf,
    tasks: Vec<JoinHandle<()>>,
}

impl OwnedPartition {
    /// Opens a fresh local store and starts indexing and firing the
    /// partition's timers.
    pub(crate) async fn start(shared: Arc<Shared>, partition: u32) -> Result<Self> {
        let dir = shared.config.dir.join(format!("p{partition}"));
        let store = Arc::new(open_fresh(dir.clone()).await?);
        let pending: Pending = Arc::default();
        let span = tracing::info_span!("partition", p = partition);
        // Answer cancels before indexing, so while this node holds the lease
        // no cancel goes around it (see `client::cancel`).
        let cancels = shared
            .client
            .subscribe(wire::cancel_subject(&shared.config.stream, partition))
            .await
            .map_err(|e| TierError::nats("subscribe to cancels", e))?;
        let part = Part { shared, partition, store: store.clone(), pending };
        let tasks = vec![
            tokio::spawn(part.clone().answer_cancels(cancels).instrument(span.clone())),
            tokio::spawn(part.clone().fire().instrument(span.clone())),
            tokio::spawn(part.clone().sweep().instrument(span.clone())),
            tokio::spawn(part.ingest().instrument(span)),
        ];
        tracing::info!(partition, "partition taken");
        Ok(OwnedPartition { partition, store, dir, tasks })
    }

    /// Stops the tasks and removes the local store: the stream keeps the truth.
    pub(crate) async fn stop(self) {
        for task in &self.tasks {
            task.abort();
        }
        for task in self.tasks {
            let _ = task.await;
        }
        let (store, dir, partition) = (self.store, self.dir, self.partition);
        let closed = tokio::task::spawn_blocking(move || {
            if let Ok(store) = Arc::try_unwrap(store) {
                store.close()?;
            }
            std::fs::remove_dir_all(&dir).map_err(|source| TierError::Io { path: dir, source })
        })
        .await;
        match closed {
            Ok(Ok(())) => tracing::info!(partition, "partition given up"),
            Ok(Err(err)) => {
                tracing::warn!(partition, %err, "partition given up; its local store was not removed")
            }
            Err(err) => tracing::warn!(partition, %err, "partition given up; closing its store panicked"),
        }
    }
}

async fn open_fresh(dir: PathBuf) -> Result<Store> {
    tokio::task::spawn_blocking(move || {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|source| TierError::Io { path: dir.clone(), source })?;
        }
        let config = delaywheel::Config::new(&dir)
            .with_queues_per_topic(1)
            .with_segment_size(64 << 20)
            .with_queue_file_entries(1 << 20);
        Ok(Store::open(config)?)
    })
    .await
    .expect("opening a local store does not panic")
}

/// What each task of one owned partition holds.
#[derive(Clone)]
struct Part {
    shared: Arc<Shared>,
    partition: u32,
    store: Arc<Store>,
    pending: Pending,
}

/// A timer read from the stream, checked.
struct Indexed {
    sequence: u64,
    deliver_at_ms: u64,
    ack: async_nats::Subject,
    /// What the local store keeps: the message itself, or (when its headers
    /// or payload are too large for a local record) only its sequence.
    local: Message,
}

/// Tags of a local timer that holds only the sequence: firing it reads the
/// message from the stream.
const BY_REFERENCE: &str = "ref";

impl Part {
    /// Reads the partition from its first pending timer on, and puts each as
    /// a timer into the local store.
    async fn ingest(self) {
        loop {
            match self.ingest_once().await {
                Ok(()) => tracing::warn!("the stream's consumer ended; reading again"),
                Err(err) => tracing::warn!(%err, "reading the partition failed; reading again"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            // A new read starts from the beginning: drop what was indexed.
            // (Only reached on errors; the ordered consumer recovers from gaps
            // itself.) Timers indexed twice would fire twice, so start over.
            self.forget_all().await;
        }
    }

    async fn ingest_once(&self) -> Result<()> {
        let config = &self.shared.config;
        let name = format!("delaytier-p{}", self.partition);
        // A fresh consumer hands out every timer not yet acknowledged,
        // including those an earlier owner held.
        let _ = self.shared.stream.delete_consumer(&name).await;
        let consumer = self
            .shared
            .stream
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
        let messages = consumer.messages().await.map_err(|e| TierError::nats("read the partition", e))?;
        let mut chunks = messages.ready_chunks(INGEST_BATCH);
        let max_body = self.store.max_body_bytes();
        while let Some(chunk) = chunks.next().await {
            let mut timers = Vec::with_capacity(chunk.len());
            let mut read_up_to = 0;
            for message in chunk {
                let message = message.map_err(|e| TierError::nats("read the partition", e))?;
                match index(message, max_body) {
                    Ok(timer) => {
                        read_up_to = timer.sequence;
                        timers.push(timer);
                    }
                    Err((sequence, err)) => {
                        read_up_to = read_up_to.max(sequence);
                        self.pending.lock().expect("index lock").malformed += 1;
                        metrics::counter!("delaytier_malformed_total").increment(1);
                        tracing::warn!(%err, "timer left in the stream, not indexed");
                    }
                }
            }
            self.put(timers, read_up_to).await?;
        }
        Ok(())
    }

    /// Puts timers into the local store, holding the index so a timer that
    /// fires at once is known before it is looked up.
    async fn put(&self, timers: Vec<Indexed>, read_up_to: u64) -> Result<()> {
        let (store, pending) = (self.store.clone(), self.pending.clone());
        let count = timers.len() as u64;
        tokio::task::spawn_blocking(move || {
            let mut index = pending.lock().expect("index lock");
            let (messages, timers): (Vec<Message>, Vec<_>) =
                timers.into_iter().map(|t| (t.local, (t.sequence, t.deliver_at_ms, t.ack))).unzip();
            let receipts = store.put_batch(messages)?;
            for ((sequence, deliver_at_ms, ack), receipt) in timers.into_iter().zip(receipts) {
                let handle = receipt.handle().ok_or_else(|| TierError::BadTimer {
                    sequence,
                    problem: "the local store took it as an untimed message".into(),
                })?;
                debug_assert_eq!(handle.deliver_at_ms, deliver_at_ms.max(1), "0 is kept as 1");
                index.timers.insert(sequence, PendingTimer { handle, ack });
            }
            index.read_up_to = index.read_up_to.max(read_up_to);
            Ok::<_, TierError>(())
        })
        .await
        .expect("a local put does not panic")?;
        metrics::counter!("delaytier_indexed_total").increment(count);
        Ok(())
    }

    async fn forget_all(&self) {
        let (store, pending) = (self.store.clone(), self.pending.clone());
        let _ = tokio::task::spawn_blocking(move || {
            let mut index = pending.lock().expect("index lock");
            index.read_up_to = 0;
            index.malformed = 0;
            let handles: Vec<Handle> = index.timers.drain().map(|(_, t)| t.handle).collect();
            store.cancel_batch(&handles)
        })
        .await;
    }

    /// Takes the local store's deliveries and fires each.
    async fn fire(self) {
        let mut consumer = match self.store.consumer(FIRE_TOPIC, 0) {
            Ok(consumer) => consumer,
            Err(err) => return tracing::error!(%err, "cannot consume the local store"),
        };
        loop {
            let polled = tokio::task::spawn_blocking(move || {
                let batch = consumer.poll(1024, Duration::from_millis(200));
                (consumer, batch)
            })
            .await
            .expect("a local poll does not panic");
            consumer = polled.0;
            let batch = match polled.1 {
                Ok(batch) => batch,
                Err(err) => {
                    tracing::error!(%err, "the local store failed; this partition stops firing");
                    return;
                }
            };
            futures::stream::iter(&batch)
                .for_each_concurrent(FIRE_CONCURRENCY, |m| self.fire_until_done(m))
                .await;
            consumer.commit();
        }
    }

    /// Fires one timer, retrying while the partition is ours.
    async fn fire_until_done(&self, timer: &ConsumedMessage) {
        let Some(sequence) = timer.key().and_then(|k| k.parse::<u64>().ok()) else {
            return tracing::error!(key = ?timer.key(), "a local timer without its sequence");
        };
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.fire_one(sequence, timer).await {
                Ok(()) => return,
                Err(err) => {
                    metrics::counter!("delaytier_fire_errors_total").increment(1);
                    tracing::warn!(sequence, %err, "firing failed; retrying");
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    async fn fire_one(&self, sequence: u64, timer: &ConsumedMessage) -> Result<()> {
        let shared = &self.shared;
        let pending = self.pending.lock().expect("index lock").timers.get(&sequence).map(|t| t.ack.clone());
        let Some(source_ack) = pending else {
            return Ok(()); // cancelled while it fired
        };
        let stream = &shared.config.stream;
        let (target, headers, payload) = if timer.tags() == Some(BY_REFERENCE) {
            let source = match shared.stream.direct_get(sequence).await {
                Ok(source) => source,
                Err(err) if err.kind() == DirectGetErrorKind::NotFound => {
                    self.pending.lock().expect("index lock").timers.remove(&sequence);
                    metrics::counter!("delaytier_skipped_total").increment(1);
                    return Ok(()); // deleted from the stream by hand
                }
                Err(err) => return Err(TierError::nats(format!("read timer {sequence}"), err)),
            };
            let (target, headers) =
                fired_headers(stream, self.partition, sequence, header_pairs(&source.headers))?;
            (target, headers, source.payload)
        } else {
            let pairs = timer.properties().iter().map(|(n, v)| (n.as_str(), v.as_str()));
            let (target, headers) = fired_headers(stream, self.partition, sequence, pairs)?;
            (target, headers, timer.body().clone())
        };
        let published = publish_acked(&shared.js, target, headers, payload).await?;
        if published.duplicate {
            metrics::counter!("delaytier_duplicates_dropped_total").increment(1);
        }
        acknowledge(&shared.client, sequence, source_ack).await?;
        let mut index = self.pending.lock().expect("index lock");
        index.timers.remove(&sequence);
        if index.fired.len() == MAX_REMEMBERED {
            index.fired.pop_front();
        }
        index.fired.push_back((Instant::now(), sequence));
        drop(index);
        metrics::counter!("delaytier_fired_total").increment(1);
        if let Some(at) = timer.deliver_at_ms() {
            let late_ms = now_ms().saturating_sub(at);
            metrics::histogram!("delaytier_lateness_seconds").record(late_ms as f64 / 1e3);
        }
        Ok(())
    }

    /// Deletes fired timers whose acknowledgement was lost.
    ///
    /// The server confirms an acknowledgement before its consumer's replicas
    /// have it: when the consumer's leader dies then, the new leader still
    /// counts the timer as handed out and unacknowledged, so the stream keeps
    /// it, and the partition's next owner would fire it again (outside the
    /// duplicate window, if that is later than two minutes). Seen here with
    /// `kill -9` of a NATS server: 97 of 4,000 fired timers left behind.
    /// Every few seconds the sweep compares the consumer's unacknowledged
    /// count with what this node holds; if the consumer has more, it looks up
    /// the timers fired lately and deletes those still in the stream.
    async fn sweep(self) {
        let name = format!("delaytier-p{}", self.partition);
        loop {
            tokio::time::sleep(SWEEP_EVERY).await;
            let settled: Vec<u64> = {
                let mut index = self.pending.lock().expect("index lock");
                let cut = index.fired.partition_point(|(at, _)| at.elapsed() >= ACK_SETTLES);
                index.fired.drain(..cut).map(|(_, s)| s).collect()
            };
            if settled.is_empty() {
                continue;
            }
            let held = {
                let index = self.pending.lock().expect("index lock");
                index.timers.len() + index.malformed
            };
            match self.shared.stream.consumer_info(&name).await {
                Ok(info) if info.num_ack_pending <= held => continue,
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(%err, "sweep: cannot read the consumer; checking the fired timers");
                }
            }
            let stream = &self.shared.stream;
            // Some(sequence): it could not be checked now; look again next round.
            let checks: Vec<(usize, Option<u64>)> = futures::stream::iter(settled)
                .map(|sequence| async move {
                    match stream.direct_get(sequence).await {
                        Ok(_) => match remove_source(stream, sequence).await {
                            Ok(deleted) => (deleted as usize, None),
                            Err(_) => (0, Some(sequence)),
                        },
                        Err(err) if err.kind() == DirectGetErrorKind::NotFound => (0, None),
                        Err(_) => (0, Some(sequence)),
                    }
                })
                .buffer_unordered(64)
                .collect()
                .await;
            let left: usize = checks.iter().map(|(n, _)| n).sum();
            let again = checks.iter().filter_map(|(_, s)| *s);
            let mut index = self.pending.lock().expect("index lock");
            for sequence in again {
                index.fired.push_front((Instant::now() - ACK_SETTLES, sequence));
            }
            drop(index);
            if left > 0 {
                metrics::counter!("delaytier_lost_acks_total").increment(left as u64);
                tracing::warn!(left, "sweep: deleted fired timers whose acknowledgement was lost");
            }
        }
    }

    /// Answers cancels of this partition's timers while it is ours.
    async fn answer_cancels(self, mut requests: async_nats::Subscriber) {
        while let Some(request) = requests.next().await {
            let Some(reply) = request.reply else { continue };
            let answer = match std::str::from_utf8(&request.payload).ok().and_then(|s| s.parse().ok()) {
                Some(sequence) => match self.cancel(sequence).await {
                    Ok(answer) => answer.as_str().to_string(),
                    Err(err) => format!("error: {err}"),
                },
                None => "error: the payload is not a sequence number".to_string(),
            };
            if let Err(err) = self.shared.client.publish(reply, answer.into()).await {
                tracing::warn!(%err, "cannot answer a cancel");
            }
        }
    }

    /// Cancels a timer: the local store decides whether it is too late. A
    /// timer this node has not read yet is waited for (briefly), so there is
    /// one judge of every cancel while the partition is owned.
    async fn cancel(&self, sequence: u64) -> Result<CancelAnswer> {
        let deadline = Instant::now() + CANCEL_WAITS_FOR_INGEST;
        let mut checked_in_stream = false;
        loop {
            let (timer, read_past) = {
                let index = self.pending.lock().expect("index lock");
                (index.timers.get(&sequence).cloned(), index.read_up_to >= sequence)
            };
            if let Some(timer) = timer {
                return self.cancel_indexed(sequence, timer).await;
            }
            if read_past {
                // Fired and removed, or malformed and never indexed.
                return Ok(CancelAnswer::NotFound);
            }
            if !checked_in_stream {
                let shared = &self.shared;
                if !is_pending_in_stream(&shared.stream, &shared.config.prefix, self.partition, sequence)
                    .await?
                {
                    return Ok(CancelAnswer::NotFound);
                }
                checked_in_stream = true;
            }
            if Instant::now() > deadline {
                return Err(TierError::Owner(format!("timer {sequence} is not read yet; cancel again")));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn cancel_indexed(&self, sequence: u64, timer: PendingTimer) -> Result<CancelAnswer> {
        let PendingTimer { handle, ack } = timer;
        let store = self.store.clone();
        let outcome = tokio::task::spawn_blocking(move || store.cancel(handle))
            .await
            .expect("a local cancel does not panic")?;
        match outcome {
            CancelOutcome::Cancelled => {
                acknowledge(&self.shared.client, sequence, ack).await?;
                self.pending.lock().expect("index lock").timers.remove(&sequence);
                metrics::counter!("delaytier_cancelled_total").increment(1);
                Ok(CancelAnswer::Cancelled)
            }
            CancelOutcome::AlreadyDelivered => Ok(CancelAnswer::AlreadyFired),
            CancelOutcome::NotFound => Ok(CancelAnswer::NotFound),
        }
    }
}

/// Cancels a timer no owner has indexed: delete it from the stream, after
/// checking it is this partition's (a handle naming the wrong partition must
/// not delete another partition's timer).
pub(crate) async fn cancel_in_stream(
    stream: &Stream,
    prefix: &str,
    partition: u32,
    sequence: u64,
) -> Result<CancelAnswer> {
    if !is_pending_in_stream(stream, prefix, partition, sequence).await? {
        return Ok(CancelAnswer::NotFound);
    }
    if remove_source(stream, sequence).await? {
        metrics::counter!("delaytier_cancelled_total").increment(1);
        Ok(CancelAnswer::Cancelled)
    } else {
        Ok(CancelAnswer::NotFound)
    }
}

/// Publishes to a stream and waits for its acknowledgement.
pub(crate) async fn publish_acked(
    js: &jetstream::Context,
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<jetstream::publish::PublishAck> {
    let failed = |e: async_nats::Error| TierError::nats(format!("publish to {subject}"), e);
    let pending =
        js.publish_with_headers(subject.clone(), headers, payload).await.map_err(|e| failed(e.into()))?;
    pending.await.map_err(|e| failed(e.into()))
}

/// Whether the stream holds this sequence as a timer of `partition`.
async fn is_pending_in_stream(stream: &Stream, prefix: &str, partition: u32, sequence: u64) -> Result<bool> {
    match stream.direct_get(sequence).await {
        Ok(source) => Ok(wire::partition_of_subject(prefix, &source.subject) == Some(partition)),
        Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(false),
        Err(err) => Err(TierError::nats(format!("read timer {sequence}"), err)),
    }
}

/// Acknowledges a timer's delivery, which removes it from the work-queue
/// stream, and waits for the server to confirm.
async fn acknowledge(client: &async_nats::Client, sequence: u64, ack: async_nats::Subject) -> Result<()> {
    client
        .request(ack, bytes::Bytes::from_static(b"+ACK"))
        .await
        .map_err(|e| TierError::nats(format!("acknowledge timer {sequence}"), e))?;
    Ok(())
}

/// Deletes a timer's message from the stream (slow: a JetStream API call);
/// false if it was gone already.
pub(crate) async fn remove_source(stream: &Stream, sequence: u64) -> Result<bool> {
    match stream.delete_message(sequence).await {
        Ok(deleted) => Ok(deleted),
        Err(err) => match stream.direct_get(sequence).await {
            Err(gone) if gone.kind() == DirectGetErrorKind::NotFound => Ok(false),
            _ => Err(TierError::nats(format!("delete timer {sequence}"), err)),
        },
    }
}

/// Checks a timer read from the stream and makes its local record; the
/// error carries the sequence (0 if even that is unknown).
fn index(message: JsMessage, max_body: usize) -> std::result::Result<Indexed, (u64, TierError)> {
    let sequence = match message.info() {
        Ok(info) => info.stream_sequence,
        Err(e) => return Err((0, TierError::nats("read a message's sequence", e))),
    };
    let bad = |problem: &str| (sequence, TierError::BadTimer { sequence, problem: problem.to_string() });
    let headers = message.headers.as_ref().ok_or_else(|| bad("no headers"))?;
    if headers.get(wire::TARGET).is_none_or(|t| t.as_str().is_empty()) {
        return Err(bad(&format!("no {} header", wire::TARGET)));
    }
    let deliver_at_ms = deliver_at(headers)
        .ok_or_else(|| bad(&format!("no {} header in ms since the epoch", wire::DELIVER_AT)))?;
    if deliver_at_ms > MAX_DELIVER_AT_MS {
        return Err(bad(&format!("{} {deliver_at_ms} is past the end of year 9999", wire::DELIVER_AT)));
    }
    let ack = message.reply.clone().ok_or_else(|| bad("delivered without an acknowledgement subject"))?;
    let header_bytes: usize = header_pairs(headers).map(|(n, v)| n.len() + v.len() + 8).sum();
    let local = if header_bytes <= MAX_PROPERTIES_LEN && message.payload.len() <= max_body {
        header_pairs(headers)
            .fold(Message::new(FIRE_TOPIC, message.payload.clone()), |m, (n, v)| m.property(n, v))
    } else {
        Message::new(FIRE_TOPIC, Bytes::new()).tags(BY_REFERENCE)
    };
    let local = local.deliver_at_ms(deliver_at_ms).key(sequence.to_string());
    Ok(Indexed { sequence, deliver_at_ms, ack, local })
}

/// Every (name, value) of a header map, a name repeated per value.
fn header_pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers.iter().flat_map(|(name, values)| values.iter().map(move |v| (name.as_ref(), v.as_str())))
}

fn deliver_at(headers: &HeaderMap) -> Option<u64> {
    headers.get(wire::DELIVER_AT)?.as_str().trim().parse().ok()
}

/// The target and headers of a fired timer: the source's headers without the
/// target, plus the deduplication id and the handle it had.
fn fired_headers<'a>(
    stream: &str,
    partition: u32,
    sequence: u64,
    source: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<(String, HeaderMap)> {
    let mut target = None;
    let mut headers = HeaderMap::new();
    for (name, value) in source {
        if name.eq_ignore_ascii_case(wire::TARGET) {
            target = Some(value.to_string()).filter(|t| !t.is_empty());
        } else if !name.eq_ignore_ascii_case(wire::MSG_ID) {
            headers.append(name, value);
        }
    }
    let target = target
        .ok_or_else(|| TierError::BadTimer { sequence, problem: format!("no {} header", wire::TARGET) })?;
    headers.insert(wire::MSG_ID, wire::msg_id(stream, sequence).as_str());
    headers.insert(wire::HANDLE, wire::TimerHandle { partition, sequence }.to_string().as_str());
    Ok((target, headers))
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fired_message_keeps_the_users_headers_and_names_itself_for_deduplication() {
        let mut source = HeaderMap::new();
        source.insert(wire::TARGET, "orders.timeout");
        source.insert(wire::DELIVER_AT, "1700000000000");
        source.insert("Order", "o-1");
        source.insert(wire::MSG_ID, "the producer's own id");
        let (target, headers) = fired_headers("DELAY", 3, 42, header_pairs(&source)).unwrap();
        assert_eq!(target, "orders.timeout");
        assert_eq!(headers.get("Order").unwrap().as_str(), "o-1");
        assert_eq!(headers.get(wire::DELIVER_AT).unwrap().as_str(), "1700000000000");
        assert_eq!(headers.get(wire::MSG_ID).unwrap().as_str(), "DELAY-42");
        assert_eq!(headers.get(wire::HANDLE).unwrap().as_str(), "3:42");
        assert!(headers.get(wire::TARGET).is_none());
        assert_eq!(deliver_at(&headers), Some(1_700_000_000_000));
    }

    #[test]
    fn a_timer_without_a_target_is_refused_naming_its_sequence() {
        let mut source = HeaderMap::new();
        source.insert(wire::DELIVER_AT, "5");
        let err = fired_headers("DELAY", 0, 9, header_pairs(&source)).unwrap_err().to_string();
        assert!(err.contains("sequence 9") && err.contains(wire::TARGET), "{err}");
    }
}
