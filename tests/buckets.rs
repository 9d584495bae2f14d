//! The bucket scheduler (the RocketMQ 4.x baseline) through the public API,
//! with a manual clock: the same calls as the wheel, its own guarantees.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use delaywheel::{CancelOutcome, Config, Error, ManualClock, Message, SCHEDULE_TOPIC, Scheduler, Store};
use proptest::prelude::*;

fn bucket_config(dir: &std::path::Path, clock: &ManualClock) -> Config {
    small_config(dir).with_clock(clock.clone()).with_scheduler(Scheduler::Buckets)
}

fn buckets_at(dir: &std::path::Path, clock: &ManualClock) -> Store {
    Store::open(bucket_config(dir, clock)).unwrap()
}

#[test]
fn levels_arrive_in_their_topic_when_due_and_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = buckets_at(dir.path(), &clock);
    let receipt = store.put(Message::new("T", "level-2").delay_level(2).key("k").tags("t")).unwrap();
    assert_eq!(receipt.deliver_at_ms(), Some(T0 + 5_000));
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(T0 + 4_999);
    assert!(consumer.poll(1, Duration::from_millis(400)).unwrap().is_empty(), "not early");
    clock.set_ms(T0 + 5_000);
    let got = consumer.poll(1, Duration::from_secs(5)).unwrap();
    assert_eq!(bodies(&got), ["level-2"]);
    let m = &got[0];
    assert_eq!((m.deliver_at_ms(), m.delay_level()), (Some(T0 + 5_000), Some(2)));
    assert_eq!((m.key(), m.tags()), (Some("k"), Some("t")));
    assert!(m.delivered_at_ms() >= T0 + 5_000);
    assert!(m.log_offset() > receipt.offset(), "the buckets deliver a copy written again");
    let stats = store.stats();
    assert_eq!((stats.delivered, stats.early, stats.pending), (1, 0, 0));
}

#[test]
fn arbitrary_times_round_up_to_the_next_level_and_beyond_the_last_arrive_early() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = buckets_at(dir.path(), &clock);
    store.put(Message::new("T", "2s").delay(Duration::from_secs(2))).unwrap();
    store.put(Message::new("T", "3h").delay(Duration::from_secs(3 * 3600))).unwrap();
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(T0 + 4_999);
    assert!(consumer.poll(1, Duration::from_millis(400)).unwrap().is_empty(), "2 s waits for the 5 s level");
    clock.set_ms(T0 + 5_000);
    let got = consumer.poll(1, Duration::from_secs(5)).unwrap();
    assert_eq!(bodies(&got), ["2s"]);
    assert_eq!(got[0].deliver_at_ms(), Some(T0 + 2_000), "consumers see the time asked for");
    assert_eq!(got[0].delivered_at_ms(), T0 + 5_000, "3 s late: 2 s asked, the 5 s level");
    assert_eq!(got[0].delay_level(), None);

    clock.set_ms(T0 + 2 * 3_600_000);
    let got = consumer.poll(1, Duration::from_secs(5)).unwrap();
    assert_eq!(bodies(&got), ["3h"], "capped at the 2 h level");
    assert!(got[0].delivered_at_ms() < got[0].deliver_at_ms().unwrap(), "one hour early");
    let stats = store.stats();
    assert_eq!((stats.delivered, stats.early), (2, 1));
    // The histogram keeps three significant digits.
    assert!((3_000..=3_003).contains(&stats.lateness_ms.max), "{:?}", stats.lateness_ms);
}

#[test]
fn cancel_before_due_after_delivery_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = buckets_at(dir.path(), &clock);
    let first = store.put(Message::new("T", "first").delay_level(1)).unwrap().handle().unwrap();
    let gone = store.put(Message::new("T", "gone").delay_level(3)).unwrap().handle().unwrap();
    let later = store.put(Message::new("T", "later").delay_level(3)).unwrap().handle().unwrap();
    assert_eq!(store.cancel(gone).unwrap(), CancelOutcome::Cancelled);
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(T0 + 1_000);
    assert_eq!(bodies(&consumer.poll(1, Duration::from_secs(5)).unwrap()), ["first"]);
    assert_eq!(store.cancel(first).unwrap(), CancelOutcome::AlreadyDelivered);
    drop(consumer);
    store.close().unwrap();

    let store = buckets_at(dir.path(), &clock);
    assert_eq!(store.cancel(gone).unwrap(), CancelOutcome::Cancelled, "still cancelled after the restart");
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(T0 + 10_000);
    let got = bodies(&drain_idle(&mut consumer, 3, Duration::from_millis(500)));
    assert_eq!(got, ["first", "later"], "the cancelled one never arrives; nothing twice after a clean close");
    assert_eq!(store.cancel(later).unwrap(), CancelOutcome::AlreadyDelivered);
}

#[test]
fn after_a_crash_the_buckets_deliver_again_what_came_after_the_last_persisted_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let config = |d: &std::path::Path| {
        bucket_config(d, &clock)
            .with_flush_interval(Duration::from_secs(3600))
            .with_schedule_offsets_interval(Duration::from_secs(3600))
    };
    let store = Store::open(config(dir.path())).unwrap();
    for i in 0..10 {
        store.put(Message::new("T", format!("m{i}")).queue_id(0).delay_level(1)).unwrap();
    }
    clock.set_ms(T0 + 1_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(drain(&mut consumer, 10).len(), 10);
    let crashed = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), crashed.path());
    drop(consumer);
    store.close().unwrap();

    // The clean close persisted the offsets: nothing again.
    let store = Store::open(config(dir.path())).unwrap();
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(drain_idle(&mut consumer, 11, Duration::from_millis(500)).len(), 10);
    drop((consumer, store));

    // The crash lost the offsets of the whole window: all ten again (at least once).
    let store = Store::open(config(crashed.path())).unwrap();
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = bodies(&drain_idle(&mut consumer, 21, Duration::from_millis(700)));
    let mut counts = BTreeMap::<String, usize>::new();
    got.iter().for_each(|b| *counts.entry(b.clone()).or_default() += 1);
    assert_eq!(counts.len(), 10, "none lost");
    assert!(counts.values().all(|&n| n == 2), "each delivered twice: {counts:?}");
}

#[test]
fn the_schedule_topic_is_reserved_and_unknown_levels_are_errors_in_both() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = buckets_at(dir.path(), &clock);
    let err = store.put(Message::new(SCHEDULE_TOPIC, "x")).unwrap_err();
    assert!(err.to_string().contains("reserved"), "{err}");
    for scheduler in [Scheduler::Wheel, Scheduler::Buckets] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(small_config(dir.path()).with_scheduler(scheduler)).unwrap();
        let err = store.put(Message::new("T", "x").delay_level(19)).unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }), "{scheduler:?}: {err}");
    }
}

/// Puts `(gap before the put in ms, level)` pairs on a store with `scheduler`,
/// runs the clock past the longest level, and returns body → (deliver-at, level).
fn deliver_all(scheduler: Scheduler, workload: &[(u64, u16)]) -> BTreeMap<String, (u64, Option<u16>)> {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(
        small_config(dir.path())
            .with_clock(clock.clone())
            .with_scheduler(scheduler)
            .with_delay_levels("1s 5s 1m 1h"),
    )
    .unwrap();
    for (i, &(gap, level)) in workload.iter().enumerate() {
        clock.advance_ms(gap);
        store.put(Message::new("T", format!("m{i}")).queue_id(0).delay_level(level)).unwrap();
    }
    clock.advance_ms(2 * 3_600_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = drain_idle(&mut consumer, workload.len() + 1, Duration::from_millis(500));
    got.iter()
        .map(|m| {
            assert!(m.delivered_at_ms() >= m.deliver_at_ms().unwrap(), "{scheduler:?}: early");
            (String::from_utf8(m.body().to_vec()).unwrap(), (m.deliver_at_ms().unwrap(), m.delay_level()))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn both_schedulers_deliver_the_same_set_at_legacy_levels(
        workload in prop::collection::vec((0u64..3_000, 1u16..=4), 1..30),
    ) {
        let wheel = deliver_all(Scheduler::Wheel, &workload);
        let buckets = deliver_all(Scheduler::Buckets, &workload);
        prop_assert_eq!(wheel.len(), workload.len());
        prop_assert_eq!(wheel, buckets);
    }
}

#[test]
fn a_store_refuses_the_other_scheduler_than_the_one_it_was_written_with() {
    for (written, other) in [(Scheduler::Wheel, Scheduler::Buckets), (Scheduler::Buckets, Scheduler::Wheel)] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(T0);
        let config = |s| small_config(dir.path()).with_clock(clock.clone()).with_scheduler(s);
        let store = Store::open(config(written)).unwrap();
        store.put(Message::new("T", "later").delay_level(3)).unwrap();
        store.close().unwrap();
        let err = Store::open(config(other)).err().expect("the other scheduler is refused");
        assert!(matches!(err, Error::Invalid { .. }), "{err}");
        assert!(err.to_string().contains(&format!("written with Scheduler::{written:?}")), "{err}");
        let store = Store::open(config(written)).unwrap();
        assert_eq!(store.stats().delivered, 0);
        let mut consumer = store.consumer("T", 0).unwrap();
        clock.set_ms(T0 + 10_000);
        assert_eq!(bodies(&consumer.poll(1, Duration::from_secs(5)).unwrap()), ["later"], "{written:?}");
    }
}
