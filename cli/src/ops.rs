//! `delaywheel drain` and `delaywheel recover`: operator commands on an existing store.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use delaywheel::internals::layout::Layout;
use delaywheel::internals::{self, COMMITLOG_MAGIC, CONSUME_QUEUE_MAGIC, FileHeader, TIMER_LOG_MAGIC};
use delaywheel::{Config, Stats, Store};

use crate::Failure;

#[derive(Args, Debug)]
pub struct DrainArgs {
    #[arg(long)]
    dir: PathBuf,
    /// Give up (exit 1) if timers are still pending after this long.
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
}

#[derive(Args, Debug)]
pub struct RecoverArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    json: bool,
}

/// A configuration with the sizes the store's files were made with, read
/// from their headers (a store opened with other sizes is refused), so the
/// operator commands open any store.
fn config_for(dir: &Path) -> Config {
    let first_header = |files_dir: &Path, magic: [u8; 8]| -> Option<u64> {
        let mut numbered: Vec<PathBuf> = std::fs::read_dir(files_dir)
            .ok()?
            .flatten()
            .filter(|e| internals::parse_numbered_file_name(&e.file_name().to_string_lossy()).is_some())
            .map(|e| e.path())
            .collect();
        numbered.sort();
        let mut header = [0u8; internals::FILE_HEADER_LEN];
        std::fs::File::open(numbered.first()?).ok()?.read_exact(&mut header).ok()?;
        FileHeader::decode(&header, magic).ok().map(|h| h.a)
    };
    let layout = Layout::new(dir);
    let first_queue_dir = || -> Option<PathBuf> {
        let topic = std::fs::read_dir(layout.consume_queues()).ok()?.flatten().next()?.path();
        Some(std::fs::read_dir(topic).ok()?.flatten().next()?.path())
    };
    let mut config = Config::new(dir);
    if let Some(size) = first_header(&layout.commit_log(), COMMITLOG_MAGIC) {
        config = config.with_segment_size(size);
    }
    let timer_log = |log: usize| first_header(&layout.timer_log(log), TIMER_LOG_MAGIC);
    if let Some(entries) = timer_log(0).or_else(|| timer_log(1)) {
        config = config.with_timer_log_file_entries(entries);
    }
    if let Some(entries) = first_queue_dir().and_then(|q| first_header(&q, CONSUME_QUEUE_MAGIC)) {
        config = config.with_queue_file_entries(entries);
    }
    config
}

fn existing_store(dir: &std::path::Path) -> Result<(), Failure> {
    if !Layout::new(dir).commit_log().is_dir() {
        return Err(Failure::Run(format!("{} is not a delaywheel store (no commitlog/)", dir.display())));
    }
    Ok(())
}

/// Waits until the dispatcher has indexed the whole log; returns when it did.
fn wait_caught_up(store: &Store, deadline: Instant) -> Result<Instant, Failure> {
    loop {
        if store.stats().dispatch_lag_bytes == 0 {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            return Err(Failure::Run("timed out replaying the commit log".into()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Stats refreshed at least twice after `since` (the wheel's gauges lag by up to a second).
fn fresh_stats(store: &Store) -> Stats {
    let since = store.stats().refreshes;
    loop {
        let stats = store.stats();
        if stats.refreshes >= since + 2 {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn drain(args: DrainArgs) -> Result<(), Failure> {
    existing_store(&args.dir)?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout_secs);
    let store = Store::open(config_for(&args.dir))?;
    wait_caught_up(&store, deadline)?;
    let at_start = fresh_stats(&store);
    let mut stats = at_start.clone();
    while stats.pending > 0 || stats.dispatch_lag_bytes > 0 {
        if Instant::now() > deadline {
            return Err(Failure::Run(format!(
                "timed out after {} s with {} timers pending",
                args.timeout_secs, stats.pending
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
        stats = fresh_stats(&store);
    }
    let recovery = store.recovery_report().clone();
    store.close()?;
    let report = serde_json::json!({
        "delivered": stats.delivered,
        "pending_at_start": at_start.pending,
        "pending": stats.pending,
        "seconds": started.elapsed().as_secs_f64(),
        "lateness_ms": {
            "p50": stats.lateness_ms.p50, "p90": stats.lateness_ms.p90, "p99": stats.lateness_ms.p99,
            "p999": stats.lateness_ms.p999, "max": stats.lateness_ms.max,
        },
        "recovered_end": recovery.end,
        "truncated_bytes": recovery.truncated_bytes,
    });
    println!("{report}");
    Ok(())
}

pub fn recover(args: RecoverArgs) -> Result<(), Failure> {
    existing_store(&args.dir)?;
    let started = Instant::now();
    let store = Store::open(config_for(&args.dir).with_delivery(false))?;
    let opened = Instant::now();
    let caught_up = wait_caught_up(&store, started + Duration::from_secs(3600))?;
    let stats = fresh_stats(&store);
    let report = store.recovery_report().clone();
    store.close()?;
    let json = serde_json::json!({
        "recovery_ms": caught_up.duration_since(started).as_secs_f64() * 1000.0,
        "open_ms": opened.duration_since(started).as_secs_f64() * 1000.0,
        "pending": stats.pending,
        "truncated_bytes": report.truncated_bytes,
        "torn_at": report.torn_at,
        "scanned_bytes": report.scanned_bytes,
        "end": report.end,
        "discarded_segments": report.discarded.len(),
    });
    if args.json {
        println!("{json}");
    } else {
        for (key, value) in json.as_object().into_iter().flatten() {
            println!("{key:>18}: {value}");
        }
    }
    Ok(())
}
