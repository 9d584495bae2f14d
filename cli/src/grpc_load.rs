//! `delaywheel grpc-load`: timed sends through a running `delaywheel serve`
//! from concurrent gRPC clients, each received back and acked, with the
//! send rate and the end-to-end lateness (receive time minus deliver time).
//! `tools/grpc-load.sh` runs it beside `delaywheel perf` on the same workload.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use delaywheel_server::proto::messaging_service_client::MessagingServiceClient;
use delaywheel_server::proto::*;
use hdrhistogram::Histogram;
use tonic::transport::Channel;

use crate::Failure;

#[derive(Args, Debug)]
pub struct GrpcLoadArgs {
    /// The gRPC endpoint of `delaywheel serve`.
    #[arg(long, default_value = "127.0.0.1:8081")]
    endpoint: String,
    /// Timed messages to send.
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    /// Concurrent senders, each on its own connection.
    #[arg(long, default_value_t = 8)]
    senders: u64,
    /// Messages per SendMessage request.
    #[arg(long, default_value_t = 16)]
    batch: u64,
    /// Requests in flight per sender.
    #[arg(long, default_value_t = 4)]
    inflight: usize,
    /// Delays in ms, uniform in A..B (half-open).
    #[arg(long, default_value = "1000..3000", value_parser = crate::perf::parse_range)]
    delay_ms: (u64, u64),
    /// Offered messages per second over all senders (default: as fast as they go).
    #[arg(long)]
    rate: Option<f64>,
    /// Concurrent receivers of the consumer group.
    #[arg(long, default_value_t = 2)]
    receivers: u64,
    /// Body bytes.
    #[arg(long, default_value_t = 128)]
    body_bytes: usize,
    /// The topic (default: a new one per run, `GrpcLoad<ms>`); the group is `<topic>Group`.
    #[arg(long)]
    topic: Option<String>,
    /// How long a received message stays invisible before it comes back unless acked.
    #[arg(long, default_value_t = 300)]
    invisible_secs: i64,
    /// Only send (the timers stay pending): the send rate alone.
    #[arg(long)]
    no_receive: bool,
    /// Receive as the official PushConsumers do: each receiver a client of its
    /// own with its telemetry stream open, receiving with `auto_renew`, no
    /// invisible duration and no batch size (the server's 60 s and 32).
    #[arg(long, conflicts_with = "no_receive")]
    push: bool,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis() as u64
}

fn resource(name: &str) -> Option<Resource> {
    Some(Resource { resource_namespace: String::new(), name: name.to_string() })
}

async fn connect(endpoint: &str) -> Result<MessagingServiceClient<Channel>, Failure> {
    let client = MessagingServiceClient::connect(format!("http://{endpoint}")).await?;
    Ok(client.max_decoding_message_size(64 << 20))
}

pub fn run(args: GrpcLoadArgs) -> Result<(), Failure> {
    if args.senders == 0 || args.batch == 0 || args.inflight == 0 || args.receivers == 0 {
        return Err(Failure::Usage("--senders, --batch, --inflight and --receivers are at least 1".into()));
    }
    if args.delay_ms.0 >= args.delay_ms.1 {
        return Err(Failure::Usage(format!("--delay-ms {}..{} is empty", args.delay_ms.0, args.delay_ms.1)));
    }
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(load(args))
}

/// What the receivers saw.
struct Seen {
    lateness_ms: Histogram<u64>,
    ids: HashSet<u64>,
    duplicates: u64,
    early: u64,
}

async fn load(args: GrpcLoadArgs) -> Result<(), Failure> {
    let args = Arc::new(args);
    let topic = args.topic.clone().unwrap_or_else(|| format!("GrpcLoad{}", now_ms()));
    let group = format!("{topic}Group");
    let mut client = connect(&args.endpoint).await?;
    let heartbeat =
        HeartbeatRequest { group: resource(&group), client_type: ClientType::SimpleConsumer as i32 };
    client.heartbeat(heartbeat).await?;

    let sent_all = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let mut receivers = Vec::new();
    for receiver in 0..if args.no_receive { 0 } else { args.receivers } {
        let (args, topic, group) = (Arc::clone(&args), topic.clone(), group.clone());
        let (sent_all, received) = (Arc::clone(&sent_all), Arc::clone(&received));
        let mut client = connect(&args.endpoint).await?;
        let client_id = format!("grpc-load-{}-{receiver}", std::process::id());
        // A PushConsumer's messages are renewed while its telemetry stream is open.
        let telemetry =
            if args.push { Some(open_telemetry(&mut client, &client_id, &group).await?) } else { None };
        receivers.push(tokio::spawn(async move {
            let seen = receive(client, args, topic, group, &client_id, sent_all, received).await;
            drop(telemetry);
            seen
        }));
    }

    let started = Instant::now();
    let mut senders = Vec::new();
    for sender in 0..args.senders {
        let (args, topic) = (Arc::clone(&args), topic.clone());
        let client = connect(&args.endpoint).await?;
        senders.push(tokio::spawn(send(client, args, topic, sender)));
    }
    for sender in senders {
        sender.await.map_err(|e| Failure::Run(e.to_string()))??;
    }
    let send_secs = started.elapsed().as_secs_f64();
    sent_all.store(true, Ordering::Release);

    let mut seen = Seen {
        lateness_ms: Histogram::new(3).expect("3 digits"),
        ids: HashSet::new(),
        duplicates: 0,
        early: 0,
    };
    for receiver in receivers {
        let part = receiver.await.map_err(|e| Failure::Run(e.to_string()))??;
        seen.lateness_ms.add(&part.lateness_ms).expect("same bounds");
        seen.duplicates +=
            part.duplicates + part.ids.iter().filter(|id| seen.ids.contains(id)).count() as u64;
        seen.early += part.early;
        seen.ids.extend(part.ids);
    }
    let h = &seen.lateness_ms;
    let report = serde_json::json!({
        "endpoint": args.endpoint,
        "messages": args.messages,
        "senders": args.senders,
        "batch": args.batch,
        "inflight": args.inflight,
        "rate": args.rate,
        "send_secs": send_secs,
        "sends_per_sec": args.messages as f64 / send_secs,
        "received": seen.ids.len(),
        "lost": if args.no_receive { 0 } else { args.messages - seen.ids.len() as u64 },
        "duplicated": seen.duplicates,
        "early": seen.early,
        "lateness_ms": {
            "p50": h.value_at_quantile(0.5), "p90": h.value_at_quantile(0.9),
            "p99": h.value_at_quantile(0.99), "max": h.max(),
        },
    });
    if args.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// One sender's share: batches of timed messages, `inflight` requests at a time.
async fn send(
    client: MessagingServiceClient<Channel>,
    args: Arc<GrpcLoadArgs>,
    topic: String,
    sender: u64,
) -> Result<(), Failure> {
    let share = args.messages / args.senders + u64::from(sender < args.messages % args.senders);
    let body = vec![b'x'; args.body_bytes];
    let interval =
        args.rate.map(|rate| Duration::from_secs_f64(args.batch as f64 * args.senders as f64 / rate));
    let started = Instant::now();
    let mut in_flight = tokio::task::JoinSet::new();
    let mut rng = fastrand::Rng::with_seed(sender);
    let mut next = 0;
    let mut batch_no = 0u32;
    while next < share {
        if let Some(interval) = interval {
            tokio::time::sleep_until((started + interval * batch_no).into()).await;
        }
        batch_no += 1;
        let count = args.batch.min(share - next);
        let messages = (next..next + count)
            .map(|i| {
                let id = sender << 40 | i;
                let due = now_ms() + rng.u64(args.delay_ms.0..args.delay_ms.1);
                Message {
                    topic: resource(&topic),
                    user_properties: Default::default(),
                    system_properties: Some(SystemProperties {
                        message_id: id.to_string(),
                        message_type: MessageType::Delay as i32,
                        delivery_timestamp: Some(prost_types::Timestamp {
                            seconds: (due / 1000) as i64,
                            nanos: ((due % 1000) * 1_000_000) as i32,
                        }),
                        body_encoding: Encoding::Identity as i32,
                        ..Default::default()
                    }),
                    body: body.clone(),
                }
            })
            .collect();
        next += count;
        if in_flight.len() >= args.inflight {
            in_flight.join_next().await.expect("not empty").map_err(|e| Failure::Run(e.to_string()))??;
        }
        let mut client = client.clone();
        in_flight.spawn(async move {
            let answer = client.send_message(SendMessageRequest { messages }).await?.into_inner();
            match answer.status {
                Some(s) if s.code == Code::Ok as i32 => Ok(()),
                s => Err(Failure::Run(format!("send refused: {s:?}"))),
            }
        });
    }
    while let Some(done) = in_flight.join_next().await {
        done.map_err(|e| Failure::Run(e.to_string()))??;
    }
    Ok(())
}

/// A request from the client `client_id`, as the official clients mark theirs.
fn from<T>(client_id: &str, message: T) -> Result<tonic::Request<T>, Failure> {
    let mut request = tonic::Request::new(message);
    let id = client_id.parse().map_err(|_| Failure::Run(format!("{client_id:?} is not a header value")))?;
    request.metadata_mut().insert("x-mq-client-id", id);
    Ok(request)
}

/// Opens `client_id`'s telemetry stream with a PushConsumer's settings for
/// `group`, and waits for the answer; the stream stays open while the returned sender lives.
async fn open_telemetry(
    client: &mut MessagingServiceClient<Channel>,
    client_id: &str,
    group: &str,
) -> Result<tokio::sync::mpsc::Sender<TelemetryCommand>, Failure> {
    let settings = Settings {
        client_type: Some(ClientType::PushConsumer as i32),
        pub_sub: Some(settings::PubSub::Subscription(Subscription {
            group: resource(group),
            ..Default::default()
        })),
        ..Default::default()
    };
    let command =
        TelemetryCommand { status: None, command: Some(telemetry_command::Command::Settings(settings)) };
    let (commands, outbound) = tokio::sync::mpsc::channel(1);
    commands.send(command).await.map_err(|_| Failure::Run("telemetry: closed at once".into()))?;
    let request = from(client_id, tokio_stream::wrappers::ReceiverStream::new(outbound))?;
    let mut replies = client.telemetry(request).await?.into_inner();
    replies.message().await?.ok_or_else(|| Failure::Run("telemetry: no settings answer".into()))?;
    // Replies are read (and dropped) so the server's side of the stream never waits.
    tokio::spawn(async move { while let Ok(Some(_)) = replies.message().await {} });
    Ok(commands)
}

/// Receives and acks until everything sent came or nothing came for a while after the last send.
async fn receive(
    mut client: MessagingServiceClient<Channel>,
    args: Arc<GrpcLoadArgs>,
    topic: String,
    group: String,
    client_id: &str,
    sent_all: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
) -> Result<Seen, Failure> {
    let mut seen = Seen {
        lateness_ms: Histogram::new(3).expect("3 digits"),
        ids: HashSet::new(),
        duplicates: 0,
        early: 0,
    };
    let quiet_limit = Duration::from_millis(args.delay_ms.1 + 10_000);
    let mut quiet_since = Instant::now();
    while received.load(Ordering::Acquire) < args.messages {
        if sent_all.load(Ordering::Acquire) && quiet_since.elapsed() > quiet_limit {
            break;
        }
        let invisible = prost_types::Duration { seconds: args.invisible_secs, nanos: 0 };
        let request = ReceiveMessageRequest {
            group: resource(&group),
            message_queue: Some(MessageQueue { topic: resource(&topic), ..Default::default() }),
            filter_expression: None,
            batch_size: if args.push { 0 } else { 1024 },
            invisible_duration: (!args.push).then_some(invisible),
            auto_renew: args.push,
            long_polling_timeout: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
            attempt_id: None,
        };
        let mut stream = client.receive_message(from(client_id, request)?).await?.into_inner();
        let mut entries = Vec::new();
        while let Some(answer) = stream.message().await? {
            let Some(receive_message_response::Content::Message(m)) = answer.content else { continue };
            let at = now_ms();
            let system = m.system_properties.unwrap_or_default();
            let due =
                system.delivery_timestamp.map_or(0, |t| t.seconds as u64 * 1000 + t.nanos as u64 / 1_000_000);
            if at < due {
                seen.early += 1;
            }
            seen.lateness_ms.saturating_record(at.saturating_sub(due));
            let id: u64 = system.message_id.parse().unwrap_or(u64::MAX);
            if !seen.ids.insert(id) {
                seen.duplicates += 1;
            } else {
                received.fetch_add(1, Ordering::AcqRel);
            }
            entries.push(AckMessageEntry {
                message_id: system.message_id,
                receipt_handle: system.receipt_handle.unwrap_or_default(),
            });
        }
        if entries.is_empty() {
            continue;
        }
        quiet_since = Instant::now();
        let ack =
            from(client_id, AckMessageRequest { group: resource(&group), topic: resource(&topic), entries })?;
        let mut acker = client.clone();
        // Acks go on while the next receive waits.
        tokio::spawn(async move { acker.ack_message(ack).await });
    }
    Ok(seen)
}
