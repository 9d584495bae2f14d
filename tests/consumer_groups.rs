//! What a server built on the store needs from its consumers: offsets made
//! durable on demand, and one wait over several queues.

mod common;

use std::time::{Duration, Instant};

use common::{bodies, crash_copy, drain, no_periodic_flush, numbered, put_numbered};
use delaywheel::{Message, Store, poll_any};

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
