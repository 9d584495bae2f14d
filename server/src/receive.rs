//! Receiving, acking and invisibility: RocketMQ 5's SimpleConsumer model on
//! the store's queues and its timing wheel.
//!
//! A group reads a topic through one [`Consumer`] per queue, plus one for
//! its **retry topic** `%RETRY%<group>|<topic>`. Handing a message out:
//! 1. appends a copy of it (body and properties, plus where it came from and
//!    the attempt that comes next) to the retry topic as a timer due when
//!    the invisible duration ends: the *invisibility timer*;
//! 2. commits the group's positions past the message and makes them durable
//!    ([`Store::sync_offsets`], which appends them to the commit log after
//!    the timers and waits for the log's group commit: the timers are on
//!    disk no later than the positions that pass their messages). The
//!    group's lock covers only the appends and the commit, so the next
//!    receive of the group polls while this one waits for the disk;
//! 3. answers, with a receipt handle naming the invisibility timer.
//!
//! A receive that finds nothing waits without a thread: on watches of the
//! group's queues ([`QueueWatch`]), its deadline and the server's stop, and
//! it ends with its client (the service drops it). One receive hands out at
//! most [`MAX_RECEIVE_BYTES`] of bodies; the rest waits for the next.
//!
//! An ack cancels the timer; `ChangeInvisibleDuration` reschedules it; if
//! neither comes in time, the timer fires and the copy appears in the retry
//! queue, which a receive reads first, as attempt + 1. Every step is the
//! store's own, persisted: after a crash, a message acked before it is never
//! handed out again (its timer is cancelled and the position is on disk), a
//! message not acked comes back once per expiry, and a crash between steps 1
//! and 2 can only hand out again a message no client has seen. After
//! [`MAX_DELIVERY_ATTEMPTS`] hand-outs (or as configured) the message goes to
//! the group's dead-letter topic `%DLQ%<group>` instead, as a plain message
//! with the retry properties (where it came from, and the attempt it would
//! have been).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use delaywheel::{Clock, ConsumedMessage, Consumer, Handle, QueueWatch, Store, SystemClock};

pub use crate::copies::MAX_SENT_PROPERTIES_LEN;
use crate::copies::{Origin, dead_reason, is_fifo};
use crate::fifo::Blocks;
use crate::proto::Code;
use crate::status::Refusal;

/// The prefix of the retry topics.
pub const RETRY_PREFIX: &str = "%RETRY%";
/// The prefix of the dead-letter topics.
pub const DLQ_PREFIX: &str = "%DLQ%";
/// Hand-outs of one message before it goes to the dead-letter topic (RocketMQ's default).
pub const MAX_DELIVERY_ATTEMPTS: u32 = 16;
/// Messages a receive asks for when it names no number (`batch_size` 0: a
/// PushConsumer takes its batch from the settings answer, which says this).
/// RocketMQ's proxy says 32; each receive costs a group commit, and at 20 k
/// messages/s PushConsumer-style receivers saw p99 lateness 28-94 ms with 32
/// and 10-12 ms with 128 (`delaywheel grpc-load --push`, side by side).
pub const DEFAULT_BATCH: usize = 128;
/// Long poll when the request names none (the clients' default, and the settings answer's).
pub const DEFAULT_LONG_POLL: Duration = Duration::from_secs(20);
/// Most body bytes one receive hands out (a larger message still goes, alone):
/// what an answer holds in memory until the client reads it.
pub const MAX_RECEIVE_BYTES: usize = 4 << 20;
/// A group's readers of a topic unused this long are dropped (their
/// positions are committed; a later receive makes them again).
const IDLE_READERS: Duration = Duration::from_secs(300);

/// The retry topic of `group` for `topic`. Group names hold no `|`, so no
/// two (group, topic) pairs share one.
pub fn retry_topic(group: &str, topic: &str) -> String {
    format!("{RETRY_PREFIX}{group}|{topic}")
}

/// One receive: who asks, for what, and how long the messages stay invisible.
pub(crate) struct Request {
    pub group: String,
    pub topic: String,
    pub max: usize,
    pub invisible: Duration,
    pub wait: Duration,
    pub filter: Filter,
}

/// Which messages a receive wants, by tag (RocketMQ's TAG expressions: `*`, or `a || b`).
pub(crate) enum Filter {
    All,
    Tags(Vec<String>),
}

impl Filter {
    pub fn parse(expression: &str) -> Self {
        let tags: Vec<String> =
            expression.split("||").map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect();
        if tags.is_empty() || tags.iter().any(|t| t == "*") { Self::All } else { Self::Tags(tags) }
    }

    fn wants(&self, message: &ConsumedMessage) -> bool {
        match self {
            Self::All => true,
            Self::Tags(tags) => message.tags().is_some_and(|tag| tags.iter().any(|t| t == tag)),
        }
    }
}

/// A message handed out, and the timer that brings it back unless acked.
pub(crate) struct Received {
    pub message: ConsumedMessage,
    pub origin: Origin,
    pub timer: Handle,
}

/// A group's readers of one topic: its consumers (the retry queue's first,
/// then the topic's queues) behind the group's lock, and watches on their
/// queues that a waiting receive uses without the lock.
pub(crate) struct Readers {
    consumers: Mutex<Vec<Consumer>>,
    watches: Vec<QueueWatch>,
    /// The queues a FIFO message out blocks ([`fifo`]).
    blocks: Blocks,
    last_used: Mutex<Instant>,
}

/// What a receive saw before it looked: [`Readers::changed`] waits for more.
pub(crate) struct Seen {
    entries: Vec<u64>,
    releases: u64,
}

impl Readers {
    fn new(consumers: Vec<Consumer>, blocks: Blocks) -> Self {
        let watches = consumers.iter().map(Consumer::watch).collect();
        Self { consumers: Mutex::new(consumers), watches, blocks, last_used: Mutex::new(Instant::now()) }
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used.lock().unwrap_or_else(|e| e.into_inner()).elapsed()
    }

    /// How many entries each queue has now, and how often a blocked queue opened.
    fn seen(&self) -> Seen {
        Seen {
            entries: self.watches.iter().map(QueueWatch::entries).collect(),
            releases: self.blocks.releases(),
        }
    }

    /// Completes once some queue has more entries, or a blocked queue opened, since `seen`.
    pub async fn changed(&self, seen: &Seen) {
        tokio::select! {
            () = self.grown(&seen.entries) => {}
            () = self.blocks.opened_since(seen.releases) => {}
        }
    }

    /// Completes once some queue has more entries than `seen` says.
    fn grown<'a>(&'a self, seen: &'a [u64]) -> impl Future<Output = ()> + 'a {
        std::future::poll_fn(move |cx| {
            let more = || self.watches.iter().zip(seen).any(|(w, &seen)| w.entries() > seen);
            if more() {
                return Poll::Ready(());
            }
            self.watches.iter().for_each(|w| w.wake_on_append(cx.waker()));
            // An append between the look and the registration woke nobody.
            if more() { Poll::Ready(()) } else { Poll::Pending }
        })
    }
}

/// The consumer groups this server knows, and their readers.
pub struct Groups {
    max_delivery_attempts: u32,
    /// Groups (by the store's name) with a number of their own.
    attempts_of_group: HashMap<String, u32>,
    /// See [`IDLE_READERS`].
    idle_readers: Duration,
    /// Groups a client declared (by its settings or a heartbeat) or received for.
    known: Mutex<HashSet<String>>,
    readers: Mutex<HashMap<(String, String), Arc<Readers>>>,
}

/// How far one group is behind on one queue.
pub(crate) struct Lag {
    pub group: String,
    pub topic: String,
    pub queue: u32,
    pub behind: u64,
}

impl Groups {
    /// No groups yet; a message handed out `max_delivery_attempts` times
    /// (or as many as `attempts_of_group` says for its group) goes to the
    /// dead-letter topic instead of coming back again.
    pub(crate) fn new(max_delivery_attempts: u32, attempts_of_group: HashMap<String, u32>) -> Self {
        Self {
            max_delivery_attempts,
            attempts_of_group,
            idle_readers: IDLE_READERS,
            known: Mutex::default(),
            readers: Mutex::default(),
        }
    }

    /// Hand-outs of one message to `group` before it goes to the dead letters.
    pub(crate) fn max_delivery_attempts(&self, group: &str) -> u32 {
        self.attempts_of_group.get(group).copied().unwrap_or(self.max_delivery_attempts)
    }

    /// Records that a client of `group` exists.
    pub(crate) fn know(&self, group: &str) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if !known.contains(group) {
            known.insert(group.to_string());
        }
    }

    /// `Ok` for a well-formed group that a client declared (by its settings
    /// or a heartbeat) or received for, since this server started.
    pub(crate) fn check(&self, group: &str, field: &str) -> Result<(), Refusal> {
        check_group(group, field)?;
        if self.known.lock().unwrap_or_else(|e| e.into_inner()).contains(group) {
            return Ok(());
        }
        let why =
            format!("{group:?} is unknown: no client of it sent its settings, a heartbeat or a receive");
        Err(Refusal::field(Code::ConsumerGroupNotFound, field, why))
    }

    /// The readers of `request`'s group and topic, made on first use. Those
    /// of other pairs unused for [`IDLE_READERS`] are dropped meanwhile.
    pub(crate) fn readers(&self, store: &Store, request: &Request) -> Result<Arc<Readers>, Refusal> {
        let retry = retry_topic(&request.group, &request.topic);
        delaywheel::validate_topic(&retry).map_err(|_| {
            let why = "with the topic, too long for the retry topic's name";
            Refusal::field(Code::IllegalConsumerGroup, "group.name", why)
        })?;
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        let key = (request.group.clone(), request.topic.clone());
        if let Some(found) = readers.get(&key) {
            found.touch();
            return Ok(Arc::clone(found));
        }
        // Nobody else holds an idle pair's readers: no receive is under way on them.
        readers.retain(|_, r| Arc::strong_count(r) > 1 || r.idle_for() < self.idle_readers);
        let mut consumers = vec![store.consumer_in_group(&request.group, &retry, 0)?];
        for queue in 0..store.queues_per_topic() {
            consumers.push(store.consumer_in_group(&request.group, &request.topic, queue)?);
        }
        let blocks = Blocks::recovered(store, &retry, store.queues_per_topic())?;
        let made = Arc::new(Readers::new(consumers, blocks));
        readers.insert(key, Arc::clone(&made));
        Ok(made)
    }

    /// Up to `request.max` messages for the group from `readers` (the retry
    /// queue's first) without waiting, each made invisible as the module
    /// says; with them, how many entries each queue had before the look, for
    /// [`Readers::changed`]. The positions are committed in memory: the caller
    /// makes them durable ([`Store::sync_offsets`]) before it answers.
    pub(crate) fn take_now(
        &self,
        store: &Store,
        readers: &Readers,
        request: &Request,
    ) -> Result<(Vec<Received>, Seen), Refusal> {
        readers.touch();
        let seen = readers.seen();
        let mut consumers = readers.consumers.lock().unwrap_or_else(|e| e.into_inner());
        let received = self.take(store, &mut consumers, &readers.blocks, request)?;
        Ok((received, seen))
    }

    /// The readers of `group` and `topic`, if a receive made them.
    fn made(&self, group: &str, topic: &str) -> Option<Arc<Readers>> {
        let readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        readers.get(&(group.to_string(), topic.to_string())).cloned()
    }

    /// The message of `timer` was acked: the queue its FIFO message blocked opens.
    pub(crate) fn acked(&self, group: &str, topic: &str, timer: Handle) {
        if let Some(readers) = self.made(group, topic) {
            readers.blocks.acked(timer);
        }
    }

    /// Marks the message of `timer` for the dead-letter topic when it comes
    /// back (the caller brings its timer due); `false` if no receive of the
    /// group made readers of the topic since the server started.
    pub(crate) fn forward(&self, group: &str, topic: &str, timer: Handle) -> bool {
        self.made(group, topic).map(|readers| readers.blocks.forward(timer)).is_some()
    }

    /// One look: polls, puts the invisibility timers, commits the positions
    /// (in memory: the caller makes them durable).
    fn take(
        &self,
        store: &Store,
        consumers: &mut [Consumer],
        blocks: &Blocks,
        request: &Request,
    ) -> Result<Vec<Received>, Refusal> {
        let before: Vec<u64> = consumers.iter().map(Consumer::position).collect();
        let polled = poll_open(consumers, blocks, request.max)?;
        let polled = within_budget(consumers, polled);
        let polled = one_fifo_per_queue(consumers, polled);
        if polled.is_empty() {
            return Ok(Vec::new());
        }
        let due = SystemClock.now_ms().saturating_add(request.invisible.as_millis() as u64);
        let retry = retry_topic(&request.group, &request.topic);
        // One copy per wanted message: its invisibility timer, or its dead letter.
        let mut copies = Vec::new();
        let mut handed_out = Vec::new();
        let mut opened = Vec::new();
        for message in polled.into_iter().filter(|m| request.filter.wants(m)) {
            let origin = Origin::of(&message);
            let forwarded = blocks.take_forwarded(message.log_offset());
            let attempts = self.max_delivery_attempts(&request.group);
            let timer = (!forwarded && origin.attempt <= attempts)
                .then(|| origin.retry_timer(&message, &retry, due))
                .flatten();
            match timer {
                Some(timer) => {
                    copies.push(timer);
                    handed_out.push(Some((origin, message)));
                }
                None => {
                    let reason = if forwarded {
                        "forwarded by its consumer".into()
                    } else {
                        dead_reason(&origin, attempts)
                    };
                    copies.push(origin.dead_letter(&message, &request.group, &reason));
                    if origin.fifo {
                        opened.push(origin.queue_id);
                    }
                    handed_out.push(None);
                }
            }
        }
        // Not waited for here: the caller's sync of the positions, appended after them, covers them.
        let tickets = match store.submit_batch(copies) {
            Ok(tickets) => tickets,
            Err(e) => {
                // Nothing was handed out: the next receive reads the same messages.
                consumers.iter_mut().zip(before).for_each(|(c, at)| c.seek(at));
                return Err(e.into());
            }
        };
        // Made durable by the caller, with the timers, before it answers.
        consumers.iter().for_each(Consumer::commit);
        let received: Vec<_> = handed_out
            .into_iter()
            .zip(tickets)
            .filter_map(|(handed_out, ticket)| {
                let (origin, message) = handed_out?;
                let timer = ticket.receipt().handle().expect("an invisibility timer is a timed message");
                Some(Received { message, origin, timer })
            })
            .collect();
        // Before the group's lock is let go, so the next receive sees them.
        opened.into_iter().for_each(|queue| blocks.dead(queue));
        for r in received.iter().filter(|r| r.origin.fifo) {
            blocks.hand_out(r.origin.queue_id, r.timer);
        }
        Ok(received)
    }

    /// How far each group is behind on each queue it reads.
    pub(crate) fn lags(&self) -> Vec<Lag> {
        let readers: Vec<_> = {
            let readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
            readers.iter().map(|(key, r)| (key.clone(), Arc::clone(r))).collect()
        };
        let mut lags = Vec::new();
        for ((group, _), readers) in readers {
            // Waits at most one look of a receive.
            for consumer in readers.consumers.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                lags.push(Lag {
                    group: group.clone(),
                    topic: consumer.topic().to_string(),
                    queue: consumer.queue_id(),
                    // A position never passes the queue's end (and the end only grows).
                    behind: consumer.queue_len() - consumer.position(),
                });
            }
        }
        lags
    }
}

/// Up to `max` messages from the consumers whose queues no FIFO message
/// blocks, the retry queue's (the first) first: it holds what blocks the others.
fn poll_open(
    consumers: &mut [Consumer],
    blocks: &Blocks,
    max: usize,
) -> delaywheel::Result<Vec<ConsumedMessage>> {
    let mut polled = Vec::new();
    for (at, consumer) in consumers.iter_mut().enumerate() {
        if polled.len() >= max {
            break;
        }
        if at > 0 && blocks.blocked(consumer.queue_id()) {
            continue;
        }
        polled.extend(consumer.poll(max - polled.len(), Duration::ZERO)?);
    }
    Ok(polled)
}

/// `polled` up to and including each topic queue's first FIFO message: a
/// queue's next FIFO message waits for the one before (see `fifo`). Each
/// consumer that read past what is kept moves back to its first message left.
fn one_fifo_per_queue(consumers: &mut [Consumer], polled: Vec<ConsumedMessage>) -> Vec<ConsumedMessage> {
    let mut stopped = HashSet::new();
    let mut kept = Vec::with_capacity(polled.len());
    for message in polled {
        // Retry copies are never held back: a FIFO one is what blocks its queue.
        let from_topic = !message.topic().starts_with(RETRY_PREFIX);
        if from_topic && stopped.contains(&message.queue_id()) {
            put_back(consumers, &message);
            continue;
        }
        if from_topic && is_fifo(&message) {
            stopped.insert(message.queue_id());
        }
        kept.push(message);
    }
    kept
}

/// Moves the consumer of `left` back to it, unless it is already there or before.
fn put_back(consumers: &mut [Consumer], left: &ConsumedMessage) {
    let reader = consumers.iter_mut().find(|c| c.topic() == left.topic() && c.queue_id() == left.queue_id());
    // A consumer's messages come in its queue's order: its first left is its lowest.
    if let Some(reader) = reader.filter(|c| c.position() > left.queue_offset()) {
        reader.seek(left.queue_offset());
    }
}

/// The first messages of `polled` whose bodies add up to at most
/// [`MAX_RECEIVE_BYTES`] (at least one); each consumer that read past them
/// moves back to its first message left, which the next receive reads.
fn within_budget(consumers: &mut [Consumer], mut polled: Vec<ConsumedMessage>) -> Vec<ConsumedMessage> {
    let mut bytes = 0;
    let over = polled.iter().position(|m| {
        bytes += m.body().len();
        bytes > MAX_RECEIVE_BYTES
    });
    let Some(keep) = over.map(|at| at.max(1)) else { return polled };
    for left in polled.drain(keep..) {
        put_back(consumers, &left);
    }
    polled
}

/// A topic a consumer may read: any a producer may send to, and the
/// dead-letter topics (`%DLQ%<group>`), which only the server writes.
pub(crate) fn check_readable_topic(topic: &str, field: &str) -> Result<(), Refusal> {
    match topic.strip_prefix(DLQ_PREFIX) {
        Some(group) => {
            delaywheel::validate_topic(topic).map_err(|e| Refusal::field(Code::IllegalTopic, field, e))?;
            check_group(group, field).map_err(|r| Refusal::new(Code::IllegalTopic, r.message))
        }
        None => crate::send::check_topic(topic, field),
    }
}

/// A group name: the topics' alphabet without `|` (it separates group and
/// topic in the retry topic's name), and not starting with `%`.
pub(crate) fn check_group(group: &str, field: &str) -> Result<(), Refusal> {
    let bad = |why: String| Err(Refusal::field(Code::IllegalConsumerGroup, field, why));
    if let Err(e) = delaywheel::validate_topic(group) {
        return bad(e.to_string().replace("topic", "group"));
    }
    if group.contains('|') || group.starts_with('%') {
        return bad(format!("{group:?}: a group has no | and does not start with %"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(group: &str, topic: &str) -> Request {
        Request {
            group: group.into(),
            topic: topic.into(),
            max: 32,
            invisible: Duration::from_secs(30),
            wait: Duration::ZERO,
            filter: Filter::All,
        }
    }

    #[test]
    fn idle_readers_are_dropped_busy_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(delaywheel::Config::new(dir.path()).with_queues_per_topic(2)).unwrap();
        let groups =
            Groups { idle_readers: Duration::ZERO, ..Groups::new(MAX_DELIVERY_ATTEMPTS, HashMap::new()) };
        let busy = groups.readers(&store, &request("G0", "T")).unwrap();
        for n in 1..100 {
            groups.readers(&store, &request(&format!("G{n}"), "T")).unwrap();
        }
        let count = || groups.readers.lock().unwrap().len();
        assert_eq!(count(), 2, "the last one made and the one a receive holds");
        drop(busy);
        groups.readers(&store, &request("G100", "T")).unwrap();
        assert_eq!(count(), 1);
        store.close().unwrap();
    }
}
