//! The exact count: every pending timer, read and counted once. The gauges
//! (`gauges.rs`) add slot counts, which is cheap and exact in a wheel that
//! ran without a restart; after a crash a slot not yet loaded may still
//! hold timers that fired before it (the recovery scan knows them, loading
//! drops them) and timers the replay indexed a second time elsewhere (the
//! second copy is dropped when it comes up). Only reading the chains tells
//! which, so a store opened without delivery (`delaywheel recover`) counts
//! this way: it walks every live chain, O(pending) reads and about 24 bytes
//! of memory per pending timer.

use std::collections::HashSet;

use crate::error::Result;
use crate::format::timer_entry::TimerEntry;
use crate::timer::geometry::{LEVEL_COUNT, LEVELS, slot_index};
use crate::timer::wheel::Wheel;

/// Pending timers, each counted once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Census {
    pub pending: u64,
    /// By the finest level holding the timer (the loaded seconds are level 0).
    pub per_level: [u64; LEVEL_COUNT],
    /// `by_due_time[i]`: due before `bounds_ms[i]` and at or after the bound
    /// before it (per interval, like [`Wheel::pending_by_due_time`], but by
    /// each timer's own deliver time, on every level); the last holds the rest.
    pub by_due_time: Vec<u64>,
}

/// A timer entry found in a live place: (message offset, level, deliver time).
type Found = (u64, usize, u64);

impl Wheel {
    /// Counts the pending timers exactly (see the module docs): those loaded
    /// and not handed out, and those in every live chain, once each, leaving
    /// out the timers that fired or were cancelled before a restart, those
    /// cancelled since (by a cancel entry anywhere, or in memory), and a
    /// replayed timer's copy whose twin was handed out.
    pub fn census(&self, bounds_ms: &[u64]) -> Result<Census> {
        let mut found: Vec<Found> =
            self.loaded.timers().map(|t| (t.message_offset, 0, t.deliver_at_ms)).collect();
        let mut cancelled = HashSet::new();
        if let Some(p) = &self.prefetch {
            found.extend(p.timers().iter().map(|t| (t.message_offset, 0, t.deliver_at_ms)));
            cancelled.extend(p.cancels().iter().copied());
            let (mut at, remaining) = p.unread();
            for _ in 0..remaining {
                let entry = self.logs[0].read_linked(at)?;
                note(entry, 0, &mut found, &mut cancelled);
                at = entry.prev;
            }
        }
        let prefetching = self.prefetch.as_ref().map(|p| p.second());
        for (level, l) in LEVELS.iter().enumerate() {
            for i in 0..l.slots {
                let index = slot_index(level, i);
                let held = self.slot_counts.get(index);
                let live = held.count > 0 && self.is_live(level, held.window);
                if !live || (level == 0 && prefetching == Some(held.window)) {
                    continue;
                }
                let slot = self.read_slot(index)?;
                for entry in self.read_chain(index, &slot)? {
                    note(entry, level, &mut found, &mut cancelled);
                }
            }
        }
        // The finest level first among the copies of one timer.
        found.sort_unstable();
        found.dedup_by_key(|(offset, _, _)| *offset);
        let mut census =
            Census { pending: 0, per_level: [0; LEVEL_COUNT], by_due_time: vec![0; bounds_ms.len() + 1] };
        for (_, level, deliver_at_ms) in
            found.into_iter().filter(|&(offset, _, _)| !self.is_gone(offset, &cancelled))
        {
            census.pending += 1;
            census.per_level[level] += 1;
            census.by_due_time
                [bounds_ms.iter().position(|&b| deliver_at_ms < b).unwrap_or(bounds_ms.len())] += 1;
        }
        Ok(census)
    }
}

impl Wheel {
    /// Whether the timer of `offset`, found in a live place, will not fire
    /// from there: it fired or was cancelled before a restart, a cancel entry
    /// among `cancelled` (those the caller read) or this session cancelled
    /// it, or it is a replayed copy whose twin was handed out.
    pub(super) fn is_gone(&self, offset: u64, cancelled: &HashSet<u64>) -> bool {
        self.restart.settled_before(offset)
            || cancelled.contains(&offset)
            || self.cancels.knows_cancelled(offset)
            || self.restart.handed_out(offset)
    }
}

fn note(entry: TimerEntry, level: usize, found: &mut Vec<Found>, cancelled: &mut HashSet<u64>) {
    if entry.cancel {
        cancelled.insert(entry.message_offset);
    } else {
        found.push((entry.message_offset, level, entry.deliver_at_ms));
    }
}
