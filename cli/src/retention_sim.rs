//! `delaywheel retention-sim`: weeks of steady traffic on a manual clock, to
//! measure what retention keeps on disk and what it copies. A fraction of
//! the timers lie years ahead: their segments are deleted long before they
//! fire, so they are relocated, once each.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use delaywheel::{Config, ManualClock, Message, Retention, Stats, Store};

use crate::{Failure, store_dir};

const TOPIC: &str = "SimTopic";
const HOUR_MS: u64 = 3_600_000;
const YEAR_MS: u64 = 365 * 24 * HOUR_MS;
/// The simulation's epoch: 2026-01-01T00:00:00Z.
const START_MS: u64 = 1_767_225_600_000;

#[derive(Args, Debug)]
pub struct RetentionSimArgs {
    /// Store directory (kept); default: a temporary one, removed at the end.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Simulated days of traffic.
    #[arg(long, default_value_t = 30)]
    days: u64,
    /// Messages put per simulated hour, spread evenly over it.
    #[arg(long, default_value_t = 2_000)]
    per_hour: u64,
    /// Percent of messages that are timers 1 to 10 years ahead (the rest: 1 s to 2 h).
    #[arg(long, default_value_t = 1.0)]
    far_percent: f64,
    /// Retention time in hours.
    #[arg(long, default_value_t = 72)]
    keep_hours: u64,
    #[arg(long, default_value_t = 4 << 20)]
    segment_size: u64,
    #[arg(long, default_value_t = 128)]
    body_bytes: usize,
    /// Entries per timer-log file (small, so reclaiming them shows in a month).
    #[arg(long, default_value_t = 1 << 16)]
    timer_log_file_entries: u64,
    /// Print the report as one JSON object on the last line.
    #[arg(long)]
    json: bool,
}

/// What the run measured.
#[derive(Default)]
struct Tally {
    messages: u64,
    far_timers: u64,
    /// Bytes of one message record (all are the same size).
    record_len: u64,
    delivered: u64,
    /// Largest commit log (segments plus relocated copies) seen after a retention pass.
    peak_log_bytes: u64,
    /// Largest store directory seen, every file included.
    peak_dir_bytes: u64,
}

pub fn run(args: RetentionSimArgs) -> Result<(), Failure> {
    if args.days == 0 || args.per_hour < 60 || !(0.0..=100.0).contains(&args.far_percent) {
        return Err(Failure::Usage("need --days > 0, --per-hour >= 60 and --far-percent in 0..=100".into()));
    }
    let (dir, _tmp) = store_dir(args.dir.clone(), "delaywheel-retention-")?;
    let clock = ManualClock::new(START_MS);
    let retention = Retention {
        keep_for: Some(Duration::from_secs(args.keep_hours * 3600)),
        max_log_bytes: None,
        check_interval: Duration::from_secs(3600),
    };
    let config = Config::new(&dir)
        .with_clock(clock.clone())
        .with_segment_size(args.segment_size)
        .with_timer_log_file_entries(args.timer_log_file_entries)
        .with_flush_interval(Duration::from_millis(5))
        .with_retention(retention);
    let store = Store::open(config)?;
    let started = Instant::now();
    let mut consumer = store.consumer(TOPIC, 0)?;
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let mut tally = Tally::default();
    let body = vec![b'x'; args.body_bytes];
    for hour in 0..args.days * 24 {
        let hour_end = delaywheel::Clock::now_ms(&clock) + HOUR_MS;
        put_hour(&store, &clock, &mut rng, &args, &body, &mut tally)?;
        clock.set_ms(hour_end);
        // Let the hour fire and the checkpoints vouch for it, consume what
        // fired, then reclaim: the pass sees what an hourly one would.
        wait_settled(&store, &clock, hour_end)?;
        tally.delivered += drain(&mut consumer)?;
        store.reclaim()?;
        let stats = store.stats();
        tally.peak_log_bytes = tally.peak_log_bytes.max(stats.disk.commit_log + stats.disk.relocated);
        tally.peak_dir_bytes = tally.peak_dir_bytes.max(crate::disk_bytes(&dir));
        if !args.json && hour % 24 == 23 {
            print_day(hour / 24 + 1, &stats, &dir);
        }
    }
    tally.delivered += drain(&mut consumer)?;
    let stats = store.stats();
    let copies = relocation_index(&dir)?;
    store.close()?;
    report(&args, &tally, &stats, &copies, started.elapsed());
    Ok(())
}

/// Puts one hour's messages, a minute's share at each minute.
fn put_hour(
    store: &Store,
    clock: &ManualClock,
    rng: &mut fastrand::Rng,
    args: &RetentionSimArgs,
    body: &[u8],
    tally: &mut Tally,
) -> Result<(), Failure> {
    let hour_start = delaywheel::Clock::now_ms(clock);
    let mut last_offset = None;
    for minute in 0..60 {
        let now = hour_start + minute * 60_000;
        clock.set_ms(now);
        for _ in 0..args.per_hour / 60 {
            let far = rng.f64() * 100.0 < args.far_percent;
            let deliver_at =
                if far { now + rng.u64(YEAR_MS..10 * YEAR_MS) } else { now + rng.u64(1_000..2 * HOUR_MS) };
            let receipt =
                store.put(Message::new(TOPIC, body.to_vec()).queue_id(0).deliver_at_ms(deliver_at))?;
            // Same topic, body and no key: every record has the same length,
            // the gap between two consecutive puts in one segment.
            if let Some(previous) = last_offset.replace(receipt.offset())
                && receipt.offset() > previous
                && receipt.offset() - previous < args.segment_size / 2
            {
                tally.record_len = receipt.offset() - previous;
            }
            tally.messages += 1;
            tally.far_timers += u64::from(far);
        }
    }
    Ok(())
}

/// Moves the clock on a second at a time until retention's floor has
/// reached the hour's end, so a pass deletes what the policy allows rather
/// than what a busy machine's threads got to. With the clock still, the
/// floor stops at the last wheel snapshot taken before the clock's last
/// step (the second loaded then names the log's end then): one more step
/// with nothing put lets it pass.
fn wait_settled(store: &Store, clock: &ManualClock, hour_end_ms: u64) -> Result<(), Failure> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let settled = store.stats().retention.settled_before_ms;
        if settled >= hour_end_ms {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let why = format!(
                "retention's floor stayed at {settled} ms for 60 s, the hour ending at {hour_end_ms} ms"
            );
            return Err(Failure::Run(why));
        }
        std::thread::sleep(Duration::from_millis(20));
        clock.set_ms(delaywheel::Clock::now_ms(clock) + 1000);
    }
}

fn drain(consumer: &mut delaywheel::Consumer) -> Result<u64, Failure> {
    let mut got = 0;
    loop {
        let batch = consumer.poll(10_000, Duration::from_millis(5))?;
        if batch.is_empty() {
            return Ok(got);
        }
        got += batch.len() as u64;
    }
}

/// (original offset) of every copy in `commitlog/relocated/index`, read as
/// `wheel-format.md` lays it out: strictly increasing means none was copied twice.
fn relocation_index(dir: &Path) -> Result<Vec<u64>, Failure> {
    let bytes = std::fs::read(dir.join("commitlog/relocated/index"))?;
    Ok(bytes
        .get(32..)
        .unwrap_or_default()
        .chunks_exact(32)
        .map(|entry| u64::from_le_bytes(entry[..8].try_into().expect("8 bytes")))
        .collect())
}

fn print_day(day: u64, stats: &Stats, dir: &Path) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "day {day:>3}: log {:.1} MiB, relocated {:.2} MiB, queues {:.1} MiB, timer index {:.1} MiB, dir {:.1} MiB",
        mib(stats.disk.commit_log),
        mib(stats.disk.relocated),
        mib(stats.disk.consume_queues),
        mib(stats.disk.timer_index),
        mib(crate::disk_bytes(dir)),
    );
}

fn report(args: &RetentionSimArgs, tally: &Tally, stats: &Stats, copies: &[u64], took: Duration) {
    let r = &stats.retention;
    let far_payload = tally.far_timers * tally.record_len;
    // What retention must keep: the messages of the retention time after
    // the last near timer of a segment fired (up to 2 h after its put), plus
    // the segment being filled, the one whose newest message is not yet old
    // enough, and one more for the hourly retention passes; and the far timers.
    let window_bytes = args.per_hour * (args.keep_hours + 2) * tally.record_len + 3 * args.segment_size;
    let copied_twice = copies.windows(2).filter(|w| w[0] >= w[1]).count();
    let json = serde_json::json!({
        "days": args.days,
        "messages": tally.messages,
        "delivered": tally.delivered,
        "record_bytes": tally.record_len,
        "far_timers": tally.far_timers,
        "far_payload_bytes": far_payload,
        "relocated_timers": r.relocated_timers,
        "relocated_bytes": r.relocated_bytes,
        "copied_twice": copied_twice,
        "segments_deleted": r.segments_deleted,
        "segments_deleted_unread": r.deleted_unread,
        "relocated_bytes_per_deleted_segment": r.relocated_bytes.checked_div(r.segments_deleted).unwrap_or(0),
        "queue_files_deleted": r.queue_files_deleted,
        "written_log_bytes": tally.messages * tally.record_len,
        "bound_log_bytes": window_bytes + far_payload,
        "peak_log_bytes": tally.peak_log_bytes,
        "final_log_bytes": stats.disk.commit_log,
        "final_relocated_bytes": stats.disk.relocated,
        "final_queue_bytes": stats.disk.consume_queues,
        "final_timer_index_bytes": stats.disk.timer_index,
        "peak_dir_bytes": tally.peak_dir_bytes,
        "wall_secs": took.as_secs_f64(),
    });
    if args.json {
        println!("{json}");
    } else {
        println!("{}", serde_json::to_string_pretty(&json).unwrap_or_default());
    }
}
