//! Idempotent puts: a dedup key makes a retried or repeated put answer the
//! first receipt while the first message stands, and a new put after.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use delaywheel::{
    CancelOutcome, Config, Error, ManualClock, Message, Receipt, ReplaceOutcome, Scheduler, Store,
};

const MINUTE: u64 = 60_000;
const HOUR: u64 = 60 * MINUTE;

fn store_with_window(dir: &std::path::Path, clock: &ManualClock, window_ms: u64) -> Store {
    let config =
        small_config(dir).with_clock(clock.clone()).with_dedup_window(Duration::from_millis(window_ms));
    Store::open(config).unwrap()
}

fn timeout(key: &str, body: &str, at: u64) -> Message {
    Message::new("OrderTimeout", body.to_string()).queue_id(0).dedup_key(key).deliver_at_ms(at)
}

fn put(store: &Store, message: Message) -> Receipt {
    store.put(message).unwrap()
}

#[test]
fn a_repeated_put_while_pending_answers_the_first_receipt_and_one_message_fires() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let first = put(&store, timeout("order-42", "first", T0 + 1_000));
    assert!(!first.is_duplicate());
    let again = put(&store, timeout("order-42", "second", T0 + 5_000));
    assert!(again.is_duplicate(), "{again:?}");
    assert_eq!((again.offset(), again.handle(), again.store_time_ms()), (first.offset(), first.handle(), T0));
    let other = put(&store, timeout("order-43", "other", T0 + 1_000));
    assert!(!other.is_duplicate(), "another key is another message");
    let other_topic = put(&store, Message::new("Other", "x").dedup_key("order-42").deliver_at_ms(T0 + 1_000));
    assert!(!other_topic.is_duplicate(), "a key is unique per topic");
    assert_eq!(store.fresh_stats().unwrap().pending, 3);
    let listed = store.pending(T0..T0 + 2_000, 10).unwrap();
    assert_eq!(
        listed.iter().filter_map(|t| t.dedup_key.as_deref()).collect::<Vec<_>>(),
        ["order-42", "order-43", "order-42"]
    );

    let mut consumer = store.consumer("OrderTimeout", 0).unwrap();
    clock.set_ms(T0 + 10_000);
    let got = drain_idle(&mut consumer, 3, Duration::from_millis(500));
    assert_eq!(bodies(&got), ["first", "other"], "the duplicate wrote nothing");
    assert_eq!(got[0].dedup_key(), Some("order-42"));
    assert!(got[0].properties().is_empty(), "the key is not a property: {:?}", got[0].properties());
}

#[test]
fn after_firing_the_key_stands_for_the_window_from_its_due_time() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_with_window(dir.path(), &clock, 10 * MINUTE);
    let first = put(&store, timeout("k", "first", T0 + HOUR));
    let mut consumer = store.consumer("OrderTimeout", 0).unwrap();
    clock.set_ms(T0 + HOUR + 1_000);
    assert_eq!(bodies(&drain_idle(&mut consumer, 1, Duration::from_secs(2))), ["first"]);

    // An hour after the put, but inside the window after it fired.
    clock.set_ms(T0 + HOUR + 9 * MINUTE);
    let late_retry = put(&store, timeout("k", "retry", T0 + 2 * HOUR));
    assert!(late_retry.is_duplicate());
    assert_eq!(late_retry.offset(), first.offset());

    clock.set_ms(T0 + HOUR + 11 * MINUTE);
    let next = put(&store, timeout("k", "next", T0 + 2 * HOUR));
    assert!(!next.is_duplicate(), "the window after it fired passed");
    clock.set_ms(T0 + 2 * HOUR);
    assert_eq!(bodies(&drain_idle(&mut consumer, 2, Duration::from_millis(500))), ["next"]);
}

#[test]
fn after_a_cancel_the_key_stands_for_the_window_from_the_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_with_window(dir.path(), &clock, 10 * MINUTE);
    let first = put(&store, timeout("k", "first", T0 + 2 * HOUR));
    clock.set_ms(T0 + 30 * MINUTE);
    assert_eq!(store.cancel(first.handle().unwrap()).unwrap(), CancelOutcome::Cancelled);

    clock.set_ms(T0 + 39 * MINUTE);
    assert!(
        put(&store, timeout("k", "retry", T0 + 2 * HOUR)).is_duplicate(),
        "inside the window after the cancel"
    );
    clock.set_ms(T0 + 41 * MINUTE);
    let next = put(&store, timeout("k", "next", T0 + 2 * HOUR));
    assert!(!next.is_duplicate(), "the window runs from the cancel, not from the due time");
    let mut consumer = store.consumer("OrderTimeout", 0).unwrap();
    clock.set_ms(T0 + 2 * HOUR);
    assert_eq!(bodies(&drain_idle(&mut consumer, 2, Duration::from_millis(500))), ["next"]);
}

#[test]
fn a_pending_timer_holds_its_key_past_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_with_window(dir.path(), &clock, MINUTE);
    let first = put(&store, timeout("k", "first", T0 + 24 * HOUR));
    clock.set_ms(T0 + 12 * HOUR);
    let retry = put(&store, timeout("k", "retry", T0 + 24 * HOUR));
    assert!(retry.is_duplicate(), "pending, long after the window after its put");
    assert_eq!(retry.handle(), first.handle());
}

#[test]
fn an_ordinary_message_keeps_its_key_for_the_window_after_its_put() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_with_window(dir.path(), &clock, MINUTE);
    let plain = || Message::new("Payments", "pay").queue_id(0).dedup_key("payment-7");
    let first = put(&store, plain());
    let retry = put(&store, plain());
    assert!(retry.is_duplicate());
    assert_eq!((retry.offset(), retry.handle()), (first.offset(), None));
    clock.set_ms(T0 + MINUTE);
    assert!(!put(&store, plain()).is_duplicate(), "the window passed");
    let mut consumer = store.consumer("Payments", 0).unwrap();
    assert_eq!(drain_idle(&mut consumer, 3, Duration::from_millis(500)).len(), 2);
}

#[test]
fn racing_producers_with_the_same_keys_make_one_message_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Arc::new(store_at(dir.path(), &clock));
    let (threads, keys, rounds) = (8, 50, 4);
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                for round in 0..rounds {
                    for k in 0..keys {
                        let key = format!("order-{}", (k + t * 7 + round) % keys);
                        let receipt = store.put(timeout(&key, &format!("{t}"), T0 + HOUR)).unwrap();
                        answers.push((key, receipt));
                    }
                }
                answers
            })
        })
        .collect();
    let answers: Vec<(String, Receipt)> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    let mut by_key = std::collections::HashMap::<String, Vec<Receipt>>::new();
    for (key, receipt) in answers {
        by_key.entry(key).or_default().push(receipt);
    }
    assert_eq!(by_key.len(), keys);
    for (key, receipts) in &by_key {
        assert_eq!(receipts.iter().filter(|r| !r.is_duplicate()).count(), 1, "{key}: one put wrote");
        assert!(receipts.iter().all(|r| r.offset() == receipts[0].offset()), "{key}: one message");
    }
    assert_eq!(store.fresh_stats().unwrap().pending, keys as u64);
}

#[test]
fn a_duplicate_is_recognised_after_a_kill_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(no_periodic_flush(dir.path()).with_clock(clock.clone())).unwrap();
    // Some indexed before the kill, and the last one not yet (its index entries lie past the checkpoint).
    let firsts: Vec<Receipt> =
        (0..20).map(|i| put(&store, timeout(&format!("k{i}"), &format!("{i}"), T0 + HOUR))).collect();
    let image = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), image.path());
    drop(store);

    let store = Store::open(no_periodic_flush(image.path()).with_clock(clock.clone())).unwrap();
    for (i, first) in firsts.iter().enumerate() {
        let retry = put(&store, timeout(&format!("k{i}"), "retry", T0 + HOUR));
        assert!(retry.is_duplicate(), "k{i}");
        assert_eq!(retry.handle(), first.handle(), "k{i}");
    }
    assert!(!put(&store, timeout("k20", "new", T0 + HOUR)).is_duplicate());
    store.close().unwrap();
    // The dedup index is rebuilt if it is lost: the log is the truth.
    std::fs::remove_dir_all(image.path().join("index").join("dedup")).unwrap();
    let store = Store::open(no_periodic_flush(image.path()).with_clock(clock.clone())).unwrap();
    for i in [0, 19, 20] {
        assert!(put(&store, timeout(&format!("k{i}"), "retry", T0 + HOUR)).is_duplicate(), "k{i}");
    }
    assert_eq!(store.fresh_stats().unwrap().pending, 21);
}

#[test]
fn a_key_in_any_dedup_index_file_is_found_after_a_reopen() {
    // Four entries a file: the keys lie in full files, whose in-memory
    // filters a reopen fills from the entries, and in the newest one.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let config = || small_config(dir.path()).with_clock(clock.clone()).with_key_index_file_entries(4);
    let store = Store::open(config()).unwrap();
    let firsts: Vec<Receipt> =
        (0..30).map(|i| put(&store, timeout(&format!("k{i}"), &format!("{i}"), T0 + HOUR))).collect();
    store.close().unwrap();
    let files = std::fs::read_dir(dir.path().join("index").join("dedup")).unwrap().count();
    assert!(files >= 7, "{files} dedup index files");

    let store = Store::open(config()).unwrap();
    for (i, first) in firsts.iter().enumerate() {
        let retry = put(&store, timeout(&format!("k{i}"), "retry", T0 + HOUR));
        assert!(retry.is_duplicate() && retry.handle() == first.handle(), "k{i}");
    }
    assert!(!put(&store, timeout("k30", "new", T0 + HOUR)).is_duplicate());
    assert_eq!(store.fresh_stats().unwrap().pending, 31);
}

#[test]
fn a_key_replaced_across_many_index_files_names_its_newest_message() {
    // Four entries a file, and one key replaced again and again among
    // others: the lookup reads the index newest file first, and must still
    // answer the newest message, before and after a reopen (which empties
    // the list of records not yet indexed).
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let config = || small_config(dir.path()).with_clock(clock.clone()).with_key_index_file_entries(4);
    let store = Store::open(config()).unwrap();
    // In the oldest file only: a lookup passes every newer file to find it.
    let oldest = put(&store, timeout("order-1", "first", T0 + HOUR));
    let mut latest = put(&store, timeout("order-42", "0", T0 + HOUR));
    for i in 1..=12u64 {
        put(&store, timeout(&format!("other-{i}"), "x", T0 + HOUR));
        let ReplaceOutcome::Replaced { receipt, replaced } =
            store.put_replacing(timeout("order-42", &i.to_string(), T0 + HOUR + i)).unwrap()
        else {
            panic!("replacement {i}: the key's timer is pending")
        };
        assert_eq!(Some(replaced), latest.handle(), "replacement {i} replaced the newest");
        latest = receipt;
        if i % 4 == 0 {
            store.fresh_stats().unwrap();
        }
    }
    let retry = put(&store, timeout("order-42", "retry", T0 + HOUR));
    assert!(retry.is_duplicate() && retry.handle() == latest.handle());
    store.close().unwrap();
    let files = std::fs::read_dir(dir.path().join("index").join("dedup")).unwrap().count();
    assert!(files >= 6, "{files} dedup index files");

    let store = Store::open(config()).unwrap();
    let retry = put(&store, timeout("order-42", "retry", T0 + HOUR));
    assert!(retry.is_duplicate() && retry.handle() == latest.handle(), "after a reopen");
    let retry = put(&store, timeout("order-1", "retry", T0 + HOUR));
    assert!(retry.is_duplicate() && retry.handle() == oldest.handle(), "a key of the oldest file");
    let ReplaceOutcome::Replaced { replaced, .. } =
        store.put_replacing(timeout("order-42", "last", T0 + 2 * HOUR)).unwrap()
    else {
        panic!("the newest is pending")
    };
    assert_eq!(Some(replaced), latest.handle());
    assert_eq!(store.fresh_stats().unwrap().pending, 14);
}

#[test]
fn a_submitted_duplicate_resolves_with_the_first_message() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(
        small_config(dir.path()).with_clock(clock.clone()).with_flush_mode(delaywheel::FlushMode::Sync),
    )
    .unwrap();
    let first = store.submit(timeout("k", "first", T0 + HOUR)).unwrap();
    let retry = store.submit(timeout("k", "retry", T0 + HOUR)).unwrap();
    assert!(retry.receipt().is_duplicate());
    retry.wait(Duration::from_secs(10)).unwrap();
    first.wait(Duration::from_secs(10)).unwrap();
    assert_eq!(retry.receipt().offset(), first.receipt().offset());
}

#[test]
fn bad_dedup_keys_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let field = |result: Result<Receipt, Error>| match result {
        Err(Error::Invalid { what, .. }) => what,
        other => panic!("expected Invalid, got {other:?}"),
    };
    assert_eq!(field(store.put(timeout("", "b", T0 + 1)),), "dedup_key");
    assert_eq!(field(store.put(timeout(&"k".repeat(delaywheel::MAX_KEY_LEN + 1), "b", T0 + 1))), "dedup_key");
    let forged = Message::new("T", "b").property("dw.dedup_key", "k");
    assert_eq!(field(store.put(forged)), "properties", "the property is set only through dedup_key");
    match store.put_batch([Message::new("T", "a"), timeout("k", "b", T0 + 1), timeout("", "c", T0 + 1)]) {
        Err(Error::InBatch { index: 2, source }) => {
            assert!(matches!(*source, Error::Invalid { what: "dedup_key", .. }))
        }
        other => panic!("expected InBatch, got {other:?}"),
    }
    let past_the_clock = timeout("k2", "c", delaywheel::MAX_DELIVER_AT_MS + 1);
    match store.put_batch([timeout("k", "a", T0 + 1), Message::new("T", "b"), past_the_clock]) {
        Err(Error::InBatch { index: 2, source }) => {
            assert!(matches!(*source, Error::Invalid { what: "deliver time", .. }), "{source:?}")
        }
        other => panic!("expected InBatch naming the third message, got {other:?}"),
    }
    assert!(!put(&store, timeout("k", "after", T0 + 1)).is_duplicate(), "the refused batch wrote nothing");
    assert_eq!(store.fresh_stats().unwrap().pending, 1, "only the put after the batches");
    store.close().unwrap();

    let buckets = tempfile::tempdir().unwrap();
    let store = Store::open(Config::new(buckets.path()).with_scheduler(Scheduler::Buckets)).unwrap();
    assert_eq!(field(store.put(Message::new("T", "b").dedup_key("k").delay_level(1))), "dedup_key");
}

#[test]
fn a_batch_writes_only_the_messages_whose_key_does_not_stand() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let standing = put(&store, timeout("k2", "standing", T0 + HOUR));
    let batch = [
        timeout("k1", "a", T0 + HOUR),
        Message::new("OrderTimeout", "b").queue_id(0),
        timeout("k1", "a again", T0 + HOUR),
        timeout("k2", "retry", T0 + HOUR),
        timeout("k3", "c", T0 + HOUR),
    ];
    let receipts = store.put_batch(batch.clone()).unwrap();
    let duplicates: Vec<bool> = receipts.iter().map(Receipt::is_duplicate).collect();
    assert_eq!(duplicates, [false, false, true, true, false]);
    assert_eq!(receipts[2].offset(), receipts[0].offset(), "a key twice in one batch is one message");
    assert_eq!(receipts[3].handle(), standing.handle());
    let again = store.submit_batch(batch).unwrap();
    assert!(
        again.iter().filter(|t| t.receipt().deliver_at_ms().is_some()).all(|t| t.receipt().is_duplicate())
    );
    for ticket in &again {
        ticket.wait(Duration::from_secs(10)).unwrap();
    }
    let tried = store.try_submit_batch(&[timeout("k1", "x", T0 + HOUR)]).unwrap().expect("no wait");
    assert!(tried[0].receipt().is_duplicate(), "inside the window after the put: no need to ask the wheel");
    assert_eq!(store.fresh_stats().unwrap().pending, 3, "k1, k2 and k3 once each");
}

#[test]
fn a_sync_put_that_timed_out_is_retried_as_a_duplicate_and_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    // A put timeout shorter than any sync: the put answers NotYetDurable, though its message stands.
    let config = small_config(dir.path())
        .with_clock(clock.clone())
        .with_flush_mode(delaywheel::FlushMode::Sync)
        .with_put_timeout(Duration::from_nanos(1));
    let store = Store::open(config).unwrap();
    let first = match store.put(timeout("order-42", "first", T0 + 1_000)) {
        Err(Error::NotYetDurable { written: delaywheel::Written::Put(receipt), .. }) => receipt,
        other => panic!("a sync takes more than a nanosecond: {other:?}"),
    };
    // The caller took the error for a failure and retries.
    let retried = match store.put(timeout("order-42", "retry", T0 + 1_000)) {
        Ok(receipt) | Err(Error::NotYetDurable { written: delaywheel::Written::Put(receipt), .. }) => receipt,
        other => panic!("{other:?}"),
    };
    assert!(retried.is_duplicate());
    assert_eq!(retried.handle(), first.handle());
    store.wait_durable(&retried, Duration::from_secs(10)).unwrap();
    let mut consumer = store.consumer("OrderTimeout", 0).unwrap();
    clock.set_ms(T0 + 2_000);
    assert_eq!(bodies(&drain_idle(&mut consumer, 2, Duration::from_millis(500))), ["first"]);
}

fn replacing(store: &Store, body: &str, at: u64) -> ReplaceOutcome {
    store.put_replacing(timeout("order-42", body, at)).unwrap()
}

#[test]
fn put_replacing_takes_the_place_of_the_pending_timer_and_only_the_new_one_fires() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let ReplaceOutcome::Put(first) = replacing(&store, "first", T0 + 5_000) else {
        panic!("nothing to replace")
    };
    let ReplaceOutcome::Replaced { receipt: second, replaced } = replacing(&store, "second", T0 + 20_000)
    else {
        panic!("the first is pending")
    };
    assert_eq!(Some(replaced), first.handle());
    assert_ne!(second.offset(), first.offset());
    let ReplaceOutcome::Replaced { receipt: third, replaced } = replacing(&store, "third", T0 + 10_000)
    else {
        panic!("the second is pending")
    };
    assert_eq!(Some(replaced), second.handle(), "each replacement names the timer it replaced");
    assert_eq!(store.cancel(first.handle().unwrap()).unwrap(), CancelOutcome::Cancelled, "replaced");
    assert_eq!(store.fresh_stats().unwrap().pending, 1);
    let retry = put(&store, timeout("order-42", "retry", T0 + 1_000));
    assert!(retry.is_duplicate() && retry.handle() == third.handle(), "the key names the latest");

    let mut consumer = store.consumer("OrderTimeout", 0).unwrap();
    clock.set_ms(T0 + 30_000);
    let got = drain_idle(&mut consumer, 3, Duration::from_millis(500));
    assert_eq!(bodies(&got), ["third"]);
    assert_eq!(got[0].deliver_at_ms(), Some(T0 + 10_000));
    assert!(got[0].properties().is_empty(), "{:?}", got[0].properties());
    // Fired: a replacement now is a plain put.
    assert!(matches!(replacing(&store, "later", T0 + 40_000), ReplaceOutcome::Put(_)));
    clock.set_ms(T0 + 40_000);
    assert_eq!(bodies(&drain_idle(&mut consumer, 2, Duration::from_millis(500))), ["later"]);
}

#[test]
fn a_replaced_timer_stays_replaced_after_a_kill_and_a_rescheduled_one_is_replaced_too() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(no_periodic_flush(dir.path()).with_clock(clock.clone())).unwrap();
    let first = replacing(&store, "first", T0 + 5_000).receipt();
    store.reschedule(first.handle().unwrap(), T0 + 7_000).unwrap();
    assert!(matches!(replacing(&store, "second", T0 + 9_000), ReplaceOutcome::Replaced { .. }));
    let image = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), image.path());
    drop(store);

    let store = Store::open(no_periodic_flush(image.path()).with_clock(clock.clone())).unwrap();
    assert_eq!(store.fresh_stats().unwrap().pending, 1);
    let mut consumer = store.consumer("OrderTimeout", 0).unwrap();
    clock.set_ms(T0 + 10_000);
    let got = drain_idle(&mut consumer, 3, Duration::from_millis(500));
    assert_eq!(bodies(&got), ["second"], "neither the first nor its reschedule fires");
}

#[test]
fn put_replacing_needs_a_timed_message_with_a_dedup_key() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let what = |m: Message| match store.put_replacing(m) {
        Err(Error::Invalid { what, .. }) => what,
        other => panic!("expected Invalid, got {other:?}"),
    };
    assert_eq!(what(Message::new("T", "b").deliver_at_ms(T0 + 1)), "dedup_key");
    assert_eq!(what(Message::new("T", "b").dedup_key("k")), "timing");
    store.schedule(daily("report", 10_000)).unwrap();
    let onto_a_schedule = Message::new("Reports", "b").dedup_key("report").deliver_at_ms(T0 + 1);
    assert_eq!(what(onto_a_schedule), "dedup_key", "a schedule is replaced by schedule_replacing");
    assert_eq!(
        what(Message::new("T", "b").property("dw.replaces", "1@2").dedup_key("k").deliver_at_ms(T0 + 1)),
        "properties"
    );
}

fn daily(key: &str, every_ms: u64) -> delaywheel::Schedule {
    let template = Message::new("Reports", "report").queue_id(0).dedup_key(key);
    delaywheel::Schedule::new(template, delaywheel::Recurrence::every(Duration::from_millis(every_ms)))
}

#[test]
fn a_schedule_with_a_dedup_key_is_created_once_while_it_is_active() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_with_window(dir.path(), &clock, MINUTE);
    let first = store.schedule(daily("report", 10_000)).unwrap();
    let again = store.schedule(daily("report", 20_000)).unwrap();
    assert!(again.is_duplicate() && again.handle() == first.handle(), "a second replica's create");
    clock.set_ms(T0 + HOUR);
    assert!(store.schedule(daily("report", 10_000)).unwrap().is_duplicate(), "active, long after the window");
    assert_eq!(store.schedules(Some("Reports"), 10).unwrap().len(), 1);
    assert_eq!(store.cancel_schedule(first.handle()).unwrap(), CancelOutcome::Cancelled);
    clock.set_ms(T0 + HOUR + 2 * MINUTE);
    assert!(!store.schedule(daily("report", 10_000)).unwrap().is_duplicate(), "cancelled, past the window");
}

#[test]
fn schedule_replacing_updates_the_active_schedule_of_the_key_or_creates_one() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_at(dir.path(), &clock);
    let ReplaceOutcome::Put(first) = store.schedule_replacing(daily("report", 10_000)).unwrap() else {
        panic!("none to replace")
    };
    let ReplaceOutcome::Replaced { receipt, replaced } =
        store.schedule_replacing(daily("report", 60_000)).unwrap()
    else {
        panic!("the first is active")
    };
    assert_eq!(Some(replaced), first.handle());
    assert_eq!(store.schedule_of(replaced).unwrap(), None, "the old one is replaced");
    let listed = store.schedules(Some("Reports"), 10).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(Some(listed[0].handle), receipt.handle());
    let what = match store.schedule_replacing(delaywheel::Schedule::new(
        Message::new("Reports", "r"),
        delaywheel::Recurrence::every(Duration::from_secs(1)),
    )) {
        Err(Error::Invalid { what, .. }) => what,
        other => panic!("{other:?}"),
    };
    assert_eq!(what, "template");
}

#[test]
fn try_submit_batch_leaves_to_submit_batch_a_key_only_the_wheel_can_judge() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = store_with_window(dir.path(), &clock, MINUTE);
    let first = put(&store, timeout("k", "first", T0 + HOUR));
    clock.set_ms(T0 + 2 * MINUTE);
    assert!(
        store.try_submit_batch(&[timeout("k", "retry", T0 + HOUR)]).unwrap().is_none(),
        "the wheel must say"
    );
    let tickets = store.submit_batch([timeout("k", "retry", T0 + HOUR)]).unwrap();
    assert!(tickets[0].receipt().is_duplicate() && tickets[0].receipt().offset() == first.offset());
    let fresh = store
        .try_submit_batch(&[timeout("other", "new", T0 + HOUR)])
        .unwrap()
        .expect("a new key needs no wait");
    assert!(!fresh[0].receipt().is_duplicate());
}
