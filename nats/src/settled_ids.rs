//! The `Nats-Msg-Id`s of timers that left the delay stream (fired, moved
//! to the dead letter, or cancelled), kept for the tier's dedup window in a
//! JetStream KV bucket: a timer carrying one of them is a producer's retry
//! of a timer that already settled, and never fires.
//!
//! The stream holds only pending timers, and each node's store is rebuilt
//! from it, so what settled can only be remembered outside both. A key is
//! `p<partition>.<the id in hex>`, its value the settled timer's stream
//! sequence; the bucket's `max_age` is the window, so entries expire on
//! their own. A node records the id before it acknowledges the timer (the
//! acknowledgement removes it from the stream): a crash between the two
//! leaves the timer in the stream with its own sequence recorded, and the
//! next owner removes it without firing it again.
//!
//! The bucket is read through JetStream's direct get, which any replica
//! may answer: a replica that lags can miss an id recorded a moment ago.
//! So each partition also remembers the ids it settled lately
//! ([`RecentlySettled`]), and the bucket answers for the older ones.

use std::fmt::Write as _;
use std::time::Duration;

use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::{self, ErrorCode, kv};

use crate::recent::Recent;
use crate::{Result, TierConfig, TierError};

/// How long a partition remembers in memory the ids it settled, at most
/// (never longer than the window): far longer than a replica lags or a
/// lookup takes.
const REMEMBERED_FOR: Duration = Duration::from_secs(600);

/// The bucket of settled ids.
pub(crate) struct SettledIds {
    kv: kv::Store,
}

impl SettledIds {
    /// Opens the bucket, creating it (or setting its window) as configured.
    /// Nodes starting together all try; the node tries again until it is
    /// made (see `node.rs`), and the first node's bucket is what the others find.
    pub(crate) async fn open(js: &jetstream::Context, config: &TierConfig) -> Result<Self> {
        let bucket = &config.dedup_bucket;
        if let Ok(kv) = js.get_key_value(bucket).await
            && kv.stream.cached_info().config.max_age == config.dedup_window
        {
            return Ok(SettledIds { kv });
        }
        let kv = js
            .create_or_update_key_value(kv::Config {
                bucket: bucket.clone(),
                history: 1,
                max_age: config.dedup_window,
                num_replicas: config.replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| TierError::nats(format!("create KV bucket {bucket}"), e))?;
        Ok(SettledIds { kv })
    }

    /// The bucket `bucket` if it exists (a node made it), for a client that
    /// settles a timer itself while no node owns its partition.
    pub(crate) async fn find(js: &jetstream::Context, bucket: &str) -> Result<Option<Self>> {
        let failed = |e: async_nats::Error| TierError::nats(format!("find KV bucket {bucket}"), e);
        match js.get_stream(format!("KV_{bucket}")).await {
            Err(e) if matches!(e.kind(), GetStreamErrorKind::JetStream(e) if e.error_code() == ErrorCode::STREAM_NOT_FOUND) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(failed(e.into())),
            Ok(_) => {}
        }
        let kv = js.get_key_value(bucket).await.map_err(|e| failed(e.into()))?;
        Ok(Some(SettledIds { kv }))
    }

    /// Records that timer `sequence` of `partition`, with `msg_id`, settled.
    pub(crate) async fn record(&self, partition: u32, msg_id: &str, sequence: u64) -> Result<()> {
        self.kv
            .put(key(partition, msg_id), sequence.to_string().into())
            .await
            .map_err(|e| TierError::nats(format!("record the Nats-Msg-Id of timer {sequence}"), e))?;
        Ok(())
    }

    /// The sequence of the timer of `partition` with `msg_id` that settled
    /// within the window, if any.
    pub(crate) async fn settled(&self, partition: u32, msg_id: &str) -> Result<Option<u64>> {
        let value = self
            .kv
            .get(key(partition, msg_id))
            .await
            .map_err(|e| TierError::nats("look up a settled Nats-Msg-Id", e))?;
        Ok(value.and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok()))
    }
}

/// The bucket's key of `msg_id` in `partition`: hex keeps any id a valid key.
fn key(partition: u32, msg_id: &str) -> String {
    let mut key = format!("p{partition}.");
    for byte in msg_id.bytes() {
        let _ = write!(key, "{byte:02x}");
    }
    key
}

/// The ids a partition settled in the last [`REMEMBERED_FOR`] (or the
/// dedup window, if shorter), by id.
pub(crate) struct RecentlySettled(Recent<Box<str>, u64>);

impl RecentlySettled {
    /// Remembers ids for [`REMEMBERED_FOR`], or `window` if shorter.
    pub(crate) fn new(window: Duration) -> Self {
        RecentlySettled(Recent::new(window.min(REMEMBERED_FOR)))
    }

    /// Timer `sequence`, with `msg_id`, settled now.
    /// The latest sequence stays: a recurring schedule's timer that settles
    /// after its next one (its firing was retried) must not make the next
    /// one's copies look like the schedule's (see `Part::put`).
    pub(crate) fn insert(&mut self, msg_id: Box<str>, sequence: u64) {
        let sequence = self.get(&msg_id).map_or(sequence, |known| known.max(sequence));
        self.0.insert(msg_id, sequence);
    }

    /// The sequence of the timer with `msg_id` settled lately, if any.
    pub(crate) fn get(&self, msg_id: &str) -> Option<u64> {
        self.0.get(msg_id).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_id_makes_a_valid_key_and_distinct_ids_distinct_keys() {
        assert_eq!(key(3, "order-42"), "p3.6f726465722d3432");
        assert_eq!(key(0, "a.b *>"), "p0.612e62202a3e");
        assert_ne!(key(1, "ab"), key(1, "a.b"));
        assert_ne!(key(1, "x"), key(2, "x"));
    }

    #[test]
    fn recently_settled_keeps_the_latest_sequence_of_an_id_for_the_window_at_most() {
        let mut recent = RecentlySettled::new(Duration::from_secs(3600));
        recent.insert("x".into(), 7);
        recent.insert("x".into(), 9);
        assert_eq!(recent.get("x"), Some(9));
        recent.insert("x".into(), 8);
        assert_eq!(recent.get("x"), Some(9), "an earlier timer settling later leaves the latest");
        assert_eq!(recent.get("y"), None);
        let mut short = RecentlySettled::new(Duration::from_millis(20));
        short.insert("x".into(), 7);
        assert_eq!(short.get("x"), Some(7));
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(short.get("x"), None, "past the window, though nothing was inserted since");
        short.insert("y".into(), 8);
        assert_eq!(short.0.held(), (1, 1), "the old id is forgotten");
    }
}
