//! One partition while this node holds its lease: a local store rebuilt from
//! the stream (or from a checkpoint and the stream after it), and the tasks
//! that stop with the lease, one module each:
//! `ingest` (read the stream into the store), `fire` (publish the due timers,
//! a recurring schedule's next timer too), `sweep` (remove what a lost
//! acknowledgement left), `checkpoint` (write the index for the next owner,
//! and take the partition over from one) and `cancels` (answer cancels; it
//! stops last, so a cancel asked while the partition moves is answered).
//! This module holds
//! what they share: starting and stopping a partition, its local store's
//! settings, the index of its pending timers, and the steps that publish to
//! the stream or take a timer out of it.
//!
//! The stream holds exactly the pending timers, so the local store is an
//! index made fresh on every acquisition: a node never trusts timers it
//! indexed under an earlier lease, since another node may have fired them
//! meanwhile.
//!
//! The delay stream is a work queue: each partition has one durable
//! consumer, whose acknowledgement wait is a century: a timer is held
//! unacknowledged until it fires, however far ahead it is. A node taking a
//! partition keeps that consumer and starts from the last owner's
//! checkpoint (`checkpoint`, a fifth task writes it), or, where there is
//! no sound one, deletes and makes the consumer again, so every timer not
//! yet acknowledged is delivered to it.
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

mod cancels;
mod checkpoint;
mod fire;
mod ingest;
mod sweep;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, RawMessageErrorKind, Stream};
use bytes::Bytes;
use delaywheel::{Handle, Store};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::recent::Recent;
use crate::settled_ids::{RecentlySettled, SettledIds};
use crate::target::TargetPolicy;
use crate::wire::{self, Layout};
use crate::{Result, TierConfig, TierError};

use cancels::{Cancels, recent_cancels};
pub(crate) use cancels::{LeaseAtStop, cancel_in_stream};
pub(crate) use checkpoint::Checkpoints;
pub(crate) use fire::dead_letter;

/// The segment size of a partition's local store: its timers' copies go
/// in 16 MiB files, and the store faults in at most half of one ahead.
const PARTITION_SEGMENT_BYTES: u64 = 16 << 20;
/// The local store's one topic.
const FIRE_TOPIC: &str = "fire";
/// The longest `Nats-Msg-Id` a timer may carry (the store's dedup key limit):
/// it becomes a key of the settled-ids bucket.
const MAX_MSG_ID_LEN: usize = 1024;
/// How long a target known to be captured by a stream (it acknowledged, or
/// a lookup found its stream) is trusted to be, sparing the JetStream API a
/// lookup per failed publish during an outage.
const CAPTURED_FOR: Duration = Duration::from_secs(60);
/// After a stream lookup fails, how long failed publishes count as
/// transient without one (the API is likely electing its leader too).
const LOOKUPS_PAUSE: Duration = Duration::from_secs(1);
/// How long a given-up partition waits for its store to be let go of.
const STORE_RELEASE: Duration = Duration::from_secs(5);

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
    /// Where partitions' checkpoints are kept; `None` if they are off.
    pub checkpoints: Option<Checkpoints>,
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
    /// Whether it is surely still in the stream (see [`Presence`]).
    presence: Presence,
}

/// Whether an indexed timer is surely still in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Presence {
    /// Handed out by the partition's consumer to this owner, which alone
    /// acknowledges it: there until this owner fires or cancels it.
    Held,
    /// Named by the previous owner's checkpoint, or read after it by a get:
    /// that owner may have fired or cancelled it since, so it is looked up
    /// in the stream before it is fired or a cancel of it is answered.
    Unconfirmed,
}

/// What the partition's tasks share about the timers read so far.
struct Index {
    /// The timers indexed and not yet removed from the stream, by sequence.
    timers: HashMap<u64, PendingTimer>,
    /// How far the partition is read: every timer its consumer handed out
    /// at or below this sequence is indexed, left (below) or gone from the
    /// stream (the consumer hands a partition's timers out in sequence
    /// order). Raised once a batch read is all indexed or left; timers
    /// above it may be indexed already, while a batch or a takeover is
    /// under way.
    read_up_to: u64,
    /// Timers read and left unacknowledged in the stream, unindexed
    /// (malformed ones not yet moved to the dead letter, duplicates not yet
    /// removed), by sequence: a checkpoint names them for the next owner.
    left: BTreeSet<u64>,
    /// The creation time (ns since the epoch) of the consumer whose
    /// deliveries `read_up_to` counts, once the index holds all it handed
    /// out up to there: a checkpoint is written only then.
    consumer_created_ns: Option<i128>,
    /// Counts changes to what a checkpoint holds, so an idle partition
    /// writes none.
    changes: u64,
    /// The count of changes the last checkpoint this owner wrote holds.
    checkpointed: Option<u64>,
    /// How many of `timers` are [`Presence::Unconfirmed`]: the sweep does
    /// not count on them being in the stream.
    unconfirmed: usize,
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
    /// The timers cancelled lately, by the sequence the cancel named.
    cancelled: Recent<u64, ()>,
}

impl Index {
    /// An empty index, remembering settled ids for at most `dedup_window`.
    fn new(dedup_window: Duration) -> Self {
        Index {
            timers: HashMap::new(),
            read_up_to: 0,
            left: BTreeSet::new(),
            consumer_created_ns: None,
            changes: 0,
            checkpointed: None,
            unconfirmed: 0,
            fired: VecDeque::new(),
            by_msg_id: HashMap::new(),
            by_origin: HashMap::new(),
            recently_settled: RecentlySettled::new(dedup_window),
            cancelled: recent_cancels(),
        }
    }

    /// Indexes `timer`, at `sequence`.
    fn insert(&mut self, sequence: u64, timer: PendingTimer) {
        self.unconfirmed += usize::from(timer.presence == Presence::Unconfirmed);
        if let Some(replaced) = self.timers.insert(sequence, timer) {
            self.unconfirmed -= usize::from(replaced.presence == Presence::Unconfirmed);
        }
        self.changes += 1;
    }

    /// Forgets the indexed timer `sequence` (fired, cancelled or gone).
    fn remove(&mut self, sequence: u64) {
        let Some(timer) = self.timers.remove(&sequence) else { return };
        self.unconfirmed -= usize::from(timer.presence == Presence::Unconfirmed);
        self.changes += 1;
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
    /// Stopped after `tasks` (see [`Cancels`]).
    cancels: Cancels,
    /// Writes the checkpoint as the partition is given back.
    part: Part,
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
        let cancels = Cancels::start(part.clone(), cancels, span.clone());
        let final_checkpoint = part.clone();
        let mut tasks = vec![
            tokio::spawn(part.clone().fire().instrument(span.clone())),
            tokio::spawn(part.clone().sweep().instrument(span.clone())),
            tokio::spawn(part.clone().checkpoint().instrument(span.clone())),
            tokio::spawn(part.ingest().instrument(span.clone())),
        ];
        if let Some(shared) = strays {
            tasks.push(tokio::spawn(crate::strays::sweep(shared, partition).instrument(span.clone())));
        }
        if let Some(shared) = leaders {
            tasks.push(tokio::spawn(crate::leaders::spread(shared).instrument(span)));
        }
        tracing::info!(partition, "partition taken");
        Ok(OwnedPartition { partition, store, dir, tasks, cancels, part: final_checkpoint })
    }

    /// Stops the tasks, answering cancels last, and removes the local store:
    /// the stream keeps the truth. A partition given back (its lease still
    /// held) has its checkpoint written meanwhile, for the next owner.
    pub(crate) async fn stop(self, lease: LeaseAtStop) {
        for task in &self.tasks {
            task.abort();
        }
        for task in self.tasks {
            let _ = task.await;
        }
        match lease {
            LeaseAtStop::HeldUntil(until) => {
                tokio::join!(self.part.final_checkpoint(until), self.cancels.finish(lease));
            }
            LeaseAtStop::Lost => self.cancels.finish(lease).await,
        }
        drop(self.part);
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

/// A timer leaving the stream, and its producer's `Nats-Msg-Id`.
#[derive(Clone, Copy)]
struct Settled<'a> {
    sequence: u64,
    msg_id: Option<&'a str>,
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
}

/// The name of `partition`'s durable consumer.
fn consumer_name(partition: u32) -> String {
    format!("delaytier-p{partition}")
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

/// The message the stream holds at `sequence`, if it holds one. A direct
/// get is answered by any replica, and one may not have applied yet a
/// message the leader acknowledged a moment ago (a timer just published):
/// "not found" there is asked again of the leader, which has it.
pub(crate) async fn stream_message(stream: &Stream, sequence: u64) -> Result<Option<StreamMessage>> {
    match stream.direct_get(sequence).await {
        Ok(message) => return Ok(Some(message)),
        Err(err) if err.kind() == DirectGetErrorKind::NotFound => {}
        Err(err) => return Err(TierError::nats(format!("read timer {sequence}"), err)),
    }
    match stream.get_raw_message(sequence).await {
        Ok(message) => Ok(Some(message)),
        Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(err) => Err(TierError::nats(format!("read timer {sequence} at the stream's leader"), err)),
    }
}

/// Deletes a timer's message from the stream (slow: a JetStream API call);
/// false if it was gone already.
pub(crate) async fn remove_source(stream: &Stream, sequence: u64) -> Result<bool> {
    match stream.delete_message(sequence).await {
        Ok(deleted) => Ok(deleted),
        Err(err) => match stream_message(stream, sequence).await {
            Ok(None) => Ok(false),
            _ => Err(TierError::nats(format!("delete timer {sequence}"), err)),
        },
    }
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
