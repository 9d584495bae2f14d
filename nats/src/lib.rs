//! delaywheel as the delay tier of a NATS JetStream cluster.
//!
//! Producers publish timers to a replicated JetStream stream (`DELAY`, on
//! `delay.<partition>.>`, or several, `DELAY-<i>`, each holding some
//! partitions: see [`Layout`]), with the deliver time and the target
//! subject in headers ([`wire`]). Each tier node leases some partitions through a KV
//! bucket (see [`run`]), reads each one it owns into a local
//! delaywheel store, and when a timer fires publishes it to its target
//! (deduplicated by stream sequence) and then acknowledges it, which removes
//! it from the work-queue stream. So the stream holds the pending timers; it is the replicated
//! truth, and each node's store is an index rebuilt from it whenever the
//! node takes a partition, as the commit log's indexes are rebuilt from it.
//!
//! A timer is a request the node makes with its own credentials, so its
//! target is checked first ([`target`]); one that cannot be fired (a
//! refused or unanswering target, a malformed timer) goes to the dead-letter
//! subject with its reason ([`TierConfig::dead_letter`]) and never holds up
//! the timers behind it.
//!
//! The guarantee: a timer is published at or after its time, never early.
//! It is published again only if an owner published it and then lost the
//! partition (died, or stalled past its lease) before deleting it; the copy
//! carries the same `Nats-Msg-Id`, so the target stream drops it if it comes
//! within its duplicate window (2 minutes by default). A copy later than the
//! window — an owner stalled for longer — is delivered twice, unless the
//! timer carried a producer's `Nats-Msg-Id` that the owner recorded as
//! settled before it lost the partition.
//!
//! A message made for NATS's own message schedules (`Nats-Schedule`, cron,
//! `@every`, `@at`, time zones) is published unchanged to the schedule
//! intake (`schedules.>`, [`TierConfig::schedules`]): a node stores it as a
//! timer under the tier's header names, and a recurring schedule's owner
//! publishes its next timer before each occurrence.
//!
//! A producer's `Nats-Msg-Id` stands while its timer is pending and for the
//! tier's dedup window after it settled ([`TierConfig::dedup_window`], kept
//! in a KV bucket: see `settled_ids.rs`): a timer carrying it meanwhile is
//! removed from the stream unfired.

#![warn(missing_docs)]

mod client;
mod config;
mod error;
mod headers;
mod intake;
mod leaders;
mod lease;
mod nats_schedule;
mod node;
mod partition;
mod recent;
mod settled_ids;
mod strays;
pub mod target;
pub mod wire;

pub use client::{RescheduleAnswer, TierClient};
pub use config::{DEFAULT_DEAD_LETTER, DEFAULT_DEDUP_BUCKET, DEFAULT_SCHEDULES, TierConfig};
pub use error::{Result, TierError};
pub use node::run;
pub use wire::{CancelAnswer, Layout, TimerHandle};
