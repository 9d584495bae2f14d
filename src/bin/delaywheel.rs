//! `delaywheel`: the demo and the operator commands.
//!
//! `cargo run --release` runs `demo`. The timing wheel (delayed delivery) is
//! not built yet, so the demo today is the storage path alone: orders are put
//! as ordinary messages and consumed, and it reports what it measured.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use delaywheel::{Clock, Config, Message, Store, SystemClock};
use hdrhistogram::Histogram;

#[derive(Parser)]
#[command(name = "delaywheel", version, about = "An embedded, persistent delayed-message engine")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The order story: put orders, consume them, report counts and latency.
    Demo {
        /// Store directory (default: a temporary directory, removed at the end).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// How many orders to put.
        #[arg(long, default_value_t = 200_000)]
        orders: u64,
    },
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
    let result = match cli.command.unwrap_or(Command::Demo { dir: None, orders: 200_000 }) {
        Command::Demo { dir, orders } => demo(dir, orders),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A store directory: the given one, or a temporary one removed on drop.
fn store_dir(dir: Option<PathBuf>) -> std::io::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        Some(dir) => Ok((dir, None)),
        None => {
            let tmp = tempfile::Builder::new().prefix("delaywheel-demo-").tempdir()?;
            Ok((tmp.path().to_path_buf(), Some(tmp)))
        }
    }
}

fn demo(dir: Option<PathBuf>, orders: u64) -> Result<(), Box<dyn std::error::Error>> {
    let (dir, _tmp) = store_dir(dir)?;
    println!("delaywheel demo: an order stream through the commit log and consume queues");
    println!("store: {}", dir.display());
    println!("(delayed delivery arrives with the timing wheel; today every order is delivered at once)");
    let config = Config::new(&dir).with_queues_per_topic(4).with_segment_size(64 << 20);
    let store = Arc::new(Store::open(config)?);
    let clock = SystemClock;

    let done = Arc::new(AtomicBool::new(false));
    let consumers: Vec<_> = (0..4)
        .map(|queue| {
            let (store, done) = (Arc::clone(&store), Arc::clone(&done));
            std::thread::spawn(move || consume_queue(&store, queue, &done))
        })
        .collect();

    let started = Instant::now();
    for i in 0..orders {
        let body = format!("{{\"order\":{i},\"event\":\"created\",\"at\":{}}}", clock.now_ms());
        store.put(Message::new("OrderTopic", body).key(format!("order-{i}")).tags("created"))?;
        if i > 0 && i % (orders / 4).max(1) == 0 {
            println!("  put {i}/{orders} orders");
        }
    }
    let put_secs = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Release);
    let mut latency = Histogram::<u64>::new(3)?;
    let mut seen = vec![0u32; orders as usize];
    for consumer in consumers {
        let (ids, hist) = consumer.join().map_err(|_| "consumer thread panicked")??;
        for id in ids {
            *seen.get_mut(id as usize).ok_or("an order id nobody put")? += 1;
        }
        latency.add(hist)?;
    }
    let consumed: u64 = seen.iter().map(|&n| u64::from(n)).sum();
    let lost = seen.iter().filter(|&&n| n == 0).count();
    let duplicated: u64 = seen.iter().map(|&n| u64::from(n.saturating_sub(1))).sum();
    let total_secs = started.elapsed().as_secs_f64();
    let disk = store.disk_bytes();
    Arc::into_inner(store).ok_or("store still shared")?.close()?;

    println!("put       {orders} orders in {put_secs:.2} s ({:.0} orders/s)", orders as f64 / put_secs);
    println!("consumed  {consumed} orders in {total_secs:.2} s");
    println!("lost      {lost}");
    println!("duplicated {duplicated}");
    println!(
        "put-to-consume latency ms: p50 {} p99 {} p99.9 {} max {}",
        latency.value_at_quantile(0.5),
        latency.value_at_quantile(0.99),
        latency.value_at_quantile(0.999),
        latency.max()
    );
    println!("disk      {:.1} MiB of segment and queue files", disk as f64 / (1 << 20) as f64);
    if lost > 0 || duplicated > 0 {
        return Err(format!("{lost} orders lost, {duplicated} duplicated").into());
    }
    Ok(())
}

/// Consumes one queue until the producer is done and the queue is drained;
/// returns the order ids seen and a histogram of put-to-consume latency in ms.
fn consume_queue(store: &Store, queue: u32, done: &AtomicBool) -> Result<(Vec<u64>, Histogram<u64>), String> {
    let mut consumer = store.consumer_in_group("billing", "OrderTopic", queue).map_err(|e| e.to_string())?;
    let mut latency = Histogram::<u64>::new(3).expect("3 significant figures is valid");
    let mut ids = Vec::new();
    loop {
        let producer_done = done.load(Ordering::Acquire);
        let batch = consumer.poll(1024, Duration::from_millis(200)).map_err(|e| e.to_string())?;
        let now = SystemClock.now_ms();
        for m in &batch {
            latency.saturating_record(now.saturating_sub(m.store_time_ms()));
            let id = m.key().and_then(|k| k.strip_prefix("order-")).and_then(|n| n.parse().ok());
            ids.push(id.ok_or_else(|| format!("unexpected key {:?}", m.key()))?);
        }
        consumer.commit();
        if batch.is_empty() && producer_done {
            return Ok((ids, latency));
        }
    }
}
