//! Crash test for retention with real processes: a child on a manual clock
//! runs a year's worth of nothing in seconds, putting far timers and filler,
//! moving its clock so segments expire constantly and are relocated and
//! deleted while it runs; it is killed with SIGKILL at a random moment (often
//! inside a relocation). The store is reopened far in the future: every far
//! timer the child saw acknowledged must fire exactly once, never early, and
//! none whose cancel was acknowledged.
//!
//! `cargo test --test crash_retention` runs 12 kills; `DELAYWHEEL_CRASH_KILLS=n`
//! runs more, `DELAYWHEEL_CRASH_SEED=n` repeats a run.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use delaywheel::{CancelOutcome, Clock, Config, ManualClock, Message, Retention, Store, SystemClock};

const TOPIC: &str = "FarTopic";
const FILLER: &str = "Filler";
const CHILD_ENV: &str = "DELAYWHEEL_CRASH_RETENTION_CHILD";
const T0: u64 = 1_700_000_000_000;
const YEAR: u64 = 365 * 86_400_000;
/// The child's clock moves this much per put: a segment is a few seconds old
/// after a few hundred puts, and the retention time is one minute.
const STEP_MS: u64 = 20;

fn config(dir: &Path, clock: &ManualClock) -> Config {
    let retention = Retention {
        keep_for: Some(Duration::from_secs(60)),
        max_log_bytes: None,
        check_interval: Duration::from_millis(5),
    };
    Config::new(dir)
        .with_clock(clock.clone())
        .with_segment_size(64 << 10)
        .with_queue_file_entries(256)
        .with_timer_log_file_entries(1 << 14)
        .with_queues_per_topic(1)
        .with_flush_interval(Duration::from_millis(5))
        .with_retention(retention)
}

/// The child: message `id` is put at `T0 + id * STEP_MS`. Every fourth is a
/// timer a year and `id` ms ahead (its id printed once acknowledged); one in
/// eight of those is cancelled at once (`c <id>` once acknowledged); the rest
/// is filler. It also asks for a retention pass every 64 puts.
fn child(dir: &str) -> ! {
    let clock = ManualClock::new(T0);
    let store = Store::open(config(Path::new(dir), &clock)).expect("child opens the store");
    let mut out = std::io::stdout().lock();
    let body = vec![b'f'; 600];
    for id in 0u64.. {
        clock.set_ms(T0 + id * STEP_MS);
        if id % 4 == 0 {
            let message = Message::new(TOPIC, id.to_le_bytes().to_vec()).deliver_at_ms(T0 + YEAR + id);
            let receipt = store.put(message).expect("put");
            writeln!(out, "{id}").expect("stdout");
            if id % 32 == 0 {
                let handle = receipt.handle().expect("a timer");
                if store.cancel(handle).expect("cancel") == CancelOutcome::Cancelled {
                    writeln!(out, "c {id}").expect("stdout");
                }
            }
        } else {
            store.put(Message::new(FILLER, body.clone())).expect("put filler");
        }
        if id % 64 == 0 {
            out.flush().expect("stdout");
            store.reclaim().expect("reclaim");
        }
    }
    unreachable!()
}

/// What one kill left behind, after recovery and delivering every far timer.
#[derive(Debug, Default)]
struct Audit {
    acked: usize,
    cancelled: usize,
    delivered: usize,
    segments_deleted_before: bool,
    lost: usize,
    duplicated: usize,
    early: usize,
    fired_after_cancel: usize,
}

fn run_once(seed: u64, kill_after: Duration) -> Audit {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || -> (Vec<u64>, HashSet<u64>) {
        let (mut acked, mut cancelled) = (Vec::new(), HashSet::new());
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            match line.strip_prefix("c ") {
                Some(id) => cancelled.extend(id.parse::<u64>().ok()),
                None => acked.extend(line.parse::<u64>().ok()),
            }
        }
        (acked, cancelled)
    });
    std::thread::sleep(kill_after);
    child.kill().expect("SIGKILL");
    child.wait().expect("reap child");
    let (acked, cancelled) = reader.join().expect("reader thread");
    let segments_deleted_before = !dir.path().join("commitlog").join(format!("{:020}", 0)).exists();

    // Reopen after every far timer is due: a year later than the child's last put.
    let clock = ManualClock::new(T0 + 2 * YEAR);
    let store =
        Store::open(config(dir.path(), &clock)).unwrap_or_else(|e| panic!("seed {seed}: reopen failed: {e}"));
    let mut consumer = store.consumer_in_group("audit", TOPIC, 0).expect("consumer");
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut early = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let batch = consumer.poll(4096, Duration::from_millis(200)).expect("poll");
        for m in &batch {
            let id = u64::from_le_bytes(m.body()[..8].try_into().expect("8-byte body"));
            *seen.entry(id).or_default() += 1;
            if m.delivered_at_ms() < m.deliver_at_ms().expect("a timed message") {
                early += 1;
            }
        }
        let settled = |id: &u64| seen.contains_key(id) || cancelled.contains(id) || id.is_multiple_of(32);
        if batch.is_empty() && acked.iter().all(settled) && store.stats().pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            break;
        }
    }
    drop(consumer);
    store.close().expect("close");
    Audit {
        acked: acked.len(),
        cancelled: cancelled.len(),
        delivered: seen.len(),
        segments_deleted_before,
        // A cancel whose answer died with the child may or may not have happened.
        lost: acked
            .iter()
            .filter(|id| !seen.contains_key(id) && !cancelled.contains(id) && !id.is_multiple_of(32))
            .count(),
        duplicated: seen.values().map(|&n| n.saturating_sub(1)).sum(),
        early,
        fired_after_cancel: cancelled.iter().filter(|id| seen.contains_key(id)).count(),
    }
}

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let kills: u64 = std::env::var("DELAYWHEEL_CRASH_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    let seed: u64 = std::env::var("DELAYWHEEL_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| SystemClock.now_ms());
    println!("retention crash test: {kills} kills, seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut failed, mut with_deletions) = (0, 0);
    for kill in 0..kills {
        let kill_after = Duration::from_millis(rng.u64(300..1_500));
        let audit = run_once(seed, kill_after);
        let ok = audit.lost == 0
            && audit.duplicated == 0
            && audit.early == 0
            && audit.fired_after_cancel == 0
            && audit.delivered + audit.cancelled >= audit.acked - audit.acked / 8;
        println!("kill {kill} after {kill_after:?}: {audit:?} {}", if ok { "ok" } else { "FAILED" });
        failed += u64::from(!ok);
        with_deletions += u64::from(audit.segments_deleted_before);
    }
    println!(
        "{} passed, {failed} failed, {with_deletions} killed after retention had deleted segments",
        kills - failed
    );
    // The test proves nothing if the child never got as far as deleting a segment.
    if failed > 0 || with_deletions < kills / 2 {
        std::process::exit(1);
    }
}
