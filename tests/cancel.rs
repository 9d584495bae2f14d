//! Cancelling timers through the public API, with a manual clock.

mod common;

use std::time::Duration;

use common::*;
use delaywheel::{CancelOutcome, Handle, ManualClock, Message, Store};

const YEAR: u64 = 365 * 86_400_000;

fn put_timer(store: &Store, body: &str, at: u64) -> Handle {
    store.put(Message::new("T", body.to_string()).deliver_at_ms(at)).unwrap().handle().unwrap()
}

#[test]
fn cancel_before_due_after_delivery_and_unknown_handles() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let soon = put_timer(&store, "soon", T0 + 1_000);
    let cancelled = put_timer(&store, "cancelled", T0 + 2_000);
    assert_eq!(store.put(Message::new("T", "plain")).unwrap().handle(), None, "only timers have handles");
    assert_eq!(store.cancel(cancelled).unwrap(), CancelOutcome::Cancelled);
    assert_eq!(store.cancel(cancelled).unwrap(), CancelOutcome::Cancelled, "cancelling twice is harmless");

    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&drain_idle(&mut consumer, 1, Duration::from_millis(300))), ["plain"]);
    clock.set_ms(T0 + 1_000);
    assert_eq!(bodies(&consumer.poll(1, Duration::from_secs(5)).unwrap()), ["soon"]);
    assert_eq!(store.cancel(soon).unwrap(), CancelOutcome::AlreadyDelivered);
    clock.set_ms(T0 + 10_000);
    assert!(
        consumer.poll(1, Duration::from_millis(300)).unwrap().is_empty(),
        "the cancelled one never fires"
    );

    let wrong_time = Handle { deliver_at_ms: soon.deliver_at_ms + 1, ..soon };
    let nowhere = Handle { offset: 1 << 40, deliver_at_ms: T0 };
    let mid_record = Handle { offset: soon.offset + 3, ..soon };
    for handle in [wrong_time, nowhere, mid_record] {
        assert_eq!(store.cancel(handle).unwrap(), CancelOutcome::NotFound, "{handle}");
    }
}

#[test]
fn cancels_survive_a_restart_and_reach_timers_on_every_level() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let aheads = [5_000, 86_400_000, 10 * YEAR, 100 * YEAR];
    let handles: Vec<Handle> = aheads.iter().map(|a| put_timer(&store, &format!("c{a}"), T0 + a)).collect();
    let kept: Vec<Handle> = aheads.iter().map(|a| put_timer(&store, &format!("k{a}"), T0 + a + 1)).collect();
    for h in &handles {
        assert_eq!(store.cancel(*h).unwrap(), CancelOutcome::Cancelled);
    }
    store.close().unwrap();

    let store = store_at(dir.path(), &clock);
    assert_eq!(
        store.cancel(handles[3]).unwrap(),
        CancelOutcome::Cancelled,
        "still cancelled after the restart"
    );
    let mut consumer = store.consumer("T", 0).unwrap();
    for (a, k) in aheads.iter().zip(&kept) {
        clock.set_ms(k.deliver_at_ms);
        let got = consumer.poll(1, Duration::from_secs(5)).unwrap();
        assert_eq!(bodies(&got), [format!("k{a}")], "{a} ms ahead: only the kept timer fires");
    }
    assert!(consumer.poll(1, Duration::from_millis(300)).unwrap().is_empty());
}

#[test]
fn a_thousand_cancels_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let handles: Vec<Handle> =
        (0..2_000).map(|i| put_timer(&store, &format!("m{i}"), T0 + 60_000 + i)).collect();
    for h in handles.iter().step_by(2) {
        assert_eq!(store.cancel(*h).unwrap(), CancelOutcome::Cancelled);
    }
    clock.set_ms(T0 + 120_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = bodies(&drain_idle(&mut consumer, 2_000, Duration::from_millis(500)));
    let want: Vec<String> = (0..2_000).filter(|i| i % 2 == 1).map(|i| format!("m{i}")).collect();
    assert_eq!(got, want);
}

/// A cancel is an answer the store keeps: asking again after the timer's time
/// has passed, and after a restart (clean, a crash copy, or with `timer/`
/// rebuilt from the commit log), still answers
/// `Cancelled`, and a delivered timer still answers `AlreadyDelivered`.
#[test]
fn a_repeated_cancel_after_the_time_passed_and_a_restart_still_answers_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let cancelled = put_timer(&store, "cancelled", T0 + 1_000);
    let delivered = put_timer(&store, "delivered", T0 + 1_001);
    let cancelled_late = put_timer(&store, "cancelled late", T0 + 5_000);
    assert_eq!(store.cancel(cancelled).unwrap(), CancelOutcome::Cancelled);
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(T0 + 2_000);
    assert_eq!(bodies(&consumer.poll(1, Duration::from_secs(5)).unwrap()), ["delivered"]);
    assert_eq!(store.cancel(cancelled).unwrap(), CancelOutcome::Cancelled, "after its time");
    assert_eq!(store.cancel(cancelled_late).unwrap(), CancelOutcome::Cancelled);
    clock.set_ms(T0 + 6_000);
    assert!(consumer.poll(1, Duration::from_millis(300)).unwrap().is_empty());
    let crashed = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), crashed.path());
    store.close().unwrap();
    let rebuilt = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), rebuilt.path());
    std::fs::remove_dir_all(rebuilt.path().join("timer")).unwrap();

    let cases =
        [("clean close", dir.path()), ("crash", crashed.path()), ("rebuild of timer/", rebuilt.path())];
    for (how, path) in cases {
        let store = store_at(path, &clock);
        for (handle, want) in [
            (cancelled, CancelOutcome::Cancelled),
            (cancelled_late, CancelOutcome::Cancelled),
            (delivered, CancelOutcome::AlreadyDelivered),
        ] {
            assert_eq!(store.cancel(handle).unwrap(), want, "after a {how}: {handle}");
        }
        store.close().unwrap();
    }
}

#[test]
fn cancel_batch_answers_each_in_order_and_the_cancelled_never_fire() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let config =
        small_config(dir.path()).with_clock(clock.clone()).with_flush_mode(delaywheel::FlushMode::Sync);
    let store = Store::open(config.clone()).unwrap();
    let fired = put_timer(&store, "fired", T0 + 1_000);
    let kept = put_timer(&store, "kept", T0 + 5_000);
    let batch: Vec<Handle> = (0..100).map(|i| put_timer(&store, &format!("c{i}"), T0 + 2_000 + i)).collect();
    clock.set_ms(T0 + 1_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&consumer.poll(1, Duration::from_secs(5)).unwrap()), ["fired"]);
    let unknown = Handle { offset: 1, deliver_at_ms: T0 };
    let mut handles = vec![fired, unknown];
    handles.extend(&batch);
    let outcomes = store.cancel_batch(&handles).unwrap();
    assert_eq!(outcomes[..2], [CancelOutcome::AlreadyDelivered, CancelOutcome::NotFound]);
    assert!(outcomes[2..].iter().all(|o| *o == CancelOutcome::Cancelled));
    drop(consumer);
    store.close().unwrap();

    let store = Store::open(config).unwrap();
    clock.set_ms(T0 + 10_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    consumer.seek(1);
    assert_eq!(bodies(&drain_idle(&mut consumer, 101, Duration::from_millis(500))), ["kept"]);
    assert_eq!(store.cancel_batch(&[kept]).unwrap(), [CancelOutcome::AlreadyDelivered]);
    assert!(store.cancel_batch(&[]).unwrap().is_empty());
}
