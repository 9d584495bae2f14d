//! What the wheel knows of cancels, and how a cancel finds its timer.
//!
//! A cancel of a timer not yet loaded appends a cancel entry to the slot its
//! second maps to now, which is where the timer is or will be cascaded to,
//! so one lookup suffices whatever the level (never O(pending)). A loaded
//! timer is dropped when it comes up. Once a timer's second is handed out the
//! wheel forgets it, and the cancel ledger (`ledger.rs`) answers a repeated
//! cancel. The cancel record in the commit log is the caller's, written
//! between [`Wheel::locate_for_cancel`] and [`Wheel::apply_cancel`].

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::durable::Pins;

use crate::error::Result;
use crate::timer::Timer;
use crate::timer::geometry::LEVEL_COUNT;
use crate::timer::ledger::{CancelLedger, LedgerEntry};
use crate::timer::restart::Restart;
use crate::timer::wheel::{Prefetch, Wheel};

/// The wheel's memory of cancels.
pub(crate) struct Cancels {
    /// Cancelled timers still ahead: loaded ones (dropped when they come
    /// up), or dropped by a cascade before their second is loaded. Each is
    /// forgotten once its second is behind; the cancel ledger answers then.
    cancelled: HashSet<u64>,
    /// The timers a cascade dropped with their cancel entries, by second:
    /// forgotten from `cancelled` once that second is loaded.
    cancelled_ahead: BTreeMap<u64, Vec<u64>>,
    /// Cancel entries in slots not yet loaded, per level (for the pending count).
    entries: [u64; LEVEL_COUNT],
    /// Every cancel answered `Cancelled`, on disk: answers a repeated cancel
    /// once the timer's second is handed out and forgotten (also after a restart).
    ledger: CancelLedger,
    /// Timers cancelled by an entry in a slot not yet loaded (a second cancel is a no-op).
    slot_cancels: HashSet<u64>,
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

/// What [`Wheel::cancel`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelState {
    Cancelled,
    AlreadyDelivered,
}

impl Cancels {
    pub fn new(ledger: CancelLedger) -> Self {
        Self {
            cancelled: HashSet::new(),
            cancelled_ahead: BTreeMap::new(),
            entries: [0; LEVEL_COUNT],
            ledger,
            slot_cancels: HashSet::new(),
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
    pub(super) fn count_entries(&mut self, level: usize, n: u64) {
        self.entries[level] += n;
    }

    /// A cancel entry for the timer of `offset` went into a slot of `level`
    /// not loaded yet.
    fn entered_in_slot(&mut self, level: usize, offset: u64) {
        self.entries[level] += 1;
        self.slot_cancels.insert(offset);
    }

    /// The timer of `offset`, loaded (or being read in), is cancelled: it is
    /// dropped when it comes up. `loaded`: it is counted among the loaded.
    fn cancelled_in_memory(&mut self, offset: u64, loaded: bool) {
        self.cancelled.insert(offset);
        if loaded {
            self.cancelled_loaded += 1;
        }
    }

    /// A cascade from `level` took a cancel entry for the timer of
    /// `offset` out of its slot; with its timer dropped beside it, that
    /// timer (due in `second`) is remembered as cancelled until its second
    /// is loaded.
    fn cascaded_entry(&mut self, level: usize, offset: u64, dropped_due_second: Option<u64>) {
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
    fn forget_behind(&mut self, loaded_through: u64, restart: &mut Restart) {
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
    pub fn held(&self) -> (&HashSet<u64>, &BTreeMap<u64, Vec<u64>>, &HashSet<u64>) {
        (&self.cancelled, &self.cancelled_ahead, &self.slot_cancels)
    }

    /// Whether the loaded timer of `offset` is cancelled (and will be dropped
    /// when it comes up).
    pub fn is_cancelled_loaded(&self, offset: u64) -> bool {
        self.cancelled.contains(&offset)
    }

    /// Whether this session already cancelled the timer of `offset`.
    pub(super) fn knows_cancelled(&self, offset: u64) -> bool {
        self.cancelled.contains(&offset) || self.slot_cancels.contains(&offset)
    }

    /// A loaded timer came up: `true` if it was cancelled (and is dropped).
    /// `repeat`: it is a second copy, whose cancel was counted with the first.
    pub fn take_cancelled(&mut self, offset: u64, repeat: bool) -> bool {
        if !self.cancelled.remove(&offset) {
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
    pub(super) fn apply_at_loading(&mut self, prefetch: Prefetch, restart: &mut Restart) -> Vec<Timer> {
        let mut timers = prefetch.timers;
        let applied = u64::from(prefetch.cancel_entries);
        debug_assert!(self.entries[0] >= applied, "level 0 counts fewer cancel entries");
        self.entries[0] -= applied;
        if !prefetch.cancels.is_empty() {
            timers.retain(|t| !prefetch.cancels.contains(&t.message_offset));
            for offset in &prefetch.cancels {
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

impl Wheel {
    /// Cancels a pending timer (see the module docs). The cancel record and
    /// the ledger entry are the caller's (see [`record_cancel`](Self::record_cancel)).
    pub fn cancel(&mut self, timer: Timer) -> Result<CancelState> {
        let where_ = self.locate_for_cancel(&timer)?;
        self.apply_cancel(timer, where_)
    }

    /// What cancelling `timer` would answer, without changing anything: the
    /// caller writes the cancel record before [`apply_cancel`](Self::apply_cancel).
    pub fn locate_for_cancel(&self, timer: &Timer) -> Result<CancelTarget> {
        let offset = timer.message_offset;
        if self.restart.cancelled_before(offset) || self.cancels.knows_cancelled(offset) {
            return Ok(CancelTarget::AlreadyCancelled);
        }
        if self.restart.delivered_before(offset) {
            return Ok(CancelTarget::AlreadyDelivered);
        }
        let sec = timer.deliver_at_ms / 1000;
        let prefetching = self.prefetch.as_ref().is_some_and(|p| p.second == sec);
        if prefetching || sec > self.loaded_through {
            // Its cancel may be a slot entry an earlier session wrote, which
            // only the ledger remembers: a second cancel record would settle
            // the timer twice in the log. This session's cancels are all in
            // memory, and a lookup costs a cancel 2.5x (`timer_control`).
            if self.restart.before_open(offset) && self.cancels.ledger().contains(offset)? {
                return Ok(CancelTarget::AlreadyCancelled);
            }
            return Ok(if prefetching { CancelTarget::Prefetching } else { CancelTarget::Slot });
        }
        // Loaded: pending exactly if not yet handed out (a replayed copy may have been).
        if self.loaded.contains(timer) && !self.restart.handed_out(offset) {
            return Ok(CancelTarget::Loaded);
        }
        // Handed out or dropped: only the ledger still knows which (read only
        // here, where the memory of this session has nothing to say).
        if self.cancels.ledger().contains(offset)? {
            return Ok(CancelTarget::AlreadyCancelled);
        }
        Ok(CancelTarget::AlreadyDelivered)
    }

    /// Enters a cancel the store answered `Cancelled` in the ledger, with
    /// its cancel record's commit-log offset (records come in log order).
    pub fn record_cancel(&mut self, timer: Timer, cancel_offset: u64) -> Result<()> {
        self.record_in_ledger(LedgerEntry::cancel(timer, cancel_offset))
    }

    /// Enters a cancel or a reschedule in the ledger (records come in log order).
    pub fn record_in_ledger(&mut self, entry: LedgerEntry) -> Result<()> {
        self.cancels.ledger_mut().record(entry)
    }

    /// The pins (see `durable/pins.rs`), read from the ledger, to share with retention.
    pub fn pins(&self) -> Arc<Pins> {
        self.cancels.ledger().pins()
    }

    /// Reads the pins from the ledger, into `pins` if given (the ones
    /// retention reads, kept across a rebuild).
    pub fn load_pins(&mut self, pins: Option<Arc<Pins>>) -> Result<()> {
        match pins {
            Some(pins) => self.cancels.ledger_mut().share_pins(pins),
            None => self.cancels.ledger_mut().load_pins(),
        }
    }

    /// The timer of the message a handle names now: the message's own
    /// (`timer`), or that of its latest reschedule record.
    pub fn current_timer(&self, timer: Timer) -> Result<Timer> {
        let latest = self.cancels.ledger().latest_reschedule(timer.message_offset)?;
        Ok(latest.map_or(timer, |entry| entry.rescheduled_timer()))
    }

    /// Carries out a cancel located by [`locate_for_cancel`](Self::locate_for_cancel).
    pub fn apply_cancel(&mut self, timer: Timer, target: CancelTarget) -> Result<CancelState> {
        let offset = timer.message_offset;
        let sec = timer.deliver_at_ms / 1000;
        match target {
            CancelTarget::AlreadyCancelled => {}
            CancelTarget::AlreadyDelivered => return Ok(CancelState::AlreadyDelivered),
            CancelTarget::Slot => {
                let (level, window) = self.place(sec).expect("a second not yet loaded");
                self.append_to_slot(level, window, timer, true)?;
                self.unloaded[level] += 1;
                self.cancels.entered_in_slot(level, offset);
            }
            CancelTarget::Prefetching => {
                // Being read in: the walk started below any entry appended now,
                // so the cancel entry is for a restart, the walk's set for now.
                self.append_to_slot(0, sec, timer, true)?;
                if let Some(prefetch) = &mut self.prefetch {
                    prefetch.cancels.insert(offset);
                    debug_assert!(prefetch.held > 0, "a cancel of a timer the prefetch does not hold");
                    prefetch.held -= 1;
                }
                self.cancels.cancelled_in_memory(offset, false);
            }
            CancelTarget::Loaded => self.cancels.cancelled_in_memory(offset, true),
        }
        Ok(CancelState::Cancelled)
    }

    /// A cascade from `level` met the cancel entry of `timer`. With the
    /// timer in the same slot (`with_its_timer`) the two cancel out here, and
    /// the timer is remembered as cancelled until its second is loaded, so a
    /// later cancel still answers `Cancelled` (and adds no entry); otherwise
    /// the timer is coarser still and the cancel moves down with it.
    pub(super) fn cascade_cancel(&mut self, level: usize, timer: Timer, with_its_timer: bool) -> Result<()> {
        let dropped_due_second = with_its_timer.then_some(timer.deliver_at_ms / 1000);
        self.cancels.cascaded_entry(level, timer.message_offset, dropped_due_second);
        if with_its_timer { Ok(()) } else { self.cancel(timer).map(drop) }
    }

    /// Forgets the cascade-dropped cancelled timers whose second is loaded:
    /// they can no longer be in a slot, and the ledger answers for them.
    pub(super) fn forget_cancelled_behind(&mut self) {
        self.cancels.forget_behind(self.loaded_through, &mut self.restart);
    }
}
