//! Fixtures for the wheel-dump tests: stores written through the library
//! with a manual clock (so every time and offset is the same on every run),
//! copies of them with damage, and a way to run the binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use delaywheel::internals;
use delaywheel::internals::record::{self, FrameError, Record};
use delaywheel::{Clock, Config, ManualClock, Message, Retention, Store};

/// The epoch ms the fixtures start at (2023-11-14T22:13:20Z).
pub const T0: u64 = 1_700_000_000_000;
pub const TOPIC: &str = "Orders";

/// Small files so everything is quick; one queue per topic; the flusher never
/// checkpoints on its own, so the checkpoint is the one written by close.
pub fn config(dir: &Path, clock: &ManualClock) -> Config {
    Config::new(dir)
        .with_segment_size(64 * 1024)
        .with_queue_file_entries(64)
        .with_timer_log_file_entries(64)
        .with_max_body_bytes(8 * 1024)
        .with_queues_per_topic(1)
        .with_flush_interval(Duration::from_secs(3600))
        .with_clock(clock.clone())
}

/// The healthy store most tests read, and the log offsets of its messages.
pub struct Healthy {
    pub dir: tempfile::TempDir,
    /// Due at T0 + 5 s, delivered.
    pub a: u64,
    /// Legacy level 2 (5 s): due at T0 + 5 s too, delivered.
    pub b: u64,
    /// Due at T0 + 20 s, cancelled.
    pub c: u64,
    /// Legacy level 18 (2 h): pending on level 0.
    pub d: u64,
    /// Due at T0 + 2 days: pending on level 1.
    pub e: u64,
    /// An ordinary message.
    pub m: u64,
}

impl Healthy {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Writes the healthy store: five timers and an ordinary message; two timers
/// delivered at T0 + 11 s, one cancelled, two pending; closed cleanly.
pub fn healthy() -> Healthy {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    let put = |m: Message| store.put(m).unwrap();
    let a = put(Message::new(TOPIC, "a").key("order-1").deliver_at_ms(T0 + 5_000));
    let b = put(Message::new(TOPIC, "b").delay_level(2));
    let c = put(Message::new(TOPIC, "c").delay(Duration::from_secs(20)));
    wait_until(|| store.stats().dispatch_lag_bytes == 0);
    assert_eq!(store.cancel(c.handle().unwrap()).unwrap(), delaywheel::CancelOutcome::Cancelled);
    let d = put(Message::new(TOPIC, "d").delay_level(18));
    let e = put(Message::new(TOPIC, "e").deliver_at_ms(T0 + 2 * 86_400_000));
    let m = put(Message::new(TOPIC, "hello").tags("paid"));
    clock.set_ms(T0 + 11_000);
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let mut got = 0;
    let started = Instant::now();
    while got < 3 && started.elapsed() < Duration::from_secs(10) {
        got += consumer.poll(3, Duration::from_millis(200)).unwrap().len();
    }
    assert_eq!(got, 3, "the ordinary message and the two due timers");
    // Let the ticking thread look at the clock again after the deliveries,
    // so what close records does not depend on thread timing.
    std::thread::sleep(Duration::from_millis(300));
    store.close().unwrap();
    let [a, b, c, d, e, m] = [a, b, c, d, e, m].map(|r| r.offset());
    Healthy { dir, a, b, c, d, e, m }
}

/// A store where every one of `n` timers (due within 10 s) was delivered.
pub fn all_delivered(n: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    for i in 0..n {
        // Spread over 10 s without a random generator: a fixed permutation.
        let delay = i * 7_919 % 10_000;
        store.put(Message::new(TOPIC, format!("m{i}")).deliver_at_ms(T0 + delay)).unwrap();
    }
    // Timers that reach the wheel before their second fire together.
    wait_until(|| store.stats().dispatch_lag_bytes == 0);
    clock.set_ms(T0 + 11_000);
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let (mut got, started) = (0, Instant::now());
    while got < n && started.elapsed() < Duration::from_secs(20) {
        got += consumer.poll(n as usize, Duration::from_millis(200)).unwrap().len() as u64;
    }
    assert_eq!(got, n);
    store.close().unwrap();
    dir
}

/// A store with retention, at two moments (each a closed copy), and the log
/// offsets of its timers.
///
/// Keep time 1 h, 64 KiB segments. At T0: five timers ten years ahead (`far`;
/// the last one cancelled), one due at T0 + 2.5 h (`soon`), then ~300 KB of
/// fillers. At T0 + 2 h, retention deletes the segments holding them and
/// relocates the six timers and the cancel: that is `first`. Then `soon`
/// fires (T0 + 3 h), more fillers follow, and at T0 + 6 h retention deletes
/// the segments holding its delivery record (its copy stays: its window has
/// not passed); one more timer (`late`) is put and delivered: that is `later`.
pub struct Retained {
    pub first: tempfile::TempDir,
    pub later: tempfile::TempDir,
    pub far: Vec<u64>,
    pub soon: u64,
    pub late: u64,
}

pub const HOUR: u64 = 3_600_000;
pub const DECADE: u64 = 10 * 365 * 24 * HOUR;
/// Where the retained fixture's relocated timers sit: the cancelled far timer is last.
pub const FAR_TIMERS: usize = 5;

/// The retained fixture's configuration: the flusher checkpoints often, so
/// retention's floor follows the log.
pub fn retention_config(dir: &Path, clock: &ManualClock) -> Config {
    let retention = Retention {
        keep_for: Some(Duration::from_secs(3600)),
        max_log_bytes: None,
        check_interval: Duration::from_secs(3600),
    };
    config(dir, clock).with_flush_interval(Duration::from_millis(5)).with_retention(retention)
}

/// 100 messages of 1,000 bytes: about 1.5 segments.
pub fn fill(store: &Store, round: usize) {
    for i in 0..100 {
        store.put(Message::new("Filler", format!("f{round}-{i}-{}", "x".repeat(1_000)))).unwrap();
    }
}

/// Lets the flusher checkpoint what was put, so retention's floor moves past it.
pub fn settle() {
    std::thread::sleep(Duration::from_millis(60));
}

/// Reclaims until `done` says so (the floor needs checkpoints after the last put).
pub fn reclaim_until(store: &Store, mut done: impl FnMut(&Store) -> bool) {
    let started = Instant::now();
    loop {
        settle();
        store.reclaim().unwrap();
        if done(store) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "retention did not get there: {:?}",
            store.stats()
        );
    }
}

pub fn retained() -> Retained {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(retention_config(dir.path(), &clock)).unwrap();
    let put = |m: Message| store.put(m).unwrap();
    let far: Vec<_> = (0..FAR_TIMERS as u64)
        .map(|i| put(Message::new(TOPIC, format!("far-{i}")).deliver_at_ms(T0 + DECADE + i)))
        .collect();
    let soon = put(Message::new(TOPIC, "soon").deliver_at_ms(T0 + 2 * HOUR + HOUR / 2));
    wait_until(|| store.stats().dispatch_lag_bytes == 0);
    let cancelled = far[FAR_TIMERS - 1].handle().unwrap();
    assert_eq!(store.cancel(cancelled).unwrap(), delaywheel::CancelOutcome::Cancelled);
    for round in 0..3 {
        fill(&store, round);
    }
    settle();
    clock.set_ms(T0 + 2 * HOUR);
    reclaim_until(&store, |s| s.stats().retention.relocated_timers == FAR_TIMERS as u64 + 1);
    assert!(store.stats().retention.oldest_retained_offset > soon.offset());
    store.close().unwrap();
    let first = copy_of(dir.path());

    let store = Store::open(retention_config(dir.path(), &clock)).unwrap();
    clock.set_ms(T0 + 3 * HOUR);
    wait_until(|| store.stats().delivered == 1);
    let stats = store.stats();
    // The delivery record of `soon` lies below this.
    let end = stats.retention.oldest_retained_offset + stats.log_bytes;
    for round in 3..7 {
        fill(&store, round);
    }
    settle();
    clock.set_ms(T0 + 6 * HOUR);
    reclaim_until(&store, |s| s.stats().retention.oldest_retained_offset > end);
    let late = store.put(Message::new(TOPIC, "late").deliver_at_ms(T0 + 6 * HOUR + 60_000)).unwrap();
    clock.set_ms(T0 + 6 * HOUR + 120_000);
    wait_until(|| store.stats().delivered == 2);
    std::thread::sleep(Duration::from_millis(300));
    store.close().unwrap();
    Retained {
        first,
        later: dir,
        far: far.iter().map(|r| r.offset()).collect(),
        soon: soon.offset(),
        late: late.offset(),
    }
}

pub fn wait_until(mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Copies a store directory (to damage the copy).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A copy of `from` in a new temporary directory.
pub fn copy_of(from: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    copy_dir(from, copy.path());
    copy
}

/// Flips bit 0 of the byte at `offset` of `file`.
pub fn flip_bit(file: &Path, offset: u64) {
    let mut bytes = std::fs::read(file).unwrap();
    bytes[offset as usize] ^= 1;
    std::fs::write(file, bytes).unwrap();
}

/// Rewrites every segment's header as `version` (the records stay as they are).
pub fn set_segment_versions(dir: &Path, version: u32) {
    for entry in std::fs::read_dir(dir.join("commitlog")).unwrap() {
        let path = entry.unwrap().path();
        if !path.file_name().unwrap().to_string_lossy().chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let header = internals::FileHeader::decode(&bytes, internals::COMMITLOG_MAGIC).unwrap();
        write_at(&path, 0, &internals::FileHeader { version, ..header }.encode());
    }
}

/// Writes `bytes` at `offset` of `file`.
pub fn write_at(file: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new().write(true).open(file).unwrap().write_all_at(bytes, offset).unwrap();
}

pub fn segment0(dir: &Path) -> PathBuf {
    dir.join("commitlog").join(format!("{:020}", 0))
}

/// Every record of the first segment with its offset and bytes, checked by
/// the library, and the offset just past the last.
pub fn records(dir: &Path) -> (Vec<(u64, Vec<u8>)>, u64) {
    let segment = std::fs::read(segment0(dir)).unwrap();
    let mut at = internals::FILE_HEADER_LEN;
    let mut out = Vec::new();
    loop {
        let frame = match record::check_header_in(&segment[at..], segment.len() - at) {
            Ok(frame) => frame,
            Err(FrameError::Empty) => break,
            Err(e) => panic!("{e:?} at {at}"),
        };
        let bytes = segment[at..at + frame.len].to_vec();
        decoded(at as u64, &bytes);
        out.push((at as u64, bytes));
        at += frame.len;
    }
    (out, at as u64)
}

/// The record `bytes` at log offset `at`, decoded by the library.
pub fn decoded(at: u64, bytes: &[u8]) -> Record<'_> {
    let frame = record::check_header(bytes).unwrap();
    Record::decode(bytes, at, frame).unwrap()
}

/// Appends a copy of the record `bytes` at the end of the log, with its CRC
/// bound to the new offset (`wheel-format.md`: the CRC hashes the offset
/// first, then bytes 4..len). `edit` may change the copy first.
pub fn append_copy(dir: &Path, mut bytes: Vec<u8>, edit: impl FnOnce(&mut [u8])) -> u64 {
    let (_, end) = records(dir);
    edit(&mut bytes);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&end.to_le_bytes()), &bytes[4..]);
    bytes[..4].copy_from_slice(&crc.to_le_bytes());
    write_at(&segment0(dir), end, &bytes);
    end
}

/// Runs `wheel-dump` with `args`.
pub fn run(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_wheel-dump")).args(args).output().unwrap()
}

/// Runs `wheel-dump DIR args...`.
pub fn dump(dir: &Path, args: &[&str]) -> Output {
    let mut all = vec![dir.to_str().unwrap()];
    all.extend_from_slice(args);
    run(&all)
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// Parses the single JSON document a command printed.
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(stdout(out).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

/// A store with one near timer (level 0, due at T0 + 60 s) and one far
/// timer (level 1, due at T0 + 2 days), both pending; closed cleanly.
/// Returns the store and the two timers' log offsets (near, far).
pub fn far_and_near() -> (tempfile::TempDir, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    let near = store.put(Message::new(TOPIC, "near").deliver_at_ms(T0 + 60_000)).unwrap();
    let far = store.put(Message::new(TOPIC, "far").deliver_at_ms(T0 + 2 * 86_400_000)).unwrap();
    wait_until(|| store.stats().dispatch_lag_bytes == 0);
    store.close().unwrap();
    (dir, near.offset(), far.offset())
}

/// A store whose near timer log had its oldest files deleted by the store,
/// and what it holds.
pub struct Reclaimed {
    pub dir: tempfile::TempDir,
    /// Near timers put and delivered, round after round.
    pub delivered: u64,
    /// The second of the first round's first timer: its slot's chain lies
    /// in a deleted timer-log file.
    pub first_second: u64,
    /// Pending at the close: a near timer (its entry in the near log's
    /// newest file) and a far one.
    pub near: u64,
    pub far: u64,
}

/// Timer-log files of 64 entries (`config`), a manual clock, and retention
/// configured (so `Store::reclaim` asks the ticking thread to delete the
/// timer-log files no chain reaches, as it does every 10 s by itself).
/// A far timer is put first; then six rounds of 40 near timers, each round
/// delivered before the next (240 near entries: four files). Once they are
/// delivered no live chain reaches the first three files, and the store
/// deletes them; a pending near timer is put last. Closed cleanly.
pub fn near_log_reclaimed() -> Reclaimed {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(retention_config(dir.path(), &clock)).unwrap();
    let far = store.put(Message::new(TOPIC, "far").deliver_at_ms(T0 + 2 * 86_400_000)).unwrap().offset();
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let (rounds, per_round) = (6u64, 40u64);
    for round in 0..rounds {
        let base = clock.now_ms();
        for i in 0..per_round {
            // Four seconds of ten timers each.
            let at = base + 1_000 + i * 100;
            store.put(Message::new(TOPIC, format!("r{round}-{i}")).deliver_at_ms(at)).unwrap();
        }
        wait_until(|| store.stats().dispatch_lag_bytes == 0);
        clock.set_ms(base + 10_000);
        let (mut got, started) = (0, Instant::now());
        while got < per_round && started.elapsed() < Duration::from_secs(20) {
            got += consumer.poll(per_round as usize, Duration::from_millis(200)).unwrap().len() as u64;
        }
        assert_eq!(got, per_round, "round {round} delivered");
    }
    let near = store.put(Message::new(TOPIC, "near").deliver_at_ms(clock.now_ms() + 3_600_000)).unwrap();
    wait_until(|| store.stats().dispatch_lag_bytes == 0);
    let first_file = dir.path().join("timer/timerlog").join(format!("{:020}", 128));
    let started = Instant::now();
    while first_file.exists() {
        // Checkpoints past the deliveries, then a retention pass: the
        // ticking thread deletes the files no chain reaches right after it.
        std::thread::sleep(Duration::from_millis(60));
        store.reclaim().unwrap();
        assert!(started.elapsed() < Duration::from_secs(20), "the near timer log's files were not deleted");
    }
    store.close().unwrap();
    Reclaimed {
        dir,
        delivered: rounds * per_round,
        first_second: (T0 + 1_000) / 1000,
        near: near.offset(),
        far,
    }
}
