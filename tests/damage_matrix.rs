//! Every file of a store × {a header byte, a middle byte, a zeroed page,
//! truncation}: in the default (lenient) mode the store opens, every timer
//! and message fires or arrives once, and the only ones missing are those
//! whose records lay in damaged bytes of the commit log.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use delaywheel::{Config, ManualClock, Message, Store};

const TIMERS: usize = 300;
const PLAIN: usize = 50;

fn config(dir: &Path, clock: &ManualClock) -> Config {
    small_config(dir).with_clock(clock.clone()).with_queues_per_topic(1)
}

/// A cleanly closed store: timers due at `T0 + 5 s` on topic `T`, plain
/// messages on `P` (a group read half of them), a cancelled timer. Returns
/// each body's record offset and length.
fn store(dir: &Path, clock: &ManualClock) -> BTreeMap<String, (u64, u64)> {
    let store = Store::open(config(dir, clock)).unwrap();
    let mut records = BTreeMap::new();
    for i in 0..TIMERS {
        let body = format!("t{i}");
        let r = store
            .put(Message::new("T", body.clone()).key(format!("k{i}")).deliver_at_ms(T0 + 5_000))
            .unwrap();
        records.insert(body, r.offset());
    }
    for i in 0..PLAIN {
        let body = format!("p{i}");
        records.insert(body.clone(), store.put(Message::new("P", body)).unwrap().offset());
    }
    let gone = store.put(Message::new("T", "cancelled").deliver_at_ms(T0 + 5_000)).unwrap();
    store.cancel(gone.handle().unwrap()).unwrap();
    let mut group = store.consumer_in_group("g", "P", 0).unwrap();
    assert_eq!(drain(&mut group, PLAIN / 2).len(), PLAIN / 2);
    group.commit();
    store.sync_offsets().unwrap();
    drop(group);
    store.close().unwrap();
    // Each record ends where the next begins (or at the end of the puts).
    let mut by_offset: Vec<(u64, String)> = records.iter().map(|(b, &o)| (o, b.clone())).collect();
    by_offset.sort();
    let ends: Vec<u64> = by_offset.iter().skip(1).map(|(o, _)| *o).chain([u64::MAX]).collect();
    by_offset.into_iter().zip(ends).map(|((o, b), end)| (b, (o, end - o))).collect()
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().unwrap() != "LOCK" && std::fs::metadata(&path).unwrap().len() > 0 {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    HeaderByte,
    MiddleByte,
    ZeroedPage,
    Truncated,
}

/// Damages `path`; the byte range it damaged.
fn damage(path: &Path, how: Damage) -> (u64, u64) {
    let mut bytes = std::fs::read(path).unwrap();
    let len = bytes.len();
    let range = match how {
        Damage::HeaderByte => {
            bytes[3] ^= 0xFF;
            (3, 4)
        }
        Damage::MiddleByte => {
            bytes[len / 2] ^= 0x10;
            (len as u64 / 2, len as u64 / 2 + 1)
        }
        Damage::ZeroedPage => {
            let from = if len > 3 * 4096 { len / 2 / 4096 * 4096 } else { 0 };
            let to = (from + 4096).min(len);
            bytes[from..to].fill(0);
            (from as u64, to as u64)
        }
        Damage::Truncated => {
            bytes.truncate(len / 2);
            (len as u64 / 2, len as u64)
        }
    };
    std::fs::write(path, bytes).unwrap();
    range
}

/// The bodies whose records the damage to segment `base` touched.
fn touched(records: &BTreeMap<String, (u64, u64)>, base: u64, (from, to): (u64, u64)) -> Vec<String> {
    let (from, to) = (base + from, base + to);
    records
        .iter()
        .filter(|&(_, &(o, l))| o < to && o.saturating_add(l) > from)
        .map(|(b, _)| b.clone())
        .collect()
}

#[test]
fn every_file_of_a_store_damaged_four_ways_costs_only_what_it_damaged() {
    let pristine = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let records = store(pristine.path(), &clock);
    let mut failures = Vec::new();
    let mut cases = 0;
    for file in files(pristine.path()) {
        let relative = file.strip_prefix(pristine.path()).unwrap().to_path_buf();
        for how in [Damage::HeaderByte, Damage::MiddleByte, Damage::ZeroedPage, Damage::Truncated] {
            cases += 1;
            let dir = tempfile::tempdir().unwrap();
            crash_copy(pristine.path(), dir.path());
            let range = damage(&dir.path().join(&relative), how);
            let segment = relative.parent() == Some(Path::new("commitlog"));
            let lost = if segment {
                let base: u64 = relative.file_name().unwrap().to_str().unwrap().parse().unwrap();
                touched(&records, base, range)
            } else {
                Vec::new()
            };
            if let Err(why) = check(dir.path(), &lost) {
                failures.push(format!("{} {how:?}: {why}", relative.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {cases} cases failed:\n{}", failures.len(), failures.join("\n"));
    assert!(cases > 40, "every kind of file: {cases} cases");
    eprintln!("{cases} damage cases, each cost only what it damaged");
}

/// Opens the damaged store and checks that every timer and every plain
/// message not in `lost` arrives exactly once.
fn check(dir: &Path, lost: &[String]) -> Result<(), String> {
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir, &clock)).map_err(|e| format!("open: {e}"))?;
    clock.set_ms(T0 + 6_000);
    let mut got = Vec::new();
    for topic in ["T", "P"] {
        let mut consumer = store.consumer(topic, 0).map_err(|e| e.to_string())?;
        loop {
            let batch = consumer
                .poll(TIMERS + PLAIN, Duration::from_millis(1500))
                .map_err(|e| format!("poll: {e}"))?;
            if batch.is_empty() {
                break;
            }
            got.extend(bodies(&batch));
        }
    }
    store.close().map_err(|e| format!("close: {e}"))?;
    let mut seen = std::collections::BTreeSet::new();
    for body in &got {
        if !seen.insert(body.clone()) {
            return Err(format!("{body} arrived twice"));
        }
    }
    if seen.contains("cancelled") {
        return Err("a cancelled timer fired".into());
    }
    let wanted = (0..TIMERS).map(|i| format!("t{i}")).chain((0..PLAIN).map(|i| format!("p{i}")));
    let missing: Vec<String> = wanted.filter(|b| !seen.contains(b) && !lost.contains(b)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "{} missing (lost to the damage: {}), first {:?}",
            missing.len(),
            lost.len(),
            &missing[..missing.len().min(5)]
        ));
    }
    Ok(())
}
