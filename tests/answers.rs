//! Answers that tell the truth: an error means what it says, a count is
//! exact when asked for, and order holds once the wheel holds the timers.

mod common;

use std::time::Duration;

use common::*;
use delaywheel::{CancelOutcome, Error, FlushMode, Handle, ManualClock, Message, Store, Written};

const MINUTE: u64 = 60_000;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// A sync put whose record is appended but not on disk within the put
/// timeout answers `NotYetDurable` with its receipt, and the message is
/// delivered once: a caller that trusted the old "timed out" error and put
/// it again sent it twice.
#[test]
fn a_sync_put_that_times_out_after_its_append_says_so_and_is_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path())
        .with_segment_size(1 << 20)
        .with_flush_mode(FlushMode::Sync)
        .with_put_timeout(Duration::from_micros(1));
    let store = Store::open(config).unwrap();
    let results: Vec<(String, Result<delaywheel::Receipt, Error>)> = std::thread::scope(|s| {
        let producers: Vec<_> = (0..8)
            .map(|p| {
                let store = &store;
                s.spawn(move || {
                    (0..100)
                        .map(|i| {
                            let body = format!("{p}-{i:03}");
                            (body.clone(), store.put(Message::new("T", body)))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        producers.into_iter().flat_map(|p| p.join().unwrap()).collect()
    });
    let mut written = Vec::new();
    let mut not_yet_durable = 0;
    for (body, result) in results {
        match result {
            Ok(_) => written.push(body),
            Err(Error::NotYetDurable { written: Written::Put(receipt), .. }) => {
                store.wait_durable(&receipt, Duration::from_secs(10)).unwrap();
                not_yet_durable += 1;
                written.push(body);
            }
            Err(e @ Error::Busy { .. }) => panic!("no put should wait for the indexes here: {e}"),
            Err(e) => panic!("{body}: an error that is neither written nor refused: {e}"),
        }
    }
    assert!(not_yet_durable > 0, "a 1 µs put timeout never ran out");
    let mut consumer = store.consumer("T", 0).unwrap();
    let mut got = bodies(&drain_idle(&mut consumer, written.len() + 1, Duration::from_millis(500)));
    got.sort();
    written.sort();
    assert_eq!(got, written, "each written message delivered once");
}

/// A handle naming an ordinary message (deliver time 0, as no put makes)
/// names no timer.
#[test]
fn a_handle_naming_an_ordinary_message_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_at(dir.path(), &ManualClock::new(T0));
    let plain = store.put(Message::new("T", "plain")).unwrap();
    for deliver_at_ms in [0, T0] {
        let forged = Handle { offset: plain.offset(), deliver_at_ms };
        assert_eq!(store.cancel(forged).unwrap(), CancelOutcome::NotFound, "{forged}");
    }
}

/// The horizons are per interval, leave cancelled timers out, add up to
/// `pending`, and `fresh_stats` has them right at once.
#[test]
fn pending_by_horizon_leaves_cancelled_timers_out() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    // Two or three timers per interval: within 5 s (one in the loaded
    // second), 5 s - 1 min, 1 - 5 min, 5 min - 1 h, 1 h - 1 d, beyond.
    let aheads = [
        vec![500, 2_000, 3_000],
        vec![30_000, 40_000],
        vec![2 * MINUTE, 3 * MINUTE],
        vec![30 * MINUTE, 40 * MINUTE, 50 * MINUTE],
        vec![5 * HOUR, 20 * HOUR],
        vec![30 * DAY, 3_000 * DAY],
    ];
    let handles: Vec<Vec<Handle>> = aheads
        .iter()
        .map(|group| {
            group
                .iter()
                .map(|ahead| {
                    let put = store.put(Message::new("T", "t").deliver_at_ms(T0 + ahead)).unwrap();
                    put.handle().unwrap()
                })
                .collect()
        })
        .collect();
    let stats = store.fresh_stats().unwrap();
    assert_eq!((stats.pending, stats.pending_by_horizon), (14, [3, 2, 2, 3, 2, 2]));
    for group in &handles {
        assert_eq!(store.cancel(group[0]).unwrap(), CancelOutcome::Cancelled);
    }
    let stats = store.fresh_stats().unwrap();
    assert_eq!((stats.pending, stats.pending_by_horizon), (8, [2, 1, 1, 2, 1, 1]));
}

/// Once `dispatch_lag_bytes` reads 0 the wheel holds every timer put, so a
/// clock jump delivers them in deliver-time order (inserts still queued to
/// the ticking thread used to come out later, out of order).
#[test]
fn after_the_lag_reads_zero_a_clock_jump_delivers_in_deliver_time_order() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let n = 10_000u64;
    for i in 0..n {
        let at = T0 + 1 + (i * 7_919 % n) * (DAY / n);
        store.put(Message::new("T", format!("{at:015}")).deliver_at_ms(at)).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.stats().dispatch_lag_bytes > 0 {
        assert!(std::time::Instant::now() < deadline, "the indexes never caught up");
        std::thread::sleep(Duration::from_millis(1));
    }
    clock.set_ms(T0 + DAY + HOUR);
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = bodies(&drain_idle(&mut consumer, n as usize, Duration::from_secs(5)));
    assert_eq!(got.len(), n as usize);
    let out_of_order = got.windows(2).filter(|w| w[0] > w[1]).count();
    assert_eq!(out_of_order, 0, "deliveries out of deliver-time order");
}

/// `fresh_stats` counts what was just done, without sleeping first.
#[test]
fn fresh_stats_count_what_was_just_put_and_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_at(dir.path(), &ManualClock::new(T0));
    let later = store.put(Message::new("T", "later").deliver_at_ms(T0 + HOUR)).unwrap();
    store.put(Message::new("T", "far").deliver_at_ms(T0 + 400 * DAY)).unwrap();
    let stats = store.fresh_stats().unwrap();
    assert_eq!((stats.pending, stats.pending_per_level), (2, [1, 1, 0]));
    store.cancel(later.handle().unwrap()).unwrap();
    assert_eq!(store.fresh_stats().unwrap().pending, 1);
}

/// A poisoned store says which step failed: here the dispatcher, which
/// cannot make a queue directory where a file is (it used to blame "an
/// earlier failed flush").
#[test]
fn the_poison_names_the_step_that_failed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    std::fs::write(dir.path().join("consumequeue/New"), b"").unwrap();
    store.put(Message::new("New", "x")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.health().is_ok() {
        assert!(std::time::Instant::now() < deadline, "the dispatcher never failed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let err = store.put(Message::new("T", "y")).unwrap_err().to_string();
    assert!(
        err.contains("dispatcher") && err.contains("consumequeue/New") && !err.contains("flush"),
        "{err}"
    );
}
