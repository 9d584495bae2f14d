//! `delaywheel drain` and `delaywheel recover`: operator commands on an existing store.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use delaywheel::internals;
use delaywheel::internals::layout::Layout;
use delaywheel::{Config, RecoveryMode, RecoveryReport, Stats, Store};

use crate::Failure;

#[derive(Args, Debug)]
pub struct DrainArgs {
    #[arg(long)]
    dir: PathBuf,
    /// Give up (exit 1) if timers are still pending after this long.
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
    /// Deliver for this long, then close and report, pending or not (a
    /// store with recurring schedules never drains).
    #[arg(long, value_name = "S")]
    for_secs: Option<u64>,
    /// Refuse to open a store whose commit log is damaged (not a torn
    /// tail), instead of skipping the damaged records and going on.
    #[arg(long)]
    strict: bool,
}

#[derive(Args, Debug)]
pub struct RecoverArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    json: bool,
    /// Give up (exit 1) if the replay of the commit log takes longer than this.
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
    /// Refuse to open a store whose commit log is damaged (not a torn
    /// tail), instead of skipping the damaged records and going on.
    #[arg(long)]
    strict: bool,
}

/// A configuration with the segment size the commit log was made with, as
/// the library reads it off the oldest segment (indexes keep their own
/// files' sizes on their own), so the operator commands open any store.
fn config_for(dir: &Path, strict: bool) -> Config {
    let mode = if strict { RecoveryMode::Strict } else { RecoveryMode::Lenient };
    let config = Config::new(dir).with_recovery_mode(mode);
    match internals::segment_size_on_disk(&Layout::new(dir).commit_log()) {
        Some(size) => config.with_segment_size(size),
        None => config,
    }
}

fn existing_store(dir: &std::path::Path) -> Result<(), Failure> {
    if !Layout::new(dir).is_store() {
        return Err(Failure::Run(format!(
            "{} is not a delaywheel store (no commitlog/, no LOCK)",
            dir.display()
        )));
    }
    Ok(())
}

/// What a wait was for, said when it times out (from the stats then).
type Waiting<'a> = &'a dyn Fn(&Stats) -> String;

/// Fails with the store's poison reason once it stopped working, or with a
/// timeout past `deadline`: an operator's wait never outlives the store.
fn still_working(store: &Store, deadline: Instant, waiting: Waiting) -> Result<(), Failure> {
    store.health()?;
    if Instant::now() > deadline {
        return Err(Failure::Run(format!("timed out {}", waiting(&store.stats()))));
    }
    Ok(())
}

/// Waits until the dispatcher has indexed the whole log; returns when it did.
fn wait_caught_up(store: &Store, deadline: Instant, waiting: Waiting) -> Result<Instant, Failure> {
    while store.stats().dispatch_lag_bytes > 0 {
        still_working(store, deadline, waiting)?;
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(Instant::now())
}

/// Exact stats ([`Store::fresh_stats`]: everything put is indexed and the
/// wheel's gauges are refreshed), retried until `deadline`.
fn fresh_stats(store: &Store, deadline: Instant, waiting: Waiting) -> Result<Stats, Failure> {
    loop {
        match store.fresh_stats() {
            Ok(stats) => return Ok(stats),
            // Indexes behind, or the ticker waiting for disk space: wait, up to the deadline.
            Err(delaywheel::Error::Busy { .. } | delaywheel::Error::TickerBusy { .. }) => {
                still_working(store, deadline, waiting)?
            }
            Err(e) => return Err(e.into()),
        }
    }
}

pub fn drain(args: DrainArgs) -> Result<(), Failure> {
    existing_store(&args.dir)?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout_secs);
    let store = Store::open(config_for(&args.dir, args.strict))?;
    let waiting = |s: &Stats| format!("after {} s with {} timers pending", args.timeout_secs, s.pending);
    wait_caught_up(&store, deadline, &waiting)?;
    let at_start = fresh_stats(&store, deadline, &waiting)?;
    let mut stats = at_start.clone();
    let until = args.for_secs.map(|secs| Instant::now() + Duration::from_secs(secs));
    let deadline = until.map_or(deadline, |until| deadline.max(until));
    let working = |s: &Stats| match until {
        Some(until) => Instant::now() < until,
        None => s.pending > 0 || s.dispatch_lag_bytes > 0,
    };
    while working(&stats) {
        still_working(&store, deadline, &waiting)?;
        std::thread::sleep(Duration::from_millis(100));
        stats = fresh_stats(&store, deadline, &waiting)?;
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
        "quarantined": stats.quarantined,
        "damage": damage(&recovery, &stats),
    });
    println!("{report}");
    Ok(())
}

pub fn recover(args: RecoverArgs) -> Result<(), Failure> {
    existing_store(&args.dir)?;
    let started = Instant::now();
    let store = Store::open(config_for(&args.dir, args.strict).with_delivery(false))?;
    let opened = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout_secs);
    let waiting = |s: &Stats| {
        format!(
            "after {} s replaying the commit log ({} bytes to go)",
            args.timeout_secs, s.dispatch_lag_bytes
        )
    };
    let caught_up = wait_caught_up(&store, deadline, &waiting)?;
    let stats = fresh_stats(&store, deadline, &waiting)?;
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
        "quarantined": stats.quarantined,
        "damage": damage(&report, &stats),
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

/// What damage to the commit log cost: the stretches recovery marked
/// skipped, the ones the readers stepped over, and the segment headers
/// written again (all empty on an undamaged store).
fn damage(report: &RecoveryReport, stats: &Stats) -> serde_json::Value {
    serde_json::json!({
        "skipped_at_recovery": report.skipped.iter().map(|&(offset, len)| [offset, len]).collect::<Vec<_>>(),
        "spans_skipped_by_readers": stats.damaged_log_spans,
        "bytes_skipped_by_readers": stats.damaged_log_bytes,
        "repaired_segment_headers": report.repaired_headers,
    })
}
