//! Where each loaded timer goes when it fires: its message's topic, queue and
//! tag hash. The ticker learns them as the timer's second is loaded, from
//! the record it checks then or from a route learnt ahead (below), so that when
//! a run of timers fires it writes one deliveries record per queue (kind 7),
//! which the dispatcher indexes without reading a message, wherever that
//! record is no longer than the run's delivery records would be.
//!
//! Routes are kept per loaded second and dropped with it, so memory follows
//! the timers loaded. A timer the ticker did not check (one indexed into a
//! second already loaded) has no route: it gets a delivery record of its own.
//!
//! **Routes learnt ahead.** The dispatcher reads every message record as it
//! indexes it, so it sends a timed message's route with its timer, once the
//! record's checksum is checked (while the record is in the cache); the
//! ticker keeps it *ahead* when the timer's second is not read in yet and
//! is due within [`AHEAD_SECONDS`], up to [`AHEAD_MAX`] of them. As the
//! second loads, such a route vouches for its timer: the record at that
//! offset is a timed message due then, checked in this run of the store, so
//! the check learns the route without reading the record again. Reading those cold
//! records was a quarter of the ticker's work per fired timer. A slot's
//! chain lists its timers newest first and the dispatcher sent them in log
//! order, so matching the two is a finger walking down one array; a timer
//! the walk does not match (rescheduled, cascaded, past the caps) is read as
//! before. Routes learnt ahead are memory only: the timers a restart or a
//! rebuild of the wheel finds already indexed are read as their seconds load.
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

/// Notes where `timer`, loaded in `second`, goes, in `seconds`.
fn learn_in(
    seconds: &mut VecDeque<SecondRoutes>,
    second: u64,
    timer: Timer,
    (topic, queue_id, tag_hash): (&str, u32, u32),
) {
    // Seconds are loaded in order: the newest is nearly always the one.
    let at = match seconds.back() {
        Some(s) if s.second == second => seconds.len() - 1,
        _ => {
            let at = seconds.partition_point(|s| s.second < second);
            if seconds.get(at).is_none_or(|s| s.second != second) {
                seconds.insert(at, SecondRoutes { second, ..SecondRoutes::default() });
            }
            at
        }
    };
    seconds[at].learn(timer, topic, queue_id, tag_hash);
}

/// A route taken for a firing timer: the index of its second in
/// [`Routes::seconds`], the index of its queue there, its tag hash.
type Taken = (usize, u32, u32);

/// How far past the newest loaded second a timer may be due for its route
/// to be kept ahead: about a minute of timers (a burst of retries), not
/// hours of them held in memory.
pub(crate) const AHEAD_SECONDS: u64 = 64;
/// The most routes kept ahead (24 bytes each: 24 to 48 MiB with the arrays'
/// slack); past it, timers are read as their second loads.
const AHEAD_MAX: usize = 1 << 20;
/// The most queues one second's routes learnt ahead name; a timer of
/// another queue is read as its second loads.
pub(crate) const AHEAD_QUEUES: usize = 64;

/// The routes the dispatcher read for the timers of a second not yet read
/// in, in log order.
struct AheadSecond {
    second: u64,
    /// Topic and queue id, by the index a route names.
    queues: Vec<(Box<str>, u32)>,
    /// Each timer, its queue's index and its tag hash, by offset.
    routes: Vec<(Timer, u32, u32)>,
    /// Routes from here on were matched or passed by the chain's walk, which goes newest first.
    unmatched: usize,
    /// The queue of the route learnt last: a burst is mostly one queue.
    last: usize,
}

impl AheadSecond {
    fn learn(&mut self, timer: Timer, (topic, queue_id, tag_hash): (&str, u32, u32)) -> bool {
        if self.routes.last().is_some_and(|(last, _, _)| last.message_offset >= timer.message_offset) {
            debug_assert!(false, "routes learnt ahead out of log order");
            return false;
        }
        let names = |(t, q): &(Box<str>, u32)| *q == queue_id && **t == *topic;
        let queue = match self.queues.get(self.last) {
            Some(last) if names(last) => self.last,
            _ => match self.queues.iter().position(names) {
                Some(queue) => queue,
                None if self.queues.len() < AHEAD_QUEUES => {
                    self.queues.push((topic.into(), queue_id));
                    self.queues.len() - 1
                }
                None => return false,
            },
        };
        self.last = queue;
        self.routes.push((timer, queue as u32, tag_hash));
        self.unmatched = self.routes.len();
        true
    }

    /// The route learnt ahead for `timer` (its queue's index and its tag
    /// hash), met in a walk down the slot's chain: routes of newer timers
    /// the walk did not meet are passed.
    fn matched(&mut self, timer: &Timer) -> Option<(u32, u32)> {
        let unmatched = &self.routes[..self.unmatched];
        // Nearly always the newest unmatched one: the chain holds little else.
        let newer = match unmatched.last() {
            Some((last, _, _)) if last.message_offset <= timer.message_offset => unmatched.len(),
            _ => unmatched.partition_point(|(t, _, _)| t.message_offset <= timer.message_offset),
        };
        self.unmatched = newer;
        let (ahead, queue, tag_hash) = *self.routes[..newer].last()?;
        if ahead != *timer {
            return None;
        }
        self.unmatched -= 1;
        Some((queue, tag_hash))
    }
}

/// A route learnt ahead that matched a timer read from its slot's chain:
/// where its second is in [`Routes::ahead`], its queue there, its tag hash.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Vouched {
    at: usize,
    queue: u32,
    tag_hash: u32,
}

/// The routes of the loaded seconds, oldest first, and those learnt ahead.
#[derive(Default)]
pub(crate) struct Routes {
    seconds: VecDeque<SecondRoutes>,
    ahead: VecDeque<AheadSecond>,
    /// Routes in `ahead`.
    ahead_len: usize,
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
        learn_in(&mut self.seconds, second, timer, (topic, queue_id, tag_hash));
    }

    /// Keeps the route of `timer`, due in `second` (not read in yet, and
    /// within [`AHEAD_SECONDS`]), as the dispatcher read it from the
    /// timer's message record; timers come in log order. `false`, with
    /// nothing kept, past [`AHEAD_MAX`] or [`AHEAD_QUEUES`].
    pub fn learn_ahead(&mut self, second: u64, timer: Timer, route: (&str, u32, u32)) -> bool {
        if self.ahead_len >= AHEAD_MAX || timer.deliver_at_ms / 1000 != second {
            return false;
        }
        let at = match self.ahead.back() {
            Some(s) if s.second == second => self.ahead.len() - 1,
            _ => {
                let at = self.ahead.partition_point(|s| s.second < second);
                if self.ahead.get(at).is_none_or(|s| s.second != second) {
                    let fresh =
                        AheadSecond { second, queues: Vec::new(), routes: Vec::new(), unmatched: 0, last: 0 };
                    self.ahead.insert(at, fresh);
                }
                at
            }
        };
        let kept = self.ahead[at].learn(timer, route);
        self.ahead_len += usize::from(kept);
        kept
    }

    /// The route learnt ahead for `timer`, read from the chain of
    /// `second`'s slot (newest first, the order this is asked in), which
    /// vouches for the timer's record; `None` if there is none (the record
    /// must be read). Its route is learnt by [`Self::learn_vouched`].
    pub fn vouching(&mut self, second: u64, timer: &Timer) -> Option<Vouched> {
        let at = self.ahead.partition_point(|s| s.second < second);
        let ahead = self.ahead.get_mut(at).filter(|s| s.second == second)?;
        let (queue, tag_hash) = ahead.matched(timer)?;
        Some(Vouched { at, queue, tag_hash })
    }

    /// Learns the route of a timer of `second` that `vouched` vouched for,
    /// as [`Self::learn`] does a route read from the record. Asked in the
    /// chain's order, between the same calls as `vouching`'s.
    pub fn learn_vouched(&mut self, second: u64, timer: Timer, vouched: Vouched) {
        let (topic, queue_id) = &self.ahead[vouched.at].queues[vouched.queue as usize];
        learn_in(&mut self.seconds, second, timer, (topic, *queue_id, vouched.tag_hash));
    }

    /// Drops the routes learnt ahead of seconds up to `second`: read in whole, none vouches any more.
    pub fn forget_ahead_through(&mut self, second: u64) {
        while self.ahead.front().is_some_and(|s| s.second <= second) {
            let dropped = self.ahead.pop_front().expect("a second is there");
            self.ahead_len -= dropped.routes.len();
        }
    }

    /// Drops the routes of the seconds before `second` (every loaded one is at or after it).
    pub fn forget_before(&mut self, second: u64) {
        while self.seconds.front().is_some_and(|s| s.second < second) {
            self.seconds.pop_front();
        }
        while self.ahead.front().is_some_and(|s| s.second < second) {
            let dropped = self.ahead.pop_front().expect("a second is there");
            self.ahead_len -= dropped.routes.len();
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

    /// Whether a route learnt ahead vouches for `timer` (learning it if so), as the load check asks.
    fn vouch(routes: &mut Routes, second: u64, timer: &Timer) -> bool {
        let Some(vouched) = routes.vouching(second, timer) else { return false };
        routes.learn_vouched(second, *timer, vouched);
        true
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
    fn routes_learnt_ahead_vouch_for_their_own_timers_met_down_the_chain() {
        let mut routes = Routes::default();
        // From the dispatcher, in log order.
        assert!(routes.learn_ahead(20, t(20_005, 100), ("A", 0, 1)));
        assert!(routes.learn_ahead(20, t(20_001, 200), ("A", 0, 2)));
        assert!(routes.learn_ahead(20, t(20_009, 300), ("B", 0, 3)));
        assert!(routes.learn_ahead(20, t(20_002, 400), ("A", 0, 4)));
        assert!(routes.learn_ahead(21, t(21_000, 500), ("A", 0, 0)));
        assert!(!routes.learn_ahead(20, t(21_000, 600), ("A", 0, 0)), "due in another second: not kept");
        assert_eq!(routes.ahead_len, 5);
        // The chain of second 20, newest first: a reschedule's timer (700),
        // then 400, then 300 with another deliver time (not vouched), 100
        // (200 was cancelled, its entry met after: passed).
        assert!(!vouch(&mut routes, 20, &t(20_003, 700)), "not learnt ahead: read");
        routes.learn(20, t(20_003, 700), "A", 0, 7);
        assert!(vouch(&mut routes, 20, &t(20_002, 400)));
        assert!(!vouch(&mut routes, 20, &t(20_008, 300)), "another deliver time");
        assert!(vouch(&mut routes, 20, &t(20_005, 100)));
        assert!(!vouch(&mut routes, 20, &t(20_001, 200)), "passed");
        assert!(!vouch(&mut routes, 21, &t(21_000, 501)), "another record");
        let chunk = [t(20_002, 400), t(20_003, 700), t(20_005, 100)];
        assert_eq!(
            routes.plan(&chunk, true),
            [Planned::Run { topic: "A", queue_id: 0, timers: vec![(400, 4), (700, 7), (100, 1)] }]
        );
        routes.forget_before(21);
        assert_eq!(routes.ahead_len, 1);
        assert!(vouch(&mut routes, 21, &t(21_000, 500)));
        routes.forget_ahead_through(21);
        assert_eq!((routes.ahead.len(), routes.ahead_len), (0, 0), "read in whole: dropped");
        assert_eq!(routes.plan(&[t(21_000, 500)], true), [Planned::One(500)], "its route stays learnt");
    }

    #[test]
    fn routes_learnt_ahead_are_capped() {
        let mut routes = Routes::default();
        for i in 0..AHEAD_MAX as u64 {
            let second = 30 + i / 100_000;
            assert!(routes.learn_ahead(second, t(second * 1000, 1 + i), ("A", 0, 0)));
        }
        assert!(!routes.learn_ahead(50, t(50_000, u64::MAX), ("A", 0, 0)), "past the cap: read at load");
        assert!(!vouch(&mut routes, 50, &t(50_000, u64::MAX)));
        routes.forget_before(31);
        assert!(
            routes.learn_ahead(50, t(50_000, u64::MAX), ("A", 0, 0)),
            "room again once a second is dropped"
        );
        let mut few = Routes::default();
        for q in 0..AHEAD_QUEUES as u32 {
            assert!(few.learn_ahead(10, t(10_000, 1 + u64::from(q)), ("A", q, 0)));
        }
        assert!(!few.learn_ahead(10, t(10_000, 1_000), ("A", 1_000, 0)), "past the queues a second names");
        assert!(few.learn_ahead(10, t(10_000, 1_001), ("A", 0, 0)), "a queue it names");
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
