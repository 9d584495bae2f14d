//! `delaywheel serve`: the RocketMQ 5 gRPC endpoint and the HTTP endpoint
//! over one store, until SIGINT or SIGTERM (then the store is closed and the
//! command exits 0).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use delaywheel::Store;
use delaywheel_server::{
    ConnectionLimits, Credentials, DEFAULT_MAX_TOPICS, ServeOptions, Server, TlsIdentity, load_or_create_key,
    store_config,
};

use crate::Failure;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The store directory (made if missing).
    #[arg(long)]
    dir: PathBuf,
    /// The gRPC endpoint (RocketMQ 5's MessagingService). Loopback by default:
    /// without --access-key anyone who reaches it may send, receive and recall.
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// Check every gRPC call's RocketMQ access-key signature (MQv2-HMAC-SHA1)
    /// against this access key and the secret in --secret-key-file.
    #[arg(long, requires = "secret_key_file")]
    access_key: Option<String>,
    /// A file holding the access key's secret (one line; kept off the command
    /// line, where other users could read it).
    #[arg(long, requires = "access_key")]
    secret_key_file: Option<PathBuf>,
    /// The HTTP endpoint: the operators' page at /, /metrics, /pending, /overview, /healthz.
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    /// Let the HTTP endpoint (and so the page) cancel and reschedule timers.
    /// It has no authentication: whoever reaches it may.
    #[arg(long)]
    allow_cancel: bool,
    /// Connections each endpoint holds at once; more are closed as soon as
    /// accepted. Default: 1,024, or a quarter of the descriptor limit if less.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: Option<u32>,
    /// Close a connection that sent nothing for this many seconds (the gRPC
    /// endpoint pings live clients every third of it, and their answers count).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(3..=86_400))]
    idle_timeout_secs: u64,
    /// Topics the store may hold (those it has count, and the retry and
    /// dead-letter topics receives make); a send or receive past it is refused.
    #[arg(long, default_value_t = DEFAULT_MAX_TOPICS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_topics: usize,
    /// Serve TLS with this PEM certificate chain, beside plaintext on the
    /// same gRPC port (a connection that opens with a TLS handshake gets TLS).
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Hand-outs of a message before it goes to its consumer group's
    /// dead-letter topic (%DLQ%<group>) instead of coming back.
    #[arg(long, default_value_t = delaywheel_server::receive::MAX_DELIVERY_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_delivery_attempts: u32,
    /// GROUP=N: the hand-outs of one consumer group's messages, instead of
    /// --max-delivery-attempts (a group in a namespace is NAMESPACE%GROUP). Repeatable.
    #[arg(long, value_name = "GROUP=N", value_parser = group_attempts)]
    group_max_delivery_attempts: Vec<(String, u32)>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    tls_key: Option<PathBuf>,
}

pub fn run(args: ServeArgs) -> Result<(), Failure> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> Result<(), Failure> {
    let credentials = credentials(&args)?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(TlsIdentity::from_pem_files(cert, key).map_err(|e| Failure::Usage(e.to_string()))?)
        }
        _ => None,
    };
    let key = load_or_create_key_in(&args.dir)?;
    let config = store_config(&args.dir);
    let store = tokio::task::spawn_blocking(move || Store::open(config)).await??;
    let truncated = store.recovery_report().truncated_bytes;
    let server = Server::bind(
        store,
        ServeOptions {
            listen: args.listen,
            http: Some(args.http),
            allow_cancel: args.allow_cancel,
            credentials,
            limits: limits(&args),
            max_topics: args.max_topics,
            tls,
            max_delivery_attempts: args.max_delivery_attempts,
            attempts_of_group: args.group_max_delivery_attempts.iter().cloned().collect(),
            ..ServeOptions::loopback(key)
        },
    )
    .await?;
    // One line a script can wait for: where both endpoints are.
    let http = server.http_addr().map_or_else(String::new, |a| a.to_string());
    println!(
        "{}",
        serde_json::json!({
            "grpc": server.grpc_addr().to_string(),
            "http": http,
            "dir": args.dir.display().to_string(),
            "truncated_bytes": truncated,
        })
    );
    server.run(stop_signal()).await?;
    Ok(())
}

/// `GROUP=N`, N from 1 to 1,000.
fn group_attempts(text: &str) -> Result<(String, u32), String> {
    let (group, attempts) = text.split_once('=').ok_or("expected GROUP=N")?;
    let attempts: u32 = attempts.parse().map_err(|_| format!("{attempts:?} is not a number"))?;
    if group.is_empty() || !(1..=1000).contains(&attempts) {
        return Err("expected a group name and N from 1 to 1000".into());
    }
    Ok((group.to_string(), attempts))
}

/// What each listener allows.
fn limits(args: &ServeArgs) -> ConnectionLimits {
    let defaults = ConnectionLimits::defaults();
    ConnectionLimits {
        max_connections: args.max_connections.map_or(defaults.max_connections, |n| n as usize),
        idle_timeout: std::time::Duration::from_secs(args.idle_timeout_secs),
    }
}

/// The access key and its secret, if given.
fn credentials(args: &ServeArgs) -> Result<Option<Credentials>, Failure> {
    let (Some(access_key), Some(file)) = (&args.access_key, &args.secret_key_file) else { return Ok(None) };
    let secret = std::fs::read_to_string(file)
        .map_err(|e| Failure::Usage(format!("--secret-key-file {}: {e}", file.display())))?;
    let secret = secret.trim_end_matches(['\r', '\n']);
    if access_key.is_empty() || secret.is_empty() {
        return Err(Failure::Usage(
            "--access-key and the secret in --secret-key-file may not be empty".into(),
        ));
    }
    Ok(Some(Credentials::new(access_key.clone(), secret.as_bytes().to_vec())))
}

fn load_or_create_key_in(dir: &std::path::Path) -> Result<delaywheel_server::HandleKey, Failure> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::Run(format!("cannot create {}: {e}", dir.display())))?;
    Ok(load_or_create_key(dir)?)
}

/// Completes on SIGINT or SIGTERM.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
