//! `delaywheel drain` and `delaywheel recover` on stores an application made.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use delaywheel::{Clock, Config, ManualClock, Message, Recurrence, Schedule, Store};

const T0: u64 = 1_700_000_000_000;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_delaywheel")).args(args).output().unwrap()
}

/// The application's configuration: files smaller than the defaults.
fn app_config(dir: &Path, clock: &ManualClock) -> Config {
    Config::new(dir)
        .with_segment_size(1 << 20)
        .with_queue_file_entries(64)
        .with_timer_log_file_entries(128)
        .with_queues_per_topic(1)
        .with_clock(clock.clone())
}

/// `recover` on a store whose indexes were deleted rebuilds them with the
/// sizes of the files it finds, and the application opens the store again
/// with its own configuration (the rebuilt indexes used to get the default
/// sizes, and the application's open was refused).
#[test]
fn recover_rebuilds_deleted_indexes_that_the_application_can_open() {
    let dir = tempfile::tempdir().unwrap();
    // The command runs on the system clock: the application's clock starts there too.
    let now = delaywheel::SystemClock.now_ms();
    let clock = ManualClock::new(now);
    let store = Store::open(app_config(dir.path(), &clock)).unwrap();
    for i in 0..10 {
        store.put(Message::new("T", format!("m{i}")).deliver_at_ms(now + 60_000)).unwrap();
        store.put(Message::new("T", format!("now {i}"))).unwrap();
    }
    store.close().unwrap();
    for index in ["consumequeue", "timer", "checkpoint"] {
        let path = dir.path().join(index);
        if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) }.unwrap();
    }

    let out = run(&["recover", "--dir", dir.path().to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let store = Store::open(app_config(dir.path(), &clock)).unwrap();
    clock.set_ms(now + 61_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    let mut got = 0;
    let started = Instant::now();
    while got < 20 && started.elapsed() < Duration::from_secs(10) {
        got += consumer.poll(100, Duration::from_millis(200)).unwrap().len();
    }
    assert_eq!(got, 20);
}

/// `drain` gives up at its timeout with the count of pending timers.
#[test]
fn drain_gives_up_at_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(app_config(dir.path(), &clock)).unwrap();
    let in_an_hour = delaywheel::SystemClock.now_ms() + 3_600_000;
    store.put(Message::new("T", "in an hour").deliver_at_ms(in_an_hour)).unwrap();
    store.close().unwrap();

    let started = Instant::now();
    let out = run(&["drain", "--dir", dir.path().to_str().unwrap(), "--timeout-secs", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("timed out after 2 s with 1 timers pending"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// `drain --for-secs` delivers for that long and reports, pending or not:
/// a store with a recurring schedule never drains.
#[test]
fn drain_for_secs_delivers_a_schedule_for_that_long_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let now = delaywheel::SystemClock.now_ms();
    let clock = ManualClock::new(now);
    let store = Store::open(app_config(dir.path(), &clock)).unwrap();
    let every = Recurrence::every(Duration::from_millis(200));
    store.schedule(Schedule::new(Message::new("T", "tick"), every).start_at_ms(now + 500)).unwrap();
    store.close().unwrap();

    let started = Instant::now();
    let out = run(&["drain", "--dir", dir.path().to_str().unwrap(), "--for-secs", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() >= Duration::from_secs(2));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pending"], 1, "{report}");
    assert!(report["delivered"].as_u64().unwrap() >= 3, "{report}");
}

/// The README's own examples name the store `data`, relative to where they
/// run: a path of one component, whose parent is the empty path (the store
/// used to fail with "fsync directory : No such file or directory").
#[test]
fn a_store_named_by_one_relative_component_opens() {
    let cwd = tempfile::tempdir().unwrap();
    let in_cwd = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_delaywheel")).args(args).current_dir(cwd.path()).output().unwrap()
    };
    let perf = in_cwd(&["perf", "--dir", "data", "--messages", "100", "--delay-ms", "0..10", "--json"]);
    assert!(perf.status.success(), "perf --dir data: {}", String::from_utf8_lossy(&perf.stderr));
    assert!(cwd.path().join("data/commitlog").is_dir());
    let recovered = in_cwd(&["recover", "--dir", "data", "--json"]);
    assert!(recovered.status.success(), "recover --dir data: {}", String::from_utf8_lossy(&recovered.stderr));
}

/// A zeroed page inside the durable log of a cleanly closed store: every
/// open used to fail ("zero bytes where a record should be"), since the
/// open's scan for settled timers walks those records. `recover` now steps
/// over it, reports the stretch and exits 0; `--strict` refuses, naming the
/// segment.
#[test]
fn recover_steps_over_a_zeroed_page_and_strict_refuses_it() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let path = path.to_str().unwrap();
    let perf =
        run(&["perf", "--dir", path, "--messages", "3000", "--delay-ms", "3600000..3700000", "--no-wait"]);
    assert!(perf.status.success(), "{}", String::from_utf8_lossy(&perf.stderr));
    let segment = dir.path().join("store/commitlog").join(format!("{:020}", 0));
    let mut file = std::fs::OpenOptions::new().write(true).open(&segment).unwrap();
    file.seek(SeekFrom::Start(200 * 1024)).unwrap();
    file.write_all(&[0; 4096]).unwrap();
    drop(file);

    let strict = run(&["recover", "--dir", path, "--json", "--strict"]);
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert_eq!(strict.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("00000000000000000000 at offset 2048"), "{stderr}");

    let out = run(&["recover", "--dir", path, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["damage"]["spans_skipped_by_readers"], 1, "{report}");
    // From the first record boundary in the page to the first record after it.
    assert!(report["damage"]["bytes_skipped_by_readers"].as_u64().unwrap() > 4096 - 256, "{report}");
}

/// A power loss during the very first open can leave the directory with its
/// `LOCK` and no `commitlog/`: the library opens it as a fresh store, and
/// so does `recover` now (it used to refuse it: "no commitlog/").
#[test]
fn recover_opens_a_store_whose_first_open_lost_power() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("LOCK"), b"").unwrap();
    let out = run(&["recover", "--dir", dir.path().to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let empty = tempfile::tempdir().unwrap();
    let refused = run(&["recover", "--dir", empty.path().to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1), "an empty directory is no store");
}

/// A damaged timer-log entry the store repairs itself (the ticking thread
/// rebuilds the wheel from the log when it meets it): `recover` counts every
/// timer and exits 0.
#[test]
fn recover_counts_through_a_damaged_timer_log_entry() {
    let dir = tempfile::tempdir().unwrap();
    let now = delaywheel::SystemClock.now_ms();
    let clock = ManualClock::new(now);
    let store = Store::open(app_config(dir.path(), &clock)).unwrap();
    for i in 0..10 {
        store.put(Message::new("T", format!("m{i}")).deliver_at_ms(now + 2 * 86_400_000 + i)).unwrap();
    }
    store.close().unwrap();
    // Entry 5 of the far timer log (level-1 chains): 32-byte header, 28-byte entries.
    let far_log = dir.path().join("timer/timerlog-far").join(format!("{:020}", 0));
    let mut bytes = std::fs::read(&far_log).unwrap();
    bytes[32 + 5 * 28 + 3] ^= 0x40;
    std::fs::write(&far_log, bytes).unwrap();

    let out = run(&["recover", "--dir", dir.path().to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pending"], 10, "{report}");
}
