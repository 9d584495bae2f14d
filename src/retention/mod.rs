//! Retention: deletes old commit-log segments without losing a pending timer.
//!
//! A segment may go once it is full, older than [`Retention::keep_for`] (or
//! the log is over [`Retention::max_log_bytes`]), and wholly below the
//! *floor*: the oldest position the last two checkpoints may replay or scan
//! from, so no recovery (not even one falling back to the previous checkpoint)
//! needs its records. The records a timer may still need — it has not fired,
//! or its delivery is not indexed yet, or it fired less than the retention
//! time ago — are first copied to the relocation area (`commitlog/relocated/`,
//! see `relocated.rs`), then a relocation record is made durable, then the
//! segment is deleted. A copy keeps its original offset, so the wheel,
//! handles and delivery records still name it; it is never copied again: its
//! window file is deleted whole once its timers have fired and the retention
//! time has passed. Per-segment counts (`pending.rs`) let a segment with
//! nothing pending go unread, and keep one whose near timers fired recently
//! until consumers had the retention time to read them.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};

use crate::clock::Clock;
use crate::commitlog::CommitLog;
use crate::commitlog::relocated::Copied;
use crate::config::Retention;
use crate::consume_queue::QueueRegistry;
use crate::durable::{Floor, Mark, Pins};
use crate::error::{Error, Result};
use crate::format::FILE_HEADER_LEN;
use crate::format::record::{
    CancelView, MessageView, OccurrencesView, RELOCATION_LEN, RecordKind, RelocationView, RescheduleView,
    record_time_ms,
};
use crate::key_index::KeyIndexes;
use crate::schedule::replaced_by;
use crate::stats::RetentionCounters;
use crate::sync::Locked;
use crate::threads::StopFlag;
use crate::topic_counts::TopicCounts;

/// What one retention pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReclaimReport {
    /// Commit-log segments deleted.
    pub segments_deleted: u64,
    /// Pending timers copied to the relocation area (each once, ever).
    pub timers_relocated: u64,
    /// Bytes of those copies.
    pub bytes_relocated: u64,
    /// Relocation window files deleted after their timers fired.
    pub windows_deleted: u64,
    /// Consume-queue files deleted because every entry in them pointed at deleted records.
    pub queue_files_deleted: u64,
}

/// Decides what to delete and deletes it. Shared by the retention thread
/// and `Store::reclaim`; one pass runs at a time.
pub(crate) struct Retainer {
    pub log: Arc<CommitLog>,
    pub queues: Arc<QueueRegistry>,
    pub keys: Arc<KeyIndexes>,
    pub topics: Option<Arc<TopicCounts>>,
    /// Tells the ticking thread (which owns the timer logs) to look for
    /// timer-log files to delete, after each pass.
    pub timer_log_reclaim: Sender<()>,
    pub clock: Arc<dyn Clock>,
    pub policy: Retention,
    pub floor: Arc<Floor>,
    pub counters: Arc<RetentionCounters>,
    pub running: Mutex<()>,
    /// When the store was opened, and the first second the wheel had not
    /// delivered then: timers due since may fire in this session, long after
    /// their time (after downtime), and stay readable the retention time after.
    pub opened_at_ms: u64,
    pub open_tick_second: u64,
    /// Messages whose timer was rescheduled, with the new deliver time (see `durable/pins.rs`).
    pub pins: Arc<Pins>,
}

impl Retainer {
    /// The `dw-retention` thread's body: a pass every check interval
    /// or when woken (a put found the log at its size cap).
    pub fn run(self: Arc<Self>, wake: Receiver<()>, stop: StopFlag) -> Result<()> {
        while !stop.is_set() {
            if let Err(e) = self.pass() {
                // Nothing was deleted that is still needed; the next pass retries.
                tracing::error!(error = %e, "retention pass failed");
            }
            let _ = wake.recv_timeout(self.policy.check_interval);
        }
        Ok(())
    }

    /// Every timer due before this instant has fired or was cancelled and
    /// two checkpoints vouch for its delivery: retention's floor in time
    /// (0 until two checkpoints are written).
    pub fn settled_before_ms(&self) -> u64 {
        self.floor.get().map_or(0, |mark| mark.settled_before_second.saturating_mul(1000))
    }

    /// Deletes every segment and relocation window that may go now.
    pub fn pass(&self) -> Result<ReclaimReport> {
        let _running = self.running.locked();
        let Some(floor) = self.floor.get() else { return Ok(ReclaimReport::default()) };
        // Until the ticking thread has read the pins, a pinned message looks
        // unneeded; until the topic counts are made, a recount reads the log.
        if !self.pins.ready() || self.topics.as_ref().is_some_and(|t| t.recounting()) {
            return Ok(ReclaimReport::default());
        }
        let _span = tracing::debug_span!("retention", floor = floor.log_offset).entered();
        let needed_from_ms = self.needed_from_ms(&floor);
        let mut report = ReclaimReport::default();
        while let Some(base) = self.next_segment(&floor, needed_from_ms)? {
            let copied = self.relocate_and_delete(base, &floor, needed_from_ms)?;
            report.segments_deleted += 1;
            report.timers_relocated += copied.timers;
            report.bytes_relocated += copied.bytes;
        }
        if report.segments_deleted > 0 {
            report.queue_files_deleted = self.queues.delete_files_below(self.log.start())?;
            self.counters.queue_files_deleted.fetch_add(report.queue_files_deleted, Ordering::Relaxed);
        }
        report.windows_deleted = self.delete_passed_windows(needed_from_ms)?;
        if report.segments_deleted > 0 || report.windows_deleted > 0 {
            self.keys.delete_unneeded(&self.log)?;
        }
        let _ = self.timer_log_reclaim.try_send(());
        Ok(report)
    }

    /// Timers due at or after this may still be needed, so their records are
    /// kept (relocated): not fired yet, or fired but their delivery not yet
    /// indexed, or fired less than the retention time ago (a consumer may
    /// still read the message), or due since this open less than the
    /// retention time ago (after downtime they fire at the open, late).
    fn needed_from_ms(&self, floor: &Mark) -> u64 {
        let keep_ms = self.policy.keep_for.map_or(0, |keep| keep.as_millis() as u64);
        // Saturating: a floor nearer the epoch than the retention time keeps everything.
        let from = floor.settled_before_second.saturating_mul(1000).saturating_sub(keep_ms);
        if self.clock.now_ms() < self.opened_at_ms.saturating_add(keep_ms) {
            return from.min(self.open_tick_second.saturating_mul(1000));
        }
        from
    }

    /// The oldest segment, if it may be deleted now.
    fn next_segment(&self, floor: &Mark, needed_from_ms: u64) -> Result<Option<u64>> {
        let size = self.log.segment_size();
        let Some(&base) = self.log.segment_bases().first() else { return Ok(None) };
        let full_and_checkpointed = base + size <= self.log.tail_base() && base + size <= floor.log_offset;
        if !full_and_checkpointed {
            return Ok(None);
        }
        if self.over_cap()? {
            return Ok(Some(base));
        }
        // Its near timers fired less than the retention time ago: consumers
        // may still read them, so the segment waits rather than copy them.
        let near_recently =
            floor.counts.pending_in(base).is_some_and(|p| p.latest_near_due_ms >= needed_from_ms);
        if near_recently {
            return Ok(None);
        }
        let expired = match (self.policy.keep_for, self.filled_at_ms(base)) {
            (Some(keep), Some(filled)) => {
                filled.saturating_add(keep.as_millis() as u64) <= self.clock.now_ms()
            }
            _ => false,
        };
        Ok(expired.then_some(base))
    }

    /// Whether the log (segments and relocated copies) leaves no room for one
    /// more segment under the cap.
    fn over_cap(&self) -> Result<bool> {
        let Some(cap) = self.policy.max_log_bytes else { return Ok(false) };
        let used = self.log.disk_bytes() + self.log.relocated().disk_bytes()?;
        Ok(used + self.log.segment_size() > cap)
    }

    /// When the segment at `base` was filled: the time of the next segment's first record.
    fn filled_at_ms(&self, base: u64) -> Option<u64> {
        let next = base + self.log.segment_size() + FILE_HEADER_LEN as u64;
        if next >= self.log.write_end() {
            return None;
        }
        self.log
            .visit_trusted(next, |_, kind, bytes| record_time_ms(kind, bytes))
            .ok()
            .and_then(|(time, _)| time)
    }

    /// Copies the pending timers of the segment at `base` (the oldest), makes
    /// the copies and a relocation record durable, then deletes the segment.
    fn relocate_and_delete(&self, base: u64, floor: &Mark, needed_from_ms: u64) -> Result<Copied> {
        let _span = tracing::info_span!("relocate", segment = base).entered();
        // A rescheduled timer's message counts in no segment: its pin keeps it.
        let pinned = !self.pins.due_from(base..base + self.log.segment_size(), needed_from_ms).is_empty();
        let copied = match floor.counts.pending_in(base) {
            Some(p) if p.count == 0 && p.latest_due_ms < needed_from_ms && !pinned => {
                self.counters.deleted_unread.fetch_add(1, Ordering::Relaxed);
                Copied::default()
            }
            // A pass that failed after its copies were indexed: never copy twice.
            _ if self.log.relocated().last_original_offset()?.is_some_and(|last| last >= base) => {
                Copied::default()
            }
            _ => self.copy_pending(base, needed_from_ms)?,
        };
        let record = RelocationView {
            relocated_at_ms: self.clock.now_ms(),
            segment_base: base,
            timers: copied.timers,
            cancels: copied.cancels,
            bytes: copied.bytes,
        };
        self.log.append_reserved(RELOCATION_LEN, |buf, offset| record.encode(buf, offset))?;
        // The copies are synced; the record must be too before the original goes.
        self.log.flush()?;
        self.log.delete_oldest_segment(base)?;
        self.counters.segments_deleted.fetch_add(1, Ordering::Relaxed);
        self.counters.relocated_timers.fetch_add(copied.timers, Ordering::Relaxed);
        self.counters.relocated_bytes.fetch_add(copied.bytes, Ordering::Relaxed);
        tracing::info!(
            segment = base,
            timers = copied.timers,
            cancels = copied.cancels,
            bytes = copied.bytes,
            "segment reclaimed"
        );
        Ok(copied)
    }

    /// When the message at `offset`, put due at `own_ms`, is needed until: a
    /// rescheduled timer's message (pinned, in the floor's counts or by the
    /// ticking thread since) is needed until its new deliver time.
    fn needed_until_ms(&self, offset: u64, own_ms: u64) -> u64 {
        self.pins.get(offset).map_or(own_ms, |pin| pin.deliver_at_ms.max(own_ms))
    }

    /// Reads the segment at `base` and copies (and syncs) what a pending timer needs.
    fn copy_pending(&self, base: u64, pending_from_ms: u64) -> Result<Copied> {
        let size = self.log.segment_size();
        let (guard, mut pass) = self.log.relocated().begin();
        let mut at = base + FILE_HEADER_LEN as u64;
        while at < base + size && at < self.log.write_end() {
            // A damaged record is skipped (its timer is lost; the ticker
            // reports it when due): one must not keep the segment forever.
            let (copied, next) = self.log.walk_checked(at, |offset, kind, bytes| {
                let corrupt = |kind| self.log.corruption_at(offset, kind);
                let pending_at = match kind {
                    RecordKind::Message => {
                        let view = MessageView::parse(bytes).map_err(corrupt)?;
                        // An update is also the cancel of the timer it replaced.
                        let settles = replaced_by(&view).map_or(0, |r| r.deliver_at_ms);
                        view.timer_deliver_at_ms()
                            .map(|own| self.needed_until_ms(offset, own).max(settles))
                            .filter(|&at| at >= pending_from_ms)
                    }
                    // A rescheduled timer's record (its message is pinned).
                    RecordKind::Reschedule => {
                        Some(RescheduleView::parse(bytes).map_err(corrupt)?.deliver_at_ms)
                            .filter(|&at| at >= pending_from_ms)
                    }
                    // Copied whole (its checksum binds all its entries) while
                    // any entry's timer is pending, filed by the latest.
                    RecordKind::Occurrences => OccurrencesView::parse(bytes, offset)
                        .map_err(corrupt)?
                        .entries()
                        .map(|(_, r)| r.deliver_at_ms)
                        .max()
                        .filter(|&at| at >= pending_from_ms),
                    // A cancel of a timer not yet due goes along: a wheel
                    // rebuilt from the log must still see it.
                    RecordKind::Cancel => Some(CancelView::parse(bytes).map_err(corrupt)?.deliver_at_ms)
                        .filter(|&at| at >= pending_from_ms),
                    _ => None,
                };
                match pending_at {
                    Some(deliver_at_ms) => {
                        pass.copy(offset, kind == RecordKind::Cancel, deliver_at_ms, bytes)
                    }
                    None => Ok(()),
                }
            })?;
            copied?;
            at = next;
        }
        let copied = pass.finish()?;
        drop(guard);
        Ok(copied)
    }

    /// Deletes the relocation windows whose timers are all due before
    /// `needed_from_ms`: fired, indexed, and read or past the retention time.
    /// A window holding the copy of a pinned message stays while its timer
    /// is needed: it was copied by when it was due then, and rescheduled
    /// later since. (A pin due before `needed_from_ms` fired long enough ago;
    /// one the cancel ledger gave after a lost counts file may have fired.)
    fn delete_passed_windows(&self, needed_from_ms: u64) -> Result<u64> {
        let mut before_sec = needed_from_ms / 1000;
        for (message, _) in self.pins.due_from(0..self.log.start(), needed_from_ms) {
            if let Some(copy) = self.log.relocated().find(message)? {
                before_sec = before_sec.min(copy.window());
            }
        }
        let (files, _) = self.log.relocated().delete_windows_before(before_sec, self.log.write_end())?;
        self.counters.windows_deleted.fetch_add(files, Ordering::Relaxed);
        Ok(files)
    }
}

/// Whether `e` means retention is the reason a put could not be written.
pub(crate) fn is_size_cap(e: &Error) -> bool {
    matches!(e, Error::SizeCap { .. })
}
