//! `Store::pending`: the timers due in a window, on a live store.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use delaywheel::{CancelOutcome, Clock, Config, ManualClock, Message, Store, SystemClock};

const HOUR: u64 = 3_600_000;
const YEAR: u64 = 365 * 24 * HOUR;

#[test]
fn the_window_lists_pending_timers_on_every_level_in_deliver_time_order() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    // Seconds, hours (level 0), a month (level 1), ten years (level 2), and a legacy level.
    let aheads = [(5_000, "a"), (2 * HOUR, "b"), (30 * 24 * HOUR, "c"), (10 * YEAR, "d"), (900, "e")];
    let mut handles = Vec::new();
    for (ahead, key) in aheads {
        let m = Message::new("orders", key).key(format!("order-{key}")).queue_id(1).deliver_at_ms(T0 + ahead);
        handles.push(store.put(m).unwrap().handle().unwrap());
    }
    let legacy = store.put(Message::new("retries", "r").delay_level(3)).unwrap().handle().unwrap();
    let cancelled =
        store.put(Message::new("orders", "x").deliver_at_ms(T0 + 7_000)).unwrap().handle().unwrap();
    assert_eq!(store.cancel(cancelled).unwrap(), CancelOutcome::Cancelled);

    let all = store.pending(0..u64::MAX, 100).unwrap();
    let keys: Vec<Option<&str>> = all.iter().map(|p| p.key.as_deref()).collect();
    assert_eq!(
        keys,
        [Some("order-e"), Some("order-a"), None, Some("order-b"), Some("order-c"), Some("order-d")],
        "by deliver time; the cancelled one left out"
    );
    assert!(all.windows(2).all(|w| w[0].deliver_at_ms <= w[1].deliver_at_ms));
    let level_of = |key: &str| all.iter().find(|p| p.key.as_deref() == Some(key)).unwrap().wheel_level;
    assert_eq!(
        [level_of("order-a"), level_of("order-b"), level_of("order-c"), level_of("order-d")],
        [0, 0, 1, 2]
    );
    let retry = all.iter().find(|p| p.handle == legacy).unwrap();
    assert_eq!(
        (retry.topic.as_str(), retry.delay_level, retry.deliver_at_ms),
        ("retries", Some(3), T0 + 10_000)
    );
    let first = &all[0];
    assert_eq!((first.topic.as_str(), first.queue, first.handle), ("orders", 1, handles[4]));

    assert_eq!(store.pending(T0 + 1_000..T0 + 2 * HOUR, 100).unwrap().len(), 2, "a and the retry");
    assert_eq!(store.pending(T0 + 1_000..T0 + 2 * HOUR + 1, 100).unwrap().len(), 3, "half-open");
    let far = store.pending(T0 + 9 * YEAR..T0 + 11 * YEAR, 100).unwrap();
    assert_eq!(far.iter().map(|p| p.handle).collect::<Vec<_>>(), [handles[3]]);
    assert_eq!(store.pending(0..u64::MAX, 2).unwrap(), all[..2], "the limit keeps the earliest");

    clock.set_ms(T0 + 6_000);
    let mut consumer = store.consumer("orders", 1).unwrap();
    assert_eq!(drain(&mut consumer, 2).len(), 2, "e and a fired");
    let after = store.pending(0..u64::MAX, 100).unwrap();
    assert_eq!(after, all[2..], "fired timers are gone, the retry is due at +10 s");
    store.close().unwrap();

    let store = store_at(dir.path(), &clock);
    assert_eq!(store.pending(0..u64::MAX, 100).unwrap(), after, "the same after a reopen");
    store.close().unwrap();
}

#[test]
fn a_timer_put_just_before_the_query_is_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    for i in 0..2_000u64 {
        let handle =
            store.put(Message::new("T", "x").deliver_at_ms(T0 + 60_000 + i)).unwrap().handle().unwrap();
        if i % 500 == 0 {
            let listed = store.pending(T0..T0 + 120_000, usize::MAX).unwrap();
            assert_eq!(listed.len() as u64, i + 1);
            assert_eq!(listed.last().unwrap().handle, handle);
        }
    }
    store.close().unwrap();
}

/// A query racing deliveries never lists a timer a consumer has already
/// received: each answer is taken at one instant on the ticking thread.
#[test]
fn a_query_racing_deliveries_never_lists_a_delivered_timer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(small_config(dir.path())).unwrap());
    let now = SystemClock.now_ms();
    let n = 20_000u64;
    // Due over the next 1.5 s, so most of them fire while the queries run.
    for i in 0..n {
        store.put(Message::new("T", "x").deliver_at_ms(now + 300 + i * 1_500 / n)).unwrap();
    }
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let done = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (store, seen, done) = (store.clone(), seen.clone(), done.clone());
        std::thread::spawn(move || {
            let mut consumer = store.consumer("T", 0).unwrap();
            let mut got = 0;
            while got < n {
                for m in consumer.poll(1_000, Duration::from_millis(100)).unwrap() {
                    seen.lock().unwrap().insert(m.log_offset());
                    got += 1;
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let (mut queries, mut overlapping) = (0, 0);
    let started = Instant::now();
    while !done.load(Ordering::Acquire) && started.elapsed() < Duration::from_secs(30) {
        let delivered_before: HashSet<u64> = seen.lock().unwrap().clone();
        let listed = store.pending(0..u64::MAX, usize::MAX).unwrap();
        for timer in &listed {
            assert!(
                !delivered_before.contains(&timer.handle.offset),
                "{} was delivered before the query",
                timer.handle
            );
        }
        queries += 1;
        overlapping += u64::from(!listed.is_empty() && !delivered_before.is_empty());
    }
    consumer.join().unwrap();
    assert!(overlapping > 0, "no query ran while timers were both delivered and pending ({queries} queries)");
    assert!(store.pending(0..u64::MAX, usize::MAX).unwrap().is_empty());
}

#[test]
fn the_bucket_scheduler_says_it_cannot_list() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(Config::new(dir.path()).with_scheduler(delaywheel::Scheduler::Buckets)).unwrap();
    let err = store.pending(0..u64::MAX, 10).unwrap_err();
    assert!(err.to_string().contains("bucket scheduler"), "{err}");
    store.close().unwrap();
}
