//! Crash test of recurring schedules with real processes: a child creates
//! schedules under load (every 50-150 ms, 4-12 occurrences, starting up to
//! 200 ms ahead, catching up every missed occurrence), cancels one in eight
//! once created, replaces another one in eight by an update some
//! milliseconds later, and is killed with SIGKILL at a random moment; the
//! store is then reopened and drained. Every occurrence of every
//! acknowledged schedule is delivered exactly once, at its own instant,
//! never early, numbered, naming the next; a cancelled or replaced one
//! delivers a prefix of its occurrences, and a replaced one all of them
//! unless its update's schedule delivered (never both cut short, never
//! neither); one whose creation or update raced the kill all of them or
//! none; and nothing is left pending in the topic's count.
//!
//! `cargo test --test crash_schedules` runs 6 kills; `DELAYWHEEL_CRASH_KILLS`
//! runs more, `DELAYWHEEL_CRASH_SEED=n` repeats a run.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::kill::{fresh_stats, kill_child_reading, kills_and_seed};
use delaywheel::{
    CancelOutcome, Clock, Config, Handle, Message, MissedRuns, Recurrence, Schedule, Store, SystemClock,
    UpdateOutcome,
};

const TOPIC: &str = "Recurring";
const CHILD_ENV: &str = "DELAYWHEEL_CRASH_SCHEDULES_CHILD";
/// Added to a schedule's id for the schedule its update makes.
const UPDATED: u64 = 1 << 40;

/// One in eight schedules is cancelled once created.
fn cancelled(id: u64) -> bool {
    id % 8 == 3
}

/// Replaced schedules waiting for their update, at most.
const REPLACED_AFTER: usize = 128;

/// One in eight is replaced by an update (`id + UPDATED`) about a thousand schedules later.
fn replaced(id: u64) -> bool {
    id < UPDATED && id % 8 == 5
}

fn config(dir: &Path) -> Config {
    Config::new(dir)
        .with_segment_size(1 << 20)
        .with_queue_file_entries(4096)
        .with_timer_log_file_entries(1 << 14)
        .with_queues_per_topic(1)
        .with_flush_interval(Duration::from_millis(50))
}

/// One schedule the child asked for.
#[derive(Debug, Clone, Copy)]
struct Asked {
    start: u64,
    period: u64,
    limit: u64,
    /// The first occurrence its receipt named, once acknowledged: the one at
    /// or after both the start and the creation (the child reads the clock
    /// for the start a moment before the store reads it).
    first: Option<u64>,
}

impl Asked {
    /// When occurrence `number` is due, the schedule's first being `first`.
    fn at(&self, first: u64, number: u64) -> u64 {
        first + (number - 1) * self.period
    }

    /// The first occurrence, as acknowledged; for one the kill left
    /// unacknowledged, the one occurrence `number` at `due` implies, if it
    /// falls on the start's grid at or after it.
    fn first(&self, number: u64, due: u64) -> Option<u64> {
        let implied = due
            .checked_sub((number - 1) * self.period)
            .filter(|&first| first >= self.start && (first - self.start).is_multiple_of(self.period));
        self.first.or(implied)
    }
}

/// A schedule of `asked`, its body `id`.
fn schedule_of(id: u64, asked: &Asked) -> Schedule {
    Schedule::new(
        Message::new(TOPIC, id.to_le_bytes().to_vec()),
        Recurrence::every(Duration::from_millis(asked.period)),
    )
    .start_at_ms(asked.start)
    .limit(asked.limit)
    .missed_runs(MissedRuns::FireAll { window: Duration::from_secs(3_600) })
}

/// The child: creates schedules forever; prints `s <id> <start> <period>
/// <limit>` before each, `<id> <first occurrence>` once acknowledged, and
/// `c <id>` once a cancel of it (one in eight) is answered `Cancelled`. An
/// update is announced and acknowledged as a creation of `id + UPDATED`.
fn child(dir: &str) -> ! {
    let store = Store::open(config(Path::new(dir))).expect("child opens the store");
    let mut rng = fastrand::Rng::new();
    let mut out = std::io::stdout().lock();
    // Replaced about a thousand schedules later (a few hundred ms): often mid-series.
    let mut to_replace: std::collections::VecDeque<(u64, Handle)> = std::collections::VecDeque::new();
    let ask = |rng: &mut fastrand::Rng| Asked {
        start: SystemClock.now_ms() + rng.u64(0..200),
        period: rng.u64(50..150),
        limit: rng.u64(4..13),
        first: None,
    };
    for id in 0u64.. {
        let asked = ask(&mut rng);
        writeln!(out, "s {id} {} {} {}", asked.start, asked.period, asked.limit).expect("stdout");
        let receipt = store.schedule(schedule_of(id, &asked)).expect("schedule");
        writeln!(out, "{id} {}", receipt.first_occurrence_ms()).expect("stdout");
        let handle = receipt.handle();
        if cancelled(id) && store.cancel_schedule(handle).expect("cancel") == CancelOutcome::Cancelled {
            writeln!(out, "c {id}").expect("stdout");
        }
        if replaced(id) {
            to_replace.push_back((id, handle));
            if to_replace.len() > REPLACED_AFTER
                && let Some((old, old_handle)) = to_replace.pop_front()
            {
                let asked = ask(&mut rng);
                let new = old + UPDATED;
                writeln!(out, "s {new} {} {} {}", asked.start, asked.period, asked.limit).expect("stdout");
                if let UpdateOutcome::Updated(receipt) =
                    store.update_schedule(old_handle, schedule_of(new, &asked)).expect("update")
                {
                    writeln!(out, "{new} {}", receipt.first_occurrence_ms()).expect("stdout");
                }
            }
        }
        if id.is_multiple_of(16) {
            out.flush().expect("stdout");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    unreachable!("the loop never ends")
}

/// What a killed child asked for and saw acknowledged.
#[derive(Default)]
struct Acks {
    asked: HashMap<u64, Asked>,
    acked: HashSet<u64>,
    cancelled: HashSet<u64>,
}

fn kill_child(dir: &Path, after: Duration) -> Acks {
    kill_child_reading(CHILD_ENV, dir, after, &[], Acks::default(), |acks, line| {
        let words: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
        match (line.split(' ').next(), words.as_slice()) {
            (Some("s"), &[id, start, period, limit]) => {
                acks.asked.insert(id, Asked { start, period, limit, first: None });
            }
            (Some("c"), &[id]) => drop(acks.cancelled.insert(id)),
            (_, &[id, first]) => {
                acks.acked.insert(id);
                if let Some(asked) = acks.asked.get_mut(&id) {
                    asked.first = Some(first);
                }
            }
            _ => {} // a line cut by the kill
        }
    })
}

/// What one kill left, once drained.
#[derive(Debug, Default)]
struct Audit {
    acked: usize,
    occurrences: usize,
    /// Occurrences of an acknowledged schedule (not cancelled) never delivered.
    lost: usize,
    duplicated: usize,
    early: usize,
    /// Delivered at another instant than the schedule's, or naming another next.
    off_schedule: usize,
    /// A cancelled or unacknowledged schedule's occurrences not a prefix of
    /// its own (unacknowledged: all or none).
    broken_series: usize,
}

impl Audit {
    fn ok(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.early == 0
            && self.off_schedule == 0
            && self.broken_series == 0
    }
}

/// Drains the topic until every acknowledged schedule delivered all its
/// occurrences and nothing is pending, or 30 s pass, and judges what came.
fn audit(store: &Store, acks: &Acks) -> Audit {
    let mut consumer = store.consumer_in_group("audit", TOPIC, 0).expect("consumer");
    let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut audit = Audit { acked: acks.acked.len(), ..Audit::default() };
    let complete = |seen: &HashMap<u64, Vec<u64>>| {
        acks.acked
            .iter()
            .filter(|&&id| !cancelled(id) && !replaced(id))
            .all(|id| seen.get(id).is_some_and(|numbers| numbers.len() as u64 >= acks.asked[id].limit))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let batch = consumer.poll(4096, Duration::from_millis(200)).expect("poll");
        for m in &batch {
            let id = u64::from_le_bytes(m.body()[..8].try_into().expect("8-byte body"));
            let occurrence = m.occurrence().expect("an occurrence");
            let (due, number) = (m.deliver_at_ms().expect("timed"), occurrence.number);
            audit.occurrences += 1;
            audit.early += usize::from(m.delivered_at_ms() < due);
            let asked = acks.asked[&id];
            let first = asked.first(number, due);
            let next = first.and_then(|first| (number < asked.limit).then(|| asked.at(first, number + 1)));
            if first.is_none_or(|first| due != asked.at(first, number)) || occurrence.next_at_ms != next {
                audit.off_schedule += 1;
                println!(
                    "schedule {id} ({asked:?}): occurrence {number} due {due}, next {:?} (want {next:?}), delivered at {}",
                    occurrence.next_at_ms,
                    m.delivered_at_ms()
                );
            }
            seen.entry(id).or_default().push(number);
        }
        if batch.is_empty() && complete(&seen) && store.stats().pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            println!("not drained in 30 s: {} pending", store.stats().pending);
            break;
        }
    }
    for (id, numbers) in &mut seen {
        let delivered = numbers.len();
        numbers.sort_unstable();
        numbers.dedup();
        audit.duplicated += delivered - numbers.len();
        let prefix = numbers.iter().copied().eq(1..=numbers.len() as u64);
        let whole = numbers.len() as u64 == acks.asked[id].limit;
        // Asked to cancel, or replaced (the answer may have died with the child): any prefix.
        let cut = cancelled(*id) || replaced(*id);
        if !prefix || (!cut && !acks.acked.contains(id) && !whole) {
            audit.broken_series += 1;
        }
    }
    // A replaced schedule ends early only if its update's schedule delivers,
    // and then none of its occurrences after the update (asked for just
    // before the new schedule's start: 100 ms of margin) was delivered.
    for &id in acks.acked.iter().filter(|&&id| replaced(id)) {
        let numbers = seen.get(&id).cloned().unwrap_or_default();
        let successor = seen.get(&(id + UPDATED)).is_some_and(|numbers| !numbers.is_empty());
        if (numbers.len() as u64) < acks.asked[&id].limit
            && !successor
            && !acks.acked.contains(&(id + UPDATED))
        {
            println!("schedule {id} delivered {} and its update nothing", numbers.len());
            audit.broken_series += 1;
        }
        let (old, new) = (acks.asked[&id], acks.asked.get(&(id + UPDATED)));
        let last_due = numbers.last().and_then(|&n| old.first.map(|first| old.at(first, n)));
        if let (true, Some(new), Some(due)) = (successor, new, last_due)
            && due > new.start + 100
        {
            println!(
                "schedule {id} delivered an occurrence due {due}, after its update (start {})",
                new.start
            );
            audit.broken_series += 1;
        }
    }
    for id in acks.acked.iter().filter(|&&id| !cancelled(id) && !replaced(id)) {
        let delivered = seen.get(id).map_or(0, Vec::len) as u64;
        audit.lost += acks.asked[id].limit.saturating_sub(delivered) as usize;
    }
    audit
}

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let (kills, seed) = kills_and_seed(6);
    println!("crash test of schedules: {kills} kills, seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut failed = 0;
    for kill in 0..kills {
        let kill_after = Duration::from_millis(rng.u64(300..1_500));
        let dir = tempfile::tempdir().expect("temp dir");
        let acks = kill_child(dir.path(), kill_after);
        let store =
            Store::open(config(dir.path())).unwrap_or_else(|e| panic!("seed {seed}: reopen failed: {e}"));
        let audit = audit(&store, &acks);
        let stats = fresh_stats(&store);
        store.close().expect("close");
        let drained = stats.pending_by_topic.is_empty() && stats.pending == 0;
        let ok = audit.ok() && drained && audit.acked > 0;
        println!(
            "kill {kill} after {kill_after:?}: {audit:?}, {} cancels answered, {} updates answered, pending by topic after: {:?} {}",
            acks.cancelled.len(),
            acks.acked.iter().filter(|&&id| id >= UPDATED).count(),
            stats.pending_by_topic,
            if ok { "ok" } else { "FAILED" }
        );
        failed += u64::from(!ok);
    }
    println!("{} passed, {failed} failed", kills - failed);
    if failed > 0 {
        std::process::exit(1);
    }
}
