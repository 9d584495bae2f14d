//! A level-0 slot being read into memory, a bounded number of entries per
//! tick: where the walk of its chain stands, the timers read so far, and the
//! cancel entries met on the way.

use std::collections::HashSet;

use crate::format::slot::Slot;
use crate::format::timer_entry::TimerEntry;
use crate::timer::Timer;

/// The most timers a prefetch reserves room for up front.
const PREFETCH_CAPACITY: usize = 65_536;

/// A level-0 slot being read into memory.
pub(crate) struct Prefetch {
    second: u64,
    /// The slot's index.
    slot: u64,
    /// The next entry to read (0: the chain ended).
    cursor: u64,
    /// Entries still to read, by the slot's count.
    remaining: u32,
    timers: Vec<Timer>,
    /// Messages whose timers a cancel entry in this slot removes.
    cancels: HashSet<u64>,
    /// Cancel entries the slot record counts.
    cancel_entries: u32,
    /// The slot's entries still counted (with its cancel entries, as an
    /// unloaded slot is): its count, less the settled timers the read
    /// skipped, plus timers indexed into it since, less cancels made since.
    held: u32,
    /// How many of `timers` the loading check has seen.
    checked: usize,
}

impl Prefetch {
    /// Starts reading `slot` (index `index`), which holds `second`.
    pub fn new(second: u64, index: u64, slot: &Slot) -> Self {
        Self {
            second,
            slot: index,
            cursor: slot.head,
            remaining: slot.count,
            // The count comes from disk: only a hint, bounded (a damaged
            // count is found when the chain ends before it).
            timers: Vec::with_capacity((slot.count as usize).min(PREFETCH_CAPACITY)),
            cancels: HashSet::new(),
            cancel_entries: slot.cancels,
            held: slot.count,
            checked: 0,
        }
    }

    /// The second being read in.
    pub fn second(&self) -> u64 {
        self.second
    }

    /// The index of the slot being read.
    pub fn slot(&self) -> u64 {
        self.slot
    }

    /// The slot's entries still counted (see the field).
    pub fn held(&self) -> u32 {
        self.held
    }

    /// Cancel entries the slot record counts.
    pub fn cancel_entries(&self) -> u32 {
        self.cancel_entries
    }

    /// The timers read so far.
    pub fn timers(&self) -> &[Timer] {
        &self.timers
    }

    /// The messages whose timers a cancel entry read so far removes.
    pub fn cancels(&self) -> &HashSet<u64> {
        &self.cancels
    }

    /// The entry to read next and how many are left to read.
    pub fn unread(&self) -> (u64, u32) {
        (self.cursor, self.remaining)
    }

    /// Whether the slot's count of entries is read.
    pub fn is_read(&self) -> bool {
        self.remaining == 0
    }

    /// The entry to read next, if the count has entries left; `Some(0)`
    /// means the chain ended before the count did.
    pub fn next_to_read(&self) -> Option<u64> {
        (self.remaining > 0).then_some(self.cursor)
    }

    /// Takes in the entry read at the cursor. `settled`: its timer fired or
    /// was cancelled before a restart, so it is skipped.
    pub fn read(&mut self, entry: TimerEntry, settled: bool) {
        debug_assert!(self.remaining > 0, "a prefetch read past its slot's count");
        if entry.cancel {
            self.cancels.insert(entry.message_offset);
        } else if !settled {
            self.timers
                .push(Timer { deliver_at_ms: entry.deliver_at_ms, message_offset: entry.message_offset });
        } else {
            debug_assert!(self.held > 0, "a prefetch holds fewer entries than it skipped");
            self.held -= 1;
        }
        self.cursor = entry.prev;
        self.remaining -= 1;
    }

    /// A timer was indexed into the second being read (below the walk, so
    /// it is not read twice).
    pub fn add_indexed(&mut self, timer: Timer) {
        self.timers.push(timer);
        self.held += 1;
    }

    /// A timer of the second being read is cancelled: the cancel entry
    /// appended for it is below the walk, so the walk's set holds it now.
    pub fn cancel(&mut self, offset: u64) {
        self.cancels.insert(offset);
        debug_assert!(self.held > 0, "a cancel of a timer the prefetch does not hold");
        self.held -= 1;
    }

    /// Runs `check` over the timers read since the last check; those it
    /// removes are no longer held.
    pub fn check_new(&mut self, check: &mut dyn FnMut(u64, &mut Vec<Timer>)) {
        let mut read = self.timers.split_off(self.checked);
        let before = read.len();
        check(self.second, &mut read);
        let removed = (before - read.len()) as u32;
        debug_assert!(self.held >= removed, "a prefetch holds fewer entries than it read");
        self.held -= removed;
        self.timers.append(&mut read);
        self.checked = self.timers.len();
    }

    /// The second read whole: its timers, the messages its cancel entries
    /// cancel, and how many cancel entries its slot counted.
    pub fn into_read(self) -> (Vec<Timer>, HashSet<u64>, u32) {
        debug_assert!(self.is_read(), "a prefetch loaded before it was read");
        (self.timers, self.cancels, self.cancel_entries)
    }
}
