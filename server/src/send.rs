//! `SendMessage`: a protocol message becomes a store message, or a refusal
//! naming the field. Everything is checked before anything is stored.
//!
//! What the protocol carries that the store has no field for is kept as
//! properties whose names start with `__` (refused in user properties):
//! the client's message id, born time and host, every key, the body's encoding.
//! The message id is also the store message's dedup key (`Message::dedup_key`):
//! a resend of a message with an id of its topic answers the first send's
//! receipt, writing nothing.

use delaywheel::{MAX_DELIVER_AT_MS, Message as StoreMessage, validate_topic};

use crate::proto::{Code, Encoding, Message, MessageType};
use crate::receive::MAX_SENT_PROPERTIES_LEN;
use crate::status::Refusal;

/// Names of the properties the server keeps for itself.
pub(crate) mod property {
    pub const MESSAGE_ID: &str = "__MSGID";
    pub const BORN_MS: &str = "__BORN_MS";
    pub const BORN_HOST: &str = "__BORN_HOST";
    /// Every key, separated by spaces (the store's key is the first).
    pub const KEYS: &str = "__KEYS";
    /// `gzip` when the body is compressed (the client said so).
    pub const ENCODING: &str = "__ENCODING";
    /// A FIFO message's message group: its messages are handed out one at a time, in order.
    pub const MESSAGE_GROUP: &str = "__MSG_GROUP";
    /// The legacy delay level a RocketMQ 4 style client sets as a user property.
    pub const LEGACY_DELAY_LEVEL: &str = "DELAY";
}

/// The longest message id accepted.
const MAX_MESSAGE_ID_LEN: usize = 128;
/// The longest message group accepted (RocketMQ's proxy's limit).
const MAX_MESSAGE_GROUP_LEN: usize = 64;

/// A message ready to put.
pub(crate) struct Outgoing {
    pub message: StoreMessage,
    pub message_id: String,
    pub topic: String,
    pub timed: bool,
}

/// Checks `message` and turns it into a store message for `queue`, or, for
/// a FIFO message, for its message group's queue (of `queues`).
pub(crate) fn to_store(
    message: Message,
    max_body: usize,
    levels: usize,
    queue: u32,
    queues: u32,
) -> Result<Outgoing, Refusal> {
    let topic = crate::names::topic(&message.topic, "topic.name")?;
    check_topic(&topic, "topic.name")?;
    let system = message.system_properties.unwrap_or_default();
    let message_id = system.message_id.clone();
    if message_id.is_empty()
        || message_id.len() > MAX_MESSAGE_ID_LEN
        || message_id.chars().any(char::is_control)
    {
        let why = format!("must be 1 to {MAX_MESSAGE_ID_LEN} bytes without control characters");
        return Err(Refusal::field(Code::IllegalMessageId, "system_properties.message_id", why));
    }
    if message.body.is_empty() {
        return Err(Refusal::field(Code::MessageBodyEmpty, "body", "empty"));
    }
    if message.body.len() > max_body {
        let why = format!("{} bytes, more than the {max_body} allowed", message.body.len());
        return Err(Refusal::field(Code::MessageBodyTooLarge, "body", why));
    }
    check_type(&system)?;
    let group = message_group(&system)?;
    let level = legacy_level(&message.user_properties, levels)?;
    let deliver_at_ms = system.delivery_timestamp.map(|t| timestamp_ms(&t)).transpose()?;
    let timed = deliver_at_ms.is_some() || level.is_some();
    if group.is_some() && timed {
        let why = "a FIFO message (with a message group) has no delivery time";
        return Err(Refusal::field(
            Code::MessagePropertyConflictWithType,
            "system_properties.message_group",
            why,
        ));
    }
    let queue = group.as_deref().map_or(queue, |g| group_queue(g, queues));
    if deliver_at_ms.is_some() && level.is_some() {
        let why = "both a delivery timestamp and a legacy delay level";
        return Err(Refusal::field(
            Code::MessagePropertyConflictWithType,
            "system_properties.delivery_timestamp",
            why,
        ));
    }
    if system.message_type == MessageType::Delay as i32 && !timed {
        let why = "a DELAY message needs system_properties.delivery_timestamp";
        return Err(Refusal::field(
            Code::MessagePropertyConflictWithType,
            "system_properties.message_type",
            why,
        ));
    }

    let mut out = StoreMessage::new(topic.clone(), bytes::Bytes::from(message.body)).queue_id(queue);
    out = match (deliver_at_ms, level) {
        (Some(at), _) => out.deliver_at_ms(at),
        (None, Some(level)) => out.delay_level(level),
        (None, None) => out,
    };
    if let Some(tag) = system.tag.filter(|t| !t.is_empty()) {
        out = out.tags(tag);
    }
    for key in &system.keys {
        if key.is_empty() || key.contains(char::is_whitespace) {
            let why = format!("{key:?}: a key is not empty and has no white space");
            return Err(Refusal::field(Code::IllegalMessageKey, "system_properties.keys", why));
        }
    }
    if let Some(first) = system.keys.first() {
        out = out.key(first.clone()).property(property::KEYS, system.keys.join(" "));
    }
    let mut user: Vec<_> = message.user_properties.into_iter().collect();
    user.sort();
    for (name, value) in user {
        if name.is_empty() || name.starts_with("__") {
            let why = format!("{name:?}: names starting with __ are the server's");
            return Err(Refusal::field(Code::IllegalMessagePropertyKey, "user_properties", why));
        }
        out = out.property(name, value);
    }
    // The id is kept for consumers and dead letters, and is the message's
    // dedup key: a client resends a message whose answer it did not get with
    // the same id, and is answered the first one's receipt.
    out = out.property(property::MESSAGE_ID, message_id.clone()).dedup_key(message_id.clone());
    if let Some(group) = group {
        out = out.property(property::MESSAGE_GROUP, group);
    }
    if let Some(born) = system.born_timestamp.and_then(|t| timestamp_ms(&t).ok()) {
        out = out.property(property::BORN_MS, born.to_string());
    }
    if !system.born_host.is_empty() {
        out = out.property(property::BORN_HOST, system.born_host);
    }
    if system.body_encoding == Encoding::Gzip as i32 {
        out = out.property(property::ENCODING, "gzip");
    }
    if out.properties_len() > MAX_SENT_PROPERTIES_LEN {
        let why = format!(
            "{} bytes encoded with the server's own, more than the {MAX_SENT_PROPERTIES_LEN} that leave room \
             for what a retry copy adds",
            out.properties_len()
        );
        return Err(Refusal::field(Code::MessagePropertiesTooLarge, "user_properties", why));
    }
    Ok(Outgoing { message: out, message_id, topic, timed })
}

/// A topic name clients may use: the store's alphabet, and not one of the
/// server's own (`%RETRY%…`, or anything starting with `%`).
pub(crate) fn check_topic(topic: &str, field: &str) -> Result<(), Refusal> {
    validate_topic(topic).map_err(|e| Refusal::field(Code::IllegalTopic, field, e))?;
    if topic.starts_with('%') {
        return Err(Refusal::field(
            Code::IllegalTopic,
            field,
            format!("{topic:?}: names starting with % are the server's"),
        ));
    }
    Ok(())
}

fn check_type(system: &crate::proto::SystemProperties) -> Result<(), Refusal> {
    let unsupported =
        |what: &str| Err(Refusal::new(Code::Unsupported, format!("{what} are not supported by delaywheel")));
    if system.message_type == MessageType::Transaction as i32 {
        return unsupported("transactional messages");
    }
    if system.lite_topic.is_some() || system.message_type == MessageType::Lite as i32 {
        return unsupported("lite topics");
    }
    if system.priority.is_some() || system.message_type == MessageType::Priority as i32 {
        return unsupported("priority messages");
    }
    Ok(())
}

/// The message group of a FIFO message, checked (a FIFO message must have one).
fn message_group(system: &crate::proto::SystemProperties) -> Result<Option<String>, Refusal> {
    let field = "system_properties.message_group";
    let group = system.message_group.clone().filter(|g| !g.is_empty());
    match &group {
        None if system.message_type == MessageType::Fifo as i32 => {
            Err(Refusal::field(Code::MessagePropertyConflictWithType, field, "a FIFO message needs one"))
        }
        Some(g) if g.len() > MAX_MESSAGE_GROUP_LEN || g.chars().any(char::is_control) => {
            let why = format!("must be 1 to {MAX_MESSAGE_GROUP_LEN} bytes without control characters");
            Err(Refusal::field(Code::IllegalMessageGroup, field, why))
        }
        _ => Ok(group),
    }
}

/// The queue of a message group, of `queues`: the same for all its messages
/// (they are handed out in queue order), and the same in every version, so
/// an upgrade keeps a group's messages in one queue.
fn group_queue(group: &str, queues: u32) -> u32 {
    let hash = blake3::hash(group.as_bytes());
    let first = u32::from_le_bytes(hash.as_bytes()[..4].try_into().expect("4 bytes"));
    first % queues
}

fn legacy_level(
    properties: &std::collections::HashMap<String, String>,
    levels: usize,
) -> Result<Option<u16>, Refusal> {
    let Some(text) = properties.get(property::LEGACY_DELAY_LEVEL) else { return Ok(None) };
    let field = "user_properties.DELAY";
    let level: u16 = text.trim().parse().map_err(|_| {
        Refusal::field(Code::IllegalDeliveryTime, field, format!("{text:?} is not a delay level"))
    })?;
    if level == 0 || usize::from(level) > levels {
        return Err(Refusal::field(
            Code::IllegalDeliveryTime,
            field,
            format!("{level} is not a level from 1 to {levels}"),
        ));
    }
    Ok(Some(level))
}

/// Epoch milliseconds of a protocol timestamp, from 1970 to the end of 9999.
pub(crate) fn timestamp_ms(t: &prost_types::Timestamp) -> Result<u64, Refusal> {
    let field = "system_properties.delivery_timestamp";
    if t.seconds < 0 || !(0..1_000_000_000).contains(&t.nanos) {
        return Err(Refusal::field(Code::IllegalDeliveryTime, field, "before 1970 or malformed"));
    }
    let ms = (t.seconds as u64).checked_mul(1000).map(|ms| ms + t.nanos as u64 / 1_000_000);
    match ms {
        Some(ms) if ms <= MAX_DELIVER_AT_MS => Ok(ms),
        _ => Err(Refusal::field(Code::IllegalDeliveryTime, field, "after the end of the year 9999")),
    }
}

/// The protocol timestamp of epoch milliseconds.
pub(crate) fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message as _;

    use super::*;
    use crate::handles::HandleKey;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Whatever bytes a client sends, decoding and checking them answers
        /// (a message, a refusal or a decode error) and never panics.
        #[test]
        fn random_bytes_never_panic_the_request_paths(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(request) = crate::proto::SendMessageRequest::decode(bytes.as_slice()) {
                for message in request.messages {
                    let _ = to_store(message, 1 << 20, 18, 0, 4);
                }
            }
            if let Ok(message) = Message::decode(bytes.as_slice()) {
                let _ = to_store(message, 1 << 20, 18, 0, 4);
            }
            let text = String::from_utf8_lossy(&bytes);
            let key = HandleKey::from_bytes([1; 32]);
            prop_assert!(key.open_recall("T", &text).is_err());
            prop_assert!(key.open_receipt("G", "T", &text).is_err());
            let _ = crate::receive::Filter::parse(&text);
        }

        /// Random protocol messages built field by field: the same.
        #[test]
        fn random_messages_are_stored_or_refused(
            topic in "[ -~]{0,140}",
            id in "[ -~]{0,140}",
            body in proptest::collection::vec(any::<u8>(), 0..64),
            seconds in any::<i64>(),
            nanos in any::<i32>(),
            level in "[ -~]{0,4}",
            key in "[ -~]{0,40}",
        ) {
            let message = Message {
                topic: Some(crate::proto::Resource { resource_namespace: String::new(), name: topic }),
                user_properties: [("DELAY".to_string(), level)].into(),
                system_properties: Some(crate::proto::SystemProperties {
                    message_id: id,
                    keys: vec![key],
                    delivery_timestamp: Some(prost_types::Timestamp { seconds, nanos }),
                    ..Default::default()
                }),
                body,
            };
            if let Err(refusal) = to_store(message, 1 << 20, 18, 0, 4) {
                prop_assert!(refusal.message.contains(':'), "names the field: {}", refusal.message);
            }
        }
    }
}
