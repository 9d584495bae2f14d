//! The flusher: the one thread that makes data durable and writes checkpoints.
//!
//! Every `flush_interval` it syncs the commit log, then the consume queues,
//! then committed consumer offsets, and then writes a checkpoint that vouches
//! for exactly what was synced. What waits for the log alone (a sync-mode
//! put) wakes the committer (`committer.rs`) instead.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::checkpoint::CheckpointFile;
use crate::clock::Clock;
use crate::commitlog::CommitLog;
use crate::consume_queue::QueueRegistry;
use crate::durable::{Floor, FlushSignal, SegmentCounts};
use crate::error::Result;
use crate::format::checkpoint::Checkpoint;
use crate::fs::write_atomically;
use crate::key_index::KeyIndexes;
use crate::offsets::OffsetStore;
use crate::sync::Locked;
use crate::timer::tick::{WheelCheckpoint, WheelShared, WheelSnapshot};
use crate::topic_counts::TopicCounts;

pub(crate) struct Flusher {
    pub log: Arc<CommitLog>,
    pub queues: Arc<QueueRegistry>,
    pub keys: Arc<KeyIndexes>,
    pub topics: Option<Arc<TopicCounts>>,
    pub offsets: Arc<OffsetStore>,
    pub wheel: Arc<WheelShared>,
    pub checkpoint: CheckpointFile,
    pub dispatched: Arc<AtomicU64>,
    pub clock: Arc<dyn Clock>,
    pub interval: Duration,
    /// Told of every checkpoint written, for retention.
    pub floor: Arc<Floor>,
    /// `timer/segment_pending`, and when it was last written.
    pub counts_path: PathBuf,
    pub counts_written: Instant,
    /// What the checkpoint before the last one vouched for (see `cycle`).
    pub vouched_before_last: Option<Vouched>,
    /// Woken after each sync of the log: in sync flush mode the dispatcher
    /// indexes only what is durable.
    pub dispatch_wake: Sender<()>,
}

/// What a checkpoint vouches for, as far as deciding whether to write one.
pub(crate) type Vouched = (u64, u64, u64);

/// How often the segment counts are persisted at most.
const COUNTS_INTERVAL: Duration = Duration::from_secs(1);

impl Flusher {
    /// The thread's body; returns the result of the final flush.
    pub fn run(mut self, signals: Receiver<FlushSignal>) -> Result<()> {
        let mut next_full = Instant::now() + self.interval;
        loop {
            let wait = next_full.saturating_duration_since(Instant::now());
            match signals.recv_timeout(wait) {
                Ok(FlushSignal::Stop) | Err(RecvTimeoutError::Disconnected) => {
                    return self.cycle(true);
                }
                Ok(FlushSignal::Rebuild { tick_second, counts, reply }) => {
                    let _ = reply.send(self.rebuild_checkpoint(tick_second, counts));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = self.cycle(false) {
                        tracing::error!(error = %e, "periodic flush failed");
                    }
                    next_full = Instant::now() + self.interval;
                }
            }
        }
    }

    /// Syncs the files of `snapshot` (the ticker's latest, if it made one
    /// since the last cycle); returns the newest snapshot synced and its
    /// segment counts. Called after the commit log's sync: an index entry
    /// synced here may name a record appended after that sync, which
    /// recovery then finds past the log's end and rebuilds the index for.
    fn sync_wheel(&self, snapshot: Option<WheelSnapshot>) -> Result<(WheelCheckpoint, Arc<SegmentCounts>)> {
        let mut synced = self.wheel.synced.locked();
        if let Some(snapshot) = snapshot {
            let appended = snapshot.files.appended.iter().map(|(f, written)| f.flush_appended(0, *written));
            let in_place = snapshot.files.in_place.iter().map(|f| f.flush(0, f.len()));
            for synced in appended.chain(in_place) {
                if let Err(e) = synced {
                    self.log.poison(&format!("flush: {e}"));
                    return Err(e);
                }
            }
            *synced = (snapshot.checkpoint, snapshot.counts);
        }
        Ok(synced.clone())
    }

    /// Persists the segment counts now and then (they are an index: a
    /// restart from older counts scans the segments they did not see).
    fn write_counts(&mut self, counts: &SegmentCounts, covered_below: u64, now: bool) -> Result<()> {
        if !now && self.counts_written.elapsed() < COUNTS_INTERVAL {
            return Ok(());
        }
        write_atomically(&self.counts_path, &counts.encode(covered_below))?;
        self.counts_written = Instant::now();
        if let Some(topics) = &self.topics
            && let Err(e) = topics.persist()
        {
            // Also an index: the next open recounts without it.
            tracing::error!(error = %e, "could not write the pending counts per topic; the next open recounts");
        }
        Ok(())
    }

    /// The checkpoint a rebuild of the wheel starts from: the whole log is
    /// replayed (`dispatched` and the delivery scan at its start) and every
    /// timer-log entry counts as written after it (ends 1), so a restart,
    /// whatever state the rebuild left the wheel's files in, either finds a
    /// damaged wheel and rebuilds it too, or re-indexes every timer the
    /// rebuilt wheel does not hold yet. Until the rebuilt wheel's first
    /// snapshot, checkpoints repeat it.
    fn rebuild_checkpoint(&mut self, tick_second: u64, counts: SegmentCounts) -> Result<()> {
        let log_durable = self.log.flush()?;
        let start = self.log.start();
        let wheel = WheelCheckpoint {
            indexed: start,
            tick_second,
            delivery_scan_from: start,
            timer_log_ends: [1, 1],
            log_end: self.log.write_end(),
        };
        let counts = Arc::new(counts);
        *self.wheel.to_sync.locked() = None;
        *self.wheel.synced.locked() = (wheel, Arc::clone(&counts));
        let cp = Checkpoint {
            log_durable,
            dispatched: start,
            written_at_ms: self.clock.now_ms(),
            tick_second,
            delivery_scan_from: start,
            timer_log_end: 1,
            far_timer_log_end: 1,
            clean: false,
            sequence: 0,
        };
        let written = self.checkpoint.write(cp)?;
        self.floor.record(&written, wheel.log_end, counts);
        Ok(())
    }

    /// Syncs log, indexes and offsets, then checkpoints what was synced.
    pub fn cycle(&mut self, clean: bool) -> Result<()> {
        let _span = tracing::debug_span!("flush", clean).entered();
        // Take the wheel's snapshot and the dispatcher's progress first: the
        // records they vouch for are then all appended, so the log sync
        // below covers them. The log is synced before any index that points
        // into it (the wheel's files, the consume queues).
        let snapshot = self.wheel.to_sync.locked().take();
        let dispatched_now = self.dispatched.load(Ordering::Acquire);
        let offsets = self.offsets.snapshot(|| self.log.write_end());
        let log_durable = self.log.flush()?;
        let _ = self.dispatch_wake.try_send(());
        let (wheel, counts) = self.sync_wheel(snapshot)?;
        // A record counts as dispatched once its queue entry or its timer is indexed.
        let dispatched = dispatched_now.min(wheel.indexed);
        if let Err(e) = self.queues.flush_all().and_then(|()| self.keys.flush()) {
            self.log.poison(&format!("flush: {e}"));
            return Err(e);
        }
        if let Some(offsets) = offsets {
            self.offsets.write(&offsets)?;
        }
        // The log is synced past the snapshot: its counts' deliveries and
        // cancels are durable. The counts are an index a restart may miss
        // (it then scans the segments they do not know): a failure to write
        // them is reported, and the checkpoint is still written.
        if let Err(e) = self.write_counts(&counts, wheel.indexed, clean) {
            tracing::error!(error = %e, "could not write the segment counts; retention will scan instead");
        }
        let cp = Checkpoint {
            log_durable,
            dispatched,
            written_at_ms: self.clock.now_ms(),
            tick_second: wheel.tick_second,
            delivery_scan_from: wheel.delivery_scan_from,
            timer_log_end: wheel.timer_log_ends[0],
            far_timer_log_end: wheel.timer_log_ends[1],
            clean,
            sequence: 0,
        };
        let last = self.checkpoint.last().unwrap_or_default();
        let last_vouched = (last.log_durable, last.dispatched, last.tick_second);
        let vouched = (log_durable, dispatched, cp.tick_second);
        // Retention trusts the older of the last two checkpoints (the newest
        // may be torn), so once nothing changes one more is written: then
        // both vouch for the same state, and retention can reach it too.
        if clean || last_vouched != vouched || self.vouched_before_last != Some(vouched) {
            let written = self.checkpoint.write(cp)?;
            self.floor.record(&written, wheel.log_end, counts);
            self.vouched_before_last = Some(last_vouched);
        }
        Ok(())
    }
}
