//! The cancel ledger (`timer/cancelled/`, `wheel-format.md`: "Cancel
//! ledger"): one entry per cancel the store answered `Cancelled`, in the
//! timer-log layout. `summary` lists its files; `verify` checks each entry's
//! CRC and that its cancel record, in the retained log, cancels its timer.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use delaywheel::internals::record::Record;
use delaywheel::internals::timer_entry::TimerEntry;
use delaywheel::internals::{CANCEL_LEDGER_MAGIC, FileHeader};

const LEDGER_FILE: &str = "timer/cancelled/00000000000000000000";
/// Entry 1 at 32 + 1 * 28 (index 0 is never used).
const ENTRY_1: u64 = 60;

/// (exit code, problem file, problem offset, error) of a failing `verify --json`.
fn problem(dir: &Path) -> (i32, PathBuf, u64, String) {
    let out = dump(dir, &["verify", "--json"]);
    let doc = json(&out);
    assert_eq!(doc["ok"], false, "{doc}");
    let p = &doc["problem"];
    let file = PathBuf::from(p["file"].as_str().unwrap());
    (
        out.status.code().unwrap(),
        file,
        p["offset"].as_u64().unwrap(),
        p["error"].as_str().unwrap().to_string(),
    )
}

/// The offset of the healthy fixture's one cancel record (c's).
fn cancel_record(dir: &Path) -> u64 {
    let (records, _) = records(dir);
    let cancels: Vec<u64> = records
        .iter()
        .filter(|(at, b)| matches!(decoded(*at, b), Record::Cancel(_)))
        .map(|&(at, _)| at)
        .collect();
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    cancels[0]
}

/// Writes ledger entry `index` as `wheel-format.md` lays it out: message
/// offset, deliver-at with bit 63 set, cancel-record offset, CRC32C over the
/// entry's index then bytes 0..24.
fn write_entry(dir: &Path, index: u64, message: u64, deliver_at: u64, cancel: u64) {
    let mut entry = [0u8; 28];
    entry[..8].copy_from_slice(&message.to_le_bytes());
    entry[8..16].copy_from_slice(&(deliver_at | 1 << 63).to_le_bytes());
    entry[16..24].copy_from_slice(&cancel.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), &entry[..24]);
    entry[24..].copy_from_slice(&crc.to_le_bytes());
    write_at(&dir.join(LEDGER_FILE), 32 + index * 28, &entry);
}

#[test]
fn the_fixtures_cancel_is_in_the_ledger_and_verified() {
    let h = healthy();
    let bytes = std::fs::read(h.path().join(LEDGER_FILE)).unwrap();
    let header = FileHeader::decode(&bytes, CANCEL_LEDGER_MAGIC).unwrap();
    assert_eq!((header.a, header.b), (65_536, 0), "wheel-format.md: 65,536 entries per file, first index");
    assert_eq!(bytes.len(), 32 + 65_536 * 28);
    let entry = TimerEntry::decode(&bytes[ENTRY_1 as usize..], 1).unwrap().unwrap();
    // The timer-log layout: `prev` holds the cancel record's offset, and the cancel bit is set.
    let expected = TimerEntry {
        message_offset: h.c,
        deliver_at_ms: T0 + 20_000,
        prev: cancel_record(h.path()),
        cancel: true,
    };
    assert_eq!(entry, expected);
    assert_eq!(TimerEntry::decode(&bytes[ENTRY_1 as usize + 28..], 2), Ok(None));

    let out = dump(h.path(), &["verify", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let c = &json(&out)["checked"];
    assert_eq!((&c["cancel_ledger_entries"], &c["cancel_ledger_deleted"]), (&1.into(), &0.into()), "{c}");
}

#[test]
fn a_flipped_bit_in_a_ledger_entry_is_named() {
    let h = healthy();
    let copy = copy_of(h.path());
    let file = copy.path().join(LEDGER_FILE);
    // A bit of the cancel-record offset field.
    flip_bit(&file, ENTRY_1 + 17);
    let (code, path, offset, error) = problem(copy.path());
    assert_eq!((code, path, offset), (1, file.clone(), ENTRY_1));
    assert!(error.contains("checksum"), "{error}");
    let out = dump(copy.path(), &["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let first = stdout(&out).lines().next().unwrap().to_string();
    assert_eq!(first, format!("PROBLEM in {} at offset {ENTRY_1}", file.display()));
}

#[test]
fn a_ledger_entry_naming_the_wrong_message_is_reported() {
    let h = healthy();
    let copy = copy_of(h.path());
    // A valid entry (CRC and cancel bit) whose cancel record cancels c, not d.
    let cancel = cancel_record(copy.path());
    write_entry(copy.path(), 1, h.d, T0 + 20_000, cancel);
    let (code, path, offset, error) = problem(copy.path());
    assert_eq!((code, path, offset), (1, copy.path().join(LEDGER_FILE), ENTRY_1));
    let expected = format!("cancel record at log offset {cancel} cancels log offset {}", h.c);
    assert!(error.contains("entry 1:") && error.contains(&expected), "{error}");
}

#[test]
fn ledger_entries_out_of_log_order_are_reported() {
    let h = healthy();
    let copy = copy_of(h.path());
    // Entry 2 repeats entry 1's cancel record: a binary search by cancel record needs them increasing.
    let cancel = cancel_record(copy.path());
    write_entry(copy.path(), 2, h.c, T0 + 20_000, cancel);
    let (code, path, offset, error) = problem(copy.path());
    assert_eq!((code, path, offset), (1, copy.path().join(LEDGER_FILE), ENTRY_1 + 28));
    assert!(error.contains("not after the previous entry's"), "{error}");
}
