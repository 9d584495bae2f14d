//! What a producer uses: schedule a timer, cancel or reschedule it by handle,
//! from any process connected to the cluster.

use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::{self};
use async_nats::{HeaderMap, RequestErrorKind};
use bytes::Bytes;

use crate::config::{DEFAULT_DEAD_LETTER, DEFAULT_DEDUP_BUCKET};
use crate::headers::header_pairs;
use crate::nats_schedule::NatsSchedule;
use crate::partition::{cancel_in_stream, remove_source, stream_message};
use crate::settled_ids::SettledIds;
use crate::target::TargetPolicy;
use crate::wire::{self, CancelAnswer, Layout, TimerHandle};
use crate::{Result, TierError};

/// How long a cancel waits for the partition's owner, each time it asks.
const OWNER_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a cancel asks before it gives up: a request sent as the
/// partition moves can be lost in the cluster, unanswered (the old owner's
/// server has dropped its interest before the requester's server learns of
/// it), and asking again reaches the new owner, or no one.
const OWNER_TRIES: u32 = 3;
/// How many times a timer with a `Nats-Msg-Id` is published, at most,
/// while the delay stream does not answer (see [`TierClient::publish`]).
const PUBLISH_TRIES: u32 = 4;
/// The wait before publishing it again: a stream leader's election takes
/// about a second or two.
const PUBLISH_RETRY: Duration = Duration::from_millis(500);

/// Whether a publish failed for want of an answer from the stream, not
/// because the stream refused it.
fn unanswered_publish(kind: PublishErrorKind) -> bool {
    matches!(kind, PublishErrorKind::TimedOut | PublishErrorKind::StreamNotFound)
}

/// What [`TierClient::reschedule`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RescheduleAnswer {
    /// The timer fires at the new time, under this new handle, and never at
    /// the old one.
    Rescheduled(TimerHandle),
    /// Too late: it has fired.
    AlreadyFired,
    /// No such pending timer.
    NotFound,
}

/// A producer's view of the tier.
#[derive(Clone)]
pub struct TierClient {
    client: async_nats::Client,
    js: jetstream::Context,
    layout: Layout,
    /// The delay streams, by index.
    streams: Vec<Stream>,
    dedup_bucket: String,
}

impl TierClient {
    /// A client of the tier whose delay stream is `stream`, on
    /// `<prefix>.<partition>.>` split into `partitions` (the nodes' settings).
    pub async fn new(
        client: async_nats::Client,
        stream: &str,
        prefix: &str,
        partitions: u32,
    ) -> Result<Self> {
        Self::with_layout(client, Layout::new(stream, prefix, partitions)).await
    }

    /// A client of the tier laid out as `layout` (the nodes' settings: see
    /// [`crate::TierConfig::layout`]), whose streams exist.
    pub async fn with_layout(client: async_nats::Client, layout: Layout) -> Result<Self> {
        if layout.partitions == 0 || !(1..=layout.partitions).contains(&layout.streams) {
            let why = format!("partitions {}, streams {}", layout.partitions, layout.streams);
            return Err(TierError::Config(format!("{why}: need 1 ..= streams ..= partitions")));
        }
        let js = jetstream::new(client.clone());
        let mut streams = Vec::new();
        for index in 0..layout.streams {
            let name = layout.stream_name(index);
            let found = js.get_stream(&name).await;
            streams.push(found.map_err(|e| TierError::nats(format!("find stream {name}"), e))?);
        }
        Ok(TierClient { client, js, layout, streams, dedup_bucket: DEFAULT_DEDUP_BUCKET.into() })
    }

    /// The delay stream that holds `partition`'s timers.
    fn stream_of(&self, partition: u32) -> &Stream {
        &self.streams[self.layout.stream_index(partition) as usize]
    }

    /// For a tier whose nodes keep settled `Nats-Msg-Id`s in another bucket
    /// than [`DEFAULT_DEDUP_BUCKET`] ([`crate::TierConfig::dedup_bucket`]):
    /// a cancel this client makes itself records its timer's id there.
    pub fn with_dedup_bucket(mut self, bucket: &str) -> Self {
        self.dedup_bucket = bucket.into();
        self
    }

    /// Schedules `payload` to be published to `target` at `deliver_at_ms`
    /// (epoch ms; a time past fires at once). One `key`'s timers share a
    /// partition. Returns once the stream has it (replicated). A target the
    /// tier never publishes to (see [`crate::target`]) is refused with
    /// [`TierError::BadTarget`].
    pub async fn schedule(
        &self,
        key: &str,
        target: &str,
        deliver_at_ms: u64,
        payload: Bytes,
    ) -> Result<TimerHandle> {
        self.schedule_with_headers(key, target, deliver_at_ms, HeaderMap::new(), payload).await
    }

    /// [`schedule`](Self::schedule) with headers of the caller's, which the
    /// fired message carries.
    pub async fn schedule_with_headers(
        &self,
        key: &str,
        target: &str,
        deliver_at_ms: u64,
        mut headers: HeaderMap,
        payload: Bytes,
    ) -> Result<TimerHandle> {
        // The nodes check again (anyone can publish a timer by hand); this
        // tells an honest producer at once, naming the header.
        TargetPolicy::new(&self.layout.prefix, DEFAULT_DEAD_LETTER, Vec::new())
            .check(target)
            .map_err(|reason| TierError::BadTarget { header: wire::TARGET, reason })?;
        let partition = wire::partition_of(key.as_bytes(), self.layout.partitions);
        headers.insert(wire::TARGET, target);
        headers.insert(wire::DELIVER_AT, deliver_at_ms.to_string().as_str());
        let subject = wire::timer_subject(&self.layout.prefix, partition, "timer");
        let sequence = self.publish(subject, headers, payload).await?;
        Ok(TimerHandle { partition, sequence })
    }

    /// Publishes a timer to the delay stream; its sequence. One with a
    /// `Nats-Msg-Id` is published again where the stream did not answer
    /// (its leader stepping down: the publish timed out, or had no
    /// responders), up to [`PUBLISH_TRIES`] times: the stream keeps one
    /// message per id within its duplicate window, and answers a second
    /// publish with the first's sequence. Without an id, a publish that
    /// timed out may or may not have been kept, so the error is the caller's.
    async fn publish(&self, subject: String, headers: HeaderMap, payload: Bytes) -> Result<u64> {
        let retry = headers.get(wire::MSG_ID).is_some();
        let mut tries = 1;
        loop {
            let sent = self.js.publish_with_headers(subject.clone(), headers.clone(), payload.clone()).await;
            let acked = match sent {
                Ok(pending) => pending.await,
                Err(err) => Err(err),
            };
            match acked {
                Ok(ack) => return Ok(ack.sequence),
                Err(err) if retry && tries < PUBLISH_TRIES && unanswered_publish(err.kind()) => {
                    tracing::debug!(%err, tries, "the delay stream did not answer a publish; publishing again");
                    tries += 1;
                    tokio::time::sleep(PUBLISH_RETRY).await;
                }
                Err(err) => return Err(TierError::nats(format!("publish to {subject}"), err)),
            }
        }
    }

    /// Cancels a timer. Its partition's owner decides (so a timer being
    /// fired is never also reported cancelled); with no owner running, no
    /// one can fire it, and the client deletes it from the stream itself,
    /// first recording its producer's `Nats-Msg-Id` as settled, as an owner
    /// does (if a node made the bucket of settled ids).
    ///
    /// An owner that does not answer in 5 s is asked again, twice (so a
    /// cancel may take 15 s): the owner answers a timer it cancelled lately
    /// `Cancelled` again, but if the partition moved meanwhile and the timer
    /// is gone, whether the unanswered ask cancelled it or it fired is not
    /// known, and that is an error that says so.
    pub async fn cancel(&self, handle: TimerHandle) -> Result<CancelAnswer> {
        if handle.partition >= self.layout.partitions {
            return Ok(CancelAnswer::NotFound);
        }
        let subject = wire::cancel_subject(&self.layout.stream, handle.partition);
        let mut tries = 0;
        let answer = loop {
            tries += 1;
            let request = async_nats::Request::new()
                .payload(handle.sequence.to_string().into())
                .timeout(Some(OWNER_TIMEOUT));
            break match self.client.send_request(subject.clone(), request).await {
                Ok(reply) => CancelAnswer::parse(&reply.payload)?,
                Err(err) if err.kind() == RequestErrorKind::NoResponders => {
                    let settled_ids = SettledIds::find(&self.js, &self.dedup_bucket).await?;
                    let timer = (handle.partition, handle.sequence);
                    let stream = self.stream_of(handle.partition);
                    cancel_in_stream(stream, &self.layout.prefix, timer, settled_ids.as_ref()).await?
                }
                Err(err) if err.kind() == RequestErrorKind::TimedOut && tries < OWNER_TRIES => {
                    tracing::warn!(%handle, tries, "no answer from the partition's owner; asking again");
                    continue;
                }
                Err(err) => return Err(TierError::nats(format!("ask the owner on {subject}"), err)),
            };
        };
        if answer == CancelAnswer::NotFound && tries > 1 {
            return Err(TierError::Owner(format!(
                "timer {handle} is gone, and an earlier ask got no answer: that ask cancelled it, or it fired"
            )));
        }
        Ok(answer)
    }

    /// Moves a timer to `deliver_at_ms`: publishes a copy due then, and
    /// cancels the original; if the original fired first, the copy is
    /// removed and the answer says so.
    pub async fn reschedule(&self, handle: TimerHandle, deliver_at_ms: u64) -> Result<RescheduleAnswer> {
        let stream = self.stream_of(handle.partition);
        // Asked of the leader too if a replica has not got it: a timer
        // published a moment ago is there to be moved.
        let Some(source) = stream_message(stream, handle.sequence).await? else {
            return Ok(RescheduleAnswer::NotFound);
        };
        if wire::partition_of_subject(&self.layout.prefix, &source.subject) != Some(handle.partition) {
            return Ok(RescheduleAnswer::NotFound);
        }
        // A recurring schedule's timers follow its recurrence, and a cancel
        // of its handle stops the whole schedule.
        let pairs: Vec<(&str, &str)> = header_pairs(&source.headers).collect();
        if NatsSchedule::read(&pairs).is_ok_and(|schedule| schedule.is_some_and(|s| s.repeats())) {
            let problem = "a recurring schedule's timer: cancel the schedule and publish it again".into();
            return Err(TierError::BadTimer { sequence: handle.sequence, problem });
        }
        // The copy is the same timer, moved: it keeps its producer's id under
        // the tier's own header, and names the timer it replaces.
        let mut headers = HeaderMap::new();
        for (name, value) in header_pairs(&source.headers) {
            if name.eq_ignore_ascii_case(wire::MSG_ID) {
                headers.insert(wire::RESCHEDULED_MSG_ID, value);
            } else {
                headers.append(name, value);
            }
        }
        headers.insert(wire::DELIVER_AT, deliver_at_ms.to_string().as_str());
        headers.insert(wire::REPLACES, handle.sequence.to_string().as_str());
        let copy = TimerHandle {
            partition: handle.partition,
            sequence: self.publish(source.subject.to_string(), headers, source.payload).await?,
        };
        let answer = self.cancel(handle).await;
        let undo = || async {
            remove_source(stream, copy.sequence).await?;
            Ok::<_, TierError>(())
        };
        match answer {
            Ok(CancelAnswer::Cancelled) => Ok(RescheduleAnswer::Rescheduled(copy)),
            Ok(CancelAnswer::AlreadyFired) => undo().await.map(|()| RescheduleAnswer::AlreadyFired),
            Ok(CancelAnswer::NotFound) => undo().await.map(|()| RescheduleAnswer::NotFound),
            Err(err) => {
                undo().await?;
                Err(err)
            }
        }
    }
}
