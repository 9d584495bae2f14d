//! Timers the ticking thread armed by a record of its own (a reschedule, an
//! occurrence arming the schedule's next, a resume) that the dispatcher has
//! not handed back yet.
//!
//! The wheel takes every timer from the dispatcher, which indexes the log in
//! order: a timer the ticking thread arms reaches the wheel a moment after
//! the thread wrote its record, once the record is durable and indexed. The
//! timer it replaced left the wheel when the record was written. A listing
//! asked in that moment found neither: a schedule vanished from
//! [`Store::pending`](crate::Store::pending) for a few milliseconds after
//! each occurrence. They are kept here until the wheel has them, and a
//! listing adds them.
//!
//! Few are held at once: those written in the last flush interval or so.

use std::ops::Range;

use crate::timer::Timer;

/// The timers, in the order of their records (so by name).
#[derive(Debug, Default)]
pub(crate) struct ArmedAhead(Vec<Timer>);

impl ArmedAhead {
    /// Notes `timer`, named by the record the ticking thread just wrote.
    pub fn armed(&mut self, timer: Timer) {
        debug_assert!(
            self.0.last().is_none_or(|t| t.message_offset < timer.message_offset),
            "the ticking thread's records are appended in order"
        );
        self.0.push(timer);
    }

    /// Forgets the timers named below `offset`: the dispatcher sends timers
    /// in log order, so each of them is in the wheel, or never will be
    /// (its record did not check out).
    pub fn handed_back_below(&mut self, offset: u64) {
        let handed = self.0.partition_point(|t| t.message_offset < offset);
        self.0.drain(..handed);
    }

    /// How many are held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Those due in `window_ms`.
    pub fn due_in(&self, window_ms: &Range<u64>) -> impl Iterator<Item = Timer> {
        self.0.iter().copied().filter(|t| window_ms.contains(&t.deliver_at_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timer(deliver_at_ms: u64, message_offset: u64) -> Timer {
        Timer { deliver_at_ms, message_offset }
    }

    #[test]
    fn timers_are_held_until_the_dispatcher_is_past_their_records() {
        let mut ahead = ArmedAhead::default();
        ahead.armed(timer(5_000, 100));
        ahead.armed(timer(2_000, 160));
        ahead.armed(timer(9_000, 220));
        assert_eq!(ahead.due_in(&(0..u64::MAX)).count(), 3);
        assert_eq!(ahead.due_in(&(1_000..6_000)).collect::<Vec<_>>(), [timer(5_000, 100), timer(2_000, 160)]);
        ahead.handed_back_below(160);
        assert_eq!(ahead.due_in(&(0..u64::MAX)).collect::<Vec<_>>(), [timer(2_000, 160), timer(9_000, 220)]);
        ahead.handed_back_below(221);
        assert_eq!(ahead.due_in(&(0..u64::MAX)).count(), 0);
    }
}
