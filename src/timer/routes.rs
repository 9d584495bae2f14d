//! Where each loaded timer goes when it fires: its message's topic, queue and
//! tag hash. The ticker learns them when it checks a timer's record as the
//! timer's second is loaded (it reads the message then anyway), so that when
//! a run of timers fires it writes one deliveries record per queue (kind 7),
//! which the dispatcher indexes without reading a message, wherever that
//! record is no longer than the run's delivery records would be.
//!
//! Routes are kept per loaded second and dropped with it, so memory follows
//! the timers loaded. A timer the ticker did not check (one indexed into a
//! second already loaded) has no route: it gets a delivery record of its own.
//!
//! A second's routes are kept by millisecond, each millisecond's in firing
//! order (by offset, the order the wheel hands its timers out in), so taking
//! them is a walk of one finger along an array, not a hash lookup per timer
//! (a hash table of a million routes costs a cache miss or two per fired
//! timer). A millisecond's routes are learnt in the order of the slot's
//! chain, nearly their firing order, so putting them in order is nearly free.
//! A second with few timers keeps them in one array, sorted when the first
//! fires: a table by millisecond would cost it more than it saves (a clock
//! jumping an hour loads thousands of such seconds).

use std::collections::{HashMap, VecDeque};

use crate::format::record::{DELIVERIES_MAX, DELIVERY_LEN, deliveries_len};
use crate::timer::Timer;

/// A timer's route inside its second: which of the second's queues, and the tag hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    queue: u32,
    tag_hash: u32,
}

/// The routes of the timers of one millisecond (or of the overdue timers) of a second.
#[derive(Default)]
struct MillisecondRoutes {
    routes: Vec<(Timer, Route)>,
    /// Whether `routes` was learnt out of firing order and not yet sorted.
    shuffled: bool,
    /// Routes before it are taken, or were never going to be (see [`Self::take`]).
    finger: usize,
}

impl MillisecondRoutes {
    fn learn(&mut self, timer: Timer, route: Route) {
        self.shuffled |= self.routes.last().is_some_and(|(last, _)| *last > timer);
        self.routes.push((timer, route));
    }

    /// Takes the route of `timer`, if learnt here. Timers are taken in
    /// firing order: the wheel hands out the minimum of its loaded timers,
    /// so when `timer` fires, every loaded timer before it has fired (or
    /// was dropped, cancelled), and the finger may pass their routes. (A
    /// timer whose route is passed anyway gets a delivery record: slower,
    /// never wrong.)
    fn take(&mut self, timer: &Timer) -> Option<Route> {
        if self.shuffled {
            self.routes.sort_unstable_by_key(|(t, _)| *t);
            self.shuffled = false;
        }
        let rest = &self.routes[self.finger..];
        if rest.first().is_some_and(|(t, _)| t < timer) {
            self.finger += rest.partition_point(|(t, _)| t < timer);
        }
        match self.routes.get(self.finger) {
            Some(&(t, route)) if t == *timer => {
                self.finger += 1;
                Some(route)
            }
            _ => None,
        }
    }
}

/// Index 0 holds a second's overdue timers (due before it: indexed after
/// their own second was loaded), 1 + ms its timers due at millisecond ms.
const MILLISECOND_INDEXES: usize = 1001;

/// Routes a second keeps in one array before it spreads them by millisecond.
const SPREAD_AT: usize = 1024;

/// The routes of one loaded second.
#[derive(Default)]
struct SecondRoutes {
    second: u64,
    /// Topic and queue id, by the index a [`Route`] names.
    queues: Vec<(Box<str>, u32)>,
    /// Index of `queues` by topic, then queue id.
    by_name: HashMap<Box<str>, Vec<(u32, u32)>>,
    /// The index last learnt: a burst is mostly one queue.
    last: Option<u32>,
    /// Every route, while fewer than [`SPREAD_AT`] were learnt.
    few: MillisecondRoutes,
    /// By [`MILLISECOND_INDEXES`], once [`SPREAD_AT`] were learnt; empty before.
    by_millisecond: Vec<MillisecondRoutes>,
}

impl SecondRoutes {
    fn queue_index(&mut self, topic: &str, queue_id: u32) -> u32 {
        if let Some(last) = self.last
            && let (t, q) = &self.queues[last as usize]
            && **t == *topic
            && *q == queue_id
        {
            return last;
        }
        let ids = self.by_name.entry(topic.into()).or_default();
        let index = match ids.iter().find(|(q, _)| *q == queue_id) {
            Some(&(_, index)) => index,
            None => {
                let index = self.queues.len() as u32;
                self.queues.push((topic.into(), queue_id));
                ids.push((queue_id, index));
                index
            }
        };
        self.last = Some(index);
        index
    }

    /// Where `timer`'s route is kept: `None` for a timer due after this
    /// second (the wheel keeps none; it gets no route).
    fn millisecond_index(&self, timer: &Timer) -> Option<usize> {
        match timer.deliver_at_ms.checked_sub(self.second * 1000) {
            None => Some(0),
            Some(ms) => (ms < 1000).then_some(1 + ms as usize),
        }
    }

    fn learn(&mut self, timer: Timer, topic: &str, queue_id: u32, tag_hash: u32) {
        let Some(index) = self.millisecond_index(&timer) else { return };
        let queue = self.queue_index(topic, queue_id);
        let route = Route { queue, tag_hash };
        if self.by_millisecond.is_empty() && self.few.routes.len() < SPREAD_AT {
            return self.few.learn(timer, route);
        }
        if self.by_millisecond.is_empty() {
            self.spread();
        }
        self.by_millisecond[index].learn(timer, route);
    }

    /// Moves the routes learnt so far, not yet passed, into the table by millisecond.
    fn spread(&mut self) {
        self.by_millisecond.resize_with(MILLISECOND_INDEXES, MillisecondRoutes::default);
        let few = std::mem::take(&mut self.few);
        for (timer, route) in few.routes.into_iter().skip(few.finger) {
            // Every one has an index: `learn` keeps no other.
            if let Some(index) = self.millisecond_index(&timer) {
                self.by_millisecond[index].learn(timer, route);
            }
        }
    }

    fn take(&mut self, timer: &Timer) -> Option<Route> {
        if self.by_millisecond.is_empty() {
            return self.few.take(timer);
        }
        let index = self.millisecond_index(timer)?;
        self.by_millisecond.get_mut(index)?.take(timer)
    }
}

/// A route taken for a firing timer: the index of its second in
/// [`Routes::seconds`], the index of its queue there, its tag hash.
type Taken = (usize, u32, u32);

/// The routes of the loaded seconds, oldest first.
#[derive(Default)]
pub(crate) struct Routes {
    seconds: VecDeque<SecondRoutes>,
}

/// One record a chunk of fired timers is written as.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Planned<'a> {
    /// A deliveries record: these timers (record offset, tag hash) into one queue.
    Run { topic: &'a str, queue_id: u32, timers: Vec<(u64, u32)> },
    /// A delivery record of one timer, by its record's offset.
    One(u64),
}

impl Planned<'_> {
    /// The record's length.
    pub fn len(&self) -> usize {
        match self {
            Planned::Run { topic, timers, .. } => deliveries_len(topic.len(), timers.len()),
            Planned::One(_) => DELIVERY_LEN,
        }
    }
}

impl Routes {
    /// Notes where `timer`, loaded in `second`, goes.
    pub fn learn(&mut self, second: u64, timer: Timer, topic: &str, queue_id: u32, tag_hash: u32) {
        // Seconds are loaded in order: the newest is nearly always the one.
        let at = match self.seconds.back() {
            Some(s) if s.second == second => self.seconds.len() - 1,
            _ => {
                let at = self.seconds.partition_point(|s| s.second < second);
                if self.seconds.get(at).is_none_or(|s| s.second != second) {
                    self.seconds.insert(at, SecondRoutes { second, ..SecondRoutes::default() });
                }
                at
            }
        };
        self.seconds[at].learn(timer, topic, queue_id, tag_hash);
    }

    /// Drops the routes of the seconds before `second` (every loaded one is at or after it).
    pub fn forget_before(&mut self, second: u64) {
        while self.seconds.front().is_some_and(|s| s.second < second) {
            self.seconds.pop_front();
        }
    }

    /// How many timers have a route not yet taken.
    #[cfg(test)]
    fn len(&self) -> usize {
        let ms = self.seconds.iter().flat_map(|s| std::iter::once(&s.few).chain(&s.by_millisecond));
        ms.map(|m| m.routes.len() - m.finger).sum()
    }

    /// Takes the route of `timer`: (second index, queue index, tag hash). A
    /// timer is in the second it was loaded in, or a later one (an overdue
    /// timer indexed into a later slot).
    fn take(&mut self, timer: &Timer) -> Option<Taken> {
        let due_second = timer.deliver_at_ms / 1000;
        let from = self.seconds.partition_point(|s| s.second < due_second);
        self.seconds
            .range_mut(from..)
            .enumerate()
            .find_map(|(i, s)| s.take(timer).map(|r| (from + i, r.queue, r.tag_hash)))
    }

    /// Plans the records for a chunk of timers fired together, taking their
    /// routes: timers with a route are grouped into one deliveries record per
    /// queue (in their order within it), each one without gets a delivery
    /// record, in place, so every queue still sees its timers in the order
    /// they fired. With `batches` false (a tail segment of version 1) every
    /// timer gets a delivery record.
    pub fn plan(&mut self, chunk: &[Timer], batches: bool) -> Vec<Planned<'_>> {
        debug_assert!(chunk.len() <= DELIVERIES_MAX);
        if !batches {
            return chunk.iter().map(|t| Planned::One(t.message_offset)).collect();
        }
        let taken: Vec<_> = chunk.iter().map(|t| (t.message_offset, self.take(t))).collect();
        let mut planned = Vec::new();
        for stretch in taken.split_inclusive(|(_, route)| route.is_none()) {
            let (routed, unrouted) = match stretch.split_last() {
                Some((&(timer, None), routed)) => (routed, Some(timer)),
                _ => (stretch, None),
            };
            self.plan_runs(routed, &mut planned);
            planned.extend(unrouted.map(Planned::One));
        }
        planned
    }

    /// One deliveries record per queue among timers that all have a route,
    /// unless it would be longer than the queue's timers' delivery records
    /// (a lone timer, or a long topic): bytes written per delivery never grow.
    fn plan_runs<'a>(&'a self, routed: &[(u64, Option<Taken>)], out: &mut Vec<Planned<'a>>) {
        let mut keyed: Vec<(&'a str, u32, u64, u32)> = routed
            .iter()
            .filter_map(|&(timer, route)| {
                let (second, queue, tag_hash) = route?;
                let (topic, queue_id) = &self.seconds[second].queues[queue as usize];
                Some((&**topic, *queue_id, timer, tag_hash))
            })
            .collect();
        // Stable: a queue's timers keep their order. (A chunk is mostly one
        // queue, or a few, so the comparisons are few.)
        keyed.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        for run in keyed.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let (topic, queue_id, _, _) = run[0];
            if deliveries_len(topic.len(), run.len()) > run.len() * DELIVERY_LEN {
                out.extend(run.iter().map(|&(_, _, timer, _)| Planned::One(timer)));
                continue;
            }
            let timers = run.iter().map(|&(_, _, timer, tag_hash)| (timer, tag_hash)).collect();
            out.push(Planned::Run { topic, queue_id, timers });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(deliver_at_ms: u64, message_offset: u64) -> Timer {
        Timer { deliver_at_ms, message_offset }
    }

    #[test]
    fn a_chunk_becomes_one_run_per_queue_in_order_and_unrouted_timers_stay_in_place() {
        let mut routes = Routes::default();
        // Learnt out of firing order, as a slot's chain may hold them.
        routes.learn(10, t(10_002, 300), "A", 0, 8);
        routes.learn(10, t(10_000, 100), "A", 0, 7);
        routes.learn(10, t(10_001, 200), "B", 0, 0);
        routes.learn(10, t(10_004, 400), "A", 1, 0);
        routes.learn(10, t(10_005, 700), "A", 1, 1);
        routes.learn(11, t(9_001, 600), "A", 0, 10);
        routes.learn(11, t(9_000, 500), "A", 0, 9);
        // In firing order: overdue timers in a later second's slot first.
        let chunk = [
            t(9_000, 500),
            t(9_001, 600),
            t(10_000, 100),
            t(10_001, 200),
            t(10_002, 300),
            t(10_003, 999),
            t(10_004, 400),
            t(10_005, 700),
        ];
        let planned = routes.plan(&chunk, true);
        assert_eq!(
            planned,
            [
                Planned::Run {
                    topic: "A",
                    queue_id: 0,
                    timers: vec![(500, 9), (600, 10), (100, 7), (300, 8)]
                },
                // Alone in its queue: a delivery record is shorter.
                Planned::One(200),
                Planned::One(999),
                Planned::Run { topic: "A", queue_id: 1, timers: vec![(400, 0), (700, 1)] },
            ]
        );
        assert_eq!(planned[0].len(), deliveries_len(1, 4));
        assert_eq!(planned[2].len(), DELIVERY_LEN);
        drop(planned);
        assert_eq!(routes.len(), 0, "routes are taken");
        assert_eq!(routes.plan(&chunk[2..3], true), [Planned::One(100)], "a timer's route is taken once");
    }

    #[test]
    fn a_run_goes_as_delivery_records_while_those_are_shorter() {
        let mut routes = Routes::default();
        let long = "T".repeat(40);
        let chunk: Vec<Timer> = (0..5).map(|i| t(10_000, 100 + i)).collect();
        for timer in &chunk {
            routes.learn(10, *timer, &long, 0, 0);
        }
        // 28 + 40 + 12 n bytes against 28 n: three timers are 104 against 84.
        let three = routes.plan(&chunk[..3], true);
        assert_eq!(three, [Planned::One(100), Planned::One(101), Planned::One(102)]);
        drop(three);
        // Two more on their own are 92 against 56.
        assert_eq!(routes.plan(&chunk[3..], true), [Planned::One(103), Planned::One(104)]);
        let chunk: Vec<Timer> = (0..5).map(|i| t(10_100, 100 + i)).collect();
        for timer in &chunk {
            routes.learn(10, *timer, &long, 0, 0);
        }
        // Five are 128 against 140.
        let five = routes.plan(&chunk, true);
        assert!(matches!(&five[..], [Planned::Run { timers, .. }] if timers.len() == 5), "{five:?}");
    }

    #[test]
    fn the_routes_of_timers_that_never_fire_are_passed_over() {
        let mut routes = Routes::default();
        for i in 0..4 {
            routes.learn(10, t(10_000, 100 + i), "A", 0, i as u32);
        }
        routes.learn(10, t(10_001, 200), "A", 0, 9);
        // 101 was cancelled and 102 fires in a later call (which it cannot).
        let first = routes.plan(&[t(10_000, 100), t(10_000, 103)], true);
        assert_eq!(first, [Planned::Run { topic: "A", queue_id: 0, timers: vec![(100, 0), (103, 3)] }]);
        drop(first);
        assert_eq!(routes.len(), 1, "the finger passed the routes of 101 and 102, not 200's");
        assert_eq!(
            routes.plan(&[t(10_000, 102)], true),
            [Planned::One(102)],
            "out of firing order: no route"
        );
        assert_eq!(routes.len(), 1);
    }

    #[test]
    fn a_second_with_many_routes_spreads_them_by_millisecond_and_keeps_every_one() {
        let mut routes = Routes::default();
        let n = SPREAD_AT as u64 * 3;
        // Learnt newest first, as a chain is read; the first one fires before the rest are learnt.
        let timers: Vec<Timer> = (0..n).map(|i| t(10_000 + (i * 7) % 1000, 100 + i)).collect();
        let mut sorted = timers.clone();
        sorted.sort_unstable();
        routes.learn(10, sorted[0], "A", 0, 0);
        assert!(
            matches!(&routes.plan(&sorted[..1], true)[..], [Planned::One(_)]),
            "alone: a delivery record"
        );
        for timer in timers.iter().rev().filter(|t| **t != sorted[0]) {
            routes.learn(10, *timer, "A", 0, 1);
        }
        assert!(!routes.seconds[0].by_millisecond.is_empty(), "spread");
        assert_eq!(routes.len(), n as usize - 1);
        for chunk in sorted[1..].chunks(DELIVERIES_MAX.min(256)) {
            let planned = routes.plan(chunk, true);
            assert!(
                matches!(&planned[..], [Planned::Run { timers, .. }] if timers.len() == chunk.len()),
                "{planned:?}"
            );
        }
        assert_eq!(routes.len(), 0);
    }

    #[test]
    fn a_version_1_tail_gets_delivery_records_and_old_seconds_are_forgotten() {
        let mut routes = Routes::default();
        routes.learn(10, t(10_000, 100), "A", 0, 0);
        routes.learn(12, t(12_000, 300), "A", 0, 0);
        assert_eq!(routes.plan(&[t(10_000, 100)], false), [Planned::One(100)]);
        routes.forget_before(11);
        assert_eq!(routes.len(), 1);
        routes.forget_before(u64::MAX);
        assert_eq!(routes.len(), 0);
    }
}
