//! A store written by the previous commit-log version (segments of version
//! 1, which hold no deliveries records) still opens and delivers: with
//! delivery records (kind 2) while its tail segment is of version 1, with
//! deliveries records (kind 7) once a segment of version 2 begins; `verify`
//! passes on both. A segment of a version this build does not know is
//! refused, naming the file and the version.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use delaywheel::internals::{COMMITLOG_MAGIC, FileHeader};
use delaywheel::{Error, ManualClock, Message, Store};

fn drain(store: &Store, n: usize) -> usize {
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let (mut got, started) = (0, Instant::now());
    while got < n && started.elapsed() < Duration::from_secs(20) {
        got += consumer.poll(n, Duration::from_millis(100)).unwrap().len();
    }
    consumer.commit();
    got
}

fn checked(dir: &Path) -> serde_json::Value {
    let out = dump(dir, &["verify", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    json(&out)["checked"].clone()
}

#[test]
fn a_store_of_version_1_segments_opens_and_delivers_runs_from_its_next_segment() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    for i in 0..100u64 {
        store.put(Message::new(TOPIC, format!("old-{i}")).deliver_at_ms(T0 + 60_000 + i % 3)).unwrap();
    }
    store.close().unwrap();
    // What the previous build wrote: the same records under version 1 headers.
    set_segment_versions(dir.path(), 1);

    let store = Store::open(config(dir.path(), &clock)).unwrap();
    clock.set_ms(T0 + 61_000);
    assert_eq!(drain(&store, 100), 100);
    store.close().unwrap();
    let c = checked(dir.path());
    assert_eq!((c["deliveries"].as_u64(), c["delivery_runs"].as_u64()), (Some(100), None), "{c}");

    // Fillers roll the log to a new segment, of version 2; timers fired
    // there go as runs.
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    for i in 0..80 {
        store.put(Message::new("Filler", format!("{i}-{}", "x".repeat(1_000)))).unwrap();
    }
    for i in 0..100u64 {
        store.put(Message::new(TOPIC, format!("new-{i}")).deliver_at_ms(T0 + 180_000 + i % 3)).unwrap();
    }
    // Timers that reach the wheel before their second fire together.
    wait_until(|| store.stats().dispatch_lag_bytes == 0);
    clock.set_ms(T0 + 181_000);
    assert_eq!(drain(&store, 100), 100);
    store.close().unwrap();
    let c = checked(dir.path());
    assert_eq!(c["deliveries"], 200, "{c}");
    assert!(c["delivery_runs"].as_u64().unwrap() > 0, "{c}");
    let first = dir.path().join("commitlog/00000000000000000000");
    let first = FileHeader::decode(&std::fs::read(first).unwrap(), COMMITLOG_MAGIC).unwrap();
    assert_eq!(first.version, 1, "an old segment is not rewritten");
}

#[test]
fn a_segment_of_an_unknown_version_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    Store::open(config(dir.path(), &clock)).unwrap().close().unwrap();
    set_segment_versions(dir.path(), 4);
    match Store::open(config(dir.path(), &clock)) {
        Err(Error::UnsupportedVersion { file, found: 4, supported: 3 }) => {
            assert!(file.ends_with("commitlog/00000000000000000000"), "{}", file.display())
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a segment of version 4 opened"),
    }
}
