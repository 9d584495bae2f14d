//! The copies a hand-out writes: a message's invisibility timer (its retry
//! copy, due when the invisible duration ends) and, after its last attempt,
//! its dead letter; and what both remember of where the message came from,
//! so that the copy of a copy still names the original.

use delaywheel::{ConsumedMessage, Message as StoreMessage};

use crate::fifo;
use crate::receive::{DLQ_PREFIX, RETRY_PREFIX};

/// What a retry copy remembers of the message it copies.
mod property {
    pub const TOPIC: &str = "__TOPIC";
    pub const QUEUE: &str = "__QUEUE";
    pub const QUEUE_OFFSET: &str = "__QOFFSET";
    pub const STORE_MS: &str = "__STORE_MS";
    pub const DELIVER_MS: &str = "__DELIVER_MS";
    pub const ATTEMPT: &str = "__ATTEMPT";
    /// Why a message went to the dead-letter topic.
    pub const DEAD_REASON: &str = "__DLQ_REASON";
    pub const ALL: [&str; 7] = [TOPIC, QUEUE, QUEUE_OFFSET, STORE_MS, DELIVER_MS, ATTEMPT, DEAD_REASON];
    /// What a dead letter's reader sees of where it came from (RocketMQ's
    /// names, user properties: they stay with the letter through its own retries).
    pub const DLQ_ORIGIN_TOPIC: &str = "DLQ_ORIGIN_TOPIC";
    pub const DLQ_ORIGIN_MESSAGE_ID: &str = "DLQ_ORIGIN_MESSAGE_ID";
    /// The longest origin message id a dead letter names.
    pub const MAX_ORIGIN_ID_LEN: usize = 128;

    /// The longest reason a dead letter gives.
    pub const MAX_REASON_LEN: usize = 128;

    /// What the properties above take at most, encoded (4 bytes of lengths
    /// each, the name, the longest value: a topic, `u32` and `u64` in decimal).
    pub const RESERVED_LEN: usize = {
        const fn entry(name: &str, value: usize) -> usize {
            4 + name.len() + value
        }
        entry(TOPIC, delaywheel::MAX_TOPIC_LEN)
            + entry(QUEUE, 10)
            + entry(QUEUE_OFFSET, 20)
            + entry(STORE_MS, 20)
            + entry(DELIVER_MS, 20)
            + entry(ATTEMPT, 10)
            + entry(DEAD_REASON, MAX_REASON_LEN)
            + entry(DLQ_ORIGIN_TOPIC, delaywheel::MAX_TOPIC_LEN)
            + entry(DLQ_ORIGIN_MESSAGE_ID, MAX_ORIGIN_ID_LEN)
    };
}

/// The most a sent message's properties may take, encoded: the store's limit
/// less what a retry copy or a dead letter adds, so every message a send
/// accepts can be handed out and, at its end, dead-lettered.
pub const MAX_SENT_PROPERTIES_LEN: usize = delaywheel::MAX_PROPERTIES_LEN - property::RESERVED_LEN;

/// Where a handed-out message was first stored, and which attempt this is.
pub(crate) struct Origin {
    pub topic: String,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub store_ms: u64,
    pub deliver_at_ms: Option<u64>,
    pub attempt: u32,
    /// Whether it is a FIFO message (it has a message group).
    pub fifo: bool,
}

impl Origin {
    pub(crate) fn of(message: &ConsumedMessage) -> Self {
        let first = Self {
            topic: message.topic().to_string(),
            queue_id: message.queue_id(),
            queue_offset: message.queue_offset(),
            store_ms: message.store_time_ms(),
            deliver_at_ms: message.deliver_at_ms(),
            attempt: 1,
            fifo: is_fifo(message),
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
            fifo: first.fifo,
        }
    }

    /// A copy of `message` for `topic`, remembering this origin and
    /// `attempt`, keeping of the message's own properties those `keep` says
    /// but for those named in `renamed` (the caller sets them anew).
    fn copy(
        &self,
        message: &ConsumedMessage,
        topic: String,
        attempt: u32,
        keep: Keep,
        renamed: &[&str],
    ) -> StoreMessage {
        let mut copy = StoreMessage::new(topic, message.body().clone()).queue_id(0);
        if let Some(tags) = message.tags() {
            copy = copy.tags(tags);
        }
        if let Some(key) = message.key() {
            copy = copy.key(key);
        }
        for (name, value) in message.properties() {
            if !property::ALL.contains(&name.as_str())
                && !renamed.contains(&name.as_str())
                && keep.keeps(name)
            {
                copy = copy.property(name, value);
            }
        }
        if keep.keeps(crate::occurrences::SCHEDULE) {
            for (name, value) in crate::occurrences::properties(message) {
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

    /// The invisibility timer of `message`, due at `due_ms` in `retry`, or
    /// `None` when its properties leave no room for the copy's own (a
    /// message stored by other means than a send, which checks that room).
    pub(crate) fn retry_timer(
        &self,
        message: &ConsumedMessage,
        retry: &str,
        due_ms: u64,
    ) -> Option<StoreMessage> {
        let mut timer =
            self.copy(message, retry.to_string(), self.attempt + 1, Keep::All, &[]).deliver_at_ms(due_ms);
        if self.fifo {
            // Names the queue it blocks among the retry topic's pending timers (see `fifo`).
            timer = timer.key(fifo::marker(self.queue_id));
        }
        fits(&timer).then_some(timer)
    }

    /// The dead letter of `message` for `group`, saying why and naming its
    /// origin's topic and message id. A message whose properties leave no
    /// room for the copy's loses its user properties, then the server's,
    /// rather than stay where it blocks the others.
    pub(crate) fn dead_letter(&self, message: &ConsumedMessage, group: &str, reason: &str) -> StoreMessage {
        use property::{DLQ_ORIGIN_MESSAGE_ID, DLQ_ORIGIN_TOPIC};
        let reason = reason.get(..property::MAX_REASON_LEN).unwrap_or(reason);
        let id = message.properties().iter().find(|(k, _)| k == crate::send::property::MESSAGE_ID);
        let id = id.map_or("", |(_, id)| id.as_str());
        let id = id.get(..property::MAX_ORIGIN_ID_LEN).unwrap_or(id);
        let letter = |keep| {
            let renamed = [DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID];
            self.copy(message, format!("{DLQ_PREFIX}{group}"), self.attempt, keep, &renamed)
                .property(property::DEAD_REASON, reason)
                .property(DLQ_ORIGIN_TOPIC, self.topic.clone())
                .property(DLQ_ORIGIN_MESSAGE_ID, id)
        };
        [Keep::All, Keep::Server].into_iter().map(letter).find(fits).unwrap_or_else(|| letter(Keep::None))
    }
}

/// Which of a message's own properties a copy keeps.
#[derive(Clone, Copy)]
enum Keep {
    All,
    /// Only the server's (`__`: the message id, born time and host, keys).
    Server,
    None,
}

impl Keep {
    fn keeps(self, name: &str) -> bool {
        match self {
            Self::All => true,
            Self::Server => name.starts_with("__"),
            Self::None => false,
        }
    }
}

/// Whether `message` is a FIFO message (it has a message group).
pub(crate) fn is_fifo(message: &ConsumedMessage) -> bool {
    message.properties().iter().any(|(name, _)| name == crate::send::property::MESSAGE_GROUP)
}

/// Whether the store takes `message`'s properties.
fn fits(message: &StoreMessage) -> bool {
    message.properties_len() <= delaywheel::MAX_PROPERTIES_LEN
}

/// Why a message that gets no invisibility timer goes to the dead-letter
/// topic, its group allowing `attempts` hand-outs.
pub(crate) fn dead_reason(origin: &Origin, attempts: u32) -> String {
    if origin.attempt > attempts {
        format!("not acknowledged after {attempts} hand-outs")
    } else {
        "its properties leave no room for a retry copy's".to_string()
    }
}
