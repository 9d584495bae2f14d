//! Timed messages through the public API, with a manual clock.

mod common;

use std::time::Duration;

use common::*;
use delaywheel::{Error, ManualClock, Message, Store};

#[test]
fn timed_messages_arrive_when_due_and_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let at = store.put(Message::new("T", "at").deliver_at_ms(T0 + 2_500)).unwrap();
    let level = store.put(Message::new("T", "level-2").delay_level(2)).unwrap();
    let now = store.put(Message::new("T", "now")).unwrap();
    assert_eq!(at.deliver_at_ms(), Some(T0 + 2_500));
    assert_eq!(level.deliver_at_ms(), Some(T0 + 5_000));
    assert_eq!(now.deliver_at_ms(), None);

    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&drain_idle(&mut consumer, 3, Duration::from_millis(300))), ["now"]);
    clock.set_ms(T0 + 2_499);
    assert!(consumer.poll(1, Duration::from_millis(300)).unwrap().is_empty(), "not a millisecond early");
    clock.set_ms(T0 + 2_500);
    let got = consumer.poll(1, Duration::from_secs(5)).unwrap();
    assert_eq!(bodies(&got), ["at"]);
    assert_eq!(got[0].deliver_at_ms(), Some(T0 + 2_500));
    assert!(got[0].delivered_at_ms() >= T0 + 2_500);
    assert_eq!(got[0].log_offset(), at.offset(), "delivery points at the original record");
    clock.set_ms(T0 + 60_000);
    let got = consumer.poll(1, Duration::from_secs(5)).unwrap();
    assert_eq!(bodies(&got), ["level-2"]);
    assert_eq!(got[0].delay_level(), Some(2));
    let stats = store.stats();
    assert_eq!(stats.delivered, 2);
    assert_eq!((stats.lateness_ms.count, stats.recent_lateness_ms.count), (2, 2), "both within two minutes");
    assert!(
        stats.recent_lateness_ms.max >= 55_000,
        "level-2 fired 55 s late: {:?}",
        stats.recent_lateness_ms
    );
    clock.set_ms(T0 + 240_000);
    let stats = store.stats();
    assert_eq!((stats.lateness_ms.count, stats.recent_lateness_ms.count), (2, 0), "none lately");
    store.close().unwrap();
}

/// A second of more timers than the wheel sorts in one go (5,000: it
/// spreads them by millisecond first) fires them in (deliver time, log
/// offset) order, as consumers then read them.
#[test]
fn a_big_second_fires_in_deliver_time_then_log_order() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let messages: Vec<Message> = (0..5_000u64)
        .map(|i| Message::new("T", format!("m{i}")).deliver_at_ms(T0 + 10_000 + (i * 7_919) % 1_000))
        .collect();
    for batch in messages.chunks(500) {
        store.put_batch(batch.to_vec()).unwrap();
    }
    store.fresh_stats().unwrap(); // all with the wheel before their second loads
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(T0 + 11_000);
    let got = drain(&mut consumer, 5_000);
    let order: Vec<(u64, u64)> = got.iter().map(|m| (m.deliver_at_ms().unwrap(), m.log_offset())).collect();
    assert_eq!(order.len(), 5_000);
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "out of order: {:?}",
        order.windows(2).find(|w| w[0] >= w[1])
    );
    store.close().unwrap();
}

/// Timers fired together, several due at one millisecond, each count once
/// in the lateness histograms (a millisecond's timers are counted as one run).
#[test]
fn timers_fired_together_each_count_their_lateness() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let due = [T0 + 1_000, T0 + 1_000, T0 + 1_000, T0 + 1_200, T0 + 1_200, T0 + 1_700, T0 + 1_000];
    for (i, at) in due.iter().enumerate() {
        store.put(Message::new("T", format!("m{i}")).deliver_at_ms(*at)).unwrap();
    }
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(T0 + 2_000);
    assert_eq!(drain(&mut consumer, due.len()).len(), due.len());
    let stats = store.stats();
    assert_eq!(stats.delivered, due.len() as u64);
    assert_eq!((stats.lateness_ms.count, stats.recent_lateness_ms.count), (7, 7));
    assert!(stats.lateness_ms.max >= 1_000, "the first fired a second late: {:?}", stats.lateness_ms);
    store.close().unwrap();
}

#[test]
fn pending_timers_survive_a_clean_close_and_fire_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    store.put(Message::new("T", "soon").deliver_at_ms(T0 + 1_000)).unwrap();
    store.put(Message::new("T", "later").deliver_at_ms(T0 + 90_000)).unwrap();
    store.put(Message::new("T", "next-year").deliver_at_ms(T0 + 365 * 86_400_000)).unwrap();
    clock.set_ms(T0 + 1_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&consumer.poll(1, Duration::from_secs(5)).unwrap()), ["soon"]);
    consumer.commit();
    drop(consumer);
    store.close().unwrap();

    let store = store_at(dir.path(), &clock);
    let mut consumer = store.consumer("T", 0).unwrap();
    assert!(consumer.poll(1, Duration::from_millis(300)).unwrap().is_empty(), "soon is not delivered twice");
    clock.set_ms(T0 + 90_000);
    assert_eq!(bodies(&consumer.poll(1, Duration::from_secs(5)).unwrap()), ["later"]);
    clock.set_ms(T0 + 365 * 86_400_000);
    assert_eq!(bodies(&consumer.poll(1, Duration::from_secs(5)).unwrap()), ["next-year"]);
}

#[test]
fn bad_timing_is_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let cases = [
        (Message::new("T", "x").delay_level(19), "invalid delay level: 19 is not between 1 and 18"),
        (Message::new("T", "x").delay_level(0), "invalid delay level: 0 is not between 1 and 18"),
        (
            Message::new("T", "x").deliver_at_ms(T0).delay(Duration::from_secs(1)),
            "invalid timing: set only one of deliver_at_ms, delay and delay_level",
        ),
    ];
    for (msg, text) in cases {
        let err = store.put(msg).unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }));
        assert_eq!(err.to_string(), text);
    }
    assert!(store.put(Message::new("T", "x").deliver_at_ms(u64::MAX)).is_err());
    clock.set_ms(T0 + 10 * 86_400_000);
    assert_eq!(store.stats().pending, 0);
    let mut consumer = store.consumer("T", 0).unwrap();
    assert!(consumer.poll(1, Duration::from_millis(200)).unwrap().is_empty());
    drop(store);
    let err = Store::open(small_config(dir.path()).with_delay_levels("1s 5x")).err().unwrap();
    assert!(err.to_string().contains("\"5x\" needs a unit"), "{err}");
}

/// Timers that fire together reach the consumer through one deliveries
/// record per run; each still comes with everything it was put with: key,
/// tags, properties, level, and for a rescheduled one its new time.
#[test]
fn timers_fired_together_keep_what_they_were_put_with() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store =
        Store::open(small_config(dir.path()).with_clock(clock.clone()).with_queues_per_topic(1)).unwrap();
    let due = T0 + 5_000;
    let receipts: Vec<_> = (0..30)
        .map(|i| {
            let m = Message::new("T", format!("m{i}")).deliver_at_ms(due);
            let m = match i % 3 {
                0 => m,
                1 => m.key(format!("k{i}")).tags("paid"),
                _ => m.property("n", i.to_string()).property("empty", ""),
            };
            store.put(m).unwrap()
        })
        .collect();
    let level = store.put(Message::new("T", "level").delay_level(2)).unwrap();
    assert_eq!(level.deliver_at_ms(), Some(due), "level 2 is 5 s");
    let moved = store.put(Message::new("T", "moved").deliver_at_ms(due + 1)).unwrap();
    store.reschedule(moved.handle().unwrap(), due).unwrap();
    let before = store.stats().log_bytes;
    clock.set_ms(due + 500);

    let mut consumer = store.consumer("T", 0).unwrap();
    let mut got = Vec::new();
    while got.len() < 32 {
        let batch = consumer.poll(4, Duration::from_secs(5)).unwrap();
        assert!(!batch.is_empty(), "{} of 32", got.len());
        got.extend(batch);
    }
    let per_timer = (store.stats().log_bytes - before) / 32;
    assert!(per_timer < 28, "{per_timer} bytes a timer: delivered one record each, not in runs");
    for (m, receipt) in got.iter().zip(&receipts) {
        let i: usize = std::str::from_utf8(m.body()).unwrap()[1..].parse().unwrap();
        assert_eq!(m.log_offset(), receipt.offset());
        assert_eq!((m.deliver_at_ms(), m.delay_level()), (Some(due), None));
        let (key, tags, properties) = match i % 3 {
            0 => (None, None, vec![]),
            1 => (Some(format!("k{i}")), Some("paid"), vec![]),
            _ => (None, None, vec![("n".to_string(), i.to_string()), ("empty".to_string(), String::new())]),
        };
        assert_eq!((m.key().map(str::to_string), m.tags(), m.properties()), (key, tags, &properties[..]));
    }
    let by_body = |body: &str| got.iter().find(|m| &m.body()[..] == body.as_bytes()).unwrap();
    assert_eq!(by_body("level").delay_level(), Some(2));
    assert_eq!(by_body("moved").deliver_at_ms(), Some(due), "due at its new time");
    assert_eq!(by_body("moved").log_offset(), moved.offset());
}

/// A timer put in this run of the store and due within about a minute is
/// not read again as its second loads: the dispatcher read its record as it
/// indexed it and sent its route along. A far one, a rescheduled one and,
/// after a restart, every one are checked against their records.
#[test]
fn timers_put_in_this_run_and_due_soon_are_not_read_again_as_their_second_loads() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    for i in 0..100 {
        store.put(Message::new("T", format!("m{i}")).deliver_at_ms(T0 + 5_000 + i * 7)).unwrap();
    }
    let moved = store.put(Message::new("T", "moved").deliver_at_ms(T0 + 3_000)).unwrap();
    store.reschedule(moved.handle().unwrap(), T0 + 6_000).unwrap();
    store.put(Message::new("T", "far").deliver_at_ms(T0 + 600_000)).unwrap();
    // Every timer with the wheel before the clock moves: one the dispatcher
    // handed over after its second loaded would fire by a delivery record
    // of its own, read and checked by the dispatcher, not at loading.
    store.fresh_stats().unwrap();
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(T0 + 6_000);
    let fired = bodies(&drain(&mut consumer, 101));
    assert_eq!(fired.len(), 101);
    assert_eq!(fired.last().map(String::as_str), Some("moved"));
    assert_eq!(store.fresh_stats().unwrap().timers_checked_at_load, 1, "only the rescheduled one");
    clock.set_ms(T0 + 600_000);
    assert_eq!(bodies(&drain(&mut consumer, 1)), ["far"]);
    assert_eq!(store.fresh_stats().unwrap().timers_checked_at_load, 2, "and the far one");
    for i in 0..50 {
        store.put(Message::new("T", format!("r{i}")).deliver_at_ms(T0 + 610_000 + i)).unwrap();
    }
    consumer.commit();
    drop(consumer);
    store.close().unwrap();

    let store = store_at(dir.path(), &clock);
    store.fresh_stats().unwrap();
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(T0 + 611_000);
    assert_eq!(bodies(&drain(&mut consumer, 50)), (0..50).map(|i| format!("r{i}")).collect::<Vec<_>>());
    assert_eq!(store.fresh_stats().unwrap().timers_checked_at_load, 50, "after a restart, every one");
}
