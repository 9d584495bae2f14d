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

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::format::record::{DELIVERIES_MAX, DELIVERY_LEN, deliveries_len};
use crate::timer::Timer;

/// A timer's route inside its second: which of the second's queues, and the tag hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    queue: u32,
    tag_hash: u32,
}

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
    by_timer: HashMap<u64, Route, BuildHasherDefault<OffsetHasher>>,
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
    /// Notes where the timer of the record at `timer_offset`, loaded in
    /// `second`, goes.
    pub fn learn(&mut self, second: u64, timer_offset: u64, topic: &str, queue_id: u32, tag_hash: u32) {
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
        let routes = &mut self.seconds[at];
        let queue = routes.queue_index(topic, queue_id);
        routes.by_timer.insert(timer_offset, Route { queue, tag_hash });
    }

    /// Drops the routes of the seconds before `second` (every loaded one is at or after it).
    pub fn forget_before(&mut self, second: u64) {
        while self.seconds.front().is_some_and(|s| s.second < second) {
            self.seconds.pop_front();
        }
    }

    /// How many timers have a route.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.seconds.iter().map(|s| s.by_timer.len()).sum()
    }

    /// Takes the route of `timer`: (second index, queue index, tag hash). A
    /// timer is in the second it was loaded in, or a later one (an overdue
    /// timer indexed into a later slot).
    fn take(&mut self, timer: &Timer) -> Option<Taken> {
        let due_second = timer.deliver_at_ms / 1000;
        let from = self.seconds.partition_point(|s| s.second < due_second);
        self.seconds.range_mut(from..).enumerate().find_map(|(i, s)| {
            s.by_timer.remove(&timer.message_offset).map(|r| (from + i, r.queue, r.tag_hash))
        })
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

/// Hashes a log offset (a `u64` key) with one multiplication: offsets are
/// already spread, and this map sits on the fire path of a hot second.
#[derive(Default)]
struct OffsetHasher(u64);

impl Hasher for OffsetHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; anything else still hashes, slowly.
        for &b in bytes {
            self.write_u64(u64::from(b) ^ self.0.rotate_left(8));
        }
    }

    fn write_u64(&mut self, v: u64) {
        let x = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 29);
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
        routes.learn(10, 100, "A", 0, 7);
        routes.learn(10, 200, "B", 0, 0);
        routes.learn(10, 300, "A", 0, 8);
        routes.learn(10, 400, "A", 1, 0);
        routes.learn(11, 500, "A", 0, 9);
        routes.learn(11, 600, "A", 0, 10);
        let chunk = [
            t(10_000, 100),
            t(10_001, 200),
            t(10_002, 300),
            t(10_003, 999),
            t(10_004, 400),
            t(9_000, 500),
            t(9_001, 600),
        ];
        let planned = routes.plan(&chunk, true);
        assert_eq!(
            planned,
            [
                Planned::Run { topic: "A", queue_id: 0, timers: vec![(100, 7), (300, 8)] },
                // Alone in its queue: a delivery record is shorter.
                Planned::One(200),
                Planned::One(999),
                // Overdue timers in a later second's slot are found there.
                Planned::Run { topic: "A", queue_id: 0, timers: vec![(500, 9), (600, 10)] },
                Planned::One(400),
            ]
        );
        assert_eq!(planned[0].len(), deliveries_len(1, 2));
        assert_eq!(planned[2].len(), DELIVERY_LEN);
        drop(planned);
        assert_eq!(routes.len(), 0, "routes are taken");
        assert_eq!(routes.plan(&chunk[..1], true), [Planned::One(100)], "a timer's route is taken once");
    }

    #[test]
    fn a_run_goes_as_delivery_records_while_those_are_shorter() {
        let mut routes = Routes::default();
        let long = "T".repeat(40);
        let chunk: Vec<Timer> = (0..5).map(|i| t(10_000, 100 + i)).collect();
        for timer in &chunk {
            routes.learn(10, timer.message_offset, &long, 0, 0);
        }
        // 28 + 40 + 12 n bytes against 28 n: three timers are 104 against 84.
        let three = routes.plan(&chunk[..3], true);
        assert_eq!(three, [Planned::One(100), Planned::One(101), Planned::One(102)]);
        drop(three);
        // Two more on their own are 92 against 56.
        assert_eq!(routes.plan(&chunk[3..], true), [Planned::One(103), Planned::One(104)]);
        for timer in &chunk {
            routes.learn(10, timer.message_offset, &long, 0, 0);
        }
        // Five are 128 against 140.
        let five = routes.plan(&chunk, true);
        assert!(matches!(&five[..], [Planned::Run { timers, .. }] if timers.len() == 5), "{five:?}");
    }

    #[test]
    fn a_version_1_tail_gets_delivery_records_and_old_seconds_are_forgotten() {
        let mut routes = Routes::default();
        routes.learn(10, 100, "A", 0, 0);
        routes.learn(12, 300, "A", 0, 0);
        assert_eq!(routes.plan(&[t(10_000, 100)], false), [Planned::One(100)]);
        routes.forget_before(11);
        assert_eq!(routes.len(), 1);
        routes.forget_before(u64::MAX);
        assert_eq!(routes.len(), 0);
    }
}
