//! The wheel's slots as counted in memory: each slot's window and count as
//! last written (the once-a-second gauges read these instead of decoding
//! and checksumming 75,840 slot records on the ticking thread; measured:
//! 31-46 ms a second, the ticker's worst lateness tail), the timers in
//! slots not yet loaded per level, and the chains of slots reused since
//! this open, whose files a restart may still read (see `wheel/reclaim.rs`).

use crate::format::slot::Slot;
use crate::timer::geometry::{LEVEL_COUNT, TOTAL_SLOTS, timer_log_of};

/// A slot's window and count, mirrored in memory.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SlotCount {
    pub window: u64,
    pub count: u32,
    /// How many of the `count` entries are cancel entries.
    pub cancels: u32,
}

/// Every slot's count, and the entries in slots not yet loaded or cascaded.
pub(crate) struct SlotCounts {
    slots: Vec<SlotCount>,
    /// Entries (timers and cancel entries) in slots not yet loaded or
    /// cascaded, per level.
    unloaded: [u64; LEVEL_COUNT],
}

impl SlotCounts {
    pub fn new() -> Self {
        Self { slots: vec![SlotCount::default(); TOTAL_SLOTS as usize], unloaded: [0; LEVEL_COUNT] }
    }

    /// Slot `index`'s window and count, as last written.
    pub fn get(&self, index: u64) -> SlotCount {
        self.slots[index as usize]
    }

    /// Slot `index` was written as `slot`.
    pub fn set(&mut self, index: u64, slot: &Slot) {
        self.slots[index as usize] =
            SlotCount { window: slot.window, count: slot.count, cancels: slot.cancels };
    }

    /// Entries in slots not yet loaded or cascaded, per level.
    pub fn unloaded(&self) -> [u64; LEVEL_COUNT] {
        self.unloaded
    }

    /// `n` entries went into slots of `level` not yet loaded.
    pub fn add_unloaded(&mut self, level: usize, n: u64) {
        self.unloaded[level] += n;
    }

    /// A slot of `level` holding `n` entries is loaded or cascaded.
    pub fn take_unloaded(&mut self, level: usize, n: u64) {
        debug_assert!(self.unloaded[level] >= n, "level {level} counts fewer entries than its slot");
        self.unloaded[level] -= n;
    }
}

/// The chain of a slot reused for a new window since this open.
#[derive(Debug, Clone, Copy)]
struct Retired {
    level: usize,
    /// The window the slot held before.
    window: u64,
    /// The old chain's first entry (1, keep everything, if unknown).
    first: u64,
}

/// The chains of slots reused for a new window since this open.
#[derive(Debug, Default)]
pub(crate) struct RetiredChains(Vec<Retired>);

impl RetiredChains {
    /// The slot of `level` that held `window`, whose chain starts at entry
    /// `first`, is reused.
    pub fn retire(&mut self, level: usize, window: u64, first: u64) {
        self.0.push(Retired { level, window, first });
    }

    /// Lowers `first[log]` to the first entry of each retired chain
    /// `needed(level, window)` keeps.
    pub fn lower_first_needed(&self, needed: impl Fn(usize, u64) -> bool, first: &mut [u64; 2]) {
        for r in self.0.iter().filter(|r| needed(r.level, r.window)) {
            let log = timer_log_of(r.level);
            first[log] = first[log].min(r.first);
        }
    }

    /// Forgets the retired chains `needed(level, window)` no longer keeps.
    pub fn keep(&mut self, needed: impl Fn(usize, u64) -> bool) {
        self.0.retain(|r| needed(r.level, r.window));
    }
}
