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
/// cancelled), the update still pending. Closed cleanly. The occurrences
/// that fire together share an occurrences record (kind 8); with
/// `version_2`, the store is reopened as one the previous build wrote
/// before they fire, so each gets a record of its own (kind 6).
fn with_schedules(version_2: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let mut store = Store::open(config(dir.path(), &clock)).unwrap();
    let every = |body: &str| {
        Schedule::new(Message::new(TOPIC, body.to_string()), Recurrence::every(Duration::from_secs(1)))
            .start_at_ms(T0 + 1_000)
    };
    store.schedule(every("three").limit(3)).unwrap();
    let endless = store.schedule(every("endless")).unwrap().handle();
    let later = store.schedule(every("later").start_at_ms(T0 + 3_600_000)).unwrap().handle();
    if version_2 {
        store.close().unwrap();
        set_segment_versions(dir.path(), 2);
        store = Store::open(config(dir.path(), &clock)).unwrap();
    }
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

/// How many occurrences records (kind 8) and occurrence records that deliver (kind 6) the log holds.
fn occurrence_records(dir: &std::path::Path) -> (usize, usize) {
    use delaywheel::internals::record::Record;
    let (records, _) = records(dir);
    let kinds: Vec<Record<'_>> = records.iter().map(|(at, bytes)| decoded(*at, bytes)).collect();
    let batched = kinds.iter().filter(|r| matches!(r, Record::Occurrences(_))).count();
    let single = kinds.iter().filter(|r| matches!(r, Record::Reschedule(r) if r.delivers())).count();
    (batched, single)
}

#[test]
fn a_store_with_schedules_verifies_and_audits_clean() {
    for version_2 in [false, true] {
        let dir = with_schedules(version_2);
        // Seconds 1 and 2 fire both schedules' occurrences, 3 "endless"'s (the last
        // of "three" is a delivery record), 4 and 5 "endless"'s.
        let records = if version_2 { (0, 7) } else { (5, 0) };
        assert_eq!(occurrence_records(dir.path()), records, "version 2: {version_2}");
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
        assert_eq!((out.status.code(), json(&out)), (Some(0), expected), "version 2: {version_2}");
    }
}

#[test]
fn a_copy_of_an_occurrences_record_delivers_each_of_its_occurrences_twice() {
    use delaywheel::internals::record::{Record, encode_occurrences, occurrences_len};
    let dir = with_schedules(false);
    let (records, end) = records(dir.path());
    let Some(Record::Occurrences(first)) = records
        .iter()
        .map(|(at, bytes)| decoded(*at, bytes))
        .find(|r| matches!(r, Record::Occurrences(o) if o.len() == 2))
    else {
        panic!("an occurrences record of two")
    };
    // Its entries again at the log's end: they name the timers they fired
    // by distance back from themselves, so they are encoded anew there.
    let views: Vec<_> = first.entries().map(|(_, view)| view).collect();
    let mut again = vec![0; occurrences_len(views.len())];
    encode_occurrences(&mut again, end, first.delivered_at_ms, &views);
    let twice = copy_of(dir.path());
    append_copy(twice.path(), again, |_| {});
    let out = dump(twice.path(), &["audit", "--json"]);
    let doc = json(&out);
    assert_eq!(
        (out.status.code(), &doc["occurrences_duplicated"], &doc["duplicated"]),
        (Some(1), &2.into(), &2.into()),
        "{doc}"
    );
}

#[test]
fn an_occurrence_delivered_twice_or_skipped_on_time_fails_the_audit() {
    use delaywheel::internals::record::{OccurrenceFields, Record, RescheduleView};
    let dir = with_schedules(true);
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
