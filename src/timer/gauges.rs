//! What the wheel holds, counted: pending timers per level and by due time,
//! from the in-memory mirror of the slot counts (never by decoding slots).

use crate::error::Result;
use crate::timer::geometry::{L0_SPAN, LEVEL_COUNT, LEVELS, net_pending, slot_index, window_start};
use crate::timer::wheel::Wheel;

impl Wheel {
    /// Timers indexed and not yet handed out.
    pub fn pending(&self) -> u64 {
        self.pending_per_level().iter().sum()
    }

    /// Pending timers per wheel level (level 0 includes the loaded seconds). A
    /// cancel not yet applied is subtracted from the level its entry is on.
    pub fn pending_per_level(&self) -> [u64; LEVEL_COUNT] {
        let mut counts = net_pending(self.unloaded, self.cancels.entries);
        let (loaded, cancelled) = (self.loaded.pending() as u64, self.cancels.cancelled_loaded);
        debug_assert!(loaded >= cancelled, "{cancelled} cancelled of {loaded} loaded timers");
        counts[0] += loaded - cancelled.min(loaded);
        if let Some(prefetch) = &self.prefetch {
            counts[0] += prefetch.timers.len() as u64 + u64::from(prefetch.remaining);
        }
        counts
    }

    /// Pending timers counted by due time: `counts[i]` holds those due before
    /// `bounds_ms[i]` (and at or after the bound before it); the last count
    /// holds the rest. Exact within level 0 (18 h ahead); a coarser window
    /// counts as due at its start.
    ///
    /// The ticking thread runs this every second between deliveries, so it
    /// must be quick: level-0 slots are read only up to the last bound inside
    /// level 0's span (past it, every slot falls in the same count, which is
    /// what the running total of unloaded timers leaves), and loaded seconds
    /// are counted a second at a time.
    pub fn pending_by_due_time(&self, bounds_ms: &[u64]) -> Result<Vec<u64>> {
        let mut counts = vec![0u64; bounds_ms.len() + 1];
        let bucket = |at_ms: u64| bounds_ms.iter().position(|&b| at_ms < b).unwrap_or(bounds_ms.len());
        self.loaded.count_by_due_time(bucket, &mut counts);
        if let Some(p) = &self.prefetch {
            counts[bucket(p.second * 1000)] += p.timers.len() as u64 + u64::from(p.remaining);
        }
        let first = self.loaded_through + 1;
        let span_end_ms = (first + L0_SPAN).saturating_mul(1000);
        let cutoff_ms = bounds_ms.iter().copied().filter(|&b| b < span_end_ms).max().unwrap_or(0);
        let mut counted = 0;
        for sec in (first..first + L0_SPAN).take_while(|sec| sec * 1000 < cutoff_ms) {
            let slot = self.slot_counts[slot_index(0, sec) as usize];
            let prefetching = self.prefetch.as_ref().is_some_and(|p| p.second == sec);
            if slot.count > 0 && slot.window == sec && !prefetching {
                counts[bucket(sec * 1000)] += u64::from(slot.count);
                counted += u64::from(slot.count);
            }
        }
        // No bound lies between the cutoff and the end of the span.
        debug_assert!(self.unloaded[0] >= counted, "level 0 counts fewer timers than its slots");
        counts[bucket(cutoff_ms.max(first * 1000))] += self.unloaded[0] - counted.min(self.unloaded[0]);
        self.count_coarse_by_due_time(bucket, &mut counts);
        Ok(counts)
    }

    /// Adds the timers of levels 1 and 2 to `counts[bucket(window start)]`.
    pub(super) fn count_coarse_by_due_time(&self, bucket: impl Fn(u64) -> usize, counts: &mut [u64]) {
        for level in [1, 2] {
            for i in 0..LEVELS[level].slots {
                let slot = self.slot_counts[slot_index(level, i) as usize];
                if slot.count > 0 && self.is_live(level, slot.window) {
                    counts[bucket(window_start(level, slot.window).saturating_mul(1000))] +=
                        u64::from(slot.count);
                }
            }
        }
    }
}
