//! What a server built on the store needs from its consumers: offsets made
//! durable on demand, and one wait over several queues.

mod common;

use std::time::{Duration, Instant};

use common::{bodies, crash_copy, drain, no_periodic_flush, numbered, put_numbered};
use delaywheel::{Error, Message, POSITIONS_TOPIC, Store, poll_any};

#[test]
fn sync_offsets_makes_a_commit_survive_a_crash_before_the_next_flush() {
    for sync in [false, true] {
        let live = tempfile::tempdir().unwrap();
        let store = Store::open(no_periodic_flush(live.path())).unwrap();
        put_numbered(&store, "T", 0..5);
        let mut consumer = store.consumer_in_group("g", "T", 0).unwrap();
        assert_eq!(bodies(&drain(&mut consumer, 3)), numbered(0..3));
        consumer.commit();
        if sync {
            store.sync_offsets().unwrap();
        }
        let crashed = tempfile::tempdir().unwrap();
        crash_copy(live.path(), crashed.path());
        drop(consumer);
        store.close().unwrap();

        let store = Store::open(no_periodic_flush(crashed.path())).unwrap();
        let consumer = store.consumer_in_group("g", "T", 0).unwrap();
        // Without the sync, the commit had not reached the disk (the flusher never ran).
        assert_eq!(consumer.position(), if sync { 3 } else { 0 }, "sync {sync}");
        drop(consumer);
        store.close().unwrap();
    }
}

/// Opens a copy of `live` as a `kill -9` now would leave it, and returns
/// where group `g` starts on each queue of `T` in `queues`.
fn positions_after_a_crash(
    live: &std::path::Path,
    queues: std::ops::Range<u32>,
    lose_checkpoint: bool,
) -> Vec<u64> {
    let crashed = tempfile::tempdir().unwrap();
    crash_copy(live, crashed.path());
    if lose_checkpoint {
        std::fs::remove_file(crashed.path().join("consumer_offsets.json")).unwrap();
    }
    let store = Store::open(no_periodic_flush(crashed.path())).unwrap();
    let positions = queues.map(|q| store.consumer_in_group("g", "T", q).unwrap().position()).collect();
    store.close().unwrap();
    positions
}

#[test]
fn synced_positions_are_rebuilt_from_the_log_when_the_offsets_file_is_lost() {
    let live = tempfile::tempdir().unwrap();
    let store = Store::open(no_periodic_flush(live.path())).unwrap();
    put_numbered(&store, "T", 0..10);
    let mut consumer = store.consumer_in_group("g", "T", 0).unwrap();
    drain(&mut consumer, 2);
    consumer.commit();
    drop(consumer);
    store.close().unwrap(); // the file says 2, up to here
    let store = Store::open(no_periodic_flush(live.path())).unwrap();
    let mut consumer = store.consumer_in_group("g", "T", 0).unwrap();
    drain(&mut consumer, 4);
    consumer.commit();
    store.sync_offsets().unwrap();
    // The positions message past the file's coverage is replayed; without
    // the file, the log alone says where the group is.
    assert_eq!(positions_after_a_crash(live.path(), 0..1, false), [6]);
    assert_eq!(positions_after_a_crash(live.path(), 0..1, true), [6]);
    drop(consumer);
    store.close().unwrap();
}

#[test]
fn the_last_synced_position_wins_on_replay_also_when_it_moved_back() {
    let live = tempfile::tempdir().unwrap();
    let store = Store::open(no_periodic_flush(live.path())).unwrap();
    put_numbered(&store, "T", 0..10);
    let mut first = store.consumer_in_group("g", "T", 0).unwrap();
    let mut second = store.consumer_in_group("g", "T", 1).unwrap();
    drain(&mut first, 8);
    first.commit();
    store.sync_offsets().unwrap();
    first.seek(4);
    first.commit();
    store.put(Message::new("T", "on queue 1").queue_id(1)).unwrap();
    drain(&mut second, 1);
    second.commit();
    store.sync_offsets().unwrap();
    assert_eq!(positions_after_a_crash(live.path(), 0..2, false), [4, 1]);
    // Committed but not synced: the flusher never ran, so it is not on disk.
    first.seek(2);
    first.commit();
    assert_eq!(positions_after_a_crash(live.path(), 0..2, false), [4, 1]);
    drop((first, second));
    store.close().unwrap();
}

#[test]
fn the_positions_topic_is_the_stores_own() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(no_periodic_flush(dir.path())).unwrap();
    let err = store.put(Message::new(POSITIONS_TOPIC, "forged")).unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }) && err.to_string().contains(POSITIONS_TOPIC), "{err}");
    // No queue holds positions messages, and no consumer sees them.
    let mut consumer = store.consumer_in_group("g", "T", 0).unwrap();
    store.put(Message::new("T", "one")).unwrap();
    drain(&mut consumer, 1);
    consumer.commit();
    store.sync_offsets().unwrap();
    let mut spy = store.consumer(POSITIONS_TOPIC, 0).unwrap();
    assert!(spy.poll(10, Duration::from_millis(200)).unwrap().is_empty());
    drop((consumer, spy));
    store.close().unwrap();
}

#[test]
fn an_offsets_file_of_version_1_still_opens_and_is_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(no_periodic_flush(dir.path())).unwrap();
    put_numbered(&store, "T", 0..5);
    store.close().unwrap();
    let path = dir.path().join("consumer_offsets.json");
    let v1 = r#"{"version":1,"offsets":[{"group":"g","topic":"T","queue_id":0,"offset":3}]}"#;
    std::fs::write(&path, v1).unwrap();
    let store = Store::open(no_periodic_flush(dir.path())).unwrap();
    assert_eq!(store.consumer_in_group("g", "T", 0).unwrap().position(), 3);
    let rewritten = std::fs::read_to_string(&path).unwrap();
    assert!(rewritten.contains(r#""version": 2"#) && rewritten.contains("covers_log_to"), "{rewritten}");
    store.close().unwrap();
}

/// A file whose `covers_log_to` is no record boundary, or that is not JSON
/// at all, is rebuilt from the positions messages in the log (the open used
/// to be refused): the positions `sync_offsets` made durable come back.
#[test]
fn a_damaged_offsets_file_is_rebuilt_from_the_positions_in_the_log() {
    for garbage in [r#"{"version":2,"covers_log_to":33,"offsets":[]}"#, "{\"version\":2,\"offs"] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(no_periodic_flush(dir.path())).unwrap();
        put_numbered(&store, "T", 0..5);
        let mut consumer = store.consumer_in_group("g", "T", 0).unwrap();
        assert_eq!(drain(&mut consumer, 3).len(), 3);
        consumer.commit();
        store.sync_offsets().unwrap();
        drop(consumer);
        store.close().unwrap();
        let path = dir.path().join("consumer_offsets.json");
        // 33: one byte into the first record, past the segment's 32-byte header.
        std::fs::write(&path, garbage).unwrap();
        let store = Store::open(no_periodic_flush(dir.path())).unwrap();
        assert_eq!(store.consumer_in_group("g", "T", 0).unwrap().position(), 3, "{garbage}");
        assert_eq!(store.stats().damaged_log_spans, 0, "the file was wrong, not the log: {garbage}");
        let rewritten = std::fs::read_to_string(&path).unwrap();
        assert!(rewritten.contains("covers_log_to"), "rebuilt at once: {rewritten}");
        store.close().unwrap();
    }
}

#[test]
fn poll_any_wakes_for_whichever_queue_gets_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(no_periodic_flush(dir.path())).unwrap();
    let mut consumers: Vec<_> = (0..3).map(|q| store.consumer("T", q).unwrap()).collect();
    assert!(poll_any(&mut consumers, 10, Duration::ZERO).unwrap().is_empty());
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            store.put(Message::new("T", "late").queue_id(2)).unwrap();
        });
        let started = Instant::now();
        let got = poll_any(&mut consumers, 10, Duration::from_secs(10)).unwrap();
        assert_eq!(bodies(&got), ["late"]);
        assert_eq!(got[0].queue_id(), 2);
        assert!(started.elapsed() < Duration::from_secs(5), "woke on the put, not the timeout");
    });
    store.put(Message::new("T", "a").queue_id(1)).unwrap();
    store.put(Message::new("T", "b").queue_id(0)).unwrap();
    store.put(Message::new("T", "c").queue_id(0)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // In the consumers' order, and no more than asked.
    assert_eq!(bodies(&poll_any(&mut consumers, 2, Duration::from_secs(1)).unwrap()), ["b", "c"]);
    assert_eq!(bodies(&poll_any(&mut consumers, 2, Duration::from_secs(1)).unwrap()), ["a"]);
    drop(consumers);
    store.close().unwrap();
}
