//! Timers a producer can publish by hand that the tier must not trust: a
//! target that is the JetStream API or the tier's own subjects, a target no
//! stream acknowledges, a malformed timer. None may act with the node's
//! credentials, and none may hold up the timers behind it: each goes to the
//! dead-letter subject (`delaytier.dead.<partition>`) with its reason.

mod cluster;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use cluster::{Cluster, TierNode, collect, now_ms, pending_in_stream, wait_for};
use delaywheel_nats::TierClient;
use futures::StreamExt;

const LEASE_MS: u64 = 1500;

/// The cluster with the `OUT` and `DELAY` streams made, or None (SKIPPED).
async fn cluster() -> Option<(Cluster, async_nats::Client)> {
    let cluster = Cluster::start(cluster::nats_server()?).await;
    let client = cluster.connect().await;
    cluster::create_target_stream(&client).await;
    cluster::create_delay_stream(&client).await;
    Some((cluster, client))
}

/// One dead letter as a subscriber of `delaytier.dead.>` saw it.
#[derive(Debug, Clone)]
struct DeadLetter {
    subject: String,
    headers: HeaderMap,
    payload: String,
    /// When it arrived, ms since the epoch.
    received_ms: i64,
}

impl DeadLetter {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", |v| v.as_str())
    }
}

type DeadLetters = Arc<Mutex<Vec<DeadLetter>>>;

/// Subscribes to the default dead-letter subjects.
async fn dead_letters(client: &async_nats::Client) -> (DeadLetters, tokio::task::JoinHandle<()>) {
    let mut subscriber = client.subscribe("delaytier.dead.>").await.unwrap();
    client.flush().await.unwrap();
    let seen: DeadLetters = Arc::default();
    let sink = seen.clone();
    let task = tokio::spawn(async move {
        while let Some(message) = subscriber.next().await {
            sink.lock().unwrap().push(DeadLetter {
                subject: message.subject.to_string(),
                headers: message.headers.unwrap_or_default(),
                payload: String::from_utf8_lossy(&message.payload).into_owned(),
                received_ms: now_ms() as i64,
            });
        }
    });
    (seen, task)
}

/// Waits until a dead letter carries each of `payloads`; the letters by payload.
async fn wait_for_dead(seen: &DeadLetters, payloads: &[&str], timeout: Duration) -> Vec<DeadLetter> {
    let deadline = Instant::now() + timeout;
    loop {
        let letters = seen.lock().unwrap().clone();
        let found: Vec<DeadLetter> =
            payloads.iter().filter_map(|p| letters.iter().find(|l| l.payload == *p).cloned()).collect();
        if found.len() == payloads.len() {
            return found;
        }
        let got: Vec<&str> = letters.iter().map(|l| l.payload.as_str()).collect();
        assert!(Instant::now() < deadline, "dead letters within {timeout:?}: {got:?}, wanted {payloads:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes a timer by hand, as any NATS client can, with whatever headers.
async fn publish_raw(
    client: &async_nats::Client,
    subject: &str,
    headers: &[(&str, &str)],
    payload: &str,
) -> u64 {
    let js = jetstream::new(client.clone());
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(*name, *value);
    }
    let ack = js.publish_with_headers(subject.to_string(), map, Bytes::from(payload.to_string())).await;
    ack.unwrap().await.unwrap().sequence
}

/// A timer due now for `target` on `partition`.
async fn timer_to(client: &async_nats::Client, partition: u32, target: &str, payload: &str) -> u64 {
    let at = now_ms().to_string();
    publish_raw(
        client,
        &format!("delay.{partition}.timer"),
        &[("Delay-At", &at), ("Delay-Target", target)],
        payload,
    )
    .await
}

/// Makes a stream holding `count` messages on `<subject>.<i>`.
async fn stream_with(client: &async_nats::Client, name: &str, subject: &str, count: usize) -> stream::Stream {
    let js = jetstream::new(client.clone());
    let stream = js
        .create_stream(stream::Config {
            name: name.into(),
            subjects: vec![format!("{subject}.>")],
            num_replicas: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    for i in 0..count {
        js.publish(format!("{subject}.{i}"), Bytes::from("kept")).await.unwrap().await.unwrap();
    }
    stream
}

async fn messages_in(mut stream: stream::Stream) -> u64 {
    stream.info().await.unwrap().state.messages
}

/// Waits until the delay stream is empty.
async fn wait_until_no_timers(client: &async_nats::Client, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let have = pending_in_stream(client).await;
        if have == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the delay stream still holds {have} timers after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_naming_the_jetstream_api_or_the_tiers_own_subjects_is_dead_lettered_unpublished() {
    let Some((cluster, client)) = cluster().await else { return };
    let victim = stream_with(&client, "VICTIM", "victim", 3).await;
    let (dead, _dead_reader) = dead_letters(&client).await;
    let (arrivals, _reader) = collect(&client).await;
    // A subscriber of the tier's own subjects would see a forged message.
    let mut forged = client.subscribe("delay.1.forged").await.unwrap();
    let _node = TierNode::start(&cluster, "a", LEASE_MS);
    let hostile = [
        ("$JS.API.STREAM.PURGE.VICTIM", "purge"),
        ("$KV.delaytier_leases.partition.3", "lease"),
        ("$SYS.REQ.SERVER.PING", "sys"),
        ("delay.1.forged", "own"),
        ("out.*", "wildcard"),
        ("out.>", "tail-wildcard"),
        ("out..x", "empty-token"),
        ("out.a b", "whitespace"),
    ];
    let mut sequences = Vec::new();
    for (i, (target, payload)) in hostile.iter().enumerate() {
        sequences.push(timer_to(&client, i as u32 % 8, target, payload).await);
    }
    timer_to(&client, 0, "out.fired", "good").await;

    // The good timer fires; the hostile ones, due as early, did nothing.
    wait_for(&arrivals, 1, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(messages_in(victim).await, 3, "the victim stream was purged");
    let payloads: Vec<&str> = hostile.iter().map(|(_, p)| *p).collect();
    let letters = wait_for_dead(&dead, &payloads, Duration::from_secs(20)).await;
    // The producer's client refuses them up front, naming the header.
    let tier = TierClient::new(client.clone(), "DELAY", "delay", 8).await.unwrap();
    for (target, _) in &hostile {
        let err = tier.schedule("k", target, now_ms(), Bytes::from("x")).await.unwrap_err().to_string();
        assert!(err.contains("Delay-Target") && err.contains(&format!("{target:?}")), "{err}");
    }
    for ((letter, (target, _)), sequence) in letters.iter().zip(&hostile).zip(&sequences) {
        assert!(letter.subject.starts_with("delaytier.dead."), "{letter:?}");
        assert_eq!(letter.header("Delay-Dead-Target"), *target, "{letter:?}");
        assert_eq!(letter.header("Delay-Dead-Sequence"), sequence.to_string(), "{letter:?}");
        assert!(letter.header("Delay-Dead-Reason").contains("target"), "{letter:?}");
        assert!(letter.headers.get("Delay-Target").is_none(), "a dead letter is not a timer: {letter:?}");
    }
    wait_until_no_timers(&client, Duration::from_secs(10)).await;
    assert_eq!(arrivals.lock().unwrap().count.get("good"), Some(&1));
    let leaked = tokio::time::timeout(Duration::from_millis(300), forged.next()).await;
    assert!(leaked.is_err(), "a timer reached the tier's own subject: {leaked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_outside_the_allow_list_is_dead_lettered_and_its_stream_stays_empty() {
    let Some((cluster, client)) = cluster().await else { return };
    let elsewhere = stream_with(&client, "ELSEWHERE", "elsewhere", 0).await;
    let (dead, _dead_reader) = dead_letters(&client).await;
    let (arrivals, _reader) = collect(&client).await;
    let _node = TierNode::start_with(&cluster, "a", LEASE_MS, &["--allow-target-prefix", "out."]);
    timer_to(&client, 2, "elsewhere.x", "not-allowed").await;
    timer_to(&client, 2, "out.fired", "allowed").await;
    let letters = wait_for_dead(&dead, &["not-allowed"], Duration::from_secs(20)).await;
    assert!(letters[0].header("Delay-Dead-Reason").contains("allow"), "{letters:?}");
    assert_eq!(letters[0].subject, "delaytier.dead.2");
    wait_for(&arrivals, 1, Duration::from_secs(10)).await;
    assert_eq!(arrivals.lock().unwrap().count.get("allowed"), Some(&1));
    assert_eq!(messages_in(elsewhere).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeliverable_and_malformed_timers_are_dead_lettered_and_never_hold_up_the_rest() {
    let Some((cluster, client)) = cluster().await else { return };
    let (dead, _dead_reader) = dead_letters(&client).await;
    let (arrivals, _reader) = collect(&client).await;
    // A core subscriber that never answers, and one that answers garbage:
    // neither is a PubAck.
    let mut silent = client.subscribe("core.silent").await.unwrap();
    let mut chatty = client.subscribe("core.chatty").await.unwrap();
    let answerer = client.clone();
    let _silent = tokio::spawn(async move { while silent.next().await.is_some() {} });
    let _chatty = tokio::spawn(async move {
        while let Some(message) = chatty.next().await {
            if let Some(reply) = message.reply {
                let _ = answerer.publish(reply, Bytes::from("hello")).await;
            }
        }
    });
    client.flush().await.unwrap();
    let _node = TierNode::start(&cluster, "a", LEASE_MS);
    // Every partition gets its bad timers first, then good ones due later.
    let mut bad = Vec::new();
    for partition in 0..8 {
        for (target, kind) in
            [("nostream.x", "nostream"), ("core.silent", "silent"), ("core.chatty", "chatty")]
        {
            let payload = format!("{kind}-{partition}");
            timer_to(&client, partition, target, &payload).await;
            bad.push(payload);
        }
        let at = now_ms().to_string();
        let subject = format!("delay.{partition}.timer");
        publish_raw(&client, &subject, &[], &format!("noheaders-{partition}")).await;
        publish_raw(&client, &subject, &[("Delay-Target", "out.fired")], &format!("noat-{partition}")).await;
        let headers = [("Delay-At", "soon"), ("Delay-Target", "out.fired")];
        publish_raw(&client, &subject, &headers, &format!("badat-{partition}")).await;
        publish_raw(&client, &subject, &[("Delay-At", &at)], &format!("notarget-{partition}")).await;
        for kind in ["noheaders", "noat", "badat", "notarget"] {
            bad.push(format!("{kind}-{partition}"));
        }
    }
    let good = 400;
    let due = now_ms() + 1_000;
    for i in 0..good {
        let at = (due + i as u64 % 500).to_string();
        let headers = [("Delay-At", at.as_str()), ("Delay-Target", "out.fired")];
        publish_raw(&client, &format!("delay.{}.timer", i % 8), &headers, &format!("g-{i}")).await;
    }

    wait_for(&arrivals, good, Duration::from_secs(30)).await;
    let bad: Vec<&str> = bad.iter().map(String::as_str).collect();
    let letters = wait_for_dead(&dead, &bad, Duration::from_secs(20)).await;
    for letter in &letters {
        let reason = letter.header("Delay-Dead-Reason");
        let expect = match letter.payload.split('-').next().unwrap() {
            "nostream" | "silent" => "no stream",
            "chatty" => "not a publish acknowledgement",
            "noheaders" => "no headers",
            "noat" | "badat" => "Delay-At",
            "notarget" => "Delay-Target",
            other => panic!("{other}"),
        };
        assert!(reason.contains(expect), "{}: {reason:?}", letter.payload);
        assert!(!letter.header("Delay-Dead-Sequence").is_empty(), "{letter:?}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    {
        let arrivals = arrivals.lock().unwrap();
        for i in 0..good {
            assert_eq!(arrivals.count.get(&format!("g-{i}")), Some(&1), "g-{i}");
        }
        assert_eq!(arrivals.count.len(), good, "nothing bad reached OUT");
        assert!(arrivals.early.is_empty());
    }
    wait_until_no_timers(&client, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_stream_that_keeps_failing_is_given_up_after_the_bound_without_holding_up_the_rest() {
    let Some((cluster, client)) = cluster().await else { return };
    // A stream that exists but takes nothing more: each publish is answered
    // with an error the server marks temporary (503), so it is tried again.
    let js = jetstream::new(client.clone());
    let mut full = js
        .create_stream(stream::Config {
            name: "FULL".into(),
            subjects: vec!["full.>".into()],
            max_messages: 1,
            discard: stream::DiscardPolicy::New,
            ..Default::default()
        })
        .await
        .unwrap();
    js.publish("full.0", Bytes::from("kept")).await.unwrap().await.unwrap();
    let (dead, _dead_reader) = dead_letters(&client).await;
    let (arrivals, _reader) = collect(&client).await;
    let _node = TierNode::start_with(&cluster, "a", LEASE_MS, &["--give-up-after-ms", "3000"]);
    let due = now_ms();
    timer_to(&client, 5, "full.x", "full").await;
    let at = (due + 500).to_string();
    let headers = [("Delay-At", at.as_str()), ("Delay-Target", "out.fired")];
    publish_raw(&client, "delay.5.timer", &headers, "behind").await;

    // The timer behind fires while the failing one is still being tried.
    wait_for(&arrivals, 1, Duration::from_secs(20)).await;
    assert!(dead.lock().unwrap().is_empty(), "the timer behind waited for the failing one");
    let letters = wait_for_dead(&dead, &["full"], Duration::from_secs(30)).await;
    let reason = letters[0].header("Delay-Dead-Reason");
    println!("dead letter of a full stream's target: {reason}");
    assert!(reason.contains("still failing after"), "{reason}");
    // Its first try was at its due time at the earliest; the bound is 3 s.
    let after = letters[0].received_ms - due as i64;
    assert!(after >= 3_000, "given up {after} ms after it was due, inside the 3 s bound");
    assert_eq!(full.info().await.unwrap().state.messages, 1);
    wait_until_no_timers(&client, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_tier_makes_refuses_timers_no_partition_reads() {
    let Some(server) = cluster::nats_server() else { return };
    let cluster = Cluster::start(server).await;
    let client = cluster.connect().await;
    // No stream made beforehand: the node makes the delay stream.
    let _node = TierNode::start(&cluster, "a", LEASE_MS);
    let js = jetstream::new(client.clone());
    let far = (now_ms() + 86_400_000).to_string();
    let timer = |subject: &'static str| {
        let (js, far) = (js.clone(), far.clone());
        async move {
            let mut headers = HeaderMap::new();
            headers.insert("Delay-At", far.as_str());
            headers.insert("Delay-Target", "out.fired");
            js.publish_with_headers(subject, headers, Bytes::from("x")).await?.await
        }
    };
    // Once a timer of partition 7 is taken, the stream and its leader exist.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(err) = timer("delay.7.timer").await {
        assert!(Instant::now() < deadline, "no delay stream made by the node: {err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for stray in ["delay.8.timer", "delay.99.timer", "delay.x.timer", "delay.7"] {
        let err = timer(stray).await.expect_err(stray);
        assert_eq!(err.kind(), jetstream::context::PublishErrorKind::StreamNotFound, "{stray}: {err}");
    }
    assert_eq!(pending_in_stream(&client).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_stream_made_by_hand_timers_no_partition_reads_are_dead_lettered() {
    // `cluster()` makes the delay stream on `delay.>`, as by hand.
    let Some((cluster, client)) = cluster().await else { return };
    let (dead, _dead_reader) = dead_letters(&client).await;
    let (arrivals, _reader) = collect(&client).await;
    let _node = TierNode::start(&cluster, "a", LEASE_MS);
    let at = now_ms().to_string();
    let headers = [("Delay-At", at.as_str()), ("Delay-Target", "out.fired")];
    let strays = [("delay.8.timer", "eight"), ("delay.99.timer", "ninety-nine"), ("delay.x", "two-tokens")];
    for (subject, payload) in strays {
        publish_raw(&client, subject, &headers, payload).await;
    }
    publish_raw(&client, "delay.07.timer", &headers, "not-canonical").await;
    publish_raw(&client, "delay.7.timer", &headers, "good").await;

    let letters = wait_for_dead(
        &dead,
        &["eight", "ninety-nine", "two-tokens", "not-canonical"],
        Duration::from_secs(30),
    )
    .await;
    for letter in &letters {
        assert_eq!(letter.subject, "delaytier.dead.unowned", "{letter:?}");
        assert!(letter.header("Delay-Dead-Reason").contains("no partition reads"), "{letter:?}");
        assert_eq!(letter.header("Delay-Dead-Target"), "out.fired", "{letter:?}");
    }
    wait_for(&arrivals, 1, Duration::from_secs(10)).await;
    assert_eq!(arrivals.lock().unwrap().count.get("good"), Some(&1));
    wait_until_no_timers(&client, Duration::from_secs(10)).await;
}

/// The node answers a schedule's publisher and a cancel's requester on
/// their reply subject, with its own credentials: a reply naming the lease
/// bucket's key (`$KV.…`) would overwrite a partition's lease with the
/// answer, so such answers are not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_never_go_to_the_servers_subjects_whatever_reply_a_request_names() {
    let Some((cluster, client)) = cluster().await else { return };
    let _node = TierNode::start(&cluster, "a", LEASE_MS);
    let leases = || async {
        let js = jetstream::new(client.clone());
        let Ok(kv) = js.get_key_value("delaytier_leases").await else { return vec![None; 8] };
        let mut values = Vec::new();
        for partition in 0..8 {
            let value = kv.get(format!("partition.{partition}")).await.ok().flatten();
            values.push(value.map(|v| String::from_utf8_lossy(&v).into_owned()));
        }
        values
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while leases().await.iter().any(|v| v.as_deref() != Some("a")) {
        assert!(Instant::now() < deadline, "partitions not taken: {:?}", leases().await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut schedule = HeaderMap::new();
    schedule.insert("Nats-Schedule", "@every 1h");
    schedule.insert("Nats-Schedule-Target", "out.fired");
    for partition in 0..8 {
        let lease = format!("$KV.delaytier_leases.partition.{partition}");
        let request = client.publish_with_reply_and_headers(
            format!("schedules.p{partition}"),
            lease.clone(),
            schedule.clone(),
            Bytes::from("hourly"),
        );
        request.await.unwrap();
        let cancel = format!("$DELAYTIER.DELAY.cancel.{partition}");
        client.publish_with_reply(cancel, lease, Bytes::from("12345")).await.unwrap();
    }
    client.flush().await.unwrap();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let values = leases().await;
        assert!(values.iter().all(|v| v.as_deref() == Some("a")), "a lease overwritten: {values:?}");
    }
    // The schedules were taken all the same.
    wait_for_pending_at_least(&client, 8).await;
}

async fn wait_for_pending_at_least(client: &async_nats::Client, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pending_in_stream(client).await < want {
        assert!(Instant::now() < deadline, "the schedules were not stored");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
