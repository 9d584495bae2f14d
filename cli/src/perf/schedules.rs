//! `perf --schedules N`: creates N recurring schedules (every M ms with
//! random phases, or one cron expression in a zone), consumes every
//! occurrence for S seconds, and checks each schedule's occurrences came
//! in order, once each, never early, at their own instants. Missed
//! occurrences are caught up (`fire_all`, an hour's window), so under any
//! load every occurrence is owed and a gap is a loss.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use delaywheel::{Clock, Config, Message, MissedRuns, Recurrence, Schedule, Store, SystemClock};
use hdrhistogram::Histogram;

use super::{POLL_BATCH, PerfArgs, thread_cpu};
use crate::{
    Failure, disk_bytes, heap_peak_bytes, lateness_histogram, lateness_json, rss_peak_bytes, store_dir,
};

const TOPIC: &str = "PerfSchedules";
/// Occurrences due this close to the run's end are not owed yet.
const SETTLE_MS: u64 = 60_000;

/// How the schedules recur.
#[derive(Clone, Debug)]
enum Kind {
    /// Every this many ms, each from its own random phase.
    Every(u64),
    /// One cron expression in one zone: every schedule fires together.
    Cron { expression: String, time_zone: String },
}

/// What consumers saw, per schedule and in all.
struct Seen {
    /// Per schedule: the number of the last occurrence seen.
    last: Vec<AtomicU32>,
    delivered: AtomicU64,
    duplicated: AtomicU64,
    /// Occurrences that skipped a number (each one skipped counts).
    gaps: AtomicU64,
    early: AtomicU64,
    /// Occurrences at another instant than their schedule's.
    off_schedule: AtomicU64,
    /// The latest an occurrence was seen (ms), and when it was due: where in the run the worst came.
    latest: AtomicU64,
    latest_due: AtomicU64,
}

pub fn run(args: &PerfArgs, count: u64) -> Result<(), Failure> {
    let kind = match (&args.cron, args.every_ms) {
        (Some(expression), None) => Kind::Cron {
            expression: expression.clone(),
            time_zone: args.time_zone.clone().unwrap_or_else(|| "UTC".into()),
        },
        (None, Some(0)) => return Err(Failure::Usage("--every-ms must be at least 1".into())),
        (None, Some(every)) => Kind::Every(every),
        _ => return Err(Failure::Usage("--schedules needs one of --every-ms M or --cron EXPR".into())),
    };
    if count == 0 || args.consumers == 0 || args.producers == 0 {
        return Err(Failure::Usage("--schedules, --producers and --consumers must be at least 1".into()));
    }
    let run_secs = args.run_secs.unwrap_or(60);
    let keep = args.keep || args.dir.is_some();
    let (dir, tmp) = store_dir(args.dir.clone(), "delaywheel-perf-")?;
    let store = Arc::new(Store::open(Config::new(&dir).with_queues_per_topic(args.consumers))?);
    let seen = Arc::new(Seen {
        last: (0..count).map(|_| AtomicU32::new(0)).collect(),
        delivered: AtomicU64::new(0),
        duplicated: AtomicU64::new(0),
        gaps: AtomicU64::new(0),
        early: AtomicU64::new(0),
        off_schedule: AtomicU64::new(0),
        latest: AtomicU64::new(0),
        latest_due: AtomicU64::new(0),
    });
    // Every schedule starts after the last is created: now + 2 s + N / 100,000 s.
    let start_ms = SystemClock.now_ms() + 2_000 + count / 100;
    let starts = Arc::new(Starts::new(&kind, start_ms, count)?);
    let stop = Arc::new(AtomicBool::new(false));
    let consumers = (0..args.consumers)
        .map(|queue| {
            let (store, seen, stop, kind) =
                (Arc::clone(&store), Arc::clone(&seen), Arc::clone(&stop), kind.clone());
            let starts = Arc::clone(&starts);
            std::thread::Builder::new()
                .name(format!("perf-consumer-{queue}"))
                .spawn(move || consume(&store, queue, &seen, &starts, &kind, &stop))
        })
        .collect::<Result<Vec<_>, _>>()?;

    let created = Instant::now();
    let firsts = create_all(&store, &kind, &starts, args)?;
    let create_secs = created.elapsed().as_secs_f64();
    // What the schedules' own records take, written once: the occurrences come after.
    let schedule_log_bytes = store.stats().log_bytes;
    let run_from_ms = SystemClock.now_ms().max(start_ms);
    std::thread::sleep(Duration::from_millis(run_from_ms - SystemClock.now_ms().min(run_from_ms)));
    std::thread::sleep(Duration::from_secs(run_secs));
    let end_ms = SystemClock.now_ms();
    // Let what was due before the end arrive: a saturated store delivers
    // it late, which the lateness shows; only what never comes is lost.
    let owed = owed_by(firsts.iter().map(|&first| start_ms + u64::from(first)), &kind, end_ms)?;
    let settled = Instant::now();
    let mut lost = not_seen(&seen, &owed);
    while lost > 0 && settled.elapsed() < Duration::from_millis(SETTLE_MS) {
        std::thread::sleep(Duration::from_millis(50));
        lost = not_seen(&seen, &owed);
    }
    let settle_secs = settled.elapsed().as_secs_f64();
    stop.store(true, Ordering::Release);
    let mut lateness = lateness_histogram();
    for consumer in consumers {
        let h = consumer.join().map_err(|_| "a consumer thread panicked")??;
        lateness.add(h).map_err(|e| format!("merging lateness: {e}"))?;
    }
    let stats = store.fresh_stats()?;
    let delivered = seen.delivered.load(Ordering::Acquire);
    let window_secs = (end_ms - run_from_ms) as f64 / 1000.0;
    let report = serde_json::json!({
        "schedules": count,
        "recurrence": match &kind { Kind::Every(ms) => format!("@every {ms}ms"), Kind::Cron { expression, .. } => expression.clone() },
        "create_secs": create_secs,
        "create_per_sec": count as f64 / create_secs,
        "run_secs": window_secs,
        "occurrences_delivered": delivered,
        "occurrences_per_sec": delivered as f64 / (window_secs + settle_secs),
        "settle_secs": settle_secs,
        "lost": lost,
        "duplicated": seen.duplicated.load(Ordering::Acquire),
        "early": seen.early.load(Ordering::Acquire),
        "off_schedule": seen.off_schedule.load(Ordering::Acquire),
        "lateness_ms": lateness_json(&lateness),
        "latest_due_after_secs": seen.latest_due.load(Ordering::Acquire).saturating_sub(run_from_ms) as f64 / 1000.0,
        "scheduler_lateness_ms": {
            "p50": stats.lateness_ms.p50, "p90": stats.lateness_ms.p90, "p99": stats.lateness_ms.p99,
            "p999": stats.lateness_ms.p999, "max": stats.lateness_ms.max,
        },
        "heap_peak_bytes": heap_peak_bytes(),
        "rss_peak_bytes": rss_peak_bytes(),
        "disk_bytes": disk_bytes(&dir),
        "log_bytes": stats.log_bytes,
        "log_bytes_per_occurrence": if delivered > 0 { stats.log_bytes as f64 / delivered as f64 } else { 0.0 },
        "schedule_log_bytes": schedule_log_bytes,
        // Each occurrence's own bytes: the log's growth after the schedules were written.
        "occurrence_log_bytes_per_occurrence": if delivered > 0 {
            (stats.log_bytes - schedule_log_bytes) as f64 / delivered as f64
        } else {
            0.0
        },
        "pending": stats.pending,
        "consumers": args.consumers,
        "thread_cpu_secs": thread_cpu::report(&thread_cpu::Exited::default()),
        "dir": if keep { dir.display().to_string() } else { String::new() },
    });
    Arc::into_inner(store).ok_or("the store is still shared")?.close()?;
    if keep && let Some(tmp) = tmp {
        let _ = tmp.keep();
    }
    super::print_report(&report, args.json);
    Ok(())
}

/// Each schedule's planned start, in 4 bytes a schedule (the run's own
/// memory counts in its heap peak, and the store's is what is measured).
struct Starts {
    base_ms: u64,
    count: u64,
    /// For `Every`, each one's random phase after `base_ms`; cron ones all start then.
    phases: Vec<u32>,
}

impl Starts {
    fn new(kind: &Kind, base_ms: u64, count: u64) -> Result<Self, Failure> {
        let phases = match kind {
            Kind::Every(every) => {
                let mut rng = fastrand::Rng::with_seed(count);
                (0..count).map(|_| Self::phase(rng.u64(0..*every))).collect::<Result<_, _>>()?
            }
            Kind::Cron { .. } => Vec::new(),
        };
        Ok(Self { base_ms, count, phases })
    }

    fn of(&self, id: u64) -> u64 {
        self.base_ms + self.phases.get(id as usize).map_or(0, |&phase| u64::from(phase))
    }

    /// An instant after the base, as kept.
    fn phase(ms: u64) -> Result<u32, Failure> {
        u32::try_from(ms)
            .map_err(|_| Failure::Usage(format!("{ms} ms after the start is past what a run keeps")))
    }
}

/// The schedule of id `id`.
fn schedule(id: u64, kind: &Kind, start_ms: u64, queues: u32) -> Schedule {
    let message = Message::new(TOPIC, id.to_le_bytes().to_vec()).queue_id((id % u64::from(queues)) as u32);
    let recurrence = match kind {
        Kind::Every(every) => Recurrence::every(Duration::from_millis(*every)),
        Kind::Cron { expression, time_zone } => {
            Recurrence::cron(expression.clone()).in_time_zone(time_zone.clone())
        }
    };
    Schedule::new(message, recurrence)
        .start_at_ms(start_ms)
        .missed_runs(MissedRuns::FireAll { window: Duration::from_secs(3_600) })
}

/// Creates every schedule, split over the producers; returns each one's
/// first occurrence as the store answered it (later than its start if it
/// was created after that).
fn create_all(
    store: &Arc<Store>,
    kind: &Kind,
    starts: &Arc<Starts>,
    args: &PerfArgs,
) -> Result<Vec<u32>, Failure> {
    let producers = args.producers as u64;
    let queues = args.consumers;
    let firsts: Arc<Vec<AtomicU32>> = Arc::new((0..starts.count).map(|_| AtomicU32::new(0)).collect());
    let threads = (0..producers)
        .map(|p| {
            let (store, starts, kind) = (Arc::clone(store), Arc::clone(starts), kind.clone());
            let firsts = Arc::clone(&firsts);
            std::thread::Builder::new().name(format!("perf-producer-{p}")).spawn(move || {
                (p..starts.count).step_by(producers as usize).try_for_each(|id| {
                    let receipt = store.schedule(schedule(id, &kind, starts.of(id), queues))?;
                    let first = Starts::phase(receipt.first_occurrence_ms() - starts.base_ms)?;
                    firsts[id as usize].store(first, Ordering::Release);
                    Ok::<_, Failure>(())
                })
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    for thread in threads {
        thread.join().map_err(|_| "a producer thread panicked")??;
    }
    Ok(firsts.iter().map(|first| first.load(Ordering::Acquire)).collect())
}

/// The instants of the first occurrences of schedule `id`, up to `until_ms`.
fn owed(kind: &Kind, start_ms: u64, until_ms: u64) -> Result<u64, Failure> {
    Ok(match kind {
        Kind::Every(every) => until_ms.checked_sub(start_ms).map_or(0, |span| span / every + 1),
        Kind::Cron { .. } => {
            let probe = schedule(0, kind, start_ms, 1);
            let mut n = 0;
            let mut from = start_ms;
            loop {
                let next = probe.next_occurrences(from, 64)?;
                let within = next.iter().take_while(|&&at| at <= until_ms).count() as u64;
                n += within;
                if within < 64 {
                    break n;
                }
                from = next[63] + 1;
            }
        }
    })
}

/// Per schedule, the occurrences due by `end_ms`, counted from the first
/// occurrence the store answered.
fn owed_by(firsts: impl Iterator<Item = u64>, kind: &Kind, end_ms: u64) -> Result<Vec<u32>, Failure> {
    // Cron schedules share their instants: count once per first occurrence.
    let mut by_first = std::collections::HashMap::new();
    firsts
        .map(|first| match kind {
            Kind::Every(_) => owed(kind, first, end_ms),
            Kind::Cron { .. } => match by_first.get(&first) {
                Some(&n) => Ok(n),
                None => owed(kind, first, end_ms).inspect(|&n| {
                    by_first.insert(first, n);
                }),
            },
        })
        .map(|owed| {
            owed.and_then(|n| u32::try_from(n).map_err(|_| "more occurrences owed than u32 holds".into()))
        })
        .collect()
}

/// Occurrences owed that no consumer saw: a schedule's last seen number
/// short of what it owed, and every number skipped.
fn not_seen(seen: &Seen, owed: &[u32]) -> u64 {
    let short: u64 = owed
        .iter()
        .zip(&seen.last)
        .map(|(&owed, last)| u64::from(owed.saturating_sub(last.load(Ordering::Acquire))))
        .sum();
    seen.gaps.load(Ordering::Acquire) + short
}

/// The instant of occurrence `number` of a schedule starting at `start_ms`
/// (`None` for cron: every schedule shares them, and the order check suffices).
fn instant(kind: &Kind, start_ms: u64, number: u64) -> Option<u64> {
    match kind {
        Kind::Every(every) => Some(start_ms + (number - 1) * every),
        Kind::Cron { .. } => None,
    }
}

/// Consumes `queue` until told to stop; returns the lateness seen.
fn consume(
    store: &Store,
    queue: u32,
    seen: &Seen,
    starts: &Starts,
    kind: &Kind,
    stop: &AtomicBool,
) -> Result<Histogram<u64>, String> {
    let mut consumer = store.consumer(TOPIC, queue).map_err(|e| e.to_string())?;
    let mut lateness = lateness_histogram();
    while !stop.load(Ordering::Acquire) {
        let batch = consumer.poll(POLL_BATCH, Duration::from_millis(50)).map_err(|e| e.to_string())?;
        let now_ms = SystemClock.now_ms();
        for m in &batch {
            let id = u64::from_le_bytes(m.body()[..8].try_into().map_err(|_| "short body")?);
            let occurrence = m.occurrence().ok_or("a delivery that is no occurrence")?;
            let due = m.deliver_at_ms().ok_or("an occurrence without its instant")?;
            if id >= starts.count {
                return Err("an id no schedule has".into());
            }
            let start = starts.of(id);
            let number = u32::try_from(occurrence.number).map_err(|_| "an occurrence number past u32")?;
            if now_ms < due || m.delivered_at_ms() < due {
                seen.early.fetch_add(1, Ordering::AcqRel);
            }
            if instant(kind, start, occurrence.number).is_some_and(|at| at != due) {
                seen.off_schedule.fetch_add(1, Ordering::AcqRel);
            }
            let late = now_ms.saturating_sub(due);
            lateness.saturating_record(late);
            if late > seen.latest.fetch_max(late, Ordering::AcqRel) {
                seen.latest_due.store(due, Ordering::Release);
            }
            let last = seen.last[id as usize].fetch_max(number, Ordering::AcqRel);
            if number <= last {
                seen.duplicated.fetch_add(1, Ordering::AcqRel);
            } else {
                seen.gaps.fetch_add(u64::from(number - last - 1), Ordering::AcqRel);
                seen.delivered.fetch_add(1, Ordering::AcqRel);
            }
        }
        consumer.commit();
    }
    Ok(lateness)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A schedule created after its planned start owes from the first
    /// occurrence the store answered, not from the start: counting from the
    /// start called 458,722 occurrences of a million cron schedules lost
    /// when creating them took longer than the 12 s the run allows.
    #[test]
    fn what_is_owed_counts_from_the_first_occurrence_answered() {
        let every = Kind::Every(1_000);
        assert_eq!(owed_by([10_000, 12_000].into_iter(), &every, 12_500).ok(), Some(vec![3, 1]));
        let cron = Kind::Cron { expression: "*/10 * * * * *".into(), time_zone: "UTC".into() };
        assert_eq!(owed_by([10_000, 30_000, 10_000].into_iter(), &cron, 30_000).ok(), Some(vec![3, 1, 3]));
        let seen = Seen {
            last: [3, 0, 1].into_iter().map(AtomicU32::new).collect(),
            delivered: AtomicU64::new(4),
            duplicated: AtomicU64::new(0),
            gaps: AtomicU64::new(1),
            early: AtomicU64::new(0),
            off_schedule: AtomicU64::new(0),
            latest: AtomicU64::new(0),
            latest_due: AtomicU64::new(0),
        };
        assert_eq!(not_seen(&seen, &[3, 1, 3]), 1 + 1 + 2);
    }
}
