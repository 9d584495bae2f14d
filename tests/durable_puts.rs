//! Batch puts and pipelined puts: all of a batch or nothing of it, receipts
//! in order; tickets that resolve once the record is on disk, blocking or as
//! a future; a size cap in the middle of a batch writes nothing of it.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::time::{Duration, Instant};

use common::{T0, bodies, drain, no_periodic_flush, numbered, small_config, store_at};
use delaywheel::{Error, FlushMode, ManualClock, Message, Retention, Store};

fn numbered_messages(topic: &str, range: std::ops::Range<usize>) -> Vec<Message> {
    range.map(|i| Message::new(topic, format!("m{i}")).queue_id(0)).collect()
}

#[test]
fn a_batch_is_appended_in_order_and_delivered_whole() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let mut batch = numbered_messages("B", 0..50);
    batch[7] = Message::new("B", "m7").queue_id(0).deliver_at_ms(T0 + 5_000);
    let receipts = store.put_batch(batch).unwrap();
    assert_eq!(receipts.len(), 50);
    assert!(
        receipts.windows(2).all(|w| w[0].offset() < w[1].offset()),
        "in input order, one after the other"
    );
    assert_eq!(receipts[7].deliver_at_ms(), Some(T0 + 5_000));
    assert!(receipts[7].handle().is_some() && receipts[6].handle().is_none());
    let mut consumer = store.consumer("B", 0).unwrap();
    let now: Vec<String> = numbered(0..50).into_iter().filter(|b| b != "m7").collect();
    assert_eq!(bodies(&drain(&mut consumer, 49)), now);
    clock.set_ms(T0 + 5_000);
    assert_eq!(bodies(&drain(&mut consumer, 1)), ["m7"], "the timer in the batch fires when due");
    assert_eq!(store.put_batch(Vec::new()).unwrap(), [], "an empty batch writes nothing");
    store.close().unwrap();
}

#[test]
fn one_bad_message_rejects_the_batch_naming_its_position_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    let before = store.put(Message::new("B", "before").queue_id(0)).unwrap();
    let mut batch = numbered_messages("B", 0..5);
    batch[3] = Message::new("", "no topic");
    match store.put_batch(batch) {
        Err(Error::InBatch { index: 3, source }) => {
            assert!(matches!(*source, Error::Invalid { what: "topic", .. }), "{source}")
        }
        other => panic!("{other:?}"),
    }
    let late = Message::new("B", "bad level").queue_id(0).delay_level(99);
    match store.put_batch([Message::new("B", "fine").queue_id(0), late]) {
        Err(Error::InBatch { index: 1, .. }) => {}
        other => panic!("a timing checked after the wait for the indexes: {other:?}"),
    }
    let after = store.put(Message::new("B", "after").queue_id(0)).unwrap();
    let mut consumer = store.consumer("B", 0).unwrap();
    assert_eq!(bodies(&drain(&mut consumer, 3)), ["before", "after"], "nothing of either batch");
    assert!(after.offset() > before.offset());
    store.close().unwrap();
}

#[test]
fn a_batch_larger_than_a_segment_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path())).unwrap();
    let body = "x".repeat(4096);
    let batch: Vec<Message> = (0..20).map(|_| Message::new("B", body.clone()).queue_id(0)).collect();
    let err = store.put_batch(batch).unwrap_err();
    assert!(matches!(err, Error::Invalid { what: "batch", .. }), "{err}");
    assert_eq!(store.stats().log_bytes, 0, "nothing written");
    store.close().unwrap();
}

/// A batch that would need a new segment when the size cap allows none fails
/// whole, though its first messages would have fitted; after a reopen the
/// log holds the batches before it and nothing of this one.
#[test]
fn a_size_cap_in_the_middle_of_a_batch_writes_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let segment = 64 * 1024;
    // Two segments (and the relocation area's header), and no checkpoint while
    // the store runs: retention can delete nothing.
    let cap = Retention { keep_for: None, max_log_bytes: Some(2 * segment + 4096), ..Retention::default() };
    let config = || {
        no_periodic_flush(dir.path())
            .with_segment_size(segment)
            .with_retention(cap)
            .with_put_timeout(Duration::from_millis(200))
    };
    let store = Store::open(config()).unwrap();
    let body = "y".repeat(1000);
    let batch = |tag: &str| -> Vec<Message> {
        (0..38).map(|i| Message::new("B", format!("{tag}{i}{body}")).queue_id(0)).collect()
    };
    store.put_batch(batch("a")).unwrap();
    // Does not fit in the rest of the first segment: starts the second.
    store.put_batch(batch("b")).unwrap();
    let err = store.put_batch(batch("c")).unwrap_err();
    assert!(matches!(err, Error::SizeCap { .. }), "{err}");
    store.close().unwrap();
    let store = Store::open(config()).unwrap();
    let mut consumer = store.consumer("B", 0).unwrap();
    let got = bodies(&drain(&mut consumer, 3 * 38));
    assert_eq!(got.len(), 2 * 38, "the first two batches only");
    assert!(got.iter().all(|b| !b.starts_with('c')));
    store.close().unwrap();
}

#[test]
fn a_sync_batch_returns_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(small_config(dir.path()).with_flush_mode(FlushMode::Sync)).unwrap();
    let receipts = store.put_batch(numbered_messages("B", 0..100)).unwrap();
    store.wait_durable(receipts.last().unwrap(), Duration::ZERO).expect("on disk when put_batch returns");
    store.close().unwrap();
}

#[test]
fn tickets_resolve_once_durable_in_sync_and_async_mode() {
    for mode in [FlushMode::Sync, FlushMode::Async] {
        let dir = tempfile::tempdir().unwrap();
        let config =
            small_config(dir.path()).with_flush_mode(mode).with_flush_interval(Duration::from_millis(50));
        let store = Store::open(config).unwrap();
        let tickets: Vec<_> =
            numbered_messages("P", 0..1_000).into_iter().map(|m| store.submit(m).unwrap()).collect();
        let last = tickets.last().unwrap().wait(Duration::from_secs(5)).unwrap();
        for ticket in &tickets {
            assert!(ticket.is_durable().unwrap(), "{mode:?}: durable below the last one");
        }
        store.wait_durable(&last, Duration::ZERO).unwrap();
        let mut consumer = store.consumer("P", 0).unwrap();
        assert_eq!(bodies(&drain(&mut consumer, 1_000)), numbered(0..1_000), "{mode:?}");
        store.close().unwrap();
    }
}

#[test]
fn a_submitted_batch_stands_whole_at_once_and_its_tickets_resolve_with_one_sync() {
    let dir = tempfile::tempdir().unwrap();
    // Async mode with a slow periodic flush: nothing is durable when submit_batch returns.
    let config = small_config(dir.path()).with_flush_interval(Duration::from_millis(300));
    let store = Store::open(config).unwrap();
    let tickets = store.submit_batch(numbered_messages("S", 0..100)).unwrap();
    assert_eq!(tickets.len(), 100);
    assert!(tickets.windows(2).all(|w| w[0].receipt().offset() < w[1].receipt().offset()), "in order");
    assert!(!tickets[0].is_durable().unwrap(), "returned before the sync");
    tickets[0].wait(Duration::from_secs(5)).unwrap();
    assert!(tickets.iter().all(|t| t.is_durable().unwrap()), "one sync made the whole batch durable");
    let mut batch = numbered_messages("S", 100..105);
    batch[2] = Message::new("S", "bad level").queue_id(0).delay_level(99);
    assert!(matches!(store.submit_batch(batch), Err(Error::InBatch { index: 2, .. })));
    assert!(store.submit_batch(Vec::new()).unwrap().is_empty(), "an empty batch writes nothing");
    let mut consumer = store.consumer("S", 0).unwrap();
    assert_eq!(bodies(&drain(&mut consumer, 101)), numbered(0..100), "nothing of the refused batch");
    store.close().unwrap();
}

/// Wakes the thread that polls.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` on this thread; returns its output and how many times it was polled.
fn block_on<F: Future>(future: F) -> (F::Output, usize) {
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    for polls in 1.. {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return (out, polls);
        }
        // Only a wake-up (or this long timeout, which the caller's deadline catches) polls again.
        std::thread::park_timeout(Duration::from_secs(10));
    }
    unreachable!()
}

#[test]
fn a_ticket_is_a_future_woken_by_the_flush() {
    let dir = tempfile::tempdir().unwrap();
    // Async mode with a slow periodic flush: the ticket must wait for it, and be woken by it.
    let config = small_config(dir.path()).with_flush_interval(Duration::from_millis(300));
    let store = Store::open(config).unwrap();
    let started = Instant::now();
    let ticket = store.submit(Message::new("F", "awaited").queue_id(0)).unwrap();
    let (receipt, polls) = block_on(ticket);
    let receipt = receipt.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "woken by the flush, not by the timeout");
    assert!(polls >= 2, "not durable at once in async mode: polled {polls} times");
    store.wait_durable(&receipt, Duration::ZERO).unwrap();
    store.close().unwrap();
}
