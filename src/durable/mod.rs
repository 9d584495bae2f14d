//! What the disk vouches for: the checkpoints written (the floor below
//! which no recovery reads) and the pending timers per commit-log segment as
//! of a durable moment; and the pins, the messages rescheduled timers need
//! (from the cancel ledger). The ticking thread, the flusher and retention
//! all read these; none of them owns the others.

pub(crate) mod pins;
pub(crate) mod segment_counts;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::format::checkpoint::Checkpoint;
use crate::sync::Locked;
pub(crate) use pins::{Pin, Pins, PinsRead};
pub(crate) use segment_counts::SegmentCounts;

/// What the flusher's channel carries.
pub(crate) enum FlushSignal {
    /// Final flush and clean checkpoint, then exit.
    Stop,
    /// The ticking thread is rebuilding the wheel from the log (its files
    /// were found damaged): write, before it touches them, a checkpoint from
    /// which a restart replays the whole log and trusts no timer-log entry
    /// (see `Flusher::rebuild_checkpoint`), and answer when it is on disk.
    Rebuild {
        tick_second: u64,
        counts: SegmentCounts,
        reply: crossbeam_channel::Sender<crate::error::Result<()>>,
    },
}

/// What retention may not delete, as of the checkpoints written so far.
#[derive(Debug, Clone)]
pub(crate) struct Mark {
    /// No record below this offset is needed by a recovery (the lower
    /// `min(dispatched, delivery scan from)` of the last two checkpoints).
    pub log_offset: u64,
    /// Every timer due before this second has fired or was cancelled, and
    /// the dispatcher has indexed its delivery record (it lies below `log_offset`).
    pub settled_before_second: u64,
    /// The lower tick second of the last two checkpoints: a restart resumes
    /// the wheel there or later.
    pub tick_second: u64,
    /// Pending timers per segment, as of a moment whose deliveries and
    /// cancels were durable (the older of the last two checkpoints).
    pub counts: Arc<SegmentCounts>,
}

/// One checkpoint written: its floor, its tick second, the log end when its
/// wheel snapshot was taken, and that snapshot's counts.
#[derive(Debug, Clone)]
struct Written {
    log_offset: u64,
    tick_second: u64,
    log_end: u64,
    counts: Arc<SegmentCounts>,
}

/// How many tick seconds the floor remembers a checkpoint of, to find a
/// tick second whose deliveries are all indexed.
const HISTORY: usize = 64;

/// Tells retention what it may delete, from the checkpoints written.
#[derive(Debug, Default)]
pub(crate) struct Floor {
    written: Mutex<History>,
}

/// The checkpoints the floor reads.
#[derive(Debug, Default)]
struct History {
    /// The last two written, the newest last: a torn checkpoint falls back
    /// to the previous one, so the lower of the two counts.
    last_two: VecDeque<Written>,
    /// The first checkpoint written at each of the last [`HISTORY`] tick
    /// seconds, the newest last. The first of a second has the lowest log
    /// end of its second, so the others could never name a later settled
    /// second: keeping one per second, rather than the last few written,
    /// reaches back as far in seconds however often checkpoints are written
    /// (every 5 ms, 64 checkpoints were a third of a second, shorter than a
    /// loaded second stays loaded, and the floor stopped advancing).
    first_of_second: VecDeque<Written>,
}

impl Floor {
    /// Records a checkpoint that is on disk, with the log end at its wheel
    /// snapshot and the snapshot's segment counts (the log was synced after it).
    pub fn record(&self, cp: &Checkpoint, log_end: u64, counts: Arc<SegmentCounts>) {
        let mut history = self.written.locked();
        let log_offset = cp.dispatched.min(cp.delivery_scan_from);
        let written = Written { log_offset, tick_second: cp.tick_second, log_end, counts };
        if history.first_of_second.back().is_none_or(|w| w.tick_second != written.tick_second) {
            if history.first_of_second.len() == HISTORY {
                history.first_of_second.pop_front();
            }
            history.first_of_second.push_back(written.clone());
        }
        if history.last_two.len() == 2 {
            history.last_two.pop_front();
        }
        history.last_two.push_back(written);
    }

    /// The floor, once two checkpoints are known.
    pub fn get(&self) -> Option<Mark> {
        let history = self.written.locked();
        let (Some(older), Some(newer)) = (history.last_two.front(), history.last_two.get(1)) else {
            return None;
        };
        let log_offset = newer.log_offset.min(older.log_offset);
        let tick_second = newer.tick_second.min(older.tick_second);
        // The newest tick second whose deliveries all lie below the floor: the
        // dispatcher still reads the message of any delivery above it.
        let settled_before_second = history
            .first_of_second
            .iter()
            .filter(|w| w.log_end <= log_offset)
            .map(|w| w.tick_second)
            .max()
            .unwrap_or(0)
            .min(tick_second);
        Some(Mark { log_offset, settled_before_second, tick_second, counts: Arc::clone(&older.counts) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(tick_second: u64, offset: u64) -> Checkpoint {
        Checkpoint {
            log_durable: offset,
            dispatched: offset,
            written_at_ms: tick_second * 1000,
            tick_second,
            delivery_scan_from: offset,
            timer_log_end: 1,
            far_timer_log_end: 1,
            clean: false,
            sequence: 0,
        }
    }

    /// Checkpoints every 5 ms while a loaded second stays loaded: the floor
    /// reaches back to the first checkpoint of the second before, however
    /// many were written since (64 of them once hid it, and nothing was settled).
    #[test]
    fn the_floor_remembers_seconds_not_checkpoints() {
        let floor = Floor::default();
        let counts = Arc::new(SegmentCounts::new(1 << 20));
        // Second 10 loaded at log end 1_000; its deliveries and puts append after.
        floor.record(&checkpoint(10, 900), 1_000, Arc::clone(&counts));
        for i in 1..=200 {
            floor.record(&checkpoint(11, 900), 1_000 + i, Arc::clone(&counts));
        }
        assert_eq!(floor.get().unwrap().settled_before_second, 0, "nothing is below the floor yet");
        // The oldest loaded second is now one loaded at log end 1_000.
        floor.record(&checkpoint(12, 1_000), 1_300, Arc::clone(&counts));
        floor.record(&checkpoint(12, 1_000), 1_301, Arc::clone(&counts));
        let mark = floor.get().unwrap();
        assert_eq!((mark.log_offset, mark.settled_before_second, mark.tick_second), (1_000, 10, 12));
    }

    #[test]
    fn the_floor_needs_two_checkpoints_and_takes_the_lower() {
        let floor = Floor::default();
        let counts = Arc::new(SegmentCounts::new(1 << 20));
        floor.record(&checkpoint(5, 500), 600, Arc::clone(&counts));
        assert!(floor.get().is_none());
        floor.record(&checkpoint(7, 400), 700, Arc::clone(&counts));
        let mark = floor.get().unwrap();
        assert_eq!((mark.log_offset, mark.tick_second, mark.settled_before_second), (400, 5, 0));
    }
}
