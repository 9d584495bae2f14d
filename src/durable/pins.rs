//! Pins: the messages whose timer was rescheduled, with the timer that
//! counts now (the latest reschedule record's) and when it is due.
//!
//! A rescheduled timer is named by its reschedule record and needs its
//! message until it fires, however long after the message's own deliver
//! time that is; retention goes by deliver times, so it asks here: a pinned
//! message is relocated, and its copy's window kept, by the pin's time.
//!
//! The pins are the cancel ledger's reschedule entries (each message's
//! latest), read when the ticking thread starts (from the pins snapshot,
//! `timer/pins`, and the ledger's entries after it: see
//! `timer/pins_snapshot.rs`) and kept up to date by it as it writes them.
//! A pin stays after its timer fired or was cancelled (the ledger
//! does not know deliveries), which only keeps its message until the pin's
//! time has passed retention's `needed_from`; it goes with its ledger file.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use crate::sync::Locked;

/// The timer a pinned message's handle reaches now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pin {
    /// The reschedule record whose timer it is.
    pub timer: u64,
    /// When it is due.
    pub deliver_at_ms: u64,
}

/// The pins, shared by the ticking thread (which writes them) and retention.
#[derive(Debug, Default)]
pub(crate) struct Pins(Mutex<Inner>);

/// The pins by message, in two sorted parts with no message in both.
///
/// A recurring schedule moves its pin at every occurrence (a million
/// schedules every 10 s: 100,000 moves a second), so nearly every change
/// moves a pin that exists. Pins are kept in one array sorted by message,
/// 24 bytes a pin, changed in place; a `BTreeMap` took 39 bytes a pin and
/// 10% of the ticking thread's time. A new pin above every other is
/// appended; one below (a first reschedule of an older timer, the first
/// occurrences of schedules created together) goes to a small map, merged
/// into the array once it holds a sixteenth as many.
#[derive(Debug, Default)]
struct Inner {
    /// Read from the ledger since the ticking thread started: until then
    /// retention deletes nothing.
    ready: bool,
    sorted: Paged,
    apart: BTreeMap<u64, Pin>,
}

/// Pins kept apart before they are merged, at least.
const APART_KEPT: usize = 1_024;

impl Inner {
    fn set(&mut self, message: u64, pin: Pin) {
        // Above every pin (pins read back in order, a new schedule): no search.
        let above_all = |inner: &Self| {
            inner.sorted.last().is_none_or(|last| last < message)
                && inner.apart.last_key_value().is_none_or(|(&m, _)| m < message)
        };
        if above_all(self) {
            return self.sorted.push((message, pin));
        }
        match self.sorted.search(message) {
            Ok(at) => self.sorted.set(at, (message, pin)),
            Err(at)
                if at == self.sorted.len()
                    && self.apart.last_key_value().is_none_or(|(&m, _)| m < message) =>
            {
                self.sorted.push((message, pin));
            }
            Err(_) => {
                self.apart.insert(message, pin);
                if self.apart.len() > (self.sorted.len() / 16).max(APART_KEPT) {
                    let apart = std::mem::take(&mut self.apart);
                    self.sorted.merge(apart.into_iter().collect());
                }
            }
        }
    }

    fn get(&self, message: u64) -> Option<Pin> {
        match self.sorted.search(message) {
            Ok(at) => Some(self.sorted.get(at).1),
            Err(_) => self.apart.get(&message).copied(),
        }
    }

    fn range(&self, messages: Range<u64>) -> impl Iterator<Item = (u64, Pin)> + '_ {
        let (from, to) =
            (self.sorted.first_at_or_after(messages.start), self.sorted.first_at_or_after(messages.end));
        let apart = self.apart.range(messages).map(|(&m, &pin)| (m, pin));
        (from..to).map(|at| self.sorted.get(at)).chain(apart)
    }
}

/// Pins on a page.
const PAGE: usize = 4_096;

/// An array of pins sorted by message, in pages of [`PAGE`]: it grows a
/// page at a time and is never copied whole (a `Vec` growing past a million
/// pins holds the old array and the new one at once, 51 MB).
#[derive(Debug, Default)]
struct Paged {
    pages: Vec<Box<[(u64, Pin)]>>,
    /// The message of each filled page's first pin: the search for a page
    /// reads this one small array rather than a line of every page
    /// (reading a million pins back from the ledger took 1.5 s without it).
    firsts: Vec<u64>,
    len: usize,
}

impl Paged {
    fn len(&self) -> usize {
        self.len
    }

    fn last(&self) -> Option<u64> {
        self.len.checked_sub(1).map(|at| self.get(at).0)
    }

    fn get(&self, at: usize) -> (u64, Pin) {
        debug_assert!(at < self.len);
        self.pages[at / PAGE][at % PAGE]
    }

    fn set(&mut self, at: usize, pin: (u64, Pin)) {
        debug_assert!(at < self.len);
        self.pages[at / PAGE][at % PAGE] = pin;
        if at.is_multiple_of(PAGE) {
            self.firsts[at / PAGE] = pin.0;
        }
    }

    fn grow_to(&mut self, len: usize) {
        while self.pages.len() * PAGE < len {
            self.pages.push(vec![(0, Pin { timer: 0, deliver_at_ms: 0 }); PAGE].into_boxed_slice());
        }
        self.firsts.resize(len.div_ceil(PAGE), 0);
        self.len = len;
    }

    fn push(&mut self, pin: (u64, Pin)) {
        debug_assert!(self.len == 0 || self.get(self.len - 1).0 < pin.0, "pushed in order");
        self.grow_to(self.len + 1);
        self.set(self.len - 1, pin);
    }

    /// Keeps the pins `keep` says, in order, moving them down in place
    /// (no second array); emptied pages are freed.
    fn retain(&mut self, keep: impl Fn(&Pin) -> bool) {
        let mut kept = 0;
        for at in 0..self.len {
            let pin = self.get(at);
            if keep(&pin.1) {
                self.set(kept, pin);
                kept += 1;
            }
        }
        self.len = kept;
        self.pages.truncate(kept.div_ceil(PAGE));
        self.firsts.truncate(kept.div_ceil(PAGE));
    }

    /// Where `message` is (`Ok`), or would go (`Err`).
    fn search(&self, message: u64) -> std::result::Result<usize, usize> {
        let at = self.first_at_or_after(message);
        if at < self.len && self.get(at).0 == message { Ok(at) } else { Err(at) }
    }

    /// The index of the first pin of `message` or a later one.
    fn first_at_or_after(&self, message: u64) -> usize {
        // The page first, by its first pin; then within it.
        let page = self.firsts.partition_point(|&first| first < message).saturating_sub(1);
        let Some(on_page) = self.pages.get(page) else { return 0 };
        let filled = (self.len - page * PAGE).min(PAGE);
        page * PAGE + on_page[..filled].partition_point(|(m, _)| *m < message)
    }

    /// Merges `apart` (sorted, no message in the array) in, from the end:
    /// one pass, no sort, no second array.
    fn merge(&mut self, apart: Vec<(u64, Pin)>) {
        let kept = self.len;
        self.grow_to(kept + apart.len());
        let (mut from_kept, mut from_apart) = (kept, apart.len());
        for to in (0..self.len).rev() {
            if from_apart == 0 {
                break;
            }
            if from_kept > 0 && self.get(from_kept - 1).0 > apart[from_apart - 1].0 {
                from_kept -= 1;
                self.set(to, self.get(from_kept));
            } else {
                from_apart -= 1;
                self.set(to, apart[from_apart]);
            }
        }
    }
}

/// Pins being read from the ledger, in its order (a message's latest last).
///
/// The ledger holds a reschedule entry per occurrence of every schedule, in
/// the order they fired, so its messages come in no order: set one by one,
/// each would search a page at random (a million schedules' 3.6 M entries
/// took 1.5 s). They are set a batch at a time instead, sorted by message,
/// so the search walks the pages in order.
#[derive(Default)]
pub(crate) struct PinsRead {
    read: Inner,
    batch: Vec<(u64, Pin)>,
}

/// Entries sorted and set together (12 MB).
const READ_BATCH: usize = 1 << 19;

impl PinsRead {
    pub fn set(&mut self, message_offset: u64, pin: Pin) {
        self.batch.push((message_offset, pin));
        if self.batch.len() >= READ_BATCH {
            self.set_batch();
        }
    }

    fn set_batch(&mut self) {
        // Stable: a message's entries keep the ledger's order, so its latest is set last.
        self.batch.sort_by_key(|(message, _)| *message);
        for (message, pin) in self.batch.drain(..) {
            self.read.set(message, pin);
        }
    }

    fn finish(mut self) -> Inner {
        self.set_batch();
        self.read
    }
}

impl Pins {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.0.locked()
    }

    /// Every pin, read whole from the ledger.
    pub fn replace_all(&self, read: PinsRead) {
        *self.inner() = Inner { ready: true, ..read.finish() };
    }

    /// Forgets the pins of reschedule records below `record_offset` (their
    /// ledger entries were deleted), in place.
    pub fn forget_timers_below(&self, record_offset: u64) {
        let mut inner = self.inner();
        inner.sorted.retain(|pin| pin.timer >= record_offset);
        inner.apart.retain(|_, pin| pin.timer >= record_offset);
    }

    /// Whether the pins were read from the ledger.
    pub fn ready(&self) -> bool {
        self.inner().ready
    }

    /// The message at `message_offset` is now due as `pin` says.
    pub fn set(&self, message_offset: u64, pin: Pin) {
        self.inner().set(message_offset, pin);
    }

    pub fn get(&self, message_offset: u64) -> Option<Pin> {
        self.inner().get(message_offset)
    }

    /// The pins of messages in `messages` due at or after `from_ms`.
    pub fn due_from(&self, messages: Range<u64>, from_ms: u64) -> Vec<(u64, Pin)> {
        let inner = self.inner();
        inner.range(messages).filter(|(_, pin)| pin.deliver_at_ms >= from_ms).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Whatever the order pins come in, they read as a map of each
    /// message's latest would: new messages above the rest, older ones
    /// out of order (enough to be merged), and moves of both.
    #[test]
    fn pins_read_as_a_map_of_each_messages_latest() {
        let (pins, mut model, mut history) = (Pins::default(), BTreeMap::new(), Vec::new());
        let mut rng = fastrand::Rng::with_seed(7);
        for i in 0..20_000u64 {
            let message = match rng.u8(0..4) {
                0 => rng.u64(0..=i * 10),
                _ => i * 10 + 5,
            };
            let pin = Pin { timer: message + 1 + i, deliver_at_ms: rng.u64(0..1_000) };
            pins.set(message, pin);
            model.insert(message, pin);
            history.push((message, pin));
            if i % 997 == 0 {
                let probe = rng.u64(0..=i * 10 + 5);
                assert_eq!(pins.get(probe), model.get(&probe).copied(), "pin of {probe}");
            }
        }
        for (lo, hi) in [(0, 200_000), (5_000, 9_000), (33, 34)] {
            let mut found = pins.due_from(lo..hi, 500);
            found.sort_unstable_by_key(|(m, _)| *m);
            let expected: Vec<_> =
                model.range(lo..hi).filter(|(_, p)| p.deliver_at_ms >= 500).map(|(&m, &p)| (m, p)).collect();
            assert_eq!(found, expected);
        }
        // Forgetting old timers keeps the rest in order, as a model would.
        let forgotten = Pins::default();
        history.iter().for_each(|&(m, p)| forgotten.set(m, p));
        forgotten.forget_timers_below(100_000);
        let mut left = forgotten.due_from(0..u64::MAX, 0);
        left.sort_unstable_by_key(|(m, _)| *m);
        let kept: Vec<_> = model.iter().filter(|(_, p)| p.timer >= 100_000).map(|(&m, &p)| (m, p)).collect();
        assert_eq!(left, kept);
        assert!(!kept.is_empty() && kept.len() < model.len());
        for (m, p) in kept.iter().step_by(97) {
            assert_eq!(forgotten.get(*m), Some(*p), "found by search after the move");
        }
        // Read back from the whole history, as from the ledger: each message's latest wins.
        let (reread, mut read) = (Pins::default(), PinsRead::default());
        history.into_iter().for_each(|(m, p)| read.set(m, p));
        reread.replace_all(read);
        assert!(reread.ready());
        let mut all = reread.due_from(0..u64::MAX, 0);
        all.sort_unstable_by_key(|(m, _)| *m);
        assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    }
}
