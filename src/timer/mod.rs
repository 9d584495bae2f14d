//! Timed delivery: one persisted hierarchical wheel for arbitrary deliver
//! times and legacy delay levels alike, and the one thread that ticks it.
//!
//! `wheel.rs` is the wheel (slots in a mapped file, pure `tick(now_ms)`),
//! `log.rs` the timer log its slots chain through, `tails.rs` where each
//! slot's chain begins (so old timer-log files can be deleted), `ledger.rs`
//! the cancels answered (for a repeated cancel), `levels.rs` the legacy level table. All of them are indexes of the commit log.

pub(crate) mod ledger;
pub(crate) mod levels;
mod loaded;
pub(crate) mod log;
pub(crate) mod tails;
pub(crate) mod tick;
pub(crate) mod wheel;
