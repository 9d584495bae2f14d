//! Crash test with real processes: a child puts timed messages under load and
//! is killed with SIGKILL at a random moment; the store is then reopened,
//! drained and audited. Every message the child saw acknowledged must be
//! delivered exactly once, none early, whatever the moment of the kill; and
//! the pending count of a copy opened without delivery (what `delaywheel
//! recover` prints) must be the number of timers the reopened store delivers.
//!
//! `cargo test --test crash` runs 20 kills; `DELAYWHEEL_CRASH_KILLS=50` runs
//! more, `DELAYWHEEL_CRASH_SEED=n` repeats a run.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::crash_copy;
use common::kill::{Audit, audit, kill_child_after, kills_and_seed};
use delaywheel::{CancelOutcome, Clock, Config, Error, Message, Stats, Store, SystemClock};

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

/// `fresh_stats`, waiting out the replay.
fn fresh_stats(store: &Store) -> Stats {
    for _ in 0..600 {
        match store.fresh_stats() {
            Ok(stats) => return stats,
            Err(Error::Busy { .. }) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("fresh_stats: {e}"),
        }
    }
    panic!("the replay did not catch up in 30 s")
}

/// What `delaywheel recover` would print as pending for a copy of `dir`.
fn recover_pending(dir: &Path) -> u64 {
    let copy = tempfile::tempdir().expect("temp dir");
    crash_copy(dir, copy.path());
    let store = Store::open(config(copy.path()).with_delivery(false)).expect("open without delivery");
    let pending = fresh_stats(&store).pending;
    store.close().expect("close");
    pending
}

/// What one kill left, and the pending count recover gives against the
/// timers the reopened store delivered.
fn run_once(seed: u64, kill_after: Duration) -> (Audit, u64, u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let acks = kill_child_after(CHILD_ENV, dir.path(), kill_after);
    let recovered = recover_pending(dir.path());
    let store = Store::open(config(dir.path())).unwrap_or_else(|e| panic!("seed {seed}: reopen failed: {e}"));
    // One in eight was cancelled; an answer that died with the child may have gone either way.
    let audit = audit(&store, TOPIC, &acks, |id| id % 8 == 3);
    let delivered = fresh_stats(&store).delivered;
    store.close().expect("close");
    (audit, recovered, delivered)
}

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let (kills, seed) = kills_and_seed(20);
    println!("crash test: {kills} kills, seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut failed = 0;
    for kill in 0..kills {
        let kill_after = Duration::from_millis(rng.u64(150..1_200));
        let (audit, recovered, delivered) = run_once(seed, kill_after);
        let ok = audit.ok() && recovered == delivered;
        println!(
            "kill {kill} after {kill_after:?}: {audit:?}, recover's pending {recovered}, delivered on reopen {delivered} {}",
            if ok { "ok" } else { "FAILED" }
        );
        failed += u64::from(!ok);
    }
    println!("{} passed, {failed} failed", kills - failed);
    if failed > 0 {
        std::process::exit(1);
    }
}
