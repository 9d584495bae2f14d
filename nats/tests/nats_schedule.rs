//! Messages made for NATS's own schedules (`Nats-Schedule` and its kin),
//! published to the tier's subjects unchanged, against a real 3-node
//! JetStream cluster (see `cluster/`).

mod cluster;

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use cluster::{Cluster, TierNode, now_ms, owners, pending_in_stream};
use delaywheel_nats::{CancelAnswer, TierClient, TimerHandle};
use futures::StreamExt;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

const LEASE_MS: u64 = 1500;

/// An occurrence as the target stream stored it.
#[derive(Debug)]
struct Stored {
    subject: String,
    stored_ms: u64,
    headers: HeaderMap,
}

impl Stored {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.as_str())
    }

    /// The instant it was due: its `Delay-At`, which every occurrence but a
    /// schedule's first carries.
    fn due_ms(&self) -> Option<u64> {
        self.header("Delay-At").map(|at| at.parse().unwrap())
    }

    /// Its `Delay-Schedule-Next`, in ms.
    fn next_ms(&self) -> u64 {
        let next = self.header("Delay-Schedule-Next").unwrap();
        let at = OffsetDateTime::parse(next, &Rfc3339).unwrap_or_else(|e| panic!("{next:?}: {e}"));
        (at.unix_timestamp_nanos() / 1_000_000) as u64
    }
}

/// Everything the `SCHED` stream holds, in order.
async fn stored(js: &jetstream::Context) -> Vec<Stored> {
    let mut sched = js.get_stream("SCHED").await.unwrap();
    let last = sched.info().await.unwrap().state.last_sequence;
    let mut all = Vec::new();
    for sequence in 1..=last {
        let message = sched.direct_get(sequence).await.unwrap();
        all.push(Stored {
            subject: message.subject.to_string(),
            stored_ms: (message.time.unix_timestamp_nanos() / 1_000_000) as u64,
            headers: message.headers,
        });
    }
    all
}

fn header_map(headers: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, *value);
    }
    map
}

/// Publishes a schedule as a NATS user would, with a JetStream publish;
/// its handle (the partition is the subject's).
async fn publish(
    js: &jetstream::Context,
    subject: &str,
    headers: &[(&str, &str)],
    payload: &str,
) -> TimerHandle {
    let payload = Bytes::from(payload.to_string());
    let ack = js.publish_with_headers(subject.to_string(), header_map(headers), payload).await.unwrap().await;
    let ack = ack.unwrap_or_else(|e| panic!("{subject}: {e}"));
    assert_eq!(ack.stream, "DELAY");
    let partition = delaywheel_nats::wire::partition_of(subject.as_bytes(), 8);
    TimerHandle { partition, sequence: ack.sequence }
}

fn rfc3339(ms: u64) -> String {
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).unwrap();
    at.format(&Rfc3339).unwrap()
}

/// A one-time `@at` with milliseconds, an `@every` published twice by two
/// "replicas" (the second past JetStream's own duplicate window), a cron
/// in a time zone, an `@every` cancelled by its first handle, and a cron
/// with a bad minute; the node owning the `@every` is killed mid-run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_schedule_headers_fire_as_nats_fires_them_and_recur_across_a_node_kill() {
    let Some(binary) = cluster::nats_server() else { return };
    let cluster = Cluster::start(binary).await;
    let client = cluster.connect().await;
    let js = jetstream::new(client.clone());
    let sched = stream::Config {
        name: "SCHED".into(),
        subjects: vec!["sched.>".into()],
        num_replicas: 3,
        allow_direct: true,
        allow_message_ttl: true,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    };
    cluster::create_replicated_stream(&client, sched).await;
    // JetStream forgets a Nats-Msg-Id after a second: the tier must not.
    cluster::create_delay_stream_with(&client, Duration::from_secs(1)).await;
    let tier = TierClient::new(client.clone(), "DELAY", "delay", 8).await.unwrap();
    let mut dead = client.subscribe("delaytier.dead.>").await.unwrap();
    client.flush().await.unwrap();
    // Settled ids are forgotten after a second, so what keeps the second
    // replica's schedule out is the running schedule's own id.
    // Checkpoints twice a second: the survivor takes the killed node's
    // partitions over from them, the schedules' timers by reference.
    let (metrics_a, metrics_b) = (cluster::free_addr(), cluster::free_addr());
    let flags = |metrics: &str| {
        ["--dedup-window-ms", "1000", "--checkpoint-every-ms", "500", "--metrics", metrics].map(String::from)
    };
    let (flags_a, flags_b) = (flags(&metrics_a), flags(&metrics_b));
    let mut a = TierNode::start_with(&cluster, "a", LEASE_MS, &flags_a.each_ref().map(String::as_str));
    let mut b = TierNode::start_with(&cluster, "b", LEASE_MS, &flags_b.each_ref().map(String::as_str));
    while owners(&client).await.len() < 8 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let t0 = now_ms();
    let at_ms = t0 + 2_345;
    let at_pattern = format!("@at {}", rfc3339(at_ms));
    publish(
        &js,
        "schedules.at",
        &[("Nats-Schedule", &at_pattern), ("Nats-Schedule-Target", "sched.at")],
        "at",
    )
    .await;
    let every_headers = [
        ("Nats-Schedule", "@every 1s"),
        ("Nats-Schedule-Target", "sched.every"),
        ("Nats-Schedule-TTL", "1h"),
        ("Nats-Msg-Id", "every-report"),
    ];
    let every = publish(&js, "schedules.every", &every_headers, "every").await;
    let cron_headers = [
        ("Nats-Schedule", "*/2 * * * * *"),
        ("Nats-Schedule-Time-Zone", "Asia/Tokyo"),
        ("Nats-Schedule-Target", "sched.cron"),
    ];
    let cron = publish(&js, "schedules.cron", &cron_headers, "cron").await;
    let stop = publish(
        &js,
        "schedules.stop",
        &[("Nats-Schedule", "@every 1s"), ("Nats-Schedule-Target", "sched.stop")],
        "stop",
    )
    .await;
    // As NATS refuses a malformed schedule, the publish fails, naming the field.
    let bad = [("Nats-Schedule", "0 61 * * * *"), ("Nats-Schedule-Target", "sched.bad")];
    let refused =
        js.publish_with_headers("schedules.bad", header_map(&bad), "bad".into()).await.unwrap().await;
    let refused = refused.unwrap_err().to_string();
    assert!(refused.contains("Nats-Schedule") && refused.contains("minute"), "{refused}");
    let to_the_api =
        [("Nats-Schedule", "@every 1s"), ("Nats-Schedule-Target", "$JS.API.STREAM.DELETE.SCHED")];
    let refused =
        js.publish_with_headers("schedules.api", header_map(&to_the_api), "".into()).await.unwrap().await;
    assert!(refused.unwrap_err().to_string().contains("reserved"));

    // The second replica, past JetStream's window: one schedule still.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    publish(&js, "schedules.every", &every_headers, "every").await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let cancelled = tier.cancel(stop).await.unwrap();
    let cancelled_at = now_ms();
    assert_eq!(cancelled, CancelAnswer::Cancelled, "a recurring schedule, by its first handle");

    // The owner of the @every dies between two of its occurrences' firings.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let survivor = match owners(&client).await[&every.partition].as_str() {
        "a" => {
            a.kill();
            &metrics_b
        }
        _ => {
            b.kill();
            &metrics_a
        }
    };
    tokio::time::sleep(Duration::from_millis((t0 + 12_000).saturating_sub(now_ms()))).await;

    let page = cluster::http_get(survivor, "/metrics");
    let takeovers = page.lines().find(|l| l.starts_with("delaytier_checkpoint_takeovers_total"));
    let takeovers: f64 = takeovers.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0);
    assert!(takeovers >= 1.0, "the survivor took the killed node's partitions over from checkpoints");
    let all = stored(&js).await;
    let on = |subject: &str| all.iter().filter(|s| s.subject == subject).collect::<Vec<_>>();
    for occurrence in &all {
        let due = occurrence.due_ms().unwrap_or(0);
        assert!(occurrence.stored_ms >= due, "early: {occurrence:?}");
        assert!(
            occurrence.header("Nats-Schedule").is_none()
                && occurrence.header("Nats-Schedule-Target").is_none()
        );
        assert!(occurrence.header("Delay-Handle").is_some());
    }

    let at = on("sched.at");
    assert_eq!(at.len(), 1, "{at:?}");
    assert!(at[0].stored_ms >= at_ms, "{} before {at_ms}", at[0].stored_ms);
    assert_eq!(at[0].header("Delay-Scheduler"), Some("schedules.at"));
    assert_eq!(at[0].header("Delay-Schedule-Next"), Some("purge"));

    let every_fired = on("sched.every");
    let lateness = |fired: &[&Stored]| fired.iter().filter_map(|o| Some(o.stored_ms - o.due_ms()?)).max();
    println!(
        "@every 1s: {} occurrences, max lateness {:?} ms; cron: {}; cancelled: {}",
        every_fired.len(),
        lateness(&every_fired),
        on("sched.cron").len(),
        on("sched.stop").len()
    );
    assert!(
        (8..=12).contains(&every_fired.len()),
        "one schedule, every second for ~11 s: {}",
        every_fired.len()
    );
    let grid = every_fired[1].due_ms().unwrap();
    for (i, pair) in every_fired.windows(2).enumerate() {
        let due = pair[1].due_ms().unwrap();
        assert_eq!(pair[0].next_ms(), due, "occurrence {i} announced the next one");
        assert_eq!((due - grid) % 1_000, 0, "on the schedule's grid");
        assert!(due > pair[0].due_ms().unwrap_or(0), "each occurrence once");
    }
    for occurrence in &every_fired {
        assert_eq!(occurrence.header("Delay-Scheduler"), Some("schedules.every"));
        assert_eq!(occurrence.header("Nats-TTL"), Some("1h"));
        assert_eq!(occurrence.header("Delay-Schedule-Handle"), Some(every.to_string().as_str()));
        assert!(occurrence.header("Nats-Msg-Id").unwrap().starts_with("DELAY-"));
    }

    let cron_fired = on("sched.cron");
    assert!(cron_fired.len() >= 4, "{cron_fired:?}");
    for occurrence in &cron_fired {
        assert_eq!(occurrence.next_ms() % 2_000, 0, "every even second: {occurrence:?}");
        assert!(occurrence.due_ms().is_none_or(|due| due % 2_000 == 0));
    }

    let stop_fired = on("sched.stop");
    assert!(stop_fired.len() >= 3, "{stop_fired:?}");
    assert!(
        stop_fired.iter().all(|o| o.due_ms().unwrap_or(0) <= cancelled_at),
        "nothing after the cancel: {stop_fired:?}"
    );
    assert!(on("sched.bad").is_empty());
    // A timer in the delay stream with a bad schedule (a producer that
    // wrote the tier's header itself) goes to the dead letter, named.
    let bad_timer = [("Delay-Schedule", "0 0 0 * * * 2026"), ("Delay-Target", "sched.bad")];
    js.publish_with_headers("delay.5.bad", header_map(&bad_timer), "bad".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let letter = tokio::time::timeout(Duration::from_secs(10), dead.next()).await.unwrap().unwrap();
    let reason = letter.headers.as_ref().unwrap().get("Delay-Dead-Reason").unwrap().as_str();
    assert!(reason.contains("Delay-Schedule") && reason.contains("7 fields"), "{reason}");
    assert_eq!(letter.payload, "bad");

    // Left pending: the two schedules still recurring, which their first
    // handles cancel.
    assert_eq!(tier.cancel(every).await.unwrap(), CancelAnswer::Cancelled);
    assert_eq!(tier.cancel(cron).await.unwrap(), CancelAnswer::Cancelled);
    let mut left = pending_in_stream(&client).await;
    for _ in 0..40 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        left = pending_in_stream(&client).await;
    }
    assert_eq!(left, 0, "the delay stream still holds {left} timers");
}

/// A recurring schedule whose target refuses everything for a few seconds
/// (a full stream answers 503, so each firing is tried again): each of its
/// timers publishes its next one once, the occurrences all come when the
/// target takes them again, and after its owner is killed (so another node
/// reads the partition again, with the schedule's timers settled in
/// whatever order their retries ended) it is still one schedule, firing on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recurring_schedule_whose_target_fails_for_a_while_stays_one_schedule_across_a_reread() {
    let Some(binary) = cluster::nats_server() else { return };
    let cluster = Cluster::start(binary).await;
    let client = cluster.connect().await;
    let js = jetstream::new(client.clone());
    let full = stream::Config {
        name: "SCHED".into(),
        subjects: vec!["sched.>".into()],
        max_messages: 1,
        discard: stream::DiscardPolicy::New,
        allow_direct: true,
        ..Default::default()
    };
    js.create_stream(full.clone()).await.unwrap();
    js.publish("sched.filler", Bytes::from("full")).await.unwrap().await.unwrap();
    cluster::create_delay_stream(&client).await;
    let mut a = TierNode::start(&cluster, "a", LEASE_MS);
    let mut b = TierNode::start(&cluster, "b", LEASE_MS);
    while owners(&client).await.len() < 8 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let headers =
        [("Nats-Schedule", "@every 1s"), ("Nats-Schedule-Target", "sched.out"), ("Nats-Msg-Id", "retried")];
    let schedule = publish(&js, "schedules.retried", &headers, "retried").await;

    // Four occurrences come due while the target refuses them.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    js.update_stream(stream::Config { max_messages: -1, ..full }).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    match owners(&client).await[&schedule.partition].as_str() {
        "a" => a.kill(),
        _ => b.kill(),
    }
    let killed_at = now_ms();
    tokio::time::sleep(Duration::from_millis(6_000)).await;

    let fired: Vec<Stored> = stored(&js).await.into_iter().filter(|s| s.subject == "sched.out").collect();
    let dues: Vec<u64> = fired.iter().filter_map(Stored::due_ms).collect();
    println!("{} occurrences, due {:?}", fired.len(), dues.iter().map(|d| d % 100_000).collect::<Vec<_>>());
    let mut distinct = dues.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), dues.len(), "an occurrence twice: {dues:?}");
    assert!(distinct.windows(2).all(|w| (w[1] - w[0]) % 1_000 == 0), "one grid, one schedule: {dues:?}");
    assert!(
        dues.iter().filter(|&&due| due > killed_at + 2_000).count() >= 2,
        "the schedule fires on after the re-read: {dues:?}"
    );
    // Cancelled by its handle on the node that read it again.
    assert_eq!(
        TierClient::new(client.clone(), "DELAY", "delay", 8).await.unwrap().cancel(schedule).await.unwrap(),
        CancelAnswer::Cancelled
    );
}
