//! Crash tests with real processes: this test binary runs again as a child
//! that prints the id of every message `put` acknowledged (and `c <id>` for
//! every cancel answered `Cancelled`), is killed with SIGKILL, and the store
//! it leaves is audited.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use delaywheel::{Clock, Store, SystemClock};

/// What a killed child saw acknowledged.
pub struct Acks {
    pub acked: Vec<u64>,
    pub cancelled: HashSet<u64>,
}

/// Runs this binary with `child_env` set to `dir`, kills it after `after`,
/// and returns what it printed. The output is read as it comes, so the
/// child never blocks on a full pipe.
pub fn kill_child_after(child_env: &str, dir: &Path, after: Duration) -> Acks {
    kill_child_with(child_env, dir, after, &[])
}

/// [`kill_child_after`], with more environment variables for the child.
pub fn kill_child_with(child_env: &str, dir: &Path, after: Duration, env: &[(&str, &str)]) -> Acks {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .env(child_env, dir)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut acks = Acks { acked: Vec::new(), cancelled: HashSet::new() };
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            match line.strip_prefix("c ") {
                Some(id) => acks.cancelled.extend(id.parse::<u64>().ok()),
                None => acks.acked.extend(line.parse::<u64>().ok()),
            }
        }
        acks
    });
    std::thread::sleep(after);
    child.kill().expect("SIGKILL");
    child.wait().expect("reap child");
    reader.join().expect("reader thread")
}

/// What one kill left behind, after recovery and delivering.
#[derive(Debug, Default)]
pub struct Audit {
    pub acked: usize,
    pub cancelled: usize,
    pub delivered: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub early: usize,
    pub fired_after_cancel: usize,
}

impl Audit {
    /// Every acknowledged timer fired once, never early, or was cancelled;
    /// those whose cancel answer died with the child (one in eight at most)
    /// may have gone either way.
    pub fn ok(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.early == 0
            && self.fired_after_cancel == 0
            && self.delivered + self.cancelled >= self.acked - self.acked / 8
    }
}

/// Consumes `topic` (a message's id is its first 8 body bytes) until every
/// acknowledged id is settled and nothing is pending, or 20 s pass.
/// `maybe_cancelled(id)`: the child cancelled it, and the answer may have
/// died with it, so it may fire or not (but not twice).
pub fn audit(store: &Store, topic: &str, acks: &Acks, maybe_cancelled: impl Fn(u64) -> bool) -> Audit {
    let mut consumer = store.consumer_in_group("audit", topic, 0).expect("consumer");
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
        let settled = |id: &u64| seen.contains_key(id) || acks.cancelled.contains(id) || maybe_cancelled(*id);
        if batch.is_empty() && acks.acked.iter().all(settled) && store.stats().pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let unsettled =
        |id: &&u64| !seen.contains_key(id) && !acks.cancelled.contains(id) && !maybe_cancelled(**id);
    Audit {
        acked: acks.acked.len(),
        cancelled: acks.cancelled.len(),
        delivered: seen.len(),
        lost: acks.acked.iter().filter(unsettled).count(),
        duplicated: seen.values().map(|&n| n.saturating_sub(1)).sum(),
        early,
        fired_after_cancel: acks.cancelled.iter().filter(|id| seen.contains_key(id)).count(),
    }
}

/// How many kills (`DELAYWHEEL_CRASH_KILLS`, default `default_kills`) and
/// the seed (`DELAYWHEEL_CRASH_SEED`, default the clock) of a run.
pub fn kills_and_seed(default_kills: u64) -> (u64, u64) {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    let kills = env("DELAYWHEEL_CRASH_KILLS").unwrap_or(default_kills);
    let seed = env("DELAYWHEEL_CRASH_SEED").unwrap_or_else(|| SystemClock.now_ms());
    (kills, seed)
}
