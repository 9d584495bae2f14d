//! Crash test with real processes: a child puts timed messages under load and
//! is killed with SIGKILL at a random moment; the store is then reopened,
//! drained and audited. Every message the child saw acknowledged must be
//! delivered exactly once, none early, whatever the moment of the kill; and
//! the pending count of a copy opened without delivery (what `delaywheel
//! recover` prints) must be the number of timers the reopened store delivers,
//! and the topic's count in `Stats::pending_by_topic` must be that number too
//! (and zero once all are delivered).
//!
//! The child puts one message at a time in async flush mode; then, in sync
//! flush mode, in batches (`put_batch`) and pipelined (`submit` and
//! `submit_batch`, a message acknowledged once its ticket says it is on disk); then one at a time in
//! async mode again, rescheduling one in eight of its timers (one in
//! sixteen twice) to anywhere in the next 1.5 s, earlier or later: a
//! delivery of one must carry the deliver time of its last acknowledged
//! reschedule (or of one asked for after it, whose answer died with the
//! child), and fire once.
//!
//! Last, with dedup keys (`d<id>`), one at a time or in batches of up to
//! eight, each put followed by a retry of an earlier acknowledged id: every
//! retry, before the kill and of every acknowledged id after it, must
//! answer as a duplicate, and each id still fires once.
//!
//! `cargo test --test crash` runs 20 kills of the first and 6 of each other
//! mode; `DELAYWHEEL_CRASH_KILLS=50` runs more of the first,
//! `DELAYWHEEL_CRASH_SEED=n` repeats a run.

mod common;

use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::crash_copy;
use common::kill::{Acks, Audit, audit, fresh_stats, kill_child_reading, kill_child_with, kills_and_seed};
use delaywheel::{
    CancelOutcome, Clock, Config, FlushMode, Message, PutTicket, Receipt, RescheduleOutcome, Store,
    SystemClock,
};

const TOPIC: &str = "CrashTopic";
const CHILD_ENV: &str = "DELAYWHEEL_CRASH_CHILD";
const MODE_ENV: &str = "DELAYWHEEL_CRASH_MODE";

/// How the child puts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    OneAtATime,
    SyncBatches,
    SyncPipelined,
    Reschedules,
    Dedup,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::OneAtATime => "one",
            Self::SyncBatches => "batches",
            Self::SyncPipelined => "pipelined",
            Self::Reschedules => "reschedules",
            Self::Dedup => "dedup",
        }
    }

    fn from_env() -> Self {
        match std::env::var(MODE_ENV).as_deref() {
            Ok("batches") => Self::SyncBatches,
            Ok("pipelined") => Self::SyncPipelined,
            Ok("reschedules") => Self::Reschedules,
            Ok("dedup") => Self::Dedup,
            _ => Self::OneAtATime,
        }
    }

    fn config(self, dir: &Path) -> Config {
        match self {
            Self::OneAtATime | Self::Reschedules | Self::Dedup => config(dir),
            Self::SyncBatches | Self::SyncPipelined => config(dir).with_flush_mode(FlushMode::Sync),
        }
    }
}

fn config(dir: &Path) -> Config {
    Config::new(dir)
        .with_segment_size(1 << 20)
        .with_queue_file_entries(4096)
        .with_timer_log_file_entries(1 << 14)
        .with_queues_per_topic(1)
        .with_flush_interval(Duration::from_millis(50))
}

/// The child: puts timed messages due 0-1.5 s ahead, forever, as `mode`
/// says, and prints the id of each one acknowledged; cancels one in eight
/// once acknowledged and prints `c <id>` when the answer is `Cancelled`.
fn child(dir: &str, mode: Mode) -> ! {
    if mode == Mode::Dedup {
        dedup_child(dir);
    }
    let store = Store::open(mode.config(Path::new(dir))).expect("child opens the store");
    let mut rng = fastrand::Rng::new();
    let mut resched_rng = fastrand::Rng::new();
    let mut out = std::io::stdout().lock();
    let mut acknowledged = |id: u64, receipt: Receipt| {
        writeln!(out, "{id}").expect("stdout");
        let handle = receipt.handle().expect("a timer");
        if id % 8 == 3 && store.cancel(handle).expect("cancel") == CancelOutcome::Cancelled {
            writeln!(out, "c {id}").expect("stdout");
        }
        let times = match id % 16 {
            5 if mode == Mode::Reschedules => 2,
            13 if mode == Mode::Reschedules => 1,
            _ => 0,
        };
        for _ in 0..times {
            let at = SystemClock.now_ms() + resched_rng.u64(0..1_500);
            writeln!(out, "t {id} {at}").expect("stdout");
            if store.reschedule(handle, at).expect("reschedule") == RescheduleOutcome::Rescheduled {
                writeln!(out, "r {id}").expect("stdout");
            }
        }
        if id.is_multiple_of(64) {
            out.flush().expect("stdout");
        }
    };
    let message = |id: u64, rng: &mut fastrand::Rng| {
        let at = SystemClock.now_ms() + rng.u64(0..1_500);
        Message::new(TOPIC, id.to_le_bytes().to_vec()).deliver_at_ms(at)
    };
    let mut tickets: VecDeque<(u64, PutTicket)> = VecDeque::new();
    let mut id = 0u64;
    loop {
        match mode {
            Mode::OneAtATime | Mode::Reschedules => {
                let receipt = store.put(message(id, &mut rng)).expect("put");
                acknowledged(id, receipt);
                id += 1;
            }
            Mode::SyncBatches => {
                let ids = id..id + rng.u64(1..64);
                let receipts = store.put_batch(ids.clone().map(|i| message(i, &mut rng))).expect("put_batch");
                ids.clone().zip(receipts).for_each(|(i, receipt)| acknowledged(i, receipt));
                id = ids.end;
            }
            Mode::SyncPipelined if rng.bool() => {
                tickets.push_back((id, store.submit(message(id, &mut rng)).expect("submit")));
                id += 1;
            }
            Mode::Dedup => unreachable!("dedup_child"),
            Mode::SyncPipelined => {
                let ids = id..id + rng.u64(1..16);
                let batch =
                    store.submit_batch(ids.clone().map(|i| message(i, &mut rng))).expect("submit_batch");
                tickets.extend(ids.clone().zip(batch));
                id = ids.end;
            }
        }
        if mode == Mode::SyncPipelined {
            while let Some((_, oldest)) = tickets.front() {
                if tickets.len() < 256 && !oldest.is_durable().expect("ticket") {
                    break;
                }
                let (i, ticket) = tickets.pop_front().expect("front");
                acknowledged(i, ticket.wait(Duration::from_secs(10)).expect("durable"));
            }
        }
        if id.is_multiple_of(512) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A message of id `id` with dedup key `d<id>`, due 0-1.5 s ahead.
fn keyed_message(id: u64, rng: &mut fastrand::Rng) -> Message {
    let at = SystemClock.now_ms() + rng.u64(0..1_500);
    Message::new(TOPIC, id.to_le_bytes().to_vec()).dedup_key(format!("d{id}")).deliver_at_ms(at)
}

/// The child of [`Mode::Dedup`]: puts keyed messages one at a time or in
/// batches (each batch also retrying an earlier id), prints each new id
/// acknowledged, then retries an earlier acknowledged id and prints `x <id>`
/// if that retry was not answered as a duplicate.
fn dedup_child(dir: &str) -> ! {
    let store = Store::open(config(Path::new(dir))).expect("child opens the store");
    let mut rng = fastrand::Rng::new();
    let mut out = std::io::stdout().lock();
    let mut id = 0u64;
    loop {
        let retried = (id > 0).then(|| id - 1 - rng.u64(0..id.min(64)));
        let ids: Vec<u64> = (id..id + rng.u64(1..8)).collect();
        let receipts = if ids.len() == 1 {
            vec![store.put(keyed_message(id, &mut rng)).expect("put")]
        } else {
            let batch: Vec<Message> =
                ids.iter().chain(&retried).map(|&i| keyed_message(i, &mut rng)).collect();
            store.put_batch(batch).expect("put_batch")
        };
        for (&i, receipt) in ids.iter().zip(&receipts) {
            writeln!(out, "{i}").expect("stdout");
            if receipt.is_duplicate() {
                writeln!(out, "x {i}").expect("stdout");
            }
        }
        if let (Some(i), Some(receipt)) = (retried, receipts.get(ids.len()))
            && !receipt.is_duplicate()
        {
            writeln!(out, "x {i}").expect("stdout");
        }
        if let Some(i) = retried
            && !store.put(keyed_message(i, &mut rng)).expect("retry").is_duplicate()
        {
            writeln!(out, "x {i}").expect("stdout");
        }
        id = ids[ids.len() - 1] + 1;
        out.flush().expect("stdout");
        if id.is_multiple_of(512) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// One kill of [`Mode::Dedup`]: what it left, audited after every
/// acknowledged id was put again on the reopened store, and how many puts
/// (before or after the kill) were answered wrongly: a retry written again,
/// or a new id answered as a duplicate.
fn run_dedup_once(seed: u64, kill_after: Duration) -> (Audit, u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let acks = Acks { acked: Vec::new(), cancelled: Default::default(), reschedules: Default::default() };
    let env = [(MODE_ENV, Mode::Dedup.name())];
    let (acks, mut wrong) =
        kill_child_reading(CHILD_ENV, dir.path(), kill_after, &env, (acks, 0u64), |(acks, wrong), line| {
            match line.strip_prefix("x ") {
                Some(_) => *wrong += 1,
                None => acks.acked.extend(line.parse::<u64>().ok()),
            }
        });
    let store = Store::open(config(dir.path())).unwrap_or_else(|e| panic!("seed {seed}: reopen failed: {e}"));
    let mut rng = fastrand::Rng::with_seed(seed);
    // Newest first: the records the replay has not reached yet come first.
    for &id in acks.acked.iter().rev() {
        let retry = store.put(keyed_message(id, &mut rng)).expect("retry after the kill");
        wrong += u64::from(!retry.is_duplicate());
    }
    let audit = audit(&store, TOPIC, &acks, |_| false);
    store.close().expect("close");
    (audit, wrong)
}

/// What `delaywheel recover` would print as pending for a copy of `dir`,
/// and whether the topic's count in `Stats::pending_by_topic` says the same.
fn recover_pending(dir: &Path) -> (u64, bool) {
    let copy = tempfile::tempdir().expect("temp dir");
    crash_copy(dir, copy.path());
    let store = Store::open(config(copy.path()).with_delivery(false)).expect("open without delivery");
    let stats = fresh_stats(&store);
    store.close().expect("close");
    let topic_count = stats.pending_by_topic.iter().find(|(t, _)| t == TOPIC).map_or(0, |(_, n)| *n);
    if topic_count != stats.pending {
        println!("the topic counts {topic_count} pending, the wheel {}", stats.pending);
    }
    (stats.pending, topic_count == stats.pending)
}

/// What one kill left, and the pending count recover gives against the
/// timers the reopened store delivered.
/// Also whether the per-topic counts agreed with the wheel (before the
/// reopen, and with nothing left pending after it).
fn run_once(seed: u64, mode: Mode, kill_after: Duration) -> (Audit, u64, u64, bool) {
    let dir = tempfile::tempdir().expect("temp dir");
    let acks = kill_child_with(CHILD_ENV, dir.path(), kill_after, &[(MODE_ENV, mode.name())]);
    let (recovered, topic_agreed) = recover_pending(dir.path());
    let store = Store::open(config(dir.path())).unwrap_or_else(|e| panic!("seed {seed}: reopen failed: {e}"));
    // One in eight was cancelled; an answer that died with the child may have gone either way.
    let audit = audit(&store, TOPIC, &acks, |id| id % 8 == 3);
    let stats = fresh_stats(&store);
    store.close().expect("close");
    let drained = stats.pending_by_topic.is_empty() && stats.pending_other_topics == 0;
    if !drained {
        println!("after the drain the topics still count {:?}", stats.pending_by_topic);
    }
    (audit, recovered, stats.delivered, topic_agreed && drained)
}

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir, Mode::from_env());
    }
    let (kills, seed) = kills_and_seed(20);
    let runs = [
        (Mode::OneAtATime, kills),
        (Mode::SyncBatches, 6),
        (Mode::SyncPipelined, 6),
        (Mode::Reschedules, 6),
        (Mode::Dedup, 6),
    ];
    println!("crash test: {runs:?}, seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut failed, mut total) = (0, 0);
    for (mode, kills) in runs {
        for kill in 0..kills {
            let kill_after = Duration::from_millis(rng.u64(150..1_200));
            if mode == Mode::Dedup {
                let (audit, wrong) = run_dedup_once(seed, kill_after);
                let ok = audit.ok() && wrong == 0;
                println!(
                    "dedup kill {kill} after {kill_after:?}: {audit:?}, wrong answers {wrong} {}",
                    if ok { "ok" } else { "FAILED" }
                );
                failed += u64::from(!ok);
                total += 1;
                continue;
            }
            let (audit, recovered, delivered, topics_agree) = run_once(seed, mode, kill_after);
            let ok = audit.ok() && recovered == delivered && topics_agree;
            println!(
                "{} kill {kill} after {kill_after:?}: {audit:?}, recover's pending {recovered}, delivered on reopen {delivered} {}",
                mode.name(),
                if ok { "ok" } else { "FAILED" }
            );
            failed += u64::from(!ok);
            total += 1;
        }
    }
    println!("{} passed, {failed} failed", total - failed);
    if failed > 0 {
        std::process::exit(1);
    }
}
