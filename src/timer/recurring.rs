//! Which loaded timers are recurring schedules': the ticker notes them where
//! it reads a timer's records anyway (checking a second as it is loaded, or
//! a schedule's timer indexed into a second already loaded), so that when
//! one fires it arms the next occurrence in the same record that delivers
//! it rather than a delivery record.
//!
//! Only the timer's record offset is kept, by the loaded second that holds
//! it, and dropped with that second: memory follows the timers loaded (a
//! million schedules every 10 s keep about 100,000 a second loaded). What
//! the occurrence needs besides (the schedule, the occurrences delivered,
//! its plan) is read again from the two records when the timer fires:
//! they were read as it was loaded, a second or two before, so they are
//! in memory, and keeping them instead cost about 90 bytes a timer (the
//! plan most of it), 36 MB of the heap for a million schedules.

use std::collections::{HashSet, VecDeque};

use crate::timer::Timer;

/// Keyed by offsets the store wrote, never by what a client chose: a fast
/// hash that needs no resistance to chosen keys (SipHash stood out in a
/// profile of the ticking thread at 100 k occurrences/s; foldhash took about
/// 5% off its CPU time, two pairs of runs side by side).
type FastSet<K> = HashSet<K, foldhash::fast::FixedState>;

/// The schedules' timers of the loaded seconds, oldest second first.
#[derive(Default)]
pub(crate) struct Recurring {
    seconds: VecDeque<(u64, FastSet<u64>)>,
}

impl Recurring {
    /// Notes that `timer`, held in the wheel's loaded `second`, is a schedule's.
    pub fn learn(&mut self, second: u64, timer: Timer) {
        // Seconds are loaded in order: the newest is nearly always the one.
        let at = match self.seconds.back() {
            Some((s, _)) if *s == second => self.seconds.len() - 1,
            _ => {
                let at = self.seconds.partition_point(|(s, _)| *s < second);
                if self.seconds.get(at).is_none_or(|(s, _)| *s != second) {
                    self.seconds.insert(at, (second, FastSet::default()));
                }
                at
            }
        };
        self.seconds[at].1.insert(timer.message_offset);
    }

    /// Whether `timer` is a schedule's; it is forgotten. A timer is held
    /// in its own second or a later one (an overdue timer indexed late).
    pub fn take(&mut self, timer: &Timer) -> bool {
        let due_second = timer.deliver_at_ms / 1000;
        let from = self.seconds.partition_point(|(s, _)| *s < due_second);
        self.seconds.range_mut(from..).any(|(_, timers)| timers.remove(&timer.message_offset))
    }

    /// Whether no loaded timer is known to be a schedule's.
    pub fn is_empty(&self) -> bool {
        self.seconds.iter().all(|(_, timers)| timers.is_empty())
    }

    /// Forgets the seconds before `second`, which the wheel has handed out:
    /// what is left of them was cancelled while loaded and will not fire.
    pub fn forget_before(&mut self, second: u64) {
        while self.seconds.front().is_some_and(|(s, _)| *s < second) {
            self.seconds.pop_front();
        }
    }

    /// Forgets everything (the wheel is rebuilt).
    pub fn clear(&mut self) {
        self.seconds.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(deliver_at_ms: u64, message_offset: u64) -> Timer {
        Timer { deliver_at_ms, message_offset }
    }

    #[test]
    fn a_timer_is_found_in_its_second_or_a_later_one_once_and_forgotten_with_its_second() {
        let mut recurring = Recurring::default();
        recurring.learn(11, t(11_000, 100));
        recurring.learn(10, t(10_500, 200));
        // Overdue: indexed into a later second than its own.
        recurring.learn(12, t(9_000, 300));
        recurring.learn(12, t(12_001, 400));
        assert!(recurring.take(&t(10_500, 200)));
        assert!(!recurring.take(&t(10_500, 200)), "once");
        assert!(recurring.take(&t(9_000, 300)));
        assert!(!recurring.take(&t(11_000, 999)), "another record at that time");
        recurring.forget_before(12);
        assert!(!recurring.take(&t(11_000, 100)), "its second was handed out: it was cancelled");
        assert!(!recurring.is_empty());
        assert!(recurring.take(&t(12_001, 400)));
        assert!(recurring.is_empty());
    }
}
