//! Checkpoints: an owner writes its partition's index to a JetStream object
//! store every few seconds, and as it gives the partition back, so that the next owner reads it and the stream
//! after it, instead of every pending timer (issue 43: a takeover that does
//! not grow with the partition's timers).
//!
//! A checkpoint holds, for one incarnation of the partition's durable
//! consumer (named by its creation time), the highest sequence read and,
//! for each timer read and still pending, its sequence, due time, schedule
//! origin and `Nats-Msg-Id`; the sequences read and left in the stream
//! unindexed (malformed, or duplicates not yet removed); and the timers
//! fired lately, which the sweep checks. The next owner keeps that consumer,
//! indexes the checkpoint's timers by reference (each is read from the
//! stream when it fires, and one that left the stream since is passed over),
//! reads what the consumer handed out after the checkpoint by direct gets,
//! and then pulls what it never handed out. Whatever does not check out (no
//! checkpoint, another consumer, a damaged object) means reading the whole
//! partition again, as before.
//!
//! Layout (version 1), integers little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `DWCP` |
//! | 4 | version: 1 |
//! | 4 | partition |
//! | 4 | partitions in the layout |
//! | 2 + n | the delay stream's name (length, UTF-8) |
//! | 16 | the consumer's creation time, ns since the epoch (i128) |
//! | 8 | read up to (stream sequence) |
//! | 8, 8, 8 | counts: timers, left, fired |
//! | per timer: 8 + 8 + 8 + 2 + n | sequence, due (ms), origin (0: none), `Nats-Msg-Id` (length 0: none) |
//! | 8 each | left sequences, then fired sequences |
//! | 4 | CRC32C of everything before |

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::object_store::{self, ObjectStore};
use async_nats::jetstream::stream::{DirectGetErrorKind, RawMessageErrorKind};
use async_nats::jetstream::{self};
use bytes::Bytes;
use delaywheel::Message;
use futures::StreamExt;
use tokio::io::AsyncReadExt;

use crate::error::bounded;
use crate::wire;
use crate::{Result, TierConfig, TierError};

use super::ingest::{Read, Seen};
use super::{BY_REFERENCE, FIRE_TOPIC, Part, PendingTimer, Presence, consumer_name};

/// The largest checkpoint a node reads: about 20 million timers.
const MAX_CHECKPOINT_BYTES: u64 = 1 << 30;
/// Checkpointed timers put into the local store under one hold of the index.
const CHECKPOINT_PUT_BATCH: usize = 16_384;
/// Timers one direct get of the stream after a checkpoint asks for.
const TAIL_BATCH: usize = 1024;
/// How long a call about checkpoints may take.
const CALL_LIMIT: Duration = Duration::from_secs(10);
/// How long a node taking a partition waits for another's pull request on
/// its consumer to go (a node that gave the partition up a moment ago):
/// while one waits, the consumer could hand it timers this node never sees.
const OTHERS_PULLS_GO: Duration = Duration::from_secs(2);

const MAGIC: &[u8; 4] = b"DWCP";
const VERSION: u32 = 1;
/// The fixed part of a timer's entry: sequence, due, origin, id length.
const TIMER_FIXED: usize = 8 + 8 + 8 + 2;

/// Why a partition is read whole rather than taken over from a checkpoint
/// (the `reason` label of `delaytier_checkpoint_unused_total`).
struct Unused(&'static str);

/// One pending timer in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CheckpointTimer {
    pub sequence: u64,
    pub deliver_at_ms: u64,
    /// See `PendingTimer::origin`.
    pub origin: Option<u64>,
    pub msg_id: Option<Box<str>>,
}

/// A partition's index as its owner last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Checkpoint {
    pub partition: u32,
    pub partitions: u32,
    pub stream: String,
    /// Of the consumer whose deliveries `read_up_to` counts, in ns since
    /// the epoch: a consumer made again hands everything out again.
    pub consumer_created_ns: i128,
    pub read_up_to: u64,
    pub timers: Vec<CheckpointTimer>,
    /// Read and left in the stream unindexed: read again by the next owner.
    pub left: Vec<u64>,
    /// Fired lately: the next owner's sweep checks they left the stream.
    pub fired: Vec<u64>,
}

impl Checkpoint {
    /// The object's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let ids: usize = self.timers.iter().map(|t| t.msg_id.as_deref().map_or(0, str::len)).sum();
        let size = 4
            + 4
            + 4
            + 4
            + 2
            + self.stream.len()
            + 16
            + 8
            + 24
            + self.timers.len() * TIMER_FIXED
            + ids
            + 8 * (self.left.len() + self.fired.len())
            + 4;
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.partition.to_le_bytes());
        out.extend_from_slice(&self.partitions.to_le_bytes());
        put_text(&mut out, &self.stream);
        out.extend_from_slice(&self.consumer_created_ns.to_le_bytes());
        out.extend_from_slice(&self.read_up_to.to_le_bytes());
        for count in [self.timers.len(), self.left.len(), self.fired.len()] {
            out.extend_from_slice(&(count as u64).to_le_bytes());
        }
        for timer in &self.timers {
            out.extend_from_slice(&timer.sequence.to_le_bytes());
            out.extend_from_slice(&timer.deliver_at_ms.to_le_bytes());
            out.extend_from_slice(&timer.origin.unwrap_or(0).to_le_bytes());
            put_text(&mut out, timer.msg_id.as_deref().unwrap_or(""));
        }
        for sequence in self.left.iter().chain(&self.fired) {
            out.extend_from_slice(&sequence.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(out.len(), size);
        out
    }

    /// Reads an object's bytes; `object` names it in the error. Every count
    /// is checked against the bytes there before anything is allocated.
    pub fn decode(bytes: &[u8], object: &str) -> Result<Self> {
        let bad = |problem: String| TierError::BadCheckpoint { object: object.to_string(), problem };
        let (body, crc) = bytes
            .split_last_chunk::<4>()
            .ok_or_else(|| bad(format!("{} bytes: shorter than a checksum", bytes.len())))?;
        if crc32c::crc32c(body) != u32::from_le_bytes(*crc) {
            return Err(bad(format!("checksum mismatch over its {} bytes", body.len())));
        }
        let mut r = Reader { bytes: body, at: 0 };
        if r.take(4).map_err(&bad)? != MAGIC {
            return Err(bad("no DWCP magic at offset 0: not a checkpoint".into()));
        }
        let version = r.u32().map_err(&bad)?;
        if version != VERSION {
            return Err(bad(format!("version {version}; this node reads version {VERSION}")));
        }
        let partition = r.u32().map_err(&bad)?;
        let partitions = r.u32().map_err(&bad)?;
        let stream = r.text("the stream's name").map_err(&bad)?.to_string();
        let consumer_created_ns = i128::from_le_bytes(r.array().map_err(&bad)?);
        let read_up_to = r.u64().map_err(&bad)?;
        let timers = r.u64().map_err(&bad)?;
        let left = r.u64().map_err(&bad)?;
        let fired = r.u64().map_err(&bad)?;
        // The least the counts need: a bound before any allocation.
        let least = [timers.checked_mul(TIMER_FIXED as u64), left.checked_mul(8), fired.checked_mul(8)]
            .into_iter()
            .try_fold(0u64, |sum, n| sum.checked_add(n?));
        if least.is_none_or(|least| least > r.left() as u64) {
            let why = format!("counts {timers} timers, {left} left, {fired} fired: more than its bytes hold");
            return Err(bad(why));
        }
        let mut checkpoint = Checkpoint {
            partition,
            partitions,
            stream,
            consumer_created_ns,
            read_up_to,
            timers: Vec::with_capacity(timers as usize),
            left: Vec::with_capacity(left as usize),
            fired: Vec::with_capacity(fired as usize),
        };
        for _ in 0..timers {
            let at = r.at;
            let sequence = r.u64().map_err(&bad)?;
            let deliver_at_ms = r.u64().map_err(&bad)?;
            let origin = Some(r.u64().map_err(&bad)?).filter(|&o| o != 0);
            let msg_id =
                Some(r.text("a Nats-Msg-Id").map_err(&bad)?).filter(|id| !id.is_empty()).map(Box::from);
            // What taking over relies on: one entry per timer, in order,
            // none past what was read, a schedule's first timer before it.
            let after = checkpoint.timers.last().map_or(0, |t| t.sequence);
            if sequence <= after || sequence > read_up_to || origin.is_some_and(|o| o > sequence) {
                let why = format!(
                    "timer {sequence} (origin {origin:?}) at offset {at}: out of order or past read up to {read_up_to}"
                );
                return Err(bad(why));
            }
            checkpoint.timers.push(CheckpointTimer { sequence, deliver_at_ms, origin, msg_id });
        }
        for _ in 0..left {
            checkpoint.left.push(r.u64().map_err(&bad)?);
        }
        for _ in 0..fired {
            checkpoint.fired.push(r.u64().map_err(&bad)?);
        }
        if r.left() != 0 {
            return Err(bad(format!("{} bytes after its last entry, at offset {}", r.left(), r.at)));
        }
        if let Some(past) = checkpoint.left.iter().find(|&&sequence| sequence > read_up_to) {
            return Err(bad(format!("left sequence {past} past read up to {read_up_to}")));
        }
        Ok(checkpoint)
    }
}

/// Where a tier keeps its partitions' checkpoints: one object per
/// partition, `p<partition>`, in one object store.
pub(crate) struct Checkpoints {
    store: ObjectStore,
    every: Duration,
}

impl Checkpoints {
    /// The tier's object store of checkpoints, made if this is its first
    /// node; `None` if checkpoints are off (`checkpoint_every` zero).
    pub(crate) async fn open(js: &jetstream::Context, config: &TierConfig) -> Result<Option<Self>> {
        if config.checkpoint_every.is_zero() {
            return Ok(None);
        }
        let bucket = &config.checkpoint_bucket;
        let store = match js.get_object_store(bucket).await {
            Ok(store) => store,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: bucket.clone(),
                    description: Some("delaywheel-nats: each partition's index, for its next owner".into()),
                    num_replicas: config.replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| TierError::nats(format!("create object store {bucket}"), e))?,
        };
        Ok(Some(Checkpoints { store, every: config.checkpoint_every }))
    }

    fn object(partition: u32) -> String {
        format!("p{partition}")
    }

    /// The checkpoint of `partition`, if there is one.
    async fn read(&self, partition: u32) -> Result<Option<Checkpoint>> {
        let name = Self::object(partition);
        let what = || format!("read checkpoint {name}");
        let info = match bounded(CALL_LIMIT, what, self.store.info(&name)).await {
            Ok(info) => info,
            Err(TierError::Nats { source, .. })
                if source
                    .downcast_ref::<object_store::InfoError>()
                    .is_some_and(|e| e.kind() == object_store::InfoErrorKind::NotFound) =>
            {
                return Ok(None);
            }
            Err(err) => return Err(err),
        };
        if info.size as u64 > MAX_CHECKPOINT_BYTES {
            let problem = format!("{} bytes: over the {MAX_CHECKPOINT_BYTES} a node reads", info.size);
            return Err(TierError::BadCheckpoint { object: name, problem });
        }
        let mut bytes = Vec::with_capacity(info.size);
        let read = async {
            let object = self.store.get(&name).await.map_err(async_nats::Error::from)?;
            object.take(MAX_CHECKPOINT_BYTES).read_to_end(&mut bytes).await.map_err(async_nats::Error::from)
        };
        bounded(CALL_LIMIT * 6, what, read).await?;
        let decoded = tokio::task::spawn_blocking(move || Checkpoint::decode(&bytes, &name));
        decoded.await.expect("decoding does not panic").map(Some)
    }

    async fn write(&self, partition: u32, bytes: Vec<u8>) -> Result<()> {
        let name = Self::object(partition);
        let what = || format!("write checkpoint {name}");
        bounded(CALL_LIMIT * 6, what, self.store.put(name.as_str(), &mut bytes.as_slice())).await?;
        Ok(())
    }
}

impl Part {
    /// Writes the partition's checkpoint every few seconds while the index
    /// changes.
    pub(super) async fn checkpoint(self) {
        let Some(checkpoints) = &self.shared.checkpoints else { return };
        loop {
            tokio::time::sleep(checkpoints.every).await;
            if let Err(err) = self.write_checkpoint(checkpoints).await {
                tracing::warn!(%err, "cannot write the partition's checkpoint; trying again");
            }
        }
    }

    /// Writes the partition's checkpoint as the partition is given back,
    /// unless the last one still holds, so that the next owner reads only
    /// what came after it (the periodic one can be `checkpoint_every` old):
    /// at most until `until`, when this node's lease may be gone. A
    /// checkpoint that comes too late is only older than it could be: the
    /// next owner looks up a checkpointed timer in the stream before it
    /// fires it.
    pub(super) async fn final_checkpoint(&self, until: Instant) {
        let Some(checkpoints) = &self.shared.checkpoints else { return };
        match tokio::time::timeout_at(until.into(), self.write_checkpoint(checkpoints)).await {
            Ok(Ok(true)) => tracing::debug!("checkpoint written as the partition is given back"),
            Ok(Ok(false)) => {}
            Ok(Err(err)) => tracing::warn!(%err, "cannot write the checkpoint of a partition given back"),
            Err(_) => tracing::warn!("the checkpoint of a partition given back took past its lease"),
        }
    }

    /// Writes the checkpoint if the index changed since the last one this
    /// owner wrote (and holds what its consumer handed out); whether it did.
    async fn write_checkpoint(&self, checkpoints: &Checkpoints) -> Result<bool> {
        let Some((checkpoint, changes)) = self.snapshot() else { return Ok(false) };
        let started = std::time::Instant::now();
        let timers = checkpoint.timers.len();
        let bytes = tokio::task::spawn_blocking(move || checkpoint.encode());
        let bytes = bytes.await.expect("encoding does not panic");
        let size = bytes.len();
        checkpoints.write(self.partition, bytes).await?;
        self.pending.lock().expect("index lock").checkpointed = Some(changes);
        let partition = self.partition.to_string();
        metrics::counter!("delaytier_checkpoints_written_total", "partition" => partition).increment(1);
        tracing::debug!(timers, size, took = ?started.elapsed(), "checkpoint written");
        Ok(true)
    }

    /// The index as a checkpoint, and its change count; `None` if it has
    /// not changed since the last checkpoint written, or does not yet hold
    /// what its consumer handed out up to `read_up_to`.
    fn snapshot(&self) -> Option<(Checkpoint, u64)> {
        let index = self.pending.lock().expect("index lock");
        let consumer_created_ns = index.consumer_created_ns?;
        if index.checkpointed == Some(index.changes) {
            return None;
        }
        // A timer above `read_up_to` (put or left, its batch not yet counted
        // read) is read again by the next owner, from the tail.
        let mut timers: Vec<CheckpointTimer> = index
            .timers
            .iter()
            .filter(|&(&sequence, _)| sequence <= index.read_up_to)
            .map(|(&sequence, timer)| CheckpointTimer {
                sequence,
                deliver_at_ms: timer.handle.deliver_at_ms,
                origin: timer.origin,
                msg_id: timer.msg_id.clone(),
            })
            .collect();
        let checkpoint = Checkpoint {
            partition: self.partition,
            partitions: self.shared.layout.partitions,
            stream: self.delay_stream().name.clone(),
            consumer_created_ns,
            read_up_to: index.read_up_to,
            timers: Vec::new(),
            left: index.left.range(..=index.read_up_to).copied().collect(),
            fired: index.fired.iter().map(|&(_, sequence)| sequence).collect(),
        };
        let changes = index.changes;
        drop(index);
        timers.sort_unstable_by_key(|t| t.sequence);
        Some((Checkpoint { timers, ..checkpoint }, changes))
    }

    /// Takes the partition over from its checkpoint: indexes the timers it
    /// names and those its consumer handed out after it, and returns that
    /// consumer, kept, to pull what it never handed out, with its last
    /// delivery as read here. `None`, with
    /// nothing indexed, where that cannot be done soundly: the partition
    /// is then read whole.
    pub(super) async fn resume(&self) -> Option<(PullConsumer, Seen)> {
        let started = std::time::Instant::now();
        let partition = self.partition.to_string();
        match self.try_resume().await {
            Ok(Ok((consumer, timers, seen))) => {
                metrics::counter!("delaytier_checkpoint_takeovers_total", "partition" => partition)
                    .increment(1);
                tracing::info!(timers, took = ?started.elapsed(), "partition taken over from its checkpoint");
                Some((consumer, seen))
            }
            Ok(Err(unused)) => {
                metrics::counter!("delaytier_checkpoint_unused_total", "reason" => unused.0).increment(1);
                tracing::info!(
                    why = unused.0,
                    "no checkpoint to take the partition over from: reading it whole"
                );
                None
            }
            Err(err) => {
                metrics::counter!("delaytier_checkpoint_unused_total", "reason" => "error").increment(1);
                tracing::warn!(%err, "cannot take the partition over from its checkpoint; reading it whole");
                self.forget_all().await;
                None
            }
        }
    }

    /// The kept consumer, how many timers the checkpoint named and the
    /// consumer's last delivery, or why there is no sound checkpoint to take
    /// the partition over from.
    async fn try_resume(&self) -> Result<std::result::Result<(PullConsumer, usize, Seen), Unused>> {
        let Some(checkpoints) = &self.shared.checkpoints else { return Ok(Err(Unused("off"))) };
        let Some(mut checkpoint) = checkpoints.read(self.partition).await? else {
            return Ok(Err(Unused("none")));
        };
        let stream = &self.delay_stream().stream;
        let name = consumer_name(self.partition);
        let layout = &self.shared.layout;
        if checkpoint.partition != self.partition
            || checkpoint.partitions != layout.partitions
            || checkpoint.stream != self.delay_stream().name
        {
            return Ok(Err(Unused("another_layout")));
        }
        let Ok(mut consumer) =
            stream.get_consumer::<async_nats::jetstream::consumer::pull::Config>(&name).await
        else {
            return Ok(Err(Unused("no_consumer")));
        };
        let mut info =
            consumer.info().await.map_err(|e| TierError::nats("read the partition's consumer", e))?.clone();
        if info.created.unix_timestamp_nanos() != checkpoint.consumer_created_ns {
            return Ok(Err(Unused("another_consumer")));
        }
        let deadline = tokio::time::Instant::now() + OTHERS_PULLS_GO;
        while info.num_waiting > 0 {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    waiting = info.num_waiting,
                    "another's pull request waits on the partition's consumer"
                );
                return Ok(Err(Unused("pull_waiting")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            info = consumer
                .info()
                .await
                .map_err(|e| TierError::nats("read the partition's consumer", e))?
                .clone();
        }
        let handed_out = info.delivered.stream_sequence;
        let timers = checkpoint.timers.len();
        let stream_name = checkpoint.stream.clone();
        self.index_checkpointed(&stream_name, std::mem::take(&mut checkpoint.timers), &name).await?;
        for &sequence in &checkpoint.left {
            self.take_in_got(self.get(sequence).await?.into_iter().collect(), &name).await?;
        }
        self.read_tail(checkpoint.read_up_to, handed_out, &name).await?;
        let mut index = self.pending.lock().expect("index lock");
        index.read_up_to = index.read_up_to.max(handed_out);
        index.fired.extend(checkpoint.fired.iter().map(|&sequence| (std::time::Instant::now(), sequence)));
        index.consumer_created_ns = Some(checkpoint.consumer_created_ns);
        index.changes += 1;
        let seen = Seen { consumer: info.delivered.consumer_sequence, stream: handed_out };
        Ok(Ok((consumer, timers, seen)))
    }

    /// Indexes the checkpoint's timers, each kept by reference: they were
    /// checked and deduplicated as they were first read. Each batch is put
    /// into the local store holding the index, as `put` does: a timer due
    /// at once (one that fell due while the partition had no owner) is
    /// fired only once the index knows it.
    async fn index_checkpointed(
        &self,
        stream: &str,
        timers: Vec<CheckpointTimer>,
        consumer: &str,
    ) -> Result<()> {
        let (store, pending) = (self.store.clone(), self.pending.clone());
        let (stream, consumer) = (stream.to_string(), consumer.to_string());
        let count = timers.len() as u64;
        tokio::task::spawn_blocking(move || {
            let mut timers = timers.into_iter().peekable();
            while timers.peek().is_some() {
                let batch: Vec<CheckpointTimer> = timers.by_ref().take(CHECKPOINT_PUT_BATCH).collect();
                let messages = batch.iter().map(|t| by_reference(t.sequence, t.deliver_at_ms)).collect();
                let mut index = pending.lock().expect("index lock");
                let receipts = super::ingest::put_in_batches(&store, messages)?;
                for (timer, receipt) in batch.into_iter().zip(receipts) {
                    let CheckpointTimer { sequence, msg_id, origin, .. } = timer;
                    let handle = receipt.handle().ok_or_else(|| TierError::BadTimer {
                        sequence,
                        problem: "the local store took it as an untimed message".into(),
                    })?;
                    // In sequence order: the latest timer of an id or a schedule holds it.
                    if let Some(id) = &msg_id {
                        index.by_msg_id.insert(id.clone(), sequence);
                    }
                    if let Some(origin) = origin {
                        index.by_origin.insert(origin, sequence);
                    }
                    let ack = wire::ack_subject(&stream, &consumer, sequence);
                    let presence = Presence::Unconfirmed;
                    index.insert(sequence, PendingTimer { handle, ack, msg_id, origin, presence });
                }
            }
            Ok::<_, TierError>(())
        })
        .await
        .expect("a local put does not panic")?;
        metrics::counter!("delaytier_indexed_total").increment(count);
        Ok(())
    }

    /// The timer at `sequence`, if it is still in the stream, as a replica
    /// answering a direct get has it (one that fired and left a moment ago
    /// may still be there: see [`in_stream`](Self::in_stream)).
    pub(super) async fn get(&self, sequence: u64) -> Result<Option<StreamMessage>> {
        match self.delay_stream().stream.direct_get(sequence).await {
            Ok(message) => Ok(Some(message)),
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(err) => Err(TierError::nats(format!("read timer {sequence}"), err)),
        }
    }

    /// The timer at `sequence`, if it is still in the stream, as its
    /// leader has it: whether a timer the previous owner may have just
    /// fired or cancelled (an acknowledgement a replica may not have
    /// applied yet) is still pending.
    pub(super) async fn in_stream(&self, sequence: u64) -> Result<Option<StreamMessage>> {
        match self.delay_stream().stream.get_raw_message(sequence).await {
            Ok(message) => Ok(Some(message)),
            Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(err) => Err(TierError::nats(format!("read timer {sequence}"), err)),
        }
    }

    /// Checks and indexes timers got from the stream (by reference); one
    /// on another partition's subject is not this partition's to take.
    async fn take_in_got(&self, got: Vec<StreamMessage>, consumer: &str) -> Result<()> {
        let stream = &self.delay_stream().name;
        let prefix = &self.shared.layout.prefix;
        let ours =
            |m: &&StreamMessage| wire::partition_of_subject(prefix, &m.subject) == Some(self.partition);
        let reads = got.iter().filter(ours).map(|m| Read::got(m, stream, consumer)).collect();
        self.take_in(reads, Presence::Unconfirmed).await
    }

    /// Reads the partition's timers after `after` up to `up_to` (those its
    /// consumer handed out since the checkpoint, or to another's pull
    /// request: see [`Seen`]), in batches of direct gets, and then asks the
    /// stream's leader for the next one, since a replica answering a direct
    /// get may not have the newest yet.
    pub(super) async fn read_tail(&self, after: u64, up_to: u64, consumer: &str) -> Result<()> {
        let mut next = after + 1;
        while next <= up_to {
            let got: Vec<StreamMessage> = self.get_batch(next).await?;
            let Some(last) = got.last().map(|m| m.sequence) else { break };
            let within: Vec<StreamMessage> = got.into_iter().filter(|m| m.sequence <= up_to).collect();
            self.take_in_got(within, consumer).await?;
            next = last + 1;
        }
        let filter = wire::partition_filter(&self.shared.layout.prefix, self.partition);
        let stream = &self.delay_stream().stream;
        while next <= up_to {
            match stream.get_first_raw_message_by_subject(&filter, next).await {
                Ok(message) if message.sequence < next => {
                    let why = format!("the leader answered sequence {} for {next} on", message.sequence);
                    return Err(TierError::nats("read the partition after its checkpoint", why));
                }
                Ok(message) if message.sequence <= up_to => {
                    next = message.sequence + 1;
                    self.take_in_got(vec![message], consumer).await?;
                }
                Ok(_) => break,
                Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(err) => return Err(TierError::nats("read the partition after its checkpoint", err)),
            }
        }
        Ok(())
    }

    /// Up to `TAIL_BATCH` of the partition's timers from `from` on, by one
    /// batched direct get (nats-server 2.11 or later).
    async fn get_batch(&self, from: u64) -> Result<Vec<StreamMessage>> {
        let client = &self.shared.client;
        let failed = |e: async_nats::Error| TierError::nats("read the partition after its checkpoint", e);
        let inbox = client.new_inbox();
        let mut replies = client.subscribe(inbox.clone()).await.map_err(|e| failed(e.into()))?;
        let filter = wire::partition_filter(&self.shared.layout.prefix, self.partition);
        let request = serde_json::json!({"seq": from, "next_by_subj": filter, "batch": TAIL_BATCH});
        let subject = format!("$JS.API.DIRECT.GET.{}", self.delay_stream().name);
        let payload = Bytes::from(request.to_string());
        client.publish_with_reply(subject, inbox, payload).await.map_err(|e| failed(e.into()))?;
        let mut got: Vec<StreamMessage> = Vec::new();
        loop {
            let reply = match tokio::time::timeout(CALL_LIMIT, replies.next()).await {
                Ok(Some(reply)) => reply,
                Ok(None) => return Err(failed("the reply subscription ended".into())),
                Err(elapsed) => return Err(failed(elapsed.into())),
            };
            match reply.status.map(|s| s.as_u16()) {
                None => {
                    let message = StreamMessage::try_from(reply).map_err(|e| failed(e.into()))?;
                    // In order, from `from` on, and no more than asked for:
                    // else the server is not answering this request.
                    let after = got.last().map_or(from.saturating_sub(1), |m| m.sequence);
                    if message.sequence <= after || got.len() >= TAIL_BATCH {
                        let why = format!("direct get answered sequence {} after {after}", message.sequence);
                        return Err(failed(why.into()));
                    }
                    got.push(message);
                }
                // The end of the batch, or nothing (more) to read.
                Some(204 | 404) => return Ok(got),
                Some(status) => {
                    let why = reply.description.unwrap_or_default();
                    return Err(failed(format!("direct get answered {status} {why}").into()));
                }
            }
        }
    }
}

/// The local timer of a timer read from the stream when it fires.
fn by_reference(sequence: u64, deliver_at_ms: u64) -> Message {
    Message::new(FIRE_TOPIC, Bytes::new())
        .tags(BY_REFERENCE)
        .deliver_at_ms(deliver_at_ms)
        .key(sequence.to_string())
}

fn put_text(out: &mut Vec<u8>, text: &str) {
    debug_assert!(text.len() <= u16::MAX as usize, "names and ids are checked shorter");
    out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// Reads a checkpoint's fields in order; each error names the offset.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len());
        let end = end.ok_or_else(|| format!("cut short at offset {} (wanted {n} bytes more)", self.at))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn text(&mut self, what: &str) -> std::result::Result<&'a str, String> {
        let at = self.at;
        let len = u16::from_le_bytes(self.array()?) as usize;
        std::str::from_utf8(self.take(len)?).map_err(|_| format!("{what} at offset {at} is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            partition: 3,
            partitions: 8,
            stream: "DELAY".into(),
            consumer_created_ns: 1_765_000_000_123_456_789,
            read_up_to: 42,
            timers: vec![
                CheckpointTimer { sequence: 7, deliver_at_ms: 1_765_000_001_000, origin: None, msg_id: None },
                CheckpointTimer {
                    sequence: 40,
                    deliver_at_ms: 1_765_000_002_000,
                    origin: Some(9),
                    msg_id: Some("order-42".into()),
                },
            ],
            left: vec![12],
            fired: vec![30, 31],
        }
    }

    #[test]
    fn a_checkpoint_reads_back_as_written() {
        let bytes = sample().encode();
        assert_eq!(Checkpoint::decode(&bytes, "p3").unwrap(), sample());
        let empty = Checkpoint { timers: vec![], left: vec![], fired: vec![], ..sample() };
        assert_eq!(Checkpoint::decode(&empty.encode(), "p3").unwrap(), empty);
    }

    /// The golden bytes of the layout in the module's comment.
    #[test]
    fn the_layout_is_the_documented_one() {
        let one = Checkpoint {
            timers: vec![CheckpointTimer {
                sequence: 5,
                deliver_at_ms: 6,
                origin: Some(2),
                msg_id: Some("x".into()),
            }],
            left: vec![],
            fired: vec![9],
            ..sample()
        };
        let bytes = one.encode();
        let mut want = Vec::new();
        want.extend_from_slice(b"DWCP");
        want.extend_from_slice(&[1, 0, 0, 0, 3, 0, 0, 0, 8, 0, 0, 0, 5, 0]);
        want.extend_from_slice(b"DELAY");
        want.extend_from_slice(&1_765_000_000_123_456_789i128.to_le_bytes());
        want.extend_from_slice(&42u64.to_le_bytes());
        for n in [1u64, 0, 1, 5, 6, 2] {
            want.extend_from_slice(&n.to_le_bytes());
        }
        want.extend_from_slice(&[1, 0, b'x']);
        want.extend_from_slice(&9u64.to_le_bytes());
        assert_eq!(&bytes[..bytes.len() - 4], &want[..]);
        assert_eq!(bytes[bytes.len() - 4..], crc32c::crc32c(&want).to_le_bytes());
    }

    /// A flipped byte, a cut, a count that claims more than the bytes, a
    /// newer version: each an error naming what is wrong, nothing allocated
    /// for a count the bytes cannot hold.
    #[test]
    fn a_damaged_checkpoint_is_refused_saying_why() {
        let bytes = sample().encode();
        let problem = |bytes: &[u8]| match Checkpoint::decode(bytes, "p3") {
            Err(TierError::BadCheckpoint { object, problem }) => {
                assert_eq!(object, "p3");
                problem
            }
            other => panic!("expected a bad checkpoint, got {other:?}"),
        };
        let mut flipped = bytes.clone();
        flipped[60] ^= 1;
        assert!(problem(&flipped).contains("checksum"), "{}", problem(&flipped));
        assert!(problem(&bytes[..bytes.len() - 9]).contains("checksum"));
        assert!(problem(&[1, 2]).contains("shorter than a checksum"));
        let sealed = |mut body: Vec<u8>| {
            let crc = crc32c::crc32c(&body);
            body.extend_from_slice(&crc.to_le_bytes());
            body
        };
        let body = &bytes[..bytes.len() - 4];
        let mut huge = body.to_vec();
        let counts_at = 4 + 4 + 4 + 4 + 2 + 5 + 16 + 8;
        huge[counts_at..counts_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(problem(&sealed(huge)).contains("more than its bytes hold"));
        let mut newer = body.to_vec();
        newer[4] = 2;
        assert!(problem(&sealed(newer)).contains("version 2"));
        assert!(problem(&sealed(b"JUNKJUNK".to_vec())).contains("magic"));
        let mut longer = body.to_vec();
        longer.push(0);
        assert!(problem(&sealed(longer)).contains("after its last entry"));
        // Sound bytes that say what cannot be: each refused, naming it.
        let mut reversed = sample();
        reversed.timers.reverse();
        assert!(problem(&reversed.encode()).contains("timer 7"), "{}", problem(&reversed.encode()));
        let past = Checkpoint { read_up_to: 39, ..sample() };
        assert!(problem(&past.encode()).contains("timer 40"));
        let mut later_origin = sample();
        later_origin.timers[1].origin = Some(41);
        assert!(problem(&later_origin.encode()).contains("origin Some(41)"));
        let left_past = Checkpoint { left: vec![43], ..sample() };
        assert!(problem(&left_past.encode()).contains("left sequence 43"));
    }
}
