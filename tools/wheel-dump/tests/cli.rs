//! The command line: bad arguments, a directory that is not a store, and
//! the read-only promise (nothing changes, no `LOCK` taken, a live store is fine).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use delaywheel::{ManualClock, Message, Store};

#[test]
fn bad_arguments_get_one_line_and_exit_2() {
    let h = healthy();
    let dir = h.path().to_str().unwrap();
    for args in [
        vec![dir, "slot", "soon"],
        vec![dir, "frobnicate"],
        vec![dir, "log", "--from", "-1"],
        vec![dir, "slots", "--from"],
        vec![dir, "verify", "--bogus"],
        vec![],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn a_directory_that_is_not_a_store_is_a_clear_error() {
    let empty = tempfile::tempdir().unwrap();
    let missing = empty.path().join("nope");
    for (dir, why) in [
        (empty.path(), "it has no commitlog/ directory (nor the LOCK of a first open)"),
        (missing.as_path(), "no such directory"),
    ] {
        for cmd in ["summary", "verify", "audit"] {
            let out = dump(dir, &[cmd]);
            assert_eq!(out.status.code(), Some(1), "{cmd}");
            let expected = format!("wheel-dump: {} is not a delaywheel store: {why}\n", dir.display());
            assert_eq!(stderr(&out), expected);
        }
    }
    assert!(!missing.exists(), "nothing is created");
}

/// A power loss during the very first open can leave `LOCK` and no
/// `commitlog/`: the store opens that as a fresh store, and the tool judges
/// it the same way, an empty store (it used to refuse it).
#[test]
fn a_first_open_that_lost_power_is_an_empty_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("LOCK"), b"").unwrap();
    for cmd in ["summary", "verify", "audit"] {
        let out = dump(dir.path(), &[cmd]);
        assert_eq!(out.status.code(), Some(0), "{cmd}: {}", stderr(&out));
    }
}

/// Every file under `dir` with its bytes and modification time.
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
                out.insert(path.display().to_string(), (std::fs::read(&path).unwrap(), modified));
            }
        }
    }
    out
}

const EVERY_COMMAND: [&[&str]; 8] = [
    &["summary"],
    &["slots", "--from", "1700000000", "--to", "1800000000"],
    &["slot", "1700000005"],
    &["log", "--from", "2"],
    &["checkpoint"],
    &["verify"],
    &["audit"],
    &["audit", "--json"],
];

#[test]
fn reading_changes_nothing_and_takes_no_lock() {
    let h = healthy();
    let copy = copy_of(h.path());
    std::fs::remove_file(copy.path().join("LOCK")).unwrap();
    let before = snapshot(copy.path());
    for args in EVERY_COMMAND {
        let out = dump(copy.path(), args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    }
    assert!(!copy.path().join("LOCK").exists(), "no LOCK file is created");
    assert!(before == snapshot(copy.path()), "no file changed");
}

#[test]
fn works_beside_a_live_store() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    for i in 0..20u64 {
        store.put(Message::new(TOPIC, format!("m{i}")).deliver_at_ms(T0 + 60_000 + i * 1_000)).unwrap();
    }
    wait_until(|| store.stats().dispatch_lag_bytes == 0);
    // The store holds LOCK and its checkpoint is not clean: the timers are
    // in the wheel or past the checkpoint (replayed at the next open).
    for args in EVERY_COMMAND {
        let out = dump(dir.path(), args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}{}", stdout(&out), stderr(&out));
    }
    let doc = json(&dump(dir.path(), &["audit", "--json"]));
    assert_eq!((&doc["timer_messages"], &doc["pending"]), (&serde_json::json!(20), &serde_json::json!(20)));
    store.put(Message::new(TOPIC, "still writable")).unwrap();
    store.close().unwrap();
}

#[test]
fn a_bucket_store_verifies_and_audit_says_it_cannot_audit_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store =
        Store::open(config(dir.path(), &clock).with_scheduler(delaywheel::Scheduler::Buckets)).unwrap();
    for level in 1..=3 {
        store.put(Message::new(TOPIC, format!("l{level}")).delay_level(level)).unwrap();
    }
    clock.set_ms(T0 + 5_000);
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let mut got = 0;
    while got < 2 {
        got += consumer.poll(2, std::time::Duration::from_secs(5)).unwrap().len();
    }
    drop(consumer);
    store.close().unwrap();

    let out = dump(dir.path(), &["verify", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["checked"]["queue_entries"], 5, "3 schedule entries and 2 delivered copies: {report}");
    let out = dump(dir.path(), &["audit"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("cannot audit a bucket store"), "{}", stderr(&out));
}
