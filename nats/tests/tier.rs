//! The delay tier against a real 3-node JetStream cluster (see `cluster/`).

mod cluster;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cluster::{Cluster, TierNode, collect, now_ms, owners, pending_in_stream, wait_for};
use delaywheel_nats::{CancelAnswer, RescheduleAnswer, TierClient, TimerHandle, wire};
use futures::StreamExt;

const LEASE_MS: u64 = 1500;

/// The cluster with both streams made, or None (SKIPPED) without a server.
async fn cluster() -> Option<(Cluster, async_nats::Client, TierClient)> {
    cluster_with_msg_id_window(Duration::from_secs(120)).await
}

/// [`cluster`] whose delay stream forgets a `Nats-Msg-Id` after `window`.
async fn cluster_with_msg_id_window(window: Duration) -> Option<(Cluster, async_nats::Client, TierClient)> {
    let cluster = Cluster::start(cluster::nats_server()?).await;
    let client = cluster.connect().await;
    cluster::create_target_stream(&client).await;
    cluster::create_delay_stream_with(&client, window).await;
    let tier = TierClient::new(client.clone(), "DELAY", "delay", 8).await.unwrap();
    Some((cluster, client, tier))
}

/// Schedules `count` timers named `<name>-<i>`, due at `due(i)`, 256 at a time.
async fn schedule_many(
    tier: &TierClient,
    name: &str,
    count: usize,
    due: impl Fn(usize) -> u64,
) -> Vec<TimerHandle> {
    let jobs = (0..count).map(|i| {
        let payload = format!("{name}-{i}");
        let at = due(i);
        async move { tier.schedule(&payload, "out.fired", at, Bytes::from(payload.clone())).await.unwrap() }
    });
    futures::stream::iter(jobs).buffered(256).collect().await
}

/// Each of `<name>-0..count` arrived exactly once, nothing arrived early, and
/// nothing else arrived.
fn check_once_never_early(arrivals: &cluster::Arrivals, name: &str, count: usize) {
    assert_each_once(arrivals, name, 0..count);
    assert!(arrivals.early.is_empty(), "early: {:?}", &arrivals.early[..arrivals.early.len().min(5)]);
    assert_eq!(arrivals.count.len(), count, "nothing else arrived");
    let max = arrivals.lateness_ms.iter().max().unwrap();
    println!("{count} timers: lateness p99 {} ms, max {max} ms", p99(&arrivals.lateness_ms));
}

fn assert_each_once(arrivals: &cluster::Arrivals, name: &str, ids: impl IntoIterator<Item = usize>) {
    for i in ids {
        let key = format!("{name}-{i}");
        assert_eq!(arrivals.count.get(&key).copied(), Some(1), "{key}");
    }
}

fn p99(lateness: &[i64]) -> i64 {
    let mut sorted = lateness.to_vec();
    sorted.sort();
    sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_timers_over_two_nodes_fire_once_and_never_early() {
    let Some((cluster, client, tier)) = cluster().await else { return };
    let metrics = cluster::free_addr();
    let _a = TierNode::start_with(&cluster, "a", LEASE_MS, &["--metrics", &metrics]);
    let _b = TierNode::start(&cluster, "b", LEASE_MS);
    let (arrivals, _reader) = collect(&client).await;
    let start = now_ms() + 1_000;
    schedule_many(&tier, "soon", 10_000, |i| start + (i as u64 * 7_919) % 5_000).await;
    let days_ahead = now_ms() + 3 * 86_400_000;
    schedule_many(&tier, "later", 5, |_| days_ahead).await;
    // Headers too large for a local record: indexed by reference, read from
    // the stream when it fires.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Big", "x".repeat(20_000).as_str());
    tier.schedule_with_headers("big", "out.fired", start, headers, Bytes::from("soon-10000")).await.unwrap();
    // Timers without their headers, or due after year 9999, go to the dead
    // letter, and the rest go on.
    jetstream_publish(&client, "delay.0.timer", "malformed").await;
    let beyond = (delaywheel::MAX_DELIVER_AT_MS + 1).to_string();
    tier.schedule("beyond", "out.fired", beyond.parse().unwrap(), Bytes::from("beyond")).await.unwrap();

    wait_for(&arrivals, 10_001, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // room for a duplicate to show
    {
        let arrivals = arrivals.lock().unwrap();
        check_once_never_early(&arrivals, "soon", 10_001);
        assert_eq!(
            arrivals.big_header_len.get("soon-10000"),
            Some(&20_000),
            "the large header arrived whole"
        );
    }
    wait_for_pending(&client, 5).await; // the five days-ahead timers; the two malformed ones left
    // Node a's metrics count what it fired and what it left in the stream.
    let page = cluster::http_get(&metrics, "/metrics");
    let value = |name: &str| -> f64 {
        let line =
            page.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in:\n{page}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let fired = value("delaytier_fired_total");
    assert!((1.0..=10_001.0).contains(&fired), "node a fired {fired}");
    assert!(value("delaytier_partitions_owned") >= 1.0);
    assert!(page.contains("delaytier_lateness_seconds"), "{page}");
    let owners = owners(&client).await;
    assert_eq!(owners.len(), 8, "{owners:?}");
    assert!(owners.values().any(|o| o == "a") && owners.values().any(|o| o == "b"), "{owners:?}");
}

async fn jetstream_publish(client: &async_nats::Client, subject: &str, payload: &'static str) {
    let js = async_nats::jetstream::new(client.clone());
    js.publish(subject.to_string(), Bytes::from_static(payload.as_bytes())).await.unwrap().await.unwrap();
}

/// Waits until the delay stream holds `want` timers: the fired ones leave it
/// when their acknowledgement is applied, or at the next sweep if it was lost.
async fn wait_for_pending(client: &async_nats::Client, want: u64) {
    let start = Instant::now();
    loop {
        let have = pending_in_stream(client).await;
        if have == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the delay stream holds {have} timers, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls until every partition's lease names `node`; how long that took.
async fn wait_until_all_owned_by(client: &async_nats::Client, node: &str, timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let owners = owners(client).await;
        if owners.len() == 8 && owners.values().all(|o| o == node) {
            return start.elapsed();
        }
        assert!(start.elapsed() < timeout, "partitions not moved to {node} within {timeout:?}: {owners:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_node_killed_mid_run_hands_its_partitions_over_and_every_timer_fires_once() {
    let Some((cluster, client, tier)) = cluster().await else { return };
    let mut a = TierNode::start(&cluster, "a", LEASE_MS);
    let _b = TierNode::start(&cluster, "b", LEASE_MS);
    let (arrivals, _reader) = collect(&client).await;
    let start = now_ms() + 1_000;
    schedule_many(&tier, "t", 4_000, |i| start + (i as u64 * 7_919) % 5_000).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let before = arrivals.lock().unwrap().count.len();
    a.kill();
    let failover = wait_until_all_owned_by(&client, "b", Duration::from_secs(15)).await;
    println!(
        "kill -9 of a with {before} of 4000 fired: all partitions on b after {} ms",
        failover.as_millis()
    );
    wait_for(&arrivals, 4_000, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    check_once_never_early(&arrivals.lock().unwrap(), "t", 4_000);
    wait_for_pending(&client, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_nats_server_of_three_killed_loses_nothing() {
    let Some((mut cluster, client, tier)) = cluster().await else { return };
    let _a = TierNode::start(&cluster, "a", LEASE_MS);
    let _b = TierNode::start(&cluster, "b", LEASE_MS);
    let (arrivals, _reader) = collect(&client).await;
    let start = now_ms() + 1_500;
    schedule_many(&tier, "t", 4_000, |i| start + (i as u64 * 7_919) % 4_000).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    cluster.kill(0);
    // What is tested is that nothing is lost; on a busy 2-core CI machine
    // the cluster took over a minute to settle once (1,036 of 4,000 in 60 s).
    wait_for(&arrivals, 4_000, Duration::from_secs(180)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    check_once_never_early(&arrivals.lock().unwrap(), "t", 4_000);
    wait_for_pending(&client, 0).await;
}

/// A direct get is answered by any replica, and one may not have applied
/// yet a timer whose publish the leader acknowledged a moment ago: a
/// client that reads it there to move it, or deletes it with no owner
/// running, must still find it (it once answered `NotFound`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_just_published_is_found_at_once_by_a_client_of_any_server() {
    let Some((cluster, _client, _)) = cluster().await else { return };
    let mut tiers = Vec::new();
    for server in 0..3 {
        let nats = async_nats::connect(cluster.url(server)).await.unwrap();
        tiers.push(TierClient::new(nats, "DELAY", "delay", 8).await.unwrap());
    }
    // Published through one server, moved and cancelled through the others.
    for i in 0..300 {
        let [publisher, mover, canceller] = [i % 3, (i + 1) % 3, (i + 2) % 3].map(|s| &tiers[s]);
        let due = now_ms() + 60_000;
        let name = format!("j{i}");
        let handle = publisher.schedule(&name, "out.fired", due, Bytes::from("x")).await.unwrap();
        let moved = mover.reschedule(handle, due + 1_000).await.unwrap();
        let RescheduleAnswer::Rescheduled(new) = moved else { panic!("{name} {handle}: {moved:?}") };
        let answer = canceller.cancel(new).await.unwrap();
        assert_eq!(answer, CancelAnswer::Cancelled, "{name} {new}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_reschedule_work_from_any_client_with_or_without_an_owner() {
    let Some((cluster, client, _)) = cluster().await else { return };
    let mut a = TierNode::start(&cluster, "a", LEASE_MS);
    let mut b = TierNode::start(&cluster, "b", LEASE_MS);
    // A client of one server only, whichever node owns what.
    let far_client = async_nats::connect(cluster.url(2)).await.unwrap();
    let tier = TierClient::new(far_client, "DELAY", "delay", 8).await.unwrap();
    let (arrivals, _reader) = collect(&client).await;
    wait_until_owned(&client).await;
    let due = now_ms() + 8_000;
    let handles = schedule_many(&tier, "c", 300, |_| due).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // indexed by their owners
    for handle in &handles[..100] {
        assert_eq!(tier.cancel(*handle).await.unwrap(), CancelAnswer::Cancelled, "{handle}");
    }
    // The owner remembers what it cancelled: a client asking again (its
    // first answer late or lost) hears the same.
    assert_eq!(tier.cancel(handles[0]).await.unwrap(), CancelAnswer::Cancelled, "a second cancel");
    let sooner = now_ms() + 1_000;
    assert!(sooner + 3_000 < due, "the cancels took {} ms too long for this test", sooner + 3_000 - due);
    for handle in &handles[100..200] {
        let answer = tier.reschedule(*handle, sooner).await.unwrap();
        assert!(
            matches!(answer, RescheduleAnswer::Rescheduled(new) if new.partition == handle.partition),
            "{answer:?}"
        );
    }
    // A cancel right after the schedule, before the owner has read it.
    let quick = tier.schedule("quick", "out.fired", now_ms() + 500, Bytes::from("quick")).await.unwrap();
    assert_eq!(tier.cancel(quick).await.unwrap(), CancelAnswer::Cancelled);
    // A handle naming the wrong partition cancels nothing.
    let wrong = TimerHandle { partition: (handles[250].partition + 1) % 8, sequence: handles[250].sequence };
    assert_eq!(tier.cancel(wrong).await.unwrap(), CancelAnswer::NotFound);

    wait_for(&arrivals, 200, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    {
        let arrivals = arrivals.lock().unwrap();
        assert!(arrivals.early.is_empty(), "early: {:?}", arrivals.early);
        assert_each_once(&arrivals, "c", 100..300);
        assert_eq!(arrivals.count.len(), 200, "no cancelled timer fired");
        for i in 100..200 {
            let stored = arrivals.stored_at_ms[&format!("c-{i}")];
            assert!(stored < due as i64, "c-{i} fired at its old time");
        }
    }
    let fired = tier.cancel(handles[299]).await.unwrap();
    assert!(matches!(fired, CancelAnswer::NotFound | CancelAnswer::AlreadyFired), "{fired:?}");

    // With no node running, a client cancels in the stream itself.
    assert!(a.stop().success() && b.stop().success(), "SIGTERM stops a node cleanly");
    let due = now_ms() + 1_000;
    let handles = schedule_many(&tier, "n", 10, |_| due).await;
    for handle in &handles[..5] {
        assert_eq!(tier.cancel(*handle).await.unwrap(), CancelAnswer::Cancelled);
    }
    let _c = TierNode::start(&cluster, "c", LEASE_MS);
    wait_for(&arrivals, 205, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let arrivals = arrivals.lock().unwrap();
    assert_each_once(&arrivals, "n", 5..10);
    assert_eq!(arrivals.count.len(), 205);
}

/// A node that gives partitions back to a joining node first stops firing,
/// then unsubscribes from their cancels and answers those that reached it;
/// a request lost in the move is asked again: every cancel asked meanwhile
/// is answered `Cancelled` (by the old owner, the new one, or the client in
/// the stream while neither listens), and each is out of the stream.
/// (Before, the give-back cut off the cancels in flight: one being
/// answered could cancel its timer and leave its client with an error.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_asked_while_partitions_move_to_a_joining_node_are_all_answered() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let Some((cluster, client, tier)) = cluster().await else { return };
    let _a = TierNode::start(&cluster, "a", LEASE_MS);
    wait_until_all_owned_by(&client, "a", Duration::from_secs(15)).await;
    const TIMERS: usize = 20_000;
    let handles = schedule_many(&tier, "m", TIMERS, |_| now_ms() + 600_000).await;
    wait_for_pending(&client, TIMERS as u64).await;
    let _b = TierNode::start(&cluster, "b", LEASE_MS);
    // Cancels go on until half the partitions have moved to b, and 1 s more.
    let enough = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn({
        let (client, enough) = (client.clone(), enough.clone());
        async move {
            let start = Instant::now();
            while owners(&client).await.values().filter(|owner| *owner == "b").count() < 4 {
                assert!(start.elapsed() < Duration::from_secs(20), "b took no partitions in 20 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            enough.store(true, Ordering::Relaxed);
        }
    });
    let answers: Vec<_> = futures::stream::iter(handles)
        .take_while(|_| std::future::ready(!enough.load(Ordering::Relaxed)))
        .map(|handle| {
            let tier = &tier;
            async move { (handle, tier.cancel(handle).await) }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    if !enough.load(Ordering::Relaxed) {
        if watcher.is_finished() {
            return watcher.await.unwrap(); // it failed: b took no partitions
        }
        watcher.abort();
        panic!("all {TIMERS} timers were cancelled before the partitions moved: the test needs more");
    }
    watcher.await.unwrap();
    for (handle, answer) in &answers {
        assert!(matches!(answer, Ok(CancelAnswer::Cancelled)), "cancel of {handle}: {answer:?}");
    }
    println!("{} cancels answered while 4 partitions moved to b", answers.len());
    wait_for_pending(&client, (TIMERS - answers.len()) as u64).await;
}

/// Waits until all eight partitions have an owner.
async fn wait_until_owned(client: &async_nats::Client) {
    let start = Instant::now();
    while owners(client).await.len() < 8 {
        assert!(start.elapsed() < Duration::from_secs(15), "partitions not taken");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server may cap how many messages one pull request asks for
/// (`max_request_batch`); the ingest asks for no more than that, or every
/// pull would be refused and the partition never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_caps_pull_requests_still_has_every_timer_read_and_fired() {
    let Some(server) = cluster::nats_server() else { return };
    let cluster = Cluster::start_with_jetstream(server, "limits { max_request_batch: 100 }").await;
    let client = cluster.connect().await;
    cluster::create_target_stream(&client).await;
    cluster::create_delay_stream(&client).await;
    let tier = TierClient::new(client.clone(), "DELAY", "delay", 8).await.unwrap();
    let _a = TierNode::start(&cluster, "a", LEASE_MS);
    let (arrivals, _reader) = collect(&client).await;
    wait_until_owned(&client).await;
    let start = now_ms() + 1_000;
    schedule_many(&tier, "capped", 2_000, |i| start + (i as u64 * 7_919) % 2_000).await;
    wait_for(&arrivals, 2_000, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    check_once_never_early(&arrivals.lock().unwrap(), "capped", 2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_without_its_directory_rebuilds_from_the_stream() {
    let Some((cluster, client, tier)) = cluster().await else { return };
    let mut a = TierNode::start(&cluster, "a", LEASE_MS);
    let (arrivals, _reader) = collect(&client).await;
    wait_until_owned(&client).await;
    let start = now_ms() + 3_000;
    schedule_many(&tier, "r", 1_000, |i| start + i as u64).await;
    let far = now_ms() + 10 * 86_400_000;
    schedule_many(&tier, "far", 10, |_| far).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    a.kill();
    std::fs::remove_dir_all(&a.dir).unwrap();
    let _a = TierNode::start(&cluster, "a", LEASE_MS);
    wait_for(&arrivals, 1_000, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    check_once_never_early(&arrivals.lock().unwrap(), "r", 1_000);
    wait_for_pending(&client, 10).await; // the far timers wait in the stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_with_the_nats_msg_id_of_a_pending_one_is_dropped_after_jetstreams_window_and_moves_with_it()
{
    // JetStream forgets a Nats-Msg-Id after one second; the tier does not while the timer is pending.
    let Some((cluster, client, tier)) = cluster_with_msg_id_window(Duration::from_secs(1)).await else {
        return;
    };
    let (arrivals, _reader) = collect(&client).await;
    let _node = TierNode::start(&cluster, "a", LEASE_MS);
    let with_id = |id: &str| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id);
        headers
    };
    let due = now_ms() + 5_000;
    let first = tier.schedule_with_headers("order-42", "out.fired", due, with_id("order-42"), "first".into());
    first.await.unwrap();
    // A timer with an id, moved twice while the node owns its partition (so
    // the node, not the client, cancels what each copy replaces): each copy
    // keeps the id and is no duplicate of what it replaces.
    wait_until_owned(&client).await;
    let far = now_ms() + 600_000;
    let other = tier.schedule_with_headers("order-43", "out.fired", far, with_id("order-43"), "other".into());
    let mut moved = other.await.unwrap();
    for to in [far - 1_000, due] {
        match tier.reschedule(moved, to).await.unwrap() {
            RescheduleAnswer::Rescheduled(copy) => moved = copy,
            answer => panic!("a reschedule of a pending timer with an id answered {answer:?}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // A retry from another replica, past JetStream's window: the stream takes it as new.
    let again = tier.schedule_with_headers("order-42", "out.fired", due, with_id("order-42"), "again".into());
    again.await.unwrap();
    wait_for(&arrivals, 2, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    {
        let seen = arrivals.lock().unwrap();
        assert_eq!(seen.count.get("first"), Some(&1));
        assert_eq!(seen.count.get("other"), Some(&1));
        assert_eq!(seen.count.get("again"), None, "the duplicate never fires: {:?}", seen.count);
    }
    wait_for_pending(&client, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_with_the_nats_msg_id_of_one_that_fired_or_was_cancelled_is_dropped_for_the_window_on_any_node()
 {
    // JetStream forgets a Nats-Msg-Id after one second; the tier, 30 s after its timer settled.
    let Some((cluster, client, tier)) = cluster_with_msg_id_window(Duration::from_secs(1)).await else {
        return;
    };
    let (arrivals, _reader) = collect(&client).await;
    const WINDOW_MS: u64 = 30_000;
    let window = WINDOW_MS.to_string();
    let flags = ["--dedup-window-ms", window.as_str()];
    let schedule = |id: &'static str, payload: &'static str, due: u64| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id);
        tier.schedule_with_headers(id, "out.fired", due, headers, payload.into())
    };
    let count = |payload: &str| arrivals.lock().unwrap().count.get(payload).copied();

    let mut first_node = TierNode::start_with(&cluster, "a", LEASE_MS, &flags);
    schedule("order-42", "fired", now_ms() + 1_000).await.unwrap();
    let cancelled = schedule("order-43", "cancelled", now_ms() + 600_000).await.unwrap();
    wait_for(&arrivals, 1, Duration::from_secs(30)).await;
    assert_eq!(tier.cancel(cancelled).await.unwrap(), CancelAnswer::Cancelled);
    let settled_by = Instant::now();

    // Retries from other replicas, past JetStream's window, read by another
    // node: only the bucket of settled ids knows them. With no node running,
    // the client cancels a timer in the stream itself, and records its id too.
    first_node.kill();
    let unowned = schedule("order-45", "cancelled unowned", now_ms() + 600_000).await.unwrap();
    assert_eq!(tier.cancel(unowned).await.unwrap(), CancelAnswer::Cancelled);
    // Past JetStream's own window, however soon the next node takes over.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let _second_node = TierNode::start_with(&cluster, "b", LEASE_MS, &flags);
    wait_until_all_owned_by(&client, "b", Duration::from_secs(60)).await;
    schedule("order-42", "fired, again", now_ms() + 500).await.unwrap();
    schedule("order-43", "cancelled, again", now_ms() + 500).await.unwrap();
    schedule("order-45", "cancelled unowned, again", now_ms() + 500).await.unwrap();
    schedule("order-44", "new", now_ms() + 500).await.unwrap();
    wait_for(&arrivals, 2, Duration::from_secs(30)).await;
    wait_for_pending(&client, 0).await;
    assert!(
        settled_by.elapsed() < Duration::from_millis(WINDOW_MS - 5_000),
        "the retries came too late for this test ({:?}): the machine is too slow",
        settled_by.elapsed()
    );
    assert_eq!((count("fired"), count("new")), (Some(1), Some(1)));
    assert_eq!(count("fired, again"), None, "a retry of a fired timer never fires");
    assert_eq!(count("cancelled, again"), None, "nor one of a cancelled timer");
    assert_eq!(count("cancelled unowned, again"), None, "nor one of a timer cancelled with no owner");
    assert_eq!(count("cancelled"), None);

    // After the window the id is free again.
    tokio::time::sleep(Duration::from_millis(WINDOW_MS + 1_000).saturating_sub(settled_by.elapsed())).await;
    schedule("order-42", "after the window", now_ms() + 500).await.unwrap();
    wait_for(&arrivals, 3, Duration::from_secs(30)).await;
    assert_eq!(count("after the window"), Some(1));
}

/// A node started while no server of its cluster runs waits to connect,
/// and once one runs but the cluster has no quorum (two servers of three
/// down) keeps trying to make the delay stream and its buckets rather than
/// exit; once the servers are back, it takes the partitions and fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_while_its_cluster_has_no_quorum_waits_for_it() {
    let Some(server) = cluster::nats_server() else { return };
    let mut cluster = Cluster::start(server).await;
    let client = cluster.connect().await;
    cluster::create_target_stream(&client).await;
    (0..3).for_each(|i| cluster.kill(i));
    let mut node = TierNode::start(&cluster, "a", LEASE_MS);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(node.is_running(), "the node gave up while no server ran");
    cluster.restart(0);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(node.is_running(), "the node gave up while the cluster had no quorum");
    cluster.restart(1);
    cluster.restart(2);
    let deadline = Instant::now() + Duration::from_secs(60);
    while owners(&client).await.len() < 8 {
        assert!(Instant::now() < deadline, "the node took {:?} of 8 partitions", owners(&client).await.len());
        assert!(node.is_running(), "the node exited");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let tier = TierClient::new(client.clone(), "DELAY", "delay", 8).await.unwrap();
    let (arrivals, _reader) = collect(&client).await;
    tier.schedule("k", "out.fired", now_ms() + 500, Bytes::from("after the quorum")).await.unwrap();
    wait_for(&arrivals, 1, Duration::from_secs(30)).await;
    assert_eq!(arrivals.lock().unwrap().count.get("after the quorum").copied(), Some(1));
}

/// The messages held by each of the streams named.
async fn held_in_streams(client: &async_nats::Client, names: &[String]) -> Vec<u64> {
    let js = async_nats::jetstream::new(client.clone());
    let mut held = Vec::new();
    for name in names {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let asked = async {
                let mut stream = js.get_stream(name).await?;
                stream.info().await.map(|info| info.state.messages).map_err(async_nats::Error::from)
            };
            match asked.await {
                Ok(messages) => break held.push(messages),
                Err(err) => assert!(Instant::now() < deadline, "stream {name} does not answer: {err}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_spread_over_three_delay_streams_fire_once_cancel_and_move_when_a_node_dies() {
    let Some(server) = cluster::nats_server() else { return };
    let cluster = Cluster::start(server).await;
    let client = cluster.connect().await;
    cluster::create_target_stream(&client).await;
    let flags = ["--streams", "3"];
    let mut a = TierNode::start_with(&cluster, "a", LEASE_MS, &flags);
    let _b = TierNode::start_with(&cluster, "b", LEASE_MS, &flags);
    // The nodes make the streams: partition p in DELAY-<p % 3>, on its own subjects.
    let layout = delaywheel_nats::Layout::new("DELAY", "delay", 8).with_streams(3);
    let names: Vec<String> = (0..3).map(|i| layout.stream_name(i)).collect();
    let js = async_nats::jetstream::new(client.clone());
    let made = Instant::now();
    for name in &names {
        while js.get_stream(name).await.is_err() {
            assert!(made.elapsed() < Duration::from_secs(60), "no stream {name}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cluster::wait_for_leader(&js, name).await;
    }
    for (index, name) in (0..).zip(&names) {
        let info = js.get_stream(name).await.unwrap().info().await.unwrap().clone();
        assert_eq!(info.config.subjects, layout.stream_subjects(index), "{name}");
    }
    // A publish while a leader steps down can time out, stored or not (the
    // client says so): the timers go in once the nodes have moved them.
    wait_until_spread(&js, &names).await;
    assert!(js.get_stream("DELAY").await.is_err(), "no stream of the one-stream layout");
    let tier = TierClient::with_layout(client.clone(), layout.clone()).await.unwrap();
    let (arrivals, _reader) = collect(&client).await;
    wait_until_owned(&client).await;

    let start = now_ms() + 3_000;
    let handles = schedule_many(&tier, "s", 3_000, |i| start + (i as u64 * 7_919) % 5_000).await;
    let held = held_in_streams(&client, &names).await;
    assert!(held.iter().all(|&n| n > 0) && held.iter().sum::<u64>() <= 3_000, "held {held:?}");
    // Cancels and reschedules find each timer in its partition's stream.
    let (cancelled, moved) = (&handles[..50], &handles[50..100]);
    for handle in cancelled {
        assert_eq!(tier.cancel(*handle).await.unwrap(), CancelAnswer::Cancelled, "{handle}");
    }
    let later = start + 6_000;
    for handle in moved {
        let answer = tier.reschedule(*handle, later).await.unwrap();
        assert!(matches!(answer, RescheduleAnswer::Rescheduled(_)), "{handle}: {answer:?}");
    }
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    a.kill();
    wait_until_all_owned_by(&client, "b", Duration::from_secs(15)).await;
    wait_for(&arrivals, 2_950, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    {
        let arrivals = arrivals.lock().unwrap();
        assert!(arrivals.early.is_empty(), "early: {:?}", &arrivals.early[..arrivals.early.len().min(5)]);
        assert_each_once(&arrivals, "s", 50..3_000);
        assert_eq!(arrivals.count.len(), 2_950, "no cancelled timer fired");
        for i in 50..100 {
            assert!(
                arrivals.stored_at_ms[&format!("s-{i}")] >= later as i64,
                "s-{i} fired before its new time"
            );
        }
    }
    let start = Instant::now();
    while held_in_streams(&client, &names).await.iter().sum::<u64>() > 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "timers left in the streams");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A node laid out for two streams finds DELAY-0 holding partitions it
    // reads elsewhere: it refuses to start, at once, naming the stream.
    let mut two = TierNode::start_with(&cluster, "two", LEASE_MS, &["--streams", "2"]);
    let start = Instant::now();
    while two.is_running() {
        assert!(start.elapsed() < Duration::from_secs(20), "a node of another stream count kept running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(cluster.dir.path().join("tier-two.log")).unwrap();
    assert!(log.contains("delay stream DELAY-0 captures"), "{log}");
    assert!(owners(&client).await.values().all(|o| o == "b"), "the refused node took nothing");
}

/// The leaders of the streams named, as the cluster reports them now.
async fn leaders_of(js: &async_nats::jetstream::Context, names: &[String]) -> Vec<Option<String>> {
    let mut leaders = Vec::new();
    for name in names {
        let info = match js.get_stream(name).await {
            Ok(stream) => stream.cached_info().cluster.clone(),
            Err(_) => None,
        };
        leaders.push(info.and_then(|c| c.leader));
    }
    leaders
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delay_streams_leaders_piled_on_one_server_are_spread_over_the_servers() {
    let Some(server) = cluster::nats_server() else { return };
    let cluster = Cluster::start(server).await;
    let client = cluster.connect().await;
    let layout = delaywheel_nats::Layout::new("DELAY", "delay", 8).with_streams(3);
    let names: Vec<String> = (0..3).map(|i| layout.stream_name(i)).collect();
    for (index, name) in (0..).zip(&names) {
        let config = async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: layout.stream_subjects(index),
            num_replicas: 3,
            retention: async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
            storage: async_nats::jetstream::stream::StorageType::File,
            allow_direct: true,
            ..Default::default()
        };
        cluster::create_replicated_stream(&client, config).await;
    }
    // Every leader on n0, as after the other servers restarted.
    let js = async_nats::jetstream::new(client.clone());
    let start = Instant::now();
    loop {
        let leaders = leaders_of(&js, &names).await;
        if leaders.iter().all(|l| l.as_deref() == Some("n0")) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "leaders not moved to n0: {leaders:?}");
        for (name, leader) in names.iter().zip(&leaders) {
            if leader.as_deref() != Some("n0") {
                let request = Bytes::from(r#"{"placement":{"preferred":"n0"}}"#);
                let _ = client.request(format!("$JS.API.STREAM.LEADER.STEPDOWN.{name}"), request).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let _a = TierNode::start_with(&cluster, "a", LEASE_MS, &["--streams", "3"]);
    wait_until_spread(&js, &names).await;
}

/// Waits until the three streams `names` are led by three servers (the
/// owner of partition 0 spreads them).
async fn wait_until_spread(js: &async_nats::jetstream::Context, names: &[String]) {
    let start = Instant::now();
    loop {
        let leaders = leaders_of(js, names).await;
        let mut servers: Vec<_> = leaders.iter().flatten().collect();
        servers.sort();
        servers.dedup();
        if servers.len() == 3 {
            println!("leaders spread after {} ms: {leaders:?}", start.elapsed().as_millis());
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "leaders still piled: {leaders:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until node `addr` has written a checkpoint of each of the 8
/// partitions since it wrote `since` in all.
async fn wait_for_checkpoints(addr: &str, since: f64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let page = cluster::http_get(addr, "/metrics");
        let series = page.lines().filter(|l| l.starts_with("delaytier_checkpoints_written_total{")).count();
        if series == 8 && metric(addr, "delaytier_checkpoints_written_total") >= since + 8.0 {
            return;
        }
        assert!(Instant::now() < deadline, "node {addr} wrote checkpoints of {series} partitions");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Why node `addr` read partitions whole, for a failure's message.
fn unused_checkpoints(addr: &str) -> String {
    let page = cluster::http_get(addr, "/metrics");
    page.lines().filter(|l| l.starts_with("delaytier_checkpoint_unused_total")).collect::<Vec<_>>().join("; ")
}

/// The sum of a metric's series on a node's `/metrics` page (0 if absent).
fn metric(addr: &str, name: &str) -> f64 {
    let page = cluster::http_get(addr, "/metrics");
    let series = page.lines().filter(|l| l.split(['{', ' ']).next() == Some(name));
    series.map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap()).sum()
}

/// A node taking a partition over from its last owner's checkpoint (issue
/// 43) indexes the timers the checkpoint names and reads only what the
/// stream handed out after it. Node a writes checkpoints every 1.5 s while
/// timers fire all along; right after one is written, a cancels 20 timers
/// and 200 more are published, and a is killed before its next checkpoint.
/// Node b takes the partitions over from the checkpoints: each timer fires
/// once and never early, those fired or cancelled after the checkpoint do
/// not fire again (they are looked up in the stream first), a cancel of one
/// cancelled then answers `NotFound` (a second acknowledgement would have
/// answered `Cancelled`), and the timers published after the checkpoint fire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_taken_over_from_its_checkpoint_fires_each_timer_once() {
    let Some((cluster, client, tier)) = cluster().await else { return };
    let (metrics_a, metrics_b) = (cluster::free_addr(), cluster::free_addr());
    let every = ["--checkpoint-every-ms", "1500"];
    let mut a =
        TierNode::start_with(&cluster, "a", LEASE_MS, &[&every[..], &["--metrics", &metrics_a]].concat());
    wait_until_owned(&client).await;
    let (arrivals, _reader) = collect(&client).await;
    // 3,000 timers due one every 4 ms from 1 s on: firing around the kill.
    let start = now_ms() + 1_000;
    let firing = schedule_many(&tier, "t", 3_000, |i| start + i as u64 * 4).await;
    wait_for_checkpoints(&metrics_a, metric(&metrics_a, "delaytier_checkpoints_written_total")).await;
    // Just after a checkpoint: cancel, publish, kill, before the next one.
    let cancelled: Vec<TimerHandle> = firing[2_980..3_000].to_vec();
    for handle in &cancelled {
        assert_eq!(tier.cancel(*handle).await.unwrap(), CancelAnswer::Cancelled, "{handle}");
    }
    let after = now_ms() + 4_000;
    schedule_many(&tier, "after", 200, |i| after + i as u64).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // handed out to a
    a.kill();
    let fired_by_a = arrivals.lock().unwrap().count.len();
    let _b =
        TierNode::start_with(&cluster, "b", LEASE_MS, &[&every[..], &["--metrics", &metrics_b]].concat());
    wait_until_all_owned_by(&client, "b", Duration::from_secs(15)).await;
    // Before it is due: b looks it up in the stream, where a removed it.
    assert!(now_ms() < start + 2_980 * 4, "the takeover took too long for this test");
    assert_eq!(tier.cancel(cancelled[0]).await.unwrap(), CancelAnswer::NotFound, "cancelled by a");
    wait_for(&arrivals, 3_000 - 20 + 200, Duration::from_secs(40)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await; // room for a duplicate to show
    {
        let arrivals = arrivals.lock().unwrap();
        assert_each_once(&arrivals, "t", 0..2_980);
        assert_each_once(&arrivals, "after", 0..200);
        assert!(arrivals.early.is_empty(), "early: {:?}", &arrivals.early[..arrivals.early.len().min(5)]);
        assert_eq!(arrivals.count.len(), 3_000 - 20 + 200, "no cancelled timer fired");
    }
    let takeovers = metric(&metrics_b, "delaytier_checkpoint_takeovers_total");
    let skipped = metric(&metrics_b, "delaytier_skipped_total");
    println!(
        "a fired {fired_by_a} before its kill; b took {takeovers} partitions over from checkpoints and passed over {skipped} timers gone since"
    );
    assert_eq!(
        takeovers,
        8.0,
        "every partition taken over from its checkpoint: {}",
        unused_checkpoints(&metrics_b)
    );
    // The cancelled ones but the one cancelled again, and some fired by a
    // after its last checkpoint.
    assert!(skipped >= cancelled.len() as f64, "b passed over only {skipped} timers gone since");
    wait_for_pending(&client, 0).await;
}

/// A partition a node gives back to a joining node is taken over from its
/// checkpoint too: the giver's pull request goes with its subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_handed_to_a_joining_node_are_taken_over_from_their_checkpoints() {
    handed_to_a_joining_node(500, true).await;
}

/// A node giving a partition back writes its checkpoint as it goes, so the
/// next owner reads only what came after it, however long ago the last
/// periodic one was: here the giver writes one an hour, so none before
/// the hand-over (without the final one, the joining node reads each
/// partition whole: `delaytier_checkpoint_unused_total{reason="none"}`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_given_back_is_checkpointed_as_it_goes() {
    handed_to_a_joining_node(3_600_000, false).await;
}

/// Node a owns the 8 partitions and reads 2,000 timers (and, if asked,
/// writes its periodic checkpoints); node b joins and takes 4 of them over
/// from their checkpoints; each timer fires once, never early.
async fn handed_to_a_joining_node(checkpoint_every_ms: u64, wait_for_periodic: bool) {
    let Some((cluster, client, tier)) = cluster().await else { return };
    let (metrics_a, metrics_b) = (cluster::free_addr(), cluster::free_addr());
    let every = checkpoint_every_ms.to_string();
    let every = ["--checkpoint-every-ms", &every];
    let _a =
        TierNode::start_with(&cluster, "a", LEASE_MS, &[&every[..], &["--metrics", &metrics_a]].concat());
    wait_until_owned(&client).await;
    let (arrivals, _reader) = collect(&client).await;
    let start = now_ms() + 4_000;
    schedule_many(&tier, "t", 2_000, |i| start + i as u64 * 2).await;
    if wait_for_periodic {
        wait_for_checkpoints(&metrics_a, 0.0).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&metrics_a, "delaytier_indexed_total") < 2_000.0 {
        assert!(
            Instant::now() < deadline,
            "a indexed {} timers",
            metric(&metrics_a, "delaytier_indexed_total")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _b =
        TierNode::start_with(&cluster, "b", LEASE_MS, &[&every[..], &["--metrics", &metrics_b]].concat());
    while owners(&client).await.values().filter(|o| *o == "b").count() < 4 {
        assert!(Instant::now() < deadline, "b took no partitions");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for(&arrivals, 2_000, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    check_once_never_early(&arrivals.lock().unwrap(), "t", 2_000);
    let takeovers = metric(&metrics_b, "delaytier_checkpoint_takeovers_total");
    let unused = unused_checkpoints(&metrics_b);
    assert_eq!(takeovers, 4.0, "b took its four partitions over from their checkpoints: {unused}");
}

/// An owner that stalls past its lease (a paused process) and wakes to pull
/// once more from its partition's consumer after the next owner took it is
/// handed timers the next owner never sees from that consumer. Here that
/// old owner is a client pulling a few timers at a time from each
/// partition's consumer, never acknowledging them. While 400 timers are
/// published, the owner sees the consumer's delivery count skip and reads
/// the timers it was not handed from the stream. Then bursts of 2 timers
/// go to partition 0 (the server hands the first to the owner's waiting
/// pull request and the next to the stale one) until the stale pull takes
/// the last one published, after which nothing more comes, so only the
/// owner's check of its idle consumer finds it. Every timer fires once, never early (before, those
/// the stale pulls took never fired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_handed_to_a_stale_owners_pull_still_fire_once() {
    let Some((cluster, client, tier)) = cluster().await else { return };
    let _a = TierNode::start(&cluster, "a", LEASE_MS);
    wait_until_owned(&client).await;
    let (arrivals, _reader) = collect(&client).await;
    let mut stream = async_nats::jetstream::new(client.clone()).get_stream("DELAY").await.unwrap();
    let stale = StalePulls::start(&stream, 0..8);
    let start = now_ms() + 4_000;
    schedule_many(&tier, "t", 400, |i| start + i as u64 * 5).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let taken = stale.stop().await;
    assert!(taken > 0, "the stale pulls were handed no timers: the test shows nothing");
    wait_for(&arrivals, 400, Duration::from_secs(30)).await;
    // Names whose timers go to partition 0.
    let mut names = (0..).map(|i| format!("last-{i}")).filter(|n| wire::partition_of(n.as_bytes(), 8) == 0);
    let stale = StalePulls::start(&stream, 0..1);
    let mut published = Vec::new();
    loop {
        assert!(published.len() < 120, "the stale pull never took the last of {} timers", published.len());
        let burst: Vec<String> = names.by_ref().take(2).collect();
        let at = now_ms() + 1_000;
        let publishes = burst.iter().map(|n| tier.schedule(n, "out.fired", at, Bytes::from(n.clone())));
        futures::future::try_join_all(publishes).await.unwrap();
        published.extend(burst);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let last = stream.info().await.unwrap().state.last_sequence;
        if stale.latest() == last {
            break;
        }
    }
    stale.stop().await;
    wait_for(&arrivals, 400 + published.len(), Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let arrivals = arrivals.lock().unwrap();
    assert_each_once(&arrivals, "t", 0..400);
    for name in &published {
        assert_eq!(arrivals.count.get(name).copied(), Some(1), "{name}");
    }
    assert!(arrivals.early.is_empty(), "early: {:?}", &arrivals.early[..arrivals.early.len().min(5)]);
    println!("the stale pulls took {taken} of 400 timers, then the last of {}", published.len());
}

/// A stalled old owner's pulls: from the consumers of `partitions`, a few
/// timers at a time, held and never acknowledged.
struct StalePulls {
    stop: Arc<AtomicBool>,
    taken: Arc<AtomicUsize>,
    /// The highest stream sequence taken.
    latest: Arc<AtomicU64>,
    pulls: Vec<tokio::task::JoinHandle<()>>,
}

impl StalePulls {
    fn start(stream: &async_nats::jetstream::stream::Stream, partitions: std::ops::Range<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (taken, latest) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU64::new(0)));
        let pulls = partitions
            .map(|partition| {
                let (stream, stop) = (stream.clone(), stop.clone());
                let (taken, latest) = (taken.clone(), latest.clone());
                tokio::spawn(async move {
                    let name = format!("delaytier-p{partition}");
                    // Made by the owner once it reads the partition.
                    let deadline = Instant::now() + Duration::from_secs(10);
                    let consumer: async_nats::jetstream::consumer::PullConsumer = loop {
                        match stream.get_consumer(&name).await {
                            Ok(consumer) => break consumer,
                            Err(err) => assert!(Instant::now() < deadline, "{name}: {err}"),
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    };
                    while !stop.load(Ordering::Acquire) {
                        let fetch = consumer.fetch().max_messages(3).expires(Duration::from_millis(300));
                        let mut batch = fetch.messages().await.unwrap();
                        while let Some(Ok(held)) = batch.next().await {
                            taken.fetch_add(1, Ordering::AcqRel);
                            latest.fetch_max(held.info().unwrap().stream_sequence, Ordering::AcqRel);
                        }
                    }
                })
            })
            .collect();
        StalePulls { stop, taken, latest, pulls }
    }

    fn latest(&self) -> u64 {
        self.latest.load(Ordering::Acquire)
    }

    /// Stops pulling; how many timers the pulls took.
    async fn stop(self) -> usize {
        self.stop.store(true, Ordering::Release);
        for pull in self.pulls {
            pull.await.unwrap();
        }
        self.taken.load(Ordering::Acquire)
    }
}

/// A timer that carries a `Nats-Msg-Id` is published again where the
/// delay stream did not answer (its leader stepping down: timed out, or no
/// responders), and the stream keeps it once: 300 timers published over 3
/// s while the leader steps down three times are all acknowledged, with
/// 300 handles, and each fires once (before, some publishes failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_with_a_msg_id_are_published_again_across_a_leader_stepdown_and_kept_once() {
    let Some((cluster, client, tier)) = cluster().await else { return };
    let _a = TierNode::start(&cluster, "a", LEASE_MS);
    wait_until_owned(&client).await;
    let (arrivals, _reader) = collect(&client).await;
    let stepdowns = tokio::spawn({
        let client = client.clone();
        async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(700)).await;
                let asked = client.request("$JS.API.STREAM.LEADER.STEPDOWN.DELAY", Bytes::new()).await;
                println!("stepdown: {:?}", asked.map(|m| String::from_utf8_lossy(&m.payload).into_owned()));
            }
        }
    });
    let start = now_ms() + 25_000;
    let tier = &tier;
    let publishes = (0..300u64).map(|i| async move {
        tokio::time::sleep(Duration::from_millis(i * 10)).await;
        let name = format!("s-{i}");
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", name.as_str());
        let at = start + i;
        tier.schedule_with_headers(&name, "out.fired", at, headers, Bytes::from(name.clone()))
            .await
            .map_err(|e| format!("{name}: {e}"))
    });
    let handles: Vec<_> = futures::future::join_all(publishes).await;
    stepdowns.await.unwrap();
    let failed: Vec<&String> = handles.iter().filter_map(|h| h.as_ref().err()).collect();
    assert!(failed.is_empty(), "{} publishes failed: {:?}", failed.len(), &failed[..failed.len().min(3)]);
    let distinct: std::collections::HashSet<_> = handles.iter().map(|h| h.as_ref().unwrap()).collect();
    assert_eq!(distinct.len(), 300, "one handle a timer");
    wait_for(&arrivals, 300, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    check_once_never_early(&arrivals.lock().unwrap(), "s", 300);
}
