//! Recurring schedules in the store: each occurrence delivered once, at its
//! own millisecond, numbered, naming the next; across a reopen and a
//! `kill -9` image; missed occurrences by policy; cancel; refusals.

mod common;

use std::time::Duration;

use common::*;
use delaywheel::{
    CancelOutcome, Config, ConsumedMessage, Consumer, Error, ManualClock, Message, MissedRuns, Occurrence,
    PauseOutcome, Recurrence, Schedule, Scheduler, Store, UpdateOutcome,
};

/// Every `period_ms` from `start`, `limit` occurrences at most.
fn every(period_ms: u64, start: u64) -> Schedule {
    Schedule::new(
        Message::new("S", "tick").queue_id(0).key("job-1").property("team", "billing"),
        Recurrence::every(Duration::from_millis(period_ms)),
    )
    .start_at_ms(start)
}

/// Moves the clock to `at` and returns what was delivered by then:
/// (deliver time, occurrence). Waits for `want` (a slow machine delivers
/// late, never early); with `want` 0, for 300 ms of nothing.
fn until(clock: &ManualClock, consumer: &mut Consumer, at: u64, want: usize) -> Vec<(u64, Occurrence)> {
    clock.set_ms(at);
    let got = match want {
        0 => drain_idle(consumer, usize::MAX, Duration::from_millis(300)),
        want => drain_idle(consumer, want, Duration::from_secs(5)),
    };
    occurrences(&got)
}

fn occurrences(messages: &[ConsumedMessage]) -> Vec<(u64, Occurrence)> {
    messages.iter().map(|m| (m.deliver_at_ms().unwrap(), *m.occurrence().expect("an occurrence"))).collect()
}

/// The numbers of every occurrence in queue `S/0`, read from its start.
fn numbers_in_queue(store: &Store) -> Vec<u64> {
    let mut consumer = store.consumer("S", 0).unwrap();
    consumer.seek(0);
    let all = drain_idle(&mut consumer, usize::MAX, Duration::from_millis(300));
    all.iter().map(|m| m.occurrence().unwrap().number).collect()
}

#[test]
fn each_occurrence_is_delivered_once_at_its_instant_numbered_and_naming_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let receipt = store.schedule(every(10_000, T0 + 10_000).limit(3)).unwrap();
    let handle = receipt.handle();
    assert_eq!(receipt.first_occurrence_ms(), T0 + 10_000);
    let mut consumer = store.consumer("S", 0).unwrap();
    let at = |n: u64| T0 + 10_000 * n;
    let occurrence = |number, next| Occurrence { schedule: handle, number, next_at_ms: next };
    for n in 1..=3 {
        assert_eq!(until(&clock, &mut consumer, at(n) - 1, 0), [], "never early");
        let next = (n < 3).then(|| at(n + 1));
        assert_eq!(until(&clock, &mut consumer, at(n), 1), [(at(n), occurrence(n, next))], "occurrence {n}");
    }
    assert_eq!(until(&clock, &mut consumer, at(10), 0), [], "the limit is 3");
    assert_eq!(store.stats().occurrences_delivered, 3);
    // Each is the template as a consumer reads a timed message: the spec is the store's.
    consumer.seek(0);
    let all = drain_idle(&mut consumer, 3, Duration::from_millis(300));
    for m in &all {
        assert_eq!((m.body().as_ref(), m.key(), m.topic()), (&b"tick"[..], Some("job-1"), "S"));
        assert_eq!(m.properties(), [("team".to_string(), "billing".to_string())]);
        assert!(m.delivered_at_ms() >= m.deliver_at_ms().unwrap());
    }
    assert_eq!(store.cancel_schedule(handle).unwrap(), CancelOutcome::AlreadyDelivered, "it is over");
    store.close().unwrap();
}

#[test]
fn occurrences_a_second_apart_and_closer_each_arm_the_next() {
    // 250 ms apart: every occurrence after the first is indexed into a
    // second the wheel has already loaded.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    store.schedule(every(250, T0 + 250).limit(12)).unwrap();
    let mut consumer = store.consumer("S", 0).unwrap();
    let mut got = Vec::new();
    for step in 1..=16 {
        got.extend(until(&clock, &mut consumer, T0 + 250 * step, usize::from(step <= 12)));
    }
    let want: Vec<(u64, u64)> = (1..=12).map(|n| (T0 + 250 * n, n)).collect();
    assert_eq!(got.iter().map(|(at, o)| (*at, o.number)).collect::<Vec<_>>(), want);
    store.close().unwrap();
}

#[test]
fn a_schedule_goes_on_after_a_reopen_and_a_kill_image_and_delivers_each_occurrence_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    store.schedule(every(1_000, T0 + 1_000)).unwrap();
    let mut consumer = store.consumer("S", 0).unwrap();
    for s in 1..=3 {
        clock.set_ms(T0 + 1_000 * s);
        assert_eq!(drain(&mut consumer, 1).len(), 1, "occurrence {s}");
    }
    // What a kill -9 now would leave.
    let image = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), image.path());
    store.close().unwrap();
    assert_eq!(
        numbers_in_queue(&Store::open(small_config(dir.path()).with_clock(clock.clone())).unwrap()),
        [1, 2, 3]
    );
    for (name, path) in [("reopened", dir.path()), ("killed", image.path())] {
        let store = Store::open(small_config(path).with_clock(clock.clone())).unwrap();
        let mut consumer = store.consumer("S", 0).unwrap();
        // After a kill the replay indexes the last occurrences again, in the background.
        let replayed = std::time::Instant::now() + Duration::from_secs(5);
        while consumer.queue_len() < 3 && std::time::Instant::now() < replayed {
            std::thread::sleep(Duration::from_millis(10));
        }
        consumer.seek(3);
        for s in 4..=6 {
            let got = until(&clock, &mut consumer, T0 + 1_000 * s, 1);
            assert_eq!(
                got.iter().map(|(at, o)| (*at, o.number)).collect::<Vec<_>>(),
                [(T0 + 1_000 * s, s)],
                "{name}"
            );
        }
        assert_eq!(numbers_in_queue(&store), [1, 2, 3, 4, 5, 6], "{name}: each once");
        store.close().unwrap();
        clock.set_ms(T0 + 3_000);
    }
}

/// Delivers the first occurrence (1 s after T0, every second), closes the
/// store, and reopens it at `reopen_at` with the policy's schedule.
fn closed_through(policy: MissedRuns, reopen_at: u64) -> (tempfile::TempDir, ManualClock, Store) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    store.schedule(every(1_000, T0 + 1_000).missed_runs(policy)).unwrap();
    let mut consumer = store.consumer("S", 0).unwrap();
    assert_eq!(until(&clock, &mut consumer, T0 + 1_000, 1).len(), 1);
    consumer.commit();
    store.close().unwrap();
    clock.set_ms(reopen_at);
    let store = store_at(dir.path(), &clock);
    (dir, clock, store)
}

/// What was delivered after the first occurrence, once there are `want`.
fn delivered(store: &Store, clock: &ManualClock, at: u64, want: usize) -> Vec<(u64, u64)> {
    let mut consumer = store.consumer("S", 0).unwrap();
    consumer.seek(1);
    let got = until(clock, &mut consumer, at, want);
    got.iter().map(|(at, o)| (*at, o.number)).collect()
}

#[test]
fn missed_occurrences_follow_the_policy_after_the_store_was_closed() {
    // Closed from T0 + 1 s to T0 + 10.5 s: 2 .. 10 were missed.
    let reopen = T0 + 10_500;
    let (_dir, clock, store) = closed_through(MissedRuns::FireOnce, reopen);
    // One stands for all missed (the armed one, 2, delivered late), then on schedule.
    assert_eq!(delivered(&store, &clock, reopen, 1), [(T0 + 2_000, 2)]);
    assert_eq!(delivered(&store, &clock, T0 + 11_000, 2), [(T0 + 2_000, 2), (T0 + 11_000, 3)]);
    store.close().unwrap();

    let (_dir, clock, store) = closed_through(MissedRuns::Skip, reopen);
    assert_eq!(delivered(&store, &clock, reopen, 1), [(T0 + 10_000, 2)], "only the one not missed");
    assert_eq!(delivered(&store, &clock, T0 + 11_000, 2), [(T0 + 10_000, 2), (T0 + 11_000, 3)]);
    store.close().unwrap();

    let window = MissedRuns::FireAll { window: Duration::from_secs(3) };
    let (_dir, clock, store) = closed_through(window, reopen);
    // The window reaches back to 7.5 s: 8, 9 and 10, in order.
    let caught_up: Vec<(u64, u64)> = (0..3).map(|i| (T0 + 8_000 + 1_000 * i, 2 + i)).collect();
    assert_eq!(delivered(&store, &clock, reopen, 3), caught_up, "those within the window, in order");
    store.close().unwrap();
}

#[test]
fn a_cron_schedule_fires_at_its_wall_time_in_its_zone() {
    let dir = tempfile::tempdir().unwrap();
    // 2023-11-14 22:13:20 UTC; 09:00 in Shanghai is 01:00 UTC.
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let recurrence = Recurrence::cron("0 0 9 * * *").in_time_zone("Asia/Shanghai");
    let receipt = store.schedule(Schedule::new(Message::new("S", "report").queue_id(0), recurrence)).unwrap();
    let first = 1_700_010_000_000; // 2023-11-15 01:00:00 UTC
    assert_eq!(receipt.first_occurrence_ms(), first);
    let mut consumer = store.consumer("S", 0).unwrap();
    let got = until(&clock, &mut consumer, first, 1);
    assert_eq!(
        got.iter().map(|(at, o)| (*at, o.number, o.next_at_ms)).collect::<Vec<_>>(),
        [(first, 1, Some(first + 86_400_000))]
    );
    assert_eq!(until(&clock, &mut consumer, first + 86_400_000, 1).len(), 1);
    store.close().unwrap();
}

#[test]
fn a_cancelled_schedule_delivers_nothing_more_also_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let handle = store.schedule(every(1_000, T0 + 1_000)).unwrap().handle();
    let plain = store.put(Message::new("S", "once").queue_id(1).deliver_at_ms(T0 + 50_000)).unwrap();
    let mut consumer = store.consumer("S", 0).unwrap();
    assert_eq!(until(&clock, &mut consumer, T0 + 2_000, 2).len(), 2);
    assert_eq!(store.cancel_schedule(handle).unwrap(), CancelOutcome::Cancelled);
    assert_eq!(store.cancel_schedule(handle).unwrap(), CancelOutcome::Cancelled, "again: the same answer");
    assert_eq!(
        store.cancel_schedule(plain.handle().unwrap()).unwrap(),
        CancelOutcome::NotFound,
        "not a schedule"
    );
    match store.reschedule(handle, T0 + 9_000) {
        Err(Error::Invalid { what: "handle", .. }) => {}
        other => panic!("a schedule's occurrence is not moved one by one: {other:?}"),
    }
    assert_eq!(until(&clock, &mut consumer, T0 + 10_000, 0), []);
    store.close().unwrap();
    let store = store_at(dir.path(), &clock);
    let mut consumer = store.consumer("S", 0).unwrap();
    consumer.seek(2);
    assert_eq!(until(&clock, &mut consumer, T0 + 20_000, 0), [], "still cancelled");
    store.close().unwrap();
}

#[test]
fn a_schedule_that_is_not_acceptable_is_refused_naming_the_field_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let log_bytes = store.fresh_stats().unwrap().log_bytes;
    let cron = |expr: &str| Schedule::new(Message::new("S", "b"), Recurrence::cron(expr));
    let cases = [
        (cron("0 0 25 * * *"), "cron"),
        (cron("0 0 0 30 2 *"), "cron"),
        (cron("0 0 9 * * *\nlimit=1"), "cron"),
        (
            Schedule::new(Message::new("S", "b"), Recurrence::cron("@daily").in_time_zone("Mars/Olympus")),
            "time_zone",
        ),
        (Schedule::new(Message::new("S", "b"), Recurrence::every(Duration::ZERO)), "every"),
        (every(1_000, T0).limit(0), "limit"),
        (every(1_000, T0).end_at_ms(T0 - 1), "end_at_ms"),
        (
            Schedule::new(Message::new("S", "b").delay(Duration::from_secs(1)), Recurrence::cron("@daily")),
            "template",
        ),
        (
            Schedule::new(Message::new("S", "b").property("dw.schedule", "x"), Recurrence::cron("@daily")),
            "template",
        ),
        (Schedule::new(Message::new("../S", "b"), Recurrence::cron("@daily")), "template"),
    ];
    for (schedule, field) in cases {
        match store.schedule(schedule) {
            Err(Error::Invalid { what, reason }) => assert_eq!(what, field, "{reason}"),
            other => panic!("{field}: {other:?}"),
        }
    }
    let stats = store.fresh_stats().unwrap();
    assert_eq!((stats.log_bytes, stats.pending), (log_bytes, 0), "nothing written");
    store.close().unwrap();
    let buckets = tempfile::tempdir().unwrap();
    let store = Store::open(Config::new(buckets.path()).with_scheduler(Scheduler::Buckets)).unwrap();
    match store.schedule(every(1_000, T0)) {
        Err(Error::Invalid { what: "scheduler", .. }) => {}
        other => panic!("{other:?}"),
    }
    store.close().unwrap();
}

#[test]
fn a_paused_schedule_delivers_nothing_until_resumed_then_goes_on_from_now() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let handle = store.schedule(every(1_000, T0 + 1_000)).unwrap().handle();
    let mut consumer = store.consumer("S", 0).unwrap();
    assert_eq!(until(&clock, &mut consumer, T0 + 2_000, 2).len(), 2);
    assert_eq!(store.pause_schedule(handle).unwrap(), PauseOutcome::Paused);
    assert_eq!(store.pause_schedule(handle).unwrap(), PauseOutcome::Unchanged);
    assert_eq!(until(&clock, &mut consumer, T0 + 9_000, 0), [], "paused");
    // Paused across a reopen too.
    store.close().unwrap();
    clock.set_ms(T0 + 20_500);
    let store = store_at(dir.path(), &clock);
    let mut consumer = store.consumer("S", 0).unwrap();
    consumer.seek(2);
    assert_eq!(until(&clock, &mut consumer, T0 + 20_500, 0), [], "still paused, nothing missed");
    assert_eq!(store.resume_schedule(handle).unwrap(), PauseOutcome::Resumed);
    assert_eq!(store.resume_schedule(handle).unwrap(), PauseOutcome::Unchanged);
    let got = until(&clock, &mut consumer, T0 + 22_000, 2);
    assert_eq!(
        got.iter().map(|(at, o)| (*at, o.number)).collect::<Vec<_>>(),
        [(T0 + 21_000, 3), (T0 + 22_000, 4)]
    );
    assert_eq!(store.cancel_schedule(handle).unwrap(), CancelOutcome::Cancelled);
    assert_eq!(store.pause_schedule(handle).unwrap(), PauseOutcome::Cancelled);
    let plain = store.put(Message::new("S", "once").queue_id(1).deliver_at_ms(T0 + 50_000)).unwrap();
    assert_eq!(store.pause_schedule(plain.handle().unwrap()).unwrap(), PauseOutcome::NotFound);
    store.close().unwrap();
}

#[test]
fn a_schedule_resumed_after_its_end_is_over() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let handle = store.schedule(every(1_000, T0 + 1_000).end_at_ms(T0 + 5_500)).unwrap().handle();
    assert_eq!(store.pause_schedule(handle).unwrap(), PauseOutcome::Paused);
    clock.set_ms(T0 + 10_000);
    assert_eq!(store.resume_schedule(handle).unwrap(), PauseOutcome::Over);
    assert_eq!(
        store.cancel_schedule(handle).unwrap(),
        CancelOutcome::Cancelled,
        "closed as a cancel closes it"
    );
    assert_eq!(store.fresh_stats().unwrap().pending, 0);
    store.close().unwrap();
}

#[test]
fn the_live_store_lists_its_schedules_with_their_next_occurrence_count_and_pause() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let ticking = store.schedule(every(1_000, T0 + 1_000)).unwrap().handle();
    let paused = store.schedule(every(1_000, T0 + 1_000)).unwrap().handle();
    let daily =
        Schedule::new(Message::new("R", "b"), Recurrence::cron("@daily").in_time_zone("Europe/London"));
    let daily = store.schedule(daily).unwrap().handle();
    store.put(Message::new("S", "plain").deliver_at_ms(T0 + 5_000)).unwrap();
    let mut consumer = store.consumer("S", 0).unwrap();
    assert_eq!(until(&clock, &mut consumer, T0 + 1_000, 2).len(), 2);
    assert_eq!(store.pause_schedule(paused).unwrap(), PauseOutcome::Paused);
    let listed = store.schedules(None, 10).unwrap();
    let seen: Vec<_> = listed
        .iter()
        .map(|t| {
            let s = t.schedule.as_ref().unwrap();
            (t.handle, t.deliver_at_ms, s.fired, s.paused)
        })
        .collect();
    assert_eq!(
        seen,
        [
            (ticking, T0 + 2_000, 1, false),
            (daily, 1_700_006_400_000, 0, false),
            (paused, delaywheel::MAX_DELIVER_AT_MS, 1, true)
        ],
        "by next occurrence, the paused one last, the plain timer left out"
    );
    let recurrence = listed[1].schedule.as_ref().unwrap().recurrence.clone();
    assert_eq!(recurrence, Some(Recurrence::cron("@daily").in_time_zone("Europe/London")));
    assert_eq!(store.schedules(Some("R"), 10).unwrap().len(), 1);
    assert_eq!(store.schedules(None, 1).unwrap().len(), 1);
    store.close().unwrap();
}

#[test]
fn one_schedule_is_found_by_handle_or_key_and_previews_its_next_occurrences() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let limited = store.schedule(every(1_000, T0 + 1_000).limit(3)).unwrap().handle();
    let other = Schedule::new(Message::new("S", "b").key("job-2"), Recurrence::every(Duration::from_secs(5)));
    let other = store.schedule(other).unwrap().handle();
    let plain = store.put(Message::new("S", "plain").key("job-1").deliver_at_ms(T0 + 500)).unwrap();
    let plain = plain.handle().unwrap();

    let found = store.schedule_of(limited).unwrap().expect("active");
    assert_eq!((found.handle, found.deliver_at_ms, found.schedule.unwrap().fired), (limited, T0 + 1_000, 0));
    assert_eq!(store.schedule_of(plain).unwrap(), None, "a plain timer is no schedule");
    let by_key: Vec<_> = store.schedules_by_key("S", "job-1", 10).unwrap().iter().map(|t| t.handle).collect();
    assert_eq!(by_key, [limited], "the plain timer with the same key is left out");
    assert!(store.schedules_by_key("S", "job-3", 10).unwrap().is_empty());
    assert_eq!(
        store.next_occurrences(limited, 10).unwrap(),
        [T0 + 1_000, T0 + 2_000, T0 + 3_000],
        "its limit"
    );
    assert_eq!(store.next_occurrences(other, 2).unwrap(), [T0 + 5_000, T0 + 10_000]);

    // After one occurrence: the preview starts at the next, the limit counts what was delivered.
    let mut consumer = store.consumer("S", 0).unwrap();
    assert_eq!(until(&clock, &mut consumer, T0 + 1_000, 1).len(), 1);
    assert_eq!(store.next_occurrences(limited, 10).unwrap(), [T0 + 2_000, T0 + 3_000]);
    assert_eq!(store.schedule_of(limited).unwrap().unwrap().schedule.unwrap().fired, 1);
    assert_eq!(store.pause_schedule(other).unwrap(), PauseOutcome::Paused);
    assert!(store.schedule_of(other).unwrap().unwrap().schedule.unwrap().paused);
    assert!(store.next_occurrences(other, 2).unwrap().is_empty(), "paused: nothing until resumed");
    assert_eq!(store.cancel_schedule(limited).unwrap(), CancelOutcome::Cancelled);
    assert_eq!(store.schedule_of(limited).unwrap(), None);
    assert!(store.next_occurrences(limited, 10).unwrap().is_empty());
    store.close().unwrap();
}

/// The schedules counted by a fresh look at the store.
fn counted(store: &Store) -> (u64, u64) {
    let schedules = store.fresh_stats().unwrap().schedules.expect("counted");
    (schedules.active, schedules.paused)
}

#[test]
fn active_and_paused_schedules_are_counted_and_the_counts_survive_a_reopen_a_recount_and_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let twice = store.schedule(every(1_000, T0 + 1_000).limit(2)).unwrap().handle();
    let cancelled = store.schedule(every(1_000, T0 + 1_000)).unwrap().handle();
    let paused = store.schedule(every(1_000, T0 + 1_000)).unwrap().handle();
    let resumed = store.schedule(every(1_000, T0 + 1_000)).unwrap().handle();
    let paused_then_cancelled = store.schedule(every(1_000, T0 + 1_000)).unwrap().handle();
    store.put(Message::new("S", "plain").deliver_at_ms(T0 + 60_000)).unwrap();
    assert_eq!(counted(&store), (5, 0));
    for handle in [paused, resumed, paused_then_cancelled] {
        assert_eq!(store.pause_schedule(handle).unwrap(), PauseOutcome::Paused);
    }
    assert_eq!(counted(&store), (5, 3));
    assert_eq!(store.resume_schedule(resumed).unwrap(), PauseOutcome::Resumed);
    assert_eq!(store.cancel_schedule(cancelled).unwrap(), CancelOutcome::Cancelled);
    assert_eq!(store.cancel_schedule(paused_then_cancelled).unwrap(), CancelOutcome::Cancelled);
    assert_eq!(counted(&store), (3, 1));
    let mut consumer = store.consumer("S", 0).unwrap();
    // `twice` and `resumed` fire at T0 + 1 s and + 2 s; `twice` ends with its second.
    assert_eq!(until(&clock, &mut consumer, T0 + 1_000, 2).len(), 2);
    assert_eq!(until(&clock, &mut consumer, T0 + 2_000, 2).len(), 2);
    assert_eq!(store.schedule_of(twice).unwrap(), None, "over");
    assert_eq!(counted(&store), (2, 1), "the resumed one and the paused one");
    let image = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), image.path());
    store.close().unwrap();

    let reopen = |path: &std::path::Path| Store::open(small_config(path).with_clock(clock.clone())).unwrap();
    let store = reopen(dir.path());
    assert_eq!(counted(&store), (2, 1), "reopened");
    store.close().unwrap();
    std::fs::remove_file(dir.path().join("index/topic_pending")).unwrap();
    let store = reopen(dir.path());
    assert_eq!(counted(&store), (2, 1), "recounted from the log");
    store.close().unwrap();
    let store = reopen(image.path());
    assert_eq!(counted(&store), (2, 1), "after a kill");
    store.close().unwrap();
}

#[test]
fn an_update_replaces_a_schedule_at_once_and_its_successor_goes_on_also_after_a_reopen_and_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let old = store.schedule(every(1_000, T0 + 1_000)).unwrap().handle();
    let mut consumer = store.consumer("S", 0).unwrap();
    assert_eq!(until(&clock, &mut consumer, T0 + 1_000, 1).len(), 1);
    assert_eq!(until(&clock, &mut consumer, T0 + 2_000, 1).len(), 1);

    // Every 5 s from T0 + 5 s, with a new body and key.
    clock.set_ms(T0 + 2_500);
    let new = Schedule::new(
        Message::new("S", "tock").queue_id(0).key("job-1b"),
        Recurrence::every(Duration::from_millis(5_000)),
    )
    .start_at_ms(T0);
    let UpdateOutcome::Updated(receipt) = store.update_schedule(old, new.clone()).unwrap() else {
        panic!("an active schedule is updated")
    };
    let new_handle = receipt.handle();
    assert_eq!(new_handle.deliver_at_ms, T0 + 5_000, "the first of the new recurrence from now");
    assert_eq!(store.schedule_of(old).unwrap(), None);
    assert_eq!(store.cancel_schedule(old).unwrap(), CancelOutcome::Cancelled, "the old handle is settled");
    assert_eq!(store.update_schedule(old, new.clone()).unwrap(), UpdateOutcome::Cancelled);
    assert_eq!(store.fresh_stats().unwrap().schedules.map(|s| s.active), Some(1));
    assert_eq!(store.schedules_by_key("S", "job-1b", 10).unwrap().len(), 1);

    // Nothing of the old at T0 + 3 s or 4 s; the new at 5 s, numbered from 1, with the new body.
    assert!(until(&clock, &mut consumer, T0 + 4_000, 0).is_empty(), "the old schedule is over");
    let got = {
        clock.set_ms(T0 + 5_000);
        drain(&mut consumer, 1)
    };
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].body()[..], b"tock");
    let o = got[0].occurrence().unwrap();
    assert_eq!((o.schedule, o.number, o.next_at_ms), (new_handle, 1, Some(T0 + 10_000)));

    let image = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), image.path());
    store.close().unwrap();
    for (name, path) in [("reopened", dir.path()), ("killed", image.path())] {
        let store = Store::open(small_config(path).with_clock(clock.clone())).unwrap();
        assert_eq!(store.schedule_of(old).unwrap(), None, "{name}");
        assert_eq!(store.fresh_stats().unwrap().schedules.map(|s| s.active), Some(1), "{name}");
        let mut consumer = store.consumer("S", 0).unwrap();
        let replayed = std::time::Instant::now() + Duration::from_secs(5);
        while consumer.queue_len() < 3 && std::time::Instant::now() < replayed {
            std::thread::sleep(Duration::from_millis(10));
        }
        consumer.seek(3);
        let got = until(&clock, &mut consumer, T0 + 10_000, 1);
        assert_eq!(
            got.iter().map(|(at, o)| (*at, o.schedule, o.number)).collect::<Vec<_>>(),
            [(T0 + 10_000, new_handle, 2)],
            "{name}"
        );
        store.close().unwrap();
        clock.set_ms(T0 + 5_000);
    }
}

#[test]
fn an_update_is_refused_for_another_topic_and_answers_for_what_is_no_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let old = store.schedule(every(1_000, T0 + 1_000).limit(1)).unwrap().handle();
    let elsewhere = Schedule::new(Message::new("T", "x"), Recurrence::every(Duration::from_secs(1)));
    let refused = store.update_schedule(old, elsewhere).unwrap_err();
    assert!(matches!(refused, Error::Invalid { what: "template", .. }), "{refused}");
    let bad = Schedule::new(Message::new("S", "x"), Recurrence::cron("61 * * * * *"));
    assert!(matches!(store.update_schedule(old, bad), Err(Error::Invalid { what: "cron", .. })));
    let plain = store.put(Message::new("S", "plain").deliver_at_ms(T0 + 9_000)).unwrap().handle().unwrap();
    assert_eq!(store.update_schedule(plain, every(1_000, T0)).unwrap(), UpdateOutcome::NotFound);
    let mut consumer = store.consumer("S", 0).unwrap();
    assert_eq!(until(&clock, &mut consumer, T0 + 1_000, 1).len(), 1, "its one occurrence");
    assert_eq!(store.update_schedule(old, every(1_000, T0)).unwrap(), UpdateOutcome::Over);
    assert_eq!(store.fresh_stats().unwrap().schedules.map(|s| s.active), Some(0), "nothing was written");
    store.close().unwrap();
}

#[test]
fn a_damaged_occurrence_entry_is_made_again_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    store.schedule(every(1_000, T0 + 1_000).limit(3)).unwrap();
    let mut consumer = store.consumer("S", 0).unwrap();
    for s in 1..=3 {
        assert_eq!(until(&clock, &mut consumer, T0 + 1_000 * s, 1).len(), 1);
    }
    store.close().unwrap();
    // Entry 1 (the second occurrence's, made from its occurrence record): a
    // flipped byte in its log offset (wheel-format.md: entry i at 32 + 32 i).
    let file = dir.path().join("consumequeue/S/0/00000000000000000000");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[32 + 32 + 2] ^= 0x10;
    std::fs::write(&file, bytes).unwrap();
    let store = store_at(dir.path(), &clock);
    let mut consumer = store.consumer("S", 0).unwrap();
    consumer.seek(0);
    let numbers: Vec<u64> =
        drain(&mut consumer, 3).iter().map(|m| m.occurrence().expect("an occurrence").number).collect();
    assert_eq!(numbers, [1, 2, 3]);
    store.close().unwrap();
}

/// The handles of schedules that fired many times find their armed timer
/// after a `kill -9`, read back from the pins snapshot (`timer/pins`) and
/// the ledger's entries after it: each lists the same next occurrence and
/// count as before, and a cancel stops it.
#[test]
fn schedules_restored_from_the_pins_snapshot_list_and_cancel_as_before_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(
        small_config(dir.path()).with_clock(clock.clone()).with_flush_interval(Duration::from_millis(20)),
    )
    .unwrap();
    let handles: Vec<_> = (0..40).map(|_| store.schedule(every(100, T0 + 100)).unwrap().handle()).collect();
    let mut consumer = store.consumer("S", 0).unwrap();
    let snapshot = dir.path().join("timer/pins");
    let mut now = T0;
    let waited = std::time::Instant::now();
    // Until the snapshot thread folded some occurrences, and some more fired since.
    let mut after_snapshot = 0;
    while after_snapshot < 20 {
        assert!(waited.elapsed() < Duration::from_secs(60), "no pins snapshot was written");
        now += 100;
        assert_eq!(until(&clock, &mut consumer, now, 40).len(), 40, "at {now}");
        if snapshot.exists() {
            after_snapshot += 1;
        }
    }
    let live: Vec<_> = handles.iter().map(|&h| store.schedule_of(h).unwrap().unwrap()).collect();
    let image = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), image.path());
    store.close().unwrap();

    let store = store_at(image.path(), &clock);
    for (&handle, before) in handles.iter().zip(&live) {
        let after = store.schedule_of(handle).unwrap().expect("still scheduled");
        assert_eq!(
            (after.deliver_at_ms, after.schedule.as_ref().unwrap().fired),
            (before.deliver_at_ms, before.schedule.as_ref().unwrap().fired),
            "the armed timer of {handle:?}"
        );
        assert_eq!(store.cancel_schedule(handle).unwrap(), CancelOutcome::Cancelled);
    }
    let mut consumer = store.consumer("S", 0).unwrap();
    consumer.seek(consumer.queue_len());
    assert_eq!(until(&clock, &mut consumer, now + 2_000, 0), [], "every schedule stopped");
    store.close().unwrap();
}

/// A schedule's record damaged after its timer was loaded (and checked) is
/// never delivered: read again as the timer fires, it does not read as a
/// schedule's, and the dispatcher, which checks the message of every
/// delivery it indexes, quarantines it.
#[test]
fn a_schedule_record_damaged_after_its_timer_was_loaded_is_quarantined_when_it_fires() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let handle = store.schedule(every(1_000, T0 + 5_000)).unwrap().handle();
    let mut consumer = store.consumer("S", 0).unwrap();
    // Second T0 + 5 s is read in (and its timers checked) during the second
    // before. (Were the damage to come first, loading would quarantine it:
    // the same outcome, so a slow machine makes this test weaker, never wrong.)
    clock.set_ms(T0 + 4_500);
    std::thread::sleep(Duration::from_millis(500));
    // A byte of its body flipped on disk: the log is mapped, so the store reads it.
    let segment = dir.path().join("commitlog").join(format!("{:020}", 0));
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&segment).unwrap();
    let at = handle.offset + 40;
    let mut byte = [0u8];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut byte, at).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[byte[0] ^ 0x10], at).unwrap();
    assert_eq!(until(&clock, &mut consumer, T0 + 7_000, 0), [], "nothing delivered");
    assert_eq!(store.stats().quarantined, 1);
    store.close().unwrap();
}

#[test]
fn a_schedule_is_listed_as_pending_at_every_instant_between_its_occurrences() {
    // The ticking thread fires an occurrence and writes the record arming
    // the next; the dispatcher hands that timer back to the wheel a moment
    // later. A listing, a count or the pending gauge asked in that moment
    // used to find neither.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let handle = store.schedule(every(1_000, T0 + 1_000)).unwrap().handle();
    let mut consumer = store.consumer("S", 0).unwrap();
    let mut missing = Vec::new();
    for n in 1..=500 {
        clock.set_ms(T0 + 1_000 * n);
        // The gauge, refreshed now: the refresh itself may fire the occurrence.
        let gauge = store.fresh_stats().unwrap().pending;
        if gauge != 1 {
            missing.push((n, "gauge", gauge));
        }
        let listed = store.pending(0..u64::MAX, 10).unwrap();
        if listed.len() != 1 || listed[0].handle != handle {
            missing.push((n, "listed", listed.len() as u64));
        }
        let counted = store.pending_counts(&[]).unwrap();
        if counted != [1] {
            missing.push((n, "counted", counted[0]));
        }
        // Each occurrence is delivered before the clock moves on.
        assert_eq!(drain_idle(&mut consumer, 1, Duration::from_secs(5)).len(), 1, "occurrence {n}");
    }
    assert_eq!(missing, [], "(occurrence, query, timers) where the schedule was not found once");
    store.close().unwrap();
}

#[test]
fn occurrences_that_fire_together_take_at_most_28_log_bytes_each() {
    // 1,000 schedules every second, all due at once: each second's
    // occurrences go as occurrences records of up to 256 entries (24 bytes
    // each), where one occurrence record each took 60 bytes.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let schedules = 1_000;
    let handles: Vec<_> = (0..schedules)
        .map(|i| {
            let schedule = Schedule::new(
                Message::new("S", format!("job-{i}")).queue_id(0),
                Recurrence::every(Duration::from_millis(1_000)),
            );
            store.schedule(schedule.start_at_ms(T0 + 1_000)).unwrap().handle()
        })
        .collect();
    let mut consumer = store.consumer("S", 0).unwrap();
    let written = store.fresh_stats().unwrap().log_bytes;
    let seconds = 4;
    let mut numbers = std::collections::HashMap::new();
    for second in 1..=seconds {
        let at = T0 + 1_000 * second;
        clock.set_ms(at);
        let got = drain_idle(&mut consumer, schedules, Duration::from_secs(5));
        assert_eq!(got.len(), schedules, "second {second}");
        for m in &got {
            let o = m.occurrence().expect("an occurrence");
            assert_eq!((m.deliver_at_ms(), o.next_at_ms), (Some(at), Some(at + 1_000)));
            numbers.entry(o.schedule).or_insert_with(Vec::new).push(o.number);
        }
    }
    let per_occurrence =
        (store.fresh_stats().unwrap().log_bytes - written) as f64 / (seconds * schedules as u64) as f64;
    assert!(per_occurrence <= 28.0, "{per_occurrence} log bytes per occurrence");
    assert_eq!(numbers.len(), schedules);
    assert!(handles.iter().all(|h| numbers[h] == [1, 2, 3, 4]), "each numbered in order, once");
    store.close().unwrap();
}
