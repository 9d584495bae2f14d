//! What the wheel may delete: the timer-log files no chain a restart could
//! read reaches any more, and the cancel-ledger files no handle can ask about.
//!
//! A restart resumes at the older of the last two checkpoints on disk (the
//! newest may be torn), so a file is deleted only once no chain of a wheel
//! resumed at that checkpoint's tick second reaches it: neither a slot it
//! would still load or cascade, nor the old chain of a slot reused since
//! (a power loss can leave the slot's old record on disk).

use crate::error::Result;
use crate::timer::geometry::{LEVELS, is_live, slot_index, timer_log_of};
use crate::timer::state::slots::SlotCount;
use crate::timer::wheel::Wheel;

impl Wheel {
    /// Remembers the chain of slot `index` of `level`, which held `window`
    /// and is about to be reused: a restart from an older checkpoint may
    /// still read it, so its timer-log files are kept until that window has passed.
    pub(super) fn retire(&mut self, level: usize, index: u64, window: u64) {
        let first = self.tails.get(index, window).unwrap_or(1);
        self.retired.retire(level, window, first);
    }

    /// The oldest entry of each timer log that a wheel resumed at
    /// `tick_second` may read: the first entry of every chain it would still
    /// load or cascade. 1 (keep everything) where such a chain's start is unknown.
    pub fn first_needed_entries(&self, tick_second: u64) -> [u64; 2] {
        // Saturating: a wheel resumed at second 0 has loaded nothing (as in `geometry::slot_is_live`).
        let loaded_through = tick_second.saturating_sub(1);
        // A resumed wheel appends late timers to the chain of second
        // `loaded_through` (see `insert`), so that chain stays readable too.
        let needed = |level: usize, window: u64| match level {
            0 => window >= loaded_through,
            _ => is_live(level, window, loaded_through),
        };
        let mut first = [self.logs[0].end(), self.logs[1].end()];
        self.retired.lower_first_needed(needed, &mut first);
        for (level, l) in LEVELS.iter().enumerate() {
            for i in 0..l.slots {
                let index = slot_index(level, i);
                let SlotCount { window, count, .. } = self.slot_counts.get(index);
                if count > 0 && needed(level, window) {
                    let start = self.tails.get(index, window).unwrap_or(1);
                    first[timer_log_of(level)] = first[timer_log_of(level)].min(start);
                }
            }
        }
        first
    }

    /// Deletes the timer-log files no chain of a wheel resumed at
    /// `tick_second` would read (`tick_second` must be one a checkpoint on
    /// disk vouches for). Returns how many.
    pub fn reclaim_timer_logs(&mut self, tick_second: u64) -> Result<u64> {
        let first = self.first_needed_entries(tick_second);
        // Saturating: as in `first_needed_entries`.
        let loaded_through = tick_second.saturating_sub(1);
        self.retired.keep(|level, window| match level {
            0 => window >= loaded_through,
            _ => is_live(level, window, loaded_through),
        });
        let near = self.logs[0].delete_files_below(first[0])?;
        Ok(near + self.logs[1].delete_files_below(first[1])?)
    }

    /// Deletes the ledger files no handle can ask about any more (see
    /// [`CancelLedger::reclaim`](crate::timer::ledger::CancelLedger::reclaim)).
    pub fn reclaim_ledger(&mut self, log_start: u64, relocated_from_ms: u64) -> Result<u64> {
        self.cancels.ledger_mut().reclaim(log_start, relocated_from_ms)
    }
}
