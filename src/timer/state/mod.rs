//! The wheel's parts, each owning its state and counters, none knowing the
//! wheel that holds them (`wheel/`):
//!
//! * `slots.rs`: each slot's count in memory, the entries not yet loaded per
//!   level, and the chains of slots reused since this open;
//! * `prefetch.rs`: the second being read in, a budget per tick;
//! * `loaded.rs`: the seconds in memory, their timers in firing order;
//! * `cancels.rs`: the cancelled timers still ahead and the cancel ledger;
//! * `restart.rs`: what the commit log said of the time before this open.

pub(crate) mod cancels;
pub(crate) mod loaded;
pub(crate) mod prefetch;
pub(crate) mod restart;
pub(crate) mod slots;
