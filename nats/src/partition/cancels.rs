//! Cancels: the owner decides, so a timer being fired is never also
//! reported cancelled; without an owner, a client removes the timer itself.

use std::time::{Duration, Instant};

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::Stream;
use delaywheel::CancelOutcome;
use futures::StreamExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::recent::Recent;
use crate::settled_ids::SettledIds;
use crate::wire::{self, CancelAnswer};
use crate::{Result, TierError};

use super::{
    MAX_MSG_ID_LEN, Part, PendingTimer, Presence, acknowledge, producer_msg_id, remove_source, stream_message,
};

/// How long a cancel of a timer not read yet waits for this node to read it.
const CANCEL_WAITS_FOR_INGEST: Duration = Duration::from_secs(2);
/// How long an owner remembers the timers it cancelled, so a client asking
/// again (its first answer late or lost) hears `Cancelled` again: longer
/// than a client's three tries of 5 s.
const REMEMBER_CANCELS: Duration = Duration::from_secs(60);

/// The task that answers a partition's cancels. It stops last, once nothing
/// fires, and while the lease is surely still this node's it answers the
/// cancels that reached it before it unsubscribed. A request can still be
/// lost as the partition moves (async-nats drops what arrives for a
/// subscription just closed, and the cluster what it routed to a server
/// that has just dropped the interest): the client asks again.
pub(super) struct Cancels {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// Whether this node still holds the partition's lease as it stops it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseAtStop {
    /// Given back: this node is the one judge of its cancels until then
    /// (well inside the lease, which is not renewed while it stops).
    HeldUntil(Instant),
    /// Lost: another node may own it and fire already. The cancels on their
    /// way are not answered (an answer of ours could beat the new owner's).
    Lost,
}

impl Cancels {
    pub(super) fn start(part: Part, requests: async_nats::Subscriber, span: tracing::Span) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(part.answer_cancels(requests, stopped).instrument(span));
        Cancels { stop, task }
    }

    /// Stops answering. Called once the partition's other tasks have
    /// stopped, so the local store, which nothing fires from any more,
    /// judges alone; with the lease held, answers what reached this node
    /// before it unsubscribed, until the lease's `HeldUntil`.
    pub(super) async fn finish(self, lease: LeaseAtStop) {
        let Cancels { stop, mut task } = self;
        if let LeaseAtStop::HeldUntil(until) = lease {
            let _ = stop.send(());
            if tokio::time::timeout_at(until.into(), &mut task).await.is_ok() {
                return;
            }
            tracing::warn!("cancels still being answered as the lease runs short; the rest are asked again");
        }
        task.abort();
        let _ = task.await;
    }
}

/// The sequences a partition's owner cancelled in the last [`REMEMBER_CANCELS`].
pub(super) fn recent_cancels() -> Recent<u64, ()> {
    Recent::new(REMEMBER_CANCELS)
}

/// Whether a cancel may wait for the ingest to read its timer: not once
/// the partition is stopping, when nothing reads it any more.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ingest {
    Running,
    Stopped,
}

impl Part {
    /// Answers cancels of this partition's timers while it is ours; told to
    /// stop, unsubscribes and answers what reached this node before that.
    async fn answer_cancels(self, mut requests: async_nats::Subscriber, mut stop: oneshot::Receiver<()>) {
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => break,
                request = requests.next() => match request {
                    Some(request) => self.answer_cancel(request, Ingest::Running).await,
                    None => return,
                },
            }
        }
        // Unsubscribes; async-nats ends the subscription at its next turn,
        // handing over what it has read by then.
        if let Err(err) = requests.drain().await {
            tracing::warn!(%err, "cannot unsubscribe from cancels; those on their way are asked again");
            return;
        }
        while let Some(request) = requests.next().await {
            self.answer_cancel(request, Ingest::Stopped).await;
        }
    }

    async fn answer_cancel(&self, request: async_nats::Message, ingest: Ingest) {
        let Some(reply) = request.reply else { return };
        if let Err(refused) = self.shared.policy.check_reply(&reply) {
            tracing::warn!(%refused, "a cancel not answered");
            return;
        }
        let sequence = std::str::from_utf8(&request.payload).ok().and_then(|s| s.parse().ok());
        let answer = match sequence {
            Some(sequence) => match self.cancel(sequence, ingest).await {
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
    ///
    /// A timer this owner cancelled lately answers `Cancelled` again.
    async fn cancel(&self, sequence: u64, ingest: Ingest) -> Result<CancelAnswer> {
        let deadline = Instant::now() + CANCEL_WAITS_FOR_INGEST;
        let mut checked_in_stream = false;
        // The schedule's timer that was firing as it was cancelled.
        let mut firing = None;
        loop {
            let (current, read_past) = {
                let index = self.pending.lock().expect("index lock");
                if index.cancelled.get(&sequence).is_some() {
                    return Ok(CancelAnswer::Cancelled);
                }
                (index.current(sequence, firing), index.read_up_to >= sequence)
            };
            match current {
                Some((at, timer)) => {
                    let recurs = timer.origin.is_some();
                    match self.cancel_indexed(at, timer).await? {
                        CancelAnswer::AlreadyFired if recurs => firing = Some(at),
                        CancelAnswer::Cancelled => {
                            self.pending.lock().expect("index lock").cancelled.insert(sequence, ());
                            return Ok(CancelAnswer::Cancelled);
                        }
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
            if ingest == Ingest::Stopped {
                let partition = self.partition;
                return Err(TierError::Owner(format!(
                    "timer {sequence} is not read yet and partition {partition} is moving to another node; cancel again"
                )));
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
        let PendingTimer { handle, ack, msg_id, presence, origin } = timer;
        // A timer from a checkpoint may have been fired or cancelled by the
        // previous owner: acknowledging it again would answer `Cancelled`.
        // (Asked of the stream's leader: a replica may not have applied
        // that owner's acknowledgement yet.) A recurring schedule's timer
        // answers as one that fired: its next timer is looked for.
        if presence == Presence::Unconfirmed && self.in_stream(sequence).await?.is_none() {
            self.pending.lock().expect("index lock").remove(sequence);
            return Ok(match origin {
                Some(_) => CancelAnswer::AlreadyFired,
                None => CancelAnswer::NotFound,
            });
        }
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

/// The timer of `partition` the stream holds at this sequence, if it holds
/// one (a timer published a moment ago included: see [`stream_message`]).
async fn pending_in_stream(
    stream: &Stream,
    prefix: &str,
    partition: u32,
    sequence: u64,
) -> Result<Option<StreamMessage>> {
    let source = stream_message(stream, sequence).await?;
    Ok(source.filter(|source| wire::partition_of_subject(prefix, &source.subject) == Some(partition)))
}
