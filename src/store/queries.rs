//! The store's questions: counters and gauges, and the pending timers by
//! time window, by due-time bucket and by key. Each waits, when it must,
//! until what was put before the call is indexed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Store;
use crate::error::{Error, Result};
use crate::pending::{MAX_COUNT_BOUNDS, PendingTimer};
use crate::stats::{DiskUsage, Lateness, RetentionStats, Stats};
use crate::sync::Locked;

impl Store {
    /// Everything below this offset is indexed: in its consume queue, or
    /// held by the scheduler.
    pub(super) fn indexed_below(&self) -> u64 {
        self.scheduler.held_below(self.dispatched.load(Ordering::Acquire))
    }

    /// [`stats`](Self::stats) as of now: waits until every record put before
    /// the call is indexed (its queue entry written, its timer held by the
    /// wheel), has the ticking thread refresh its gauges, and returns them.
    /// For code that checks a count right after an action: `stats()` costs
    /// nothing but its wheel gauges (`pending`, the per-level and per-horizon
    /// counts, `reindexed`, `timer_log_entries`) are up to a second old. With
    /// the bucket scheduler the gauges are as of its last poll (100 ms).
    ///
    /// The wheel's gauges add slot counts: after a crash they may count a
    /// timer the crash delivered, or one the replay indexed twice, until its
    /// second is loaded. A store opened [without
    /// delivery](crate::Config::with_delivery) counts exactly instead (it
    /// reads every live chain, O(pending)), which is what `delaywheel
    /// recover` prints.
    ///
    /// Errors: [`Error::Busy`] if the indexes do not catch up within the put
    /// timeout; [`Error::TickerBusy`] if the ticking thread does not answer
    /// in that time (waiting for disk space, say); the poison if the store is poisoned.
    pub fn fresh_stats(&self) -> Result<Stats> {
        self.wait_indexed_to(self.log.write_end())?;
        self.wait_topics_counted()?;
        self.scheduler.refresh()?;
        Ok(self.stats())
    }

    /// Waits, up to the put timeout, until the recount of the pending timers
    /// per topic an open may need has run (the dispatcher runs it first).
    fn wait_topics_counted(&self) -> Result<()> {
        let started = std::time::Instant::now();
        while self.topics.as_ref().is_some_and(|t| t.recounting()) {
            self.health()?;
            if started.elapsed() >= self.config.put_timeout {
                // The recount reads the log: that is how far behind it is at most.
                let lag_bytes = self.log.write_end() - self.log.start();
                return Err(Error::Busy { lag_bytes, waited_ms: started.elapsed().as_millis() as u64 });
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(())
    }

    /// Waits, up to the put timeout, until every record below `end` is indexed.
    pub(super) fn wait_indexed_to(&self, end: u64) -> Result<()> {
        let started = std::time::Instant::now();
        let _ = self.wakes.dispatch.try_send(());
        while self.indexed_below() < end {
            self.health()?;
            if started.elapsed() >= self.config.put_timeout {
                let lag_bytes = end - self.indexed_below().min(end);
                return Err(Error::Busy { lag_bytes, waited_ms: started.elapsed().as_millis() as u64 });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// The first `limit` pending timers due in `window_ms` (epoch ms,
    /// half-open), by deliver time (then by offset): every timer put before
    /// the call that has not fired and is not cancelled, with its topic,
    /// queue and key. The wheel's slots and timer logs are read, never the
    /// whole commit log: the cost is that of the timers in the window, plus
    /// one read of each answered timer's message.
    ///
    /// The answer is taken at one instant on the ticking thread: each timer
    /// in it had not fired at that instant (it may fire right after).
    ///
    /// ```
    /// # use delaywheel::{Config, Message, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let due = 4_000_000_000_000; // 2096
    /// let r = store.put(Message::new("orders", "pay?").key("order-42").deliver_at_ms(due))?;
    /// let soon = store.pending(due..due + 300_000, 100)?;
    /// assert_eq!(soon[0].key.as_deref(), Some("order-42"));
    /// assert_eq!(Some(soon[0].handle), r.handle());
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Errors: [`Error::Busy`] if the indexes do not take in what was put
    /// before the call within the put timeout; [`Error::TickerBusy`] if the
    /// ticking thread does not answer in that time; a corruption error if a
    /// slot's chain does not check out; [`Error::Invalid`] with the bucket
    /// scheduler, which cannot list its timers.
    pub fn pending(&self, window_ms: std::ops::Range<u64>, limit: usize) -> Result<Vec<PendingTimer>> {
        self.wait_indexed_to(self.log.write_end())?;
        let entries = self.scheduler.pending(window_ms, limit)?;
        Ok(crate::pending::describe(&self.log, entries))
    }

    /// The pending timers counted by due time, for a chart: `counts[0]` is
    /// due before `bounds_ms[0]`, `counts[i]` from `bounds_ms[i - 1]` up to
    /// `bounds_ms[i]`, and the last count from the last bound on, so there is
    /// one count more than bounds and they add up to all pending timers. Read
    /// from the wheel's slot counts, never by listing timers: with bounds on
    /// whole seconds the counts are exact within the next 18 hours (level 0's
    /// one-second slots); further ahead a slot covers 9.1 hours (level 1) or
    /// 4.25 years (level 2) and its timers count as due at its start.
    /// Cancelled timers are not counted. Taken at one instant on the ticking
    /// thread, after everything put before the call is indexed.
    ///
    /// ```
    /// # use delaywheel::{Clock, Config, Message, Store, SystemClock};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let minute = (SystemClock.now_ms() / 1_000 + 60) * 1_000; // a whole second, a minute ahead
    /// store.put(Message::new("orders", "pay?").deliver_at_ms(minute + 250))?;
    /// assert_eq!(store.pending_counts(&[minute, minute + 1_000])?, [0, 1, 0]);
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Errors: [`Error::Invalid`] (`"bounds"`) unless the bounds ascend
    /// strictly and number at most [`MAX_COUNT_BOUNDS`]; else those of
    /// [`pending`](Self::pending).
    pub fn pending_counts(&self, bounds_ms: &[u64]) -> Result<Vec<u64>> {
        if bounds_ms.len() > MAX_COUNT_BOUNDS {
            let why = format!("{} bounds, at most {MAX_COUNT_BOUNDS}", bounds_ms.len());
            return Err(Error::invalid("bounds", why));
        }
        if let Some(w) = bounds_ms.windows(2).find(|w| w[0] >= w[1]) {
            return Err(Error::invalid("bounds", format!("{} is not before {}: bounds ascend", w[0], w[1])));
        }
        self.wait_indexed_to(self.log.write_end())?;
        self.scheduler.pending_counts(bounds_ms.to_vec())
    }

    /// The first `limit` pending timers of the messages put with `topic` and
    /// `key`, by deliver time: "is the timeout of order-42 still pending?". The key
    /// index (`index/keys/`, kept by the dispatcher for every timed message
    /// with a key) names the candidates, each candidate's message is read to
    /// compare its topic and key, and the ticking thread says which of them
    /// are pending, at one instant (as for [`pending`](Self::pending)). A
    /// rescheduled timer is answered with its new time and its unchanged handle.
    /// Only the timers answered are described (their messages read in full).
    ///
    /// ```
    /// # use delaywheel::{Config, Message, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let due = 4_000_000_000_000; // 2096
    /// let r = store.put(Message::new("orders", "cancel if unpaid").key("order-42").deliver_at_ms(due))?;
    /// let pending = store.pending_by_key("orders", "order-42", 10)?;
    /// assert_eq!(pending.len(), 1);
    /// assert_eq!(Some(pending[0].handle), r.handle());
    /// store.cancel(r.handle().unwrap())?;
    /// assert!(store.pending_by_key("orders", "order-42", 10)?.is_empty());
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Errors: as for [`pending`](Self::pending); a candidate whose message
    /// does not check out is left out with a warning.
    pub fn pending_by_key(&self, topic: &str, key: &str, limit: usize) -> Result<Vec<PendingTimer>> {
        self.wait_indexed_to(self.log.write_end())?;
        let timers =
            crate::pending::timers_with_key(&self.log, self.keys.keys.candidates(topic, key), topic, key);
        if timers.is_empty() {
            return Ok(Vec::new());
        }
        let mut entries: Vec<_> = self.scheduler.pending_of(timers)?.into_iter().flatten().collect();
        entries.sort_unstable_by_key(|e| e.timer);
        entries.truncate(limit);
        Ok(crate::pending::describe(&self.log, entries))
    }

    /// Counters and gauges: pending timers (per level and per coming horizon),
    /// deliveries and their lateness, disk use. The wheel's gauges are
    /// refreshed by the ticking thread about once a second (see [`Stats`]);
    /// [`fresh_stats`](Self::fresh_stats) waits for fresh ones.
    pub fn stats(&self) -> Stats {
        let timers = self.scheduler.stats();
        let wheel_files = self.wheel.stats.locked().disk_bytes;
        let disk = DiskUsage {
            commit_log: self.log.disk_bytes(),
            relocated: self.log.relocated().disk_bytes().unwrap_or(0),
            consume_queues: self.queues.disk_bytes(),
            timer_index: wheel_files,
            key_index: self.keys.disk_bytes(),
        };
        let counter = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let (damaged_log_spans, damaged_log_bytes) = self.log.damaged_spans();
        let retention = RetentionStats {
            oldest_retained_offset: self.log.start(),
            segments_deleted: counter(&self.retention.segments_deleted),
            relocated_timers: counter(&self.retention.relocated_timers),
            relocated_bytes: counter(&self.retention.relocated_bytes),
            windows_deleted: counter(&self.retention.windows_deleted),
            queue_files_deleted: counter(&self.retention.queue_files_deleted),
            deleted_unread: counter(&self.retention.deleted_unread),
            pending_by_segment: self.wheel.synced.locked().1.iter().collect(),
            consumer_skipped: counter(&self.retention.consumer_skipped),
            settled_before_ms: self.retainer.as_ref().map_or(0, |r| r.settled_before_ms()),
        };
        let (pending_by_topic, pending_other_topics) =
            self.topics.as_ref().and_then(|t| t.top(crate::stats::STATS_TOPICS)).unwrap_or_default();
        Stats {
            pending: timers.pending,
            pending_per_level: timers.pending_per_level,
            pending_by_horizon: timers.pending_by_horizon,
            pending_by_topic,
            pending_other_topics,
            schedules: self.topics.as_ref().and_then(|t| t.schedules()),
            delivered: timers.delivered,
            occurrences_delivered: timers.occurrences_delivered,
            early: timers.early,
            reindexed: timers.reindexed,
            lateness_ms: Lateness::from_histogram(&timers.lateness_ms),
            recent_lateness_ms: timers.recent_lateness_ms.summary(self.config.clock.now_ms()),
            disk_bytes: disk.commit_log
                + disk.relocated
                + disk.consume_queues
                + disk.timer_index
                + disk.key_index,
            timer_log_entries: timers.timer_log_entries,
            log_bytes: self.log.write_end() - self.log.start(),
            // Read after the end: the dispatcher may have passed the end read first.
            dispatch_lag_bytes: self.log.write_end().saturating_sub(self.indexed_below()),
            quarantined: self.retention.quarantined.load(Ordering::Relaxed),
            damaged_log_spans,
            damaged_log_bytes,
            refreshes: timers.refreshes,
            wheel_rebuilds: timers.rebuilds,
            timers_checked_at_load: timers.checked_at_load,
            disk,
            retention,
        }
    }
}
