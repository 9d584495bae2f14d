//! Cancels: the owner decides, so a timer being fired is never also
//! reported cancelled; without an owner, a client removes the timer itself.

use std::time::{Duration, Instant};

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, Stream};
use delaywheel::CancelOutcome;
use futures::StreamExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::settled_ids::SettledIds;
use crate::wire::{self, CancelAnswer};
use crate::{Result, TierError};

use super::{MAX_MSG_ID_LEN, Part, PendingTimer, acknowledge, producer_msg_id, remove_source};

/// How long a cancel of a timer not read yet waits for this node to read it.
const CANCEL_WAITS_FOR_INGEST: Duration = Duration::from_secs(2);
/// How long a partition being given up goes on answering the cancels sent
/// to it before it stopped listening (one may wait for the ingest, above).
const CANCELS_DRAIN: Duration = Duration::from_secs(5);

/// The task that answers a partition's cancels. It stops last, once nothing
/// fires: a cancel asked while the partition moves is answered by this node,
/// by the next owner, or (between the two) by the client in the stream,
/// never left unanswered to time out.
pub(super) struct Cancels {
    stop: oneshot::Sender<LeaseAtStop>,
    task: JoinHandle<()>,
}

/// Whether this node still holds the partition's lease as it stops it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseAtStop {
    /// Given back: this node is still the one judge of its cancels.
    Held,
    /// Lost: another node may own it already and fire; the cancels on
    /// their way are answered with an error that says to ask again.
    Lost,
}

impl Cancels {
    pub(super) fn start(part: Part, requests: async_nats::Subscriber, span: tracing::Span) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(part.answer_cancels(requests, stopped).instrument(span));
        Cancels { stop, task }
    }

    /// Stops listening and answers the cancels already on their way. Called
    /// once the partition's other tasks have stopped, so the local store,
    /// which nothing fires from any more, judges them alone.
    pub(super) async fn finish(self, lease: LeaseAtStop) {
        let Cancels { stop, mut task } = self;
        let _ = stop.send(lease);
        if tokio::time::timeout(CANCELS_DRAIN, &mut task).await.is_err() {
            tracing::warn!("cancels still being answered after {CANCELS_DRAIN:?}; the rest time out");
            task.abort();
            let _ = task.await;
        }
    }
}

impl Part {
    /// Answers cancels of this partition's timers while it is ours; told to
    /// stop, unsubscribes and answers what the server sent before that.
    async fn answer_cancels(
        self,
        mut requests: async_nats::Subscriber,
        mut stop: oneshot::Receiver<LeaseAtStop>,
    ) {
        let lease = loop {
            tokio::select! {
                biased;
                lease = &mut stop => break lease.unwrap_or(LeaseAtStop::Lost),
                request = requests.next() => match request {
                    Some(request) => self.answer_cancel(request, LeaseAtStop::Held).await,
                    None => return,
                },
            }
        };
        // Draining unsubscribes, then ends the subscription once the server
        // has confirmed it: what it sent before is still read.
        if let Err(err) = requests.drain().await {
            tracing::warn!(%err, "cannot unsubscribe from cancels; those on their way time out");
            return;
        }
        while let Some(request) = requests.next().await {
            self.answer_cancel(request, lease).await;
        }
    }

    async fn answer_cancel(&self, request: async_nats::Message, lease: LeaseAtStop) {
        let Some(reply) = request.reply else { return };
        if let Err(refused) = self.shared.policy.check_reply(&reply) {
            tracing::warn!(%refused, "a cancel not answered");
            return;
        }
        let sequence = std::str::from_utf8(&request.payload).ok().and_then(|s| s.parse().ok());
        let answer = match sequence {
            Some(_) if lease == LeaseAtStop::Lost => {
                format!("error: partition {} has moved to another node; cancel again", self.partition)
            }
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
