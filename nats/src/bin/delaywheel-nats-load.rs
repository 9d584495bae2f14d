//! `delaywheel-nats-load`: timed messages through the delay tier, or the same
//! workload through NATS's own message schedules (`Nats-Schedule`, one
//! subject per message), measured the same way: each fired message's stored
//! time in its target stream minus its due time. `tools/nats-load.sh` runs
//! both against one local cluster in one sitting.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull, stream};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use delaywheel_nats::{Layout, TierClient};
use futures::StreamExt;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Through the delay tier (its nodes must be running).
    Tier,
    /// Through JetStream message schedules (nats-server 2.12+).
    Schedule,
}

impl Mode {
    /// Its name in the reports.
    fn name(self) -> &'static str {
        match self {
            Mode::Tier => "tier",
            Mode::Schedule => "nats-schedule",
        }
    }
}

#[derive(Parser)]
#[command(name = "delaywheel-nats-load")]
struct Args {
    /// NATS server URLs, comma-separated.
    #[arg(long, default_value = "nats://127.0.0.1:4222", value_delimiter = ',')]
    nats: Vec<String>,
    #[arg(long, value_enum, default_value = "tier")]
    mode: Mode,
    /// Timed messages to send.
    #[arg(long, default_value_t = 100_000)]
    messages: usize,
    /// Delays, ms after the send starts, half-open A..B, spread evenly.
    #[arg(long, default_value = "2000..10000")]
    delay_ms: String,
    /// `--messages` recurring schedules instead of one-shot timers, each on
    /// its own subject, e.g. "@every 10s" or "*/10 * * * * *", watched for
    /// `--run-secs`: the same `Nats-Schedule` messages published to a stream
    /// that runs NATS's schedules (nats-server 2.14+), or to the tier's
    /// schedule intake (`schedules.>`).
    #[arg(long)]
    recurring: Option<String>,
    /// With `--recurring`: how long to watch the fires after the schedules are made.
    #[arg(long, default_value_t = 60)]
    run_secs: u64,
    /// Replicas of the streams the tool makes (1 on a single server).
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// The tier's partitions (as its nodes were started).
    #[arg(long, default_value_t = 8)]
    partitions: u32,
    /// The tier's delay streams (as its nodes were started).
    #[arg(long, default_value_t = 1)]
    streams: u32,
    /// Sends in flight.
    #[arg(long, default_value_t = 256)]
    inflight: usize,
    /// Tier mode: also this many timers with hostile targets (the JetStream
    /// API purging the target stream, a subject no stream captures, an
    /// invalid subject), published raw ahead of the good ones and due first;
    /// each must reach the dead-letter subject and hold up nothing.
    #[arg(long, default_value_t = 0)]
    bad_targets: usize,
    /// The tier nodes' dead-letter subject prefix (their `--dead-letter`).
    #[arg(long, default_value = "delaytier.dead")]
    dead_letter: String,
    /// Publish the timers and report how fast, without waiting for them to
    /// fire (e.g. to leave a partition holding many pending timers).
    #[arg(long, conflicts_with = "recurring")]
    no_wait: bool,
}

/// The hostile targets `--bad-targets` cycles through.
const BAD_TARGETS: [&str; 3] = ["$JS.API.STREAM.PURGE.OUT", "nostream.x", "bad subject"];

#[derive(Default)]
struct Tally {
    seen: HashMap<u64, u32>,
    lateness: Vec<i64>,
    early: u64,
    first_ms: Option<i64>,
    last_ms: i64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let Some((lo, hi)) =
        args.delay_ms.split_once("..").and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
    else {
        eprintln!("delaywheel-nats-load: --delay-ms {:?}: expected A..B in ms", args.delay_ms);
        return ExitCode::from(2);
    };
    if lo >= hi || args.messages == 0 {
        eprintln!("delaywheel-nats-load: --delay-ms must be A..B with A < B, and --messages at least 1");
        return ExitCode::from(2);
    }
    match run(&args, lo, hi).await {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("delaywheel-nats-load: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args, lo: u64, hi: u64) -> Result<serde_json::Value, async_nats::Error> {
    if let Some(recurring) = &args.recurring {
        return run_recurring(args, recurring).await;
    }
    let client = async_nats::connect(args.nats.clone()).await?;
    let js = jetstream::new(client.clone());
    let (target_stream, target) = match args.mode {
        Mode::Tier => ("OUT", "out.load"),
        Mode::Schedule => ("SCHED", "sched.out"),
    };
    prepare(&js, args.mode, args.replicas).await?;
    let mut arrivals = arrivals(&js, target_stream, target).await?;

    let start_ms = now_ms();
    let due = |i: usize| start_ms + lo + (i as u64 * 7_919) % (hi - lo);
    let mut dead_letters = client.subscribe(format!("{}.>", args.dead_letter)).await?;
    for i in 0..args.bad_targets {
        let mut headers = HeaderMap::new();
        headers.insert("Delay-At", start_ms.to_string().as_str());
        headers.insert("Delay-Target", BAD_TARGETS[i % BAD_TARGETS.len()]);
        let subject = format!("delay.{}.bad", i as u32 % args.partitions);
        js.publish_with_headers(subject, headers, Bytes::from("bad")).await?.await?;
    }
    let sent = Instant::now();
    let tier = match args.mode {
        Mode::Tier => {
            let layout = Layout::new("DELAY", "delay", args.partitions).with_streams(args.streams);
            Some(TierClient::with_layout(client.clone(), layout).await?)
        }
        Mode::Schedule => None,
    };
    let sends = (0..args.messages).map(|i| {
        let (js, tier) = (&js, &tier);
        async move {
            let payload = Bytes::from(i.to_string());
            match tier {
                Some(tier) => tier
                    .schedule(&i.to_string(), target, due(i), payload)
                    .await
                    .map(|_| ())
                    .map_err(Into::into),
                None => schedule_in_nats(js, i, target, due(i), payload).await,
            }
        }
    });
    let results: Vec<Result<(), async_nats::Error>> =
        futures::stream::iter(sends).buffer_unordered(args.inflight).collect().await;
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    let enqueue_secs = sent.elapsed().as_secs_f64();
    if args.no_wait {
        return Ok(serde_json::json!({
            "mode": args.mode.name(),
            "messages": args.messages,
            "enqueue_per_sec": args.messages as f64 / enqueue_secs,
            "waited": false,
        }));
    }

    let mut tally = Tally::default();
    let deadline = Instant::now() + Duration::from_millis(hi) + Duration::from_secs(60);
    while tally.seen.len() < args.messages {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(message)) = tokio::time::timeout(left, arrivals.next()).await else { break };
        let message = message?;
        let id: u64 = std::str::from_utf8(&message.payload)?.parse()?;
        let stored = (message.info()?.published.unix_timestamp_nanos() / 1_000_000) as i64;
        let late = stored - due(id as usize) as i64;
        if late < 0 {
            tally.early += 1;
        }
        tally.lateness.push(late);
        tally.first_ms.get_or_insert(stored);
        tally.last_ms = stored;
        *tally.seen.entry(id).or_default() += 1;
    }
    let mut dead_lettered = 0;
    while dead_lettered < args.bad_targets {
        match tokio::time::timeout(Duration::from_secs(10), dead_letters.next()).await {
            Ok(Some(_)) => dead_lettered += 1,
            _ => break,
        }
    }
    let mut report = report(args, enqueue_secs, start_ms + lo, &mut tally);
    if args.bad_targets > 0 {
        let kept = js.get_stream(target_stream).await?.info().await?.state.messages;
        report["bad_targets"] = args.bad_targets.into();
        report["dead_lettered"] = dead_lettered.into();
        report["target_stream_messages"] = kept.into();
    }
    Ok(report)
}

/// `--recurring`: makes the schedules, then reads their fires for `--run-secs`.
async fn run_recurring(args: &Args, spec: &str) -> Result<serde_json::Value, async_nats::Error> {
    let client = async_nats::connect(args.nats.clone()).await?;
    let js = jetstream::new(client.clone());
    prepare(&js, args.mode, args.replicas).await?;
    // The same message either way; only where it is published differs, and
    // the name the occurrences give the next instant.
    let (stream, target, subject, next_header) = match args.mode {
        Mode::Schedule => ("SCHED", "sched.rout", "sched.r", "Nats-Schedule-Next"),
        Mode::Tier => ("OUT", "out.rout", "schedules.r", "Delay-Schedule-Next"),
    };
    let mut arrivals = arrivals(&js, stream, target).await?;
    let sent = Instant::now();
    let creates = (0..args.messages).map(|i| {
        let js = &js;
        async move {
            let mut headers = HeaderMap::new();
            headers.insert("Nats-Schedule", spec);
            headers.insert("Nats-Schedule-Target", target);
            js.publish_with_headers(format!("{subject}.{i}"), headers, Bytes::from(i.to_string()))
                .await?
                .await?;
            Ok::<_, async_nats::Error>(())
        }
    });
    let results: Vec<_> = futures::stream::iter(creates).buffer_unordered(args.inflight).collect().await;
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    let create_secs = sent.elapsed().as_secs_f64();
    // Each fire names the next instant (NATS's `Nats-Schedule-Next` in whole
    // seconds, the tier's `Delay-Schedule-Next` in ms): a schedule's later
    // fires are measured against what its previous one announced; its first
    // (made at the creation's second) is only counted.
    let mut next_of: HashMap<u64, i64> = HashMap::new();
    let (mut lateness, mut early, mut fires) = (Vec::new(), 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(args.run_secs);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(message)) = tokio::time::timeout(left, arrivals.next()).await else { break };
        let message = message?;
        let id: u64 = std::str::from_utf8(&message.payload)?.parse()?;
        let stored = (message.info()?.published.unix_timestamp_nanos() / 1_000_000) as i64;
        fires += 1;
        if let Some(due) = next_of.get(&id) {
            early += u64::from(stored < *due);
            lateness.push(stored - due);
        }
        let next = message.headers.as_ref().and_then(|h| h.get(next_header));
        match next
            .map(|v| time::OffsetDateTime::parse(v.as_str(), &time::format_description::well_known::Rfc3339))
        {
            Some(Ok(at)) => next_of.insert(id, (at.unix_timestamp_nanos() / 1_000_000) as i64),
            _ => next_of.remove(&id),
        };
    }
    lateness.sort_unstable();
    let at =
        |q: f64| lateness.get(((lateness.len() as f64 * q) as usize).min(lateness.len().saturating_sub(1)));
    Ok(serde_json::json!({
        "mode": args.mode.name(),
        "recurrence": spec,
        "schedules": args.messages,
        "create_per_sec": args.messages as f64 / create_secs,
        "run_secs": args.run_secs,
        "fires": fires,
        "fires_per_sec": fires as f64 / args.run_secs as f64,
        "measured": lateness.len(),
        "early": early,
        "lateness_ms": { "p50": at(0.5), "p99": at(0.99), "max": lateness.last() },
    }))
}

/// What arrives on `subject` of `stream` from now on.
async fn arrivals(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
) -> Result<pull::Ordered, async_nats::Error> {
    let reader = js
        .get_stream(stream)
        .await?
        .create_consumer(pull::OrderedConfig {
            filter_subject: subject.into(),
            deliver_policy: DeliverPolicy::New,
            ..Default::default()
        })
        .await?;
    Ok(reader.messages().await?)
}

/// Makes the target stream (and, for schedules, the stream that holds them).
async fn prepare(js: &jetstream::Context, mode: Mode, replicas: usize) -> Result<(), async_nats::Error> {
    let config = match mode {
        Mode::Tier => stream::Config {
            name: "OUT".into(),
            subjects: vec!["out.>".into()],
            num_replicas: replicas,
            ..Default::default()
        },
        // A schedule and its target must be in one stream.
        Mode::Schedule => stream::Config {
            name: "SCHED".into(),
            subjects: vec!["sched.>".into()],
            num_replicas: replicas,
            allow_message_schedules: true,
            allow_rollup: true,
            ..Default::default()
        },
    };
    js.get_or_create_stream(config).await?;
    Ok(())
}

/// One schedule per message, on its own subject (a subject holds one schedule).
async fn schedule_in_nats(
    js: &jetstream::Context,
    i: usize,
    target: &str,
    due_ms: u64,
    payload: Bytes,
) -> Result<(), async_nats::Error> {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(due_ms as i128 * 1_000_000)?
        .format(&time::format_description::well_known::Rfc3339)?;
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Schedule", format!("@at {at}").as_str());
    headers.insert("Nats-Schedule-Target", target);
    js.publish_with_headers(format!("sched.t.{i}"), headers, payload).await?.await?;
    Ok(())
}

fn report(args: &Args, enqueue_secs: f64, first_due_ms: u64, tally: &mut Tally) -> serde_json::Value {
    tally.lateness.sort_unstable();
    let at = |q: f64| {
        tally
            .lateness
            .get(((tally.lateness.len() as f64 * q) as usize).min(tally.lateness.len().saturating_sub(1)))
    };
    let delivered = tally.seen.len();
    let duplicated: u32 = tally.seen.values().map(|&n| n - 1).sum();
    let spread_secs = (tally.last_ms - first_due_ms as i64).max(1) as f64 / 1e3;
    serde_json::json!({
        "mode": args.mode.name(),
        "messages": args.messages,
        "delay_ms": args.delay_ms,
        "enqueue_secs": enqueue_secs,
        "enqueue_per_sec": args.messages as f64 / enqueue_secs,
        "delivered": delivered,
        "lost": args.messages - delivered,
        "duplicated": duplicated,
        "early": tally.early,
        "deliver_per_sec": delivered as f64 / spread_secs,
        "lateness_ms": { "p50": at(0.5), "p99": at(0.99), "max": tally.lateness.last() },
    })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
