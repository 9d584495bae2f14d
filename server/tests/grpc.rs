//! A tonic client from the same `.proto` against an in-process server on an
//! ephemeral port: send, timed send, recall, receive, ack, invisibility, and
//! the answers to bad requests.

mod client;
mod common;

use std::time::Duration;

use delaywheel::Store;
use delaywheel_server::proto::messaging_service_client::MessagingServiceClient;
use delaywheel_server::proto::*;
use delaywheel_server::{HandleKey, ServeOptions, store_config};
use tonic::transport::Channel;

use client::*;
use common::http_get;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_timed_send_recall_receive_and_ack() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;

    let route =
        client.query_route(QueryRouteRequest { topic: resource("Orders"), endpoints: None }).await.unwrap();
    let route = route.into_inner();
    assert_eq!(code(&route.status), Code::Ok);
    assert_eq!(route.message_queues.len(), 2, "the store's queues per topic");

    let sent = send(client, vec![message("Orders", "n1", "normal", None)]).await;
    assert_eq!(code(&sent.status), Code::Ok);
    assert!(sent.entries[0].recall_handle.is_empty(), "a normal message has nothing to recall");
    let due = now_ms() as i64 + 1_500;
    let timed = send(
        client,
        vec![message("Orders", "t1", "timed", Some(due)), message("Orders", "t2", "recalled", Some(due))],
    )
    .await;
    assert_eq!(code(&timed.status), Code::Ok);
    let recall = RecallMessageRequest {
        topic: resource("Orders"),
        recall_handle: timed.entries[1].recall_handle.clone(),
    };
    let recalled = client.recall_message(recall.clone()).await.unwrap().into_inner();
    assert_eq!((code(&recalled.status), recalled.message_id.as_str()), (Code::Ok, "t2"));

    heartbeat(client, "G").await;
    let (first, status) =
        receive(client, "G", "Orders", Duration::from_secs(2), Duration::from_secs(5)).await;
    assert_eq!(code(&Some(status)), Code::Ok);
    assert_eq!(first.iter().map(body).collect::<Vec<_>>(), ["normal"]);
    let system = first[0].system_properties.as_ref().unwrap();
    assert_eq!((system.message_id.as_str(), system.delivery_attempt), ("n1", Some(1)));
    assert_eq!(
        (system.tag.as_deref(), system.keys.as_slice()),
        (Some("created"), &["order-1".to_string()][..])
    );
    assert_eq!(first[0].user_properties.get("color").map(String::as_str), Some("blue"));
    assert!(
        !first[0].user_properties.keys().any(|k| k.starts_with("__")),
        "the server's properties stay inside"
    );

    // The timed one arrives at its time, not before; the recalled one never.
    let (second, _) = receive(client, "G", "Orders", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(second.iter().map(body).collect::<Vec<_>>(), ["timed"]);
    assert!(now_ms() as i64 >= due);
    assert_eq!(ack(client, "G", "Orders", &second[0]).await, Code::Ok);
    assert_eq!(ack(client, "G", "Orders", &second[0]).await, Code::Ok, "an ack repeated changes nothing");
    // Recalling a delivered message says so.
    let late = RecallMessageRequest {
        topic: resource("Orders"),
        recall_handle: timed.entries[0].recall_handle.clone(),
    };
    assert_eq!(
        code(&client.recall_message(late).await.unwrap().into_inner().status),
        Code::PreconditionFailed
    );

    // "normal" was not acked: it comes back after 2 s, as attempt 2; acking the old receipt is refused.
    let (again, _) = receive(client, "G", "Orders", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(again.iter().map(body).collect::<Vec<_>>(), ["normal"]);
    assert_eq!(again[0].system_properties.as_ref().unwrap().delivery_attempt, Some(2));
    assert_eq!(
        ack(client, "G", "Orders", &first[0]).await,
        Code::InvalidReceiptHandle,
        "the first receipt expired"
    );
    assert_eq!(ack(client, "G", "Orders", &again[0]).await, Code::Ok);
    // Another group reads the topic from the start, on its own.
    heartbeat(client, "H").await;
    let (other, _) = receive(client, "H", "Orders", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(other.iter().map(body).collect::<Vec<_>>(), ["normal", "timed"]);
    // A receipt of group H does not ack for G.
    assert_eq!(ack(client, "G", "Orders", &other[0]).await, Code::InvalidReceiptHandle);
    let (nothing, status) =
        receive(client, "G", "Orders", Duration::from_secs(30), Duration::from_secs(1)).await;
    assert!(nothing.is_empty());
    assert_eq!(code(&Some(status)), Code::MessageNotFound);

    let (_, metrics) = http_get(server.http, "/metrics").await;
    assert!(metrics.contains("delaywheel_grpc_acks_total 3"), "{metrics}");
    assert!(
        metrics.contains("delaywheel_consumer_lag_messages{group=\"G\",topic=\"Orders\",queue=\"0\"} 0"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_invisible_duration_moves_the_redelivery() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    send(client, vec![message("Jobs", "j1", "job", None)]).await;
    heartbeat(client, "G").await;
    let (got, _) = receive(client, "G", "Jobs", Duration::from_secs(1), Duration::from_secs(5)).await;
    let system = got[0].system_properties.as_ref().unwrap();
    let change = ChangeInvisibleDurationRequest {
        group: resource("G"),
        topic: resource("Jobs"),
        receipt_handle: system.receipt_handle.clone().unwrap(),
        invisible_duration: Some(prost_types::Duration { seconds: 3600, nanos: 0 }),
        message_id: "j1".into(),
    };
    let changed = client.change_invisible_duration(change).await.unwrap().into_inner();
    assert_eq!(code(&changed.status), Code::Ok);
    assert_eq!(Some(changed.receipt_handle), system.receipt_handle, "the receipt stays valid");
    // Without the change it would be back after 1 s.
    let (none, _) = receive(client, "G", "Jobs", Duration::from_secs(1), Duration::from_secs(3)).await;
    assert!(none.is_empty(), "invisible for an hour now");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_the_field_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    let mut oversized = message("Orders", "big", "", None);
    oversized.body = vec![b'x'; 4 << 20 | 1];
    let mut no_id = message("Orders", "", "b", None);
    no_id.system_properties.as_mut().unwrap().message_id.clear();
    let mut reserved = message("Orders", "r", "b", None);
    reserved.user_properties.insert("__MSGID".into(), "x".into());
    let mut timed_fifo = message("Orders", "f", "b", Some(now_ms() as i64 + 60_000));
    timed_fifo.system_properties.as_mut().unwrap().message_group = Some("g".into());
    let mut fifo_without_group = message("Orders", "f", "b", None);
    fifo_without_group.system_properties.as_mut().unwrap().message_type = MessageType::Fifo as i32;
    let mut long_group = message("Orders", "f", "b", None);
    long_group.system_properties.as_mut().unwrap().message_group = Some("g".repeat(65));
    let mut transactional = message("Orders", "t", "b", None);
    transactional.system_properties.as_mut().unwrap().message_type = MessageType::Transaction as i32;
    let cases = [
        (message("bad topic!", "a", "b", None), Code::IllegalTopic, "topic.name"),
        (message("%RETRY%G|Orders", "a", "b", None), Code::IllegalTopic, "topic.name"),
        (message("Orders", "a", "b", Some(-1_000)), Code::IllegalDeliveryTime, "before 1970"),
        (message("Orders", "a", "b", Some(253_402_300_800_000)), Code::IllegalDeliveryTime, "9999"),
        (message("Orders", "a", "", None), Code::MessageBodyEmpty, "body"),
        (oversized, Code::MessageBodyTooLarge, "body"),
        (no_id, Code::IllegalMessageId, "message_id"),
        (reserved, Code::IllegalMessagePropertyKey, "__MSGID"),
        (
            timed_fifo,
            Code::MessagePropertyConflictWithType,
            "message_group: a FIFO message (with a message group) has no delivery time",
        ),
        (
            fifo_without_group,
            Code::MessagePropertyConflictWithType,
            "message_group: a FIFO message needs one",
        ),
        (long_group, Code::IllegalMessageGroup, "message_group: must be 1 to 64 bytes"),
        (transactional, Code::Unsupported, "transactional messages"),
    ];
    for (bad, want, names) in cases {
        // A good message first: nothing of a request is stored unless all of it is.
        let answer = send(client, vec![message("Orders", "good", "good", None), bad]).await;
        let status = answer.status.unwrap();
        assert_eq!(Code::try_from(status.code).unwrap(), want, "{}", status.message);
        assert!(status.message.contains(names), "{names}: {}", status.message);
    }
    let recall =
        |handle: &str| RecallMessageRequest { topic: resource("Orders"), recall_handle: handle.to_string() };
    for garbage in ["", "r1.1.2.3", "r1.0.1796174066000.3caef89d3f645ae70aa6929aa2cb5657.id", "\u{0}\u{ff}"] {
        let answer = client.recall_message(recall(garbage)).await.unwrap().into_inner();
        let status = answer.status.unwrap();
        assert_eq!(Code::try_from(status.code).unwrap(), Code::BadRequest, "{garbage:?}");
        assert!(status.message.starts_with("recall_handle: "), "{}", status.message);
    }
    // A group no client used has no assignment; a receive makes it, as the
    // official clients may receive before their settings are answered.
    let assignment = |group: &str| QueryAssignmentRequest {
        topic: resource("Orders"),
        group: resource(group),
        endpoints: None,
    };
    let unknown = client.query_assignment(assignment("Nobody")).await.unwrap().into_inner();
    assert_eq!(code(&unknown.status), Code::ConsumerGroupNotFound, "{:?}", unknown.status);
    let (got, status) =
        receive(client, "Nobody", "Orders", Duration::from_secs(5), Duration::from_secs(1)).await;
    assert!(got.is_empty(), "no refused request stored anything");
    assert_eq!(Code::try_from(status.code).unwrap(), Code::MessageNotFound, "{}", status.message);
    let known = client.query_assignment(assignment("Nobody")).await.unwrap().into_inner();
    assert_eq!((code(&known.status), known.assignments.len()), (Code::Ok, 2));
    let (_, status) =
        receive(client, "bad|group", "Orders", Duration::from_secs(5), Duration::from_secs(1)).await;
    assert_eq!(Code::try_from(status.code).unwrap(), Code::IllegalConsumerGroup, "{}", status.message);
    // An RPC delaywheel does not implement says so.
    let refused = client.end_transaction(EndTransactionRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
    assert!(refused.message().contains("transactional messages are not supported"), "{}", refused.message());
    // The HTTP side: a bad window is a 400 naming the parameter.
    let (status, text) = http_get(server.http, "/pending?from=soon").await;
    assert!(status.contains("400") && text.contains("from:"), "{status} {text}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_last_attempt_a_message_goes_to_the_dead_letter_topic() {
    let dir = tempfile::tempdir().unwrap();
    let options =
        ServeOptions { max_delivery_attempts: 2, ..ServeOptions::loopback(HandleKey::from_bytes([3; 32])) };
    let mut server = start_with(dir.path(), options).await;
    let client = &mut server.client;
    send(client, vec![message("Jobs", "p1", "poison", None)]).await;
    heartbeat(client, "G").await;
    for attempt in 1..=2 {
        let (got, _) = receive(client, "G", "Jobs", Duration::from_secs(1), Duration::from_secs(5)).await;
        assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["poison"], "attempt {attempt}");
        assert_eq!(got[0].system_properties.as_ref().unwrap().delivery_attempt, Some(attempt));
    }
    // Not acked twice: it does not come a third time.
    let (none, _) = receive(client, "G", "Jobs", Duration::from_secs(1), Duration::from_secs(3)).await;
    assert!(none.is_empty());
    // Any group may read the dead letters, which name where they came from; nobody may send there.
    let request = QueryRouteRequest { topic: resource("%DLQ%G"), endpoints: None };
    let route = client.query_route(request).await.unwrap().into_inner();
    assert_eq!(code(&route.status), Code::Ok);
    assert!(route.message_queues.iter().all(|q| q.permission == Permission::Read as i32));
    let (letters, _) =
        receive(client, "Ops", "%DLQ%G", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(letters.iter().map(body).collect::<Vec<_>>(), ["poison"]);
    let origin = |name: &str| letters[0].user_properties.get(name).map(String::as_str);
    assert_eq!(origin("DLQ_ORIGIN_TOPIC"), Some("Jobs"));
    assert_eq!(origin("DLQ_ORIGIN_MESSAGE_ID"), Some("p1"));
    assert_eq!(origin("color"), Some("blue"), "the message's own properties stay");
    assert_eq!(ack(client, "Ops", "%DLQ%G", &letters[0]).await, Code::Ok);
    let refused = send(client, vec![message("%DLQ%G", "p2", "forged", None)]).await;
    assert_eq!(code(&refused.status), Code::IllegalTopic);
    server.stop().await;
    let store = Store::open(store_config(dir.path()).with_queues_per_topic(2)).unwrap();
    let mut dead = store.consumer("%DLQ%G", 0).unwrap();
    let letters = dead.poll(10, Duration::from_secs(1)).unwrap();
    assert_eq!(letters.iter().map(|m| &m.body()[..]).collect::<Vec<_>>(), [&b"poison"[..]]);
    let attempt = letters[0].properties().iter().find(|(k, _)| k == "__ATTEMPT").map(|(_, v)| v.as_str());
    assert_eq!(attempt, Some("3"), "the attempt it would have been");
}

/// The value of property `name` of a stored message.
fn property_of<'a>(m: &'a delaywheel::ConsumedMessage, name: &str) -> Option<&'a str> {
    m.properties().iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_leaves_room_for_the_retry_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    // Under the store's limit with the server's own properties, but not with a retry copy's.
    let mut big = message("Jobs", "big", "big", None);
    big.user_properties.insert("blob".into(), "x".repeat(delaywheel::MAX_PROPERTIES_LEN - 300));
    let answer = send(client, vec![big]).await;
    assert_eq!(code(&answer.status), Code::MessagePropertiesTooLarge);
    let why = &answer.status.as_ref().unwrap().message;
    assert!(why.starts_with("user_properties: ") && why.contains("retry copy"), "{why}");
    // The largest a send takes is received, and comes back as a retry copy.
    let mut largest = message("Jobs", "largest", "largest", None);
    let room = delaywheel_server::receive::MAX_SENT_PROPERTIES_LEN - 200;
    largest.user_properties.insert("blob".into(), "x".repeat(room));
    let answer = send(client, vec![largest]).await;
    assert_eq!(code(&answer.entries[0].status), Code::Ok);
    heartbeat(client, "G").await;
    for attempt in 1..=2 {
        let (got, status) =
            receive(client, "G", "Jobs", Duration::from_secs(1), Duration::from_secs(5)).await;
        assert_eq!(code(&Some(status)), Code::Ok, "attempt {attempt}");
        assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["largest"], "attempt {attempt}");
        assert_eq!(got[0].user_properties["blob"].len(), room);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_with_no_room_for_its_retry_copy_is_dead_lettered_not_a_poison() {
    let dir = tempfile::tempdir().unwrap();
    // Stored by other means than a send (the library), at the store's own limit.
    let store = Store::open(store_config(dir.path()).with_queues_per_topic(2)).unwrap();
    let blob = "x".repeat(delaywheel::MAX_PROPERTIES_LEN - 4 - "blob".len());
    store.put(delaywheel::Message::new("Jobs", "huge").queue_id(0).property("blob", blob)).unwrap();
    for n in 0..3 {
        store.put(delaywheel::Message::new("Jobs", format!("good {n}")).queue_id(0)).unwrap();
    }
    store.close().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    heartbeat(client, "G").await;
    let (got, status) = receive(client, "G", "Jobs", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(code(&Some(status)), Code::Ok);
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["good 0", "good 1", "good 2"]);
    server.stop().await;
    let store = Store::open(store_config(dir.path()).with_queues_per_topic(2)).unwrap();
    let letters = store.consumer("%DLQ%G", 0).unwrap().poll(10, Duration::from_secs(1)).unwrap();
    assert_eq!(letters.iter().map(|m| &m.body()[..]).collect::<Vec<_>>(), [&b"huge"[..]]);
    let reason = property_of(&letters[0], "__DLQ_REASON").unwrap();
    assert!(reason.contains("no room for a retry copy"), "{reason}");
    assert_eq!(property_of(&letters[0], "__TOPIC"), Some("Jobs"));
    assert_eq!(property_of(&letters[0], "blob"), None, "the user properties that did not fit are dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_delay_level_and_a_dropped_receive() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    let mut legacy = message("Orders", "l1", "level-1", None);
    legacy.user_properties.insert("DELAY".into(), "1".into());
    let sent_at = now_ms();
    let sent = send(client, vec![legacy]).await;
    assert_eq!(code(&sent.status), Code::Ok);
    assert!(!sent.entries[0].recall_handle.is_empty(), "a level is a timer too");
    heartbeat(client, "G").await;
    // A client that goes away mid-receive loses nothing: the message comes
    // now, or after its invisible duration.
    let request = receive_request("G", "Orders", Duration::from_secs(1), Duration::from_secs(5));
    drop(client.receive_message(request).await.unwrap());
    let (got, _) = receive(client, "G", "Orders", Duration::from_secs(30), Duration::from_secs(10)).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["level-1"]);
    let system = got[0].system_properties.as_ref().unwrap();
    assert_eq!(system.message_type, MessageType::Delay as i32);
    let due = system.delivery_timestamp.as_ref().unwrap();
    let due_ms = due.seconds as u64 * 1000 + due.nanos as u64 / 1_000_000;
    assert!(due_ms >= sent_at + 1_000 && now_ms() >= due_ms, "level 1 is 1 s after the send");
    let mut bad = message("Orders", "l2", "b", None);
    bad.user_properties.insert("DELAY".into(), "19".into());
    let refused = send(client, vec![bad]).await;
    assert_eq!(code(&refused.status), Code::IllegalDeliveryTime);
    server.stop().await;
}

/// A `QueryRoute` for `Orders` with `headers` (name, value).
async fn route_with(
    client: &mut MessagingServiceClient<Channel>,
    headers: &[(&'static str, String)],
) -> Result<QueryRouteResponse, tonic::Status> {
    let mut request = tonic::Request::new(QueryRouteRequest { topic: resource("Orders"), endpoints: None });
    for (name, value) in headers {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    client.query_route(request).await.map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_credentials_every_call_must_be_signed() {
    use delaywheel_server::Credentials;
    use delaywheel_server::auth::{AUTHORIZATION, DATE_TIME};
    let dir = tempfile::tempdir().unwrap();
    let credentials = Credentials::new("ak", "the-secret");
    let options = ServeOptions {
        credentials: Some(credentials.clone()),
        ..ServeOptions::loopback(HandleKey::from_bytes([3; 32]))
    };
    let mut server = start_with(dir.path(), options).await;
    let client = &mut server.client;
    let date_time = "20261204T080000Z".to_string();
    let signed = [(DATE_TIME, date_time.clone()), (AUTHORIZATION, credentials.authorization(&date_time))];
    let route = route_with(client, &signed).await.unwrap();
    assert_eq!(code(&route.status), Code::Ok);
    assert!(!route.message_queues.is_empty());

    let unsigned = route_with(client, &[]).await.unwrap_err();
    assert_eq!(unsigned.code(), tonic::Code::Unauthenticated);
    assert!(unsigned.message().starts_with("authorization: missing"), "{}", unsigned.message());
    let wrong_secret = Credentials::new("ak", "not-the-secret").authorization(&date_time);
    let forged = route_with(client, &[(DATE_TIME, date_time.clone()), (AUTHORIZATION, wrong_secret)]).await;
    assert_eq!(forged.unwrap_err().code(), tonic::Code::Unauthenticated);
    // A streaming call is checked too, before anything is received.
    let request = receive_request("G", "Orders", Duration::from_secs(1), Duration::from_secs(1));
    let refused = client.receive_message(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    server.stop().await;
}

/// Whether the server closed `stream` within `within` (a read ends or fails).
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut byte = [0u8; 1];
    match tokio::time::timeout(within, stream.read(&mut byte)).await {
        Ok(Ok(0) | Err(_)) => true,
        Ok(Ok(_)) => false, // the server spoke (an HTTP/2 preface): read on
        Err(_) => false,
    }
}

/// Whether the server closed `stream` within `within`, reading past what it says.
async fn drained_and_closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        if closed_within(stream, left).await {
            return true;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_and_capped_live_ones_are_not() {
    use delaywheel_server::ConnectionLimits;
    use tokio::io::AsyncWriteExt as _;
    let dir = tempfile::tempdir().unwrap();
    let limits = ConnectionLimits { max_connections: 6, idle_timeout: Duration::from_secs(3) };
    let options = ServeOptions { limits, ..ServeOptions::loopback(HandleKey::from_bytes([3; 32])) };
    let mut server = start_with(dir.path(), options).await;
    // The test's client holds one gRPC connection; five silent ones fill the cap.
    let mut silent = Vec::new();
    for _ in 0..5 {
        silent.push(tokio::net::TcpStream::connect(server.grpc).await.unwrap());
    }
    let mut half_sent = tokio::net::TcpStream::connect(server.http).await.unwrap();
    half_sent.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut over = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
    assert!(closed_within(&mut over, Duration::from_secs(2)).await, "over the cap: closed at once");
    // A live client's long poll outlasts the idle timeout: the pings keep it.
    let client = &mut server.client;
    heartbeat(client, "G").await;
    let (got, status) = receive(client, "G", "Idle", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert!(got.is_empty());
    assert_eq!(code(&Some(status)), Code::MessageNotFound, "the poll ran its course");
    // By now the silent ones are gone, the half-sent request too.
    for (n, stream) in silent.iter_mut().enumerate() {
        assert!(drained_and_closed_within(stream, Duration::from_secs(3)).await, "silent connection {n}");
    }
    assert!(drained_and_closed_within(&mut half_sent, Duration::from_secs(3)).await, "half-sent request");
    // Their places are free again.
    let mut again = MessagingServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    let answer = send(&mut again, vec![message("Idle", "after", "after", None)]).await;
    assert_eq!(code(&answer.status), Code::Ok);
    drop(again);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_wait_without_threads_and_end_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    heartbeat(&mut server.client, "G").await;
    let wait = Duration::from_secs(3);
    // 120 polls of one group over 4 connections (each takes 64 at most).
    let mut polls = Vec::new();
    for _ in 0..4 {
        let client = MessagingServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
        for _ in 0..30 {
            let mut client = client.clone();
            polls.push(tokio::spawn(async move {
                let started = std::time::Instant::now();
                let (got, _) = receive(&mut client, "G", "Polled", Duration::from_secs(30), wait).await;
                (got.iter().map(|m| body(m).to_string()).collect::<Vec<_>>(), started.elapsed())
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = std::time::Instant::now();
    let answer = send(&mut server.client, vec![message("Polled", "m1", "one", None)]).await;
    assert_eq!(code(&answer.status), Code::Ok);
    assert!(sent.elapsed() < wait, "a send waited {:?} behind the polls", sent.elapsed());
    let mut got = Vec::new();
    let mut longest = Duration::ZERO;
    for poll in polls {
        let (bodies, took) = poll.await.unwrap();
        got.extend(bodies);
        longest = longest.max(took);
    }
    assert_eq!(got, ["one"], "the message went to exactly one poll");
    // Not a timing target: polls that queued on the group's lock took several times their wait.
    assert!(longest < wait * 2, "a poll of {wait:?} took {longest:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_whose_client_gave_up_takes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    heartbeat(client, "G").await;
    let abandoned = receive(client, "G", "Given", Duration::from_secs(30), Duration::from_secs(20));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), abandoned).await.is_err(),
        "nothing to receive yet"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = send(client, vec![message("Given", "m1", "for the next poll", None)]).await;
    assert_eq!(code(&answer.status), Code::Ok);
    // The abandoned poll is gone: it did not hand the message to nobody.
    let (got, _) = receive(client, "G", "Given", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["for the next poll"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_receive_hands_out_a_bounded_number_of_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    let big = |n: usize| {
        let mut m = message("Big", &format!("m{n}"), "", None);
        m.body = vec![b'0' + n as u8; 1536 << 10];
        m
    };
    for n in 0..4 {
        assert_eq!(code(&send(client, vec![big(n)]).await.status), Code::Ok);
    }
    heartbeat(client, "G").await;
    let mut batches = Vec::new();
    while batches.iter().map(Vec::len).sum::<usize>() < 4 {
        let (got, _) = receive(client, "G", "Big", Duration::from_secs(30), Duration::from_secs(5)).await;
        assert!(!got.is_empty(), "after {batches:?}");
        let total: usize = got.iter().map(|m| m.body.len()).sum();
        assert!(total <= delaywheel_server::receive::MAX_RECEIVE_BYTES, "{total} bytes in one receive");
        batches.push(got.iter().map(|m| m.body[0] - b'0').collect::<Vec<_>>());
    }
    assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2], "{batches:?}");
    let mut all = batches.concat();
    all.sort();
    assert_eq!(all, [0, 1, 2, 3], "none twice, none skipped");
    server.stop().await;
}

/// A send is appended on the async thread when that takes no wait, else
/// on the blocking pool: sends that need new segments (file work, left to
/// the pool) are stored like the rest, each message once. (Small segments:
/// a receive's retry copies are one batch, which must fit in one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_across_segment_rolls_are_each_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_config(dir.path()).with_queues_per_topic(2).with_segment_size(256 << 10);
    let mut server =
        start_on(Store::open(config).unwrap(), ServeOptions::loopback(HandleKey::from_bytes([3; 32]))).await;
    let sends = (0..8).map(|sender| {
        let mut client = server.client.clone();
        tokio::spawn(async move {
            for request in 0..20 {
                let batch = (0..4)
                    .map(|i| {
                        let mut m = message("Rolls", &format!("s{sender}r{request}m{i}"), "", None);
                        m.body = format!("{sender}.{request}.{i}.{}", "z".repeat(1000)).into_bytes();
                        m
                    })
                    .collect();
                assert_eq!(code(&send(&mut client, batch).await.status), Code::Ok);
            }
        })
    });
    for sender in sends.collect::<Vec<_>>() {
        sender.await.unwrap();
    }
    heartbeat(&mut server.client, "G").await;
    let mut bodies = std::collections::BTreeSet::new();
    let mut received = 0;
    while received < 640 {
        let (got, status) =
            receive(&mut server.client, "G", "Rolls", Duration::from_secs(30), Duration::from_secs(5)).await;
        assert!(!got.is_empty(), "{received} of 640 received: {status:?}");
        received += got.len();
        bodies
            .extend(got.iter().map(|m| String::from_utf8_lossy(&m.body[..m.body.len() - 1001]).into_owned()));
    }
    assert_eq!((received, bodies.len()), (640, 640), "each of 8 x 20 x 4 once");
    let segments = std::fs::read_dir(dir.path().join("commitlog")).unwrap().count();
    assert!(segments >= 3, "640 KB of messages in 256 KiB segments: {segments} files");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_size_limit_is_resource_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let mut huge = message("Orders", "huge", "", None);
    huge.body = vec![b'x'; 6 << 20];
    let request = SendMessageRequest { messages: vec![huge] };
    let refused = server.client.send_message(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_topics_past_the_cap_are_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let options = ServeOptions { max_topics: 4, ..ServeOptions::loopback(HandleKey::from_bytes([3; 32])) };
    let mut server = start_with(dir.path(), options).await;
    let client = &mut server.client;
    let to = |topic: &str| message(topic, &format!("to-{topic}"), "b", None);
    assert_eq!(code(&send(client, vec![to("T1"), to("T2")]).await.status), Code::Ok);
    let answer = send(client, vec![to("T1"), to("T3"), to("T4"), to("T5")]).await;
    assert_eq!(code(&answer.status), Code::Forbidden);
    let why = &answer.status.as_ref().unwrap().message;
    assert!(why.starts_with("topic.name: 3 new topic(s)") && why.contains("cap of 4"), "{why}");
    // A receive makes its retry and dead-letter topics: two more than T1's.
    heartbeat(client, "G").await;
    let (got, status) = receive(client, "G", "T1", Duration::from_secs(30), Duration::from_secs(1)).await;
    assert_eq!(code(&Some(status)), Code::Ok);
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["b"], "nothing of the refused request was stored");
    let (_, status) = receive(client, "G", "T2", Duration::from_secs(30), Duration::from_secs(1)).await;
    assert_eq!(code(&Some(status)), Code::Forbidden);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_every_consumer_needs_digest_defaults_and_a_nack() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    // The settings answer: a batch size, a long poll, and the delay levels as the nack backoff.
    let settings = consumer_settings(client, "G").await;
    let Some(settings::PubSub::Subscription(subscription)) = &settings.pub_sub else {
        panic!("{settings:?}")
    };
    assert_eq!(subscription.receive_batch_size, Some(128));
    assert_eq!(subscription.long_polling_timeout.map(|d| d.seconds), Some(20));
    let policy = settings.backoff_policy.unwrap();
    assert_eq!(policy.max_attempts, 16);
    let Some(retry_policy::Strategy::CustomizedBackoff(backoff)) = policy.strategy else {
        panic!("{policy:?}")
    };
    let next: Vec<i64> = backoff.next.iter().map(|d| d.seconds).collect();
    assert_eq!(next[..5], [1, 5, 10, 30, 60]);
    assert_eq!(next.len(), 18);

    send(client, vec![message("Jobs", "j1", "nack me", None)]).await;
    // A PushConsumer's receive: no batch size, no invisible duration, auto_renew.
    let request = ReceiveMessageRequest {
        batch_size: 0,
        invisible_duration: None,
        auto_renew: true,
        ..receive_request("G", "Jobs", Duration::from_secs(1), Duration::from_secs(5))
    };
    let (got, _) = receive_with(client, request).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["nack me"]);
    let system = got[0].system_properties.as_ref().unwrap();
    assert_eq!(system.invisible_duration.map(|d| d.seconds), Some(60), "the proxy's default");
    let digest = system.body_digest.as_ref().expect("every received message has a body digest");
    assert_eq!(digest.r#type, DigestType::Md5 as i32);
    assert_eq!(digest.checksum, "AECD4C7B3CF04FEC66619A7F31AC0939", "MD5, upper-case hex");
    // A nack: invisible for 0 s, so back at once, as attempt 2 (not after the 60 s).
    let nack = ChangeInvisibleDurationRequest {
        group: resource("G"),
        topic: resource("Jobs"),
        receipt_handle: system.receipt_handle.clone().unwrap(),
        invisible_duration: Some(prost_types::Duration { seconds: 0, nanos: 0 }),
        message_id: "j1".into(),
    };
    assert_eq!(code(&client.change_invisible_duration(nack).await.unwrap().into_inner().status), Code::Ok);
    let (again, _) = receive(client, "G", "Jobs", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(again.iter().map(body).collect::<Vec<_>>(), ["nack me"]);
    assert_eq!(again[0].system_properties.as_ref().unwrap().delivery_attempt, Some(2));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_carries_at_most_64_requests_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    heartbeat(&mut server.client, "G").await;
    let wait = Duration::from_secs(2);
    // 100 long polls on one connection: 64 run, the rest wait for a stream.
    let started = std::time::Instant::now();
    let polls: Vec<_> = (0..100)
        .map(|_| {
            let mut client = server.client.clone();
            tokio::spawn(async move {
                receive(&mut client, "G", "Streams", Duration::from_secs(30), wait).await;
                started.elapsed()
            })
        })
        .collect();
    let mut took = Vec::new();
    for poll in polls {
        took.push(poll.await.unwrap());
    }
    took.sort();
    assert!(took[63] < wait * 2, "the first 64 ran at once: {:?}", took[63]);
    assert!(took[64] >= wait * 2, "the 65th waited for one of them: {:?}", took[64]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_keep_their_topics_and_groups_apart() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    let in_ns = |namespace: &str, name: &str| {
        Some(Resource { resource_namespace: namespace.to_string(), name: name.to_string() })
    };
    for namespace in ["shop", "bank"] {
        let mut m = message("Orders", namespace, namespace, None);
        m.topic = in_ns(namespace, "Orders");
        assert_eq!(code(&send(client, vec![m]).await.status), Code::Ok);
    }
    for namespace in ["shop", "bank"] {
        let route = QueryRouteRequest { topic: in_ns(namespace, "Orders"), endpoints: None };
        let route = client.query_route(route).await.unwrap().into_inner();
        assert!(route.message_queues.iter().all(|q| q.topic == in_ns(namespace, "Orders")));
        let request = ReceiveMessageRequest {
            group: in_ns(namespace, "G"),
            message_queue: Some(MessageQueue { topic: in_ns(namespace, "Orders"), ..Default::default() }),
            ..receive_request("", "", Duration::from_secs(30), Duration::from_secs(3))
        };
        let (got, _) = receive_with(client, request).await;
        assert_eq!(got.iter().map(body).collect::<Vec<_>>(), [namespace], "only its own namespace's");
        assert_eq!(got[0].topic, in_ns(namespace, "Orders"));
        let ack = AckMessageRequest {
            group: in_ns(namespace, "G"),
            topic: in_ns(namespace, "Orders"),
            entries: vec![AckMessageEntry {
                message_id: namespace.into(),
                receipt_handle: got[0].system_properties.as_ref().unwrap().receipt_handle.clone().unwrap(),
            }],
        };
        assert_eq!(code(&client.ack_message(ack).await.unwrap().into_inner().status), Code::Ok);
    }
    // Nothing in the default namespace, and no spelling of a wrapped name reaches one.
    let (none, _) = receive(client, "G", "Orders", Duration::from_secs(30), Duration::from_millis(500)).await;
    assert!(none.is_empty());
    let (_, status) = receive(client, "G", "shop%Orders", Duration::from_secs(30), Duration::ZERO).await;
    assert_eq!(code(&Some(status)), Code::IllegalTopic);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_answers_before_its_calls_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    // Rust's official client sets the call's deadline to the long poll it asks for.
    let mut request =
        tonic::Request::new(receive_request("G", "T", Duration::from_secs(30), Duration::from_secs(20)));
    request.set_timeout(Duration::from_secs(1));
    let mut stream = server.client.receive_message(request).await.unwrap().into_inner();
    let mut status = None;
    while let Some(answer) = stream.message().await.expect("answered, not cut off by the deadline") {
        if let Some(receive_message_response::Content::Status(s)) = answer.content {
            status = Some(s);
        }
    }
    assert_eq!(code(&status), Code::MessageNotFound, "a 'no message' answer, in the call's second");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedules_occurrences_carry_its_handle_number_and_next_also_when_redelivered() {
    use delaywheel::{Message as StoreMessage, Recurrence, Schedule};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(store_config(dir.path()).with_queues_per_topic(2)).unwrap();
    let start = (now_ms() / 1000 + 2) * 1000;
    let every =
        Schedule::new(StoreMessage::new("Reports", "tick"), Recurrence::every(Duration::from_secs(1)))
            .start_at_ms(start)
            .limit(2);
    let schedule = store.schedule(every).unwrap().handle().to_string();
    let mut server = start_on(store, ServeOptions::loopback(HandleKey::from_bytes([3; 32]))).await;
    let client = &mut server.client;
    heartbeat(client, "G").await;

    let mut seen: Vec<Message> = Vec::new();
    while seen.len() < 2 {
        let (got, _) = receive(client, "G", "Reports", Duration::from_secs(2), Duration::from_secs(5)).await;
        for m in got {
            // Acked at once, before its invisibility ends (a busy machine takes its time).
            if seen.is_empty() {
                assert_eq!(ack(client, "G", "Reports", &m).await, Code::Ok);
            }
            seen.push(m);
        }
    }
    let property = |m: &Message, name: &str| m.user_properties.get(name).cloned();
    let delivered_at = |m: &Message| {
        let t = m.system_properties.as_ref().unwrap().delivery_timestamp.unwrap();
        t.seconds as u64 * 1000 + t.nanos as u64 / 1_000_000
    };
    for (i, m) in seen.iter().enumerate() {
        assert_eq!(property(m, "DW_SCHEDULE").as_deref(), Some(schedule.as_str()));
        assert_eq!(property(m, "DW_OCCURRENCE"), Some((i + 1).to_string()));
        assert_eq!(delivered_at(m), start + 1000 * i as u64, "the occurrence's instant");
        assert!(!m.user_properties.contains_key("dw.schedule"), "the spec stays inside");
    }
    assert_eq!(property(&seen[0], "DW_NEXT_OCCURRENCE_MS"), Some((start + 1000).to_string()));
    assert_eq!(property(&seen[1], "DW_NEXT_OCCURRENCE_MS"), None, "the last has no next");

    // The second was not acked: its redelivery, a retry copy, says the same.
    let (again, _) = receive(client, "G", "Reports", Duration::from_secs(30), Duration::from_secs(10)).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].system_properties.as_ref().unwrap().delivery_attempt, Some(2));
    assert_eq!(property(&again[0], "DW_OCCURRENCE").as_deref(), Some("2"));
    assert_eq!(property(&again[0], "DW_SCHEDULE").as_deref(), Some(schedule.as_str()));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_with_the_same_message_id_answers_the_first_send_and_is_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    let due = now_ms() as i64 + 500;
    let first = send(client, vec![message("Orders", "retry-1", "first", Some(due))]).await;
    assert_eq!(code(&first.status), Code::Ok);
    // The client's deadline passed before the answer: it sends the same message again.
    let again = send(client, vec![message("Orders", "retry-1", "again", Some(due + 60_000))]).await;
    assert_eq!(code(&again.status), Code::Ok);
    assert_eq!(again.entries[0].offset, first.entries[0].offset, "the first send's receipt");
    assert_eq!(again.entries[0].recall_handle, first.entries[0].recall_handle);
    let other_topic = send(client, vec![message("Payments", "retry-1", "other", None)]).await;
    assert_ne!(other_topic.entries[0].offset, first.entries[0].offset, "an id is a dedup key per topic");
    let (status, pending) = http_get(server.http, "/pending?topic=Orders&key=order-1").await;
    assert!(status.contains("200"), "{status}");
    assert!(pending.contains(r#""dedup_key":"retry-1""#), "the pending timer shows its dedup key: {pending}");

    heartbeat(client, "G").await;
    let (got, _) = receive(client, "G", "Orders", Duration::from_secs(30), Duration::from_secs(3)).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["first"]);
    let (more, _) = receive(client, "G", "Orders", Duration::from_secs(30), Duration::from_secs(1)).await;
    assert!(more.is_empty(), "delivered once: {more:?}");
    server.stop().await;
}
