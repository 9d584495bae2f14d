//! What the disk vouches for: the checkpoints written (the floor below
//! which no recovery reads) and the pending timers per commit-log segment as
//! of a durable moment; and the pins, the messages rescheduled timers need
//! (from the cancel ledger). The ticking thread, the flusher and retention
//! all read these; none of them owns the others.

pub(crate) mod pins;
pub(crate) mod segment_counts;

use std::sync::{Arc, Mutex};

use crate::format::checkpoint::Checkpoint;
use crate::sync::Locked;
pub(crate) use pins::{Pin, Pins};
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

/// How many checkpoints the floor remembers to find a tick second whose
/// deliveries are all indexed.
const HISTORY: usize = 64;

/// Tells retention what it may delete, from the checkpoints written.
#[derive(Debug, Default)]
pub(crate) struct Floor {
    /// The newest last.
    written: Mutex<std::collections::VecDeque<Written>>,
}

impl Floor {
    /// Records a checkpoint that is on disk, with the log end at its wheel
    /// snapshot and the snapshot's segment counts (the log was synced after it).
    pub fn record(&self, cp: &Checkpoint, log_end: u64, counts: Arc<SegmentCounts>) {
        let mut written = self.written.locked();
        if written.len() == HISTORY {
            written.pop_front();
        }
        let log_offset = cp.dispatched.min(cp.delivery_scan_from);
        written.push_back(Written { log_offset, tick_second: cp.tick_second, log_end, counts });
    }

    /// The floor, once two checkpoints are known. A torn checkpoint falls
    /// back to the previous one, so the lower of the last two counts.
    pub fn get(&self) -> Option<Mark> {
        let mut written = self.written.locked();
        let [.., older, newer] = written.make_contiguous() else { return None };
        let (older, newer) = (older.clone(), newer.clone());
        let log_offset = newer.log_offset.min(older.log_offset);
        // The newest tick second whose deliveries all lie below the floor: the
        // dispatcher still reads the message of any delivery above it.
        let settled_before_second = written
            .iter()
            .filter(|w| w.log_end <= log_offset)
            .map(|w| w.tick_second)
            .max()
            .unwrap_or(0)
            .min(newer.tick_second.min(older.tick_second));
        let tick_second = newer.tick_second.min(older.tick_second);
        Some(Mark { log_offset, settled_before_second, tick_second, counts: Arc::clone(&older.counts) })
    }
}
