//! How many pending timers each commit-log segment holds, so retention
//! deletes a segment without reading it when none is left.
//!
//! The ticking thread keeps the counts: +1 when a timer is indexed, -1 when
//! it fires or is cancelled, and +1 in the segment of each cancel record
//! (so it is scanned, and the cancel relocated with its timer). A count may be too high (a timer indexed twice
//! by a replay, one delivered just before a crash), which only costs a scan;
//! it is never too low, which is what makes skipping the scan safe:
//! * retention uses the counts of a snapshot whose deliveries and cancels
//!   were already durable in the log (see `Floor`);
//! * segments whose inserts the counts may have missed (after a restart from
//!   a counts file older than the checkpoint, or without one) are *unknown*
//!   and always scanned.
//!
//! The counts are an index: persisted now and then to `timer/segment_pending`
//! (layout in `wheel-format.md`), rebuilt by the replay after a restart, and
//! treated as unknown if the file is missing or damaged.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use crate::format::layout::SEGMENT_COUNTS_FILE;
use crate::format::segment_counts::{self as codec, SegmentPending};

/// Pending timers per segment (by segment base offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentCounts {
    segment_size: u64,
    counts: BTreeMap<u64, SegmentPending>,
    /// Log offsets whose segments' counts may miss inserts: scanned, never skipped.
    unknown: Range<u64>,
}

impl SegmentCounts {
    /// Counts that know every segment.
    pub fn new(segment_size: u64) -> Self {
        Self { segment_size, counts: BTreeMap::new(), unknown: 0..0 }
    }

    /// The counts of a wheel rebuilt by a replay of `replayed`: the replay
    /// counts every timer but no cancel record, so those segments are unknown.
    pub fn rebuilt(segment_size: u64, replayed: Range<u64>) -> Self {
        let unknown = if replayed.is_empty() { 0..0 } else { replayed };
        Self { unknown, ..Self::new(segment_size) }
    }

    fn base(&self, offset: u64) -> u64 {
        offset - offset % self.segment_size
    }

    /// A timer of the message at `offset`, due at `deliver_at_ms`, was
    /// indexed; `near`: it is due within the retention time.
    pub fn indexed(&mut self, offset: u64, deliver_at_ms: u64, near: bool) {
        let pending = self.counts.entry(self.base(offset)).or_default();
        pending.count += 1;
        pending.latest_due_ms = pending.latest_due_ms.max(deliver_at_ms);
        if near {
            pending.latest_near_due_ms = pending.latest_near_due_ms.max(deliver_at_ms);
        }
    }

    /// The timer of the message at `offset` fired or was cancelled.
    pub fn settled(&mut self, offset: u64) {
        self.settled_in(self.base(offset), 1);
    }

    /// The timers of the messages at `offsets` fired: like
    /// [`settled`](Self::settled) for each, with one map lookup per run of
    /// offsets in the same segment (a hot second's timers mostly are).
    pub fn settled_all(&mut self, offsets: impl IntoIterator<Item = u64>) {
        let mut run: Option<(u64, u64)> = None;
        let size = self.segment_size;
        for base in offsets.into_iter().map(|offset| offset - offset % size) {
            match &mut run {
                Some((run_base, n)) if *run_base == base => *n += 1,
                _ => {
                    if let Some((run_base, n)) = run.replace((base, 1)) {
                        self.settled_in(run_base, n);
                    }
                }
            }
        }
        if let Some((base, n)) = run {
            self.settled_in(base, n);
        }
    }

    fn settled_in(&mut self, base: u64, n: u64) {
        if let Some(pending) = self.counts.get_mut(&base) {
            // Saturating by design (a test pins it): one settlement may reach
            // the counts more than once, and a count only steers retention's
            // scans (see the module's doc), so it stops at zero.
            pending.count = pending.count.saturating_sub(n);
        }
    }

    /// A cancel record at `offset` cancels a timer not yet due: its segment
    /// must be scanned before deletion (the cancel is relocated if the timer
    /// is still ahead then). Never decremented: it only costs that scan.
    pub fn cancel_recorded(&mut self, offset: u64, deliver_at_ms: u64) {
        self.indexed(offset, deliver_at_ms, false);
    }

    /// What the segment at `base` holds; `None` if the counts may have missed some.
    pub fn pending_in(&self, base: u64) -> Option<SegmentPending> {
        let overlaps_unknown = base < self.unknown.end && self.unknown.start < base + self.segment_size;
        (!overlaps_unknown).then(|| self.counts.get(&base).copied().unwrap_or_default())
    }

    /// Segments with pending timers (start offset, count), oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts.iter().filter(|(_, p)| p.count > 0).map(|(&base, p)| (base, p.count))
    }

    /// Drops the counts of segments below `start` (deleted).
    pub fn forget_below(&mut self, start: u64) {
        self.counts = self.counts.split_off(&self.base(start));
    }

    /// The file's bytes: these counts cover every insert below `covered_below`.
    pub fn encode(&self, covered_below: u64) -> Vec<u8> {
        codec::encode(covered_below, &self.unknown, &self.counts)
    }

    /// Decodes a counts file; `None` if it is not a valid one.
    pub fn decode(bytes: &[u8], segment_size: u64) -> Option<(Self, u64)> {
        let decoded = codec::decode(bytes)?;
        let counts = Self { segment_size, counts: decoded.counts, unknown: decoded.unknown };
        Some((counts, decoded.covered_below))
    }

    /// The counts a resumed wheel starts from: the file's, with unknown
    /// segments from its coverage (or the replay start, if lower) up to
    /// `replay_end`: inserts it did not see that the replay will not repeat,
    /// and cancel records, which the replay does not count. No valid file:
    /// every segment below `replay_end` is unknown.
    pub fn load(dir: &Path, segment_size: u64, replay_from: u64, replay_end: u64) -> Self {
        let path = dir.join(SEGMENT_COUNTS_FILE);
        let loaded = std::fs::read(&path).ok().and_then(|bytes| Self::decode(&bytes, segment_size));
        let Some((mut counts, covered_below)) = loaded else {
            tracing::info!(file = %path.display(), "no segment counts; old segments will be scanned before deletion");
            return Self::rebuilt(segment_size, 0..replay_end);
        };
        let gap = covered_below.min(replay_from)..replay_end;
        if !gap.is_empty() {
            counts.unknown = if counts.unknown.is_empty() {
                gap
            } else {
                counts.unknown.start.min(gap.start)..counts.unknown.end.max(gap.end)
            };
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_inserts_and_settlements_and_never_go_below_zero() {
        let mut counts = SegmentCounts::new(1000);
        counts.indexed(1_500, 70, true);
        counts.indexed(1_700, 50, true);
        counts.indexed(2_100, 90, false);
        counts.settled(1_500);
        counts.settled(9_999);
        let count = |counts: &SegmentCounts, base| counts.pending_in(base).map(|p| p.count);
        assert_eq!(count(&counts, 1_000), Some(1));
        assert_eq!(count(&counts, 2_000), Some(1));
        assert_eq!(count(&counts, 3_000), Some(0));
        counts.settled(1_700);
        counts.settled(1_700);
        assert_eq!(
            counts.pending_in(1_000),
            Some(SegmentPending { count: 0, latest_due_ms: 70, latest_near_due_ms: 70 })
        );
        assert_eq!(counts.pending_in(2_000).map(|p| p.latest_near_due_ms), Some(0), "a far timer");
        counts.forget_below(2_000);
        assert_eq!(counts.iter().collect::<Vec<_>>(), [(2_000, 1)]);
    }

    #[test]
    fn settling_many_at_once_counts_as_settling_each() {
        let offsets = [1_100, 1_200, 2_100, 1_300, 2_200, 2_300, 2_400, 3_100];
        let (mut one_by_one, mut at_once) = (SegmentCounts::new(1000), SegmentCounts::new(1000));
        for counts in [&mut one_by_one, &mut at_once] {
            (0..4).for_each(|i| counts.indexed(1_000 + i * 50, 10, true));
            (0..3).for_each(|i| counts.indexed(2_000 + i * 50, 10, true));
            counts.indexed(3_000, 10, true);
        }
        offsets.iter().for_each(|&o| one_by_one.settled(o));
        at_once.settled_all(offsets);
        assert_eq!(at_once.iter().collect::<Vec<_>>(), one_by_one.iter().collect::<Vec<_>>());
        assert_eq!(at_once.iter().collect::<Vec<_>>(), [(1_000, 1)], "the emptied segments are left out");
    }

    #[test]
    fn the_file_round_trips_and_gaps_become_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let mut counts = SegmentCounts::new(1000);
        counts.indexed(1_500, 10, true);
        counts.indexed(5_500, 20, false);
        std::fs::write(dir.path().join(SEGMENT_COUNTS_FILE), counts.encode(4_000)).unwrap();

        let same = SegmentCounts::load(dir.path(), 1000, 3_000, 3_000);
        assert_eq!(same, counts, "a clean close: nothing to replay, nothing unknown");
        let replayed = SegmentCounts::load(dir.path(), 1000, 3_000, 3_500);
        assert_eq!(replayed.pending_in(3_000), None, "the replay counts no cancel record");
        let gap = SegmentCounts::load(dir.path(), 1000, 6_200, 6_200);
        assert_eq!(
            gap.pending_in(1_000),
            Some(SegmentPending { count: 1, latest_due_ms: 10, latest_near_due_ms: 10 })
        );
        assert_eq!(gap.pending_in(3_000), Some(SegmentPending::default()));
        for base in [4_000, 5_000, 6_000] {
            assert_eq!(gap.pending_in(base), None, "inserts in 4000..6200 were not counted");
        }

        let mut bytes = counts.encode(4_000);
        let last = bytes.len() - 6;
        bytes[last] ^= 1;
        std::fs::write(dir.path().join(SEGMENT_COUNTS_FILE), bytes).unwrap();
        let damaged = SegmentCounts::load(dir.path(), 1000, 3_000, 3_000);
        assert_eq!(damaged.pending_in(1_000), None, "a damaged file knows nothing");
        assert_eq!(
            damaged.pending_in(3_000),
            Some(SegmentPending::default()),
            "appended after the open: counted"
        );
    }
}
