//! What the wheel remembers of cancels: the cancelled timers still ahead,
//! the cancel entries in slots not yet loaded (counted per level for the
//! pending gauges), and the cancel ledger (`ledger.rs`), which answers a
//! repeated cancel once a timer's second is handed out and forgotten. How a
//! cancel finds its timer is `wheel/cancel.rs`.

use std::collections::{BTreeMap, HashSet};

use crate::timer::Timer;
use crate::timer::geometry::LEVEL_COUNT;
use crate::timer::ledger::CancelLedger;
use crate::timer::state::prefetch::Prefetch;
use crate::timer::state::restart::Restart;

/// A set of offsets, hashed fast: every timer fired looks itself up in
/// `cancelled`, where SipHash cost more than the look (offsets are the
/// store's own, not chosen by a caller).
type OffsetSet = HashSet<u64, foldhash::fast::FixedState>;

/// The wheel's memory of cancels.
pub(crate) struct Cancels {
    /// Cancelled timers still ahead: loaded ones (dropped when they come
    /// up), or dropped by a cascade before their second is loaded. Each is
    /// forgotten once its second is behind; the cancel ledger answers then.
    cancelled: OffsetSet,
    /// The timers a cascade dropped with their cancel entries, by second:
    /// forgotten from `cancelled` once that second is loaded.
    cancelled_ahead: BTreeMap<u64, Vec<u64>>,
    /// Cancel entries in slots not yet loaded, per level (for the pending count).
    entries: [u64; LEVEL_COUNT],
    /// Every cancel answered `Cancelled`, on disk: answers a repeated cancel
    /// once the timer's second is handed out and forgotten (also after a restart).
    ledger: CancelLedger,
    /// Timers cancelled by an entry in a slot not yet loaded (a second cancel is a no-op).
    slot_cancels: OffsetSet,
    /// Loaded timers cancelled and not yet come up (still counted by `loaded`).
    cancelled_loaded: u64,
}

/// Where a cancel finds its timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelTarget {
    AlreadyCancelled,
    AlreadyDelivered,
    /// In a slot not loaded yet: a cancel entry goes there.
    Slot,
    /// In the second being read in.
    Prefetching,
    /// Loaded in memory, not yet handed out.
    Loaded,
}

/// What a cancel found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelState {
    Cancelled,
    AlreadyDelivered,
}

impl Cancels {
    pub fn new(ledger: CancelLedger) -> Self {
        Self {
            cancelled: OffsetSet::default(),
            cancelled_ahead: BTreeMap::new(),
            entries: [0; LEVEL_COUNT],
            ledger,
            slot_cancels: OffsetSet::default(),
            cancelled_loaded: 0,
        }
    }

    /// Cancel entries in slots not yet loaded, per level.
    pub fn entries(&self) -> [u64; LEVEL_COUNT] {
        self.entries
    }

    /// Loaded timers cancelled and not yet come up.
    pub fn cancelled_loaded(&self) -> u64 {
        self.cancelled_loaded
    }

    /// The cancel ledger.
    pub fn ledger(&self) -> &CancelLedger {
        &self.ledger
    }

    /// The cancel ledger, to record in or reclaim.
    pub fn ledger_mut(&mut self) -> &mut CancelLedger {
        &mut self.ledger
    }

    /// A live slot of `level` read at open holds `n` cancel entries.
    pub fn count_entries(&mut self, level: usize, n: u64) {
        self.entries[level] += n;
    }

    /// A cancel entry for the timer of `offset` went into a slot of `level`
    /// not loaded yet.
    pub fn entered_in_slot(&mut self, level: usize, offset: u64) {
        self.entries[level] += 1;
        self.slot_cancels.insert(offset);
    }

    /// The timer of `offset`, loaded (or being read in), is cancelled: it is
    /// dropped when it comes up. `loaded`: it is counted among the loaded.
    pub fn cancelled_in_memory(&mut self, offset: u64, loaded: bool) {
        self.cancelled.insert(offset);
        if loaded {
            self.cancelled_loaded += 1;
        }
    }

    /// A cascade from `level` took a cancel entry for the timer of
    /// `offset` out of its slot; with its timer dropped beside it, that
    /// timer (due in `second`) is remembered as cancelled until its second
    /// is loaded.
    pub fn cascaded_entry(&mut self, level: usize, offset: u64, dropped_due_second: Option<u64>) {
        debug_assert!(self.entries[level] > 0, "level {level} counts fewer cancel entries");
        self.entries[level] -= 1;
        self.slot_cancels.remove(&offset);
        if let Some(second) = dropped_due_second {
            self.cancelled.insert(offset);
            self.cancelled_ahead.entry(second).or_default().push(offset);
        }
    }

    /// Forgets the cascade-dropped cancelled timers whose second is at or
    /// before `loaded_through`.
    pub fn forget_behind(&mut self, loaded_through: u64, restart: &mut Restart) {
        while let Some(entry) = self.cancelled_ahead.first_entry()
            && *entry.key() <= loaded_through
        {
            for offset in entry.remove() {
                self.forget(offset, restart);
            }
        }
    }

    /// Whether no cancelled timer is remembered in memory any more.
    #[cfg(test)]
    pub fn holds_nothing(&self) -> bool {
        self.cancelled.is_empty() && self.cancelled_ahead.is_empty() && self.slot_cancels.is_empty()
    }

    /// The cancelled timers remembered in memory, for test messages.
    #[cfg(test)]
    pub fn held(&self) -> (&OffsetSet, &BTreeMap<u64, Vec<u64>>, &OffsetSet) {
        (&self.cancelled, &self.cancelled_ahead, &self.slot_cancels)
    }

    /// Whether the loaded timer of `offset` is cancelled (and will be dropped
    /// when it comes up).
    pub fn is_cancelled_loaded(&self, offset: u64) -> bool {
        self.cancelled.contains(&offset)
    }

    /// Whether this session already cancelled the timer of `offset`.
    pub fn knows_cancelled(&self, offset: u64) -> bool {
        self.cancelled.contains(&offset) || self.slot_cancels.contains(&offset)
    }

    /// A loaded timer came up: `true` if it was cancelled (and is dropped).
    /// `repeat`: it is a second copy, whose cancel was counted with the first.
    pub fn take_cancelled(&mut self, offset: u64, repeat: bool) -> bool {
        // Nearly always none: no hashing then.
        if self.cancelled.is_empty() || !self.cancelled.remove(&offset) {
            return false;
        }
        if !repeat {
            debug_assert!(self.cancelled_loaded > 0, "a cancelled loaded timer was not counted");
            self.cancelled_loaded -= 1;
        }
        true
    }

    /// Applies the cancel entries of a second read in whole and returns its
    /// timers: from now on the ledger answers a repeated cancel of them.
    pub fn apply_at_loading(&mut self, prefetch: Prefetch, restart: &mut Restart) -> Vec<Timer> {
        let (mut timers, cancels, cancel_entries) = prefetch.into_read();
        let applied = u64::from(cancel_entries);
        debug_assert!(self.entries[0] >= applied, "level 0 counts fewer cancel entries");
        self.entries[0] -= applied;
        if !cancels.is_empty() {
            timers.retain(|t| !cancels.contains(&t.message_offset));
            for offset in &cancels {
                self.slot_cancels.remove(offset);
                self.forget(*offset, restart);
            }
        }
        timers
    }

    /// Forgets a cancelled timer that can no longer come up from where it
    /// was. The replay may have indexed it a second time, in another second's
    /// slot: that copy counts as handed out already, so it is dropped when it
    /// comes up.
    fn forget(&mut self, offset: u64, restart: &mut Restart) {
        self.cancelled.remove(&offset);
        restart.forget(offset);
    }
}
