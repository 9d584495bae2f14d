//! The pending timers due in a window of time, in deliver-time order, for
//! [`Store::pending`](crate::Store::pending). Read on the ticking thread, so
//! the answer and firing agree: a timer in it had not fired when it was made.
//!
//! Only the places that can hold a timer due in the window are read: the
//! loaded seconds, the second being read in, and the live slots whose window
//! overlaps it (level-0 slots of its seconds, coarser slots not yet
//! cascaded), never the commit log. A cancel entry lies in a slot covering
//! its timer's second, so once every slot covering a second is read, the
//! timers found due in it are known to be pending or not. Slots are read in
//! order of their first second, and the walk stops once `limit` pending
//! timers are found due before the next slot begins: O(timers in the slots
//! read) reads and memory.

use std::collections::HashSet;
use std::ops::Range;

use crate::error::Result;
use crate::format::timer_entry::TimerEntry;
use crate::timer::Timer;
use crate::timer::geometry::{LEVELS, slot_index, window_of, window_start};
use crate::timer::state::cancels::CancelTarget;
use crate::timer::wheel::Wheel;

/// What became of a timer (see [`Wheel::fate_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimerFate {
    Pending,
    /// Fired, when due at `deliver_at_ms` (its latest deliver time).
    Delivered {
        deliver_at_ms: u64,
    },
    /// Cancelled by the record at `record_offset` (`None`: the ledger no
    /// longer knows which), when it was due at `deliver_at_ms`.
    Cancelled {
        record_offset: Option<u64>,
        deliver_at_ms: u64,
    },
}

/// A pending timer and the finest wheel level holding it (0 for the loaded seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingEntry {
    pub timer: Timer,
    pub level: u8,
}

/// A live slot overlapping the window: its level, index and first second.
#[derive(Debug, Clone, Copy)]
struct SlotToRead {
    first_second: u64,
    level: usize,
    index: u64,
}

impl Wheel {
    /// The first `limit` pending timers due in `window_ms` (epoch ms,
    /// half-open), by (deliver time, commit-log offset); see the module docs.
    /// `armed_ahead`: timers due in the window that the wheel does not hold
    /// yet (see `timer::armed_ahead`).
    pub fn pending_between(
        &self,
        window_ms: Range<u64>,
        limit: usize,
        armed_ahead: impl Iterator<Item = Timer>,
    ) -> Result<Vec<PendingEntry>> {
        if window_ms.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let in_window = |t: &Timer| window_ms.contains(&t.deliver_at_ms);
        let mut found: Vec<PendingEntry> = self
            .loaded
            .timers()
            .filter(|t| in_window(t))
            .map(|&timer| PendingEntry { timer, level: 0 })
            .collect();
        found.extend(armed_ahead.map(|timer| PendingEntry { timer, level: self.level_for(timer) }));
        let mut cancelled = HashSet::new();
        let overlaps = |second: u64| {
            second.saturating_mul(1000) < window_ms.end
                && second.saturating_add(1).saturating_mul(1000) > window_ms.start
        };
        if let Some(p) = &self.prefetch
            && overlaps(p.second())
        {
            found.extend(
                p.timers().iter().filter(|t| in_window(t)).map(|&timer| PendingEntry { timer, level: 0 }),
            );
            cancelled.extend(p.cancels().iter().copied());
            let (mut at, remaining) = p.unread();
            for _ in 0..remaining {
                let entry = self.logs[0].read_linked(at)?;
                if entry.cancel {
                    cancelled.insert(entry.message_offset);
                } else if window_ms.contains(&entry.deliver_at_ms) {
                    found.push(PendingEntry { timer: timer_of(&entry), level: 0 });
                }
                at = entry.prev;
            }
        }
        let prefetching = self.prefetch.as_ref().map(|p| p.second());
        for slot in self.live_slots_overlapping(&window_ms) {
            let gone = |offset: u64| self.is_gone(offset, &cancelled);
            if enough(&found, limit, slot.first_second.saturating_mul(1000), gone) {
                break;
            }
            if slot.level == 0 && prefetching == Some(slot.first_second) {
                continue;
            }
            let record = self.read_slot(slot.index)?;
            let from = found.len();
            for entry in self.read_chain(slot.index, &record)? {
                if entry.cancel {
                    cancelled.insert(entry.message_offset);
                } else if window_ms.contains(&entry.deliver_at_ms) {
                    found.push(PendingEntry { timer: timer_of(&entry), level: slot.level as u8 });
                }
            }
            // Sorted while cached: level-0 slots hold disjoint seconds, in
            // order, so the sort below then only checks (the 100 k timers of
            // a 5-minute window on 10 M pending: a tenth of the query).
            found[from..].sort_unstable_by_key(|e| (e.timer, e.level));
        }
        // The copies of one timer are the same timer: the finest level first.
        found.sort_unstable_by_key(|e| (e.timer, e.level));
        found.dedup_by_key(|e| e.timer);
        found.retain(|e| !self.is_gone(e.timer.message_offset, &cancelled));
        found.truncate(limit);
        Ok(found)
    }

    /// Whether each of `timers` (each a message's own timer) is pending now,
    /// as the timer that counts for its message (its latest reschedule's):
    /// one answer per timer, in order. O(1) per timer, but for a cancel
    /// ledger lookup of one not yet loaded (see `locate_for_cancel`).
    pub fn pending_of(&self, timers: &[Timer]) -> Result<Vec<Option<PendingEntry>>> {
        timers
            .iter()
            .map(|&own| {
                let timer = self.current_timer(own)?;
                let level = match self.locate_for_cancel(&timer)? {
                    CancelTarget::Loaded | CancelTarget::Prefetching => 0,
                    CancelTarget::Slot => self.level_for(timer),
                    CancelTarget::AlreadyCancelled | CancelTarget::AlreadyDelivered => return Ok(None),
                };
                Ok(Some(PendingEntry { timer, level }))
            })
            .collect()
    }

    /// What became of `own` (a message's own timer), as the timer that
    /// counts for its message now: pending, delivered or cancelled.
    pub fn fate_of(&self, own: Timer) -> Result<TimerFate> {
        let timer = self.current_timer(own)?;
        Ok(match self.locate_for_cancel(&timer)? {
            CancelTarget::AlreadyDelivered => TimerFate::Delivered { deliver_at_ms: timer.deliver_at_ms },
            CancelTarget::AlreadyCancelled => TimerFate::Cancelled {
                record_offset: self.cancels.ledger().cancel_record_of(timer.message_offset)?,
                deliver_at_ms: timer.deliver_at_ms,
            },
            CancelTarget::Loaded | CancelTarget::Prefetching | CancelTarget::Slot => TimerFate::Pending,
        })
    }

    /// The finest level that holds, or will hold, `timer` (0 for a loaded second).
    fn level_for(&self, timer: Timer) -> u8 {
        self.place(timer.deliver_at_ms / 1000).map_or(0, |(level, _)| level as u8)
    }

    /// The live slots whose window overlaps `window_ms`, by first second.
    fn live_slots_overlapping(&self, window_ms: &Range<u64>) -> Vec<SlotToRead> {
        let (first, last) = (window_ms.start / 1000, (window_ms.end - 1) / 1000);
        let mut slots = Vec::new();
        for (level, l) in LEVELS.iter().enumerate() {
            // Live windows start after the loaded seconds (coarser ones
            // after the window being cascaded), and a level holds at most
            // `slots` windows at once: past that, slots repeat.
            let first_live = match level {
                0 => self.loaded_through + 1,
                _ => window_of(level, self.loaded_through) + 2,
            };
            let (from, to) = (window_of(level, first).max(first_live), window_of(level, last));
            let to = to.min(from.saturating_add(l.slots - 1));
            for window in from..=to {
                let index = slot_index(level, window);
                let held = self.slot_counts.get(index);
                if held.count > 0 && held.window == window && self.is_live(level, window) {
                    slots.push(SlotToRead {
                        first_second: window_start(level, window).max(first),
                        level,
                        index,
                    });
                }
            }
        }
        slots.sort_unstable_by_key(|s| (s.first_second, s.level));
        slots
    }
}

/// Whether `found` already holds `limit` distinct timers, neither settled
/// nor cancelled, due before `next_ms`, where the next slot to read begins:
/// every slot that can hold one of them, or its cancel entry, was read.
fn enough(found: &[PendingEntry], limit: usize, next_ms: u64, gone: impl Fn(u64) -> bool) -> bool {
    if found.len() < limit {
        return false;
    }
    let before_next: HashSet<u64> = found
        .iter()
        .filter(|e| e.timer.deliver_at_ms < next_ms && !gone(e.timer.message_offset))
        .map(|e| e.timer.message_offset)
        .collect();
    before_next.len() >= limit
}

fn timer_of(entry: &TimerEntry) -> Timer {
    Timer { deliver_at_ms: entry.deliver_at_ms, message_offset: entry.message_offset }
}
