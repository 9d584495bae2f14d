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
    assert_eq!((&*retry.topic, retry.delay_level, retry.deliver_at_ms), ("retries", Some(3), T0 + 10_000));
    let first = &all[0];
    assert_eq!((&*first.topic, first.queue, first.handle), ("orders", 1, handles[4]));

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

/// The keys of the timers `pending_by_key` answers, with their deliver times.
fn by_key(store: &Store, topic: &str, key: &str) -> Vec<(delaywheel::Handle, u64)> {
    store
        .pending_by_key(topic, key, usize::MAX)
        .unwrap()
        .iter()
        .map(|p| (p.handle, p.deliver_at_ms))
        .collect()
}

#[test]
fn pending_by_key_answers_a_keys_pending_timers_through_cancel_reschedule_and_firing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let put = |topic: &str, key: &str, ahead: u64| {
        let m = Message::new(topic, "b").key(key).queue_id(0).deliver_at_ms(T0 + ahead);
        store.put(m).unwrap().handle().unwrap()
    };
    let soon = put("orders", "order-42", 5_000);
    let month = put("orders", "order-42", 30 * 24 * HOUR);
    let decade = put("orders", "order-42", 10 * YEAR);
    let other_topic = put("payments", "order-42", 5_000);
    let other_key = put("orders", "order-43", 5_000);
    store.put(Message::new("orders", "now, not timed").key("order-42").queue_id(0)).unwrap();
    for i in 0..500 {
        put("orders", &format!("noise-{i}"), 1_000 + i);
    }
    assert_eq!(
        by_key(&store, "orders", "order-42"),
        [(soon, T0 + 5_000), (month, T0 + 30 * 24 * HOUR), (decade, T0 + 10 * YEAR)],
        "every level, by deliver time; the same key in another topic is another key"
    );
    let first_two: Vec<_> =
        store.pending_by_key("orders", "order-42", 2).unwrap().iter().map(|p| p.handle).collect();
    assert_eq!(first_two, [soon, month], "a limit answers the soonest");
    assert_eq!(by_key(&store, "payments", "order-42"), [(other_topic, T0 + 5_000)]);
    assert_eq!(by_key(&store, "orders", "order-43"), [(other_key, T0 + 5_000)]);
    assert!(by_key(&store, "orders", "order-44").is_empty());
    let described = store.pending_by_key("orders", "order-42", usize::MAX).unwrap();
    assert_eq!(
        (&*described[2].topic, described[2].key.as_deref(), described[2].wheel_level),
        ("orders", Some("order-42"), 2)
    );

    assert_eq!(store.cancel(month).unwrap(), CancelOutcome::Cancelled);
    assert_eq!(store.reschedule(decade, T0 + 2 * HOUR).unwrap(), delaywheel::RescheduleOutcome::Rescheduled);
    assert_eq!(
        by_key(&store, "orders", "order-42"),
        [(soon, T0 + 5_000), (decade, T0 + 2 * HOUR)],
        "the cancelled one is gone; the rescheduled one keeps its handle, at its new time"
    );
    clock.set_ms(T0 + 6_000);
    let mut consumer = store.consumer("orders", 0).unwrap();
    assert_eq!(drain(&mut consumer, 503).len(), 503, "the noise, the untimed one, soon and order-43");
    assert_eq!(by_key(&store, "orders", "order-42"), [(decade, T0 + 2 * HOUR)], "a fired timer is gone");
    store.close().unwrap();

    let store = store_at(dir.path(), &clock);
    assert_eq!(by_key(&store, "orders", "order-42"), [(decade, T0 + 2 * HOUR)], "the same after a reopen");
    store.close().unwrap();
}

/// Every key's answer, for comparing stores.
fn answers_by_key(store: &Store, keys: usize) -> Vec<Vec<(delaywheel::Handle, u64)>> {
    (0..keys).map(|k| by_key(store, "orders", &format!("k{k}"))).collect()
}

fn key_index_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> =
        std::fs::read_dir(dir.join("index/keys")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

fn flip(path: &std::path::Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

/// The key index is an index of the log: a crash cuts what the replay
/// indexes again, and a missing or damaged index is rebuilt from the log.
#[test]
fn the_key_index_survives_a_crash_and_is_rebuilt_when_missing_or_damaged() {
    const PER_FILE: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let config = |dir: &std::path::Path| {
        no_periodic_flush(dir).with_clock(clock.clone()).with_key_index_file_entries(PER_FILE as u64)
    };
    let store = Store::open(config(dir.path())).unwrap();
    let mut handles = Vec::new();
    for i in 0..20u64 {
        let m = Message::new("orders", "b").key(format!("k{}", i % 5)).deliver_at_ms(T0 + HOUR + i);
        handles.push(store.put(m).unwrap().handle().unwrap());
    }
    store.close().unwrap();
    let store = Store::open(config(dir.path())).unwrap();
    for i in 20..30u64 {
        let m = Message::new("orders", "b").key(format!("k{}", i % 5)).deliver_at_ms(T0 + HOUR + i);
        handles.push(store.put(m).unwrap().handle().unwrap());
    }
    assert_eq!(store.cancel(handles[7]).unwrap(), CancelOutcome::Cancelled);
    let want = answers_by_key(&store, 5);
    assert_eq!(want.iter().map(Vec::len).sum::<usize>(), 29);
    assert_eq!(want[2][0], (handles[2], T0 + HOUR + 2));
    // Killed now: ten entries lie past the checkpoint the reopen resumes at.
    let crashed = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), crashed.path());
    store.close().unwrap();
    let store = Store::open(config(crashed.path())).unwrap();
    assert_eq!(answers_by_key(&store, 5), want, "after a crash: cut and indexed again, not twice");
    store.close().unwrap();

    let files = key_index_files(dir.path());
    assert_eq!(files.len(), 4, "{files:?}: 30 entries, 8 per file");
    std::fs::remove_dir_all(dir.path().join("index/keys")).unwrap();
    let store = Store::open(config(dir.path())).unwrap();
    assert_eq!(answers_by_key(&store, 5), want, "rebuilt from the log");
    store.close().unwrap();
    assert_eq!(key_index_files(dir.path()), files, "the same files");

    flip(&files[0], 9);
    let store = Store::open(config(dir.path())).unwrap();
    assert_eq!(answers_by_key(&store, 5), want, "a damaged header: rebuilt");
    store.close().unwrap();

    // The newest file holds entries 24..30 (after one bucket head: files of
    // 8 entries have one bucket per 64 entries, at least one): damage its second.
    let second_entry = 32 + 4 + 20;
    flip(files.last().unwrap(), second_entry + 3);
    let store = Store::open(config(dir.path())).unwrap();
    assert_eq!(answers_by_key(&store, 5), want, "a damaged entry before good ones: rebuilt");
    store.close().unwrap();
}

fn by_topic(store: &Store) -> (Vec<(String, u64)>, u64) {
    let stats = store.fresh_stats().unwrap();
    (stats.pending_by_topic, stats.pending_other_topics)
}

fn counted(pairs: &[(&str, u64)], other: u64) -> (Vec<(String, u64)>, u64) {
    (pairs.iter().map(|&(t, n)| (t.to_string(), n)).collect(), other)
}

/// `Stats::pending_by_topic`: the topics with the most pending timers and
/// the rest summed, through cancel, reschedule, firing and reopens (from
/// the counts file, or recounted without one).
#[test]
fn stats_count_pending_timers_per_topic_bounded_by_the_busiest() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let put = |store: &Store, topic: &str, ahead: u64| {
        store.put(Message::new(topic, "b").queue_id(0).deliver_at_ms(T0 + ahead)).unwrap().handle().unwrap()
    };
    let orders: Vec<_> = (0..5).map(|i| put(&store, "orders", HOUR + i)).collect();
    put(&store, "payments", 5_000);
    put(&store, "payments", 10 * YEAR);
    put(&store, "payments", 5_000);
    for t in 0..20 {
        put(&store, &format!("t{t:02}"), 30 * 24 * HOUR);
    }
    store.put(Message::new("orders", "not timed").queue_id(0)).unwrap();
    let mut want = vec![("orders", 5), ("payments", 3)];
    let ones: Vec<String> = (0..20).map(|t| format!("t{t:02}")).collect();
    want.extend(ones.iter().take(14).map(|t| (t.as_str(), 1)));
    assert_eq!(by_topic(&store), counted(&want, 6), "16 topics, most first (then by name), and the rest");

    assert_eq!(store.cancel(orders[0]).unwrap(), CancelOutcome::Cancelled);
    assert_eq!(
        store.cancel(orders[0]).unwrap(),
        CancelOutcome::Cancelled,
        "a repeated cancel settles nothing more"
    );
    assert_eq!(
        store.reschedule(orders[1], T0 + 20 * YEAR).unwrap(),
        delaywheel::RescheduleOutcome::Rescheduled
    );
    clock.set_ms(T0 + 6_000);
    let mut consumer = store.consumer("payments", 0).unwrap();
    assert_eq!(drain(&mut consumer, 2).len(), 2);
    want[0] = ("orders", 4);
    want[1] = ("payments", 1);
    want.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let expected = counted(&want, 6);
    assert_eq!(by_topic(&store), expected, "cancelled and fired timers left their topics");
    store.close().unwrap();

    let store = store_at(dir.path(), &clock);
    assert_eq!(by_topic(&store), expected, "from the counts file");
    // Killed now, with the counts file of the open: the crashed copy brings it forward.
    put(&store, "orders", HOUR);
    let crashed = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), crashed.path());
    store.close().unwrap();
    let mut plus_one = want.clone();
    plus_one[0].1 += 1;
    let store = store_at(crashed.path(), &clock);
    assert_eq!(by_topic(&store), counted(&plus_one, 6), "a crash: the file brought to the replay start");
    store.close().unwrap();

    std::fs::remove_file(dir.path().join("index/topic_pending")).unwrap();
    let store = store_at(dir.path(), &clock);
    assert_eq!(by_topic(&store), counted(&plus_one, 6), "recounted from the log");
    store.close().unwrap();
    let path = dir.path().join("index/topic_pending");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 9;
    bytes[last] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let store = store_at(dir.path(), &clock);
    assert_eq!(by_topic(&store), counted(&plus_one, 6), "a damaged file: recounted");
    store.close().unwrap();
}

#[test]
fn counts_by_due_time_match_the_timers_put_second_by_second_and_add_up() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    // 1,200 timers over the next 5 minutes, a few per second (none due now: they would fire at
    // once; none on a second's first millisecond), plus hours, a month and ten years ahead.
    let mut expected = vec![0u64; 300];
    let mut handles = Vec::new();
    for i in 0..1_200u64 {
        let second = 1 + (i * 7) % 299;
        expected[second as usize] += 1;
        let at = T0 + second * 1_000 + 1 + i % 999;
        handles.push(
            store.put(Message::new("orders", "m").queue_id(0).deliver_at_ms(at)).unwrap().handle().unwrap(),
        );
    }
    for ahead in [2 * HOUR, 30 * 24 * HOUR, 10 * YEAR] {
        store.put(Message::new("orders", "far").deliver_at_ms(T0 + ahead)).unwrap();
    }
    assert_eq!(store.cancel(handles[0]).unwrap(), CancelOutcome::Cancelled);
    expected[1] -= 1;

    let bounds: Vec<u64> = (0..=300).map(|s| T0 + s * 1_000).collect();
    let counts = store.pending_counts(&bounds).unwrap();
    assert_eq!(counts.len(), 302, "one count before the bounds, one per interval, one after");
    assert_eq!(counts[0], 0, "nothing due before now");
    assert_eq!(&counts[1..301], &expected[..], "exact per second, the cancelled one left out");
    assert_eq!(counts[301], 3, "the rest, whatever level holds them");
    assert_eq!(store.pending_counts(&[]).unwrap(), [1_202], "no bounds: all of them");
    let days: Vec<u64> = (0..=3_650).map(|d| T0 + d * 24 * HOUR).collect();
    let by_day = store.pending_counts(&days).unwrap();
    assert_eq!(by_day[1], 1_200, "today: the five minutes and the hours ahead");
    assert_eq!(by_day.iter().sum::<u64>(), 1_202, "every level counted once");

    // Two minutes on, the first two minutes have fired.
    clock.set_ms(T0 + 120_000);
    let mut consumer = store.consumer("orders", 0).unwrap();
    let fired: u64 = expected[..120].iter().sum();
    assert_eq!(drain(&mut consumer, fired as usize).len() as u64, fired);
    let counts = store.pending_counts(&bounds).unwrap();
    assert_eq!(&counts[121..301], &expected[120..], "the seconds still ahead are as they were");
    assert_eq!(counts[..121].iter().sum::<u64>(), 0, "the fired ones are gone");

    for bad in [vec![T0, T0], vec![T0 + 1, T0], vec![0; delaywheel::MAX_COUNT_BOUNDS + 1]] {
        let e = store.pending_counts(&bad).unwrap_err();
        assert!(matches!(e, delaywheel::Error::Invalid { what: "bounds", .. }), "{e}");
    }
    store.close().unwrap();
}

/// A store none of whose timers has a key has an empty key index, not a
/// missing one: reopening it reads nothing of the log below its checkpoint.
/// (It was rebuilt at every open: every record read, to find no key.)
#[test]
fn an_empty_key_index_is_not_rebuilt_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let offsets: Vec<u64> = (0..20)
        .map(|i| store.put(Message::new("orders", "x").deliver_at_ms(T0 + 1_500 + i)).unwrap().offset())
        .collect();
    // They fire, so the wheel's scan for settled timers starts after them.
    for second in 1..=5 {
        clock.set_ms(T0 + second * 1_000);
        std::thread::sleep(Duration::from_millis(50));
    }
    store.close().unwrap();
    // Both checkpoint slots past them.
    store_at(dir.path(), &clock).close().unwrap();
    assert_eq!(key_index_files(dir.path()), Vec::<std::path::PathBuf>::new(), "no key, no file");
    // Damage the frame of a record the checkpoint is past: only a walk of the whole log meets it.
    flip(&dir.path().join("commitlog").join(format!("{:020}", 0)), offsets[10] as usize + 8);
    let store = store_at(dir.path(), &clock);
    let stats = store.stats();
    assert_eq!(stats.damaged_log_spans, 0, "the open read no record below the checkpoint");
    store.close().unwrap();
}

/// The counts file follows the dispatcher also while no count changes
/// (plain messages, occurrences of schedules: each arms what it settles),
/// so a restart brings it forward over a second of records, not over
/// everything since the last change (467 MB after 90 s of a million
/// schedules).
#[test]
fn the_counts_file_moves_on_while_the_counts_stay_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(
        small_config(dir.path()).with_clock(clock.clone()).with_flush_interval(Duration::from_millis(10)),
    )
    .unwrap();
    let path = dir.path().join("index/topic_pending");
    let through = || {
        let bytes = std::fs::read(&path).unwrap_or_default();
        let header =
            delaywheel::internals::FileHeader::decode(&bytes, delaywheel::internals::TOPIC_PENDING_MAGIC);
        header.map_or(0, |h| h.a)
    };
    let written_past = |offset: u64| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while through() <= offset && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        through() > offset
    };
    let timed = store.put(Message::new("orders", "a").deliver_at_ms(T0 + HOUR)).unwrap().offset();
    assert!(written_past(timed), "a count changed: the file is written");
    let mut last = 0;
    for i in 0..200u64 {
        last = store.put(Message::new("orders", i.to_le_bytes().to_vec())).unwrap().offset();
    }
    assert!(written_past(last), "counted through {} of {last}", through());
    store.close().unwrap();
}
