//! Damage costs only what it damaged: a zeroed page inside the durable log
//! or a damaged segment header costs the records there, never the store,
//! in the default (lenient) mode; strict mode refuses, naming file and offset.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use delaywheel::{Config, Error, ManualClock, Message, Receipt, RecoveryMode, RecoveryReport, Store};

const SEG: u64 = 64 * 1024;
const TIMERS: usize = 5_000;
const PAGE: u64 = 4096;

fn segment(dir: &Path, base: u64) -> PathBuf {
    dir.join("commitlog").join(format!("{base:020}"))
}

fn config(dir: &Path, clock: &ManualClock) -> Config {
    small_config(dir).with_clock(clock.clone()).with_queues_per_topic(1)
}

/// A cleanly closed store of [`TIMERS`] timers due at `T0 + 5 s`, spread
/// over several segments; their receipts and record lengths.
fn closed_store_with_timers(dir: &Path, clock: &ManualClock) -> Vec<(Receipt, u64)> {
    let store = Store::open(config(dir, clock)).unwrap();
    let receipts: Vec<_> = (0..TIMERS)
        .map(|i| store.put(Message::new("T", format!("m{i}")).deliver_at_ms(T0 + 5_000)).unwrap())
        .collect();
    store.close().unwrap();
    assert!(receipts.last().unwrap().offset() > 2 * SEG, "the timers fill more than two segments");
    receipts
        .into_iter()
        .map(|r| {
            let bytes = std::fs::read(segment(dir, r.offset() - r.offset() % SEG)).unwrap();
            let at = (r.offset() % SEG) as usize + 4;
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as u64;
            (r, len)
        })
        .collect()
}

/// Zeros `[from, from + PAGE)` of the log; the bodies of the messages whose
/// records it touched.
fn zero_page(dir: &Path, records: &[(Receipt, u64)], from: u64) -> Vec<String> {
    let base = from - from % SEG;
    let mut bytes = std::fs::read(segment(dir, base)).unwrap();
    bytes[(from - base) as usize..(from - base + PAGE) as usize].fill(0);
    std::fs::write(segment(dir, base), bytes).unwrap();
    let touched = |(r, len): &&(Receipt, u64)| r.offset() < from + PAGE && r.offset() + len > from;
    records.iter().enumerate().filter(|(_, r)| touched(r)).map(|(i, _)| format!("m{i}")).collect()
}

/// Opens the store, lets every timer come due and consumes what arrives.
fn deliver_all(dir: &Path, clock: &ManualClock) -> (Vec<String>, delaywheel::Stats, RecoveryReport) {
    let store = Store::open(config(dir, clock)).unwrap();
    let report = store.recovery_report().clone();
    clock.set_ms(T0 + 6_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    let got = bodies(&drain_idle(&mut consumer, TIMERS, Duration::from_secs(3)));
    let stats = store.stats();
    store.close().unwrap();
    (got, stats, report)
}

/// Checks that `got` holds every timer but the `lost` ones, each once; on
/// failure says which differ, not all 5,000.
fn assert_all_but(got: &[String], lost: &[String]) {
    let mut counts = std::collections::BTreeMap::new();
    for body in got {
        *counts.entry(body.as_str()).or_insert(0) += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).map(|(b, _)| *b).collect();
    let expected: Vec<String> = numbered(0..TIMERS).into_iter().filter(|b| !lost.contains(b)).collect();
    let missing: Vec<_> = expected.iter().filter(|b| !counts.contains_key(b.as_str())).take(10).collect();
    let extra: Vec<_> = lost.iter().filter(|b| counts.contains_key(b.as_str())).collect();
    assert!(
        twice.is_empty() && missing.is_empty() && extra.is_empty(),
        "{} delivered of {} expected; twice {twice:?}; missing {missing:?}; lost but delivered {extra:?}",
        got.len(),
        expected.len()
    );
}

/// A zeroed page in the middle of a sealed segment of a cleanly closed
/// store: the open went on past it (every open used to fail with "zero
/// bytes where a record should be"), the timers whose records it held are
/// lost and reported, and every other timer fires once.
#[test]
fn a_zeroed_page_inside_the_durable_log_costs_only_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let records = closed_store_with_timers(dir.path(), &clock);
    let lost = zero_page(dir.path(), &records, SEG + 3 * PAGE);
    assert!(lost.len() > 10, "the page held {} records", lost.len());

    let strict = Store::open(config(dir.path(), &clock).with_recovery_mode(RecoveryMode::Strict));
    match strict {
        Err(Error::Corruption { file, .. }) => assert_eq!(file, segment(dir.path(), SEG)),
        other => panic!("strict mode refuses the damaged log, naming its segment: {:?}", other.err()),
    }

    let (got, stats, _) = deliver_all(dir.path(), &clock);
    assert_all_but(&got, &lost);
    assert_eq!(stats.damaged_log_spans, 1, "one damaged stretch, reported");
    assert!(stats.damaged_log_bytes > PAGE - 256, "{} bytes", stats.damaged_log_bytes);
    assert_eq!(stats.quarantined, lost.len() as u64, "each lost timer is reported when it comes due");
}

/// The same page, when the indexes are rebuilt from the first segment (the
/// wheel's files deleted): the replay steps over the page the same way.
#[test]
fn a_zeroed_page_costs_only_its_records_when_the_indexes_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let records = closed_store_with_timers(dir.path(), &clock);
    let lost = zero_page(dir.path(), &records, 2 * SEG + 5 * PAGE);
    std::fs::remove_dir_all(dir.path().join("timer")).unwrap();

    let (got, _, report) = deliver_all(dir.path(), &clock);
    assert_all_but(&got, &lost);
    // With no wheel to resume, recovery validates the whole log and marks the stretch skipped on disk.
    assert_eq!(report.skipped.len(), 1, "{report:?}");
}

/// A flipped byte in the header of the only segment: the header is written
/// again from what the file says (every open used to fail with "bad
/// magic", though every record was intact), and nothing is lost.
#[test]
fn a_damaged_segment_header_is_written_again_and_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    closed_store_with_timers(dir.path(), &clock);
    let first = segment(dir.path(), 0);
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[3] ^= 0xFF;
    std::fs::write(&first, &bytes).unwrap();

    let strict = Store::open(config(dir.path(), &clock).with_recovery_mode(RecoveryMode::Strict));
    match strict {
        Err(Error::Corruption { file, offset: 0, .. }) => assert_eq!(file, first),
        other => panic!("strict mode refuses the damaged header: {:?}", other.err()),
    }

    let store = Store::open(config(dir.path(), &clock)).unwrap();
    assert_eq!(store.recovery_report().repaired_headers, std::slice::from_ref(&first));
    store.close().unwrap();
    let (got, stats, _) = deliver_all(dir.path(), &clock);
    assert_all_but(&got, &[]);
    assert_eq!((stats.quarantined, stats.damaged_log_spans), (0, 0));
    let header = std::fs::read(&first).unwrap();
    assert_eq!(&header[..8], b"DWCLOG\0\0", "the repaired header is on disk");
}

/// Damage in a consume queue (its header, or its last entry's CRC) is an
/// index to rebuild, not an outage (each used to refuse the open): the queue
/// is rebuilt from the log, and every message and timer is there.
#[test]
fn a_damaged_consume_queue_is_rebuilt_from_the_log() {
    for (what, at) in [("a header byte", 3), ("the last entry's CRC", 32 + 49 * 32 + 28)] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(T0);
        let store = Store::open(config(dir.path(), &clock)).unwrap();
        put_numbered(&store, "T", 0..50);
        store.put(Message::new("T", "timer").deliver_at_ms(T0 + 5_000)).unwrap();
        store.close().unwrap();
        let queue = dir.path().join("consumequeue/T/0").join(format!("{:020}", 0));
        let mut bytes = std::fs::read(&queue).unwrap();
        bytes[at] ^= 0xFF;
        std::fs::write(&queue, &bytes).unwrap();

        let strict = Store::open(config(dir.path(), &clock).with_recovery_mode(RecoveryMode::Strict));
        assert!(matches!(strict, Err(Error::Corruption { .. })), "{what}: strict refuses");

        let store = Store::open(config(dir.path(), &clock)).unwrap();
        assert_eq!(store.recovery_report().rebuilt_indexes, [dir.path().join("consumequeue")], "{what}");
        let mut consumer = store.consumer("T", 0).unwrap();
        assert_eq!(bodies(&drain(&mut consumer, 50)), numbered(0..50), "{what}");
        clock.set_ms(T0 + 6_000);
        assert_eq!(bodies(&drain(&mut consumer, 1)), ["timer"], "{what}");
        drop(consumer);
        store.close().unwrap();
    }
}

/// A flipped byte in the header of the relocation index (every store has
/// one, header-only until retention moves a timer): the header holds only
/// constants of the format, so it is written again (every open used to be
/// refused, naming it).
#[test]
fn a_damaged_relocation_index_header_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    store.put(Message::new("T", "timer").deliver_at_ms(T0 + 5_000)).unwrap();
    store.close().unwrap();
    let index = dir.path().join("commitlog/relocated/index");
    let mut bytes = std::fs::read(&index).unwrap();
    bytes[20] ^= 0x01;
    std::fs::write(&index, &bytes).unwrap();

    let strict = Store::open(config(dir.path(), &clock).with_recovery_mode(RecoveryMode::Strict));
    assert!(
        matches!(strict, Err(Error::Corruption { ref file, .. }) if *file == index),
        "{:?}",
        strict.err()
    );
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    assert_eq!(store.recovery_report().repaired_headers, std::slice::from_ref(&index));
    clock.set_ms(T0 + 6_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&drain(&mut consumer, 1)), ["timer"]);
}

/// Damage to entries in the middle of a consume queue, where the open does
/// not look (it checks the queue's end): the first entry, one plain
/// message's entry, a run of ten zeroed entries, and an entry inside a run
/// of timers fired together (one deliveries record). The log still holds
/// what they pointed at, so a consumer that meets them gets them made again
/// from it, in order (it used to get `BadEntry` and had to seek past a
/// message that was not lost).
#[test]
fn damaged_entries_in_the_middle_of_a_queue_are_made_again_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    put_numbered(&store, "T", 0..100);
    for i in 100..200 {
        store.put(Message::new("T", format!("m{i}")).deliver_at_ms(T0 + 5_000)).unwrap();
    }
    // Indexed before they are due: the ticker learns where each goes and
    // fires them as one deliveries record.
    let started = std::time::Instant::now();
    while store.stats().dispatch_lag_bytes > 0 {
        assert!(started.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(2));
    }
    clock.set_ms(T0 + 6_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&drain(&mut consumer, 200)), numbered(0..200));
    drop(consumer);
    store.close().unwrap();

    // 64 entries per queue file (small_config), each 32 bytes after a 32-byte header.
    let entry_at = |index: u64| (format!("{:020}", index / 64 * 64), 32 + (index % 64) as usize * 32);
    let damage = |index: u64, how: &dyn Fn(&mut [u8])| {
        let (file, at) = entry_at(index);
        let path = dir.path().join("consumequeue/T/0").join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        how(&mut bytes[at..at + 32]);
        std::fs::write(&path, bytes).unwrap();
    };
    damage(0, &|e| e[3] ^= 0x40);
    damage(20, &|e| e[9] ^= 0x01);
    (70..80).for_each(|i| damage(i, &|e| e.fill(0)));
    damage(150, &|e| e[17] ^= 0x08);

    let store = Store::open(config(dir.path(), &clock)).unwrap();
    let mut consumer = store.consumer_in_group("fresh", "T", 0).unwrap();
    let got = consumer.poll(500, Duration::from_secs(1)).unwrap();
    assert_eq!(bodies(&got), numbered(0..200));
    store.close().unwrap();
}
