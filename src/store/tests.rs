use std::time::Duration;

use super::*;
use crate::mmap::FAIL_FLUSH;
use crate::ticket::PutTicket;

/// Every outstanding ticket fails once a flush fails: blocking, as a
/// future, and in a batch of thousands in flight.
#[test]
fn a_failed_flush_fails_every_outstanding_ticket() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        Config::new(dir.path()).with_segment_size(1 << 20).with_flush_interval(Duration::from_secs(3600));
    let store = Store::open(config).unwrap();
    let early = store.submit(Message::new("T", "early")).unwrap();
    store.wait_durable(&early.receipt(), Duration::from_secs(5)).unwrap();
    let tickets: Vec<PutTicket> =
        (0..2_000).map(|i| store.submit(Message::new("T", format!("{i}"))).unwrap()).collect();
    let mut future = std::pin::pin!(store.submit(Message::new("T", "awaited")).unwrap());
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    assert!(future.as_mut().poll(&mut cx).is_pending(), "async mode: not durable before a flush");
    FAIL_FLUSH.add(dir.path());
    let err = store.wait_durable(&tickets[0].receipt(), Duration::from_secs(5)).unwrap_err();
    FAIL_FLUSH.remove(dir.path());
    assert!(matches!(err, Error::Poisoned { .. }), "{err}");
    for ticket in &tickets {
        assert!(matches!(ticket.wait(Duration::from_secs(1)), Err(Error::Poisoned { .. })));
        assert!(ticket.is_durable().is_err());
    }
    assert!(matches!(future.as_mut().poll(&mut cx), std::task::Poll::Ready(Err(Error::Poisoned { .. }))));
    assert_eq!(early.wait(Duration::ZERO).unwrap(), early.receipt(), "on disk before the failure");
    assert!(early.is_durable().unwrap());
    assert!(store.close().is_err(), "close reports the poisoning");
}

#[test]
fn a_failed_flush_poisons_the_store_until_it_is_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let config = || Config::new(dir.path()).with_segment_size(1 << 20).with_flush_mode(FlushMode::Sync);
    let store = Store::open(config()).unwrap();
    store.put(Message::new("T", "before")).unwrap();
    assert!(store.health().is_ok());

    FAIL_FLUSH.add(dir.path());
    let err = store.put(Message::new("T", "during")).unwrap_err();
    assert!(matches!(err, Error::Poisoned { .. }), "{err}");
    assert!(err.to_string().contains("injected flush failure"), "{err}");
    let err = store.put(Message::new("T", "after")).unwrap_err();
    assert!(matches!(err, Error::Poisoned { .. }), "writes stay refused: {err}");
    let health = store.health().unwrap_err();
    assert!(health.to_string().contains("injected flush failure"), "health names the reason: {health}");
    FAIL_FLUSH.remove(dir.path());
    assert!(store.close().is_err(), "close reports the poisoning");

    let store = Store::open(config()).unwrap();
    store.put(Message::new("T", "reopened")).unwrap();
    let mut consumer = store.consumer("T", 0).unwrap();
    let mut bodies = Vec::new();
    while let Ok(batch) = consumer.poll(10, Duration::from_millis(300)) {
        if batch.is_empty() {
            break;
        }
        bodies.extend(batch.iter().map(|m| String::from_utf8(m.body().to_vec()).unwrap()));
    }
    // "during" reached the page cache before its flush failed: it was not
    // acknowledged, and it may or may not be there; the others must be.
    bodies.retain(|b| b != "during");
    assert_eq!(bodies, ["before", "reopened"]);
}

/// Polls `consumer` until `n` messages came or `wait` passed.
fn bodies_of(consumer: &mut crate::Consumer, n: usize, wait: Duration) -> Vec<String> {
    let started = std::time::Instant::now();
    let mut bodies = Vec::new();
    while bodies.len() < n && started.elapsed() < wait {
        let batch = consumer.poll(100, Duration::from_millis(100)).unwrap();
        bodies.extend(batch.iter().map(|m| String::from_utf8(m.body().to_vec()).unwrap()));
    }
    bodies
}

/// Puts until one is refused, for at most 10 s; returns the refusal.
fn put_until_refused(store: &Store, message: impl Fn(usize) -> Message) -> (usize, Error) {
    let started = std::time::Instant::now();
    for i in 0.. {
        match store.put(message(i)) {
            Ok(_) => assert!(started.elapsed() < Duration::from_secs(10), "never refused"),
            Err(e) => return (i, e),
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    unreachable!()
}

/// Puts `message`, retrying while a full disk refuses it: each stalled
/// thread sees the room at its next retry.
fn put_once_there_is_room(store: &Store, message: Message) {
    let started = std::time::Instant::now();
    while let Err(e) = store.put(message.clone()) {
        assert!(matches!(e, Error::DiskFull { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5), "still refused once room is back: {e}");
        std::thread::sleep(crate::stall::RETRY);
    }
}

/// `try_submit_batch` appends where nothing waits; a batch that needs a new
/// segment (file work) it leaves whole, writing nothing, to `submit_batch`,
/// which makes the segment; a message not acceptable is refused as by
/// `submit_batch`.
#[test]
fn try_submit_batch_appends_without_waiting_and_leaves_a_roll_to_submit_batch() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path())
        .with_segment_size(crate::MIN_SEGMENT_SIZE)
        .with_queues_per_topic(1)
        .with_flush_mode(FlushMode::Sync);
    let store = Store::open(config).unwrap();
    let batch = |tag: &str| -> Vec<Message> {
        (0..38).map(|i| Message::new("B", format!("{tag}{i:04}{}", "z".repeat(1000)))).collect()
    };
    let first = store.try_submit_batch(&batch("a")).unwrap().expect("the first batch fits the segment");
    assert_eq!(first.len(), 38);
    for ticket in &first {
        ticket.wait(Duration::from_secs(10)).unwrap();
    }
    let end = store.log.write_end();
    assert!(store.try_submit_batch(&batch("b")).unwrap().is_none(), "the second needs a new segment");
    assert_eq!(store.log.write_end(), end, "nothing of it written");
    let bad = [Message::new("B", "fine"), Message::new("not a topic", "x")];
    let refused = store.try_submit_batch(&bad);
    assert!(matches!(refused, Err(Error::InBatch { index: 1, .. })), "{refused:?}");
    for ticket in store.submit_batch(batch("b")).unwrap() {
        ticket.wait(Duration::from_secs(10)).unwrap();
    }
    let mut consumer = store.consumer("B", 0).unwrap();
    let got = bodies_of(&mut consumer, 77, Duration::from_secs(2));
    let tags: String = got.iter().map(|b| &b[..1]).collect();
    assert_eq!(tags, format!("{}{}", "a".repeat(38), "b".repeat(38)), "each batch once, in order");
    store.close().unwrap();
}

/// A batch that needs a new segment the disk has no room for fails
/// whole (its first messages would have fitted in the old one), and the
/// store reopens with nothing of it.
#[test]
fn a_full_disk_at_the_roll_fails_a_batch_whole() {
    use crate::mmap::FAIL_RESERVE;
    let dir = tempfile::tempdir().unwrap();
    let config =
        || Config::new(dir.path()).with_segment_size(crate::MIN_SEGMENT_SIZE).with_queues_per_topic(1);
    let store = Store::open(config()).unwrap();
    let batch = |tag: &str| -> Vec<Message> {
        (0..38).map(|i| Message::new("B", format!("{tag}{i:04}{}", "z".repeat(1000)))).collect()
    };
    store.put_batch(batch("a")).unwrap();
    let full = dir.path().join("commitlog");
    FAIL_RESERVE.add(&full);
    let err = store.put_batch(batch("b"));
    FAIL_RESERVE.remove(&full);
    assert!(matches!(err, Err(Error::DiskFull { .. })), "{err:?}");
    store.put(Message::new("B", "after")).unwrap();
    store.close().unwrap();
    let store = Store::open(config()).unwrap();
    let mut consumer = store.consumer("B", 0).unwrap();
    let got = bodies_of(&mut consumer, 40, Duration::from_secs(2));
    assert_eq!(got.len(), 39, "the first batch and the put after: {:?}", got.len());
    assert!(got.iter().all(|b| !b.starts_with('b')), "nothing of the failed batch");
    store.close().unwrap();
}

#[test]
fn a_full_disk_for_a_queue_file_is_back_pressure_not_poison() {
    use crate::mmap::FAIL_RESERVE;
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path())
        .with_segment_size(1 << 20)
        .with_queues_per_topic(1)
        .with_max_index_lag(1)
        .with_put_timeout(Duration::from_secs(5));
    let store = Store::open(config).unwrap();
    let full = dir.path().join("consumequeue").join("U");
    FAIL_RESERVE.add(&full);
    let (accepted, err) = put_until_refused(&store, |i| Message::new("U", format!("u{i}")));
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    store.health().unwrap();
    FAIL_RESERVE.remove(&full);
    let mut consumer = store.consumer("U", 0).unwrap();
    let want: Vec<String> = (0..accepted).map(|i| format!("u{i}")).collect();
    assert_eq!(
        bodies_of(&mut consumer, accepted, Duration::from_secs(10)),
        want,
        "every acknowledged put, once room is back"
    );
    put_once_there_is_room(&store, Message::new("U", "after"));
    assert_eq!(bodies_of(&mut consumer, 1, Duration::from_secs(10)), ["after"]);
    store.close().unwrap();
}

#[test]
fn a_full_disk_for_a_timer_log_file_is_back_pressure_not_poison() {
    use crate::mmap::FAIL_RESERVE;
    const T0: u64 = 1_700_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::ManualClock::new(T0);
    let config = Config::new(dir.path())
        .with_segment_size(1 << 20)
        .with_queues_per_topic(1)
        .with_timer_log_file_entries(8)
        .with_max_index_lag(1)
        .with_put_timeout(Duration::from_secs(5))
        .with_clock(clock.clone());
    let store = Store::open(config).unwrap();
    let timer = |i| Message::new("T", format!("t{i}")).deliver_at_ms(T0 + 10_000);
    // The first timer makes the first timer-log file (8 entries, the first one unused).
    store.put(timer(0)).unwrap();
    assert_eq!(store.fresh_stats().unwrap().pending, 1);
    let full = dir.path().join("timer");
    FAIL_RESERVE.add(&full);
    let (refused_at, err) = put_until_refused(&store, |i| timer(i + 1));
    let accepted = 1 + refused_at;
    // Refused once the wheel, out of room, stops taking timers: not
    // thousands of puts later, held in the dispatcher's queue to it.
    assert!((2..=16).contains(&accepted), "refused after {accepted} timers");
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    store.health().unwrap();
    FAIL_RESERVE.remove(&full);
    put_once_there_is_room(&store, timer(accepted));
    clock.set_ms(T0 + 11_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    let mut got = bodies_of(&mut consumer, accepted + 1, Duration::from_secs(10));
    got.sort_by_key(|b| b[1..].parse::<usize>().unwrap());
    let want: Vec<String> = (0..=accepted).map(|i| format!("t{i}")).collect();
    assert_eq!(got, want, "every acknowledged timer fires once, once room is back");
    assert!(bodies_of(&mut consumer, 1, Duration::from_millis(500)).is_empty(), "and none twice");
    store.health().unwrap();
    store.close().unwrap();
}

/// Disk space a directory's files take (allocated blocks, not their lengths).
fn allocated_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() { allocated_bytes(&entry.path()) } else { meta.blocks() * 512 };
    }
    total
}

/// A new queue costs what it holds, not its file's size: 100 one-message
/// topics took 9.6 MB of disk each (each queue file reserved whole).
#[test]
fn a_new_queue_reserves_its_file_as_it_fills() {
    let dir = tempfile::tempdir().unwrap();
    let config = || Config::new(dir.path()).with_queues_per_topic(1);
    let store = Store::open(config()).unwrap();
    for topic in 0..50 {
        store.put(Message::new(format!("T{topic}"), "x")).unwrap();
    }
    store.fresh_stats().unwrap();
    let queues = dir.path().join("consumequeue");
    let taken = allocated_bytes(&queues);
    assert!(taken <= 50 * (2 * crate::mmap::GROWTH_MIN as u64), "{taken} bytes for 50 one-entry queues");
    store.close().unwrap();
    // Reopened, a queue grows on where it was.
    let store = Store::open(config()).unwrap();
    let entries = 3 * crate::mmap::GROWTH_MIN / crate::format::queue_entry::ENTRY_LEN;
    store.put_batch((0..entries).map(|i| Message::new("T0", format!("{i}")))).unwrap();
    let mut consumer = store.consumer("T0", 0).unwrap();
    assert_eq!(bodies_of(&mut consumer, entries + 1, Duration::from_secs(10)).len(), entries + 1);
    assert!(allocated_bytes(&queues) <= taken + 8 * crate::mmap::GROWTH_MIN as u64);
    store.close().unwrap();
}

/// Growing a queue's file on a full disk is back-pressure too, and the
/// entries are written once there is room.
#[test]
fn a_full_disk_while_a_queue_file_grows_is_back_pressure_not_poison() {
    use crate::mmap::FAIL_RESERVE;
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path())
        .with_queues_per_topic(1)
        .with_max_index_lag(1)
        .with_put_timeout(Duration::from_secs(5));
    let store = Store::open(config).unwrap();
    store.put(Message::new("G", "g0")).unwrap();
    let mut consumer = store.consumer("G", 0).unwrap();
    assert_eq!(bodies_of(&mut consumer, 1, Duration::from_secs(5)), ["g0"], "the file exists");
    let full = dir.path().join("consumequeue").join("G");
    FAIL_RESERVE.add(&full);
    let (refused_at, err) = put_until_refused(&store, |i| Message::new("G", format!("g{}", i + 1)));
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    let per_reserve = crate::mmap::GROWTH_MIN / crate::format::queue_entry::ENTRY_LEN;
    assert!(refused_at < per_reserve + 16, "refused after {refused_at}, past the first reserve");
    store.health().unwrap();
    FAIL_RESERVE.remove(&full);
    let want: Vec<String> = (1..=refused_at).map(|i| format!("g{i}")).collect();
    assert_eq!(bodies_of(&mut consumer, refused_at, Duration::from_secs(10)), want);
    store.close().unwrap();
}
