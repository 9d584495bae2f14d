//! Retention through the public API, with a manual clock and 64 KiB segments:
//! old segments are deleted, pending timers are relocated once and still fire
//! exactly once at their millisecond, handles still cancel, consumers skip
//! what was deleted, and the size cap never deletes a pending timer.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use delaywheel::{
    CancelOutcome, Clock, Config, Consumer, Error, Handle, ManualClock, Message, Recurrence, ReplaceOutcome,
    RescheduleOutcome, Retention, Schedule, Stats, Store, UpdateOutcome,
};

const MINUTE: u64 = 60_000;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;
const YEAR: u64 = 365 * DAY;
const SEGMENT: u64 = 64 * 1024;
const FILLER: usize = 1_000;

fn config(dir: &std::path::Path, clock: &ManualClock, retention: Retention) -> Config {
    small_config(dir)
        .with_clock(clock.clone())
        .with_flush_interval(Duration::from_millis(5))
        .with_retention(retention)
}

fn keep_for(keep: Duration) -> Retention {
    Retention { keep_for: Some(keep), max_log_bytes: None, check_interval: Duration::from_secs(3600) }
}

/// Timers put and not yet seen delivered, by deliver time; and their handles.
#[derive(Default)]
struct Model {
    pending: BTreeMap<u64, Vec<String>>,
    handles: BTreeMap<String, Handle>,
}

impl Model {
    fn put(&mut self, store: &Store, body: String, at: u64) {
        let receipt = store.put(Message::new("T", body.clone()).queue_id(0).deliver_at_ms(at)).unwrap();
        self.handles.insert(body.clone(), receipt.handle().unwrap());
        self.pending.entry(at).or_default().push(body);
    }

    /// Moves the timer of `body`, due at `from`, to `to`.
    fn reschedule(&mut self, store: &Store, body: &str, from: u64, to: u64) {
        let handle = self.handles[body];
        assert_eq!(store.reschedule(handle, to).unwrap(), RescheduleOutcome::Rescheduled, "{body}");
        let due = self.pending.get_mut(&from).unwrap();
        due.retain(|b| b != body);
        if due.is_empty() {
            self.pending.remove(&from);
        }
        self.pending.entry(to).or_default().push(body.to_string());
    }

    fn cancel(&mut self, store: &Store, body: &str) {
        let handle = self.handles[body];
        assert_eq!(store.cancel(handle).unwrap(), CancelOutcome::Cancelled, "{body}");
        let due = self.pending.get_mut(&handle.deliver_at_ms).unwrap();
        due.retain(|b| b != body);
        if due.is_empty() {
            self.pending.remove(&handle.deliver_at_ms);
        }
    }

    /// Moves the clock to `target`, stopping at every deliver time on the way:
    /// each timer must arrive exactly then, once.
    fn advance_to(&mut self, clock: &ManualClock, consumer: &mut Consumer, target: u64) {
        while let Some((&due, _)) = self.pending.first_key_value().filter(|(due, _)| **due <= target) {
            let want = self.pending.remove(&due).unwrap();
            clock.set_ms(due);
            let got = drain(consumer, want.len());
            let mut got_bodies = bodies(&got);
            got_bodies.sort();
            let mut want = want;
            want.sort();
            assert_eq!(got_bodies, want, "due at {due}");
            for m in &got {
                assert_eq!(m.delivered_at_ms(), due, "{:?} fired at its millisecond", m.body());
            }
        }
        clock.set_ms(target);
        assert!(consumer.poll(1, Duration::from_millis(20)).unwrap().is_empty(), "nothing else fired");
    }
}

/// (original offset, deliver time) of every copy in the relocation index,
/// read from the file as `wheel-format.md` lays it out.
fn relocation_index(dir: &std::path::Path) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(dir.join("commitlog/relocated/index")).unwrap();
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    (32..bytes.len()).step_by(32).map(|at| (u64_at(at), u64_at(at + 8))).collect()
}

fn fill(store: &Store, round: usize) {
    for i in 0..100 {
        let body = format!("f{round}-{i}-{}", "x".repeat(FILLER));
        store.put(Message::new("F", body).queue_id(0)).unwrap();
    }
}

/// Lets the flusher checkpoint what was put, so retention's floor moves past it.
fn settle() {
    std::thread::sleep(Duration::from_millis(60));
}

/// Advances the clock a second at a time, settling and reclaiming, until
/// `done` holds for the store's stats or ten seconds have passed; returns
/// the last stats, for the caller to assert on.
fn reclaim_until(store: &Store, clock: &ManualClock, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        clock.advance_ms(1_000);
        settle();
        store.reclaim().unwrap();
        let stats = store.stats();
        if done(&stats) || std::time::Instant::now() > deadline {
            return stats;
        }
    }
}

#[test]
fn pending_timers_outlive_their_segments_and_fire_once_at_their_millisecond() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let mut store = Store::open(config(dir.path(), &clock, keep_for(Duration::from_secs(3600)))).unwrap();
    let mut consumer = store.consumer("T", 0).unwrap();
    let mut model = Model::default();
    let rounds = 24;
    let mut max_log_bytes = 0;
    // Counters restart with the store: what the first one did.
    let mut before_restart = (0, 0, 0);
    for round in 0..rounds {
        let now = clock.now_ms();
        model.put(&store, format!("minute-{round}"), now + MINUTE + round as u64);
        model.put(&store, format!("day-{round}"), now + DAY + round as u64);
        model.put(&store, format!("decade-{round}"), now + 10 * YEAR + round as u64);
        fill(&store, round);
        settle();
        model.advance_to(&clock, &mut consumer, now + 2 * HOUR);
        settle();
        store.reclaim().unwrap();
        max_log_bytes = max_log_bytes.max(store.stats().disk.commit_log);
        if round == rounds / 2 {
            // The relocation area and the wheel survive a restart.
            consumer.commit();
            drop(consumer);
            let r = store.stats().retention;
            before_restart = (r.segments_deleted, r.relocated_timers, r.deleted_unread);
            store.close().unwrap();
            store = Store::open(config(dir.path(), &clock, keep_for(Duration::from_secs(3600)))).unwrap();
            consumer = store.consumer("T", 0).unwrap();
        }
    }
    let r = store.stats().retention;
    let (deleted, relocated) = (before_restart.0 + r.segments_deleted, before_restart.1 + r.relocated_timers);
    let written = rounds as u64 * 100 * FILLER as u64;
    // Queue files that only pointed at deleted records went with them.
    let queue_file = 32 + 64 * 32;
    let queues = store.stats().disk.consume_queues;
    assert!(r.queue_files_deleted > 0, "{r:?}");
    assert!(
        queues <= 16 * queue_file,
        "{queues} bytes of consume queues for 2,400 fillers in 64-entry files"
    );
    // Segments of fillers only are deleted without a read: their counts said 0.
    let unread = before_restart.2 + r.deleted_unread;
    assert!(unread > 0 && unread < deleted, "{unread} of {deleted} deleted unread");
    assert!(deleted >= 30, "{deleted} segments deleted");
    assert!(
        max_log_bytes <= 8 * SEGMENT,
        "the log stays bounded: {max_log_bytes} bytes for {written} written"
    );
    // Every decade timer was pending when its segment went; the day timers
    // only if their segment went within the day. None was copied twice.
    let copies = relocation_index(dir.path());
    assert_eq!(copies.len() as u64, relocated);
    assert!(copies.windows(2).all(|w| w[0].0 < w[1].0), "no message was copied twice: {copies:?}");
    let decades = copies.iter().filter(|(_, at)| *at > T0 + YEAR).count();
    assert!(decades >= rounds - 2, "{decades} decade timers relocated: {copies:?}");

    // Handles from before the relocation still cancel.
    for round in [0, 5, 17] {
        model.cancel(&store, &format!("decade-{round}"));
    }
    let last = *model.pending.last_key_value().unwrap().0;
    model.advance_to(&clock, &mut consumer, last + 1);
    assert!(model.pending.is_empty());

    // Once a window of copies has passed (and the retention time after it),
    // its file goes, and the index forgets its copies.
    let relocated_before = store.stats().disk.relocated;
    clock.advance_ms(13 * DAY + 2 * HOUR);
    // Retention deletes a window once two checkpoints written after the
    // ticker crossed those 13 days vouch for it; on a slow machine that
    // takes more than one `settle`, so each second more gives it another.
    let stats = reclaim_until(&store, &clock, |s| s.disk.relocated < relocated_before / 4);
    assert!(stats.retention.windows_deleted > 0, "{:?}", stats.retention);
    assert!(
        stats.disk.relocated < relocated_before / 4,
        "{} of {relocated_before} bytes left",
        stats.disk.relocated
    );

    // The fillers nobody read were deleted: a consumer skips them and gets the rest.
    assert_eq!(store.stats().retention.consumer_skipped, 0, "the timer consumer kept up");
    let mut fillers = store.consumer("F", 0).unwrap();
    let got = drain_idle(&mut fillers, rounds * 100, Duration::from_millis(300));
    let skipped = store.stats().retention.consumer_skipped;
    assert!(skipped > 0);
    assert_eq!(got.len() as u64 + skipped, rounds as u64 * 100, "each filler read or skipped once");
}

/// A timer rescheduled past the time retention would keep its message for
/// (its segment is deleted, and its own deliver time says nothing needs it)
/// still fires, at its new time: its message is pinned and copied by that
/// time. A timer relocated before it was rescheduled fires at its new time
/// too, earlier or later than its window, which stays while it is pending;
/// both across a restart and a wheel rebuilt from the log.
#[test]
fn rescheduled_timers_keep_their_messages_through_retention() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let open = || Store::open(config(dir.path(), &clock, keep_for(Duration::from_secs(3600)))).unwrap();
    let mut store = open();
    let mut model = Model::default();
    model.put(&store, "minute-to-days".into(), T0 + MINUTE);
    model.put(&store, "day-to-weeks".into(), T0 + DAY);
    model.put(&store, "day-to-hours".into(), T0 + DAY + 1);
    model.reschedule(&store, "minute-to-days", T0 + MINUTE, T0 + 3 * DAY);
    let mut consumer = store.consumer("T", 0).unwrap();
    for round in 0..6 {
        fill(&store, round);
        settle();
        model.advance_to(&clock, &mut consumer, clock.now_ms() + 2 * HOUR);
        settle();
        clock.advance_ms(1_000);
        settle();
        store.reclaim().unwrap();
    }
    let relocated = relocation_index(dir.path());
    assert!(store.stats().retention.segments_deleted > 0);
    assert!(
        relocated.iter().any(|&(_, at)| at == T0 + 3 * DAY),
        "the rescheduled message was copied by its new time: {relocated:?}"
    );
    // Both day timers were relocated with their segment; now move them.
    assert!(
        relocated.iter().filter(|&&(_, at)| (T0 + DAY..=T0 + DAY + 1).contains(&at)).count() >= 2,
        "{relocated:?}"
    );
    model.reschedule(&store, "day-to-weeks", T0 + DAY, T0 + 20 * DAY);
    model.reschedule(&store, "day-to-hours", T0 + DAY + 1, clock.now_ms() + 3 * HOUR);
    consumer.commit();
    drop(consumer);
    store.close().unwrap();
    store = open();
    let mut consumer = store.consumer("T", 0).unwrap();
    let mut day = 0;
    while let Some(&next) = model.pending.keys().next() {
        fill(&store, 10 + day);
        settle();
        let step = (clock.now_ms() + DAY).min(next);
        model.advance_to(&clock, &mut consumer, step);
        settle();
        clock.advance_ms(1_000);
        settle();
        store.reclaim().unwrap();
        day += 1;
        if day == 10 {
            // Lose the wheel: the rebuild finds the relocated message and its
            // reschedule, and the pins come back from the cancel ledger.
            consumer.commit();
            drop(consumer);
            store.close().unwrap();
            std::fs::remove_dir_all(dir.path().join("timer")).unwrap();
            store = open();
            consumer = store.consumer_in_group("after-rebuild", "T", 0).unwrap();
            let _ = drain_idle(&mut consumer, usize::MAX, Duration::from_millis(300));
        }
    }
    assert!(day > 10, "the rebuild ran");
    assert!(store.pending(0..u64::MAX, 10).unwrap().is_empty(), "each fired once, at its new time");
}

/// A store whose log is capped at six segments (retention runs when a
/// write waits for room, not on its own), which waits `put_timeout` for room.
fn capped_store(dir: &std::path::Path, clock: &ManualClock, put_timeout: Duration) -> Store {
    let retention = Retention {
        keep_for: None,
        max_log_bytes: Some(6 * SEGMENT),
        check_interval: Duration::from_secs(3600),
    };
    Store::open(config(dir, clock, retention).with_put_timeout(put_timeout)).unwrap()
}

/// What fires once the clock is at `at_ms`, of the messages of `T` whose
/// bodies start with `prefix`: each body up to its second `-`.
fn fired_starting_with(store: &Store, clock: &ManualClock, at_ms: u64, prefix: &str) -> Vec<String> {
    let mut consumer = store.consumer("T", 0).unwrap();
    let _ = drain_idle(&mut consumer, usize::MAX, Duration::from_millis(300));
    clock.set_ms(at_ms);
    let got = drain_idle(&mut consumer, usize::MAX, Duration::from_millis(1_000));
    (bodies(&got).into_iter())
        .filter(|body| body.starts_with(prefix))
        .map(|body| body.split_inclusive('-').take(2).collect())
        .collect()
}

/// Puts ordinary messages, which retention may delete, past the log's cap.
fn fill_past_the_cap(store: &Store) {
    for i in 0..8 * SEGMENT / FILLER as u64 {
        store.put(Message::new("T", format!("filler-{i}-{}", "f".repeat(FILLER))).queue_id(0)).unwrap();
    }
}

/// At the size cap a replacement (`put_replacing`) waits for retention to
/// make room, as a put does, rather than fail at once: the log is full of
/// ordinary messages retention may delete, and replacements of one timer go
/// on past several segment boundaries, each of which needs an old segment deleted.
#[test]
fn a_replacement_at_the_size_cap_waits_for_room_as_a_put_does() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = capped_store(dir.path(), &clock, Duration::from_secs(10));
    let reminder = |i: u64| {
        let body = format!("reminder-{i}-{}", "r".repeat(FILLER));
        Message::new("T", body).queue_id(0).dedup_key("cart-7").deliver_at_ms(T0 + HOUR + i)
    };
    store.put(reminder(0)).unwrap();
    fill_past_the_cap(&store);
    let replacements = 3 * SEGMENT / FILLER as u64;
    for i in 1..=replacements {
        let outcome = store.put_replacing(reminder(i)).unwrap_or_else(|e| panic!("replacement {i}: {e}"));
        assert!(matches!(outcome, ReplaceOutcome::Replaced { .. }), "{i}: {outcome:?}");
    }
    assert!(store.stats().retention.segments_deleted > 0, "retention made room");
    let fired = fired_starting_with(&store, &clock, T0 + 2 * HOUR, "reminder-");
    assert_eq!(fired, [format!("reminder-{replacements}-")], "only the last replacement fires, once");
    store.close().unwrap();
}

/// The same for a schedule's updates: each writes the whole schedule
/// record again, and at the cap waits for room as a put does.
#[test]
fn a_schedule_update_at_the_size_cap_waits_for_room_as_a_put_does() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = capped_store(dir.path(), &clock, Duration::from_secs(10));
    let hourly = |i: u64| {
        let body = format!("report-{i}-{}", "r".repeat(FILLER));
        let every = Recurrence::every(Duration::from_millis(HOUR + i));
        Schedule::new(Message::new("T", body).queue_id(0), every)
    };
    let mut handle = store.schedule(hourly(0)).unwrap().handle();
    fill_past_the_cap(&store);
    let updates = 3 * SEGMENT / FILLER as u64;
    for i in 1..=updates {
        match store.update_schedule(handle, hourly(i)).unwrap_or_else(|e| panic!("update {i}: {e}")) {
            UpdateOutcome::Updated(receipt) => handle = receipt.handle(),
            other => panic!("update {i}: {other:?}"),
        }
    }
    assert!(store.stats().retention.segments_deleted > 0, "retention made room");
    assert_eq!(store.schedule_of(handle).unwrap().map(|s| s.handle), Some(handle));
    let fired = fired_starting_with(&store, &clock, T0 + 2 * HOUR, "report-");
    assert_eq!(fired, [format!("report-{updates}-")], "only the last update's schedule fires, once");
    store.close().unwrap();
}

#[test]
fn the_size_cap_refuses_puts_rather_than_delete_a_pending_timer() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = capped_store(dir.path(), &clock, Duration::from_millis(300));
    // Only far timers: every byte retention could reclaim must be relocated,
    // and the copies count against the cap too.
    let mut put = 0;
    let err = loop {
        let body = format!("far-{put}-{}", "y".repeat(FILLER));
        match store.put(Message::new("T", body).queue_id(0).deliver_at_ms(T0 + YEAR + put)) {
            Ok(_) => put += 1,
            Err(e) => break e,
        }
        if put % 50 == 0 {
            settle();
        }
        assert!(put < 10_000, "the cap never bit");
    };
    assert!(matches!(err, Error::SizeCap { .. }), "{err}");
    assert!(err.to_string().contains("size cap"), "{err}");
    let stats = store.stats();
    assert!(stats.disk.commit_log + stats.disk.relocated <= 6 * SEGMENT + SEGMENT, "{:?}", stats.disk);

    // Every acknowledged timer is still there and fires once.
    clock.set_ms(T0 + YEAR + put);
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = drain(&mut consumer, put as usize);
    let mut seen: Vec<u64> = got.iter().map(|m| m.deliver_at_ms().unwrap() - T0 - YEAR).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..put).collect::<Vec<_>>());
}

#[test]
fn a_wheel_rebuilt_from_the_log_finds_relocated_timers_and_their_cancels() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let open = || Store::open(config(dir.path(), &clock, keep_for(Duration::from_secs(3600)))).unwrap();
    let store = open();
    let mut model = Model::default();
    model.put(&store, "kept".into(), T0 + 10 * YEAR);
    model.put(&store, "cancelled".into(), T0 + 10 * YEAR + 1);
    // Fires before its segment goes: the delivery record outlives the message.
    model.put(&store, "fired".into(), T0 + MINUTE);
    fill(&store, 0);
    model.cancel(&store, "cancelled");
    fill(&store, 1);
    fill(&store, 2);
    let mut consumer = store.consumer("T", 0).unwrap();
    model.advance_to(&clock, &mut consumer, T0 + MINUTE);
    consumer.commit();
    drop(consumer);
    settle();
    clock.set_ms(T0 + 2 * HOUR);
    settle();
    // A second checkpoint at the new time: retention goes by the older of two.
    let stats = reclaim_until(&store, &clock, |s| s.retention.segments_deleted > 0);
    assert!(stats.retention.segments_deleted > 0);
    let copies = relocation_index(dir.path());
    assert_eq!(
        copies.iter().map(|(_, at)| at - T0 - 10 * YEAR).collect::<Vec<_>>(),
        [0, 1, 1],
        "both timers and the cancel were relocated: {copies:?}"
    );
    store.close().unwrap();

    // Lose the wheel: it is rebuilt from the log, which no longer holds them
    // (nor the fired timer's message, whose delivery record it replays).
    std::fs::remove_dir_all(dir.path().join("timer")).unwrap();
    let store = open();
    // The queues were rebuilt too, without the fired timer's entry (its topic
    // went with its message): positions shifted, so read them from the start.
    let mut consumer = store.consumer_in_group("after-rebuild", "T", 0).unwrap();
    model.advance_to(&clock, &mut consumer, T0 + 10 * YEAR + 2_000);
    assert!(model.pending.is_empty());
}

/// A schedule whose record retention relocated, its occurrence overdue
/// when the wheel is rebuilt: restored into a second already loaded, it
/// still arms the next occurrence when it fires (it went out as a plain
/// delivery, and the schedule ended, before the ticker learnt such timers).
#[test]
fn a_relocated_schedule_overdue_at_a_rebuild_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let open = || Store::open(config(dir.path(), &clock, keep_for(Duration::from_secs(3600)))).unwrap();
    let store = open();
    let daily =
        Schedule::new(Message::new("T", "daily").queue_id(0), Recurrence::every(Duration::from_millis(DAY)))
            .start_at_ms(T0 + DAY);
    let handle = store.schedule(daily).unwrap().handle();
    for round in 0..3 {
        fill(&store, round);
    }
    settle();
    clock.set_ms(T0 + 2 * HOUR);
    settle();
    let stats = reclaim_until(&store, &clock, |s| s.retention.segments_deleted > 0);
    assert!(stats.retention.segments_deleted > 0);
    assert!(relocation_index(dir.path()).iter().any(|&(offset, _)| offset == handle.offset), "relocated");
    store.close().unwrap();

    // The wheel is lost, and the store reopens half an hour after the first occurrence.
    std::fs::remove_dir_all(dir.path().join("timer")).unwrap();
    clock.set_ms(T0 + DAY + 30 * MINUTE);
    let store = open();
    let mut consumer = store.consumer_in_group("after-rebuild", "T", 0).unwrap();
    let got = drain(&mut consumer, 1);
    let occurrence = got.first().and_then(|m| m.occurrence()).copied().expect("the first occurrence");
    assert_eq!((occurrence.number, occurrence.next_at_ms), (1, Some(T0 + 2 * DAY)), "the schedule goes on");
    clock.set_ms(T0 + 2 * DAY);
    let got = drain(&mut consumer, 1);
    assert_eq!(got.first().and_then(|m| m.occurrence()).map(|o| o.number), Some(2));
    store.close().unwrap();
}

/// A paused schedule whose record and pause record retention relocated is
/// counted, active and paused, also when the counts are made again from a
/// log that no longer holds either record.
#[test]
fn a_relocated_paused_schedule_is_counted_after_a_recount() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let open = || Store::open(config(dir.path(), &clock, keep_for(Duration::from_secs(3600)))).unwrap();
    let store = open();
    let daily =
        Schedule::new(Message::new("T", "daily").queue_id(0), Recurrence::every(Duration::from_millis(DAY)))
            .start_at_ms(T0 + DAY);
    let handle = store.schedule(daily).unwrap().handle();
    assert_eq!(store.pause_schedule(handle).unwrap(), delaywheel::PauseOutcome::Paused);
    for round in 0..3 {
        fill(&store, round);
    }
    settle();
    clock.set_ms(T0 + 2 * HOUR);
    settle();
    let stats = reclaim_until(&store, &clock, |s| s.retention.segments_deleted > 0);
    assert!(stats.retention.segments_deleted > 0);
    let relocated = relocation_index(dir.path());
    assert!(relocated.len() >= 2, "the schedule's record and its pause: {relocated:?}");
    let counted = |store: &Store| store.fresh_stats().unwrap().schedules.map(|s| (s.active, s.paused));
    assert_eq!(counted(&store), Some((1, 1)));
    store.close().unwrap();
    std::fs::remove_file(dir.path().join("index/topic_pending")).unwrap();
    let store = open();
    assert_eq!(counted(&store), Some((1, 1)), "recounted with the relocated records");
    assert_eq!(store.resume_schedule(handle).unwrap(), delaywheel::PauseOutcome::Resumed);
    assert_eq!(counted(&store), Some((1, 0)));
    store.close().unwrap();
}

#[test]
fn a_timer_that_fires_late_after_downtime_stays_readable_for_the_retention_time() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let open = || Store::open(config(dir.path(), &clock, keep_for(Duration::from_secs(3600)))).unwrap();
    let store = open();
    store.put(Message::new("T", "overdue").queue_id(0).deliver_at_ms(T0 + MINUTE)).unwrap();
    for round in 0..3 {
        fill(&store, round);
    }
    settle();
    store.close().unwrap();
    // A day of downtime, and the wheel lost: it is rebuilt from the log, and
    // the timer fires at the open, a day late.
    std::fs::remove_dir_all(dir.path().join("timer")).unwrap();
    clock.set_ms(T0 + DAY);
    let store = open();
    settle();
    clock.advance_ms(1_000);
    settle();
    store.reclaim().unwrap();
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = drain(&mut consumer, 1);
    assert_eq!(bodies(&got), ["overdue"], "{:?}", store.stats().retention);
    assert_eq!(store.stats().retention.consumer_skipped, 0);
}

/// The key index keeps finding a relocated timer by its key, and its files
/// go once every message they name is gone.
#[test]
fn the_key_index_follows_retention() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let config =
        config(dir.path(), &clock, keep_for(Duration::from_secs(3600))).with_key_index_file_entries(2);
    let store = Store::open(config.clone()).unwrap();
    let keyed = |key: &str, at: u64| {
        let m = Message::new("T", key.to_string()).key(key).queue_id(0).deliver_at_ms(at);
        store.put(m).unwrap().handle().unwrap()
    };
    let decades = [keyed("d0", T0 + 10 * YEAR), keyed("d1", T0 + 10 * YEAR + 1)];
    let mut consumer = store.consumer("T", 0).unwrap();
    let files = || -> std::collections::BTreeSet<std::ffi::OsString> {
        std::fs::read_dir(dir.path().join("index/keys")).unwrap().map(|e| e.unwrap().file_name()).collect()
    };
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..12 {
        keyed(&format!("m{round}"), clock.now_ms() + MINUTE);
        seen.extend(files());
        fill(&store, round);
        settle();
        clock.advance_ms(2 * HOUR);
        assert_eq!(drain(&mut consumer, 1).len(), 1, "m{round} fired");
        settle();
        clock.advance_ms(1_000);
        settle();
        store.reclaim().unwrap();
    }
    // The last round's files go once checkpoints vouch for its deliveries.
    reclaim_until(&store, &clock, |_| files().len() <= 2);
    assert!(store.stats().retention.segments_deleted > 0);
    assert!(!relocation_index(dir.path()).is_empty());
    for (key, handle) in ["d0", "d1"].into_iter().zip(decades) {
        let found = store.pending_by_key("T", key, usize::MAX).unwrap();
        assert_eq!(found.iter().map(|p| p.handle).collect::<Vec<_>>(), [handle], "{key}, relocated");
    }
    assert!(store.pending_by_key("T", "m0", usize::MAX).unwrap().is_empty(), "fired");
    let left = files();
    assert_eq!(left.len(), 2, "{left:?} of {seen:?}: the first (relocated timers) and the newest stay");
    assert_eq!(left.first(), seen.first());
    assert!(seen.len() >= 6, "{seen:?}");
    assert!(store.stats().disk.key_index > 0);
    let counted = |store: &Store| store.fresh_stats().unwrap().pending_by_topic;
    assert_eq!(counted(&store), [("T".to_string(), 2)], "the two relocated timers");
    drop(consumer);
    store.close().unwrap();
    // Recounted: the relocated timers' messages are below the oldest segment.
    std::fs::remove_file(dir.path().join("index/topic_pending")).unwrap();
    let store = Store::open(config).unwrap();
    assert_eq!(counted(&store), [("T".to_string(), 2)], "recounted with the relocated timers");
    store.close().unwrap();
}

/// A damaged record in the oldest segment costs its own timer, not the
/// retention of the whole log: the copy pass steps over it as every walker
/// does (it used to fail at it at every pass, and the segment stayed).
#[test]
fn a_damaged_record_does_not_stop_retention() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let open = || Store::open(config(dir.path(), &clock, keep_for(Duration::from_secs(3600)))).unwrap();
    let store = open();
    let far: Vec<_> = (0..5)
        .map(|i| {
            store.put(Message::new("T", format!("far{i}")).queue_id(0).deliver_at_ms(T0 + YEAR)).unwrap()
        })
        .collect();
    for round in 0..3 {
        fill(&store, round);
    }
    settle();
    store.close().unwrap();
    let victim = far[2].offset();
    let segment = dir.path().join("commitlog").join(format!("{:020}", 0));
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[victim as usize + 30] ^= 0x01;
    std::fs::write(&segment, bytes).unwrap();

    let store = open();
    clock.set_ms(T0 + DAY);
    let stats = reclaim_until(&store, &clock, |s| s.retention.segments_deleted > 0);
    assert!(stats.retention.segments_deleted > 0, "{:?}", stats.retention);
    assert_eq!(
        stats.retention.relocated_timers, 4,
        "every pending timer but the damaged one: {:?}",
        stats.retention
    );
    assert_eq!(stats.damaged_log_spans, 1);
}

/// Occurrences that fired together share an occurrences record, whose
/// entries name the schedules' next timers. Retention copies the record
/// whole while those are pending; a wheel rebuilt from the log finds them
/// in the copy, and the consumer follows the next occurrences' records
/// back to it: each schedule goes on, every occurrence delivered once.
#[test]
fn an_occurrences_record_outlives_its_segment_and_its_schedules_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let open = || Store::open(config(dir.path(), &clock, keep_for(Duration::from_secs(1_800)))).unwrap();
    let store = open();
    let hourly = |name: &str| {
        let every = Recurrence::every(Duration::from_millis(HOUR));
        Schedule::new(Message::new("T", name.to_string()).queue_id(0), every).start_at_ms(T0 + MINUTE)
    };
    let handles =
        [store.schedule(hourly("a")).unwrap().handle(), store.schedule(hourly("b")).unwrap().handle()];
    let numbers = |got: &[delaywheel::ConsumedMessage]| {
        let mut seen: Vec<(String, u64, Option<u64>)> = (got.iter())
            .map(|m| {
                let o = m.occurrence().expect("an occurrence");
                (String::from_utf8(m.body().to_vec()).unwrap(), o.number, o.next_at_ms)
            })
            .collect();
        seen.sort();
        seen
    };
    let mut consumer = store.consumer_in_group("first", "T", 0).unwrap();
    clock.set_ms(T0 + MINUTE);
    let next = Some(T0 + MINUTE + HOUR);
    assert_eq!(numbers(&drain(&mut consumer, 2)), [("a".into(), 1, next), ("b".into(), 1, next)]);
    for round in 0..3 {
        fill(&store, round);
    }
    settle();
    // Past the retention time of what was written then, before the next occurrences.
    clock.set_ms(T0 + MINUTE + 31 * MINUTE);
    settle();
    let stats = reclaim_until(&store, &clock, |s| s.retention.segments_deleted > 0);
    assert!(stats.retention.segments_deleted > 0);
    assert!(clock.now_ms() < T0 + MINUTE + HOUR, "reclaimed before the next occurrences");
    let copies = relocation_index(dir.path());
    let copied = |offset: u64, at: u64| copies.contains(&(offset, at));
    assert!(handles.iter().all(|h| copies.iter().any(|&(offset, _)| offset == h.offset)), "{copies:?}");
    let record = copies.iter().find(|&&(offset, _)| handles.iter().all(|h| h.offset != offset));
    assert!(record.is_some_and(|&(offset, _)| copied(offset, T0 + MINUTE + HOUR)), "{copies:?}");
    // A handle (the caller's word) naming any byte of the copied record is no schedule's.
    let (record, _) = *record.unwrap();
    for offset in record..record + 72 {
        let bogus = Handle { offset, deliver_at_ms: T0 + MINUTE + HOUR };
        assert!(!matches!(store.schedule_of(bogus), Ok(Some(_))), "{offset}");
        assert!(!matches!(store.cancel_schedule(bogus), Ok(CancelOutcome::Cancelled)), "{offset}");
    }
    store.close().unwrap();

    // The wheel is lost: rebuilt from the log and the copies.
    std::fs::remove_dir_all(dir.path().join("timer")).unwrap();
    let store = open();
    let mut consumer = store.consumer_in_group("after-rebuild", "T", 0).unwrap();
    let _ = drain_idle(&mut consumer, usize::MAX, Duration::from_millis(200));
    clock.set_ms(T0 + MINUTE + HOUR);
    let next = Some(T0 + MINUTE + 2 * HOUR);
    assert_eq!(numbers(&drain(&mut consumer, 2)), [("a".into(), 2, next), ("b".into(), 2, next)]);
    clock.set_ms(T0 + MINUTE + 2 * HOUR);
    let next = Some(T0 + MINUTE + 3 * HOUR);
    assert_eq!(numbers(&drain(&mut consumer, 2)), [("a".into(), 3, next), ("b".into(), 3, next)]);
    assert!(consumer.poll(1, Duration::from_millis(200)).unwrap().is_empty(), "each once");
    for handle in handles {
        let listed = store.schedule_of(handle).unwrap().expect("still scheduled");
        assert_eq!(listed.deliver_at_ms, T0 + MINUTE + 3 * HOUR);
    }
    store.close().unwrap();
}
