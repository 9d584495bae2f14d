//! Put and consume through the public API.

mod common;

use std::time::{Duration, Instant};

use common::*;
use delaywheel::{Error, Message, Store};

#[test]
fn a_message_round_trips_with_its_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    let msg = Message::new("OrderTopic", "order-7 created")
        .key("order-7")
        .tags("create")
        .property("region", "eu")
        .property("amount", "12.50");
    let receipt = store.put(msg).unwrap();
    let mut consumer = store.consumer("OrderTopic", receipt.queue_id()).unwrap();
    let got = consumer.poll(10, Duration::from_secs(5)).unwrap();
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(&m.body()[..], b"order-7 created");
    assert_eq!((m.topic(), m.key(), m.tags()), ("OrderTopic", Some("order-7"), Some("create")));
    assert_eq!(m.properties(), &[("region".into(), "eu".into()), ("amount".into(), "12.50".into())]);
    assert_eq!((m.log_offset(), m.queue_offset()), (receipt.offset(), 0));
    assert_eq!(m.store_time_ms(), receipt.store_time_ms());
    assert_eq!(m.delivered_at_ms(), receipt.store_time_ms(), "an ordinary message is visible when stored");
    store.close().unwrap();
}

#[test]
fn poll_wakes_when_a_message_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(Store::open(small_config(dir.path())).unwrap());
    let mut consumer = store.consumer("T", 0).unwrap();
    let producer = {
        let store = std::sync::Arc::clone(&store);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            store.put(Message::new("T", "late")).unwrap();
        })
    };
    let started = Instant::now();
    let got = consumer.poll(1, Duration::from_secs(60)).unwrap();
    assert_eq!(bodies(&got), ["late"]);
    // Not a timing target: a poll that slept to its 60 s timeout would fail here.
    assert!(started.elapsed() < Duration::from_secs(30));
    producer.join().unwrap();
    assert!(consumer.poll(1, Duration::from_millis(50)).unwrap().is_empty(), "nothing more to read");
}

/// A waker that counts its wakes.
struct Counting(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Counting {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_queue_watch_wakes_a_task_at_the_next_append() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    let consumer = store.consumer("T", 0).unwrap();
    let watch = consumer.watch();
    assert_eq!(watch.entries(), 0);
    let counted = Arc::new(Counting(Default::default()));
    let waker = std::task::Waker::from(Arc::clone(&counted));
    watch.wake_on_append(&waker);
    watch.wake_on_append(&waker); // the same task registers once
    store.put(Message::new("T", "first")).unwrap();
    let started = Instant::now();
    while counted.0.load(Ordering::SeqCst) == 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(counted.0.load(Ordering::SeqCst), 1, "woken once");
    assert_eq!(watch.entries(), 1);
    // Woken once per registration: the next append wakes nobody.
    store.put(Message::new("T", "second")).unwrap();
    while watch.entries() < 2 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(counted.0.load(Ordering::SeqCst), 1);
}

#[test]
fn keys_keep_their_queue_and_queues_keep_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    let mut per_queue: Vec<Vec<String>> = vec![Vec::new(); 4];
    for i in 0..200 {
        let key = format!("order-{}", i % 7);
        let receipt = store.put(Message::new("T", format!("{key}/{i}")).key(key)).unwrap();
        per_queue[receipt.queue_id() as usize].push(format!("order-{}/{i}", i % 7));
    }
    for (queue_id, expected) in per_queue.iter().enumerate() {
        let mut consumer = store.consumer("T", queue_id as u32).unwrap();
        assert_eq!(&bodies(&drain(&mut consumer, expected.len())), expected);
    }
}

#[test]
fn bad_messages_are_refused_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    let cases = [
        (Message::new("", "x"), "invalid topic: empty"),
        (Message::new("a/b", "x"), "invalid topic: \"a/b\" may only hold ASCII letters, digits and _ - % |"),
        (Message::new("x".repeat(128), "x"), "invalid topic: longer than 127 bytes"),
        (Message::new("T", vec![0u8; 8 * 1024 + 1]), "invalid body: 8193 bytes is over the limit of 8192"),
        (Message::new("T", "x").queue_id(4), "invalid queue id: 4 is not below the 4 queues of a topic"),
    ];
    for (msg, expected) in cases {
        let err = store.put(msg).unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }));
        assert_eq!(err.to_string(), expected);
    }
    assert!(store.consumer("T", 9).is_err());
    // Nothing was stored.
    let mut consumer = store.consumer("T", 0).unwrap();
    assert!(consumer.poll(10, Duration::from_millis(50)).unwrap().is_empty());
}

#[test]
fn four_concurrent_producers_lose_nothing_and_keep_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(Store::open(small_config(dir.path())).unwrap());
    let per_producer = 2_000;
    let producers: Vec<_> = (0..4)
        .map(|p| {
            let store = std::sync::Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..per_producer {
                    store.put(Message::new("T", format!("{p}:{i}")).queue_id(0)).unwrap();
                }
            })
        })
        .collect();
    producers.into_iter().for_each(|p| p.join().unwrap());
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = bodies(&drain(&mut consumer, 4 * per_producer));
    assert_eq!(got.len(), 4 * per_producer);
    let mut next = [0usize; 4];
    for body in got {
        let (p, i) = body.split_once(':').unwrap();
        let (p, i): (usize, usize) = (p.parse().unwrap(), i.parse().unwrap());
        assert_eq!(i, next[p], "producer {p}'s messages arrive in put order");
        next[p] += 1;
    }
}

#[test]
fn sync_flush_puts_return_and_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path()).with_flush_mode(delaywheel::FlushMode::Sync);
    let store = std::sync::Arc::new(Store::open(config).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|p| {
            let store = std::sync::Arc::clone(&store);
            std::thread::spawn(move || {
                (0..50).for_each(|i| {
                    store.put(Message::new("T", format!("{p}.{i}"))).unwrap();
                })
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(drain(&mut consumer, 200).len(), 200);
}

#[test]
fn a_producer_faster_than_the_indexes_gets_busy_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    // No lag allowed and no waiting: a put that finds anything unindexed is refused.
    let config = small_config(dir.path()).with_max_index_lag(0).with_put_timeout(Duration::ZERO);
    let store = Store::open(config).unwrap();
    let (mut acked, mut busy) = (0usize, None);
    for i in 0..100_000 {
        match store.put(Message::new("T", format!("m{i}"))) {
            Ok(_) => acked += 1,
            Err(e @ Error::Busy { .. }) => {
                busy = Some(e);
                break;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    let busy = busy.expect("a put outran the dispatcher at least once");
    assert!(busy.to_string().starts_with("store is busy: the indexes are "), "{busy}");
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = drain(&mut consumer, acked + 1);
    assert_eq!(got.len(), acked, "every acknowledged put arrives, the refused one does not");
}
