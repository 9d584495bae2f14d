//! The two timer logs and `timer/tails`: level-0 chains run through
//! `timer/timerlog/`, level-1 and level-2 chains through `timer/timerlog-far/`
//! (each with its own entry indexes), `timer/tails` records where each slot's
//! chain begins, and the store deletes a timer log's oldest files once no
//! live chain reaches them (`wheel-format.md`: "Timer logs", "Chain starts",
//! "Retention and the relocation area").

mod common;

use std::path::{Path, PathBuf};

use common::*;
use delaywheel::internals::{self, geometry, tail};
use delaywheel::{ManualClock, Message, Store};
use serde_json::{Value, json};

/// Runs `verify --json`: (exit code, the document).
fn verify(dir: &Path) -> (i32, Value) {
    let out = dump(dir, &["verify", "--json"]);
    (out.status.code().unwrap(), json(&out))
}

/// (exit code, problem file, problem offset, error) of a failing `verify --json`.
fn problem(dir: &Path) -> (i32, PathBuf, u64, String) {
    let (code, doc) = verify(dir);
    assert_eq!(doc["ok"], false, "{doc}");
    let p = &doc["problem"];
    let file = PathBuf::from(p["file"].as_str().unwrap());
    (code, file, p["offset"].as_u64().unwrap(), p["error"].as_str().unwrap().to_string())
}

/// The JSON lines of a listing after its header line.
fn lines(out: &std::process::Output) -> Vec<Value> {
    stdout(out).lines().skip(1).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The far timer's second and its level-1 slot (index over all levels).
fn far_slot() -> (u64, u64) {
    let second = (T0 + 2 * 86_400_000) / 1000;
    (second, geometry::slot_index(1, geometry::window_of(1, second)))
}

const FAR_FILE: &str = "timer/timerlog-far/00000000000000000000";

#[test]
fn summary_lists_both_timer_logs_and_the_chain_starts() {
    let (dir, _, _) = far_and_near();
    let out = dump(dir.path(), &["summary", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc = json(&out);
    let files: Vec<(&str, u64)> = doc["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["bytes"].as_u64().unwrap()))
        .collect();
    let log_file = 32 + 64 * 28;
    for expected in [
        ("timer/tails", geometry::TAILS_FILE_LEN),
        ("timer/timerlog/00000000000000000000", log_file),
        (FAR_FILE, log_file),
    ] {
        assert!(files.contains(&expected), "{expected:?} in {files:?}");
    }
    assert_eq!(geometry::TAILS_FILE_LEN, 32 + 24 * 75_840, "wheel-format.md: 24-byte records, one per slot");
    assert_eq!(
        doc["timer_logs"],
        json!([
            {"dir": "timer/timerlog", "levels": [0], "files": 1, "first_entry": 1, "end": 2, "entries": 1},
            {"dir": "timer/timerlog-far", "levels": [1, 2], "files": 1, "first_entry": 1, "end": 2, "entries": 1},
        ])
    );
    assert_eq!(doc["pending_per_level"], json!([1, 1, 0]));
    let timer_bytes: u64 = files.iter().filter(|(p, _)| p.starts_with("timer/")).map(|(_, b)| b).sum();
    let segment_counts = files.iter().find(|(p, _)| *p == "timer/segment_pending").unwrap().1;
    assert_eq!(doc["retention"]["disk_bytes"]["timer_index"], timer_bytes - segment_counts);

    let text = stdout(&dump(dir.path(), &["summary"]));
    assert!(text.contains("\ntimer logs\n"), "{text}");
    assert!(text.contains("  timer/timerlog-far/  levels 1, 2      1"), "{text}");
    assert!(text.contains(&format!("  {FAR_FILE}")), "{text}");
}

#[test]
fn the_far_timers_second_is_read_from_the_far_log() {
    let (dir, near, far) = far_and_near();
    let (second, _) = far_slot();
    let out = dump(dir.path(), &["slot", &second.to_string(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let got = lines(&out);
    assert_eq!(got.len(), 1, "{got:?}");
    // Entry 1 of the far log; entry 1 of the near log is the near timer.
    assert_eq!(
        (&got[0]["level"], &got[0]["entry"], &got[0]["message_offset"], &got[0]["state"]),
        (&json!(1), &json!(1), &json!(far), &json!("pending"))
    );
    let text = stdout(&dump(dir.path(), &["slot", &second.to_string()]));
    let row =
        |l: &str| l.starts_with("1 ") && l.contains(&format!(" {far}  {TOPIC} ")) && l.ends_with("pending");
    assert!(text.lines().any(row), "{text}");
    // The near timer's second reads the near log.
    let near_second = ((T0 + 60_000) / 1000).to_string();
    let got = lines(&dump(dir.path(), &["slot", &near_second, "--json"]));
    assert_eq!((&got[0]["level"], &got[0]["message_offset"]), (&json!(0), &json!(near)));
    // `log --far` lists the far log; `log` the near one, as before.
    let far_log = lines(&dump(dir.path(), &["log", "--far", "--json"]));
    assert_eq!(far_log.iter().map(|l| &l["message_offset"]).collect::<Vec<_>>(), [&json!(far)]);
    let near_log = lines(&dump(dir.path(), &["log", "--json"]));
    assert_eq!(near_log.iter().map(|l| &l["message_offset"]).collect::<Vec<_>>(), [&json!(near)]);
}

#[test]
fn verify_and_audit_read_both_logs() {
    let (dir, _, _) = far_and_near();
    let (code, doc) = verify(dir.path());
    assert_eq!(code, 0, "{doc}");
    let c = &doc["checked"];
    assert_eq!((&c["near_timer_log_entries"], &c["far_timer_log_entries"]), (&json!(1), &json!(1)), "{c}");
    assert_eq!(
        (&c["chains_walked"], &c["chain_entries"], &c["chain_starts"]),
        (&json!(2), &json!(2), &json!(2))
    );
    let out = dump(dir.path(), &["audit", "--json"]);
    let expected = json!({"schema_version": 1, "timer_messages": 2, "delivered": 0, "cancelled": 0,
        "pending": 2, "lost": 0, "duplicated": 0, "early": 0, "reclaimed": 0, "unreadable_log_stretches": 0,
        "unreadable_log_bytes": 0, "rescheduled": 0, "fired_after_reschedule": 0, "schedules": 0,
        "occurrences_delivered": 0, "occurrences_duplicated": 0, "occurrences_early": 0, "occurrences_missing": 0});
    assert_eq!((out.status.code(), json(&out)), (Some(0), expected));
}

#[test]
fn a_flipped_bit_in_a_far_log_entry_is_named() {
    let (dir, _, _) = far_and_near();
    let copy = copy_of(dir.path());
    let file = copy.path().join(FAR_FILE);
    // Entry 1 (the far timer, in the chain of a live level-1 slot) at 32 + 1 * 28.
    flip_bit(&file, 60 + 10);
    let (code, path, offset, _) = problem(copy.path());
    assert_eq!((code, path, offset), (1, file.clone(), 60));
    let out = dump(copy.path(), &["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let first = stdout(&out).lines().next().unwrap().to_string();
    assert_eq!(first, format!("PROBLEM in {} at offset 60", file.display()));
}

#[test]
fn a_live_chain_reaching_a_deleted_file_is_named() {
    let (dir, _, _) = far_and_near();
    let copy = copy_of(dir.path());
    std::fs::remove_file(copy.path().join(FAR_FILE)).unwrap();
    let (_, index) = far_slot();
    let (code, path, offset, error) = problem(copy.path());
    assert_eq!(
        (code, path, offset),
        (1, copy.path().join("timer/wheel"), internals::slot::slot_position(index))
    );
    assert!(error.contains("timer/timerlog-far/") && error.contains("deleted"), "{error}");
}

/// Writes slot `index`'s `timer/tails` record as `wheel-format.md` lays it
/// out: window, first entry, CRC32C over the slot index then bytes 0..16.
fn write_tail(dir: &Path, index: u64, window: u64, first: u64) {
    let mut record = [0u8; 24];
    record[..8].copy_from_slice(&window.to_le_bytes());
    record[8..16].copy_from_slice(&first.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), &record[..16]);
    record[16..20].copy_from_slice(&crc.to_le_bytes());
    write_at(&dir.join("timer/tails"), tail::tail_position(index), &record);
}

#[test]
fn chain_starts_are_checked_for_live_slots() {
    let (dir, _, _) = far_and_near();
    let (second, index) = far_slot();
    let window = geometry::window_of(1, second);
    let tails = dir.path().join("timer/tails");
    let position = tail::tail_position(index);
    assert_eq!(position, 32 + index * 24);
    let bytes = std::fs::read(&tails).unwrap();
    assert_eq!(
        tail::decode_record(&bytes[position as usize..position as usize + 24], index),
        Ok(Some(tail::TailRecord { window, first_entry: 1 })),
        "the far chain starts at entry 1 of the far log"
    );

    // A flipped bit: the record fails its CRC.
    let copy = copy_of(dir.path());
    flip_bit(&copy.path().join("timer/tails"), position + 3);
    let (code, path, offset, _) = problem(copy.path());
    assert_eq!((code, path, offset), (1, copy.path().join("timer/tails"), position));

    // A valid record for the slot's window that names another entry.
    let copy = copy_of(dir.path());
    write_tail(copy.path(), index, window, 2);
    let (code, path, offset, error) = problem(copy.path());
    assert_eq!((code, path, offset), (1, copy.path().join("timer/tails"), position));
    assert!(error.contains("oldest entry is 1"), "{error}");

    // A valid record for another window: the start is unknown, not a problem.
    let copy = copy_of(dir.path());
    write_tail(copy.path(), index, window - 1, 7);
    let (code, doc) = verify(copy.path());
    assert_eq!(code, 0, "{doc}");
    let c = &doc["checked"];
    assert_eq!((&c["chain_starts"], &c["chain_starts_unknown"]), (&json!(1), &json!(1)), "{c}");
}

/// Every record is checked, not only those of live slots: a damaged one of
/// an idle slot is named too (it used to pass as "unknown").
#[test]
fn a_damaged_chain_start_of_an_idle_slot_is_named() {
    let (dir, _, _) = far_and_near();
    let copy = copy_of(dir.path());
    let idle = 5;
    write_tail(copy.path(), idle, 1_000, 3);
    assert_eq!(verify(copy.path()).0, 0, "a valid record of an idle slot is fine");
    let position = tail::tail_position(idle);
    flip_bit(&copy.path().join("timer/tails"), position + 1);
    let (code, path, offset, _) = problem(copy.path());
    assert_eq!((code, path, offset), (1, copy.path().join("timer/tails"), position));
}

#[test]
fn a_near_log_whose_oldest_files_were_deleted_is_read() {
    let r = near_log_reclaimed();
    let dir = r.dir.path();
    let near_files: Vec<String> = std::fs::read_dir(dir.join("timer/timerlog"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(near_files, [format!("{:020}", 192)], "the store kept only the file it appends to");

    let out = dump(dir, &["summary", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc = json(&out);
    let logs = &doc["timer_logs"];
    // 240 delivered near timers and the pending one: entries 1..=241.
    assert_eq!(
        (&logs[0]["files"], &logs[0]["first_entry"], &logs[0]["end"], &logs[0]["entries"]),
        (&json!(1), &json!(192), &json!(242), &json!(50)),
        "{logs}"
    );
    assert_eq!((&logs[1]["first_entry"], &logs[1]["entries"]), (&json!(1), &json!(1)), "{logs}");
    assert_eq!(doc["pending_per_level"], json!([1, 1, 0]));
    let text = stdout(&dump(dir, &["summary"]));
    assert!(text.contains("in files deleted once no live chain reached them"), "{text}");

    let (code, doc) = verify(dir);
    assert_eq!(code, 0, "{doc}");
    let c = &doc["checked"];
    assert_eq!(c["timer_log_first_entries"], json!([192, 1]), "{c}");
    assert_eq!((&c["near_timer_log_entries"], &c["far_timer_log_entries"]), (&json!(50), &json!(1)), "{c}");
    assert_eq!(c["chains_walked"], 2, "the pending near timer's slot and the far one's: {c}");
    let text = stdout(&dump(dir, &["verify"]));
    assert!(text.starts_with("ok: ") && text.contains("timer/timerlog/ starts at entry 192"), "{text}");

    let out = dump(dir, &["audit", "--json"]);
    let expected = json!({"schema_version": 1, "timer_messages": r.delivered + 2, "delivered": r.delivered,
        "cancelled": 0, "pending": 2, "lost": 0, "duplicated": 0, "early": 0, "reclaimed": 0, "unreadable_log_stretches": 0,
        "unreadable_log_bytes": 0, "rescheduled": 0, "fired_after_reschedule": 0, "schedules": 0,
        "occurrences_delivered": 0, "occurrences_duplicated": 0, "occurrences_early": 0, "occurrences_missing": 0});
    assert_eq!((out.status.code(), json(&out)), (Some(0), expected));

    // The listings start at the first entry on disk; a stale slot whose chain
    // lies in a deleted file is listed as far as the log holds it.
    let out = dump(dir, &["log", "--json"]);
    let got = lines(&out);
    assert_eq!(got.first().map(|l| &l["index"]), Some(&json!(192)));
    assert_eq!(got.last().map(|l| &l["message_offset"]), Some(&json!(r.near)));
    let text = stdout(&dump(dir, &["log"]));
    assert!(
        text.starts_with("entries below 192 were in files deleted") && text.contains("at index 242"),
        "{text}"
    );
    let out = dump(dir, &["slot", &r.first_second.to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("0 entries") && text.contains("in a file deleted"), "{text}");
    let far_second =
        lines(&dump(dir, &["log", "--far", "--json"]))[0]["deliver_at_ms"].as_u64().unwrap() / 1000;
    let got = lines(&dump(dir, &["slot", &far_second.to_string(), "--json"]));
    assert_eq!((&got[0]["message_offset"], &got[0]["state"]), (&json!(r.far), &json!("pending")));
}

/// A power loss can keep a timer log's pages and lose the wheel's page that
/// linked their entries, the commit-log records they name, or an earlier
/// page of the same log. Recovery cuts such entries (a later put could land
/// on the offsets they name), so the recovered store verifies clean and
/// counts each timer once.
fn recover_with_the_far_log_ahead(keep_the_log: bool, hole: bool) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let far = || Message::new(TOPIC, "far").deliver_at_ms(T0 + 2 * 86_400_000);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    store.put(far()).unwrap();
    store.close().unwrap();
    let image = copy_of(dir.path());

    let store = Store::open(config(dir.path(), &clock)).unwrap();
    for _ in 0..3 {
        store.put(far()).unwrap();
    }
    wait_until(|| store.stats().pending == 4);
    // The far timer log reached the disk (entries 2, 3, 4), and the commit
    // log if `keep_the_log`; the wheel did not.
    let mut reached = vec![Path::new("timer").join("timerlog-far")];
    if keep_the_log {
        reached.push(PathBuf::from("commitlog"));
    }
    for path in reached {
        std::fs::remove_dir_all(image.path().join(&path)).unwrap();
        copy_dir(&dir.path().join(&path), &image.path().join(&path));
    }
    drop(store);
    if hole {
        let entry = internals::timer_entry::ENTRY_LEN as u64;
        write_at(
            &image.path().join("timer/timerlog-far").join(format!("{:020}", 0)),
            32 + 3 * entry,
            &vec![0; entry as usize],
        );
    }

    let store = Store::open(config(image.path(), &clock)).unwrap();
    let want = if keep_the_log { 4 } else { 1 };
    wait_until(|| store.stats().pending == want && store.stats().dispatch_lag_bytes == 0);
    store.close().unwrap();
    let (code, doc) = verify(image.path());
    assert_eq!(code, 0, "{doc}");
    let store = Store::open(config(image.path(), &clock)).unwrap();
    wait_until(|| store.stats().dispatch_lag_bytes == 0 && store.stats().pending > 0);
    assert_eq!(store.stats().pending, want, "each timer counted once");
}

#[test]
fn timer_log_entries_naming_records_a_power_loss_took_do_not_survive_recovery() {
    recover_with_the_far_log_ahead(false, false);
}

#[test]
fn timer_log_entries_past_a_hole_a_power_loss_left_do_not_survive_recovery() {
    recover_with_the_far_log_ahead(true, true);
}

/// A cancel reaches the wheel's chain before its record is durable: if a
/// power loss keeps the chain and takes the record, the timer is not
/// cancelled (the commit log is the truth) and still fires.
#[test]
fn a_cancel_whose_record_a_power_loss_took_does_not_survive_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let due = T0 + 2 * 86_400_000;
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    let receipt = store.put(Message::new(TOPIC, "far").deliver_at_ms(due)).unwrap();
    store.close().unwrap();
    let image = copy_of(dir.path());

    let store = Store::open(config(dir.path(), &clock)).unwrap();
    assert_eq!(store.cancel(receipt.handle().unwrap()).unwrap(), delaywheel::CancelOutcome::Cancelled);
    // The wheel and its far log reached the disk; the cancel record did not.
    for path in ["timer/timerlog-far", "timer/wheel", "timer/tails"].map(PathBuf::from) {
        let (from, to) = (dir.path().join(&path), image.path().join(&path));
        if from.is_dir() {
            std::fs::remove_dir_all(&to).unwrap();
            copy_dir(&from, &to);
        } else {
            std::fs::copy(&from, &to).unwrap();
        }
    }
    drop(store);

    let store = Store::open(config(image.path(), &clock)).unwrap();
    wait_until(|| store.stats().pending == 1);
    clock.set_ms(due + 1_000);
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let got = consumer.poll(10, std::time::Duration::from_secs(5)).unwrap();
    assert_eq!(got.iter().map(|m| &m.body()[..]).collect::<Vec<_>>(), [b"far"]);
    store.close().unwrap();
    let (code, doc) = verify(image.path());
    assert_eq!(code, 0, "{doc}");
}
