use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::format::slot::S_COUNT;
use crate::timer::geometry::L0_SPAN;
use crate::timer::state::cancels::{CancelState, CancelTarget};

const START_MS: u64 = 1_700_000_000_123;
const HOUR: u64 = 3_600_000;
const DAY: u64 = 24 * HOUR;
const YEAR: u64 = 365 * DAY;

fn wheel(dir: &Path, now_ms: u64) -> Wheel {
    Wheel::open(dir, 1 << 12, now_ms, None, Settled::default(), 0).unwrap()
}

fn timer(deliver_at_ms: u64, message_offset: u64) -> Timer {
    Timer { deliver_at_ms, message_offset }
}

#[test]
fn timers_come_out_at_their_millisecond_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    for (i, at) in [START_MS + 2_500, START_MS + 900, START_MS + 2_500, START_MS - 50].iter().enumerate() {
        w.insert(timer(*at, i as u64 * 100 + 32)).unwrap();
    }
    assert_eq!(w.pending(), 4);
    assert_eq!(w.tick(START_MS, 0).unwrap(), [timer(START_MS - 50, 332)], "the past one is due at once");
    assert_eq!(w.tick(START_MS + 899, 0).unwrap(), []);
    assert_eq!(w.tick(START_MS + 900, 0).unwrap(), [timer(START_MS + 900, 132)]);
    assert_eq!(w.tick(START_MS + 2_499, 0).unwrap(), []);
    assert_eq!(
        w.tick(START_MS + 10_000, 0).unwrap(),
        [timer(START_MS + 2_500, 32), timer(START_MS + 2_500, 232)],
        "same millisecond: put (offset) order"
    );
    assert_eq!(w.pending(), 0);
}

#[test]
fn far_timers_cascade_and_arrive_on_time_reindexed_once_per_level() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    let aheads = [HOUR, DAY, 30 * DAY, 10 * YEAR, 100 * YEAR];
    for (i, ahead) in aheads.iter().enumerate() {
        w.insert(timer(START_MS + ahead + 7, 32 + i as u64)).unwrap();
    }
    assert_eq!(w.pending_per_level(), [1, 2, 2], "1 h on level 0, 1 and 30 days on 1, 10 and 100 years on 2");
    for (i, ahead) in aheads.iter().enumerate() {
        let due = START_MS + ahead + 7;
        assert_eq!(w.tick(due - 1, 0).unwrap(), [], "never early: {ahead} ms ahead");
        assert_eq!(w.tick(due, 0).unwrap(), [timer(due, 32 + i as u64)]);
    }
    // 1 d and 30 d descend one level each; 10 and 100 years two each.
    assert_eq!(w.reindexed(), 1 + 1 + 2 + 2);
}

#[test]
fn a_corrupt_slot_is_an_error_naming_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    w.insert(timer(START_MS + 5_000, 32)).unwrap();
    let sec = (START_MS + 5_000) / 1000;
    let at = FILE_HEADER_LEN as u64 + slot_index(0, sec) * SLOT_LEN as u64;
    drop(w);
    let path = dir.path().join("wheel");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at as usize + S_COUNT] ^= 0x04;
    std::fs::write(&path, bytes).unwrap();
    let resume = Resume { tick_second: START_MS / 1000 };
    let err = Wheel::open(dir.path(), 1 << 12, START_MS, Some(resume), Settled::default(), 0).err().unwrap();
    assert!(
        matches!(&err, Error::Corruption { file, offset, kind: CorruptionKind::ChecksumMismatch { .. } }
            if *file == path && *offset == at),
        "{err}"
    );
}

#[test]
fn reopening_resumes_where_it_stopped_without_redelivering() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    w.insert(timer(START_MS + 1_000, 32)).unwrap();
    w.insert(timer(START_MS + 1_500, 64)).unwrap();
    w.insert(timer(START_MS + DAY, 96)).unwrap();
    assert_eq!(w.tick(START_MS + 1_200, 0).unwrap(), [timer(START_MS + 1_000, 32)]);
    let resume = Resume { tick_second: w.tick_second() };
    drop(w);
    let settled = Settled { delivered: HashSet::from([32]), ..Default::default() };
    let mut w = Wheel::open(dir.path(), 1 << 12, START_MS + 1_200, Some(resume), settled, 0).unwrap();
    assert_eq!(w.tick(START_MS + 2_000, 0).unwrap(), [timer(START_MS + 1_500, 64)]);
    assert_eq!(w.tick(START_MS + DAY, 0).unwrap(), [timer(START_MS + DAY, 96)]);
}

#[test]
fn a_late_timer_after_a_restart_never_lands_on_a_chain_whose_files_were_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let second = START_MS / 1000 + 5;
    let mut w = Wheel::open(dir.path(), 16, START_MS, None, Settled::default(), 0).unwrap();
    // 40 timers in one second, all cancelled: its chain spans three files.
    for i in 0..40 {
        w.insert(timer(second * 1000 + 10, 32 + i)).unwrap();
    }
    for i in 0..40 {
        w.cancel(timer(second * 1000 + 10, 32 + i)).unwrap();
    }
    assert!(w.tick(second * 1000 + 500, 0).unwrap().is_empty());
    // A checkpoint vouches that every second before `second + 1` was delivered.
    let tick = second + 1;
    w.reclaim_timer_logs(tick).unwrap();
    drop(w);
    // A restart at that tick may append a late timer to that second's chain.
    let resume = Resume { tick_second: tick };
    let mut w =
        Wheel::open(dir.path(), 16, second * 1000 + 600, Some(resume), Settled::default(), 0).unwrap();
    w.insert(timer(second * 1000 + 20, 9_999)).unwrap();
    // The late timer holds the tick at its second; the older checkpoint's
    // tick is still the later one.
    let resume_again = Resume { tick_second: w.tick_second() };
    assert_eq!(resume_again.tick_second, second);
    w.reclaim_timer_logs(tick).unwrap();
    drop(w);
    // Closed before it fired: the next open reads that chain whole.
    let mut w =
        Wheel::open(dir.path(), 16, second * 1000 + 600, Some(resume_again), Settled::default(), 0).unwrap();
    assert!(w.chains_intact());
    assert_eq!(w.tick(second * 1000 + 700, 0).unwrap(), [timer(second * 1000 + 20, 9_999)]);
}

#[test]
fn a_slot_reused_after_the_checkpoint_keeps_its_old_chain_readable() {
    let dir = tempfile::tempdir().unwrap();
    let second = START_MS / 1000 + 5;
    let mut w = Wheel::open(dir.path(), 16, START_MS, None, Settled::default(), 0).unwrap();
    for i in 0..40 {
        w.insert(timer(second * 1000 + 10, 32 + i)).unwrap();
    }
    assert_eq!(w.tick(second * 1000 + 500, 0).unwrap().len(), 40);
    // What a power loss may leave: the wheel as the checkpoint saw it.
    let before = [
        ("wheel", std::fs::read(dir.path().join("wheel")).unwrap()),
        ("tails", std::fs::read(dir.path().join("tails")).unwrap()),
    ];
    // The same level-0 slot, one turn of the wheel later, then more entries.
    let reuse = second + LEVELS[0].slots;
    w.insert(timer(reuse * 1000, 9_000)).unwrap();
    for i in 0..20 {
        w.insert(timer((second + 100) * 1000, 9_001 + i)).unwrap();
    }
    // The older checkpoint still stands at `second`.
    w.reclaim_timer_logs(second).unwrap();
    drop(w);
    for (name, bytes) in before {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let resume = Resume { tick_second: second };
    let mut w =
        Wheel::open(dir.path(), 16, second * 1000 + 600, Some(resume), Settled::default(), 0).unwrap();
    assert!(w.chains_intact());
    assert_eq!(w.tick(second * 1000 + 600, 0).unwrap().len(), 40, "the old chain is read whole");
}

/// The plain pass over every level-0 slot and loaded timer that
/// `pending_by_due_time` shortcuts: its oracle.
fn pending_by_due_time_scanning_everything(w: &Wheel, bounds_ms: &[u64]) -> Vec<u64> {
    let mut net = vec![0i64; bounds_ms.len() + 1];
    let bucket = |at_ms: u64| bounds_ms.iter().position(|&b| at_ms < b).unwrap_or(bounds_ms.len());
    for t in w.loaded.timers().filter(|t| !w.cancels.is_cancelled_loaded(t.message_offset)) {
        net[bucket(t.deliver_at_ms)] += 1;
    }
    if let Some(p) = &w.prefetch {
        net[bucket(p.second() * 1000)] += i64::from(p.held()) - 2 * i64::from(p.cancel_entries());
    }
    let first = w.loaded_through + 1;
    for sec in first..first + L0_SPAN {
        let slot = w.slot_counts.get(slot_index(0, sec));
        let prefetching = w.prefetch.as_ref().is_some_and(|p| p.second() == sec);
        if slot.count > 0 && slot.window == sec && !prefetching {
            net[bucket(sec * 1000)] += i64::from(slot.count) - 2 * i64::from(slot.cancels);
        }
    }
    // Levels 1 and 2 are read whole by both.
    w.count_coarse_by_due_time(bucket, &mut net);
    super::gauges::carry_cancels_back(net)
}

/// What [`Wheel::pending_between`] lists, as (deliver time, offset).
fn listed(w: &Wheel, window: std::ops::Range<u64>, limit: usize) -> Vec<(u64, u64)> {
    let entries = w.pending_between(window, limit, std::iter::empty()).unwrap();
    entries.iter().map(|e| (e.timer.deliver_at_ms, e.timer.message_offset)).collect()
}

#[derive(Debug, Clone)]
enum Op {
    /// Put a timer this many ms from now (may be negative: in the past).
    Put(i64),
    /// Move the clock forward.
    Advance(u64),
    /// Cancel the n-th timer put so far (modulo how many there are).
    Cancel(usize),
    /// Reschedule the n-th timer put so far to this many ms from now.
    Reschedule(usize, i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (-5_000i64..5_000).prop_map(Op::Put),
        3 => (0i64..(2 * DAY) as i64).prop_map(Op::Put),
        1 => (0i64..(20 * YEAR) as i64).prop_map(Op::Put),
        1 => (0i64..(150 * YEAR) as i64).prop_map(Op::Put),
        3 => (0u64..3_000).prop_map(Op::Advance),
        1 => (0u64..(3 * DAY)).prop_map(Op::Advance),
        1 => (0u64..(40 * YEAR)).prop_map(Op::Advance),
        2 => any::<usize>().prop_map(Op::Cancel),
        2 => (any::<usize>(), -5_000i64..5_000).prop_map(|(n, ahead)| Op::Reschedule(n, ahead)),
        1 => (any::<usize>(), 0i64..(2 * DAY) as i64).prop_map(|(n, ahead)| Op::Reschedule(n, ahead)),
        1 => (any::<usize>(), 0i64..(150 * YEAR) as i64).prop_map(|(n, ahead)| Op::Reschedule(n, ahead)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The wheel hands out exactly what a `BTreeMap` of deliver times says,
    /// in its order, never early; a reschedule (as the ticking thread makes
    /// it: the old timer out as by a cancel, the ledger entry, the record's
    /// timer in) moves a timer in the model.
    #[test]
    fn the_wheel_matches_a_btreemap_model(
        ops in proptest::collection::vec(op(), 1..80),
        short in (-5_000i64..(2 * DAY) as i64, 1u64..HOUR, 1usize..8),
        long in (-5_000i64..(150 * YEAR) as i64, 1u64..(30 * YEAR), 1usize..8),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut now = START_MS;
        let mut w = wheel(dir.path(), now);
        let mut model: BTreeMap<(u64, u64), ()> = BTreeMap::new();
        let mut put: Vec<Timer> = Vec::new();
        let mut cancelled = std::collections::HashSet::new();
        let mut next_offset = 32;
        for op in ops {
            match op {
                Op::Put(ahead) => {
                    let at = now.saturating_add_signed(ahead).max(1);
                    w.insert(timer(at, next_offset)).unwrap();
                    model.insert((at, next_offset), ());
                    put.push(timer(at, next_offset));
                    next_offset += 64;
                }
                Op::Advance(by) => {
                    now += by;
                    let got = w.tick(now, 0).unwrap();
                    let still_pending = model.split_off(&(now + 1, 0));
                    let want: Vec<Timer> = model.keys().map(|&(at, off)| timer(at, off)).collect();
                    model = still_pending;
                    for t in &got {
                        prop_assert!(t.deliver_at_ms <= now, "early: {:?} at {}", t, now);
                    }
                    prop_assert_eq!(got, want);
                    prop_assert_eq!(w.pending(), model.len() as u64);
                }
                Op::Reschedule(n, ahead) if !put.is_empty() => {
                    let handle = put[n % put.len()];
                    let t = w.current_timer(handle).unwrap();
                    let at = now.saturating_add_signed(ahead).max(1);
                    let record = next_offset;
                    next_offset += 64;
                    let was_pending = model.remove(&(t.deliver_at_ms, t.message_offset)).is_some();
                    let target = w.locate_for_cancel(&t).unwrap();
                    match target {
                        CancelTarget::AlreadyDelivered | CancelTarget::AlreadyCancelled => {
                            prop_assert!(!was_pending, "{:?} was pending: {:?}", t, target);
                        }
                        target => {
                            prop_assert!(was_pending, "{:?} was not pending: {:?}", t, target);
                            w.apply_cancel(t, target).unwrap();
                            let entry = crate::timer::ledger::LedgerEntry::reschedule(handle.message_offset, at, record);
                            w.record_in_ledger(entry).unwrap();
                            w.insert(timer(at, record)).unwrap();
                            model.insert((at, record), ());
                        }
                    }
                }
                Op::Reschedule(..) => {}
                Op::Cancel(n) if !put.is_empty() => {
                    let t = w.current_timer(put[n % put.len()]).unwrap();
                    let outcome = w.cancel(t).unwrap();
                    let was_pending = model.remove(&(t.deliver_at_ms, t.message_offset)).is_some();
                    if was_pending {
                        // As the ticking thread does once the cancel record is written.
                        w.record_cancel(t, next_offset).unwrap();
                        next_offset += 64;
                    }
                    if was_pending || cancelled.contains(&t) {
                        prop_assert_eq!(outcome, CancelState::Cancelled, "{:?} was pending", t);
                        cancelled.insert(t);
                    } else {
                        prop_assert_eq!(outcome, CancelState::AlreadyDelivered, "{:?} was delivered", t);
                    }
                }
                Op::Cancel(_) => {}
            }
            for horizons in [[5_000, 60_000, 300_000, HOUR, DAY], [500, 1_000, 2_000, 30 * DAY, 20 * YEAR]] {
                let bounds = horizons.map(|ahead| now + ahead);
                let counts = w.pending_by_due_time(&bounds).unwrap();
                prop_assert_eq!(&counts, &pending_by_due_time_scanning_everything(&w, &bounds));
                prop_assert_eq!(counts.iter().sum::<u64>(), w.pending(), "the intervals add up to pending");
            }
            // Within the hour every count is exact (level 0), cancelled timers
            // left out, for bounds on whole seconds (as the stats use).
            let bounds = [5_000, 60_000, 300_000, HOUR, DAY].map(|ahead| (now + ahead).div_ceil(1000) * 1000);
            let mut within_the_hour = [0u64; 4];
            for &(at, _) in model.keys() {
                if let Some(i) = bounds[..4].iter().position(|&b| at < b) {
                    within_the_hour[i] += 1;
                }
            }
            prop_assert_eq!(&w.pending_by_due_time(&bounds).unwrap()[..4], &within_the_hour[..]);
            // The window query lists what the model holds, in its order.
            for (from, len, limit) in [short, long] {
                let from = now.saturating_add_signed(from);
                let want: Vec<(u64, u64)> = model
                    .keys()
                    .filter(|(at, _)| (from..from + len).contains(at))
                    .take(limit)
                    .copied()
                    .collect();
                prop_assert_eq!(listed(&w, from..from + len, limit), want, "{}..+{} limit {}", from, len, limit);
            }
        }
        prop_assert_eq!(listed(&w, 0..u64::MAX, usize::MAX), model.keys().copied().collect::<Vec<_>>());
    }
}

#[test]
fn a_late_timer_not_yet_handed_out_is_found_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    assert_eq!(w.tick(START_MS, 0).unwrap(), []);
    // Due long ago, indexed after its second was loaded: it goes to the newest loaded slot.
    w.insert(timer(START_MS - 3_600_000, 32)).unwrap();
    let resume = Resume { tick_second: w.tick_second() };
    drop(w);
    let mut w = Wheel::open(dir.path(), 1 << 12, START_MS, Some(resume), Settled::default(), 0).unwrap();
    assert_eq!(w.tick(START_MS, 0).unwrap(), [timer(START_MS - 3_600_000, 32)]);
}

#[test]
fn a_big_second_is_prefetched_over_several_ticks_and_delivered_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    let second = START_MS / 1000 + 5;
    let n = 3 * PREFETCH_BUDGET as u64 + 7;
    for i in 0..n {
        w.insert(timer(second * 1000 + i % 1000, 32 + i)).unwrap();
    }
    // Well before the second: each tick reads at most one budget of entries.
    let mut ticks = 0;
    let mut now = (second - 1) * 1000;
    while w.prefetch.is_some() || w.loaded_through < second {
        assert_eq!(w.tick(now, 0).unwrap(), []);
        now += 1;
        ticks += 1;
    }
    assert!(ticks >= 4, "prefetch was spread over {ticks} ticks");
    let got = w.tick(second * 1000 + 999, 0).unwrap();
    assert_eq!(got.len() as u64, n);
    assert!(got.windows(2).all(|p| p[0] <= p[1]), "in (deliver time, offset) order");
}

#[test]
fn pending_by_due_time_counts_every_horizon_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    // Horizons: 5 s, 1 min, 1 h, 1 day, beyond.
    let bounds = [5_000, 60_000, HOUR, DAY].map(|ahead| START_MS + ahead);
    let aheads = [2_000, 3_000, 30_000, 20 * 60_000, 5 * HOUR, 30 * DAY, 10 * YEAR];
    for (i, ahead) in aheads.iter().enumerate() {
        w.insert(timer(START_MS + ahead, 32 + i as u64 * 64)).unwrap();
    }
    let want = vec![2, 1, 1, 1, 2];
    assert_eq!(w.pending_by_due_time(&bounds).unwrap(), want);
    let resume = Resume { tick_second: w.tick_second() };
    drop(w);
    let again = Wheel::open(dir.path(), 1 << 12, START_MS, Some(resume), Settled::default(), 0).unwrap();
    assert_eq!(again.pending_by_due_time(&bounds).unwrap(), want, "read back from the wheel file");
}

/// Cancelled timers are remembered in memory only while they are ahead:
/// once their second is behind, the cancel ledger answers a repeated cancel.
#[test]
fn cancelled_timers_are_forgotten_from_memory_once_behind_and_the_ledger_answers() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    let aheads = [500, 3_000, 2 * DAY, 40 * DAY];
    let timers: Vec<Timer> = aheads.iter().zip(0..).map(|(a, i)| timer(START_MS + a, 32 + 64 * i)).collect();
    for t in &timers {
        w.insert(*t).unwrap();
    }
    w.tick(START_MS, 0).unwrap();
    let mut cancel_offset = 100_000;
    for t in &timers {
        assert_eq!(w.cancel(*t).unwrap(), CancelState::Cancelled);
        w.record_cancel(*t, cancel_offset).unwrap();
        cancel_offset += 64;
    }
    let mut now = START_MS;
    while now < START_MS + 41 * DAY {
        now += 3_600_000;
        assert_eq!(w.tick(now, 0).unwrap(), [], "nothing cancelled fires");
    }
    assert!(w.cancels.holds_nothing(), "forgotten: {:?}", w.cancels.held());
    for t in &timers {
        assert_eq!(w.cancel(*t).unwrap(), CancelState::Cancelled, "{t:?}: the ledger still knows");
    }
    let never_cancelled = timer(START_MS + 1_000, 32 + 64 * 10);
    assert_eq!(w.cancel(never_cancelled).unwrap(), CancelState::AlreadyDelivered);
}

/// Reopens the wheel in `dir` as a restart would, at `resume`, with the
/// replay of `replay` to come and the checkpoint's timer-log ends `ends`.
fn restart(dir: &Path, now_ms: u64, resume: Resume, replay: std::ops::Range<u64>, ends: [u64; 2]) -> Wheel {
    let mut w = Wheel::open(dir, 1 << 12, now_ms, Some(resume), Settled::default(), 0).unwrap();
    w.set_replay_range(replay);
    assert!(w.note_preindexed(ends, u64::MAX).unwrap());
    w
}

/// Ticks from `from` to `to` (both included) in steps of `step` ms, collecting what comes out.
fn tick_through(w: &mut Wheel, from: u64, to: u64, step: u64) -> Vec<Timer> {
    let times = (from..to).step_by(step as usize).chain([to]);
    times.flat_map(|now| w.tick(now, 0).unwrap()).collect()
}

/// A late timer sits in the slot of a later second, where a cancel does not
/// look: after a restart the replay indexes it again, a cancel lands with
/// that copy, and neither copy fires.
#[test]
fn a_late_timer_is_indexed_again_after_a_restart_and_a_cancel_reaches_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    assert_eq!(w.tick(START_MS, 0).unwrap(), []);
    let ends = w.timer_log_ends();
    let second = START_MS / 1000;
    let late = timer(second * 1000 + 900, 32);
    assert!(w.insert(late).unwrap(), "indexed after its second was loaded");
    let resume = Resume { tick_second: w.tick_second() };
    drop(w);

    let mut w = restart(dir.path(), START_MS, resume, 32..64, ends);
    assert!(w.insert(late).unwrap(), "the replay sends it again");
    assert_eq!(w.cancel(late).unwrap(), CancelState::Cancelled);
    assert_eq!(tick_through(&mut w, START_MS, START_MS + 10_000, 50), []);
}

/// An entry written after the checkpoint in a far slot, of a message below
/// the replay (a cascade from level 2 made it): the replay does not send it,
/// and the far slot's own cascade, during the catch-up after three days of
/// downtime, must not take that entry for its copy.
#[test]
fn a_far_timer_indexed_after_the_checkpoint_and_not_replayed_still_fires() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    let ends = w.timer_log_ends();
    let far = timer(START_MS + 2 * DAY, 32);
    w.insert(far).unwrap();
    let resume = Resume { tick_second: w.tick_second() };
    drop(w);

    let back = START_MS + 3 * DAY;
    let mut w = restart(dir.path(), back, resume, 1_000..2_000, ends);
    assert_eq!(w.pending(), 1);
    assert_eq!(tick_through(&mut w, back, back + 1_000, 100), [far]);
}

/// A timer indexed before a restart and sent again by the replay is held
/// once (and counted once), and fires once.
#[test]
fn a_replayed_timer_found_in_the_wheel_is_held_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    let ends = w.timer_log_ends();
    let timers =
        [timer(START_MS + 5_000, 32), timer(START_MS + 2 * DAY, 96), timer(START_MS + 20 * YEAR, 160)];
    for t in timers {
        w.insert(t).unwrap();
    }
    let resume = Resume { tick_second: w.tick_second() };
    drop(w);

    let mut w = restart(dir.path(), START_MS, resume, 32..200, ends);
    for t in timers {
        assert!(w.insert(t).unwrap());
    }
    assert_eq!(w.pending(), 3, "each held once");
    assert_eq!(tick_through(&mut w, START_MS, START_MS + 6_000, 100), [timers[0]]);
    assert_eq!(tick_through(&mut w, START_MS + 6_000, START_MS + 2 * DAY + 1_000, 60_000), [timers[1]]);
}

/// A copy the replay made in another second than the one a cancel entry
/// removes (a late copy) is dropped too.
#[test]
fn a_cancel_applied_at_loading_also_stops_a_replayed_copy_in_a_later_second() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    assert_eq!(w.tick(START_MS, 0).unwrap(), []);
    let second = START_MS / 1000;
    let late = timer(second * 1000 + 900, 32);
    w.insert(late).unwrap();
    drop(w);

    // No usable ends (an older checkpoint): nothing is skipped. A checkpoint
    // from before the late timer's second was loaded: the replay's copy goes
    // to the slot of its own second, the first copy waits in the next one.
    let resume = Resume { tick_second: second };
    let mut w = restart(dir.path(), START_MS, resume, 32..64, [u64::MAX; 2]);
    assert!(w.insert(late).unwrap());
    assert_eq!(w.locate_for_cancel(&late).unwrap(), CancelTarget::Slot);
    assert_eq!(w.cancel(late).unwrap(), CancelState::Cancelled);
    assert_eq!(tick_through(&mut w, START_MS, START_MS + 10_000, 50), []);
}

/// A power loss can lose the delivery records of a second the wheel has
/// handed out, and a restart then resumes at the checkpoint on disk, before
/// that second: its slot must still hold its timers, so the slot is not
/// reused for a second 18 hours later until the checkpoints on disk are past it.
#[test]
fn a_slot_is_reused_only_behind_the_durable_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    let s0 = START_MS / 1000 + 2;
    let due: Vec<Timer> = (0..10).map(|i| timer(s0 * 1000 + i, 32 + 64 * i)).collect();
    for t in &due {
        w.insert(*t).unwrap();
    }
    // The checkpoints on disk still resume at the wheel's first second.
    w.set_durable_tick(START_MS / 1000);
    assert_eq!(tick_through(&mut w, START_MS, s0 * 1000 + 5_000, 100), due);
    // A timer due in the second that maps to the same level-0 slot, 18 h later.
    let later = timer((s0 + L0_SPAN) * 1000 + 7, 32 + 64 * 10);
    w.insert(later).unwrap();
    drop(w);
    // Power loss: the deliveries were not durable; restart at the checkpoint's tick.
    let resume = Resume { tick_second: START_MS / 1000 };
    let mut w =
        Wheel::open(dir.path(), 1 << 12, s0 * 1000 + 5_000, Some(resume), Settled::default(), 0).unwrap();
    assert_eq!(tick_through(&mut w, s0 * 1000 + 5_000, s0 * 1000 + 6_000, 100), due, "fired again");
    assert_eq!(w.pending(), 1, "the later timer is still pending");
}

/// The census reads every live chain: it agrees with the slot counts in a
/// wheel that ran without a restart, and after one it leaves out a timer
/// that fired before it but still sits in a slot not yet loaded.
#[test]
fn the_census_counts_each_pending_timer_once_also_where_slot_counts_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = wheel(dir.path(), START_MS);
    let bounds = [5_000, 60_000, HOUR, DAY].map(|ahead| START_MS + ahead);
    let aheads = [2_000, 3_000, 30_000, 5 * HOUR, 30 * DAY, 10 * YEAR];
    let timers: Vec<Timer> = aheads.iter().zip(0..).map(|(a, i)| timer(START_MS + a, 32 + 64 * i)).collect();
    for t in &timers {
        w.insert(*t).unwrap();
    }
    assert_eq!(w.tick(START_MS, 0).unwrap(), []);
    for (t, cancel_offset) in [(timers[1], 100_000), (timers[5], 100_064)] {
        assert_eq!(w.cancel(t).unwrap(), CancelState::Cancelled);
        w.record_cancel(t, cancel_offset).unwrap();
    }
    let census = w.census(&bounds).unwrap();
    assert_eq!(census.pending, w.pending());
    assert_eq!(census.per_level, w.pending_per_level());
    assert_eq!(census.by_due_time, [1, 1, 0, 1, 1], "due in 2 s, 30 s, 5 h, 30 days");
    assert_eq!(census.by_due_time, w.pending_by_due_time(&bounds).unwrap());

    let resume = Resume { tick_second: w.tick_second() };
    drop(w);
    let fired = Settled { delivered: [timers[2].message_offset].into(), ..Settled::default() };
    let again = Wheel::open(dir.path(), 1 << 12, START_MS, Some(resume), fired, 0).unwrap();
    assert_eq!(again.pending(), 4, "the slot counts still hold the timer that fired");
    let census = again.census(&bounds).unwrap();
    assert_eq!((census.pending, census.by_due_time), (3, vec![1, 0, 0, 1, 1]));
}
