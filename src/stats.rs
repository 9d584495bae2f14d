//! What `Store::stats` reports.

use crate::topic_counts::ScheduleCounts;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// How many topics [`Stats::pending_by_topic`] names.
pub const STATS_TOPICS: usize = 16;

/// A snapshot of the store's counters and gauges. Wheel gauges are refreshed
/// about once a second by the ticking thread; with the bucket scheduler,
/// `pending` is refreshed every poll (100 ms) and the per-level, per-horizon,
/// re-index and timer-log figures stay 0 (the buckets have none of them).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Timers indexed and not yet delivered.
    pub pending: u64,
    /// Pending timers per wheel level (0: within 18 h, 1: within 8.5 years, 2: beyond).
    pub pending_per_level: [u64; 3],
    /// Pending timers by when they are due, per interval (not cumulative):
    /// within 5 s, from 5 s to 1 min, 1 min to 5 min, 5 min to 1 h, 1 h to
    /// 1 d, and beyond 1 d ([`HORIZON_LABELS`] name them by their upper
    /// ends), each bound rounded up to a whole second (a wheel slot holds one
    /// second). They add up to `pending`, cancelled timers left out. Read
    /// from slot counts: exact within 18 h; a coarser window counts at its
    /// start (a store opened without delivery counts each timer at its own
    /// deliver time on [`fresh_stats`](crate::Store::fresh_stats)).
    pub pending_by_horizon: [u64; 6],
    /// Pending timers of the topics with the most of them, most first: at
    /// most [`STATS_TOPICS`] topics, so a store with a million topics keeps
    /// small stats. Counted by the dispatcher in log order (a timer leaves
    /// its topic's count when its delivery or cancel record is indexed, a
    /// few milliseconds after it fired), kept across restarts. Empty with the
    /// bucket scheduler, while a recount runs after an open that found no
    /// usable counts file ([`fresh_stats`](crate::Store::fresh_stats) waits
    /// for it), and if the counts could not be made (logged).
    pub pending_by_topic: Vec<(String, u64)>,
    /// Pending timers of every other topic, summed.
    pub pending_other_topics: u64,
    /// The recurring schedules with an occurrence still to come, and the
    /// paused among them. Counted as [`pending_by_topic`](Self::pending_by_topic)
    /// is (in log order, kept across restarts); `None` when those are empty
    /// for want of counts.
    pub schedules: Option<ScheduleCounts>,
    /// Timers delivered since the store was opened.
    pub delivered: u64,
    /// Of those, occurrences of recurring schedules.
    pub occurrences_delivered: u64,
    /// Deliveries before their deliver-at time since open. Always 0 for the
    /// wheel; the buckets deliver early what lies beyond their largest level.
    pub early: u64,
    /// Timer-log entries written by cascades since the store was opened.
    pub reindexed: u64,
    /// Delivery time minus deliver-at time, over deliveries since open.
    pub lateness_ms: Lateness,
    /// The same over the deliveries of the last one to two minutes (this
    /// minute of the clock and the one before), so a dashboard sees how
    /// delivery keeps up now; lateness past an hour counts as an hour.
    pub recent_lateness_ms: Lateness,
    /// Bytes of the commit log, consume queues, wheel and timer log.
    pub disk_bytes: u64,
    /// Timer-log entries written so far (each 28 bytes on disk).
    pub timer_log_entries: u64,
    /// Bytes appended to the commit log (records and padding), from its first retained byte to its end.
    pub log_bytes: u64,
    /// Commit-log bytes not yet indexed: not yet in their consume queue, or
    /// (for a timer) not yet held by the wheel. At 0 every timer put so far
    /// is in the wheel, so a clock jump then delivers them in deliver-time
    /// order and cancel finds each of them.
    pub dispatch_lag_bytes: u64,
    /// Damaged records skipped since open, each logged with its file and
    /// offset: records the dispatcher could not index, and due timers not
    /// delivered because their message does not check out.
    pub quarantined: u64,
    /// Damaged stretches of the commit log that readers walking it stepped
    /// over since open (lenient mode), each logged with its file, offset and
    /// length: the records in them are lost. Recovery's own are in
    /// [`RecoveryReport::skipped`](crate::RecoveryReport::skipped).
    pub damaged_log_spans: u64,
    /// Their bytes.
    pub damaged_log_bytes: u64,
    /// How many times the wheel gauges have been refreshed since open.
    pub refreshes: u64,
    /// How many times the ticking thread rebuilt the wheel from the commit
    /// log since open, because its files were found damaged (each logged).
    pub wheel_rebuilds: u64,
    /// Timers the ticking thread checked against their records since open,
    /// reading them as the timers' seconds loaded, before they fire. Most
    /// timed messages indexed in this run of the store and due within about
    /// a minute are not read: the dispatcher checked their records as it
    /// indexed them (see `timer/routes.rs`).
    pub timers_checked_at_load: u64,
    /// Bytes on disk per kind of file.
    pub disk: DiskUsage,
    /// What retention did since open, and where the log now starts.
    pub retention: RetentionStats,
}

/// Bytes on disk per kind of file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DiskUsage {
    /// Commit-log segment files (truth).
    pub commit_log: u64,
    /// Relocated copies of pending timers and their index (truth).
    pub relocated: u64,
    /// Consume-queue files (index).
    pub consume_queues: u64,
    /// The wheel file and the timer log (index).
    pub timer_index: u64,
    /// The key index's files (index; see [`Store::pending_by_key`](crate::Store::pending_by_key)).
    pub key_index: u64,
}

/// Retention's counters since open.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RetentionStats {
    /// Offset of the first record of the oldest segment still on disk.
    pub oldest_retained_offset: u64,
    /// Commit-log segments deleted.
    pub segments_deleted: u64,
    /// Pending timers copied to the relocation area.
    pub relocated_timers: u64,
    /// Bytes of those copies.
    pub relocated_bytes: u64,
    /// Relocation window files deleted after their timers fired.
    pub windows_deleted: u64,
    /// Consume-queue files deleted because all their entries pointed at deleted records.
    pub queue_files_deleted: u64,
    /// Segments deleted without being read, because their count of pending timers was 0.
    pub deleted_unread: u64,
    /// Pending timers per segment (start offset, count) as of the wheel's last
    /// sync; segments not listed hold none. A count may be too high after a
    /// restart (a timer indexed twice by the replay), never too low.
    pub pending_by_segment: Vec<(u64, u64)>,
    /// Consume-queue entries consumers skipped because retention deleted their records.
    pub consumer_skipped: u64,
    /// Retention's floor in time: every timer due before this instant (ms)
    /// has fired or was cancelled, and the last checkpoints vouch for its
    /// delivery, so only the retention time keeps its record. It trails the
    /// clock by the ticking, indexing and checkpointing not yet done; 0
    /// without retention or before two checkpoints.
    pub settled_before_ms: u64,
}

/// How far ahead the first five counts of [`Stats::pending_by_horizon`]
/// reach, in ms: 5 s, 1 min, 5 min, 1 h, 1 d (the sixth is the rest), from
/// now, each rounded up to a whole second.
pub const HORIZONS_MS: [u64; 5] = [5_000, 60_000, 300_000, 3_600_000, 86_400_000];
/// Labels of [`Stats::pending_by_horizon`].
pub const HORIZON_LABELS: [&str; 6] = ["5s", "1m", "5m", "1h", "1d", "beyond"];

/// A summary of a lateness histogram, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lateness {
    /// Deliveries measured.
    pub count: u64,
    /// Median lateness.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// The largest lateness seen.
    pub max: u64,
}

impl Lateness {
    pub(crate) fn from_histogram(h: &hdrhistogram::Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// The counters and gauges a scheduler's thread publishes for `Store::stats`.
#[derive(Debug, Clone)]
pub(crate) struct TimerStats {
    pub pending: u64,
    pub pending_per_level: [u64; 3],
    /// Pending timers due within 5 s, 1 min, 5 min, 1 h, 1 d, and beyond.
    pub pending_by_horizon: [u64; 6],
    pub delivered: u64,
    pub occurrences_delivered: u64,
    pub early: u64,
    pub reindexed: u64,
    /// Delivery time minus deliver-at time; an early delivery counts as 0.
    pub lateness_ms: hdrhistogram::Histogram<u64>,
    /// The same, over this minute and the one before.
    pub recent_lateness_ms: RecentLateness,
    pub disk_bytes: u64,
    pub timer_log_entries: u64,
    /// How many times the gauges were refreshed (about once a second).
    pub refreshes: u64,
    /// How many times the wheel was rebuilt from the log since open (its files were damaged).
    pub rebuilds: u64,
    /// Timers checked against their records as their seconds loaded.
    pub checked_at_load: u64,
}

impl TimerStats {
    pub fn new() -> Self {
        // Lateness up to 1,000 hours, 3 significant digits.
        let lateness_ms =
            hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
        Self {
            pending: 0,
            pending_per_level: [0; 3],
            pending_by_horizon: [0; 6],
            delivered: 0,
            occurrences_delivered: 0,
            early: 0,
            reindexed: 0,
            lateness_ms,
            recent_lateness_ms: RecentLateness::new(),
            disk_bytes: 0,
            timer_log_entries: 0,
            refreshes: 0,
            rebuilds: 0,
            checked_at_load: 0,
        }
    }

    /// Records the lateness of `count` deliveries, since open and for this minute.
    pub fn record_lateness(&mut self, now_ms: u64, lateness_ms: u64, count: u64) {
        self.lateness_ms.saturating_record_n(lateness_ms, count);
        self.recent_lateness_ms.record(now_ms, lateness_ms, count);
    }
}

/// Lateness over the clock's current minute and the one before: two
/// one-minute histograms, the older dropped as each minute begins.
#[derive(Debug, Clone)]
pub(crate) struct RecentLateness {
    /// The minute (`now_ms / 60_000`) of `current`.
    minute: u64,
    current: hdrhistogram::Histogram<u64>,
    previous: hdrhistogram::Histogram<u64>,
}

impl RecentLateness {
    const MINUTE_MS: u64 = 60_000;

    fn new() -> Self {
        // Up to an hour, 2 significant digits: small enough to clone with every stats call.
        let empty =
            hdrhistogram::Histogram::new_with_bounds(1, 3_600_000, 2).expect("valid histogram bounds");
        Self { minute: 0, current: empty.clone(), previous: empty }
    }

    fn record(&mut self, now_ms: u64, lateness_ms: u64, count: u64) {
        let minute = now_ms / Self::MINUTE_MS;
        if minute != self.minute {
            // A clock that went back starts afresh too.
            match minute == self.minute + 1 {
                true => std::mem::swap(&mut self.previous, &mut self.current),
                false => self.previous.reset(),
            }
            self.current.reset();
            self.minute = minute;
        }
        self.current.saturating_record_n(lateness_ms, count);
    }

    /// The summary at `now_ms`: of both minutes while `current` is this
    /// minute's, of `current` alone in the next, then of nothing.
    pub fn summary(&self, now_ms: u64) -> Lateness {
        let minute = now_ms / Self::MINUTE_MS;
        if minute == self.minute {
            let mut both = self.previous.clone();
            // Same bounds and precision: adding cannot fail.
            let _ = both.add(&self.current);
            Lateness::from_histogram(&both)
        } else if minute == self.minute + 1 {
            Lateness::from_histogram(&self.current)
        } else {
            Lateness::default()
        }
    }
}

/// Counters of what retention did since open (and what consumers and the
/// dispatcher skipped).
#[derive(Debug, Default)]
pub(crate) struct RetentionCounters {
    pub segments_deleted: AtomicU64,
    pub relocated_timers: AtomicU64,
    pub relocated_bytes: AtomicU64,
    pub windows_deleted: AtomicU64,
    pub queue_files_deleted: AtomicU64,
    /// Segments deleted without reading them: their count said no timer was pending.
    pub deleted_unread: AtomicU64,
    /// Consume-queue entries consumers skipped because retention deleted their records.
    pub consumer_skipped: AtomicU64,
    /// Damaged records the dispatcher skipped, and timers the ticking thread
    /// did not deliver because their message is damaged.
    pub quarantined: Arc<AtomicU64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_lateness_keeps_this_minute_and_the_one_before() {
        let minute = RecentLateness::MINUTE_MS;
        let at = 1_000 * minute;
        let mut recent = RecentLateness::new();
        recent.record(at + 5, 10, 1);
        recent.record(at + minute - 1, 20, 1);
        assert_eq!(recent.summary(at + minute - 1).count, 2);
        recent.record(at + minute, 30, 1);
        let both = recent.summary(at + minute + 1);
        assert_eq!((both.count, both.max), (3, 30), "this minute and the one before");
        recent.record(at + 2 * minute, 40, 1);
        assert_eq!(recent.summary(at + 2 * minute).count, 2, "the first minute dropped");
        assert_eq!(recent.summary(at + 3 * minute).max, 40, "a minute on, only the last minute's");
        assert_eq!(recent.summary(at + 4 * minute), Lateness::default(), "nothing delivered lately");
        recent.record(at + 10 * minute, 50, 1);
        assert_eq!(recent.summary(at + 10 * minute).count, 1, "after a gap, nothing older");
    }
}
