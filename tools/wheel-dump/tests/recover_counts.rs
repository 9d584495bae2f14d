//! After a kill in the middle of a hot second, the pending count of a store
//! opened without delivery (what `delaywheel recover` prints) is exact: it
//! equals `wheel-dump audit`'s pending, and the number of timers the store
//! then delivers when reopened.
//!
//! A child (this binary again) puts a burst of timers due within one second
//! a few seconds ahead, cancelling one in sixteen, and is killed with
//! SIGKILL 130-820 ms into that second, while the wheel delivers it and the
//! child goes on putting timers due within the next 1.5 s.
//! `DELAYWHEEL_RECOVER_KILLS=n` runs more kills, `DELAYWHEEL_RECOVER_SEED=n`
//! repeats a run.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{copy_of, dump, json};
use delaywheel::{Clock, Config, Error, Message, Stats, Store, SystemClock};

const TOPIC: &str = "Burst";
const CHILD_ENV: &str = "DELAYWHEEL_RECOVER_CHILD";
const BURST: u64 = 100_000;

fn config(dir: &Path) -> Config {
    Config::new(dir).with_queues_per_topic(1).with_flush_interval(Duration::from_millis(50))
}

/// The child: puts the burst, prints the second it is due in, and goes on
/// putting timers due soon until it is killed.
fn child(dir: &str) -> ! {
    let store = Store::open(config(Path::new(dir))).expect("child opens the store");
    let second = SystemClock.now_ms() / 1000 + 4;
    for i in 0..BURST {
        let at = second * 1000 + i % 1000;
        let receipt =
            store.put(Message::new(TOPIC, i.to_le_bytes().to_vec()).deliver_at_ms(at)).expect("put");
        if i % 16 == 5 {
            store.cancel(receipt.handle().expect("a timer")).expect("cancel");
        }
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{second}").and_then(|()| out.flush()).expect("stdout");
    for i in BURST.. {
        let at = SystemClock.now_ms() + fastrand::u64(0..1_500);
        store.put(Message::new(TOPIC, i.to_le_bytes().to_vec()).deliver_at_ms(at)).expect("put");
        if i % 16 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    unreachable!()
}

/// Runs the child and kills it `into_ms` into its burst's second.
fn kill_into_burst(dir: &Path, into_ms: u64) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .env(CHILD_ENV, dir)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).expect("child's second");
    let second: u64 = line.trim().parse().unwrap_or_else(|_| panic!("child printed {line:?}"));
    let kill_at_ms = second * 1000 + into_ms;
    std::thread::sleep(Duration::from_millis(kill_at_ms.saturating_sub(SystemClock.now_ms())));
    child.kill().expect("SIGKILL");
    child.wait().expect("reap child");
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

/// What `delaywheel recover` prints as pending: opened without delivery, replayed, counted.
fn recover_pending(dir: &Path) -> u64 {
    let store = Store::open(config(dir).with_delivery(false)).expect("open without delivery");
    let pending = fresh_stats(&store).pending;
    store.close().expect("close");
    pending
}

/// Reopens with delivery and returns how many timers the store delivered before nothing was pending.
fn delivered_on_reopen(dir: &Path) -> u64 {
    let store = Store::open(config(dir)).expect("reopen");
    for _ in 0..600 {
        let stats = fresh_stats(&store);
        if stats.pending == 0 {
            store.close().expect("close");
            return stats.delivered;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timers still pending 30 s after reopening")
}

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let kills = std::env::var("DELAYWHEEL_RECOVER_KILLS").ok().and_then(|k| k.parse().ok()).unwrap_or(4);
    let seed = std::env::var("DELAYWHEEL_RECOVER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("recover counts: {kills} kills, seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut failed = 0;
    for kill in 0..kills {
        let into_ms = rng.u64(130..820);
        let dir = tempfile::tempdir().expect("temp dir");
        kill_into_burst(dir.path(), into_ms);
        let audit = json(&dump(copy_of(dir.path()).path(), &["audit", "--json"]));
        let recovered = recover_pending(copy_of(dir.path()).path());
        let delivered = delivered_on_reopen(dir.path());
        let (audited, lost) =
            (audit["pending"].as_u64().expect("pending"), audit["lost"].as_u64().expect("lost"));
        let ok = recovered == audited && recovered == delivered && lost == 0;
        println!(
            "kill {kill} {into_ms} ms into the second: recover {recovered}, audit {audited} (lost {lost}), \
             delivered on reopen {delivered} {}",
            if ok { "ok" } else { "FAILED" }
        );
        failed += usize::from(!ok);
    }
    assert_eq!(failed, 0, "{failed} of {kills} kills miscounted (seed {seed})");
}
