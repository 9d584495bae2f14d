//! Crash test with real processes: a child puts timed messages under load and
//! is killed with SIGKILL at a random moment; the store is then reopened,
//! drained and audited. Every message the child saw acknowledged must be
//! delivered exactly once, none early, whatever the moment of the kill.
//!
//! `cargo test --test crash` runs 20 kills; `DELAYWHEEL_CRASH_KILLS=50` runs
//! more, `DELAYWHEEL_CRASH_SEED=n` repeats a run.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use delaywheel::{CancelOutcome, Clock, Config, Message, Store, SystemClock};

const TOPIC: &str = "CrashTopic";
const CHILD_ENV: &str = "DELAYWHEEL_CRASH_CHILD";

fn config(dir: &Path) -> Config {
    Config::new(dir)
        .with_segment_size(1 << 20)
        .with_queue_file_entries(4096)
        .with_timer_log_file_entries(1 << 14)
        .with_queues_per_topic(1)
        .with_flush_interval(Duration::from_millis(50))
}

/// The child: puts timed messages due 0-1.5 s ahead, forever, and prints the
/// id of each one `put` acknowledged; cancels one in eight right away and
/// prints `c <id>` when the answer is `Cancelled`.
fn child(dir: &str) -> ! {
    let store = Store::open(config(Path::new(dir))).expect("child opens the store");
    let mut rng = fastrand::Rng::new();
    let mut out = std::io::stdout().lock();
    for id in 0u64.. {
        let at = SystemClock.now_ms() + rng.u64(0..1_500);
        let body = id.to_le_bytes().to_vec();
        let receipt = store.put(Message::new(TOPIC, body).deliver_at_ms(at)).expect("put");
        writeln!(out, "{id}").expect("stdout");
        if id % 8 == 3 {
            let handle = receipt.handle().expect("a timer");
            if store.cancel(handle).expect("cancel") == CancelOutcome::Cancelled {
                writeln!(out, "c {id}").expect("stdout");
            }
        }
        if id % 64 == 0 {
            out.flush().expect("stdout");
        }
        if id % 512 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    unreachable!()
}

/// What one kill left behind, after recovery and draining.
#[derive(Debug, Default)]
struct Audit {
    acked: usize,
    cancelled: usize,
    delivered: usize,
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
    // Read the acknowledgements as they come, so the child never blocks on a full pipe.
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

    let store = Store::open(config(dir.path())).unwrap_or_else(|e| panic!("seed {seed}: reopen failed: {e}"));
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
        // A timer whose cancel answer died with the child may never come.
        let settled = |id: &u64| seen.contains_key(id) || cancelled.contains(id) || id % 8 == 3;
        let all_acked_seen = acked.iter().all(settled);
        if batch.is_empty() && all_acked_seen && store.stats().pending == 0 {
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
        // A cancel whose answer was not printed before the kill may or may not
        // have happened: such a timer may fire or not, but not twice.
        lost: acked
            .iter()
            .filter(|id| !seen.contains_key(id) && !cancelled.contains(id) && *id % 8 != 3)
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
    let kills: u64 = std::env::var("DELAYWHEEL_CRASH_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let seed: u64 = std::env::var("DELAYWHEEL_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| SystemClock.now_ms());
    println!("crash test: {kills} kills, seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut failed = 0;
    for kill in 0..kills {
        let kill_after = Duration::from_millis(rng.u64(150..1_200));
        let audit = run_once(seed, kill_after);
        // Every acknowledged timer either fired or was cancelled (those whose
        // cancel answer died with the child may have gone either way).
        let ok = audit.lost == 0
            && audit.duplicated == 0
            && audit.early == 0
            && audit.fired_after_cancel == 0
            && audit.delivered + audit.cancelled >= audit.acked - audit.acked / 8;
        println!("kill {kill} after {kill_after:?}: {audit:?} {}", if ok { "ok" } else { "FAILED" });
        failed += u64::from(!ok);
    }
    println!("{} passed, {failed} failed", kills - failed);
    if failed > 0 {
        std::process::exit(1);
    }
}
