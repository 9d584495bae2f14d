//! Timed delivery: one persisted hierarchical wheel for arbitrary deliver
//! times and legacy delay levels alike, and the one thread that ticks it.
//!
//! * `geometry.rs`: levels, placement, slot indexes, cascades (pure);
//! * `wheel.rs`: the wheel itself: insert, the pure `tick(now_ms)`, loading,
//!   prefetching and cascading, on slots in a mapped file;
//! * `cancels.rs`: how a cancel finds its timer; `ledger.rs`: every cancel
//!   answered, on disk, for a repeated cancel;
//! * `restart.rs`: the wheel's recovery contract (what the log says happened
//!   since the checkpoint); `reclaim.rs`: the timer-log and ledger files it
//!   may delete; `gauges.rs`: pending counts from the slot counts;
//!   `census.rs`: the exact count, by reading every live chain;
//!   `window.rs`: the pending timers due in a window of time;
//! * `routes.rs`: where each loaded timer goes (topic, queue, tags), so a run
//!   that fires together is one deliveries record per queue;
//! * `log.rs`: the timer logs the slots chain through; `tails.rs`: where each
//!   slot's chain begins; `loaded.rs`: the seconds in memory;
//! * `tick.rs`: the ticking thread; `front.rs`: the wheel's side of the
//!   scheduler seam; `levels.rs`: the legacy level table.
//!
//! All of it is an index of the commit log.

pub(crate) mod cancels;
mod census;
mod front;
mod gauges;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub mod geometry;
pub(crate) mod ledger;
pub(crate) mod levels;
mod loaded;
pub(crate) mod log;
mod reclaim;
pub(crate) mod restart;
mod routes;
pub(crate) mod tails;
pub(crate) mod tick;
pub(crate) mod wheel;
pub(crate) mod window;

pub(crate) use front::WheelFront;

/// A timer: the message it delivers and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Timer {
    pub deliver_at_ms: u64,
    pub message_offset: u64,
}
