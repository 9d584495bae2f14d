//! # delaywheel
//!
//! An embedded, persistent delayed-message engine in the manner of Apache
//! RocketMQ: messages are appended to a segmented, memory-mapped **commit log**
//! (the only truth), and per-topic **consume queues** (indexes rebuilt from the
//! log) point consumers at them.
//!
//! ```
//! use std::time::Duration;
//! use delaywheel::{Config, Message, Store};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(Config::new(dir.path()).with_segment_size(1 << 20))?;
//! let receipt = store.put(Message::new("OrderTopic", "order-1 created").key("order-1"))?;
//! let mut consumer = store.consumer("OrderTopic", receipt.queue_id())?;
//! let got = consumer.poll(10, Duration::from_secs(1))?;
//! assert_eq!(&got[0].body()[..], b"order-1 created");
//! consumer.commit();
//! store.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Which file is truth and which is an index, and every byte of each, is in
//! `wheel-format.md` at the repository root.

#![warn(missing_docs)]

mod buckets;
mod checkpoint;
mod clock;
mod commitlog;
mod committer;
mod config;
mod consume_queue;
mod consumer;
mod dedup;
mod dispatcher;
mod durable;
mod error;
mod flusher;
mod hash_filter;
mod key_index;
// Some codecs and rules exist for the tools that read them through `internals`.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
mod format;
mod fs;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals;
mod message;
mod mmap;
mod offsets;
mod open;
mod pending;
mod prefault;
mod queue_repair;
mod receipt;
#[cfg(feature = "crash-recorder")]
#[doc(hidden)]
pub mod recorder;
mod recovery;
mod retention;
mod schedule;
mod scheduler;
mod sealed;
mod stall;
mod stats;
mod store;
mod sync;
mod threads;
mod ticket;
mod timer;
mod topic_counts;

pub use buckets::SCHEDULE_TOPIC;
pub use clock::{Clock, ManualClock, SystemClock};
pub use commitlog::RecoveryReport;
pub use config::{
    Config, DEFAULT_DELAY_LEVELS, FlushMode, MIN_SEGMENT_SIZE, RecoveryMode, Retention, Scheduler,
};
pub use consumer::{Consumer, QueueWatch, poll_any};
pub use error::{CorruptionKind, Error, Result};
pub use message::{
    CancelOutcome, ConsumedMessage, Handle, MAX_DELIVER_AT_MS, MAX_KEY_LEN, MAX_PROPERTIES_LEN, MAX_TAGS_LEN,
    MAX_TOPIC_LEN, Message, PauseOutcome, Receipt, RescheduleOutcome, Written, validate_topic,
};
pub use offsets::POSITIONS_TOPIC;
pub use pending::{MAX_COUNT_BOUNDS, PendingTimer, ScheduleState};
pub use receipt::{Occurrence, ReplaceOutcome, ScheduleReceipt, UpdateOutcome};
pub use retention::ReclaimReport;
pub use schedule::{MissedRuns, Recurrence, Schedule};
pub use sealed::SealedHandle;
pub use stats::{DiskUsage, HORIZON_LABELS, HORIZONS_MS, Lateness, RetentionStats, STATS_TOPICS, Stats};
pub use store::{DEFAULT_GROUP, SCHEDULES_SCANNED, Store};
pub use ticket::PutTicket;
pub use timer::levels::DelayLevels;
pub use topic_counts::ScheduleCounts;
