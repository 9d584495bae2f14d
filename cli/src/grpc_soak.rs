//! `delaywheel grpc-soak`: the hostile half of a soak against a running
//! `delaywheel serve`, all on loopback and bounded in count and time:
//! silent connections to both endpoints, many long polls of one group, and a
//! message whose properties leave no room for its retry copy. It reports
//! what the server did with each, and its health at the end.
//! `tools/serve-soak.sh` runs it beside `delaywheel grpc-load`, whose good
//! messages must each be delivered once meanwhile.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Args;
use delaywheel_server::proto::messaging_service_client::MessagingServiceClient;
use delaywheel_server::proto::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::Failure;

#[derive(Args, Debug)]
pub struct GrpcSoakArgs {
    /// The gRPC endpoint of `delaywheel serve`.
    #[arg(long, default_value = "127.0.0.1:8081")]
    endpoint: SocketAddr,
    /// Its HTTP endpoint.
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    /// Silent connections, half to each endpoint.
    #[arg(long, default_value_t = 1_000)]
    idle: usize,
    /// Concurrent long polls of one group (on connections of 60 polls each).
    #[arg(long, default_value_t = 500)]
    polls: usize,
    /// How long each long poll waits, in seconds.
    #[arg(long, default_value_t = 20)]
    poll_secs: i64,
    /// How long the silent connections are watched for the server to close them.
    #[arg(long, default_value_t = 90)]
    watch_secs: u64,
}

pub fn run(args: GrpcSoakArgs) -> Result<(), Failure> {
    tokio::runtime::Runtime::new()?.block_on(soak(args))
}

fn resource(name: &str) -> Option<Resource> {
    Some(Resource { resource_namespace: String::new(), name: name.to_string() })
}

async fn soak(args: GrpcSoakArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let mut idle = Vec::with_capacity(args.idle);
    let mut refused_at_connect = 0;
    for n in 0..args.idle {
        let to = if n % 2 == 0 { args.endpoint } else { args.http };
        match TcpStream::connect(to).await {
            Ok(stream) => idle.push(stream),
            Err(_) => refused_at_connect += 1,
        }
    }
    let watched = tokio::spawn(closed_by_server(idle, Duration::from_secs(args.watch_secs)));
    let polls = tokio::spawn(long_polls(args.endpoint, args.polls, args.poll_secs));
    let poison = poison_send(args.endpoint).await?;
    let (polled, polls_ok, polls_secs_max) = polls.await.map_err(|e| Failure::Run(e.to_string()))??;
    let (closed, closed_secs_max) = watched.await.map_err(|e| Failure::Run(e.to_string()))?;
    let healthz = healthz(args.http).await?;
    let report = serde_json::json!({
        "idle_opened": args.idle - refused_at_connect,
        "idle_refused_at_connect": refused_at_connect,
        "idle_closed_by_server": closed,
        "idle_closed_within_secs": closed_secs_max,
        "polls": polled,
        "polls_answered": polls_ok,
        "poll_longest_secs": polls_secs_max,
        "poison_send": poison,
        "healthz": healthz,
        "secs": started.elapsed().as_secs_f64(),
    });
    println!("{report}");
    Ok(())
}

/// How many of `streams` the server closed (reset, or ended) within `watch`,
/// and when the last of them went, in seconds. Bytes the server sends (an
/// HTTP/2 preface) are read and dropped.
async fn closed_by_server(streams: Vec<TcpStream>, watch: Duration) -> (usize, f64) {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + watch;
    let waits = streams.into_iter().map(|mut stream| async move {
        let mut buffer = [0u8; 256];
        loop {
            match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
                Ok(Ok(0) | Err(_)) => return Some(started.elapsed().as_secs_f64()),
                Ok(Ok(_)) => continue,
                Err(_) => return None,
            }
        }
    });
    let mut closed = 0;
    let mut last = 0.0f64;
    let tasks: Vec<_> = waits.map(tokio::spawn).collect();
    for task in tasks {
        if let Ok(Some(at)) = task.await {
            closed += 1;
            last = last.max(at);
        }
    }
    (closed, last)
}

/// `count` long polls of one group on an empty topic: how many ran, how
/// many ended with an answer (found nothing), and the longest in seconds.
async fn long_polls(
    endpoint: SocketAddr,
    count: usize,
    wait_secs: i64,
) -> Result<(usize, usize, f64), Failure> {
    let (group, topic) = ("SoakPollers", "SoakPolled");
    let mut tasks = Vec::new();
    let mut client = None;
    for n in 0..count {
        if n % 60 == 0 {
            let mut fresh = MessagingServiceClient::connect(format!("http://{endpoint}")).await?;
            let heartbeat =
                HeartbeatRequest { group: resource(group), client_type: ClientType::SimpleConsumer as i32 };
            fresh.heartbeat(heartbeat).await?;
            client = Some(fresh);
        }
        let mut client = client.clone().expect("made at n = 0");
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let request = ReceiveMessageRequest {
                group: resource(group),
                message_queue: Some(MessageQueue { topic: resource(topic), ..Default::default() }),
                filter_expression: None,
                batch_size: 32,
                invisible_duration: Some(prost_types::Duration { seconds: 30, nanos: 0 }),
                auto_renew: false,
                long_polling_timeout: Some(prost_types::Duration { seconds: wait_secs, nanos: 0 }),
                attempt_id: None,
            };
            let mut answered = false;
            if let Ok(stream) = client.receive_message(request).await {
                let mut stream = stream.into_inner();
                while let Ok(Some(answer)) = stream.message().await {
                    answered |= matches!(answer.content, Some(receive_message_response::Content::Status(_)));
                }
            }
            (answered, started.elapsed().as_secs_f64())
        }));
    }
    let (mut answered, mut longest) = (0, 0.0f64);
    for task in tasks {
        let (ok, secs) = task.await.map_err(|e| Failure::Run(e.to_string()))?;
        answered += usize::from(ok);
        longest = longest.max(secs);
    }
    Ok((count, answered, longest))
}

/// A send whose properties are under the store's limit but leave no room for
/// a retry copy's: the answer's code and message.
async fn poison_send(endpoint: SocketAddr) -> Result<serde_json::Value, Failure> {
    let mut client = MessagingServiceClient::connect(format!("http://{endpoint}")).await?;
    let blob = "x".repeat(delaywheel::MAX_PROPERTIES_LEN - 300);
    let message = Message {
        topic: resource("SoakPoison"),
        user_properties: [("blob".to_string(), blob)].into(),
        system_properties: Some(SystemProperties {
            message_id: "poison".into(),
            body_encoding: Encoding::Identity as i32,
            ..Default::default()
        }),
        body: b"poison".to_vec(),
    };
    let answer = client.send_message(SendMessageRequest { messages: vec![message] }).await?.into_inner();
    let status = answer.status.unwrap_or_default();
    let code =
        Code::try_from(status.code).map_or_else(|_| status.code.to_string(), |c| c.as_str_name().into());
    Ok(serde_json::json!({ "code": code, "message": status.message }))
}

/// The status line of `GET /healthz`.
async fn healthz(http: SocketAddr) -> Result<String, Failure> {
    let mut stream = TcpStream::connect(http).await?;
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer.lines().next().unwrap_or_default().to_string())
}
