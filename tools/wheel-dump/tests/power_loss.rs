//! Power loss, simulated. A workload runs against a store while the crash
//! recorder (the library's `crash-recorder` feature, see `src/recorder.rs`)
//! watches every durability point; at a chosen one it freezes what the disk
//! holds and what the page cache holds. Each image of a power loss there
//! (the synced state plus a random subset of the pages written since) is
//! then opened, drained and audited:
//!
//! * every put acknowledged before the crash is delivered exactly once, or
//!   never if a cancel acknowledged before the crash cancelled it (in async
//!   flush mode: every put whose record the last completed flush covered);
//!   a timer rescheduled (acknowledged before the crash, in sync mode) is
//!   delivered for its new time, otherwise for its old or its new one;
//! * nothing is delivered twice, nothing early;
//! * every put has a dedup key (`d<id>`): after the open, each put is made
//!   again, and one acknowledged before the crash (as above) must answer
//!   as a duplicate (so it is not delivered twice); one that was not may
//!   be written anew (once: its first record did not survive);
//! * `wheel-dump verify` finds nothing wrong in the image as the power loss
//!   left it (what the open cuts or rebuilds is the normal recovery), and
//!   `verify` and `audit` find nothing wrong after the open;
//! * a consumer group's position whose `sync_offsets` returned before the
//!   crash holds, and no position past what was committed appears;
//! * every occurrence of a recurring schedule acknowledged before the crash
//!   is delivered once, in order, at its instant (a cancelled one: a
//!   prefix of them; one not acknowledged: all or none), and the audit
//!   finds no occurrence twice, early or missing.
//!
//! `cargo test --test power_loss` checks a bounded, seeded sample;
//! `DELAYWHEEL_POWER_LOSS_CRASHES=N` checks N crash points per flush mode
//! (each with `DELAYWHEEL_POWER_LOSS_IMAGES`, default 2, images), and
//! `DELAYWHEEL_POWER_LOSS_SEED=S` repeats a run.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{T0, dump, json, stdout};
use delaywheel::internals::record::{MESSAGE_FIXED_LEN, dedup_property_len};
use delaywheel::recorder::{Frozen, Recording};
use delaywheel::{
    CancelOutcome, Clock, Config, FlushMode, ManualClock, Message, MissedRuns, Recurrence, RescheduleOutcome,
    Schedule, Store, UpdateOutcome,
};

const TOPIC: &str = "Orders";
/// Probability that a change not yet durable reached the disk anyway.
const WRITEBACK: f64 = 0.5;

fn config(dir: &Path, clock: &ManualClock, mode: FlushMode) -> Config {
    Config::new(dir)
        .with_segment_size(64 * 1024)
        .with_queue_file_entries(256)
        .with_timer_log_file_entries(512)
        .with_max_body_bytes(1024)
        .with_queues_per_topic(1)
        .with_flush_mode(mode)
        .with_flush_interval(Duration::from_millis(5))
        .with_clock(clock.clone())
}

/// What the workload saw acknowledged.
#[derive(Debug, Clone, Copy)]
struct Put {
    deliver_at_ms: Option<u64>,
    /// The record's end in the commit log.
    end: u64,
    /// Durability points seen when `put` had returned: below the crash point,
    /// the put was acknowledged before the crash.
    acked_by: u64,
    /// Same for a cancel answered `Cancelled`, if one was.
    cancelled_by: Option<u64>,
    /// The new deliver time of a reschedule answered `Rescheduled`, and the
    /// durability points seen when it was.
    rescheduled: Option<(u64, u64)>,
}

fn workload(dir: &Path, mode: FlushMode, crash_at: u64, seed: u64) -> (Vec<Put>, Arc<Frozen>, u64) {
    let recording = Recording::arm(dir, crash_at);
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir, &clock, mode)).unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut puts: Vec<Put> = Vec::new();
    let frozen = loop {
        if let Some(frozen) = recording.frozen() {
            break frozen;
        }
        assert!(puts.len() < 200_000, "the crash point {crash_at} was never reached");
        let id = puts.len() as u64;
        let now = clock.now_ms();
        let deliver_at_ms = match rng.u64(..10) {
            0 => None,
            1 => Some(now + 3 * 86_400_000 + rng.u64(..86_400_000)),
            2 => Some(now + 5 * 365 * 86_400_000 + rng.u64(..86_400_000)),
            _ => Some(now + rng.u64(..3_000)),
        };
        let Ok(receipt) = store.put(keyed(id, deliver_at_ms)) else { continue };
        assert!(!receipt.is_duplicate(), "every put has a key of its own");
        let key_len = dedup_property_len(&format!("d{id}"));
        let end = receipt.offset() + (MESSAGE_FIXED_LEN + TOPIC.len() + key_len + 8) as u64;
        puts.push(Put {
            deliver_at_ms,
            end,
            acked_by: recording.events(),
            cancelled_by: None,
            rescheduled: None,
        });
        let handle = receipt.handle();
        match rng.u64(..12) {
            0 | 1 if handle.is_some_and(|h| store.cancel(h).is_ok_and(|o| o == CancelOutcome::Cancelled)) => {
                puts.last_mut().expect("just pushed").cancelled_by = Some(recording.events());
            }
            2 | 3 => {
                // Earlier or later, near or years away.
                let to = if rng.bool() { now + rng.u64(..3_000) } else { now + 5 * 365 * 86_400_000 };
                if let Some(h) = handle
                    && store.reschedule(h, to).is_ok_and(|o| o == RescheduleOutcome::Rescheduled)
                {
                    puts.last_mut().expect("just pushed").rescheduled = Some((to, recording.events()));
                }
            }
            _ => {}
        }
        if rng.u64(..4) == 0 {
            clock.advance_ms(rng.u64(..400));
            std::thread::sleep(Duration::from_micros(rng.u64(..2_000)));
        }
    };
    let crashed_at_ms = clock.now_ms();
    recording.disarm();
    drop(store);
    (puts, frozen, crashed_at_ms)
}

/// The message of put `id`: its id as its body, its dedup key `d<id>`.
fn keyed(id: u64, deliver_at_ms: Option<u64>) -> Message {
    let message = Message::new(TOPIC, id.to_le_bytes().to_vec()).dedup_key(format!("d{id}"));
    match deliver_at_ms {
        Some(at) => message.deliver_at_ms(at),
        None => message,
    }
}

/// Whether `put` was acknowledged before the crash (so it had to survive it).
fn acked(put: &Put, frozen: &Frozen, mode: FlushMode) -> bool {
    put.acked_by < frozen.event && (mode == FlushMode::Sync || put.end <= frozen.log_durable_end)
}

/// Whether `put` had to survive the crash, and how often it may be delivered.
fn expected(put: &Put, frozen: &Frozen, mode: FlushMode) -> (usize, usize) {
    let acked = acked(put, frozen, mode);
    let cancelled = put.cancelled_by.is_some_and(|by| by < frozen.event) && mode == FlushMode::Sync;
    match (acked, cancelled, put.cancelled_by.is_some()) {
        (true, true, _) => (0, 0),
        (true, false, false) => (1, 1),
        // A cancel not known to have reached the disk may or may not hold.
        (true, false, true) => (0, 1),
        (false, _, _) => (0, 1),
    }
}

/// Opens the image, delivers everything, and checks what came out.
fn check_image(image: &Path, puts: &[Put], frozen: &Frozen, mode: FlushMode, crashed_at_ms: u64) {
    // The image as the power loss left it: what the open cuts back or
    // rebuilds is the normal recovery, not a problem.
    let raw = dump(image, &["verify"]);
    assert_eq!(raw.status.code(), Some(0), "{} before the open: {}", image.display(), stdout(&raw));
    let clock = ManualClock::new(crashed_at_ms);
    let store =
        Store::open(config(image, &clock, mode)).unwrap_or_else(|e| panic!("open {}: {e}", image.display()));
    // Every put made again, as a producer that did not see its answer would.
    for (id, put) in puts.iter().enumerate() {
        let retry = store.put(keyed(id as u64, put.deliver_at_ms)).unwrap();
        if acked(put, frozen, mode) {
            assert!(
                retry.is_duplicate(),
                "{}: the retry of acknowledged put {id} wrote again",
                image.display()
            );
        }
    }
    // Everything comes due: the far timers years later.
    clock.set_ms(crashed_at_ms + 20 * 365 * 86_400_000);
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut due: HashMap<u64, Option<u64>> = HashMap::new();
    let mut quiet = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while quiet < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}: still pending after a minute: {:?}",
            image.display(),
            store.stats()
        );
        let batch = consumer.poll(4096, Duration::from_millis(300)).unwrap();
        if batch.is_empty() && store.stats().pending == 0 && store.stats().dispatch_lag_bytes == 0 {
            quiet += 1;
            continue;
        }
        for m in batch {
            let id = u64::from_le_bytes(m.body()[..8].try_into().unwrap());
            if let Some(due) = m.deliver_at_ms() {
                assert!(m.delivered_at_ms() >= due, "{}: message {id} delivered early", image.display());
            }
            *seen.entry(id).or_default() += 1;
            due.insert(id, m.deliver_at_ms());
        }
    }
    let stats = store.stats();
    store.close().unwrap();
    for (id, put) in puts.iter().enumerate() {
        let (least, most) = expected(put, frozen, mode);
        let got = seen.get(&(id as u64)).copied().unwrap_or(0);
        if got > 0 {
            // A reschedule acknowledged before the crash holds in sync mode; any other may or may not.
            let allowed = match put.rescheduled {
                None => vec![put.deliver_at_ms],
                Some((to, by)) if by < frozen.event && mode == FlushMode::Sync => vec![Some(to)],
                Some((to, _)) => vec![put.deliver_at_ms, Some(to)],
            };
            assert!(
                allowed.contains(&due[&(id as u64)]),
                "{}: message {id} was delivered for {:?}, not one of {allowed:?}",
                image.display(),
                due[&(id as u64)]
            );
        }
        assert!(
            (least..=most).contains(&got),
            "{}: message {id} ({put:?}) delivered {got} times, expected {least}..={most}; crash at event {} (log durable below {})",
            image.display(),
            frozen.event,
            frozen.log_durable_end
        );
    }
    let verify = dump(image, &["verify"]);
    assert_eq!(verify.status.code(), Some(0), "{}: {}", image.display(), stdout(&verify));
    let audit = dump(image, &["audit", "--json"]);
    let doc = json(&audit);
    assert_eq!(
        (&doc["lost"], &doc["duplicated"], &doc["early"], &doc["fired_after_reschedule"]),
        (&0.into(), &0.into(), &0.into(), &0.into()),
        "{}: {}\nthe store at close: {stats:?}",
        image.display(),
        stdout(&dump(image, &["audit"]))
    );
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn run(mode: FlushMode) {
    let crashes = env_or("DELAYWHEEL_POWER_LOSS_CRASHES", 3);
    let images = env_or("DELAYWHEEL_POWER_LOSS_IMAGES", 2);
    let seed = env_or("DELAYWHEEL_POWER_LOSS_SEED", 0x5EED);
    let mut rng = fastrand::Rng::with_seed(seed ^ mode as u64);
    let mut checked = 0;
    for crash in 0..crashes {
        let crash_at = 20 + rng.u64(..400);
        let dir = tempfile::tempdir().unwrap();
        let workload_seed = rng.u64(..);
        let (puts, frozen, crashed_at_ms) = workload(dir.path(), mode, crash_at, workload_seed);
        for i in 0..images {
            let image = tempfile::tempdir().unwrap();
            let image_seed = rng.u64(..);
            frozen.write_image(image.path(), image_seed, WRITEBACK).unwrap();
            if std::env::var_os("DELAYWHEEL_POWER_LOSS_KEEP").is_some() {
                // The image as the power loss left it, for a look with wheel-dump.
                let kept = tempfile::TempDir::with_prefix("power-loss-").unwrap().keep();
                frozen.write_image(&kept, image_seed, WRITEBACK).unwrap();
                eprintln!("image kept in {}", kept.display());
            }
            eprintln!(
                "{mode:?} crash {crash} at event {crash_at} (workload seed {workload_seed:#x}), image {i} (seed {image_seed:#x}), {} puts",
                puts.len()
            );
            check_image(image.path(), &puts, &frozen, mode, crashed_at_ms);
            checked += 1;
        }
    }
    eprintln!("{mode:?}: {checked} power-loss images checked (seed {seed:#x})");
}

#[test]
fn after_a_power_loss_in_sync_mode_every_acknowledged_put_is_delivered_exactly_once() {
    run(FlushMode::Sync);
}

#[test]
fn after_a_power_loss_in_async_mode_everything_flushed_is_delivered_exactly_once() {
    run(FlushMode::Async);
}

/// A consumer group reads what is put, committing and syncing its position
/// after each read; returns each position synced with the durability points
/// seen when `sync_offsets` had returned, and the highest ever committed.
fn positions_workload(dir: &Path, crash_at: u64, seed: u64) -> (Vec<(u64, u64)>, u64, Arc<Frozen>) {
    let recording = Recording::arm(dir, crash_at);
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir, &clock, FlushMode::Sync)).unwrap();
    let mut consumer = store.consumer_in_group("g", TOPIC, 0).unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut synced, mut committed) = (Vec::new(), 0);
    let frozen = loop {
        if let Some(frozen) = recording.frozen() {
            break frozen;
        }
        assert!(synced.len() < 100_000, "the crash point {crash_at} was never reached");
        for _ in 0..rng.u64(1..8) {
            let _ = store.put(Message::new(TOPIC, vec![0; 8]));
        }
        let Ok(read) = consumer.poll(rng.usize(1..12), Duration::from_millis(5)) else { continue };
        if read.is_empty() {
            continue;
        }
        consumer.commit();
        committed = consumer.position();
        if store.sync_offsets().is_ok() {
            synced.push((consumer.position(), recording.events()));
        }
    };
    recording.disarm();
    drop(consumer);
    drop(store);
    (synced, committed, frozen)
}

#[test]
fn after_a_power_loss_a_synced_consumer_position_holds() {
    let crashes = env_or("DELAYWHEEL_POWER_LOSS_CRASHES", 3);
    let images = env_or("DELAYWHEEL_POWER_LOSS_IMAGES", 2);
    let seed = env_or("DELAYWHEEL_POWER_LOSS_SEED", 0x5EED);
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x9051);
    for crash in 0..crashes {
        let crash_at = 20 + rng.u64(..400);
        let dir = tempfile::tempdir().unwrap();
        let (synced, committed, frozen) = positions_workload(dir.path(), crash_at, rng.u64(..));
        // The newest position whose sync returned before the crash point.
        let least = synced.iter().filter(|(_, by)| *by < frozen.event).map(|(p, _)| *p).max().unwrap_or(0);
        for i in 0..images {
            let image = tempfile::tempdir().unwrap();
            let image_seed = rng.u64(..);
            frozen.write_image(image.path(), image_seed, WRITEBACK).unwrap();
            let clock = ManualClock::new(T0);
            let store = Store::open(config(image.path(), &clock, FlushMode::Sync)).unwrap();
            let position = store.consumer_in_group("g", TOPIC, 0).unwrap().position();
            store.close().unwrap();
            assert!(
                (least..=committed).contains(&position),
                "crash {crash} at event {crash_at}, image {i} (seed {image_seed:#x}): position {position}, \
                 synced {least} before the crash, {committed} committed"
            );
            let verify = dump(image.path(), &["verify"]);
            assert_eq!(verify.status.code(), Some(0), "{}: {}", image.path().display(), stdout(&verify));
        }
    }
}

/// A schedule the workload created: every `period` ms from `start`, `limit`
/// occurrences; acknowledged at `acked_by`; its record at `offset`. One
/// made by an update replaced `replaces`; one replaced was replaced by the
/// schedule `replaced_by` at `replaced_at_ms`.
#[derive(Debug, Clone, Copy)]
struct Asked {
    start: u64,
    period: u64,
    limit: u64,
    offset: u64,
    acked_by: u64,
    cancelled_by: Option<u64>,
    replaces: Option<usize>,
    replaced_by: Option<(usize, u64)>,
}

impl Asked {
    /// A schedule created (`replaces`: by an update of that one) with its record at `offset`.
    fn new(start: u64, period: u64, limit: u64, offset: u64, acked_by: u64, replaces: Option<usize>) -> Self {
        Self { start, period, limit, offset, acked_by, cancelled_by: None, replaces, replaced_by: None }
    }
}

/// Every `period` ms from `start`, `limit` occurrences, body `id`.
fn every(id: u64, start: u64, period: u64, limit: u64) -> Schedule {
    Schedule::new(
        Message::new(TOPIC, id.to_le_bytes().to_vec()),
        Recurrence::every(Duration::from_millis(period)),
    )
    .start_at_ms(start)
    .limit(limit)
    // Every occurrence is owed, however late the image's clock is.
    .missed_runs(MissedRuns::FireAll { window: Duration::from_secs(100 * 365 * 86_400) })
}

/// Creates schedules while the clock moves, occurrences firing as it goes,
/// until the crash point.
fn schedules_workload(
    dir: &Path,
    mode: FlushMode,
    crash_at: u64,
    seed: u64,
) -> (Vec<Asked>, Arc<Frozen>, u64) {
    let recording = Recording::arm(dir, crash_at);
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir, &clock, mode)).unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut asked: Vec<Asked> = Vec::new();
    let frozen = loop {
        if let Some(frozen) = recording.frozen() {
            break frozen;
        }
        assert!(asked.len() < 100_000, "the crash point {crash_at} was never reached");
        let id = asked.len() as u64;
        let (start, period, limit) = (clock.now_ms() + rng.u64(..500), rng.u64(100..500), rng.u64(2..8));
        let Ok(receipt) = store.schedule(every(id, start, period, limit)) else { continue };
        let offset = receipt.receipt().offset();
        asked.push(Asked::new(start, period, limit, offset, recording.events(), None));
        // One in eight replaces an earlier schedule, untouched so far, often mid-series.
        let earlier = rng.usize(..asked.len());
        let untouched =
            |a: &Asked| a.cancelled_by.is_none() && a.replaced_by.is_none() && a.replaces.is_none();
        if rng.u64(..8) == 0 && untouched(&asked[earlier]) {
            let new_id = asked.len();
            let (start, period, limit) = (clock.now_ms() + rng.u64(..500), rng.u64(100..500), rng.u64(2..8));
            let handle =
                delaywheel::Handle { offset: asked[earlier].offset, deliver_at_ms: asked[earlier].start };
            if let Ok(UpdateOutcome::Updated(receipt)) =
                store.update_schedule(handle, every(new_id as u64, start, period, limit))
            {
                let offset = receipt.receipt().offset();
                asked[earlier].replaced_by = Some((new_id, clock.now_ms()));
                asked.push(Asked::new(start, period, limit, offset, recording.events(), Some(earlier)));
            }
            continue;
        }
        if rng.u64(..8) == 0
            && store.cancel_schedule(receipt.handle()).is_ok_and(|o| o == CancelOutcome::Cancelled)
        {
            asked.last_mut().expect("just pushed").cancelled_by = Some(recording.events());
        }
        if rng.u64(..3) == 0 {
            clock.advance_ms(rng.u64(..300));
            std::thread::sleep(Duration::from_micros(rng.u64(..2_000)));
        }
    };
    let crashed_at_ms = clock.now_ms();
    recording.disarm();
    drop(store);
    (asked, frozen, crashed_at_ms)
}

/// Opens the image, delivers every occurrence, and checks each schedule's.
fn check_schedules_image(
    image: &Path,
    asked: &[Asked],
    frozen: &Frozen,
    mode: FlushMode,
    crashed_at_ms: u64,
) {
    let raw = dump(image, &["verify"]);
    assert_eq!(raw.status.code(), Some(0), "{} before the open: {}", image.display(), stdout(&raw));
    let clock = ManualClock::new(crashed_at_ms);
    let store =
        Store::open(config(image, &clock, mode)).unwrap_or_else(|e| panic!("open {}: {e}", image.display()));
    // Every occurrence comes due, and is caught up in order.
    clock.set_ms(crashed_at_ms + 60_000);
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let mut seen: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let mut quiet = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while quiet < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}: still pending: {:?}",
            image.display(),
            store.stats()
        );
        let batch = consumer.poll(4096, Duration::from_millis(300)).unwrap();
        if batch.is_empty() && store.stats().pending == 0 && store.stats().dispatch_lag_bytes == 0 {
            quiet += 1;
            continue;
        }
        for m in batch {
            let id = u64::from_le_bytes(m.body()[..8].try_into().unwrap());
            let due = m.deliver_at_ms().unwrap();
            assert!(m.delivered_at_ms() >= due, "{}: schedule {id} delivered early", image.display());
            seen.entry(id).or_default().push((m.occurrence().unwrap().number, due));
        }
    }
    store.close().unwrap();
    let acked = |a: &Asked| {
        a.acked_by < frozen.event && (mode == FlushMode::Sync || a.offset < frozen.log_durable_end)
    };
    let whole =
        |a: &Asked| -> Vec<(u64, u64)> { (1..=a.limit).map(|n| (n, a.start + (n - 1) * a.period)).collect() };
    let delivered: Vec<Vec<(u64, u64)>> =
        (0..asked.len()).map(|id| seen.remove(&(id as u64)).unwrap_or_default()).collect();
    for (id, a) in asked.iter().enumerate() {
        let got = &delivered[id];
        let prefix = got.iter().copied().eq(whole(a).into_iter().take(got.len()));
        let ok = match (acked(a), a.cancelled_by.is_some(), a.replaced_by) {
            // Replaced: the occurrences before the update, all of them if
            // the update's record is gone (never both, never neither).
            (acked, _, Some((new, at_ms))) => {
                let replaced = !delivered[new].is_empty();
                prefix
                    && (replaced || !acked || *got == whole(a))
                    && (!replaced || got.iter().all(|&(_, due)| due <= at_ms))
            }
            // A schedule the crash could not take: every occurrence once, in order.
            (true, false, None) => *got == whole(a),
            // Its record may be gone: all of it, or nothing.
            (false, false, None) => got.is_empty() || *got == whole(a),
            // Cancelled (the cancel held, or may have): the occurrences before it, in order.
            (_, true, None) => prefix,
        };
        assert!(
            ok,
            "{}: schedule {id} ({a:?}) delivered {got:?}; crash at event {} (log durable below {})",
            image.display(),
            frozen.event,
            frozen.log_durable_end
        );
    }
    let audit = dump(image, &["audit", "--json"]);
    let doc = json(&audit);
    let counts =
        ["lost", "duplicated", "early", "occurrences_duplicated", "occurrences_early", "occurrences_missing"];
    for key in counts {
        assert_eq!(doc[key], 0, "{}: {key}: {}", image.display(), stdout(&dump(image, &["audit"])));
    }
}

fn run_schedules(mode: FlushMode) {
    let crashes = env_or("DELAYWHEEL_POWER_LOSS_CRASHES", 3);
    let images = env_or("DELAYWHEEL_POWER_LOSS_IMAGES", 2);
    let seed = env_or("DELAYWHEEL_POWER_LOSS_SEED", 0x5EED);
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5C4E ^ mode as u64);
    // Occurrences that shared an occurrences record with another, in the images as the power loss left them.
    let mut shared = 0;
    for crash in 0..crashes {
        let crash_at = 20 + rng.u64(..400);
        let dir = tempfile::tempdir().unwrap();
        let workload_seed = rng.u64(..);
        let (asked, frozen, crashed_at_ms) = schedules_workload(dir.path(), mode, crash_at, workload_seed);
        for i in 0..images {
            let image = tempfile::tempdir().unwrap();
            let image_seed = rng.u64(..);
            frozen.write_image(image.path(), image_seed, WRITEBACK).unwrap();
            shared += entries_in_shared_occurrences_records(image.path());
            eprintln!(
                "{mode:?} schedules crash {crash} at event {crash_at} (workload seed {workload_seed:#x}), image {i} (seed {image_seed:#x}), {} schedules, {} by an update",
                asked.len(),
                asked.iter().filter(|a| a.replaces.is_some()).count()
            );
            check_schedules_image(image.path(), &asked, &frozen, mode, crashed_at_ms);
        }
    }
    eprintln!("{mode:?}: {shared} occurrences shared an occurrences record");
    assert!(crashes < 3 || shared > 0, "no crash point met occurrences fired together");
}

/// The entries of the occurrences records of two or more in the first
/// segment, up to the first record that does not check out (a torn tail).
fn entries_in_shared_occurrences_records(dir: &Path) -> usize {
    use delaywheel::internals::record::{self, Record};
    let Ok(segment) = std::fs::read(dir.join("commitlog").join(format!("{:020}", 0))) else { return 0 };
    let (mut at, mut shared) = (delaywheel::internals::FILE_HEADER_LEN, 0);
    while let Ok(frame) = record::check_frame(&segment[at..], at as u64) {
        if let Ok(Record::Occurrences(o)) = Record::decode(&segment[at..], at as u64, frame)
            && o.len() > 1
        {
            shared += o.len();
        }
        at += frame.len;
    }
    shared
}

#[test]
fn after_a_power_loss_every_occurrence_of_an_acknowledged_schedule_is_delivered_once() {
    run_schedules(FlushMode::Sync);
    run_schedules(FlushMode::Async);
}
