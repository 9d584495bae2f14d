//! What the wheel holds, counted: pending timers per level and by due time,
//! from the in-memory mirror of the slot counts (never by decoding slots).

use crate::error::Result;
use crate::timer::Timer;
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
        // The second being read in counts as the unloaded slot it was: its
        // cancel entries are still among the level's until it is loaded.
        let mut entries = self.slot_counts.unloaded();
        entries[0] += self.prefetch.as_ref().map_or(0, |p| u64::from(p.held()));
        let mut counts = net_pending(entries, self.cancels.entries());
        let (loaded, cancelled) = (self.loaded.pending() as u64, self.cancels.cancelled_loaded());
        debug_assert!(loaded >= cancelled, "{cancelled} cancelled of {loaded} loaded timers");
        counts[0] += loaded - cancelled.min(loaded);
        counts
    }

    /// Pending timers counted by due time: `counts[i]` holds those due before
    /// `bounds_ms[i]` (and at or after the bound before it), so the counts
    /// are per interval, not cumulative; the last count holds the rest, and
    /// they add up to [`pending`](Self::pending). A level-0 slot not loaded
    /// counts as due at its second's start, so with bounds on whole seconds
    /// the counts are exact within level 0 (18 h ahead); a coarser window
    /// counts as due at its start. Cancelled timers
    /// are not counted, whether their cancel is applied or still an entry in
    /// a slot.
    ///
    /// The ticking thread runs this every second between deliveries, so it
    /// must be quick: level-0 slots are read only up to the last bound inside
    /// level 0's span (past it, every slot falls in the same count, which is
    /// what the running totals of unloaded timers and cancel entries leave),
    /// and loaded seconds are counted a second at a time.
    pub fn pending_by_due_time(&self, bounds_ms: &[u64]) -> Result<Vec<u64>> {
        // Per interval: timers, less the cancel entries' timers (an entry is
        // not a timer, and removes one): signed until the carry below.
        let mut net = vec![0i64; bounds_ms.len() + 1];
        debug_assert!(bounds_ms.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        // The first bound past `at_ms`: a binary search, since a chart asks for thousands.
        let bucket = |at_ms: u64| bounds_ms.partition_point(|&b| b <= at_ms);
        let mut loaded = vec![0u64; net.len()];
        self.loaded.count_by_due_time(bucket, &self.cancels, &mut loaded);
        net.iter_mut().zip(&loaded).for_each(|(n, &l)| *n += l as i64);
        // The second being read in, as the unloaded slot it was.
        let prefetch_cancels = self.prefetch.as_ref().map_or(0, |p| u64::from(p.cancel_entries()));
        if let Some(p) = &self.prefetch {
            net[bucket(p.second() * 1000)] += i64::from(p.held()) - 2 * i64::from(p.cancel_entries());
        }
        let first = self.loaded_through + 1;
        let span_end_ms = (first + L0_SPAN).saturating_mul(1000);
        let cutoff_ms = bounds_ms.iter().copied().filter(|&b| b < span_end_ms).max().unwrap_or(0);
        let (mut entries, mut cancels) = (0, 0);
        for sec in (first..first + L0_SPAN).take_while(|sec| sec * 1000 < cutoff_ms) {
            let slot = self.slot_counts.get(slot_index(0, sec));
            let prefetching = self.prefetch.as_ref().is_some_and(|p| p.second() == sec);
            if slot.count > 0 && slot.window == sec && !prefetching {
                net[bucket(sec * 1000)] += i64::from(slot.count) - 2 * i64::from(slot.cancels);
                (entries, cancels) = (entries + u64::from(slot.count), cancels + u64::from(slot.cancels));
            }
        }
        // No bound lies between the cutoff and the end of the span.
        let unloaded = self.slot_counts.unloaded()[0];
        debug_assert!(unloaded >= entries, "level 0 counts fewer entries than its slots");
        let cancels = cancels + prefetch_cancels;
        debug_assert!(
            self.cancels.entries()[0] >= cancels,
            "level 0 counts fewer cancel entries than its slots"
        );
        let rest = (unloaded - entries) as i64 - 2 * (self.cancels.entries()[0] - cancels) as i64;
        net[bucket(cutoff_ms.max(first * 1000))] += rest;
        self.count_coarse_by_due_time(bucket, &mut net);
        Ok(carry_cancels_back(net))
    }

    /// Adds `timers`, which the wheel does not hold yet (see
    /// `timer::armed_ahead`), to the `counts` of
    /// [`pending_by_due_time`](Self::pending_by_due_time), each where the
    /// wheel will count it: at the start of the slot it will wait in.
    pub fn count_not_yet_held(
        &self,
        timers: impl Iterator<Item = Timer>,
        bounds_ms: &[u64],
        counts: &mut [u64],
    ) {
        debug_assert_eq!(counts.len(), bounds_ms.len() + 1, "one count more than bounds");
        for timer in timers {
            let counted_at_ms = match self.place(timer.deliver_at_ms / 1000) {
                Some((level, window)) => window_start(level, window).saturating_mul(1000),
                None => timer.deliver_at_ms,
            };
            counts[bounds_ms.partition_point(|&b| b <= counted_at_ms)] += 1;
        }
    }

    /// Adds the timers of levels 1 and 2, less their cancel entries' timers,
    /// to `net[bucket(window start)]`.
    pub(super) fn count_coarse_by_due_time(&self, bucket: impl Fn(u64) -> usize, net: &mut [i64]) {
        for level in [1, 2] {
            for i in 0..LEVELS[level].slots {
                let slot = self.slot_counts.get(slot_index(level, i));
                if slot.count > 0 && self.is_live(level, slot.window) {
                    net[bucket(window_start(level, slot.window).saturating_mul(1000))] +=
                        i64::from(slot.count) - 2 * i64::from(slot.cancels);
                }
            }
        }
    }
}

/// A cancel entry sits in the slot its timer's second maps to now, which
/// may be finer than the slot the timer waits in: that coarser window
/// starts earlier, so an interval that removes more timers than it holds
/// passes the rest to the one before it.
pub(super) fn carry_cancels_back(net: Vec<i64>) -> Vec<u64> {
    let mut counts = vec![0u64; net.len()];
    let mut carry = 0;
    for (count, n) in counts.iter_mut().zip(net).rev() {
        let n = n - carry;
        carry = (-n).max(0);
        *count = n.max(0) as u64;
    }
    debug_assert_eq!(carry, 0, "more cancel entries than timers they cancel");
    counts
}
