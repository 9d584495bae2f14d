//! `verify`, `audit` and `summary` on a store with recurring schedules:
//! occurrence records are reschedule records that deliver, and the tools
//! judge them by the library's rules.

mod common;

use std::time::Duration;

use common::*;
use delaywheel::{CancelOutcome, ManualClock, Message, Recurrence, Schedule, Store};

/// Two schedules every second from T0 + 1 s: one of 3 occurrences, all
/// delivered; one unbounded, 5 delivered then cancelled; a third replaced
/// by an update before its first occurrence (the replaced one counts as
/// cancelled), the update still pending. Closed cleanly.
fn with_schedules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    let every = |body: &str| {
        Schedule::new(Message::new(TOPIC, body.to_string()), Recurrence::every(Duration::from_secs(1)))
            .start_at_ms(T0 + 1_000)
    };
    store.schedule(every("three").limit(3)).unwrap();
    let endless = store.schedule(every("endless")).unwrap().handle();
    let later = store.schedule(every("later").start_at_ms(T0 + 3_600_000)).unwrap().handle();
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let mut got = 0;
    for s in 1..=5 {
        clock.set_ms(T0 + 1_000 * s);
        got += drain(&mut consumer, if s <= 3 { 2 } else { 1 });
    }
    assert_eq!(got, 8);
    assert_eq!(store.cancel_schedule(endless).unwrap(), CancelOutcome::Cancelled);
    let updated = store.update_schedule(later, every("later still").start_at_ms(T0 + 7_200_000)).unwrap();
    assert!(matches!(updated, delaywheel::UpdateOutcome::Updated(_)));
    store.close().unwrap();
    dir
}

fn drain(consumer: &mut delaywheel::Consumer, want: usize) -> usize {
    let mut got = 0;
    while got < want {
        let batch = consumer.poll(want - got, Duration::from_secs(5)).unwrap();
        assert!(!batch.is_empty(), "{got} of {want}");
        got += batch.len();
    }
    got
}

#[test]
fn a_store_with_schedules_verifies_and_audits_clean() {
    let dir = with_schedules();
    let out = dump(dir.path(), &["verify", "--json"]);
    let doc = json(&out);
    assert_eq!((out.status.code(), &doc["ok"]), (Some(0), &true.into()), "{doc}");
    assert_eq!(doc["checked"]["queue_entries"], 8, "one per occurrence delivered");
    let out = dump(dir.path(), &["audit", "--json"]);
    let expected = serde_json::json!({"schema_version": 1, "timer_messages": 4, "delivered": 1,
        "cancelled": 2, "pending": 1, "lost": 0, "duplicated": 0, "early": 0, "reclaimed": 0,
        "unreadable_log_stretches": 0, "unreadable_log_bytes": 0, "rescheduled": 0,
        "fired_after_reschedule": 0, "schedules": 4, "occurrences_delivered": 8,
        "occurrences_duplicated": 0, "occurrences_early": 0, "occurrences_missing": 0});
    assert_eq!((out.status.code(), json(&out)), (Some(0), expected));
}

#[test]
fn an_occurrence_delivered_twice_or_skipped_on_time_fails_the_audit() {
    use delaywheel::internals::record::{OccurrenceFields, Record, RescheduleView};
    let dir = with_schedules();
    // The first occurrence record of "three": a copy of it delivers its timer again.
    let (records, _) = records(dir.path());
    let (_, first) = records
        .iter()
        .find(|(at, bytes)| matches!(decoded(*at, bytes), Record::Reschedule(r) if r.delivers()))
        .expect("an occurrence record");
    let twice = copy_of(dir.path());
    append_copy(twice.path(), first.clone(), |_| {});
    let out = dump(twice.path(), &["audit", "--json"]);
    let doc = json(&out);
    assert_eq!(
        (out.status.code(), &doc["occurrences_duplicated"], &doc["duplicated"]),
        (Some(1), &1.into(), &1.into())
    );
    // The same record saying it skipped the occurrence, fired on time: nothing excuses it.
    let skipped = copy_of(dir.path());
    let (at, _) = records.iter().find(|(_, bytes)| bytes == first).unwrap();
    let r = RescheduleView::parse(first).unwrap();
    let on_time =
        RescheduleView { occurrence: r.occurrence.map(|o| OccurrenceFields { delivers: false, ..o }), ..r };
    let mut bytes = first.clone();
    on_time.encode(&mut bytes, *at);
    write_at(&segment0(skipped.path()), *at, &bytes);
    let out = dump(skipped.path(), &["audit", "--json"]);
    let doc = json(&out);
    assert_eq!((out.status.code(), &doc["occurrences_missing"]), (Some(1), &1.into()), "{doc}");
}
