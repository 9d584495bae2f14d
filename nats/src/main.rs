//! `delaywheel-nats`: runs one node of the NATS JetStream delay tier.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use delaywheel_nats::TierConfig;

/// One node of the delay tier: leases partitions of the delay stream and
/// fires their timers to their target subjects.
#[derive(Parser)]
#[command(name = "delaywheel-nats", version)]
struct Args {
    /// NATS server URLs, comma-separated (any of the cluster's).
    #[arg(long, default_value = "nats://127.0.0.1:4222", value_delimiter = ',')]
    nats: Vec<String>,
    /// Where this node keeps the local stores of the partitions it owns.
    #[arg(long)]
    dir: PathBuf,
    /// This node's name, unique in the tier ([-_A-Za-z0-9]).
    #[arg(long)]
    node_id: String,
    /// The delay stream (created if absent); with --streams above 1, the
    /// streams' base name (STREAM-<i>).
    #[arg(long, default_value = "DELAY")]
    stream: String,
    /// The delay stream's subjects are PREFIX.<partition>.>.
    #[arg(long, default_value = "delay")]
    prefix: String,
    /// Partitions of the timers (every node must agree).
    #[arg(long, default_value_t = 8)]
    partitions: u32,
    /// Delay streams holding the partitions, named STREAM-<i> if more than
    /// one: each has a Raft leader of its own (every node must agree).
    #[arg(long, default_value_t = 1)]
    streams: u32,
    /// Replicas of the delay stream and the lease bucket.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// A lease not renewed for this long passes to another node.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
    /// The KV bucket of the leases.
    #[arg(long, default_value = "delaytier_leases")]
    lease_bucket: String,
    /// Fire timers only to targets starting with this (e.g. `orders.`);
    /// repeatable. Without it, any subject that is not reserved ($…, _INBOX.…,
    /// the tier's own).
    #[arg(long = "allow-target-prefix", value_name = "PREFIX")]
    allow_target_prefixes: Vec<String>,
    /// Timers that cannot be fired go to DEAD_LETTER.<partition>, with their reason.
    #[arg(long, default_value = delaywheel_nats::DEFAULT_DEAD_LETTER)]
    dead_letter: String,
    /// A timer whose target's stream keeps failing to acknowledge it for this
    /// long goes to the dead letter.
    #[arg(long, default_value_t = 60_000)]
    give_up_after_ms: u64,
    /// How long a producer's Nats-Msg-Id stands after its timer fired or was
    /// cancelled: a timer with it is dropped meanwhile (ms).
    #[arg(long, default_value_t = 86_400_000)]
    dedup_window_ms: u64,
    /// The KV bucket of the Nats-Msg-Ids of settled timers.
    #[arg(long, default_value = "delaytier_msg_ids")]
    dedup_bucket: String,
    /// How often an owner writes its partitions' checkpoints, from which the
    /// next owner takes a partition over without reading every timer (ms);
    /// 0: never (a takeover reads the partition whole).
    #[arg(long, default_value_t = 10_000)]
    checkpoint_every_ms: u64,
    /// The object store of the partitions' checkpoints.
    #[arg(long, default_value = "delaytier_checkpoints")]
    checkpoint_bucket: String,
    /// Take messages with NATS's Nats-Schedule headers published to
    /// SCHEDULES.> (no stream may capture them); empty: do not.
    #[arg(long, default_value = delaywheel_nats::DEFAULT_SCHEDULES)]
    schedules: String,
    /// Serve Prometheus metrics (delaytier_*) on this address, e.g. 127.0.0.1:9464.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut config = TierConfig::new(args.nats, args.dir, args.node_id);
    config.stream = args.stream;
    config.prefix = args.prefix;
    config.partitions = args.partitions;
    config.streams = args.streams;
    config.replicas = args.replicas;
    config.lease = Duration::from_millis(args.lease_ms);
    config.lease_bucket = args.lease_bucket;
    config.allow_target_prefixes = args.allow_target_prefixes;
    config.dead_letter = args.dead_letter;
    config.give_up_after = Duration::from_millis(args.give_up_after_ms);
    config.dedup_window = Duration::from_millis(args.dedup_window_ms);
    config.dedup_bucket = args.dedup_bucket;
    config.checkpoint_every = Duration::from_millis(args.checkpoint_every_ms);
    config.checkpoint_bucket = args.checkpoint_bucket;
    config.schedules = Some(args.schedules).filter(|s| !s.is_empty());
    if let Err(err) = config.validate() {
        eprintln!("delaywheel-nats: {err}");
        return ExitCode::from(2);
    }
    if let Some(addr) = args.metrics {
        let exporter =
            metrics_exporter_prometheus::PrometheusBuilder::new().with_http_listener(addr).install();
        if let Err(err) = exporter {
            eprintln!("delaywheel-nats: --metrics {addr}: {err}");
            return ExitCode::FAILURE;
        }
    }
    match delaywheel_nats::run(config, shutdown()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("delaywheel-nats: {err}");
            ExitCode::FAILURE
        }
    }
}

/// SIGINT or SIGTERM.
async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler can be installed");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
