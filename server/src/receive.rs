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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use delaywheel::{
    Clock, ConsumedMessage, Consumer, Handle, Message as StoreMessage, Store, SystemClock, poll_any,
};

use crate::proto::Code;
use crate::status::Refusal;

/// The prefix of the retry topics.
pub const RETRY_PREFIX: &str = "%RETRY%";
/// The prefix of the dead-letter topics.
pub const DLQ_PREFIX: &str = "%DLQ%";
/// Hand-outs of one message before it goes to the dead-letter topic (RocketMQ's default).
pub const MAX_DELIVERY_ATTEMPTS: u32 = 16;
/// How long one wait of a long poll lasts: between two, other receivers of
/// the group take their turn, and a server that is stopping is noticed.
const WAIT_SLICE: Duration = Duration::from_millis(250);

/// What a retry copy remembers of the message it copies.
mod property {
    pub const TOPIC: &str = "__TOPIC";
    pub const QUEUE: &str = "__QUEUE";
    pub const QUEUE_OFFSET: &str = "__QOFFSET";
    pub const STORE_MS: &str = "__STORE_MS";
    pub const DELIVER_MS: &str = "__DELIVER_MS";
    pub const ATTEMPT: &str = "__ATTEMPT";
    pub const ALL: [&str; 6] = [TOPIC, QUEUE, QUEUE_OFFSET, STORE_MS, DELIVER_MS, ATTEMPT];
}

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

/// Where a handed-out message was first stored, and which attempt this is.
pub(crate) struct Origin {
    pub topic: String,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub store_ms: u64,
    pub deliver_at_ms: Option<u64>,
    pub attempt: u32,
}

impl Origin {
    fn of(message: &ConsumedMessage) -> Self {
        let first = Self {
            topic: message.topic().to_string(),
            queue_id: message.queue_id(),
            queue_offset: message.queue_offset(),
            store_ms: message.store_time_ms(),
            deliver_at_ms: message.deliver_at_ms(),
            attempt: 1,
        };
        if !message.topic().starts_with(RETRY_PREFIX) {
            return first;
        }
        // A retry copy: what it remembers (we wrote it; anything unreadable keeps the copy's own).
        let get = |name: &str| message.properties().iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let number = |name: &str| get(name).and_then(|v| v.parse::<u64>().ok());
        Self {
            topic: get(property::TOPIC).map_or(first.topic, String::from),
            queue_id: number(property::QUEUE).map_or(first.queue_id, |q| q as u32),
            queue_offset: number(property::QUEUE_OFFSET).unwrap_or(first.queue_offset),
            store_ms: number(property::STORE_MS).unwrap_or(first.store_ms),
            deliver_at_ms: number(property::DELIVER_MS),
            attempt: number(property::ATTEMPT).map_or(2, |a| a.min(u64::from(u32::MAX)) as u32),
        }
    }

    /// A copy of `message` for `topic`, remembering this origin and `attempt`.
    fn copy(&self, message: &ConsumedMessage, topic: String, attempt: u32) -> StoreMessage {
        let mut copy = StoreMessage::new(topic, message.body().clone()).queue_id(0);
        if let Some(tags) = message.tags() {
            copy = copy.tags(tags);
        }
        if let Some(key) = message.key() {
            copy = copy.key(key);
        }
        for (name, value) in message.properties() {
            if !property::ALL.contains(&name.as_str()) {
                copy = copy.property(name, value);
            }
        }
        copy = copy
            .property(property::TOPIC, self.topic.clone())
            .property(property::QUEUE, self.queue_id.to_string())
            .property(property::QUEUE_OFFSET, self.queue_offset.to_string())
            .property(property::STORE_MS, self.store_ms.to_string())
            .property(property::ATTEMPT, attempt.to_string());
        match self.deliver_at_ms {
            Some(at) => copy.property(property::DELIVER_MS, at.to_string()),
            None => copy,
        }
    }
}

/// A group's consumers of one topic: its retry queue's first, then the topic's queues.
type Readers = Arc<Mutex<Vec<Consumer>>>;

/// The consumer groups this server knows, and their readers.
pub struct Groups {
    max_delivery_attempts: u32,
    /// Groups a client declared (by its settings or a heartbeat) or received for.
    known: Mutex<HashSet<String>>,
    readers: Mutex<HashMap<(String, String), Readers>>,
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
    /// goes to the dead-letter topic instead of coming back again.
    pub(crate) fn new(max_delivery_attempts: u32) -> Self {
        Self { max_delivery_attempts, known: Mutex::default(), readers: Mutex::default() }
    }

    pub(crate) fn max_delivery_attempts(&self) -> u32 {
        self.max_delivery_attempts
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

    fn readers(&self, store: &Store, group: &str, topic: &str) -> Result<Readers, Refusal> {
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        let key = (group.to_string(), topic.to_string());
        if let Some(found) = readers.get(&key) {
            return Ok(Arc::clone(found));
        }
        let retry = retry_topic(group, topic);
        let mut consumers = vec![store.consumer_in_group(group, &retry, 0)?];
        for queue in 0..store.queues_per_topic() {
            consumers.push(store.consumer_in_group(group, topic, queue)?);
        }
        let made = Arc::new(Mutex::new(consumers));
        readers.insert(key, Arc::clone(&made));
        Ok(made)
    }

    /// Up to `request.max` messages for the group, the retry queue's first,
    /// waiting up to `request.wait` for the first; each made invisible as
    /// the module says. Returns early, with what it has, once `stopping` is set.
    pub(crate) fn receive(
        &self,
        store: &Store,
        stopping: &AtomicBool,
        request: &Request,
    ) -> Result<Vec<Received>, Refusal> {
        let retry = retry_topic(&request.group, &request.topic);
        delaywheel::validate_topic(&retry).map_err(|_| {
            let why = "with the topic, too long for the retry topic's name";
            Refusal::field(Code::IllegalConsumerGroup, "group.name", why)
        })?;
        let readers = self.readers(store, &request.group, &request.topic)?;
        let deadline = Instant::now() + request.wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut consumers = readers.lock().unwrap_or_else(|e| e.into_inner());
            let received = self.take(store, &mut consumers, request, left.min(WAIT_SLICE))?;
            drop(consumers);
            if !received.is_empty() {
                // Outside the group's lock, so the next receive polls meanwhile. Once this
                // returns, the messages are the timers' to bring back, never the queues'.
                store.sync_offsets()?;
                return Ok(received);
            }
            if left <= WAIT_SLICE || stopping.load(Ordering::Acquire) {
                return Ok(received);
            }
        }
    }

    /// One wait of a receive: polls, puts the invisibility timers, commits
    /// the positions (in memory: the caller makes them durable).
    fn take(
        &self,
        store: &Store,
        consumers: &mut [Consumer],
        request: &Request,
        wait: Duration,
    ) -> Result<Vec<Received>, Refusal> {
        let before: Vec<u64> = consumers.iter().map(Consumer::position).collect();
        let polled = poll_any(consumers, request.max, wait)?;
        if polled.is_empty() {
            return Ok(Vec::new());
        }
        let (wanted, _filtered): (Vec<_>, Vec<_>) = polled.into_iter().partition(|m| request.filter.wants(m));
        let (live, dead): (Vec<_>, Vec<_>) = wanted
            .into_iter()
            .map(|m| (Origin::of(&m), m))
            .partition(|(o, _)| o.attempt <= self.max_delivery_attempts);
        let due = SystemClock.now_ms().saturating_add(request.invisible.as_millis() as u64);
        let retry = retry_topic(&request.group, &request.topic);
        let timers = live
            .iter()
            .map(|(origin, m)| origin.copy(m, retry.clone(), origin.attempt + 1).deliver_at_ms(due));
        let dead_letters = dead
            .iter()
            .map(|(origin, m)| origin.copy(m, format!("{DLQ_PREFIX}{}", request.group), origin.attempt));
        // Not waited for here: the caller's sync of the positions, appended after them, covers them.
        let tickets = match store.submit_batch(timers.chain(dead_letters).collect::<Vec<_>>()) {
            Ok(tickets) => tickets,
            Err(e) => {
                // Nothing was handed out: the next receive reads the same messages.
                consumers.iter_mut().zip(before).for_each(|(c, at)| c.seek(at));
                return Err(e.into());
            }
        };
        // Made durable by the caller, with the timers, before it answers.
        consumers.iter().for_each(Consumer::commit);
        let received = live.into_iter().zip(tickets).map(|((origin, message), ticket)| {
            let timer = ticket.receipt().handle().expect("an invisibility timer is a timed message");
            Received { message, origin, timer }
        });
        Ok(received.collect())
    }

    /// How far each group is behind on each queue it reads.
    pub(crate) fn lags(&self) -> Vec<Lag> {
        let readers: Vec<_> = {
            let readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
            readers.iter().map(|(key, r)| (key.clone(), Arc::clone(r))).collect()
        };
        let mut lags = Vec::new();
        for ((group, _), consumers) in readers {
            // Waits at most one wait slice of a receive.
            for consumer in consumers.lock().unwrap_or_else(|e| e.into_inner()).iter() {
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
