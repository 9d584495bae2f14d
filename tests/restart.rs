//! Reopening: after a clean close, after a simulated crash, with indexes gone.

mod common;

use std::time::Duration;

use common::*;
use delaywheel::Store;

#[test]
fn segments_roll_over_and_everything_survives_a_clean_close() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    put_numbered(&store, "T", 0..3000);
    store.close().unwrap();
    let segments = std::fs::read_dir(dir.path().join("commitlog")).unwrap().count();
    assert!(segments >= 3, "3000 records should fill several 64 KiB segments, got {segments}");

    let store = Store::open(small_config(dir.path())).unwrap();
    assert_eq!(store.recovery_report().scanned_bytes, 0, "a clean close leaves nothing to validate");
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&drain(&mut consumer, 3000)), numbered(0..3000));
    put_numbered(&store, "T", 3000..3010);
    assert_eq!(bodies(&drain(&mut consumer, 10)), numbered(3000..3010));
}

#[test]
fn committed_consumer_offsets_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    put_numbered(&store, "T", 0..10);
    let mut consumer = store.consumer_in_group("billing", "T", 0).unwrap();
    assert_eq!(drain(&mut consumer, 4).len(), 4);
    consumer.commit();
    drop(consumer);
    store.close().unwrap();

    let store = Store::open(small_config(dir.path())).unwrap();
    let mut billing = store.consumer_in_group("billing", "T", 0).unwrap();
    assert_eq!(billing.position(), 4);
    assert_eq!(bodies(&drain(&mut billing, 6)), numbered(4..10));
    let other = store.consumer_in_group("audit", "T", 0).unwrap();
    assert_eq!(other.position(), 0, "groups keep their own offsets");
}

#[test]
fn a_crash_loses_nothing_that_was_put() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let store = Store::open(no_periodic_flush(dir.path())).unwrap();
    put_numbered(&store, "T", 0..1500);
    // Let the dispatcher index part of it, so both the log and the queues need replay.
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(drain(&mut consumer, 700).len(), 700);
    put_numbered(&store, "T", 1500..2000);
    crash_copy(dir.path(), crashed.path());
    drop(consumer);
    drop(store);

    let store = Store::open(small_config(crashed.path())).unwrap();
    let report = store.recovery_report().clone();
    assert!(report.scanned_bytes > 0, "the records after the checkpoint were validated");
    assert_eq!(report.torn_at, None);
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&drain(&mut consumer, 2000)), numbered(0..2000), "each message exactly once");
    assert!(consumer.poll(1, Duration::from_millis(100)).unwrap().is_empty());
}

#[test]
fn consume_queues_are_rebuilt_when_missing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    put_numbered(&store, "T", 0..500);
    put_numbered(&store, "U", 0..20);
    store.close().unwrap();
    std::fs::remove_dir_all(dir.path().join("consumequeue")).unwrap();

    let store = Store::open(small_config(dir.path())).unwrap();
    let mut t = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&drain(&mut t, 500)), numbered(0..500));
    let mut u = store.consumer("U", 0).unwrap();
    assert_eq!(bodies(&drain(&mut u, 20)), numbered(0..20));
}

#[test]
fn a_second_open_of_the_same_directory_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    let err = Store::open(small_config(dir.path())).err().unwrap();
    assert!(matches!(err, delaywheel::Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("is locked by another process"));
    store.close().unwrap();
    Store::open(small_config(dir.path())).unwrap().close().unwrap();
}

/// The lock is on the directory itself: deleting `LOCK` under a running
/// store does not let a second open in (both used to append).
#[test]
fn deleting_the_lock_file_does_not_unlock_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    std::fs::remove_file(dir.path().join("LOCK")).unwrap();
    let err = Store::open(small_config(dir.path())).err().unwrap();
    assert!(matches!(err, delaywheel::Error::Locked { .. }), "{err}");
    store.close().unwrap();
    Store::open(small_config(dir.path())).unwrap().close().unwrap();
}

/// A power loss can leave the wheel file newer than the timer log it chains
/// into. Simulated here by zeroing the timer log: reopening rebuilds every
/// index from the commit log, and each timer still fires once.
#[test]
fn a_wheel_whose_chains_point_past_the_timer_log_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let clock = delaywheel::ManualClock::new(1_700_000_000_000);
    let config = || small_config(dir.path()).with_clock(clock.clone());
    let store = Store::open(config()).unwrap();
    for i in 0..300u64 {
        let at = 1_700_000_000_000 + 1_000 + i * 100;
        store.put(delaywheel::Message::new("T", format!("m{i}")).deliver_at_ms(at)).unwrap();
    }
    clock.set_ms(1_700_000_000_000 + 1_000 + 99 * 100);
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&drain_idle(&mut consumer, 100, Duration::from_millis(500))), numbered(0..100));
    consumer.commit();
    drop(consumer);
    store.close().unwrap();

    for file in std::fs::read_dir(dir.path().join("timer").join("timerlog")).unwrap() {
        let path = file.unwrap().path();
        let len = std::fs::metadata(&path).unwrap().len();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[32..].fill(0);
        std::fs::write(&path, &bytes[..len as usize]).unwrap();
    }

    let store = Store::open(config()).unwrap();
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(1_700_000_000_000 + 60_000);
    let got = bodies(&drain_idle(&mut consumer, 300, Duration::from_millis(500)));
    assert_eq!(got, numbered(100..300), "the delivered ones are not delivered again, the rest fire once");
}

/// Waits until the dispatcher has indexed everything and the wheel's gauges
/// were refreshed twice since, then returns the pending count.
fn pending_once_indexed(store: &Store) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.stats().dispatch_lag_bytes > 0 {
        assert!(std::time::Instant::now() < deadline, "the dispatcher never caught up");
        std::thread::sleep(Duration::from_millis(10));
    }
    let refreshes = store.stats().refreshes;
    while store.stats().refreshes < refreshes + 2 {
        assert!(std::time::Instant::now() < deadline, "the gauges were never refreshed");
        std::thread::sleep(Duration::from_millis(50));
    }
    store.stats().pending
}

/// A crash leaves the timers indexed since the last checkpoint in the wheel,
/// and the replay sends them again: each is held (and counted) once, on every
/// level, and fires once.
#[test]
fn after_a_crash_each_pending_timer_is_held_once() {
    const T0: u64 = 1_700_000_000_000;
    const DAY: u64 = 86_400_000;
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let clock = delaywheel::ManualClock::new(T0);
    let config = |path: &std::path::Path| no_periodic_flush(path).with_clock(clock.clone());
    let store = Store::open(config(dir.path())).unwrap();
    let aheads = [3_600_000, 2 * DAY, 3650 * DAY];
    let mut want = Vec::new();
    for ahead in aheads {
        for j in 0..100 {
            let body = format!("{ahead}+{j}");
            store.put(delaywheel::Message::new("T", body.clone()).deliver_at_ms(T0 + ahead + j)).unwrap();
            want.push(body);
        }
    }
    assert_eq!(pending_once_indexed(&store), 300);
    crash_copy(dir.path(), crashed.path());
    drop(store);

    let store = Store::open(config(crashed.path())).unwrap();
    assert_eq!(pending_once_indexed(&store), 300, "each timer is held once after the replay");
    clock.set_ms(T0 + 3651 * DAY);
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = bodies(&drain_idle(&mut consumer, 300, Duration::from_millis(500)));
    assert_eq!(got, want, "each fires once, in deliver-time order");
    assert_eq!(pending_once_indexed(&store), 0);
}

/// Retention trusts the older of the last two checkpoints, so once nothing
/// changes the store writes one more: both slots then vouch for the same
/// state (the floor reaches it), instead of the older one lagging for good.
#[test]
fn once_nothing_changes_both_checkpoint_slots_vouch_for_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let clock = delaywheel::ManualClock::new(1_700_000_000_000);
    let config =
        small_config(dir.path()).with_flush_interval(Duration::from_millis(5)).with_clock(clock.clone());
    let store = Store::open(config).unwrap();
    put_numbered(&store, "T", 0..10);
    store.put(delaywheel::Message::new("T", "later").deliver_at_ms(1_700_000_060_000)).unwrap();
    let vouched = |at: usize| {
        let bytes = std::fs::read(dir.path().join("checkpoint")).unwrap();
        let cp = delaywheel::internals::checkpoint::Checkpoint::decode_slot(&bytes[at..at + 96]).unwrap();
        cp.map(|cp| (cp.log_durable, cp.dispatched, cp.tick_second))
    };
    let started = std::time::Instant::now();
    let end =
        |vouched: Option<(u64, u64, u64)>| vouched.map(|(durable, dispatched, _)| durable.min(dispatched));
    while !(vouched(0) == vouched(512) && end(vouched(0)) == Some(store.stats().log_bytes + 32)) {
        assert!(started.elapsed() < Duration::from_secs(10), "slots {:?} and {:?}", vouched(0), vouched(512));
        std::thread::sleep(Duration::from_millis(20));
    }
    store.close().unwrap();
}
