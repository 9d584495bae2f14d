//! Time, injected: the store asks a [`Clock`], never the OS directly, so tests
//! and benches can move through years in milliseconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in epoch milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// The current time in milliseconds since the Unix epoch. The store never
    /// asks for anything else: a clock that jumps is followed (see the README).
    fn now_ms(&self) -> u64;
}

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock before 1970 is treated as 1970: nothing is due earlier than that.
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that moves only when told to; clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start_ms` (epoch ms).
    pub fn new(start_ms: u64) -> Self {
        Self { now_ms: Arc::new(AtomicU64::new(start_ms)) }
    }

    /// Sets the time, for every clone; it may move backwards.
    pub fn set_ms(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the time forward by `by_ms`, for every clone.
    pub fn advance_ms(&self, by_ms: u64) {
        self.now_ms.fetch_add(by_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time() {
        let a = ManualClock::new(1_000);
        let b = a.clone();
        a.advance_ms(500);
        assert_eq!(b.now_ms(), 1_500);
        b.set_ms(10);
        assert_eq!(a.now_ms(), 10);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
