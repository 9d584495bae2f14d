//! How a cancel finds its timer (see `state/cancels.rs` for what is
//! remembered of cancels, and `ledger.rs` for the cancels answered on disk).
//!
//! A cancel of a timer not yet loaded appends a cancel entry to the slot its
//! second maps to now, which is where the timer is or will be cascaded to,
//! so one lookup suffices whatever the level (never O(pending)). A loaded
//! timer is dropped when it comes up. The cancel record in the commit log is
//! the caller's, written between [`Wheel::locate_for_cancel`] and
//! [`Wheel::apply_cancel`].

use std::sync::Arc;

use crate::durable::Pins;
use crate::error::Result;
use crate::timer::Timer;
use crate::timer::ledger::LedgerEntry;
use crate::timer::state::cancels::{CancelState, CancelTarget};
use crate::timer::wheel::Wheel;

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
        let prefetching = self.prefetch.as_ref().is_some_and(|p| p.second() == sec);
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
                self.slot_counts.add_unloaded(level, 1);
                self.cancels.entered_in_slot(level, offset);
            }
            CancelTarget::Prefetching => {
                // Being read in: the walk started below any entry appended now,
                // so the cancel entry is for a restart, the walk's set for now.
                self.append_to_slot(0, sec, timer, true)?;
                if let Some(prefetch) = &mut self.prefetch {
                    prefetch.cancel(offset);
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
