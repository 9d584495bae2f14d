//! Crash tests with real processes: this test binary runs again as a child
//! that prints the id of every message `put` acknowledged (and `c <id>` for
//! every cancel answered `Cancelled`; `t <id> <ms>` before it asks to
//! reschedule a timer to `ms`, `r <id>` once that is answered
//! `Rescheduled`), is killed with SIGKILL, and the store it leaves is audited.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use delaywheel::{Clock, Error, Stats, Store, SystemClock};

/// What a killed child saw acknowledged.
pub struct Acks {
    pub acked: Vec<u64>,
    pub cancelled: HashSet<u64>,
    /// Per id, the deliver times it asked to reschedule to, in order, each
    /// with whether it was answered `Rescheduled`.
    pub reschedules: HashMap<u64, Vec<(u64, bool)>>,
}

impl Acks {
    /// The deliver times a delivery of `id` may carry, if a reschedule of it
    /// was acknowledged: that of the last one acknowledged, or of one asked
    /// for after it (its answer may have died with the child). `None`: any.
    pub fn allowed_times(&self, id: u64) -> Option<Vec<u64>> {
        let asked = self.reschedules.get(&id)?;
        let last_acked = asked.iter().rposition(|&(_, acked)| acked)?;
        Some(asked[last_acked..].iter().map(|&(at, _)| at).collect())
    }
}

/// Runs this binary with `child_env` set to `dir`, kills it after `after`,
/// and returns what it printed. The output is read as it comes, so the
/// child never blocks on a full pipe.
pub fn kill_child_after(child_env: &str, dir: &Path, after: Duration) -> Acks {
    kill_child_with(child_env, dir, after, &[])
}

/// [`kill_child_after`], with more environment variables for the child.
pub fn kill_child_with(child_env: &str, dir: &Path, after: Duration, env: &[(&str, &str)]) -> Acks {
    let acks = Acks { acked: Vec::new(), cancelled: HashSet::new(), reschedules: HashMap::new() };
    kill_child_reading(child_env, dir, after, env, acks, |acks, line| {
        let words: Vec<u64> = line.split(' ').skip(1).filter_map(|w| w.parse().ok()).collect();
        match (line.split(' ').next(), words.as_slice()) {
            (Some("c"), &[id]) => drop(acks.cancelled.insert(id)),
            (Some("t"), &[id, at]) => acks.reschedules.entry(id).or_default().push((at, false)),
            (Some("r"), &[id]) => {
                if let Some(last) = acks.reschedules.get_mut(&id).and_then(|asked| asked.last_mut()) {
                    last.1 = true;
                }
            }
            _ => acks.acked.extend(line.parse::<u64>().ok()),
        }
    })
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
    /// Timers with an acknowledged reschedule.
    pub rescheduled: usize,
    /// Rescheduled (acknowledged) and delivered for another deliver time.
    pub fired_off_schedule: usize,
}

impl Audit {
    /// Every acknowledged timer fired once, never early, or was cancelled;
    /// those whose cancel answer died with the child (one in eight at most,
    /// rounded up: of 4 acknowledged, id 3 may be one) may have gone either way.
    pub fn ok(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.early == 0
            && self.fired_after_cancel == 0
            && self.fired_off_schedule == 0
            && self.delivered + self.cancelled + self.acked.div_ceil(8) >= self.acked
    }
}

/// Consumes `topic` (a message's id is its first 8 body bytes) until every
/// acknowledged id is settled and nothing is pending, or 20 s pass.
/// `maybe_cancelled(id)`: the child cancelled it, and the answer may have
/// died with it, so it may fire or not (but not twice).
pub fn audit(store: &Store, topic: &str, acks: &Acks, maybe_cancelled: impl Fn(u64) -> bool) -> Audit {
    let mut consumer = store.consumer_in_group("audit", topic, 0).expect("consumer");
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let (mut early, mut off_schedule) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let batch = consumer.poll(4096, Duration::from_millis(200)).expect("poll");
        for m in &batch {
            let id = u64::from_le_bytes(m.body()[..8].try_into().expect("8-byte body"));
            *seen.entry(id).or_default() += 1;
            let due = m.deliver_at_ms().expect("a timed message");
            if m.delivered_at_ms() < due {
                early += 1;
            }
            if acks.allowed_times(id).is_some_and(|allowed| !allowed.contains(&due)) {
                off_schedule += 1;
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
        rescheduled: acks.reschedules.values().filter(|asked| asked.iter().any(|&(_, acked)| acked)).count(),
        fired_off_schedule: off_schedule,
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

/// `fresh_stats`, waiting out the replay of a reopened store.
pub fn fresh_stats(store: &Store) -> Stats {
    for _ in 0..600 {
        match store.fresh_stats() {
            Ok(stats) => return stats,
            Err(Error::Busy { .. }) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("fresh_stats: {e}"),
        }
    }
    panic!("the replay did not catch up in 30 s")
}

/// Runs this binary with `child_env` set to `dir` (and `env`), kills it
/// after `after`, and hands `line` each line it printed, as they come, so
/// the child never blocks on a full pipe. Returns what `line` made of them.
pub fn kill_child_reading<T: Send + 'static>(
    child_env: &str,
    dir: &Path,
    after: Duration,
    env: &[(&str, &str)],
    mut seen: T,
    line: impl Fn(&mut T, &str) + Send + 'static,
) -> T {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .env(child_env, dir)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout).lines().map_while(Result::ok).for_each(|l| line(&mut seen, &l));
        seen
    });
    std::thread::sleep(after);
    child.kill().expect("SIGKILL");
    child.wait().expect("reap child");
    reader.join().expect("reader thread")
}
