//! What users put and what consumers get back.

use bytes::Bytes;

use crate::config::MAX_TOPIC_LEN;
use crate::error::{Error, Result};

/// Longest message key, in bytes.
pub const MAX_KEY_LEN: usize = 1024;
/// Longest tags string, in bytes.
pub const MAX_TAGS_LEN: usize = 1024;
/// Largest encoded property block, in bytes.
pub const MAX_PROPERTIES_LEN: usize = 16 * 1024;

/// A message to put: a topic, a body, and optional routing and metadata.
#[derive(Debug, Clone)]
pub struct Message {
    pub(crate) topic: String,
    pub(crate) queue_id: Option<u32>,
    pub(crate) key: Option<String>,
    pub(crate) tags: Option<String>,
    pub(crate) properties: Vec<(String, String)>,
    pub(crate) body: Bytes,
}

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
        }
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

    pub fn tags(mut self, tags: impl Into<String>) -> Self {
        self.tags = Some(tags.into());
        self
    }

    pub fn property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((name.into(), value.into()));
        self
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

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
        if self.tags.as_ref().is_some_and(|t| t.len() > MAX_TAGS_LEN) {
            return Err(Error::invalid("tags", format!("longer than {MAX_TAGS_LEN} bytes")));
        }
        if crate::commitlog::record::properties_len(&self.properties) > MAX_PROPERTIES_LEN {
            return Err(Error::invalid(
                "properties",
                format!("more than {MAX_PROPERTIES_LEN} bytes encoded"),
            ));
        }
        Ok(())
    }
}

/// Topic names become directory names, so they are restricted to a safe alphabet.
pub(crate) fn validate_topic(topic: &str) -> Result<()> {
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

/// What `put` returns: where the message is and when it was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    pub(crate) offset: u64,
    pub(crate) queue_id: u32,
    pub(crate) store_time_ms: u64,
}

impl Receipt {
    /// The commit-log offset of the message record.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn queue_id(&self) -> u32 {
        self.queue_id
    }

    pub fn store_time_ms(&self) -> u64 {
        self.store_time_ms
    }
}

/// A message as a consumer sees it. The body is a zero-copy view of the commit log.
#[derive(Debug, Clone)]
pub struct ConsumedMessage {
    pub(crate) topic: String,
    pub(crate) queue_id: u32,
    pub(crate) queue_offset: u64,
    pub(crate) log_offset: u64,
    pub(crate) store_time_ms: u64,
    pub(crate) visible_at_ms: u64,
    pub(crate) key: Option<String>,
    pub(crate) tags: Option<String>,
    pub(crate) properties: Vec<(String, String)>,
    pub(crate) body: Bytes,
}

impl ConsumedMessage {
    pub fn topic(&self) -> &str {
        &self.topic
    }
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
    pub fn store_time_ms(&self) -> u64 {
        self.store_time_ms
    }
    /// When the message became visible to consumers (its store time for an ordinary message).
    pub fn delivered_at_ms(&self) -> u64 {
        self.visible_at_ms
    }
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    pub fn tags(&self) -> Option<&str> {
        self.tags.as_deref()
    }
    pub fn properties(&self) -> &[(String, String)] {
        &self.properties
    }
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
    fn body_limit_is_enforced() {
        assert!(Message::new("T", vec![0u8; 10]).validate(10).is_ok());
        let err = Message::new("T", vec![0u8; 11]).validate(10).unwrap_err();
        assert_eq!(err.to_string(), "invalid body: 11 bytes is over the limit of 10");
    }
}
