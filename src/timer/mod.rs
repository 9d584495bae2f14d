//! Timed delivery: one persisted hierarchical wheel for arbitrary deliver
//! times and legacy delay levels alike, and the one thread that ticks it.
//!
//! * `geometry.rs`: levels, placement, slot indexes, cascades (pure);
//! * `wheel/`: the wheel itself, on slots in a mapped file: insert, the pure
//!   `tick(now_ms)`, loading, prefetching and cascading (`mod.rs`); how a
//!   cancel finds its timer (`cancel.rs`); the recovery contract
//!   (`restart.rs`); the files it may delete (`reclaim.rs`); pending counts
//!   (`gauges.rs`, `census.rs`) and the timers due in a window (`window.rs`);
//! * `state/`: the wheel's parts, each owning its state: slot counts, the
//!   second being read in, the loaded seconds, the cancels it remembers,
//!   and what the log said of the time before a restart;
//! * `ledger.rs`: every cancel answered, on disk, for a repeated cancel;
//!   `routes.rs`: where each loaded timer goes (topic, queue, tags), so a run
//!   that fires together is one deliveries record per queue;
//!   `recurring.rs`: which loaded timers are recurring schedules' (their
//!   plans are read again from the records when they fire);
//! * `log.rs`: the timer logs the slots chain through; `tails.rs`: where each
//!   slot's chain begins; `levels.rs`: the legacy level table;
//! * `tick.rs`: the ticking thread; `front.rs`: the wheel's side of the
//!   scheduler seam.
//!
//! Arrows run one way: `front → tick → wheel/ → state/ → ledger → {log,
//! tails, geometry}`; `routes.rs` and `recurring.rs` are the ticking
//! thread's alone (`tick/occurrences.rs` fires the schedules' timers), and
//! `tick/control.rs` names the cancel answers of `state/cancels.rs`.
//!
//! All of it is an index of the commit log.

mod armed_ahead;
pub(crate) mod front;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub mod geometry;
pub(crate) mod ledger;
pub(crate) mod levels;
pub(crate) mod log;
pub(crate) mod pins_snapshot;
mod recurring;
mod routes;
pub(crate) mod state;
pub(crate) mod tails;
pub(crate) mod tick;
pub(crate) mod wheel;

pub(crate) use front::WheelFront;

/// A timer: the message it delivers and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Timer {
    pub deliver_at_ms: u64,
    pub message_offset: u64,
}

/// A timer the dispatcher indexed, for the ticking thread to insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NewTimer {
    pub timer: Timer,
    /// A recurring schedule's (of its record, or of an occurrence's): when
    /// it fires, the next occurrence is armed.
    pub recurring: bool,
}
