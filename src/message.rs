//! What users put and what consumers get back.

use std::num::{NonZeroU16, NonZeroU64};
use std::time::Duration;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::format::record::{
    DEDUP_PROPERTY, MessageFields, REPLACES_PROPERTY, Timing, dedup_property_len, properties_len,
};
pub use crate::receipt::{Handle, Receipt, Written};
use crate::timer::levels::DelayLevels;

pub use crate::format::record::{MAX_KEY_LEN, MAX_PROPERTIES_LEN, MAX_TAGS_LEN, MAX_TOPIC_LEN};

/// A message to put: a topic, a body, and optional routing and metadata.
#[derive(Debug, Clone)]
pub struct Message {
    pub(crate) topic: String,
    pub(crate) queue_id: Option<u32>,
    pub(crate) key: Option<String>,
    pub(crate) tags: Option<String>,
    pub(crate) properties: Vec<(String, String)>,
    pub(crate) body: Bytes,
    pub(crate) timing: When,
    /// A recurring schedule's record (`Store::schedule` alone sets it): its
    /// spec is in its properties, and each occurrence delivers it.
    pub(crate) schedule: bool,
    /// The dedup key, written as the property [`DEDUP_PROPERTY`] (see `dedup.rs`).
    pub(crate) dedup_key: Option<String>,
}

/// A checked timed message to write in place of a pending timer
/// (`Store::put_replacing`), by the ticking thread, which alone can tell
/// the timer is still pending as it writes.
#[derive(Debug)]
pub(crate) struct Replacement {
    pub message: Message,
    pub queue_id: u32,
    pub timing: Timing,
}

/// What the ticking thread did with a [`Replacement`].
#[derive(Debug)]
pub(crate) enum ReplaceAnswer {
    /// Written in place of the timer: the new message's receipt, and the
    /// replacement back, freed by the caller's thread (whose allocator
    /// made it) rather than the ticking thread.
    Written(Receipt, Box<Replacement>),
    /// The timer was not pending: nothing written, and the replacement
    /// comes back for the caller to look again or put.
    NotPending(Box<Replacement>),
    /// Not written: the log is at its size cap (the error says so). The
    /// replacement comes back for the caller to wait for retention and ask
    /// again, as a put waits.
    OverSizeCap(Box<Replacement>, Error),
}

impl Replacement {
    /// Writes the record of the message, naming `replaced` (`offset@deliver_at_ms`).
    pub fn fields<'a>(&'a self, store_time_ms: u64, replaced: &'a str) -> MessageFields<'a> {
        MessageFields { replaces: replaced, ..self.message.fields(self.queue_id, store_time_ms, self.timing) }
    }
}

/// When a message should be delivered, as the producer asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum When {
    #[default]
    Now,
    At(u64),
    After(Duration),
    Level(u16),
    /// More than one timing option was set: refused at put.
    Conflict,
}

/// The latest deliver time accepted: the last millisecond of the year 9999.
pub const MAX_DELIVER_AT_MS: u64 = 253_402_300_799_999;

impl Message {
    /// A message for `topic`, delivered at once unless timed.
    pub fn new(topic: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            queue_id: None,
            key: None,
            tags: None,
            properties: Vec::new(),
            body: body.into(),
            timing: When::Now,
            schedule: false,
            dedup_key: None,
        }
    }

    /// Deliver at this wall-clock time (epoch ms). A time in the past means
    /// now. The message is a timer whatever the time: it has a handle, and
    /// its receipt and consumers report its deliver time, except that 0 is
    /// kept as 1 (0 marks an ordinary message on disk), so
    /// `deliver_at_ms(0)` comes back as `Some(1)`.
    pub fn deliver_at_ms(self, epoch_ms: u64) -> Self {
        self.timed(When::At(epoch_ms))
    }

    /// Deliver this long after the message is stored.
    pub fn delay(self, delay: Duration) -> Self {
        self.timed(When::After(delay))
    }

    /// Deliver after legacy delay level `level` (1-based, from the configured table).
    pub fn delay_level(self, level: u16) -> Self {
        self.timed(When::Level(level))
    }

    fn timed(mut self, when: When) -> Self {
        self.timing = if self.timing == When::Now { when } else { When::Conflict };
        self
    }

    /// Puts the message on this queue of its topic (otherwise the key picks one, or queue 0).
    pub fn queue_id(mut self, queue_id: u32) -> Self {
        self.queue_id = Some(queue_id);
        self
    }

    /// A business key; without an explicit queue id it also picks the queue, so
    /// messages with one key stay in order.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// A dedup key (1 to [`MAX_KEY_LEN`] bytes), unlike the routing
    /// [`key`](Self::key) unique per topic: while a message put with the same
    /// topic and dedup key stands, a put of this one writes nothing and
    /// answers the first one's receipt, marked
    /// [`is_duplicate`](Receipt::is_duplicate). It stands while its timer is
    /// pending and for the dedup window after
    /// ([`Config::with_dedup_window`](crate::Config::with_dedup_window),
    /// 24 h by default): after its put, after its due time (for a timer that
    /// fired) or after its cancel, whichever is later. Racing puts with one
    /// key make one message. Consumers read it as
    /// [`ConsumedMessage::dedup_key`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use delaywheel::{Config, Message, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let timeout = || Message::new("OrderTimeout", "order-42").dedup_key("order-42").delay(Duration::from_secs(1800));
    /// let first = store.put(timeout())?;
    /// let retry = store.put(timeout())?; // a retry, or another replica: nothing is written
    /// assert!(retry.is_duplicate());
    /// assert_eq!(retry.handle(), first.handle());
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dedup_key(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = Some(key.into());
        self
    }

    /// Tags (up to [`MAX_TAGS_LEN`] bytes): consumers may filter on their hash
    /// without reading the message.
    pub fn tags(mut self, tags: impl Into<String>) -> Self {
        self.tags = Some(tags.into());
        self
    }

    /// Adds a property (all of them up to [`MAX_PROPERTIES_LEN`] bytes encoded).
    pub fn property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((name.into(), value.into()));
        self
    }

    /// Whether no deliver time, delay or delay level was set.
    pub(crate) fn is_untimed(&self) -> bool {
        self.timing == When::Now
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The properties' size encoded, as [`MAX_PROPERTIES_LEN`] counts it: a
    /// caller that adds properties of its own later checks its room with this.
    pub fn properties_len(&self) -> usize {
        dedup_property_len(self.dedup_key.as_deref().unwrap_or("")) + properties_len(&self.properties)
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The queue this message goes to, checked against the topic's queue count.
    pub(crate) fn resolve_queue(&self, queues_per_topic: u32) -> Result<u32> {
        let queue = match (self.queue_id, &self.key) {
            (Some(id), _) => id,
            (None, Some(key)) => crc32c::crc32c(key.as_bytes()) % queues_per_topic,
            (None, None) => 0,
        };
        if queue >= queues_per_topic {
            return Err(Error::invalid(
                "queue id",
                format!("{queue} is not below the {queues_per_topic} queues of a topic"),
            ));
        }
        Ok(queue)
    }

    pub(crate) fn validate(&self, max_body_bytes: usize) -> Result<()> {
        validate_topic(&self.topic)?;
        if self.body.len() > max_body_bytes {
            return Err(Error::invalid(
                "body",
                format!("{} bytes is over the limit of {max_body_bytes}", self.body.len()),
            ));
        }
        if self.key.as_ref().is_some_and(|k| k.len() > MAX_KEY_LEN) {
            return Err(Error::invalid("key", format!("longer than {MAX_KEY_LEN} bytes")));
        }
        self.validate_dedup_key()?;
        if self.tags.as_ref().is_some_and(|t| t.len() > MAX_TAGS_LEN) {
            return Err(Error::invalid("tags", format!("longer than {MAX_TAGS_LEN} bytes")));
        }
        if self.properties_len() > MAX_PROPERTIES_LEN {
            return Err(Error::invalid(
                "properties",
                format!("more than {MAX_PROPERTIES_LEN} bytes encoded"),
            ));
        }
        Ok(())
    }
}

impl Message {
    /// The dedup key's length; the reserved property set only through it.
    fn validate_dedup_key(&self) -> Result<()> {
        if let Some(key) = &self.dedup_key {
            if key.is_empty() {
                return Err(Error::invalid("dedup_key", "empty"));
            }
            if key.len() > MAX_KEY_LEN {
                return Err(Error::invalid("dedup_key", format!("longer than {MAX_KEY_LEN} bytes")));
            }
        }
        if let Some((name, _)) = self
            .properties
            .iter()
            .find(|(name, _)| [DEDUP_PROPERTY, REPLACES_PROPERTY].contains(&name.as_str()))
        {
            return Err(Error::invalid("properties", format!("{name} is reserved for the store's own use")));
        }
        Ok(())
    }

    /// The record fields of this (validated) message on `queue_id`, stored at `store_time_ms`.
    pub(crate) fn fields(&self, queue_id: u32, store_time_ms: u64, timing: Timing) -> MessageFields<'_> {
        MessageFields {
            topic: &self.topic,
            key: self.key.as_deref().unwrap_or(""),
            tags: self.tags.as_deref().unwrap_or(""),
            properties: &self.properties,
            dedup_key: self.dedup_key.as_deref().unwrap_or(""),
            replaces: "",
            body: &self.body,
            queue_id,
            store_time_ms,
            timing,
            schedule: self.schedule,
        }
    }

    /// The deliver time and level this message asks for, given its store time:
    /// `(0, 0)` for an ordinary message.
    pub(crate) fn resolve_timing(&self, store_time_ms: u64, levels: &DelayLevels) -> Result<(u64, u16)> {
        let at = match self.timing {
            When::Now => return Ok((0, 0)),
            When::Conflict => {
                return Err(Error::invalid("timing", "set only one of deliver_at_ms, delay and delay_level"));
            }
            When::At(at) => at,
            When::After(delay) => {
                let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                store_time_ms.saturating_add(ms)
            }
            When::Level(level) => store_time_ms.saturating_add(levels.delay_ms(level)?),
        };
        if at > MAX_DELIVER_AT_MS {
            return Err(Error::invalid(
                "deliver time",
                format!("{at} ms is past the clock's range (the end of year 9999, {MAX_DELIVER_AT_MS} ms)"),
            ));
        }
        // 0 marks an ordinary message on disk; a timer due at the epoch is simply due.
        let level = if let When::Level(level) = self.timing { level } else { 0 };
        Ok((at.max(1), level))
    }
}

/// Topic names become directory names, so they are restricted to a safe alphabet.
pub fn validate_topic(topic: &str) -> Result<()> {
    if topic.is_empty() {
        return Err(Error::invalid("topic", "empty"));
    }
    if topic.len() > MAX_TOPIC_LEN {
        return Err(Error::invalid("topic", format!("longer than {MAX_TOPIC_LEN} bytes")));
    }
    if !topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'%' | b'|')) {
        return Err(Error::invalid(
            "topic",
            format!("{topic:?} may only hold ASCII letters, digits and _ - % |"),
        ));
    }
    Ok(())
}

impl std::str::FromStr for Handle {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::invalid("handle", format!("{s:?} is not offset@deliver_at_ms"));
        let (offset, at) = s.split_once('@').ok_or_else(bad)?;
        Ok(Self { offset: offset.parse().map_err(|_| bad())?, deliver_at_ms: at.parse().map_err(|_| bad())? })
    }
}

/// What [`Store::cancel`](crate::Store::cancel) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The timer will never fire (also the answer for a timer cancelled before).
    Cancelled,
    /// Too late: the timer has fired.
    AlreadyDelivered,
    /// No timed message with this deliver time at that offset.
    NotFound,
}

/// What [`Store::pause_schedule`](crate::Store::pause_schedule) and
/// [`Store::resume_schedule`](crate::Store::resume_schedule) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseOutcome {
    /// Paused: no occurrence is delivered until it is resumed.
    Paused,
    /// Resumed: the next occurrence is the first of its recurrence from now.
    Resumed,
    /// It was paused (a pause), or was not (a resume): nothing changed.
    Unchanged,
    /// The schedule is over (its limit, or its end, also an end that passed
    /// while it was paused): nothing is delivered any more.
    Over,
    /// The schedule was cancelled (nothing changed).
    Cancelled,
    /// No recurring schedule with this handle.
    NotFound,
}

/// What [`Store::reschedule`](crate::Store::reschedule) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RescheduleOutcome {
    /// The timer fires at the new time and never at the old one. Its handle
    /// stays valid: cancel and reschedule it with the same handle as before.
    Rescheduled,
    /// Too late: the timer has fired (nothing changed).
    AlreadyDelivered,
    /// The timer was cancelled (nothing changed).
    Cancelled,
    /// No timed message with this deliver time at that offset.
    NotFound,
}

/// A message as a consumer sees it. The body is a zero-copy view of the commit log.
#[derive(Debug, Clone)]
pub struct ConsumedMessage {
    pub(crate) topic: std::sync::Arc<str>,
    pub(crate) body: Bytes,
    /// Its key, tags and properties, if it has any: a pointer for the many
    /// messages without, which keeps the whole small to hand out by the million.
    pub(crate) extras: Option<Box<Extras>>,
    pub(crate) queue_offset: u64,
    pub(crate) log_offset: u64,
    pub(crate) store_time_ms: u64,
    pub(crate) visible_at_ms: u64,
    pub(crate) deliver_at_ms: Option<NonZeroU64>,
    pub(crate) queue_id: u32,
    pub(crate) delay_level: Option<NonZeroU16>,
}

/// What a message may carry besides its body (see [`ConsumedMessage`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Extras {
    pub key: Option<String>,
    pub tags: Option<String>,
    pub properties: Vec<(String, String)>,
    pub dedup_key: Option<String>,
    /// Which occurrence of a recurring schedule it is.
    pub occurrence: Option<crate::receipt::Occurrence>,
}

impl ConsumedMessage {
    /// The topic it was consumed from.
    pub fn topic(&self) -> &str {
        &self.topic
    }
    /// The queue it was consumed from.
    pub fn queue_id(&self) -> u32 {
        self.queue_id
    }
    /// Position in its consume queue; commit `queue_offset() + 1` to move past it.
    pub fn queue_offset(&self) -> u64 {
        self.queue_offset
    }
    /// Offset of the message record in the commit log.
    pub fn log_offset(&self) -> u64 {
        self.log_offset
    }
    /// When the store appended the message (epoch ms).
    pub fn store_time_ms(&self) -> u64 {
        self.store_time_ms
    }
    /// When the message became visible to consumers: its store time for an
    /// ordinary message, the time the wheel delivered it for a timed one.
    pub fn delivered_at_ms(&self) -> u64 {
        self.visible_at_ms
    }
    /// When a timed message was due (`None` for an ordinary message).
    pub fn deliver_at_ms(&self) -> Option<u64> {
        self.deliver_at_ms.map(NonZeroU64::get)
    }
    /// The legacy delay level it was put with, if any.
    pub fn delay_level(&self) -> Option<u16> {
        self.delay_level.map(NonZeroU16::get)
    }
    /// Its business key, if it had one.
    pub fn key(&self) -> Option<&str> {
        self.extras.as_ref().and_then(|e| e.key.as_deref())
    }
    /// Its tags, if it had any.
    pub fn tags(&self) -> Option<&str> {
        self.extras.as_ref().and_then(|e| e.tags.as_deref())
    }
    /// Its dedup key, if it was put with one (see [`Message::dedup_key`]).
    pub fn dedup_key(&self) -> Option<&str> {
        self.extras.as_ref().and_then(|e| e.dedup_key.as_deref())
    }
    /// Its properties, in the order they were added.
    pub fn properties(&self) -> &[(String, String)] {
        self.extras.as_ref().map_or(&[], |e| &e.properties)
    }
    /// For a recurring schedule's occurrence: the schedule's handle, the
    /// occurrence's number and when the next is due. Its
    /// [`deliver_at_ms`](Self::deliver_at_ms) is the occurrence's instant.
    pub fn occurrence(&self) -> Option<&crate::receipt::Occurrence> {
        self.extras.as_ref().and_then(|e| e.occurrence.as_ref())
    }
    /// The body: a zero-copy view of the commit log.
    pub fn body(&self) -> &Bytes {
        &self.body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_checked() {
        assert!(validate_topic("OrderTopic").is_ok());
        assert!(validate_topic("a-b_c%d|e9").is_ok());
        assert!(validate_topic("").is_err());
        assert!(validate_topic("../etc").is_err());
        assert!(validate_topic(&"x".repeat(MAX_TOPIC_LEN + 1)).is_err());
        assert!(validate_topic(&"x".repeat(MAX_TOPIC_LEN)).is_ok());
    }

    #[test]
    fn queue_is_explicit_or_picked_by_key() {
        let m = Message::new("T", "b");
        assert_eq!(m.resolve_queue(4).unwrap(), 0);
        assert_eq!(m.clone().queue_id(3).resolve_queue(4).unwrap(), 3);
        assert!(m.clone().queue_id(4).resolve_queue(4).is_err());
        let a = m.clone().key("order-1").resolve_queue(4).unwrap();
        assert_eq!(a, m.key("order-1").resolve_queue(4).unwrap(), "one key, one queue");
    }

    #[test]
    fn timing_resolves_against_the_store_time() {
        let levels = DelayLevels::default();
        let m = Message::new("T", "b");
        assert_eq!(m.resolve_timing(1_000, &levels).unwrap(), (0, 0));
        assert_eq!(m.clone().deliver_at_ms(5_000).resolve_timing(1_000, &levels).unwrap(), (5_000, 0));
        assert_eq!(
            m.clone().delay(Duration::from_secs(2)).resolve_timing(1_000, &levels).unwrap(),
            (3_000, 0)
        );
        assert_eq!(m.clone().delay_level(3).resolve_timing(1_000, &levels).unwrap(), (11_000, 3));
        assert_eq!(
            m.clone().deliver_at_ms(0).resolve_timing(1_000, &levels).unwrap(),
            (1, 0),
            "past means now"
        );
        assert!(m.clone().delay_level(19).resolve_timing(1_000, &levels).is_err());
        assert!(m.clone().deliver_at_ms(MAX_DELIVER_AT_MS + 1).resolve_timing(0, &levels).is_err());
        let both = m.deliver_at_ms(5).delay_level(1).resolve_timing(0, &levels).unwrap_err();
        assert_eq!(both.to_string(), "invalid timing: set only one of deliver_at_ms, delay and delay_level");
    }

    #[test]
    fn handles_round_trip_as_bytes_and_text() {
        let h = Handle { offset: 4096, deliver_at_ms: 1_700_000_000_000 };
        assert_eq!(Handle::from_bytes(h.to_bytes()), h);
        assert_eq!(h.to_string(), "4096@1700000000000");
        assert_eq!("4096@1700000000000".parse::<Handle>().unwrap(), h);
        assert!("4096".parse::<Handle>().is_err());
    }

    #[test]
    fn body_limit_is_enforced() {
        assert!(Message::new("T", vec![0u8; 10]).validate(10).is_ok());
        let err = Message::new("T", vec![0u8; 11]).validate(10).unwrap_err();
        assert_eq!(err.to_string(), "invalid body: 11 bytes is over the limit of 10");
    }
}
