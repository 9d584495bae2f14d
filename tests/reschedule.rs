//! `Store::reschedule`: a timer moved earlier, later, into the past and
//! across wheel levels fires once, at its new time, never at the old one;
//! its handle stays valid; the answer holds across a reopen.

mod common;

use std::time::Duration;

use common::*;
use delaywheel::{CancelOutcome, Handle, ManualClock, Message, RescheduleOutcome, Store};

const HOUR: u64 = 3_600_000;
const YEAR: u64 = 365 * 24 * HOUR;

fn put(store: &Store, body: &str, at: u64) -> Handle {
    store.put(Message::new("T", body.to_string()).queue_id(0).deliver_at_ms(at)).unwrap().handle().unwrap()
}

/// Moves the clock to `at` and returns the bodies delivered by then, with the deliver time the consumer saw.
fn deliveries_until(clock: &ManualClock, consumer: &mut delaywheel::Consumer, at: u64) -> Vec<(String, u64)> {
    clock.set_ms(at);
    let got = drain_idle(consumer, usize::MAX, Duration::from_millis(300));
    got.iter().map(|m| (String::from_utf8_lossy(m.body()).into_owned(), m.deliver_at_ms().unwrap())).collect()
}

#[test]
fn a_rescheduled_timer_fires_once_at_its_new_time_never_at_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let later = put(&store, "later", T0 + 5_000);
    let earlier = put(&store, "earlier", T0 + 60_000);
    let past = put(&store, "past", T0 + 30_000);
    let twice = put(&store, "twice", T0 + 4_000);
    assert_eq!(store.reschedule(later, T0 + 20_000).unwrap(), RescheduleOutcome::Rescheduled);
    assert_eq!(store.reschedule(earlier, T0 + 2_000).unwrap(), RescheduleOutcome::Rescheduled);
    assert_eq!(store.reschedule(past, T0 - 10_000).unwrap(), RescheduleOutcome::Rescheduled);
    assert_eq!(store.reschedule(twice, T0 + 8_000).unwrap(), RescheduleOutcome::Rescheduled);
    assert_eq!(
        store.reschedule(twice, T0 + 4_000).unwrap(),
        RescheduleOutcome::Rescheduled,
        "back to the old time"
    );
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(
        deliveries_until(&clock, &mut consumer, T0),
        [("past".to_string(), T0 - 10_000)],
        "the past is now"
    );
    assert_eq!(deliveries_until(&clock, &mut consumer, T0 + 2_000), [("earlier".to_string(), T0 + 2_000)]);
    assert_eq!(deliveries_until(&clock, &mut consumer, T0 + 4_000), [("twice".to_string(), T0 + 4_000)]);
    assert_eq!(deliveries_until(&clock, &mut consumer, T0 + 19_999), [], "not at the old time");
    assert_eq!(deliveries_until(&clock, &mut consumer, T0 + 20_000), [("later".to_string(), T0 + 20_000)]);
    assert_eq!(deliveries_until(&clock, &mut consumer, T0 + 120_000), [], "each once");
    assert_eq!(store.reschedule(later, T0 + 200_000).unwrap(), RescheduleOutcome::AlreadyDelivered);
    assert_eq!(store.cancel(later).unwrap(), CancelOutcome::AlreadyDelivered, "the handle still names it");
    store.close().unwrap();
}

#[test]
fn the_handle_stays_valid_for_cancel_and_reschedule_also_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let a = put(&store, "a", T0 + 5_000);
    let b = put(&store, "b", T0 + 6_000);
    assert_eq!(store.reschedule(a, T0 + 50_000).unwrap(), RescheduleOutcome::Rescheduled);
    assert_eq!(store.reschedule(b, T0 + 70_000).unwrap(), RescheduleOutcome::Rescheduled);
    assert_eq!(store.cancel(a).unwrap(), CancelOutcome::Cancelled, "cancels the rescheduled timer");
    assert_eq!(store.reschedule(a, T0 + 1_000).unwrap(), RescheduleOutcome::Cancelled);
    let wrong = Handle { deliver_at_ms: b.deliver_at_ms + 1, ..b };
    assert_eq!(store.reschedule(wrong, T0).unwrap(), RescheduleOutcome::NotFound);
    let new_time = Handle { deliver_at_ms: T0 + 70_000, ..b };
    assert_eq!(
        store.reschedule(new_time, T0).unwrap(),
        RescheduleOutcome::NotFound,
        "the handle is the put's"
    );
    store.close().unwrap();

    let store = store_at(dir.path(), &clock);
    assert_eq!(store.cancel(a).unwrap(), CancelOutcome::Cancelled);
    assert_eq!(
        store.reschedule(b, T0 + 80_000).unwrap(),
        RescheduleOutcome::Rescheduled,
        "found after a reopen"
    );
    let listed = store.pending(0..u64::MAX, 10).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].handle, listed[0].deliver_at_ms), (b, T0 + 80_000));
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(deliveries_until(&clock, &mut consumer, T0 + 79_999), []);
    assert_eq!(deliveries_until(&clock, &mut consumer, T0 + 80_000), [("b".to_string(), T0 + 80_000)]);
    store.close().unwrap();
}

#[test]
fn timers_move_across_every_wheel_level_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    // Seconds -> years, years -> seconds, a month -> hours, hours -> decades.
    let moves = [(5_000, 10 * YEAR), (20 * YEAR, 7_000), (30 * 24 * HOUR, 3 * HOUR), (2 * HOUR, 40 * YEAR)];
    let mut want = Vec::new();
    for (i, (from, to)) in moves.into_iter().enumerate() {
        let handle = put(&store, &format!("m{i}"), T0 + from);
        assert_eq!(store.reschedule(handle, T0 + to).unwrap(), RescheduleOutcome::Rescheduled);
        want.push((T0 + to, format!("m{i}")));
    }
    want.sort();
    let listed: Vec<u64> = store.pending(0..u64::MAX, 10).unwrap().iter().map(|p| p.deliver_at_ms).collect();
    assert_eq!(listed, want.iter().map(|(at, _)| *at).collect::<Vec<_>>());
    let mut consumer = store.consumer("T", 0).unwrap();
    for (at, body) in want {
        assert_eq!(deliveries_until(&clock, &mut consumer, at - 1), [], "{body} not early");
        assert_eq!(deliveries_until(&clock, &mut consumer, at), [(body.clone(), at)], "{body} on time");
    }
    store.close().unwrap();
}
