//! The seconds the wheel has loaded into memory and not yet fully delivered.
//!
//! Each loaded second holds its slot's timers sorted once by (deliver time,
//! commit-log offset), a cursor, and a small heap for timers indexed into it
//! after it was loaded. Only a few seconds are loaded at a time (the oldest
//! undelivered one and the prefetch ahead), so the earliest timer is the
//! minimum of a handful of candidates.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::timer::Timer;
use crate::timer::state::cancels::Cancels;

/// One loaded second.
struct Second {
    second: u64,
    /// The caller's mark when the second was loaded (the commit-log end):
    /// deliveries of its timers all lie after it.
    mark: u64,
    sorted: Vec<Timer>,
    next: usize,
    late: BinaryHeap<Reverse<Timer>>,
}

impl Second {
    fn peek(&self) -> Option<Timer> {
        let a = self.sorted.get(self.next).copied();
        let b = self.late.peek().map(|Reverse(t)| *t);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn pop(&mut self) -> Option<Timer> {
        let top = self.peek()?;
        if self.sorted.get(self.next) == Some(&top) {
            self.next += 1;
        } else {
            self.late.pop();
        }
        Some(top)
    }

    fn remaining(&self) -> usize {
        self.sorted.len() - self.next + self.late.len()
    }

    fn contains(&self, timer: &Timer) -> bool {
        self.sorted[self.next..].binary_search(timer).is_ok() || self.late.iter().any(|Reverse(t)| t == timer)
    }

    fn timers(&self) -> impl Iterator<Item = &Timer> {
        self.sorted[self.next..].iter().chain(self.late.iter().map(|Reverse(t)| t))
    }
}

/// Timers a second holds from which they are spread by millisecond before
/// sorting: below it, one comparison sort costs less than a thousand counts.
const SPREAD_AT: usize = 4096;

/// Runs a second's timers are spread into: the overdue ones (due before
/// it, indexed after their own second was loaded), then one per millisecond.
const RUNS: usize = 1 + 1000;

/// Sorts the timers of `second` by (deliver time, offset), as the wheel
/// hands them out. A big second is first spread by millisecond (two passes:
/// count, then place), so that only each millisecond's run is left to sort
/// by offset; the slot's chain lists a run nearly in reverse log order,
/// which the sort finds and turns in one pass. A comparison sort of the
/// whole second was a tenth of the ticker's cost of firing a timer.
fn sort_timers(second: u64, timers: &mut Vec<Timer>) {
    let start_ms = second * 1000;
    // Past the second's last millisecond: `RUNS`, which no run holds.
    let run = |t: &Timer| match t.deliver_at_ms.checked_sub(start_ms) {
        None => 0,
        Some(ms) => usize::try_from(ms).ok().filter(|&ms| ms < 1000).map_or(RUNS, |ms| 1 + ms),
    };
    // A timer due after its second is never loaded into it; if one were, the
    // plain sort still orders it.
    if timers.len() < SPREAD_AT || timers.iter().any(|t| run(t) >= RUNS) {
        timers.sort_unstable();
        return;
    }
    let mut starts = vec![0usize; RUNS + 1];
    for t in timers.iter() {
        starts[run(t) + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut next = starts.clone();
    let mut spread = timers.clone();
    for t in timers.iter() {
        spread[next[run(t)]] = *t;
        next[run(t)] += 1;
    }
    for bounds in starts.windows(2) {
        spread[bounds[0]..bounds[1]].sort_unstable();
    }
    *timers = spread;
}

/// The loaded seconds, oldest first.
#[derive(Default)]
pub(crate) struct Loaded {
    seconds: VecDeque<Second>,
}

impl Loaded {
    /// Adds a freshly loaded second (later than every loaded one).
    pub fn push(&mut self, second: u64, mark: u64, mut timers: Vec<Timer>) {
        sort_timers(second, &mut timers);
        debug_assert!(self.seconds.back().is_none_or(|s| s.second < second));
        self.seconds.push_back(Second { second, mark, sorted: timers, next: 0, late: BinaryHeap::new() });
    }

    /// Adds a timer to loaded second `second`, loading an empty one with `mark` if needed.
    pub fn add_late(&mut self, second: u64, mark: u64, timer: Timer) {
        let at = self.seconds.partition_point(|s| s.second < second);
        if self.seconds.get(at).is_none_or(|s| s.second != second) {
            let empty = Second { second, mark, sorted: Vec::new(), next: 0, late: BinaryHeap::new() };
            self.seconds.insert(at, empty);
        }
        self.seconds[at].late.push(Reverse(timer));
    }

    /// The earliest timer.
    pub fn peek(&self) -> Option<Timer> {
        self.seconds.iter().filter_map(Second::peek).min()
    }

    /// Removes and returns the earliest timer if it is due at `now_ms`
    /// (one look at each loaded second); drops seconds left empty.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<Timer> {
        let (at, top) = (self.seconds.iter().enumerate())
            .filter_map(|(at, s)| s.peek().map(|t| (at, t)))
            .min_by_key(|&(_, t)| t)?;
        if top.deliver_at_ms > now_ms {
            return None;
        }
        self.seconds[at].pop();
        while self.seconds.front().is_some_and(|s| s.remaining() == 0) {
            self.seconds.pop_front();
        }
        Some(top)
    }

    /// Whether `timer` is loaded and not yet handed out.
    pub fn contains(&self, timer: &Timer) -> bool {
        self.seconds.iter().any(|s| s.contains(timer))
    }

    /// The oldest loaded second still holding timers, and its mark.
    pub fn oldest(&self) -> Option<(u64, u64)> {
        self.seconds.front().map(|s| (s.second, s.mark))
    }

    /// How many seconds are loaded.
    pub fn len(&self) -> usize {
        self.seconds.len()
    }

    /// Timers loaded and not yet handed out.
    pub fn pending(&self) -> usize {
        self.seconds.iter().map(Second::remaining).sum()
    }

    /// Adds each loaded timer not cancelled to `counts[bucket(deliver_at_ms)]`,
    /// where `bucket` grows with time. A second whose last millisecond is in
    /// bucket 0 is added whole, less its share of the cancelled loaded
    /// timers: a timer kept in a second is due in it or earlier (an overdue
    /// one indexed late), so in bucket 0 too. Seconds loaded are the next
    /// few, so a burst of a million timers costs one addition.
    pub fn count_by_due_time(&self, bucket: impl Fn(u64) -> usize, cancels: &Cancels, counts: &mut [u64]) {
        let mut cancelled_elsewhere = 0;
        for s in &self.seconds {
            if bucket(s.second * 1000 + 999) == 0 {
                counts[0] += s.remaining() as u64;
                continue;
            }
            for t in s.timers() {
                match cancels.is_cancelled_loaded(t.message_offset) {
                    true => cancelled_elsewhere += 1,
                    false => counts[bucket(t.deliver_at_ms)] += 1,
                }
            }
        }
        debug_assert!(
            cancels.cancelled_loaded() >= cancelled_elsewhere,
            "cancelled loaded timers miscounted"
        );
        debug_assert!(
            counts[0] >= cancels.cancelled_loaded() - cancelled_elsewhere,
            "cancelled loaded timers miscounted"
        );
        counts[0] -= cancels.cancelled_loaded() - cancelled_elsewhere;
    }

    /// The loaded timers not yet handed out, cancelled ones included.
    pub fn timers(&self) -> impl Iterator<Item = &Timer> {
        self.seconds.iter().flat_map(Second::timers)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Spreading by millisecond sorts as a comparison sort does, overdue
        /// timers, ties of one millisecond and chains in any order included.
        #[test]
        fn a_big_second_sorts_as_a_comparison_sort(
            timers in prop::collection::vec((0u64..1_300, 0u64..50_000), SPREAD_AT..SPREAD_AT + 3_000),
            reversed in any::<bool>(),
        ) {
            let second = 7;
            // Due in the second, or up to 300 ms before it (overdue).
            let mut timers: Vec<Timer> = timers
                .into_iter()
                .map(|(ms, offset)| t(second * 1000 + ms - 300, offset))
                .collect();
            if reversed {
                timers.sort_unstable_by_key(|t| Reverse(t.message_offset));
            }
            let mut expected = timers.clone();
            expected.sort_unstable();
            sort_timers(second, &mut timers);
            prop_assert_eq!(timers, expected);
        }
    }

    #[test]
    fn a_timer_due_after_its_second_is_still_sorted() {
        let mut timers: Vec<Timer> = (0..SPREAD_AT as u64).map(|i| t(7_000 + i % 1000, i)).collect();
        timers.push(t(8_500, 1));
        let mut expected = timers.clone();
        expected.sort_unstable();
        sort_timers(7, &mut timers);
        assert_eq!(timers, expected);
    }

    fn t(at: u64, off: u64) -> Timer {
        Timer { deliver_at_ms: at, message_offset: off }
    }

    #[test]
    fn pops_in_order_across_seconds_and_late_inserts() {
        let mut loaded = Loaded::default();
        loaded.push(10, 1, vec![t(10_900, 1), t(10_100, 2)]);
        loaded.push(11, 2, vec![t(11_000, 3)]);
        loaded.add_late(11, 9, t(5, 4));
        loaded.add_late(10, 9, t(10_500, 5));
        assert_eq!(loaded.pending(), 5);
        assert_eq!(loaded.pop_due(4), None, "nothing is due before 5");
        assert_eq!(loaded.pending(), 5);
        assert_eq!(loaded.oldest(), Some((10, 1)));
        let order: Vec<u64> =
            std::iter::from_fn(|| loaded.pop_due(u64::MAX)).map(|t| t.message_offset).collect();
        assert_eq!(order, [4, 2, 5, 1, 3]);
        assert_eq!(loaded.len(), 0);
        loaded.add_late(12, 7, t(1, 6));
        assert_eq!(loaded.oldest(), Some((12, 7)), "an emptied wheel reloads a second for a late timer");
    }
}
