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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::context::{GetStreamByNameErrorKind, PublishError, PublishErrorKind};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, Stream};
use async_nats::jetstream::{self, Message as JsMessage};
use bytes::Bytes;
use delaywheel::{
    CancelOutcome, ConsumedMessage, Handle, MAX_DELIVER_AT_MS, MAX_PROPERTIES_LEN, Message, Store,
};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::error::bounded;
use crate::headers::{
    Occurrence, borrowed_pairs, dead_letter_headers, deliver_at, fired_headers, header_pairs, owned_pairs,
    successor_headers, target_of, value_of,
};
use crate::nats_schedule::NatsSchedule;
use crate::settled_ids::{RecentlySettled, SettledIds};
use crate::target::TargetPolicy;
use crate::wire::{self, CancelAnswer, Layout, TimerHandle};
use crate::{Result, TierConfig, TierError};

/// The segment size of a partition's local store: its timers' copies go
/// in 16 MiB files, and the store faults in at most half of one ahead.
const PARTITION_SEGMENT_BYTES: u64 = 16 << 20;
/// The most bytes of timers one local batch put holds (about): a batch must
/// fit in one segment, and 1,024 timers of up to 4 MiB each would not.
const PUT_BATCH_BYTES: usize = (PARTITION_SEGMENT_BYTES / 4) as usize;
/// The local store's one topic.
const FIRE_TOPIC: &str = "fire";
/// Timers read from the stream per local batch put.
const INGEST_BATCH: usize = 1024;
/// Lookups of settled `Nats-Msg-Id`s a batch read from the stream makes at once.
const SETTLED_LOOKUPS: usize = 64;
/// The longest `Nats-Msg-Id` a timer may carry (the store's dedup key limit):
/// it becomes a key of the settled-ids bucket.
const MAX_MSG_ID_LEN: usize = 1024;
/// Fired timers published at once (a timer waiting to be tried again holds
/// no lane, so those behind it go on).
const FIRE_CONCURRENCY: usize = 128;
/// Timers taken from the local store and not done yet (firing or waiting
/// to be tried again), at most: during an outage the rest wait in the local
/// store, not in memory.
const MAX_FIRING: usize = 4096;
/// The longest a dead letter's publish may take to reach the server.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a target known to be captured by a stream (it acknowledged, or
/// a lookup found its stream) is trusted to be, sparing the JetStream API a
/// lookup per failed publish during an outage.
const CAPTURED_FOR: Duration = Duration::from_secs(60);
/// After a stream lookup fails, how long failed publishes count as
/// transient without one (the API is likely electing its leader too).
const LOOKUPS_PAUSE: Duration = Duration::from_secs(1);
/// How often the sweep looks for fired timers still in the stream.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// A fired timer's acknowledgement has surely been applied after this.
const ACK_SETTLES: Duration = Duration::from_secs(5);
/// How long the consumer's count must keep saying that no acknowledgement
/// was lost before the sweep forgets a fired timer unchecked.
const COUNT_VOUCHES: Duration = Duration::from_secs(20);
/// Fired timers remembered for the sweep, at most.
const MAX_REMEMBERED: usize = 1 << 20;
/// How long a given-up partition waits for its store to be let go of.
const STORE_RELEASE: Duration = Duration::from_secs(5);
/// How long a cancel of a timer not read yet waits for this node to read it.
const CANCEL_WAITS_FOR_INGEST: Duration = Duration::from_secs(2);
/// How long the stream waits for a timer's acknowledgement before handing it
/// out again: longer than any timer waits, so never.
const HOLD_UNTIL_FIRED: Duration = Duration::from_secs(100 * 365 * 86_400);

/// What the partitions of one node share.
pub(crate) struct Shared {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    /// Where the timers are: the partitions and their delay streams.
    pub layout: Layout,
    /// The delay streams, by index (see [`Layout::stream_index`]).
    pub streams: Vec<DelayStream>,
    pub config: TierConfig,
    /// What a timer may target (from `config`, made once).
    pub policy: TargetPolicy,
    /// Which targets streams capture, as lately seen.
    pub captured: Mutex<Captured>,
    /// Partitions taken so far: each take's store has a directory of its own.
    pub takes: AtomicU64,
    /// The `Nats-Msg-Id`s of timers that settled within the dedup window.
    pub settled_ids: SettledIds,
}

impl Shared {
    /// The delay stream that holds `partition`'s timers.
    pub fn stream_of(&self, partition: u32) -> &DelayStream {
        &self.streams[self.layout.stream_index(partition) as usize]
    }
}

/// One delay stream of the layout, as the node found or made it.
pub(crate) struct DelayStream {
    pub stream: Stream,
    pub name: String,
    /// Whether it captures subjects no partition of it reads (made by hand
    /// or by an older node), so the owner of its first partition looks for them.
    pub strays_possible: bool,
}

/// Targets lately seen captured by a stream, and when a stream lookup last
/// failed.
#[derive(Default)]
pub(crate) struct Captured {
    targets: HashMap<String, Instant>,
    lookup_failed: Option<Instant>,
}

impl Captured {
    /// Whether `target` was seen captured lately.
    fn knows(&self, target: &str) -> bool {
        self.targets.get(target).is_some_and(|at| at.elapsed() < CAPTURED_FOR)
    }

    fn saw(&mut self, target: &str) {
        if self.knows(target) {
            return;
        }
        if self.targets.len() >= 4096 {
            self.targets.clear(); // a bound, not a cache policy: a miss costs one lookup
        }
        self.targets.insert(target.to_string(), Instant::now());
    }

    fn lookups_paused(&self) -> bool {
        self.lookup_failed.is_some_and(|at| at.elapsed() < LOOKUPS_PAUSE)
    }
}

/// A timer indexed and not yet removed from the stream.
#[derive(Clone)]
struct PendingTimer {
    /// Its timer in the local store, for cancels.
    handle: Handle,
    /// The subject that acknowledges its delivery, removing it from the stream.
    ack: async_nats::Subject,
    /// Its producer's `Nats-Msg-Id`, if it had one.
    msg_id: Option<Box<str>>,
    /// For a recurring schedule's timer, the sequence of the schedule's
    /// first timer, whose handle names the schedule.
    origin: Option<u64>,
}

/// What the partition's tasks share about the timers read so far.
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
    /// The sequence of the indexed timer holding each `Nats-Msg-Id`.
    by_msg_id: HashMap<Box<str>, u64>,
    /// The sequence of each recurring schedule's latest timer indexed, by
    /// the sequence of its first.
    by_origin: HashMap<u64, u64>,
    /// The `Nats-Msg-Id`s of the timers this partition settled lately (see
    /// `settled_ids.rs`): kept across a read of the partition again.
    recently_settled: RecentlySettled,
}

impl Index {
    /// An empty index, remembering settled ids for at most `dedup_window`.
    fn new(dedup_window: Duration) -> Self {
        Index {
            timers: HashMap::new(),
            read_up_to: 0,
            malformed: 0,
            fired: VecDeque::new(),
            by_msg_id: HashMap::new(),
            by_origin: HashMap::new(),
            recently_settled: RecentlySettled::new(dedup_window),
        }
    }

    /// Forgets the indexed timer `sequence` (fired, cancelled or gone).
    fn remove(&mut self, sequence: u64) {
        let Some(timer) = self.timers.remove(&sequence) else { return };
        if let Some(id) = timer.msg_id
            && self.by_msg_id.get(&id) == Some(&sequence)
        {
            self.by_msg_id.remove(&id);
        }
        if let Some(origin) = timer.origin
            && self.by_origin.get(&origin) == Some(&sequence)
        {
            self.by_origin.remove(&origin);
        }
    }

    /// The pending timer a handle's sequence names, other than `firing`:
    /// that timer, or the latest of the recurring schedule whose first timer
    /// it was.
    fn current(&self, sequence: u64, firing: Option<u64>) -> Option<(u64, PendingTimer)> {
        let pending = |at: u64| self.timers.get(&at).filter(|_| Some(at) != firing).map(|t| (at, t.clone()));
        pending(sequence).or_else(|| pending(*self.by_origin.get(&sequence)?))
    }

    /// Forgets the indexed timer `sequence`, which settled (fired, moved to
    /// the dead letter, or cancelled) after its id was recorded.
    fn settle(&mut self, sequence: u64) {
        if let Some(id) = self.timers.get(&sequence).and_then(|t| t.msg_id.clone()) {
            self.recently_settled.insert(id, sequence);
        }
        self.remove(sequence);
    }

    /// The indexed timer, other than `sequence`, that holds `msg_id`.
    fn holder_of(&self, msg_id: &str, sequence: u64) -> Option<u64> {
        self.by_msg_id
            .get(msg_id)
            .copied()
            .filter(|&held| held != sequence && self.timers.contains_key(&held))
    }
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
        // A directory of its own per take: a store of an earlier take that
        // something still holds can never write into this one's files.
        let take = shared.takes.fetch_add(1, Ordering::Relaxed);
        let dir = shared.config.dir.join(format!("p{partition}-{take}"));
        let store = Arc::new(open_fresh(dir.clone()).await?);
        let pending: Pending = Arc::new(Mutex::new(Index::new(shared.config.dedup_window)));
        let span = tracing::info_span!("partition", p = partition);
        // Answer cancels before indexing, so while this node holds the lease
        // no cancel goes around it (see `client::cancel`).
        let cancels = shared
            .client
            .subscribe(wire::cancel_subject(&shared.config.stream, partition))
            .await
            .map_err(|e| TierError::nats("subscribe to cancels", e))?;
        // A stream's first partition is the one whose number is its index.
        let strays = (partition < shared.layout.streams
            && shared.streams[partition as usize].strays_possible)
            .then(|| shared.clone());
        // The owner of partition 0 spreads the streams' leaders (see `leaders`).
        let leaders = (partition == 0 && shared.layout.streams > 1).then(|| shared.clone());
        let part = Part { shared, partition, store: store.clone(), pending };
        let mut tasks = vec![
            tokio::spawn(part.clone().answer_cancels(cancels).instrument(span.clone())),
            tokio::spawn(part.clone().fire().instrument(span.clone())),
            tokio::spawn(part.clone().sweep().instrument(span.clone())),
            tokio::spawn(part.ingest().instrument(span.clone())),
        ];
        if let Some(shared) = strays {
            tasks.push(tokio::spawn(crate::strays::sweep(shared, partition).instrument(span.clone())));
        }
        if let Some(shared) = leaders {
            tasks.push(tokio::spawn(crate::leaders::spread(shared).instrument(span)));
        }
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
        let (dir, partition) = (self.dir, self.partition);
        let store = sole_owner(self.store).await;
        if store.is_none() {
            tracing::warn!(partition, "the local store is still in use; removing it unclosed");
        }
        let closed = tokio::task::spawn_blocking(move || {
            if let Some(store) = store {
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

/// The store, once the partition's tasks' blocking work (a local put or
/// poll under way when they were aborted) has let go of it; None if that
/// takes longer than `STORE_RELEASE`.
async fn sole_owner(mut store: Arc<Store>) -> Option<Store> {
    let deadline = Instant::now() + STORE_RELEASE;
    loop {
        match Arc::try_unwrap(store) {
            Ok(store) => return Some(store),
            Err(_) if Instant::now() >= deadline => return None,
            Err(shared) => store = shared,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Removes the local stores an earlier run of this node left (killed before
/// it could): they are indexes of a stream that has moved on.
pub(crate) fn remove_stale_stores(dir: &std::path::Path) -> Result<()> {
    let io = |source| TierError::Io { path: dir.to_path_buf(), source };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let ours = name
            .strip_prefix('p')
            .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit() || b == b'-'));
        if ours && path.is_dir() {
            std::fs::remove_dir_all(&path).map_err(|source| TierError::Io { path, source })?;
        }
    }
    Ok(())
}

async fn open_fresh(dir: PathBuf) -> Result<Store> {
    tokio::task::spawn_blocking(move || {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|source| TierError::Io { path: dir.clone(), source })?;
        }
        Ok(Store::open(partition_store_config(&dir))?)
    })
    .await
    .expect("opening a local store does not panic")
}

/// The local store of a partition in `dir`. A node owns many partitions,
/// each a store: small segments keep what an idle one holds on disk and in
/// memory small (see the README).
fn partition_store_config(dir: &std::path::Path) -> delaywheel::Config {
    delaywheel::Config::new(dir)
        .with_queues_per_topic(1)
        .with_segment_size(PARTITION_SEGMENT_BYTES)
        .with_queue_file_entries(1 << 20)
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
    /// Its producer's `Nats-Msg-Id`, if it had one.
    msg_id: Option<Box<str>>,
    /// The timer it replaces, for a rescheduled timer's copy: that timer
    /// holds the same `Nats-Msg-Id` without making the copy a duplicate.
    replaces: Option<u64>,
    /// See [`PendingTimer::origin`].
    origin: Option<u64>,
}

/// A timer read from the stream that will not be indexed.
struct Reject {
    sequence: u64,
    /// The dead letter's reason label: `malformed` or `refused` (its target).
    kind: &'static str,
    error: TierError,
}

/// A due timer as it is to be published.
struct Due {
    ack: async_nats::Subject,
    /// Its producer's `Nats-Msg-Id`, recorded as settled before the ack.
    msg_id: Option<Box<str>>,
    /// The source's headers, the target included.
    source: Vec<(String, String)>,
    payload: Bytes,
    /// The subject it was published to, for a `Nats-Schedule`'s timer (its
    /// occurrences name it, and its next timer goes there).
    subject: Option<String>,
    /// See [`PendingTimer::origin`].
    origin: Option<u64>,
}

/// What the tries to fire one timer share.
#[derive(Default)]
struct Tries {
    /// Since when the tries fail, if the last one failed.
    failing_since: Option<Instant>,
    /// A recurring schedule's next occurrence (`None` after its last),
    /// once computed: every try announces the same one.
    next_ms: Option<Option<u64>>,
    /// Whether the schedule's next timer is in the delay stream: a retry
    /// publishes the occurrence again (its target drops the copy), not it.
    next_stored: bool,
}

/// A timer leaving the stream, and its producer's `Nats-Msg-Id`.
#[derive(Clone, Copy)]
struct Settled<'a> {
    sequence: u64,
    msg_id: Option<&'a str>,
}

/// Why a try to fire a timer failed.
enum Failure {
    /// The tier will not publish to its target.
    Refused(String),
    /// Its target will never acknowledge it.
    Undeliverable(String),
    /// It may work later: the cluster or the connection is in trouble.
    Transient(TierError),
}

/// Tags of a local timer that holds only the sequence: firing it reads the
/// message from the stream.
const BY_REFERENCE: &str = "ref";
/// The local property that keeps the subject of a `Nats-Schedule`'s timer
/// (no header can have this name: NATS's have no `:`).
const SUBJECT_PROPERTY: &str = ":subject";

impl Part {
    /// The delay stream that holds this partition's timers.
    fn delay_stream(&self) -> &DelayStream {
        self.shared.stream_of(self.partition)
    }

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
        let stream = &self.delay_stream().stream;
        let _ = stream.delete_consumer(&name).await;
        let consumer = stream
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
            let mut rejected = Vec::new();
            let mut read_up_to = 0;
            for message in chunk {
                let message = message.map_err(|e| TierError::nats("read the partition", e))?;
                match index(&message, self.partition, max_body, &self.shared.policy) {
                    Ok(timer) => {
                        read_up_to = read_up_to.max(timer.sequence);
                        timers.push(timer);
                    }
                    Err(reject) => {
                        read_up_to = read_up_to.max(reject.sequence);
                        rejected.push((message, reject));
                    }
                }
            }
            self.put(timers, read_up_to).await?;
            for (message, reject) in rejected {
                self.reject(&message, reject).await;
            }
        }
        Ok(())
    }

    /// A timer that will never be indexed: moves it to the dead letter and
    /// removes it from the stream; if that fails now, it stays in the stream
    /// (counted, as the sweep expects) until the partition is read again.
    async fn reject(&self, message: &JsMessage, reject: Reject) {
        let Reject { sequence, kind, error } = reject;
        if kind == "malformed" {
            metrics::counter!("delaytier_malformed_total").increment(1);
        }
        tracing::warn!(sequence, %error, "timer not indexed: moving it to the dead letter");
        let buried = match (&message.reply, sequence) {
            (Some(ack), 1..) => {
                let source = message.headers.as_ref().map(owned_pairs).unwrap_or_default();
                let payload = message.payload.clone();
                let settled = Settled { sequence, msg_id: None };
                self.bury(settled, &source, payload, ack.clone(), kind, &error.to_string()).await
            }
            _ => Err(error),
        };
        if let Err(err) = buried {
            self.pending.lock().expect("index lock").malformed += 1;
            tracing::warn!(sequence, %err, "timer left in the stream, not indexed");
        }
    }

    /// Puts timers into the local store, holding the index so a timer that
    /// fires at once is known before it is looked up; drops the duplicates.
    async fn put(&self, timers: Vec<Indexed>, read_up_to: u64) -> Result<()> {
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
                .map(|t| (t.local, (t.sequence, t.deliver_at_ms, t.ack, t.msg_id, t.origin)))
                .unzip();
            let receipts = put_in_batches(&store, messages)?;
            for ((sequence, deliver_at_ms, ack, msg_id, origin), receipt) in timers.into_iter().zip(receipts)
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
                index.timers.insert(sequence, PendingTimer { handle, ack, msg_id, origin });
            }
            index.read_up_to = index.read_up_to.max(read_up_to);
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

    /// Records the `Nats-Msg-Id` of a timer that was fired or moved to the
    /// dead letter, if it has one, as settled: before the timer leaves the
    /// stream, so that a retry of it within the dedup window never fires,
    /// whichever node reads it. Tried until it is recorded: the timer was
    /// published, and publishing it again would be worse than waiting.
    async fn record_settled(&self, settled: Settled<'_>) {
        let Some(id) = settled.msg_id else { return };
        let mut backoff = Duration::from_millis(50);
        while let Err(err) = self.shared.settled_ids.record(self.partition, id, settled.sequence).await {
            metrics::counter!("delaytier_settled_id_errors_total").increment(1);
            tracing::warn!(sequence = settled.sequence, %err, "cannot record a settled Nats-Msg-Id; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
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
                tracing::warn!(sequence, %err, "a duplicate timer stays in the stream for now");
            }
        }
    }

    async fn forget_all(&self) {
        let (store, pending) = (self.store.clone(), self.pending.clone());
        let _ = tokio::task::spawn_blocking(move || {
            let mut index = pending.lock().expect("index lock");
            index.read_up_to = 0;
            index.malformed = 0;
            index.by_msg_id.clear();
            index.by_origin.clear();
            let handles: Vec<Handle> = index.timers.drain().map(|(_, t)| t.handle).collect();
            store.cancel_batch(&handles)
        })
        .await;
    }

    /// Takes the local store's deliveries and fires each, at most
    /// `FIRE_CONCURRENCY` at once and `MAX_FIRING` under way. The local store is only an index, so its
    /// position is committed once a timer's firing has started: the stream
    /// keeps the timer until that firing ends. The firings are futures of
    /// this task, not tasks of their own, so when the partition is given up
    /// aborting this task ends them all before its store is closed.
    async fn fire(self) {
        let mut consumer = match self.store.consumer(FIRE_TOPIC, 0) {
            Ok(consumer) => consumer,
            Err(err) => return tracing::error!(%err, "cannot consume the local store"),
        };
        let lanes = Arc::new(Semaphore::new(FIRE_CONCURRENCY));
        let slots = Arc::new(Semaphore::new(MAX_FIRING));
        let mut firing = FuturesUnordered::new();
        loop {
            let poll = tokio::task::spawn_blocking(move || {
                let batch = consumer.poll(1024, Duration::from_millis(200));
                (consumer, batch)
            });
            let polled = drive(&mut firing, poll).await.expect("a local poll does not panic");
            consumer = polled.0;
            let batch = match polled.1 {
                Ok(batch) => batch,
                Err(err) => {
                    tracing::error!(%err, "the local store failed; this partition stops firing");
                    return;
                }
            };
            for timer in batch {
                let Ok(slot) = drive(&mut firing, slots.clone().acquire_owned()).await else { return };
                let Ok(lane) = drive(&mut firing, lanes.clone().acquire_owned()).await else { return };
                let fire = self.clone().fire_until_done(timer, lanes.clone(), lane);
                firing.push(async move {
                    fire.await;
                    drop(slot);
                });
            }
            consumer.commit();
        }
    }

    /// Fires one timer. A failure that may pass (the cluster or the
    /// connection in trouble) is tried again, the timer giving up its lane
    /// while it waits so the timers behind it go on; a timer that can never
    /// be published, or still fails after `give_up_after`, goes to the dead
    /// letter.
    async fn fire_until_done(
        self,
        timer: ConsumedMessage,
        lanes: Arc<Semaphore>,
        lane: OwnedSemaphorePermit,
    ) {
        let Some(sequence) = timer.key().and_then(|k| k.parse::<u64>().ok()) else {
            return tracing::error!(key = ?timer.key(), "a local timer without its sequence");
        };
        let mut lane = Some(lane);
        let mut tries = Tries::default();
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.fire_one(sequence, &timer, &mut tries).await {
                Ok(()) => return,
                Err(err) => {
                    tries.failing_since.get_or_insert_with(Instant::now);
                    metrics::counter!("delaytier_fire_errors_total").increment(1);
                    tracing::warn!(sequence, %err, "firing failed; retrying");
                }
            }
            drop(lane.take());
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
            let Ok(again) = lanes.clone().acquire_owned().await else { return };
            lane = Some(again);
        }
    }

    /// One try: publish and acknowledge, or move to the dead letter a timer
    /// that cannot be published. An error means try again.
    async fn fire_one(&self, sequence: u64, timer: &ConsumedMessage, tries: &mut Tries) -> Result<()> {
        let Some(due) = self.load(sequence, timer).await? else {
            return Ok(()); // cancelled while it fired, or deleted from the stream by hand
        };
        let (kind, reason) = match self.publish(sequence, timer, &due, tries).await {
            Ok(duplicate) => {
                // A recurring schedule's id is held by its next timer from
                // here on (in every owner's index, read from the stream), so
                // it is recorded as settled only when the schedule ends.
                let held_on = tries.next_stored && tries.next_ms.flatten().is_some();
                let msg_id = due.msg_id.as_deref().filter(|_| !held_on);
                return self.fired(sequence, due.ack, msg_id, timer, duplicate).await;
            }
            Err(Failure::Refused(reason)) => ("refused", reason),
            Err(Failure::Undeliverable(reason)) => ("undeliverable", reason),
            Err(Failure::Transient(err)) => match tries.failing_since {
                Some(since) if since.elapsed() >= self.shared.config.give_up_after => {
                    ("gave_up", format!("still failing after {:?}: {err}", since.elapsed()))
                }
                _ => return Err(err),
            },
        };
        let settled = Settled { sequence, msg_id: due.msg_id.as_deref() };
        self.bury(settled, &due.source, due.payload, due.ack, kind, &reason).await
    }

    /// The timer as it is to be published, or None if it left the stream.
    async fn load(&self, sequence: u64, timer: &ConsumedMessage) -> Result<Option<Due>> {
        let pending = self.pending.lock().expect("index lock").timers.get(&sequence).cloned();
        let Some(PendingTimer { ack, msg_id, origin, .. }) = pending else {
            return Ok(None);
        };
        if timer.tags() != Some(BY_REFERENCE) {
            let mut subject = None;
            let mut source = Vec::with_capacity(timer.properties().len());
            for (name, value) in timer.properties() {
                match name.as_str() {
                    SUBJECT_PROPERTY => subject = Some(value.clone()),
                    _ => source.push((name.clone(), value.clone())),
                }
            }
            return Ok(Some(Due { ack, msg_id, source, payload: timer.body().clone(), subject, origin }));
        }
        match self.delay_stream().stream.direct_get(sequence).await {
            Ok(message) => {
                let source = owned_pairs(&message.headers);
                let subject = Some(message.subject.to_string());
                Ok(Some(Due { ack, msg_id, source, payload: message.payload, subject, origin }))
            }
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => {
                self.pending.lock().expect("index lock").remove(sequence);
                metrics::counter!("delaytier_skipped_total").increment(1);
                Ok(None) // deleted from the stream by hand
            }
            Err(err) => Err(TierError::nats(format!("read timer {sequence}"), err)),
        }
    }

    /// Publishes a due timer to its target and waits for the target stream's
    /// acknowledgement; whether it was a duplicate. A recurring schedule's
    /// next timer is published to the delay stream at the same time, and
    /// both must be acknowledged before the timer is (so a crash leaves
    /// both, never neither; a second copy of the next timer is dropped by
    /// the schedule's id as it is read, of the occurrence by its
    /// `Nats-Msg-Id`). A next timer that failed fails the try, however the
    /// occurrence went.
    async fn publish(
        &self,
        sequence: u64,
        timer: &ConsumedMessage,
        due: &Due,
        tries: &mut Tries,
    ) -> std::result::Result<bool, Failure> {
        let shared = &self.shared;
        let source = borrowed_pairs(&due.source);
        let refused = |err: TierError| Failure::Refused(err.to_string());
        let target = target_of(sequence, &source).map_err(refused)?;
        shared.policy.check(target).map_err(|reason| Failure::Refused(reason.to_string()))?;
        let schedule = NatsSchedule::read(&source).map_err(Failure::Refused)?;
        let (occurrence, next) = match &schedule {
            Some(schedule) => {
                let (occurrence, next) = self.occurrence(sequence, timer, due, schedule, tries);
                (Some(occurrence), next)
            }
            None => (None, None),
        };
        let stream = &self.delay_stream().name;
        let (target, headers) =
            fired_headers(stream, self.partition, sequence, &source, occurrence.as_ref()).map_err(refused)?;
        let published = async {
            shared.js.publish_with_headers(target.clone(), headers, due.payload.clone()).await?.await
        };
        let next_published = async {
            let Some((subject, headers)) = next else { return Ok(()) };
            publish_acked(&shared.js, subject, headers, due.payload.clone()).await?;
            metrics::counter!("delaytier_schedule_next_total").increment(1);
            Ok(())
        };
        let (published, next_published) = tokio::join!(published, next_published);
        next_published.map_err(Failure::Transient)?;
        tries.next_stored = true;
        match published {
            Ok(ack) => {
                shared.captured.lock().expect("captured lock").saw(&target);
                Ok(ack.duplicate)
            }
            Err(err) => Err(self.classify(&target, err).await),
        }
    }

    /// What an occurrence of a schedule says besides its message, and for a
    /// recurring schedule with a next occurrence, its next timer: the
    /// subject and headers it is published to the delay stream with.
    fn occurrence<'a>(
        &self,
        sequence: u64,
        timer: &ConsumedMessage,
        due: &'a Due,
        schedule: &'a NatsSchedule,
        tries: &mut Tries,
    ) -> (Occurrence<'a>, Option<(String, HeaderMap)>) {
        let subject = due.subject.as_deref().unwrap_or_default();
        debug_assert!(!subject.is_empty(), "a schedule's timer keeps its subject");
        let scheduler = self.shared.layout.scheduler_of(subject);
        let due_ms = timer.deliver_at_ms();
        debug_assert!(due_ms.is_some(), "a local timer is timed");
        // Once per firing: a retry announces and stores the same next timer.
        let next_ms =
            *tries.next_ms.get_or_insert_with(|| schedule.next(due_ms.unwrap_or_default(), now_ms()));
        let handle = |sequence| TimerHandle { partition: self.partition, sequence };
        let source = borrowed_pairs(&due.source);
        let next = match (next_ms, due.origin) {
            (Some(next_ms), Some(origin)) if !tries.next_stored => {
                let stream = &self.delay_stream().name;
                let id = due.msg_id.as_deref().map_or_else(|| wire::msg_id(stream, origin), str::to_string);
                let headers = successor_headers(&source, &id, sequence, handle(origin), next_ms);
                Some((subject.to_string(), headers))
            }
            _ => None,
        };
        let rollup = schedule.rollup();
        let occurrence =
            Occurrence { scheduler, next_ms, ttl: schedule.ttl(), rollup, schedule: due.origin.map(handle) };
        (occurrence, next)
    }

    /// Sorts a failed publish: a JetStream answer other than "unavailable",
    /// or an answer that is no acknowledgement, will not change; silence or
    /// no responders will not either when no stream captures the target
    /// (a core subscriber never acknowledges), but is a stream's leader
    /// being elected when one does.
    async fn classify(&self, target: &str, err: PublishError) -> Failure {
        let turned_away =
            |err: &PublishError| Failure::Undeliverable(format!("the target's stream refused it: {err}"));
        let transient =
            |err: PublishError| Failure::Transient(TierError::nats(format!("publish to {target}"), err));
        match err.kind() {
            PublishErrorKind::StreamNotFound | PublishErrorKind::TimedOut => {
                match self.captured(target).await {
                    Some(false) => {
                        let what = if err.kind() == PublishErrorKind::TimedOut {
                            "no answer"
                        } else {
                            "no responders"
                        };
                        Failure::Undeliverable(format!("no stream captures {target:?} ({what})"))
                    }
                    _ => transient(err),
                }
            }
            PublishErrorKind::WrongLastMessageId
            | PublishErrorKind::WrongLastSequence
            | PublishErrorKind::MaxPayloadExceeded => turned_away(&err),
            PublishErrorKind::Other => match std::error::Error::source(&err) {
                Some(answer) if answer.is::<serde_json::Error>() => Failure::Undeliverable(format!(
                    "the answer from {target:?} is not a publish acknowledgement"
                )),
                Some(answer) => match answer.downcast_ref::<jetstream::Error>() {
                    Some(js) if js.code() != 503 => turned_away(&err),
                    _ => transient(err),
                },
                None => transient(err),
            },
            _ => transient(err),
        }
    }

    /// Whether a stream captures `target`; None if JetStream cannot say now.
    async fn captured(&self, target: &str) -> Option<bool> {
        {
            let captured = self.shared.captured.lock().expect("captured lock");
            if captured.knows(target) {
                return Some(true);
            }
            if captured.lookups_paused() {
                return None;
            }
        }
        let found = self.shared.js.stream_by_subject(target).await;
        let mut captured = self.shared.captured.lock().expect("captured lock");
        match found {
            Ok(_) => {
                captured.saw(target);
                Some(true)
            }
            Err(err) if err.kind() == GetStreamByNameErrorKind::NotFound => Some(false),
            Err(_) => {
                captured.lookup_failed = Some(Instant::now());
                None
            }
        }
    }

    /// Acknowledges a timer that fired, and counts it.
    async fn fired(
        &self,
        sequence: u64,
        ack: async_nats::Subject,
        msg_id: Option<&str>,
        timer: &ConsumedMessage,
        duplicate: bool,
    ) -> Result<()> {
        if duplicate {
            metrics::counter!("delaytier_duplicates_dropped_total").increment(1);
        }
        self.record_settled(Settled { sequence, msg_id }).await;
        acknowledge(&self.shared.client, sequence, ack).await?;
        self.forget(sequence);
        metrics::counter!("delaytier_fired_total").increment(1);
        if let Some(at) = timer.deliver_at_ms() {
            let late_ms = now_ms().saturating_sub(at);
            metrics::histogram!("delaytier_lateness_seconds").record(late_ms as f64 / 1e3);
        }
        Ok(())
    }

    /// Moves a timer to the dead letter, then removes it from the stream.
    async fn bury(
        &self,
        settled: Settled<'_>,
        source: &[(String, String)],
        payload: Bytes,
        ack: async_nats::Subject,
        kind: &'static str,
        reason: &str,
    ) -> Result<()> {
        let sequence = settled.sequence;
        self.dead_letter(sequence, source, payload, kind, reason).await?;
        self.record_settled(settled).await;
        acknowledge(&self.shared.client, sequence, ack).await?;
        self.forget(sequence);
        Ok(())
    }

    /// Publishes a timer of this partition to its dead-letter subject.
    async fn dead_letter(
        &self,
        sequence: u64,
        source: &[(String, String)],
        payload: Bytes,
        kind: &'static str,
        reason: &str,
    ) -> Result<()> {
        let source = borrowed_pairs(source);
        let from = (self.delay_stream().name.as_str(), Some(self.partition));
        dead_letter(&self.shared, from, sequence, &source, payload, kind, reason).await
    }

    /// Forgets a timer that left the line (fired or dead-lettered), and
    /// remembers it for the sweep, in case its acknowledgement is lost.
    fn forget(&self, sequence: u64) {
        let mut index = self.pending.lock().expect("index lock");
        index.settle(sequence);
        if index.fired.len() == MAX_REMEMBERED {
            index.fired.pop_front();
        }
        index.fired.push_back((Instant::now(), sequence));
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
            let (settled, held) = {
                let mut index = self.pending.lock().expect("index lock");
                let cut = index.fired.partition_point(|(at, _)| at.elapsed() >= ACK_SETTLES);
                let settled: Vec<(Instant, u64)> = index.fired.drain(..cut).collect();
                (settled, index.timers.len() + index.malformed)
            };
            if settled.is_empty() {
                continue;
            }
            match self.delay_stream().stream.consumer_info(&name).await {
                Ok(info) if info.num_ack_pending <= held => {
                    // The count says no acknowledgement was lost. Right after
                    // the consumer's leader changed it can say so before it
                    // counts what the old leader lost (seen: 2 of 4,000 left
                    // after a kill -9), so a fired timer is forgotten only
                    // once the count has vouched for it over COUNT_VOUCHES.
                    let recent = settled.iter().filter(|(at, _)| at.elapsed() < ACK_SETTLES + COUNT_VOUCHES);
                    let mut index = self.pending.lock().expect("index lock");
                    for &kept in recent.rev() {
                        index.fired.push_front(kept);
                    }
                    continue;
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(%err, "sweep: cannot read the consumer; checking the fired timers");
                }
            }
            let stream = &self.delay_stream().stream;
            // Some(sequence): it could not be checked now; look again next round.
            let checks: Vec<(usize, Option<u64>)> =
                futures::stream::iter(settled.into_iter().map(|(_, s)| s))
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
            if let Err(refused) = self.shared.policy.check_reply(&reply) {
                tracing::warn!(%refused, "a cancel not answered");
                continue;
            }
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
    ///
    /// The handle of a recurring schedule's first timer names the schedule:
    /// its cancel cancels the schedule's latest timer, and if that one is
    /// firing, waits for the next (published before it fires) and cancels it.
    async fn cancel(&self, sequence: u64) -> Result<CancelAnswer> {
        let deadline = Instant::now() + CANCEL_WAITS_FOR_INGEST;
        let mut checked_in_stream = false;
        // The schedule's timer that was firing as it was cancelled.
        let mut firing = None;
        loop {
            let (current, read_past) = {
                let index = self.pending.lock().expect("index lock");
                (index.current(sequence, firing), index.read_up_to >= sequence)
            };
            match current {
                Some((at, timer)) => {
                    let recurs = timer.origin.is_some();
                    match self.cancel_indexed(at, timer).await? {
                        CancelAnswer::AlreadyFired if recurs => firing = Some(at),
                        answer => return Ok(answer),
                    }
                }
                // Its next timer is not read yet.
                None if firing.is_some() => {}
                // Fired and removed, or malformed and never indexed.
                None if read_past => return Ok(CancelAnswer::NotFound),
                None => {}
            }
            if firing.is_none() && !read_past && !checked_in_stream {
                let shared = &self.shared;
                let stream = &self.delay_stream().stream;
                if pending_in_stream(stream, &shared.layout.prefix, self.partition, sequence).await?.is_none()
                {
                    return Ok(CancelAnswer::NotFound);
                }
                checked_in_stream = true;
            }
            if Instant::now() > deadline {
                let why = match firing {
                    Some(_) => "is firing and its next timer is not read yet",
                    None => "is not read yet",
                };
                return Err(TierError::Owner(format!("timer {sequence} {why}; cancel again")));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn cancel_indexed(&self, sequence: u64, timer: PendingTimer) -> Result<CancelAnswer> {
        let PendingTimer { handle, ack, msg_id, .. } = timer;
        // Recorded first: a cancel that then fails may still have taken
        // effect, but a cancelled timer's id is never left unrecorded.
        if let Some(id) = msg_id {
            self.shared.settled_ids.record(self.partition, &id, sequence).await?;
        }
        let store = self.store.clone();
        let outcome = tokio::task::spawn_blocking(move || store.cancel(handle))
            .await
            .expect("a local cancel does not panic")?;
        match outcome {
            CancelOutcome::Cancelled => {
                acknowledge(&self.shared.client, sequence, ack).await?;
                self.pending.lock().expect("index lock").settle(sequence);
                metrics::counter!("delaytier_cancelled_total").increment(1);
                Ok(CancelAnswer::Cancelled)
            }
            CancelOutcome::AlreadyDelivered => Ok(CancelAnswer::AlreadyFired),
            CancelOutcome::NotFound => Ok(CancelAnswer::NotFound),
        }
    }
}

/// Publishes a timer to the dead-letter subject of its partition
/// (`<dead_letter>.unowned` for one no partition reads), with core NATS: no
/// stream of the tier captures it (see the README), and it waits only until
/// the server has it.
pub(crate) async fn dead_letter(
    shared: &Shared,
    (stream, partition): (&str, Option<u32>),
    sequence: u64,
    source: &[(&str, &str)],
    payload: Bytes,
    kind: &'static str,
    reason: &str,
) -> Result<()> {
    let config = &shared.config;
    let subject = match partition {
        Some(partition) => config.dead_letter_subject(partition),
        None => format!("{}.unowned", config.dead_letter),
    };
    let mut headers = dead_letter_headers(stream, partition, sequence, source, reason);
    let client = &shared.client;
    let mut sent = client.publish_with_headers(subject.clone(), headers.clone(), payload.clone()).await;
    if sent.as_ref().is_err_and(|e| e.kind() == async_nats::PublishErrorKind::MaxPayloadExceeded) {
        // The added headers pushed it past the server's limit: the reason matters more.
        headers.insert(wire::DEAD_PAYLOAD, format!("dropped, {} bytes", payload.len()).as_str());
        sent = client.publish_with_headers(subject.clone(), headers, Bytes::new()).await;
    }
    sent.map_err(|e| TierError::nats(format!("publish to {subject}"), e))?;
    bounded(FLUSH_TIMEOUT, || format!("flush to {subject}"), client.flush()).await?;
    metrics::counter!("delaytier_dead_lettered_total", "reason" => kind).increment(1);
    tracing::warn!(sequence, %subject, reason, "timer moved to the dead letter");
    Ok(())
}

/// Awaits `wanted` while driving the firings under way.
async fn drive<F: Future, T: Future>(firing: &mut FuturesUnordered<F>, wanted: T) -> T::Output {
    tokio::pin!(wanted);
    loop {
        tokio::select! {
            output = &mut wanted => return output,
            Some(_) = firing.next(), if !firing.is_empty() => {}
        }
    }
}

/// Cancels a timer no owner has indexed: delete it from the stream, after
/// checking it is this partition's (a handle naming the wrong partition must
/// not delete another partition's timer).
pub(crate) async fn cancel_in_stream(
    stream: &Stream,
    prefix: &str,
    (partition, sequence): (u32, u64),
    settled_ids: Option<&SettledIds>,
) -> Result<CancelAnswer> {
    let Some(source) = pending_in_stream(stream, prefix, partition, sequence).await? else {
        return Ok(CancelAnswer::NotFound);
    };
    // As an owner does, the producer's id is recorded before the timer
    // leaves the stream: a retry inside the window is then a duplicate.
    // An id longer than an owner takes (it dead-letters the timer) is not one.
    let id = producer_msg_id(&source.headers).filter(|id| id.len() <= MAX_MSG_ID_LEN);
    if let (Some(settled_ids), Some(id)) = (settled_ids, id) {
        settled_ids.record(partition, id, sequence).await?;
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

/// The timer of `partition` the stream holds at this sequence, if it holds one.
async fn pending_in_stream(
    stream: &Stream,
    prefix: &str,
    partition: u32,
    sequence: u64,
) -> Result<Option<StreamMessage>> {
    match stream.direct_get(sequence).await {
        Ok(source) => {
            Ok((wire::partition_of_subject(prefix, &source.subject) == Some(partition)).then_some(source))
        }
        Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(None),
        Err(err) => Err(TierError::nats(format!("read timer {sequence}"), err)),
    }
}

/// The producer's `Nats-Msg-Id` of a timer (a rescheduled timer's copy
/// carries it under the tier's own header); `None` if it has none.
fn producer_msg_id(headers: &HeaderMap) -> Option<&str> {
    (headers.get(wire::MSG_ID))
        .or_else(|| headers.get(wire::RESCHEDULED_MSG_ID))
        .map(|id| id.as_str())
        .filter(|id| !id.is_empty())
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
fn put_in_batches(store: &Store, messages: Vec<Message>) -> delaywheel::Result<Vec<delaywheel::Receipt>> {
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
    message: &JsMessage,
    partition: u32,
    max_body: usize,
    policy: &TargetPolicy,
) -> std::result::Result<Indexed, Reject> {
    let (sequence, stored) = match message.info() {
        Ok(info) => (info.stream_sequence, info.published),
        Err(e) => {
            let error = TierError::nats("read a message's sequence", e);
            return Err(Reject { sequence: 0, kind: "malformed", error });
        }
    };
    let bad = |problem: &str| Reject {
        sequence,
        kind: "malformed",
        error: TierError::BadTimer { sequence, problem: problem.to_string() },
    };
    let headers = message.headers.as_ref().ok_or_else(|| bad("no headers"))?;
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
    let ack = message.reply.clone().ok_or_else(|| bad("delivered without an acknowledgement subject"))?;
    let subject = schedule.is_some().then(|| (SUBJECT_PROPERTY, message.subject.as_str()));
    let header_bytes: usize = pairs.iter().chain(&subject).map(|(n, v)| n.len() + v.len() + 8).sum();
    let local = if header_bytes <= MAX_PROPERTIES_LEN && message.payload.len() <= max_body {
        let copy = Message::new(FIRE_TOPIC, message.payload.clone());
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
    Ok(Indexed { sequence, deliver_at_ms, ack, local, msg_id, replaces, origin })
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(sequence: u64, replaces: Option<u64>, origin: Option<u64>) -> Indexed {
        let local = Message::new(FIRE_TOPIC, Bytes::new());
        let ack = async_nats::Subject::from("ack");
        Indexed { sequence, deliver_at_ms: 1, ack, local, msg_id: Some("id".into()), replaces, origin }
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
