//! `delaywheel`: the demo, the large-scale harness and the operator commands.
//! `cargo run --release` runs `demo`. Command-line contracts: `../shared/design.md` §6.

mod demo;
mod grpc_load;
mod grpc_soak;
mod ops;
mod pending;
mod perf;
mod retention_sim;
mod schedules;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Counts heap bytes, so `perf` can report its peak.
#[global_allocator]
static HEAP: peak_alloc::PeakAlloc = peak_alloc::PeakAlloc;

#[derive(Parser)]
#[command(name = "delaywheel", version, about = "An embedded, persistent delayed-message engine")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The order-timeout story: timed orders, a progress line, a lateness summary.
    Demo(demo::DemoArgs),
    /// Puts N timed messages, consumes every delivery, and reports.
    Perf(perf::PerfArgs),
    /// Opens a store, delivers until no timer is pending, prints a JSON summary.
    Drain(ops::DrainArgs),
    /// Opens a store (recovering it) without delivering, reports, closes it.
    Recover(ops::RecoverArgs),
    /// The pending timers of a store on disk due in [--from, --to), read-only.
    Pending(pending::PendingArgs),
    /// The active recurring schedules of a store on disk, read-only.
    Schedules(schedules::SchedulesArgs),
    /// The RocketMQ 5 gRPC endpoint and the HTTP endpoint over one store.
    Serve(serve::ServeArgs),
    /// Timed sends through a running `serve` from concurrent gRPC clients: rate and lateness.
    GrpcLoad(grpc_load::GrpcLoadArgs),
    /// Silent connections, long polls and a poison-sized message against a running `serve`.
    GrpcSoak(grpc_soak::GrpcSoakArgs),
    /// Weeks of steady traffic on a manual clock: what retention keeps and copies.
    RetentionSim(retention_sim::RetentionSimArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            let first = e.to_string().lines().next().unwrap_or("bad arguments").to_string();
            eprintln!("{first}");
            return ExitCode::from(2);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    let result = match cli.command.unwrap_or(Command::Demo(demo::DemoArgs::default())) {
        Command::Demo(args) => demo::run(args),
        Command::Perf(args) => perf::run(args),
        Command::Drain(args) => ops::drain(args),
        Command::Recover(args) => ops::recover(args),
        Command::Pending(args) => pending::run(args),
        Command::Schedules(args) => schedules::run(args),
        Command::RetentionSim(args) => retention_sim::run(args),
        Command::Serve(args) => serve::run(args),
        Command::GrpcLoad(args) => grpc_load::run(args),
        Command::GrpcSoak(args) => grpc_soak::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Run(message)) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Why a command failed: bad arguments (exit 2) or a failed run (exit 1).
pub enum Failure {
    Usage(String),
    Run(String),
}

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Run(e.to_string())
    }
}

/// A store directory: the given one (kept), or a temporary one removed on drop.
pub fn store_dir(
    dir: Option<PathBuf>,
    prefix: &str,
) -> std::io::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        Some(dir) => Ok((dir, None)),
        None => {
            let tmp = tempfile::Builder::new().prefix(prefix).tempdir()?;
            Ok((tmp.path().to_path_buf(), Some(tmp)))
        }
    }
}

/// Peak heap bytes since the process started.
pub fn heap_peak_bytes() -> u64 {
    HEAP.peak_usage() as u64
}

/// Peak resident set size, from `/proc/self/status` (0 where unavailable).
pub fn rss_peak_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Bytes allocated on disk under `dir`.
pub fn disk_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&entry.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// The lateness summary every report uses.
/// A histogram of lateness in ms: up to 1,000 hours, three significant digits.
/// (Explicit bounds: an auto-sized histogram clamps `saturating_record` to its
/// initial range, about 2 s, instead of growing.)
pub fn lateness_histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

pub fn lateness_json(h: &hdrhistogram::Histogram<u64>) -> serde_json::Value {
    let q = |q: f64| if h.is_empty() { 0 } else { h.value_at_quantile(q) };
    serde_json::json!({
        "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999), "max": h.max(),
    })
}
