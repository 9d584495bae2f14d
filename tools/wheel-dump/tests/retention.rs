//! A store with retention (`common::retained`): segments deleted, timers
//! relocated to `commitlog/relocated/`. `summary` shows the retention part,
//! `verify` accepts what retention legitimately leaves (records named below
//! the oldest segment, queues not starting at file 0) and still names a
//! flipped bit in the relocation area by file and offset, and `audit` counts
//! the relocated timers.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use delaywheel::internals::{FileHeader, RELOCATION_INDEX_MAGIC, relocation};
use delaywheel::{ManualClock, Store};
use serde_json::json;

/// The relocation index's entries (position, entry), decoded by the library.
fn index_entries(dir: &Path) -> Vec<(u64, relocation::IndexEntry)> {
    let bytes = std::fs::read(dir.join("commitlog/relocated/index")).unwrap();
    let header = FileHeader::decode(&bytes, RELOCATION_INDEX_MAGIC).unwrap();
    assert_eq!((header.a, header.b), (32, 1 << 20), "wheel-format.md: entry length, window length");
    (32..bytes.len() as u64)
        .step_by(32)
        .map(|at| (at, relocation::IndexEntry::decode(&bytes[at as usize..at as usize + 32], at).unwrap()))
        .collect()
}

fn window_file(dir: &Path, entry: &relocation::IndexEntry) -> PathBuf {
    dir.join("commitlog/relocated").join(format!("{:020}", entry.window()))
}

/// Runs `verify --json`: (exit code, the document).
fn verify(dir: &Path) -> (i32, serde_json::Value) {
    let out = dump(dir, &["verify", "--json"]);
    (out.status.code().unwrap(), json(&out))
}

/// (exit code, problem file, problem offset) of a failing `verify --json`.
fn problem(dir: &Path) -> (i32, PathBuf, u64) {
    let (code, doc) = verify(dir);
    assert_eq!(doc["ok"], false, "{doc}");
    let p = &doc["problem"];
    (code, PathBuf::from(p["file"].as_str().unwrap()), p["offset"].as_u64().unwrap())
}

#[test]
fn the_fixture_relocated_what_it_says() {
    let r = retained();
    let entries = index_entries(r.first.path());
    let originals: Vec<u64> = entries.iter().map(|(_, e)| e.original_offset).collect();
    let mut timers = r.far.clone();
    timers.push(r.soon);
    assert_eq!(originals.len(), timers.len() + 1, "six timers and the cancel: {entries:?}");
    assert!(timers.iter().all(|t| originals.contains(t)), "{originals:?} {timers:?}");
    assert!(!r.first.path().join("commitlog/00000000000000000000").exists());
    assert_eq!(index_entries(r.later.path()), entries, "nothing relocated later, nothing dropped");
}

#[test]
fn summary_shows_the_retention_part() {
    let r = retained();
    let out = dump(r.first.path(), &["summary", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc = json(&out);
    let ret = &doc["retention"];
    assert_eq!(ret["segments_deleted"], true, "{ret}");
    let oldest = ret["oldest_segment"].as_u64().unwrap();
    assert!(oldest > 0 && oldest.is_multiple_of(64 * 1024), "{ret}");
    assert_eq!(ret["oldest_retained_offset"], oldest + 32);
    // Every relocation record is still in the log: the pass wrote them at its end.
    assert_eq!(ret["relocation_records"]["timers"], FAR_TIMERS as u64 + 1, "{ret}");
    assert_eq!(ret["relocation_records"]["cancels"], 1, "{ret}");
    assert!(ret["relocation_records"]["count"].as_u64().unwrap() >= 1, "{ret}");
    assert_eq!(ret["relocation_index_entries"], FAR_TIMERS as u64 + 2);
    // The far timers share one window, `soon` has its own.
    assert_eq!(ret["relocation_window_files"], 2, "{ret}");
    let paths: Vec<&str> =
        doc["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    for entry in index_entries(r.first.path()) {
        let window = format!("commitlog/relocated/{:020}", entry.1.window());
        assert!(paths.contains(&window.as_str()), "{window} in {paths:?}");
    }
    assert!(
        paths.contains(&"commitlog/relocated/index") && paths.contains(&"timer/segment_pending"),
        "{paths:?}"
    );
    let files: u64 = doc["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"].as_str().unwrap().starts_with("commitlog/relocated/"))
        .map(|f| f["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(ret["disk_bytes"]["relocated"], files);

    let text = stdout(&dump(r.first.path(), &["summary"]));
    let expected = format!("oldest retained segment  commitlog/{oldest:020}");
    assert!(text.contains("\nretention\n") && text.contains(&expected), "{text}");
    assert!(text.contains("relocation index entries"), "{text}");
}

#[test]
fn summary_of_a_store_without_retention_has_no_retention_part() {
    let h = healthy();
    let doc = json(&dump(h.path(), &["summary", "--json"]));
    assert_eq!(doc["retention"]["segments_deleted"], false);
    assert_eq!(doc["retention"]["relocation_records"], serde_json::Value::Null, "the log is not scanned");
    assert!(!stdout(&dump(h.path(), &["summary"])).contains("\nretention\n"));
}

#[test]
fn verify_accepts_what_retention_leaves() {
    let r = retained();
    for dir in [r.first.path(), r.later.path()] {
        let (code, doc) = verify(dir);
        assert_eq!(code, 0, "{doc}");
        let c = &doc["checked"];
        assert!(c["oldest_segment"].as_u64().unwrap() > 0, "{c}");
        assert_eq!((&c["relocated_timers"], &c["relocated_cancels"]), (&json!(6), &json!(1)), "{c}");
        assert_eq!(c["relocated_copies"], 7);
        assert_eq!((&c["relocation_unfinished"], &c["relocation_torn"]), (&json!(0), &json!(0)));
        assert_eq!(c["relocation_window_files"], 2);
        // The far timer's cancel is in the ledger; its cancel record went with its segment.
        assert_eq!((&c["cancel_ledger_entries"], &c["cancel_ledger_deleted"]), (&json!(1), &json!(1)), "{c}");
    }
    // Later: the delivery of `soon` and the fillers' records were deleted;
    // the queues still point at some of them, the timer log names the copies.
    let (_, doc) = verify(r.later.path());
    let c = &doc["checked"];
    assert!(c["named_relocated"].as_u64().unwrap() >= 7, "six timers and a cancel entry: {c}");
    assert!(c["queue_entries_deleted"].as_u64().unwrap() > 0, "{c}");
    let filler_queue = r.later.path().join("consumequeue/Filler/0");
    let first_file = std::fs::read_dir(&filler_queue).unwrap().map(|e| e.unwrap().file_name()).min().unwrap();
    assert_ne!(
        first_file.to_str().unwrap(),
        "00000000000000000000",
        "retention deleted the queue's first files"
    );
    let text = stdout(&dump(r.later.path(), &["verify"]));
    assert!(
        text.starts_with("ok: ") && text.contains("retention deleted the records below log offset"),
        "{text}"
    );
}

#[test]
fn a_flipped_bit_in_a_relocation_index_entry_is_named() {
    let r = retained();
    let copy = copy_of(r.later.path());
    let index = copy.path().join("commitlog/relocated/index");
    // Entry 2 at 32 + 2 * 32, a bit in its deliver-at field.
    flip_bit(&index, 96 + 9);
    assert_eq!(problem(copy.path()), (1, index.clone(), 96));
    let out = dump(copy.path(), &["verify"]);
    let first = stdout(&out).lines().next().unwrap().to_string();
    assert_eq!(first, format!("PROBLEM in {} at offset 96", index.display()));
}

#[test]
fn a_flipped_bit_in_the_last_relocation_index_entry_of_a_closed_store_is_named() {
    let r = retained();
    let copy = copy_of(r.first.path());
    let index = copy.path().join("commitlog/relocated/index");
    let last = index_entries(copy.path()).last().unwrap().0;
    flip_bit(&index, last + 20);
    assert_eq!(problem(copy.path()), (1, index, last), "not taken for a pass cut short");
}

#[test]
fn a_flipped_bit_in_a_relocated_copy_is_named() {
    let r = retained();
    let copy = copy_of(r.first.path());
    let entries = index_entries(copy.path());
    // The copy of `soon`, inside its body: the CRC covers its original offset.
    let (_, soon) = entries.iter().find(|(_, e)| e.original_offset == r.soon).unwrap();
    let window = window_file(copy.path(), soon);
    flip_bit(&window, soon.position + u64::from(soon.len) - 2);
    assert_eq!(problem(copy.path()), (1, window, soon.position));
}

#[test]
fn a_missing_window_whose_timers_are_not_due_is_named() {
    let r = retained();
    let copy = copy_of(r.first.path());
    let entries = index_entries(copy.path());
    let (position, far) = entries.iter().find(|(_, e)| e.original_offset == r.far[0]).unwrap();
    std::fs::remove_file(window_file(copy.path(), far)).unwrap();
    assert_eq!(problem(copy.path()), (1, copy.path().join("commitlog/relocated/index"), *position));
}

#[test]
fn an_index_short_of_what_a_relocation_record_says_is_named() {
    let r = retained();
    let copy = copy_of(r.first.path());
    let index = copy.path().join("commitlog/relocated/index");
    let len = std::fs::metadata(&index).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&index).unwrap().set_len(len - 32).unwrap();
    let (code, file, _) = problem(copy.path());
    assert_eq!(code, 1);
    assert_eq!(
        file.parent(),
        Some(copy.path().join("commitlog").as_path()),
        "the segment of the relocation record"
    );
    let doc = verify(copy.path()).1;
    assert!(doc["problem"]["error"].as_str().unwrap().contains("relocation record says"), "{doc}");
}

#[test]
fn audit_counts_relocated_timers() {
    let r = retained();
    let out = dump(r.first.path(), &["audit", "--json"]);
    let expected = json!({"schema_version": 1, "timer_messages": 6, "delivered": 0, "cancelled": 1,
        "pending": 5, "lost": 0, "duplicated": 0, "early": 0, "reclaimed": 0, "unreadable_log_stretches": 0,
        "unreadable_log_bytes": 0, "rescheduled": 0, "fired_after_reschedule": 0, "schedules": 0,
        "occurrences_delivered": 0, "occurrences_duplicated": 0, "occurrences_early": 0, "occurrences_missing": 0});
    assert_eq!((out.status.code(), json(&out)), (Some(0), expected));
    let text = stdout(&dump(r.first.path(), &["audit"]));
    assert!(text.contains("not audited, except the 6 timers relocated"), "{text}");
}

#[test]
fn audit_counts_a_relocated_timer_whose_delivery_was_deleted_as_reclaimed() {
    let r = retained();
    let out = dump(r.later.path(), &["audit", "--json"]);
    // `late` delivered; the cancelled far timer cancelled by its relocated
    // cancel; four far timers pending; `soon` fired, its record deleted.
    let expected = json!({"schema_version": 1, "timer_messages": 7, "delivered": 1, "cancelled": 1,
        "pending": 4, "lost": 0, "duplicated": 0, "early": 0, "reclaimed": 1, "unreadable_log_stretches": 0,
        "unreadable_log_bytes": 0, "rescheduled": 0, "fired_after_reschedule": 0, "schedules": 0,
        "occurrences_delivered": 0, "occurrences_duplicated": 0, "occurrences_early": 0, "occurrences_missing": 0});
    assert_eq!((out.status.code(), json(&out)), (Some(0), expected));
    assert!(r.late > r.soon);
}

#[test]
fn every_command_reads_a_retained_store() {
    let r = retained();
    let entries = index_entries(r.later.path());
    let soon_second =
        entries.iter().find(|(_, e)| e.original_offset == r.soon).unwrap().1.deliver_at_ms / 1000;
    let second = soon_second.to_string();
    for args in
        [&["summary"][..], &["slots"], &["slot", &second], &["log"], &["checkpoint"], &["verify"], &["audit"]]
    {
        let out = dump(r.later.path(), args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}{}", stdout(&out), stderr(&out));
    }
    // `soon` fired and its delivery record was deleted: the slot listing says
    // so rather than calling it missed, and knows its topic from its copy.
    let lines = stdout(&dump(r.later.path(), &["slot", &second, "--json"]));
    let soon = lines
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["message_offset"] == r.soon);
    let soon = soon.unwrap_or_else(|| panic!("{lines}"));
    assert_eq!(
        (soon["state"].as_str(), soon["topic"].as_str()),
        (Some("retention-deleted"), Some(TOPIC)),
        "{soon}"
    );
}

/// The relocation index cannot be rebuilt from the copies (a copy does not
/// record its original offset): a store whose index was deleted or cut
/// short is refused naming the first copy it no longer names. The index
/// used to be recreated or cut without an error, and the far timers it
/// named never fired.
#[test]
fn a_deleted_or_cut_relocation_index_is_refused_not_recreated() {
    let r = retained();
    let entries = index_entries(r.first.path());
    assert!(entries.len() > FAR_TIMERS, "the far timers and a cancel were relocated");
    let clock = ManualClock::new(T0 + 2 * HOUR);
    let index = Path::new("commitlog/relocated/index");

    let deleted = copy_of(r.first.path());
    std::fs::remove_file(deleted.path().join(index)).unwrap();
    let err = Store::open(retention_config(deleted.path(), &clock)).err().expect("refused");
    // The first copy of the oldest window file.
    let (file, position) =
        entries.iter().map(|(_, e)| (window_file(deleted.path(), e), e.position)).min().unwrap();
    assert!(
        matches!(&err, delaywheel::Error::Corruption { file: f, offset, .. } if *f == file && *offset == position),
        "{err}"
    );
    assert!(err.to_string().contains("relocated/index does not name"), "{err}");

    let cut = copy_of(r.first.path());
    let half = 32 + 32 * (entries.len() as u64 / 2);
    std::fs::OpenOptions::new().write(true).open(cut.path().join(index)).unwrap().set_len(half).unwrap();
    let err = Store::open(retention_config(cut.path(), &clock)).err().expect("refused");
    let (file, position) = entries[entries.len() / 2..]
        .iter()
        .map(|(_, e)| (window_file(cut.path(), e), e.position))
        .min()
        .unwrap();
    assert!(
        matches!(&err, delaywheel::Error::Corruption { file: f, offset, .. } if *f == file && *offset == position),
        "{err}"
    );

    let intact = copy_of(r.first.path());
    Store::open(retention_config(intact.path(), &clock)).unwrap().close().unwrap();
}

/// A pass that copied a segment's timers and crashed before indexing them
/// leaves copies no entry names, of records still in the log: the store
/// opens (the next pass copies the segment again), with the timer once.
#[test]
fn copies_left_by_an_unfinished_pass_are_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(retention_config(dir.path(), &clock)).unwrap();
    let far = store.put(delaywheel::Message::new(TOPIC, "far").deliver_at_ms(T0 + DECADE)).unwrap();
    store.close().unwrap();

    let (records, _) = records(dir.path());
    let (_, bytes) = records.iter().find(|(at, _)| *at == far.offset()).unwrap();
    let window = relocation::window_of(T0 + DECADE);
    let mut file = FileHeader::new(delaywheel::internals::RELOCATED_MAGIC, 1 << 20, window).encode().to_vec();
    file.extend_from_slice(bytes);
    std::fs::write(dir.path().join("commitlog/relocated").join(format!("{window:020}")), file).unwrap();

    let store = Store::open(retention_config(dir.path(), &clock)).unwrap();
    wait_until(|| store.stats().pending == 1);
    store.close().unwrap();
}

/// A record's time is read before it is appended: the oldest retained record
/// may carry a time a little earlier than a delivery record deleted before
/// it. A relocated timer that fired then is still reclaimed, not lost (the
/// power-loss test met one: a put racing the delivery of a timer due a
/// moment later).
#[test]
fn a_relocated_timer_due_just_after_the_oldest_retained_record_is_reclaimed_not_lost() {
    let r = retained();
    let dir = copy_of(r.later.path());
    let oldest = std::fs::read_dir(dir.path().join("commitlog"))
        .unwrap()
        .filter_map(|e| {
            delaywheel::internals::parse_numbered_file_name(&e.unwrap().file_name().to_string_lossy())
        })
        .min()
        .unwrap();
    let segment = dir.path().join("commitlog").join(delaywheel::internals::numbered_file_name(oldest));
    let at = delaywheel::internals::FILE_HEADER_LEN as u64;
    let bytes = std::fs::read(&segment).unwrap();
    let len = u32::from_le_bytes(bytes[at as usize + 4..at as usize + 8].try_into().unwrap()) as usize;
    let mut record = bytes[at as usize..at as usize + len].to_vec();
    // `soon` was due at T0 + 2.5 h and fired; say the first record kept was put a second before.
    let soon_due = T0 + 2 * HOUR + HOUR / 2;
    record[12..20].copy_from_slice(&(soon_due - 1_000).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&(oldest + at).to_le_bytes()), &record[4..]);
    record[..4].copy_from_slice(&crc.to_le_bytes());
    write_at(&segment, at, &record);
    let out = dump(dir.path(), &["audit", "--json"]);
    let doc = json(&out);
    assert_eq!((&doc["lost"], &doc["reclaimed"]), (&0.into(), &1.into()), "{doc}");
}

/// A timer rescheduled before retention deleted its segments is named by
/// its reschedule record, whose copy retention relocates: `verify` accepts
/// that copy for a live slot's pending timer (it accepted only a message's
/// copy and called the timer deleted without one).
#[test]
fn verify_accepts_a_relocated_reschedule_for_a_pending_timer() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(retention_config(dir.path(), &clock)).unwrap();
    let timer = store.put(delaywheel::Message::new(TOPIC, "far").deliver_at_ms(T0 + DECADE)).unwrap();
    wait_until(|| store.stats().dispatch_lag_bytes == 0);
    let moved = store.reschedule(timer.handle().unwrap(), T0 + DECADE + 1_000).unwrap();
    assert_eq!(moved, delaywheel::RescheduleOutcome::Rescheduled);
    for round in 0..3 {
        fill(&store, round);
    }
    settle();
    clock.set_ms(T0 + 2 * HOUR);
    reclaim_until(&store, |s| s.stats().retention.oldest_retained_offset > timer.offset() + 4_096);
    store.close().unwrap();
    let (code, doc) = verify(dir.path());
    assert_eq!((code, &doc["ok"]), (0, &json!(true)), "{doc}");
    let audit = json(&dump(dir.path(), &["audit", "--json"]));
    assert_eq!((&audit["pending"], &audit["lost"]), (&json!(1), &json!(0)), "{audit}");
}
