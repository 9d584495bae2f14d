//! Firing the due timers: publish each to its target (a recurring
//! schedule's next timer to the delay stream too), then acknowledge it; and
//! the dead letter, where a timer that cannot be fired goes (the ingest
//! buries a malformed one there too).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream;
use async_nats::jetstream::context::{GetStreamByNameErrorKind, PublishError, PublishErrorKind};
use bytes::Bytes;
use delaywheel::ConsumedMessage;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::bounded;
use crate::headers::{
    Occurrence, borrowed_pairs, dead_letter_headers, fired_headers, owned_pairs, successor_headers, target_of,
};
use crate::nats_schedule::NatsSchedule;
use crate::wire::{self, TimerHandle};
use crate::{Result, TierError};

use super::{
    BY_REFERENCE, FIRE_TOPIC, Part, PendingTimer, Presence, SUBJECT_PROPERTY, Settled, Shared, acknowledge,
    now_ms, publish_acked,
};

/// Fired timers published at once (a timer waiting to be tried again holds
/// no lane, so those behind it go on).
const FIRE_CONCURRENCY: usize = 128;
/// Timers taken from the local store and not done yet (firing or waiting
/// to be tried again), at most: during an outage the rest wait in the local
/// store, not in memory.
const MAX_FIRING: usize = 4096;
/// The longest a dead letter's publish may take to reach the server.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// Fired timers remembered for the sweep, at most.
const MAX_REMEMBERED: usize = 1 << 20;

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

/// Why a try to fire a timer failed.
enum Failure {
    /// The tier will not publish to its target.
    Refused(String),
    /// Its target will never acknowledge it.
    Undeliverable(String),
    /// It may work later: the cluster or the connection is in trouble.
    Transient(TierError),
}

impl Part {
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

    /// Takes the local store's deliveries and fires each, at most
    /// `FIRE_CONCURRENCY` at once and `MAX_FIRING` under way. The local store is only an index, so its
    /// position is committed once a timer's firing has started: the stream
    /// keeps the timer until that firing ends. The firings are futures of
    /// this task, not tasks of their own, so when the partition is given up
    /// aborting this task ends them all before its store is closed.
    pub(super) async fn fire(self) {
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
        let Some(PendingTimer { ack, msg_id, origin, presence, .. }) = pending else {
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
        // One the previous owner may have just fired is asked of the leader.
        let got = match presence {
            Presence::Held => self.get(sequence).await?,
            Presence::Unconfirmed => self.in_stream(sequence).await?,
        };
        match got {
            Some(message) => {
                let source = owned_pairs(&message.headers);
                let subject = Some(message.subject.to_string());
                Ok(Some(Due { ack, msg_id, source, payload: message.payload, subject, origin }))
            }
            None => {
                self.pending.lock().expect("index lock").remove(sequence);
                metrics::counter!("delaytier_skipped_total").increment(1);
                // Deleted from the stream by hand, or fired or cancelled by
                // the previous owner after its checkpoint.
                Ok(None)
            }
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
    pub(super) async fn bury(
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
