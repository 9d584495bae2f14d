//! Starting and stopping: one store, a gRPC listener and an optional HTTP
//! listener; a stop ends the long polls and telemetry streams, lets the
//! answers in flight finish, then closes the store.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use delaywheel::{Config, FlushMode, Store};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::Credentials;
use crate::codes::StandardCodes;
use crate::connections::{ConnectionLimits, Guarded, keepalive_interval};
use crate::error::ServeError;
use crate::handles::HandleKey;
use crate::metrics::Metrics;
use crate::proto::messaging_service_server::MessagingServiceServer;
use crate::proto::{
    Address, AddressScheme, Broker, CustomizedBackoff, Endpoints, ExponentialBackoff, MessageQueue,
    MessageType, Permission, RetryPolicy, Settings, TelemetryCommand, retry_policy, settings,
    telemetry_command,
};
use crate::receive::{DEFAULT_BATCH, DEFAULT_LONG_POLL, Groups, MAX_DELIVERY_ATTEMPTS};
use crate::renewal::{RenewPolicy, Renewals};
use crate::service::Service;
use crate::status::ok;
use crate::tls::TlsIdentity;
use crate::topics::{DEFAULT_MAX_TOPICS, Topics};

/// How long a stop waits for the answers in flight before closing the store anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests in flight on one gRPC connection (HTTP/2 streams): each may
/// hold a request body or an answer in memory.
const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// Where to listen.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The gRPC endpoint (port 0 picks a free one).
    pub listen: SocketAddr,
    /// The HTTP endpoint, if any.
    pub http: Option<SocketAddr>,
    /// The key that tags recall and receipt handles ([`crate::load_or_create_key`]).
    pub key: HandleKey,
    /// Hand-outs of one message before it goes to its group's dead-letter
    /// topic instead ([`crate::receive::MAX_DELIVERY_ATTEMPTS`] is RocketMQ's default).
    pub max_delivery_attempts: u32,
    /// Groups (by the store's name: `group`, or `namespace%group`) whose
    /// messages get another number of hand-outs than `max_delivery_attempts`.
    pub attempts_of_group: std::collections::HashMap<String, u32>,
    /// Whether the HTTP endpoint's `POST /timers/{handle}/cancel` and
    /// `/reschedule` act (the endpoint has no authentication yet): off, they answer 403.
    pub allow_cancel: bool,
    /// The access key every gRPC call must be signed with ([`crate::auth`]); none: no check.
    pub credentials: Option<Credentials>,
    /// What each listener allows: connections at once, and how long one may stay silent.
    pub limits: ConnectionLimits,
    /// Topics the store may hold; a send or receive that would make more is refused.
    pub max_topics: usize,
    /// The certificate and key to serve TLS with, beside plaintext on the gRPC port ([`crate::tls`]).
    pub tls: Option<TlsIdentity>,
    /// How a PushConsumer's messages stay invisible while its client lives ([`crate::renewal`]).
    pub renew: RenewPolicy,
}

impl ServeOptions {
    /// Both listeners on loopback (ports 0: free ones), RocketMQ's 16 attempts.
    pub fn loopback(key: HandleKey) -> Self {
        let any_port = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            listen: any_port,
            http: Some(any_port),
            key,
            max_delivery_attempts: MAX_DELIVERY_ATTEMPTS,
            attempts_of_group: std::collections::HashMap::new(),
            allow_cancel: false,
            credentials: None,
            limits: ConnectionLimits::defaults(),
            max_topics: DEFAULT_MAX_TOPICS,
            renew: RenewPolicy::DEFAULT,
            tls: None,
        }
    }
}

/// The store configuration `delaywheel serve` uses for `dir`: sync flush, so
/// an answered send is on disk.
pub fn store_config(dir: &Path) -> Config {
    Config::new(dir).with_flush_mode(FlushMode::Sync)
}

/// What the service, the HTTP handlers and the stop share.
pub(crate) struct Shared {
    pub store: Store,
    pub groups: Groups,
    pub topics: Topics,
    pub metrics: Metrics,
    pub renewals: Arc<Renewals>,
    pub key: HandleKey,
    /// See [`ServeOptions::allow_cancel`].
    pub allow_cancel: bool,
    /// Set when the server stops: long polls return what they have.
    stop: watch::Sender<bool>,
    /// The address clients reach the gRPC endpoint at, for routes.
    endpoint: SocketAddr,
    /// Spreads sends over a topic's queues.
    next_queue: AtomicU32,
}

impl Shared {
    pub fn stop_signal(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    pub fn next_queue(&self) -> u32 {
        self.next_queue.fetch_add(1, Ordering::Relaxed) % self.store.queues_per_topic()
    }

    /// The queues of `topic`, all on this endpoint (`asked`: the address the client dialled, if it said).
    pub fn queues(&self, topic: &str, asked: Option<Endpoints>) -> Vec<MessageQueue> {
        let endpoints = asked.filter(|e| !e.addresses.is_empty()).unwrap_or_else(|| Endpoints {
            scheme: if self.endpoint.is_ipv4() { AddressScheme::IPv4 } else { AddressScheme::IPv6 } as i32,
            addresses: vec![Address {
                host: self.endpoint.ip().to_string(),
                port: i32::from(self.endpoint.port()),
            }],
        });
        let broker = Broker { name: "delaywheel".to_string(), id: 0, endpoints: Some(endpoints) };
        // Only the server writes a dead-letter topic.
        let permission = if topic.starts_with(crate::receive::DLQ_PREFIX) {
            Permission::Read
        } else {
            Permission::ReadWrite
        };
        (0..self.store.queues_per_topic())
            .map(|id| MessageQueue {
                topic: Some(crate::names::resource(topic)),
                id: id as i32,
                permission: permission as i32,
                broker: Some(broker.clone()),
                // Transactions are not supported: clients refuse to send them.
                accept_message_types: vec![
                    MessageType::Normal as i32,
                    MessageType::Fifo as i32,
                    MessageType::Delay as i32,
                ],
            })
            .collect()
    }

    /// The answer to a client's settings: its own, with the server's limits
    /// and retry policy. A producer retries a send 3 times, 10 ms to 1 s
    /// apart; a consumer's nack (`ChangeInvisibleDuration`) waits, attempt
    /// by attempt, the store's delay levels (1 s, 5 s, 10 s, 30 s, 1 m, …),
    /// as RocketMQ's proxy answers, and it asks [`DEFAULT_BATCH`] messages
    /// per receive, polling up to [`DEFAULT_LONG_POLL`].
    pub fn settings_reply(&self, mut settings: Settings) -> TelemetryCommand {
        let proto = |d: Duration| prost_types::Duration {
            seconds: d.as_secs() as i64,
            nanos: d.subsec_nanos() as i32,
        };
        match &mut settings.pub_sub {
            Some(settings::PubSub::Publishing(publishing)) => {
                publishing.max_body_size = self.store.max_body_bytes().min(i32::MAX as usize) as i32;
                publishing.validate_message_type = true;
                settings.backoff_policy = Some(RetryPolicy {
                    max_attempts: 3,
                    strategy: Some(retry_policy::Strategy::ExponentialBackoff(ExponentialBackoff {
                        initial: Some(proto(Duration::from_millis(10))),
                        max: Some(proto(Duration::from_secs(1))),
                        multiplier: 2.0,
                    })),
                });
            }
            Some(settings::PubSub::Subscription(subscription)) => {
                let group = crate::names::group(&subscription.group, "")
                    .and_then(|group| crate::receive::check_group(&group, "").map(|()| group));
                if let Ok(group) = &group {
                    self.groups.know(group);
                }
                // A group with no number of its own (or none well formed) gets the server's.
                let attempts = self.groups.max_delivery_attempts(group.as_deref().unwrap_or(""));
                subscription.fifo = Some(false);
                subscription.receive_batch_size = Some(DEFAULT_BATCH as i32);
                subscription.long_polling_timeout = Some(proto(DEFAULT_LONG_POLL));
                let next = self.store.delay_levels().delays().map(proto).collect();
                settings.backoff_policy = Some(RetryPolicy {
                    max_attempts: attempts as i32,
                    strategy: Some(retry_policy::Strategy::CustomizedBackoff(CustomizedBackoff { next })),
                });
            }
            None => {}
        }
        TelemetryCommand { status: Some(ok()), command: Some(telemetry_command::Command::Settings(settings)) }
    }
}

/// A server with its listeners bound, ready to [`run`](Self::run).
pub struct Server {
    shared: Arc<Shared>,
    grpc: TcpListener,
    http: Option<TcpListener>,
    credentials: Option<Credentials>,
    limits: ConnectionLimits,
    tls: Option<TlsIdentity>,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })
}

impl Server {
    /// Binds the listeners (so the caller learns the ports before serving).
    pub async fn bind(store: Store, options: ServeOptions) -> Result<Self, ServeError> {
        let grpc = bind(options.listen).await?;
        let http = match options.http {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let endpoint =
            grpc.local_addr().map_err(|source| ServeError::Bind { addr: options.listen, source })?;
        let topics = Topics::new(&store, options.max_topics);
        let shared = Arc::new(Shared {
            topics,
            store,
            groups: Groups::new(options.max_delivery_attempts, options.attempts_of_group),
            metrics: Metrics::new(),
            renewals: Arc::new(Renewals::new(options.renew)),
            key: options.key,
            allow_cancel: options.allow_cancel,
            stop: watch::channel(false).0,
            endpoint,
            next_queue: AtomicU32::new(0),
        });
        let (credentials, limits, tls) = (options.credentials, options.limits, options.tls);
        Ok(Self { shared, grpc, http, credentials, limits, tls })
    }

    /// The gRPC endpoint's address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.shared.endpoint
    }

    /// The HTTP endpoint's address, if it has one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then stops as the module says and closes the store.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServeError> {
        let Self { shared, grpc, http, credentials, limits, tls } = self;
        let stopped = shared.stop_signal();
        let until_stopped = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            }
        };
        let service = MessagingServiceServer::new(Service::new(Arc::clone(&shared)))
            // A body at the limit, with room for the rest of the request.
            .max_decoding_message_size(shared.store.max_body_bytes() + (1 << 20));
        let signed = move |request: tonic::Request<()>| match &credentials {
            Some(credentials) => credentials.check(request.metadata()).map(|()| request),
            None => Ok(request),
        };
        let service = tonic::service::interceptor::InterceptedService::new(StandardCodes(service), signed);
        let refused = || shared.metrics.connections_refused.clone();
        let incoming = crate::tls::sorted(Guarded::new(grpc, limits, refused()), tls, limits.idle_timeout);
        let keepalive = keepalive_interval(&limits);
        let grpc = tonic::transport::Server::builder()
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
            .http2_keepalive_interval(Some(keepalive))
            .http2_keepalive_timeout(Some(keepalive))
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, until_stopped());
        let grpc = tokio::spawn(grpc);
        let renewer =
            Arc::clone(&shared.renewals).run(Arc::clone(&shared), |s| &s.store, shared.stop_signal());
        let renewer = tokio::spawn(renewer);
        let http = http.map(|listener| {
            let bound = listener.local_addr().unwrap_or(shared.endpoint);
            let app = crate::http::router(Arc::clone(&shared), bound);
            let listener = Guarded::new(listener, limits, refused());
            tokio::spawn(axum::serve(listener, app).with_graceful_shutdown(until_stopped()).into_future())
        });
        shutdown.await;
        tracing::info!("stopping: ending long polls and streams, then closing the store");
        let _ = shared.stop.send(true);
        let grpc = grpc.await.map_err(|e| ServeError::Serve { listener: "gRPC", reason: e.to_string() })?;
        grpc.map_err(|e| ServeError::Serve { listener: "gRPC", reason: e.to_string() })?;
        let _ = renewer.await;
        if let Some(http) = http {
            let served =
                http.await.map_err(|e| ServeError::Serve { listener: "HTTP", reason: e.to_string() })?;
            served.map_err(|e| ServeError::Serve { listener: "HTTP", reason: e.to_string() })?;
        }
        close(shared).await
    }
}

/// Closes the store once the last task holding it let go.
async fn close(mut shared: Arc<Shared>) -> Result<(), ServeError> {
    let started = Instant::now();
    loop {
        match Arc::try_unwrap(shared) {
            Ok(shared) => {
                let store = shared.store;
                return tokio::task::spawn_blocking(move || store.close())
                    .await
                    .map_err(|e| ServeError::Serve { listener: "gRPC", reason: e.to_string() })?
                    .map_err(ServeError::from);
            }
            Err(still_shared) if started.elapsed() < DRAIN_TIMEOUT => {
                shared = still_shared;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => {
                // Dropping the store closes it when the last task ends.
                tracing::warn!(
                    "answers still in flight after {DRAIN_TIMEOUT:?}; the store closes when they end"
                );
                return Ok(());
            }
        }
    }
}
