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

mod common;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::kill::{Audit, audit, kill_child_after, kills_and_seed};
use delaywheel::{CancelOutcome, Config, ManualClock, Message, Retention, Store};

const TOPIC: &str = "FarTopic";
const FILLER: &str = "Filler";
const CHILD_ENV: &str = "DELAYWHEEL_CRASH_RETENTION_CHILD";
const T0: u64 = 1_700_000_000_000;
const YEAR: u64 = 365 * 86_400_000;
/// The child's clock moves this much per put: a segment is a few seconds old
/// after a few hundred puts, and the retention time is half a minute, so
/// segments are deleted from about 1,500 puts on (a fraction of a second in a
/// debug build; with a minute, half the kills came before the first deletion
/// on a busy machine and the run failed its own bar below).
const STEP_MS: u64 = 20;

fn config(dir: &Path, clock: &ManualClock) -> Config {
    let retention = Retention {
        keep_for: Some(Duration::from_secs(30)),
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

/// What one kill left behind, and whether retention had deleted segments by then.
fn run_once(seed: u64, kill_after: Duration) -> (Audit, bool, Vec<(String, u64)>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let acks = kill_child_after(CHILD_ENV, dir.path(), kill_after);
    let segments_deleted = !dir.path().join("commitlog").join(format!("{:020}", 0)).exists();
    // Reopen after every far timer is due: a year later than the child's last put.
    let clock = ManualClock::new(T0 + 2 * YEAR);
    let store =
        Store::open(config(dir.path(), &clock)).unwrap_or_else(|e| panic!("seed {seed}: reopen failed: {e}"));
    // One in eight far timers was cancelled; an answer that died with the child may have gone either way.
    let audit = audit(&store, TOPIC, &acks, |id| id.is_multiple_of(32));
    // Every timer fired: no topic counts one pending (a count recounted
    // without the relocated timers would have gone below zero first).
    let left = store.fresh_stats().expect("stats").pending_by_topic;
    store.close().expect("close");
    (audit, segments_deleted, left)
}

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let (kills, seed) = kills_and_seed(12);
    println!("retention crash test: {kills} kills, seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut failed, mut with_deletions) = (0, 0);
    for kill in 0..kills {
        let kill_after = Duration::from_millis(rng.u64(300..1_500));
        let (audit, segments_deleted, left) = run_once(seed, kill_after);
        let ok = audit.ok() && left.is_empty();
        println!(
            "kill {kill} after {kill_after:?}: {audit:?}, segments deleted before the kill: {segments_deleted}, pending by topic after: {left:?} {}",
            if ok { "ok" } else { "FAILED" }
        );
        failed += u64::from(!ok);
        with_deletions += u64::from(segments_deleted);
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
