//! Timed delivery: one persisted hierarchical wheel for arbitrary deliver
//! times and legacy delay levels alike, and the one thread that ticks it.
//!
//! * `geometry.rs`: levels, placement, slot indexes, cascades (pure);
//! * `wheel/`: the wheel itself, on slots in a mapped file: insert, the pure
//!   `tick(now_ms)`, loading, prefetching and cascading (`mod.rs`); how a
//!   cancel finds its timer (`cancel.rs`); the recovery contract
//!   (`restart.rs`); the files it may delete (`reclaim.rs`); pending counts
//!   (`gauges.rs`, `census.rs`) and the timers due in a window (`window.rs`);
//! * `state/`: the wheel's parts, each owning its state: slot counts, the
//!   second being read in, the loaded seconds, the cancels it remembers,
//!   and what the log said of the time before a restart;
//! * `ledger.rs`: every cancel answered, on disk, for a repeated cancel;
//!   `routes.rs`: where each loaded timer goes (topic, queue, tags), so a run
//!   that fires together is one deliveries record per queue;
//!   `recurring.rs`: which loaded timers are recurring schedules' (their
//!   plans are read again from the records when they fire);
//! * `log.rs`: the timer logs the slots chain through; `tails.rs`: where each
//!   slot's chain begins; `levels.rs`: the legacy level table;
//! * `tick.rs`: the ticking thread; `front.rs`: the wheel's side of the
//!   scheduler seam.
//!
//! Arrows run one way: `front → tick → wheel/ → state/ → ledger → {log,
//! tails, geometry}`; `routes.rs` and `recurring.rs` are the ticking
//! thread's alone (`tick/occurrences.rs` fires the schedules' timers), and
//! `tick/control.rs` names the cancel answers of `state/cancels.rs`.
//!
//! All of it is an index of the commit log.

mod armed_ahead;
pub(crate) mod front;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub mod geometry;
pub(crate) mod ledger;
pub(crate) mod levels;
pub(crate) mod log;
pub(crate) mod pins_snapshot;
mod recurring;
mod routes;
pub(crate) mod state;
pub(crate) mod tails;
pub(crate) mod tick;
pub(crate) mod wheel;

pub(crate) use front::WheelFront;

/// A timer: the message it delivers and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Timer {
    pub deliver_at_ms: u64,
    pub message_offset: u64,
}

/// A timer the dispatcher indexed, for the ticking thread to insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NewTimer {
    pub timer: Timer,
    /// A recurring schedule's (of its record, or of an occurrence's): when
    /// it fires, the next occurrence is armed.
    pub recurring: bool,
    /// Where a timed message goes, as the dispatcher read it from the
    /// message record, its checksum checked (see `routes.rs`); `None` for a
    /// reschedule record's timer or a schedule's, whose records the ticker
    /// reads itself, or one of a queue past the batch's [`BATCH_QUEUES`].
    pub route: Option<NewRoute>,
}

/// A new timer's route: its queue, by index into [`NewTimers::queues`], and its tag hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NewRoute {
    pub queue: u16,
    pub tag_hash: u32,
}

/// Timers the dispatcher sends the ticking thread in one command, in log
/// order, with the queues their routes name.
#[derive(Debug, Default)]
pub(crate) struct NewTimers {
    pub timers: Vec<NewTimer>,
    /// Topic and queue id, by [`NewRoute::queue`].
    pub queues: Vec<(Box<str>, u32)>,
}

/// The most queues one [`NewTimers`] names (as many as a second's routes
/// learnt ahead may): a timer past them goes without a route (the ticker
/// reads its record).
const BATCH_QUEUES: usize = crate::timer::routes::AHEAD_QUEUES;

impl NewTimers {
    pub fn with_capacity(timers: usize) -> Self {
        Self { timers: Vec::with_capacity(timers), queues: Vec::new() }
    }

    /// Adds a timer; `route` is its message's topic, queue id and tags.
    pub fn push(&mut self, timer: Timer, recurring: bool, route: Option<(&str, u32, &str)>) {
        let route = route.and_then(|(topic, queue_id, tags)| {
            let queue = self.queue_index(topic, queue_id)?;
            Some(NewRoute { queue, tag_hash: crate::format::queue_entry::tag_hash(tags) })
        });
        self.timers.push(NewTimer { timer, recurring, route });
    }

    /// The index of a queue in [`Self::queues`], added if there is room.
    fn queue_index(&mut self, topic: &str, queue_id: u32) -> Option<u16> {
        let names = |(t, q): &(Box<str>, u32)| *q == queue_id && **t == *topic;
        // A batch is mostly the queue of the timer before, the newest one.
        if let Some(last) = self.timers.last().and_then(|t| t.route)
            && names(&self.queues[usize::from(last.queue)])
        {
            return Some(last.queue);
        }
        if let Some(index) = self.queues.iter().position(names) {
            return Some(index as u16);
        }
        if self.queues.len() == BATCH_QUEUES {
            return None;
        }
        self.queues.push((topic.into(), queue_id));
        Some((self.queues.len() - 1) as u16)
    }

    pub fn len(&self) -> usize {
        self.timers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
    }
}
