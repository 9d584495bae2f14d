//! `delaywheel perf`: the large-scale harness. Puts N messages (each body
//! starts with its id), consumes every delivery, and checks each id arrived
//! exactly once and never early.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use delaywheel::{Clock, Config, FlushMode, Message, Scheduler, Store, SystemClock};
use hdrhistogram::Histogram;

mod ledger;
mod producers;
mod schedules;
mod thread_cpu;

use ledger::Ledger;
use producers::{Produced, PutPath, put_all};

use crate::{
    Failure, disk_bytes, heap_peak_bytes, lateness_histogram, lateness_json, rss_peak_bytes, store_dir,
};

const TOPIC: &str = "PerfTopic";
/// After the last deliver time, how long the run waits for stragglers.
const GRACE: Duration = Duration::from_secs(30);
/// Messages the consumer takes per poll. Lateness is taken when a poll
/// returns, so a big batch makes its first messages wait for its last: with
/// 4,096 a consumer that fell behind in a burst read thousands of messages
/// before handing out any. Side by side on the 1 M burst (this machine, 8 and
/// 11 runs): p99 median 5.5 ms with outliers of 13 and 19 ms at 4,096, median
/// 4 ms and at most 6 ms at 256; 32 was no better (6 ms over 3 runs).
const POLL_BATCH: usize = 256;

#[derive(Args, Debug)]
pub struct PerfArgs {
    /// Store directory (kept); default: a temporary one, removed unless --keep.
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long, default_value_t = 1_000_000)]
    messages: u64,
    #[arg(long, default_value_t = 128)]
    body_bytes: usize,
    /// Delays drawn uniformly from A..B milliseconds (default 0..10000).
    #[arg(long, value_parser = parse_range, conflicts_with_all = ["levels", "same_second", "same_millisecond"])]
    delay_ms: Option<(u64, u64)>,
    /// Legacy levels drawn uniformly from A..B (or A..=B).
    #[arg(long, value_parser = parse_range, conflicts_with_all = ["same_second", "same_millisecond"])]
    levels: Option<(u64, u64)>,
    /// Every message due within one and the same second, after the last put.
    #[arg(long, conflicts_with = "same_millisecond")]
    same_second: bool,
    /// Every message due at one and the same millisecond, after the last put.
    #[arg(long)]
    same_millisecond: bool,
    /// Spread the topic over N queues, each read by its own consumer thread.
    #[arg(long, default_value_t = 1)]
    consumers: u32,
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Puts per second over all producers (0: as fast as they can).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Put in batches of N (`Store::put_batch`).
    #[arg(long, conflicts_with = "inflight")]
    batch: Option<usize>,
    /// Pipelined puts (`Store::submit`), up to N in flight per producer.
    #[arg(long)]
    inflight: Option<usize>,
    #[arg(long, value_enum, default_value_t = SchedulerArg::Wheel)]
    scheduler: SchedulerArg,
    /// Give each message a key (`order-<id>`), so the store keeps its key
    /// index (`Store::pending_by_key`): run with and without to see its cost.
    #[arg(long)]
    keys: bool,
    /// Give each message a dedup key (`order-<id>`, `Message::dedup_key`):
    /// each put looks its key up first. After the puts, 10,000 of them are
    /// put again and timed: each must answer as a duplicate.
    #[arg(long)]
    dedup_keys: bool,
    /// Fraction of messages to cancel after putting them.
    #[arg(long, default_value_t = 0.0)]
    cancel_ratio: f64,
    #[arg(long, value_enum, default_value_t = FlushArg::Async)]
    flush: FlushArg,
    /// Keep the temporary store directory.
    #[arg(long)]
    keep: bool,
    /// Report right after the puts, leaving the timers pending.
    #[arg(long)]
    no_wait: bool,
    /// Print the report as one JSON object on the last line.
    #[arg(long)]
    json: bool,
    /// Create N recurring schedules instead of putting messages, and
    /// consume their occurrences (with --every-ms or --cron, --run-secs).
    #[arg(long, value_name = "N", conflicts_with_all = ["delay_ms", "levels", "same_second", "same_millisecond", "batch", "inflight"])]
    schedules: Option<u64>,
    /// Each schedule every M ms, from a random phase.
    #[arg(long, value_name = "M", requires = "schedules", conflicts_with = "cron")]
    every_ms: Option<u64>,
    /// Each schedule on this 6-field cron expression.
    #[arg(long, value_name = "EXPR", requires = "schedules")]
    cron: Option<String>,
    /// The IANA zone of --cron (default UTC).
    #[arg(long, value_name = "TZ", requires = "cron")]
    time_zone: Option<String>,
    /// How long the schedules run once they begin (default 60).
    #[arg(long, value_name = "S", requires = "schedules")]
    run_secs: Option<u64>,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum SchedulerArg {
    Wheel,
    Buckets,
}

impl SchedulerArg {
    fn name(self) -> &'static str {
        match self {
            Self::Wheel => "wheel",
            Self::Buckets => "buckets",
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum FlushArg {
    Async,
    Sync,
}

/// `A..B` (end excluded) or `A..=B` (end included), as a half-open pair.
pub(crate) fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b, inclusive) = if let Some((a, b)) = s.split_once("..=") {
        (a, b, true)
    } else if let Some((a, b)) = s.split_once("..") {
        (a, b, false)
    } else {
        return Err(format!("{s:?} is not a range like 0..10000"));
    };
    let a: u64 = a.trim().parse().map_err(|_| format!("{a:?} is not a number"))?;
    let b: u64 = b.trim().parse().map_err(|_| format!("{b:?} is not a number"))?;
    let end = if inclusive { b + 1 } else { b };
    if end <= a {
        return Err(format!("{s:?} is empty"));
    }
    Ok((a, end))
}

/// How each message is timed.
#[derive(Clone, Copy, Debug)]
enum Workload {
    DelayMs(u64, u64),
    Levels(u64, u64),
    /// All due in this epoch second.
    SameSecond(u64),
    /// All due at this epoch millisecond.
    SameMillisecond(u64),
}

impl Workload {
    fn message(&self, body: bytes::Bytes, queue: u32, rng: &mut fastrand::Rng, now_ms: u64) -> Message {
        let message = Message::new(TOPIC, body).queue_id(queue);
        match *self {
            Workload::DelayMs(a, b) => message.deliver_at_ms(now_ms + rng.u64(a..b)),
            Workload::Levels(a, b) => message.delay_level(rng.u64(a..b) as u16),
            Workload::SameSecond(second) => message.deliver_at_ms(second * 1000 + rng.u64(0..1000)),
            Workload::SameMillisecond(at) => message.deliver_at_ms(at),
        }
    }

    /// The instant a burst begins at (epoch ms), for the two burst workloads.
    fn burst_ms(&self) -> Option<u64> {
        match *self {
            Workload::SameSecond(second) => Some(second * 1000),
            Workload::SameMillisecond(at) => Some(at),
            _ => None,
        }
    }
}

pub fn run(args: PerfArgs) -> Result<(), Failure> {
    if let Some(count) = args.schedules {
        return schedules::run(&args, count);
    }
    let workload = workload(&args)?;
    if !(0.0..=1.0).contains(&args.cancel_ratio) {
        return Err(Failure::Usage("--cancel-ratio must be between 0 and 1".into()));
    }
    if args.batch == Some(0) || args.inflight == Some(0) {
        return Err(Failure::Usage("--batch and --inflight must be at least 1".into()));
    }
    if args.body_bytes < 8 || args.producers == 0 || args.messages == 0 || args.consumers == 0 {
        return Err(Failure::Usage(
            "--body-bytes must be at least 8, --producers, --consumers and --messages at least 1".into(),
        ));
    }
    let keep = args.keep || args.dir.is_some();
    let (dir, tmp) = store_dir(args.dir.clone(), "delaywheel-perf-")?;
    let flush = match args.flush {
        FlushArg::Async => FlushMode::Async,
        FlushArg::Sync => FlushMode::Sync,
    };
    let scheduler = match args.scheduler {
        SchedulerArg::Wheel => Scheduler::Wheel,
        SchedulerArg::Buckets => Scheduler::Buckets,
    };
    let config = Config::new(&dir)
        .with_queues_per_topic(args.consumers)
        .with_flush_mode(flush)
        .with_scheduler(scheduler);
    let store = Arc::new(Store::open(config)?);
    let workload = match workload {
        Workload::SameSecond(_) => {
            // Begins after the last put: now + 2 s + N / 200,000 s.
            Workload::SameSecond((SystemClock.now_ms() + 2_000 + args.messages / 200) / 1000 + 1)
        }
        Workload::SameMillisecond(_) => {
            Workload::SameMillisecond(SystemClock.now_ms() + 2_000 + args.messages / 200)
        }
        other => other,
    };
    let ledger = Arc::new(Ledger::new(args.messages));
    let stop = Arc::new(AtomicBool::new(false));
    let last_seen_ms = Arc::new(AtomicU64::new(0));
    let consumers = (0..args.consumers)
        .map(|queue| {
            let (store, ledger, stop) = (Arc::clone(&store), Arc::clone(&ledger), Arc::clone(&stop));
            let last_seen = Arc::clone(&last_seen_ms);
            std::thread::Builder::new()
                .name(format!("perf-consumer-{queue}"))
                .spawn(move || consume(&store, queue, &ledger, &stop, &last_seen))
        })
        .collect::<Result<Vec<_>, _>>()?;

    let started = Instant::now();
    let Produced { latest_due, latency_us: put_latency, cpu_secs: producers_cpu } =
        put_all(&store, &ledger, workload, &args)?;
    let enqueue_secs = started.elapsed().as_secs_f64();
    ledger.puts_done_ms.store(SystemClock.now_ms(), Ordering::Release);
    let duplicates = if args.dedup_keys { Some(put_duplicates(&store, args.messages)?) } else { None };
    let acked = args.messages;
    if args.no_wait {
        wait_for_indexing(&store, acked - ledger.cancelled_count.load(Ordering::Acquire));
    } else {
        wait_for_deliveries(&ledger, acked, latest_due, args.json);
    }
    stop.store(true, Ordering::Release);
    let Consumed { lateness, after_puts, first_last, cpu_secs: consumers_cpu } = join_consumers(consumers)?;
    let mut exited = thread_cpu::Exited::default();
    exited.add("perf-producers", producers_cpu);
    exited.add("perf-consumers", consumers_cpu);
    let run_end_ms = SystemClock.now_ms();

    let delivered = ledger.delivered.load(Ordering::Acquire);
    // Acknowledged, due long enough ago, and never delivered (with --no-wait,
    // timers not yet due are pending, not lost).
    let lost =
        if args.no_wait && run_end_ms < latest_due + GRACE.as_millis() as u64 { 0 } else { ledger.lost() };
    let deliver_secs = first_last.map_or(0.0, |(first, last)| last.duration_since(first).as_secs_f64());
    // Fresh: the report counts every timer as pending or delivered at one instant.
    let stats = store.fresh_stats()?;
    let disk = disk_bytes(&dir);
    let report = serde_json::json!({
        "scheduler": args.scheduler.name(),
        "keys": args.keys,
        "dedup_keys": args.dedup_keys,
        // `--dedup-keys`: puts of messages already put, each timed alone (µs).
        "duplicate_put_us": duplicates.as_ref().map(|(h, _)| serde_json::json!({
            "puts": h.len(), "p50": h.value_at_quantile(0.5), "p99": h.value_at_quantile(0.99), "max": h.max(),
        })),
        // Of those, how many wrote a message: must be 0.
        "duplicates_written": duplicates.as_ref().map(|(_, written)| *written),
        "messages": args.messages,
        "enqueue_secs": enqueue_secs,
        "enqueue_per_sec": args.messages as f64 / enqueue_secs,
        "put_path": PutPath::of(&args).name(),
        // From the call until the put returned (with --inflight: until its
        // ticket was seen durable); in sync mode, until it was on disk. Not
        // measured for one async put at a time (all zeros then).
        "put_latency_ms": put_latency_json(&put_latency),
        "delivered": delivered,
        "cancelled": ledger.cancelled_count.load(Ordering::Acquire),
        "fired_after_cancel": ledger.fired_after_cancel.load(Ordering::Acquire),
        "lost": lost,
        "duplicated": ledger.duplicated.load(Ordering::Acquire),
        "early": ledger.early.load(Ordering::Acquire),
        "deliver_per_sec": if deliver_secs > 0.0 { delivered as f64 / deliver_secs } else { 0.0 },
        "lateness_ms": lateness_json(&lateness),
        // Of the timers due after the last put returned: the lateness of
        // delivery alone, without the puts competing for the cores.
        "lateness_after_puts_ms": lateness_json(&after_puts),
        "heap_peak_bytes": heap_peak_bytes(),
        "rss_peak_bytes": rss_peak_bytes(),
        "disk_bytes": disk,
        "pending": stats.pending,
        "consumers": args.consumers,
        // The last delivery seen, in ms after the burst's instant (the
        // second's beginning, or the millisecond all timers were due at).
        "burst_last_seen_ms": workload.burst_ms().and_then(|at| first_last.map(|_| last_seen_ms.load(Ordering::Acquire).saturating_sub(at))),
        // The latest delivery the wheel made (its delivery record's time), in
        // ms after that instant: the consumer sees it once indexed.
        "burst_last_delivered_ms": workload.burst_ms().and_then(|at| first_last.map(|_| ledger.last_delivered_ms.load(Ordering::Acquire).saturating_sub(at))),
        // Deliveries per second from the burst's instant to the last sighting.
        "burst_per_sec": workload.burst_ms().and_then(|at| {
            let span_ms = last_seen_ms.load(Ordering::Acquire).saturating_sub(at).max(1);
            first_last.map(|_| delivered as f64 * 1000.0 / span_ms as f64)
        }),
        // Counted by the scheduler at the moment it delivered (before the
        // dispatcher and the consumer): where the delay comes from.
        "early_at_scheduler": stats.early,
        "log_bytes_per_message": stats.log_bytes as f64 / args.messages as f64,
        "scheduler_lateness_ms": {
            "p50": stats.lateness_ms.p50, "p90": stats.lateness_ms.p90, "p99": stats.lateness_ms.p99,
            "p999": stats.lateness_ms.p999, "max": stats.lateness_ms.max,
        },
        "timer_index_bytes": timer_index_bytes(&dir, &stats),
        // CPU seconds per store thread (alive until the close below) and of
        // the whole process: a stage near one core's worth of the run bounds it.
        "thread_cpu_secs": thread_cpu::report(&exited),
        // What one put cost its producer (issue 42: more producers must
        // not cost more a put than one).
        "producer_cpu_us_per_put": exited.of("perf-producers") * 1e6 / args.messages as f64,
        "dir": if keep { dir.display().to_string() } else { String::new() },
    });
    Arc::into_inner(store).ok_or("the store is still shared")?.close()?;
    if keep && let Some(tmp) = tmp {
        let _ = tmp.keep();
    }
    print_report(&report, args.json);
    Ok(())
}

/// Percentiles of put latency, recorded in microseconds, in milliseconds.
/// Puts again (`--dedup-keys`) up to 10,000 of the `messages` put, spread
/// over them; returns each one's latency in µs and how many were not
/// answered as duplicates.
fn put_duplicates(store: &Store, messages: u64) -> Result<(Histogram<u64>, u64), Failure> {
    let mut latency = Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
    let step = (messages / 10_000).max(1);
    let mut written = 0;
    for id in (0..messages).step_by(step as usize) {
        let message =
            Message::new(TOPIC, "again").dedup_key(format!("order-{id}")).delay(Duration::from_secs(3600));
        let since = Instant::now();
        let receipt = store.put(message)?;
        latency.saturating_record(since.elapsed().as_micros() as u64);
        written += u64::from(!receipt.is_duplicate());
    }
    Ok((latency, written))
}

fn put_latency_json(h: &Histogram<u64>) -> serde_json::Value {
    let ms = |us: u64| us as f64 / 1000.0;
    let q = |q: f64| if h.is_empty() { 0.0 } else { ms(h.value_at_quantile(q)) };
    serde_json::json!({ "p50": q(0.5), "p99": q(0.99), "max": ms(h.max()) })
}

fn workload(args: &PerfArgs) -> Result<Workload, Failure> {
    if args.same_second {
        return Ok(Workload::SameSecond(0));
    }
    if args.same_millisecond {
        return Ok(Workload::SameMillisecond(0));
    }
    if let Some((a, b)) = args.levels {
        if a == 0 || b > 19 {
            return Err(Failure::Usage(format!("--levels {a}..{b}: levels run from 1 to 18")));
        }
        return Ok(Workload::Levels(a, b));
    }
    let (a, b) = args.delay_ms.unwrap_or((0, 10_000));
    Ok(Workload::DelayMs(a, b))
}

/// What consumers saw: lateness, of all and of the timers due after the
/// last put returned, the first and last delivery instants, and the CPU
/// seconds the consumers used.
struct Consumed {
    lateness: Histogram<u64>,
    after_puts: Histogram<u64>,
    first_last: Option<(Instant, Instant)>,
    cpu_secs: f64,
}

/// Joins the consumer threads: their lateness merged, the first first and the last last delivery.
fn join_consumers(
    consumers: Vec<std::thread::JoinHandle<Result<Consumed, String>>>,
) -> Result<Consumed, Failure> {
    let mut all = Consumed {
        lateness: lateness_histogram(),
        after_puts: lateness_histogram(),
        first_last: None,
        cpu_secs: 0.0,
    };
    for consumer in consumers {
        let seen = consumer.join().map_err(|_| "a consumer thread panicked")??;
        all.lateness.add(seen.lateness).map_err(|e| format!("merging lateness: {e}"))?;
        all.after_puts.add(seen.after_puts).map_err(|e| format!("merging lateness: {e}"))?;
        all.first_last = match (all.first_last, seen.first_last) {
            (Some((f, l)), Some((f2, l2))) => Some((f.min(f2), l.max(l2))),
            (one, other) => one.or(other),
        };
        all.cpu_secs += seen.cpu_secs;
    }
    Ok(all)
}

/// Consumes `queue` until told to stop.
fn consume(
    store: &Store,
    queue: u32,
    ledger: &Ledger,
    stop: &AtomicBool,
    last_seen_ms: &AtomicU64,
) -> Result<Consumed, String> {
    let mut consumer = store.consumer(TOPIC, queue).map_err(|e| e.to_string())?;
    let mut lateness = lateness_histogram();
    let mut after_puts = lateness_histogram();
    let mut first_last: Option<(Instant, Instant)> = None;
    while !stop.load(Ordering::Acquire) {
        let batch = consumer.poll(POLL_BATCH, Duration::from_millis(50)).map_err(|e| e.to_string())?;
        if batch.is_empty() {
            continue;
        }
        let now_ms = SystemClock.now_ms();
        let now = Instant::now();
        first_last = Some((first_last.map_or(now, |(first, _)| first), now));
        last_seen_ms.fetch_max(now_ms, Ordering::AcqRel);
        for m in &batch {
            let body = m.body();
            let id = u64::from_le_bytes(body[..8].try_into().map_err(|_| "short body")?);
            let due = m.deliver_at_ms().unwrap_or(m.store_time_ms());
            if now_ms < due || m.delivered_at_ms() < due {
                ledger.early.fetch_add(1, Ordering::AcqRel);
            }
            lateness.saturating_record(now_ms.saturating_sub(due));
            if due >= ledger.puts_done_ms.load(Ordering::Acquire) {
                after_puts.saturating_record(now_ms.saturating_sub(due));
            }
            ledger.last_delivered_ms.fetch_max(m.delivered_at_ms(), Ordering::AcqRel);
            ledger.deliver(id)?;
        }
        consumer.commit();
    }
    Ok(Consumed { lateness, after_puts, first_last, cpu_secs: thread_cpu::this_thread_secs() })
}

/// Waits until every acknowledged message is delivered, or the latest deliver
/// time plus the grace period has passed. Shows a progress line unless `quiet`.
fn wait_for_deliveries(ledger: &Ledger, acked: u64, latest_due_ms: u64, quiet: bool) {
    let deadline_ms = latest_due_ms + GRACE.as_millis() as u64;
    let mut last_line = Instant::now();
    loop {
        let delivered = ledger.delivered.load(Ordering::Acquire) + ledger.duplicated.load(Ordering::Acquire);
        let cancelled = ledger.cancelled_count.load(Ordering::Acquire);
        if ledger.delivered.load(Ordering::Acquire) + cancelled >= acked || SystemClock.now_ms() > deadline_ms
        {
            break;
        }
        if !quiet && last_line.elapsed() >= Duration::from_secs(1) {
            eprint!("\r  delivered {delivered} of {acked}   ");
            last_line = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if !quiet {
        eprintln!();
    }
}

/// Waits (up to 10 minutes) until every put is indexed: the dispatcher has
/// caught up and the wheel's refreshed gauges count every timer as pending or delivered.
/// Waits until the wheel holds every timer put and not cancelled
/// (`settled_by_puts`: puts minus this run's cancels, which count as
/// neither pending nor delivered), or 600 s.
fn wait_for_indexing(store: &Store, settled_by_puts: u64) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while Instant::now() < deadline {
        let stats = store.stats();
        if stats.dispatch_lag_bytes == 0 && stats.pending + stats.delivered >= settled_by_puts {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Bytes the timer index (wheel file plus used timer-log entries) takes, and per pending timer.
fn timer_index_bytes(dir: &std::path::Path, stats: &delaywheel::Stats) -> serde_json::Value {
    let wheel = std::fs::metadata(dir.join("timer").join("wheel")).map_or(0, |m| m.len());
    let allocated = disk_bytes(&dir.join("timer"));
    let per_pending = |bytes: u64| if stats.pending > 0 { bytes as f64 / stats.pending as f64 } else { 0.0 };
    // Used: the wheel file and the timer-log entries written (the last file is preallocated whole).
    let used = wheel + stats.timer_log_entries * 28;
    serde_json::json!({
        "wheel_file": wheel,
        "allocated": allocated,
        "allocated_per_pending_timer": per_pending(allocated),
        "used": used,
        "used_per_pending_timer": per_pending(used),
    })
}

pub(crate) fn print_report(report: &serde_json::Value, json: bool) {
    if !json {
        for (key, value) in report.as_object().into_iter().flatten() {
            println!("{key:>18}: {value}");
        }
        return;
    }
    println!("{report}");
}
