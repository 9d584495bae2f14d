//! The baseline: RocketMQ 4.x's `ScheduleMessageService`, built faithfully on
//! the same store so the benches can compare it with the timing wheel.
//!
//! * A timed message is indexed under the schedule topic
//!   [`SCHEDULE_TOPIC`], in queue `level - 1`, with its due time in the
//!   consume-queue entry (`time_ms`), so polling reads no commit-log record
//!   until one is due. Its real topic and queue stay in the record.
//! * One thread (`dw-schedule`, RocketMQ's single `Timer`) runs one
//!   poll task per level every 100 ms: each delivers its queue's head while it
//!   is due and stops at the first one that is not (a level's queue is in put
//!   order, so in due order but for puts racing within a millisecond).
//! * Delivering writes the whole message again into the commit log (a record
//!   flagged `rescheduled`), which the dispatcher indexes into the real topic:
//!   the second payload write is part of what the benches compare.
//! * Progress is a per-level offset table, persisted every
//!   `schedule_offsets_interval` (RocketMQ: 10 s) and at close, restored at
//!   open and clamped into each queue. After a crash the deliveries made since
//!   the last persist are made again: at least once, not exactly once.
//! * A deliver time that is not a level is rounded **up** to the next level,
//!   as RocketMQ's proxy does (`useDelayLevel`); beyond the largest level it
//!   is capped there, and those messages arrive early (counted in
//!   `Stats::early`).
//! * Cancel (which 4.x lacks) is kept so the same workloads run on both: a
//!   cancel record, and an in-memory set of cancelled offsets the poller skips,
//!   rebuilt at open from the cancel records after the oldest pending head.
//!
//! Everything here is an index of the commit log, like the wheel.

mod offsets;
mod poller;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::commitlog::CommitLog;
use crate::consume_queue::{ConsumeQueue, QueueRegistry};
use crate::error::{Error, Result};
use crate::format::queue_entry::{Entry, tag_hash};
use crate::format::record::{MessageView, RecordKind, RescheduleView, Timing};
use crate::message::{CancelOutcome, RescheduleOutcome};
use crate::scheduler::SchedulerFront;
use crate::stats::TimerStats;
use crate::sync::Locked;
use crate::timer::levels::DelayLevels;
use crate::timer::{Timer, WheelFront};

pub(crate) use offsets::DelayOffsets;
pub(crate) use poller::{Poller, ScheduleCommand};

/// The topic whose queue `k - 1` holds the level-`k` messages (RocketMQ's name).
/// Reserved: `put` refuses it.
pub const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";
/// How often each level's queue head is checked.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The level a timed message waits in and when that level delivers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub level: u16,
    pub due_ms: u64,
}

/// The bucket of a message stored at `store_time_ms` with `timing`: its own
/// level, or for an arbitrary deliver time the smallest level that is not
/// earlier (the largest level if every level is earlier).
pub(crate) fn bucket_for(levels: &DelayLevels, store_time_ms: u64, timing: Timing) -> Result<Bucket> {
    let level = if timing.delay_level != 0 {
        timing.delay_level
    } else {
        // A deliver time already past wants the shortest level.
        let wanted = timing.deliver_at_ms.saturating_sub(store_time_ms);
        round_up_to_level(levels, wanted)
    };
    let due_ms = store_time_ms.saturating_add(levels.delay_ms(level)?);
    Ok(Bucket { level, due_ms })
}

/// The 1-based level with the smallest delay of at least `delay_ms`, else the longest one.
fn round_up_to_level(levels: &DelayLevels, delay_ms: u64) -> u16 {
    let delays = || levels.delays().map(|d| d.as_millis() as u64).zip(1u16..);
    let not_earlier = delays().filter(|&(d, _)| d >= delay_ms).min();
    let longest = delays().max_by_key(|&(d, level)| (d, std::cmp::Reverse(level)));
    not_earlier.or(longest).map_or(1, |(_, level)| level)
}

/// The buckets' front: the dispatcher appends to the level queues directly;
/// cancels go to the poller thread, the one place that decides a timer's fate.
pub(crate) struct BucketFront {
    pub levels: DelayLevels,
    pub queues: Arc<QueueRegistry>,
    pub log: Arc<CommitLog>,
    pub commands: Sender<ScheduleCommand>,
    pub stats: Arc<Mutex<TimerStats>>,
    /// The dispatcher's progress: a cancel waits until its message is indexed.
    pub dispatched: Arc<AtomicU64>,
    pub timeout: Duration,
    /// The wheel, empty, ticks beside the buckets: the checkpoint's wheel
    /// fields come from it, so it hears of the dispatcher's progress.
    pub idle_wheel: WheelFront,
}

impl SchedulerFront for BucketFront {
    fn index(&self, offset: u64, record: &[u8], view: &MessageView<'_>) -> Result<Option<Arc<ConsumeQueue>>> {
        let bucket = bucket_for(&self.levels, view.store_time_ms, view.timing)?;
        let queue = self.queues.get_or_create(SCHEDULE_TOPIC, u32::from(bucket.level) - 1);
        let record_len = record.len() as u32;
        let tag_hash = tag_hash(view.tags);
        queue.append(&Entry {
            log_offset: offset,
            record_len,
            tag_hash,
            time_ms: bucket.due_ms,
            flags: 0,
        })?;
        Ok(Some(queue))
    }

    fn indexed_below(&self, offset: u64) -> Result<()> {
        self.idle_wheel.indexed_below(offset)
    }

    fn cancel(&self, timer: Timer) -> Result<CancelOutcome> {
        let bucket = self.bucket_of(timer.message_offset)?;
        self.wait_indexed(timer.message_offset)?;
        let (reply, answer) = crossbeam_channel::bounded(1);
        let command = ScheduleCommand::Cancel { timer, level: bucket.level, reply };
        self.commands.send(command).map_err(|_| Error::Closed)?;
        answer.recv_timeout(self.timeout).map_err(|_| Error::Closed)?
    }

    fn stats(&self) -> TimerStats {
        self.stats.locked().clone()
    }

    /// The buckets index a timed record as the dispatcher hands it over.
    fn held_below(&self, dispatched: u64) -> u64 {
        dispatched
    }

    /// A bucket store writes no reschedule record (it cannot reschedule).
    fn index_rescheduled(&self, offset: u64, _view: &RescheduleView) -> Result<()> {
        tracing::warn!(offset, "a reschedule record in a bucket store: ignored");
        Ok(())
    }

    /// RocketMQ 4.x's buckets are FIFO queues of offsets by level: a timer
    /// cannot be moved to another time (nor are arbitrary times kept).
    fn reschedule(&self, _timer: Timer, _deliver_at_ms: u64) -> Result<RescheduleOutcome> {
        Err(Error::invalid("scheduler", "the bucket scheduler cannot reschedule; use the wheel"))
    }

    /// The poller refreshes its gauges at every poll (100 ms): nothing to ask.
    fn refresh(&self) -> Result<()> {
        Ok(())
    }

    /// RocketMQ 4.x's buckets are FIFO queues of offsets: they cannot be
    /// read by due time without scanning every bucket, so they do not answer.
    fn pending(
        &self,
        _window_ms: std::ops::Range<u64>,
        _limit: usize,
    ) -> Result<Vec<crate::timer::wheel::window::PendingEntry>> {
        Err(Error::invalid("scheduler", "the bucket scheduler cannot list pending timers; use the wheel"))
    }

    fn pending_of(
        &self,
        _timers: Vec<crate::timer::Timer>,
    ) -> Result<Vec<Option<crate::timer::wheel::window::PendingEntry>>> {
        Err(Error::invalid(
            "scheduler",
            "the bucket scheduler cannot tell which timers are pending; use the wheel",
        ))
    }

    fn fate_of(&self, _timer: crate::timer::Timer) -> Result<crate::timer::wheel::window::TimerFate> {
        Err(Error::invalid(
            "scheduler",
            "the bucket scheduler cannot tell what became of a timer; use the wheel",
        ))
    }

    fn pending_counts(&self, _bounds_ms: Vec<u64>) -> Result<Vec<u64>> {
        Err(Error::invalid("scheduler", "the bucket scheduler cannot count pending timers by due time"))
    }
}

impl BucketFront {
    /// The bucket of the timed message record at `offset` (checked by the caller).
    fn bucket_of(&self, offset: u64) -> Result<Bucket> {
        let record = self.log.read(offset)?;
        if record.kind != RecordKind::Message {
            return Err(Error::invalid("cancel", format!("no message at offset {offset}")));
        }
        let view = MessageView::parse(&record.bytes).map_err(|kind| self.log.corruption_at(offset, kind))?;
        bucket_for(&self.levels, view.store_time_ms, view.timing)
    }

    /// Waits (up to the timeout) until the dispatcher has indexed the record at `offset`.
    fn wait_indexed(&self, offset: u64) -> Result<()> {
        let started = std::time::Instant::now();
        loop {
            let dispatched = self.dispatched.load(Ordering::Acquire);
            if dispatched > offset {
                return Ok(());
            }
            if started.elapsed() >= self.timeout {
                let waited_ms = started.elapsed().as_millis() as u64;
                return Err(Error::Busy { lag_bytes: offset + 1 - dispatched, waited_ms });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(deliver_at_ms: u64, delay_level: u16) -> Timing {
        Timing { deliver_at_ms, delay_level }
    }

    #[test]
    fn a_level_is_its_own_bucket() {
        let levels = DelayLevels::default();
        let bucket = bucket_for(&levels, 1_000, timing(1_000 + 30_000, 4)).unwrap();
        assert_eq!(bucket, Bucket { level: 4, due_ms: 31_000 });
    }

    #[test]
    fn arbitrary_times_round_up_to_the_next_level() {
        let levels = DelayLevels::default();
        let at = |delay_ms| bucket_for(&levels, 0, timing(delay_ms, 0)).unwrap();
        assert_eq!(at(1), Bucket { level: 1, due_ms: 1_000 });
        assert_eq!(at(1_000), Bucket { level: 1, due_ms: 1_000 });
        assert_eq!(at(1_001), Bucket { level: 2, due_ms: 5_000 });
        assert_eq!(at(45 * 60_000), Bucket { level: 17, due_ms: 3_600_000 });
        // Beyond the largest level: capped there, so delivered early.
        assert_eq!(at(3 * 3_600_000), Bucket { level: 18, due_ms: 7_200_000 });
    }

    #[test]
    fn a_time_in_the_past_goes_to_the_shortest_level() {
        let levels = DelayLevels::parse("5s 1s 10s").unwrap();
        let bucket = bucket_for(&levels, 50_000, timing(1, 0)).unwrap();
        assert_eq!(bucket, Bucket { level: 2, due_ms: 51_000 });
    }
}
