//! Downtime and clock jumps, with a manual clock.

mod common;

use std::time::Duration;

use common::*;
use delaywheel::{ManualClock, Message};

const DAY: u64 = 86_400_000;

#[test]
fn timers_due_during_a_year_of_downtime_arrive_at_restart_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    // Put out of order: a day, an hour, a month, a minute ahead, and one beyond the downtime.
    for (name, ahead) in
        [("day", DAY), ("hour", 3_600_000), ("month", 30 * DAY), ("minute", 60_000), ("late", 400 * DAY)]
    {
        store.put(Message::new("T", name).deliver_at_ms(T0 + ahead)).unwrap();
    }
    store.close().unwrap();

    clock.set_ms(T0 + 365 * DAY);
    let store = store_at(dir.path(), &clock);
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = drain_idle(&mut consumer, 5, Duration::from_millis(500));
    assert_eq!(bodies(&got), ["minute", "hour", "day", "month"], "oldest first, nothing early");
    assert!(got.iter().all(|m| m.delivered_at_ms() >= T0 + 365 * DAY));
    clock.set_ms(T0 + 400 * DAY);
    assert_eq!(bodies(&consumer.poll(1, Duration::from_secs(5)).unwrap()), ["late"]);
}

#[test]
fn a_clock_that_moves_back_delivers_nothing_early_or_twice() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    store.put(Message::new("T", "first").deliver_at_ms(T0 + 1_000)).unwrap();
    store.put(Message::new("T", "second").deliver_at_ms(T0 + 5_000)).unwrap();
    let mut consumer = store.consumer("T", 0).unwrap();
    clock.set_ms(T0 + 1_000);
    assert_eq!(bodies(&consumer.poll(1, Duration::from_secs(5)).unwrap()), ["first"]);

    // Back by an hour: the wheel waits for time to catch up.
    clock.set_ms(T0 - 3_600_000);
    assert!(consumer.poll(1, Duration::from_millis(400)).unwrap().is_empty());
    clock.set_ms(T0 + 4_999);
    assert!(consumer.poll(1, Duration::from_millis(300)).unwrap().is_empty(), "not early");
    clock.set_ms(T0 + 5_000);
    let got = consumer.poll(2, Duration::from_secs(5)).unwrap();
    assert_eq!(bodies(&got), ["second"]);
    assert!(consumer.poll(1, Duration::from_millis(300)).unwrap().is_empty(), "nothing twice");
}

#[test]
fn a_clock_that_jumps_forward_catches_up_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let n = 500u64;
    for i in (0..n).rev() {
        // Spread over ten days, put in reverse order.
        store.put(Message::new("T", format!("{i:04}")).deliver_at_ms(T0 + 1 + i * (10 * DAY / n))).unwrap();
    }
    clock.set_ms(T0 + 11 * DAY);
    let mut consumer = store.consumer("T", 0).unwrap();
    // Catching up on eleven days walks the seconds that hold timers one by
    // one: about half a second in a debug build on one busy core.
    let got = bodies(&drain_idle(&mut consumer, n as usize, Duration::from_secs(5)));
    let want: Vec<String> = (0..n).map(|i| format!("{i:04}")).collect();
    assert_eq!(got, want);
}
