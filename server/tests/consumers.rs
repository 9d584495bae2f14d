//! What a PushConsumer relies on beyond a SimpleConsumer: the messages it
//! received with `auto_renew` stay invisible while its client lives (its
//! telemetry stream is open), and come back when it goes away or nacks.

#[allow(dead_code)]
mod client;

use std::time::{Duration, Instant};

use delaywheel_server::proto::messaging_service_client::MessagingServiceClient;
use delaywheel_server::proto::*;
use delaywheel_server::{HandleKey, RenewPolicy, ServeOptions};
use tonic::transport::Channel;

use client::*;

/// A request from the client `id`, as every official client marks its requests.
fn from<T>(id: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("x-mq-client-id", id.parse().unwrap());
    request
}

/// A PushConsumer's open telemetry stream: dropping it closes the stream.
struct Telemetry {
    _commands: tokio::sync::mpsc::Sender<TelemetryCommand>,
    _replies: tonic::Streaming<TelemetryCommand>,
}

/// Opens client `id`'s telemetry stream with its consumer settings for `group`.
async fn telemetry(client: &mut MessagingServiceClient<Channel>, id: &str, group: &str) -> Telemetry {
    let (commands, inbound) = tokio::sync::mpsc::channel(1);
    commands.send(consumer_settings_command(group)).await.unwrap();
    let request = from(id, tokio_stream::wrappers::ReceiverStream::new(inbound));
    let mut replies = client.telemetry(request).await.unwrap().into_inner();
    replies.message().await.unwrap().expect("the settings answer");
    Telemetry { _commands: commands, _replies: replies }
}

/// A PushConsumer's receive from client `id`: no batch size, no invisible duration, `auto_renew`.
async fn push_receive(client: &mut MessagingServiceClient<Channel>, id: &str, group: &str) -> Message {
    let request = ReceiveMessageRequest {
        batch_size: 0,
        invisible_duration: None,
        auto_renew: true,
        ..receive_request(group, "Jobs", Duration::from_secs(1), Duration::from_secs(5))
    };
    let mut stream = client.receive_message(from(id, request)).await.unwrap().into_inner();
    let mut got = Vec::new();
    while let Some(answer) = stream.message().await.unwrap() {
        if let Some(receive_message_response::Content::Message(m)) = answer.content {
            got.push(m);
        }
    }
    assert_eq!(got.len(), 1, "one message was waiting");
    got.pop().unwrap()
}

/// How long until `group` gets a message back (as a SimpleConsumer), if within `within`.
async fn back_after(
    client: &mut MessagingServiceClient<Channel>,
    group: &str,
    within: Duration,
) -> Option<(Duration, Message)> {
    let started = Instant::now();
    let (mut got, _) = receive(client, group, "Jobs", Duration::from_secs(30), within).await;
    assert!(got.len() <= 1);
    got.pop().map(|m| (started.elapsed(), m))
}

fn receipt(m: &Message) -> String {
    m.system_properties.as_ref().unwrap().receipt_handle.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_renewed_messages_stay_invisible_while_their_client_lives() {
    let dir = tempfile::tempdir().unwrap();
    let renew = RenewPolicy {
        invisible: Duration::from_secs(2),
        ahead: Duration::from_secs(1),
        ..RenewPolicy::DEFAULT
    };
    let options = ServeOptions { renew, ..ServeOptions::loopback(HandleKey::from_bytes([3; 32])) };
    let mut server = start_with(dir.path(), options).await;
    let client = &mut server.client;
    let stream = telemetry(client, "push-1", "G").await;

    // Held past two and a half invisible durations, then acked: it never came back.
    send(client, vec![message("Jobs", "m1", "held", None)]).await;
    let held = push_receive(client, "push-1", "G").await;
    let invisible = held.system_properties.as_ref().unwrap().invisible_duration.unwrap();
    assert_eq!(invisible.seconds, 2, "the policy's duration");
    assert!(
        back_after(client, "G", Duration::from_secs(5)).await.is_none(),
        "renewed while the client lives"
    );
    assert_eq!(ack(client, "G", "Jobs", &held).await, Code::Ok, "the receipt is still good");

    // A nack takes the timer from the renewer: back after the nack's 3 s, not renewed forever.
    send(client, vec![message("Jobs", "m2", "nacked", None)]).await;
    let nacked = push_receive(client, "push-1", "G").await;
    let nack = ChangeInvisibleDurationRequest {
        group: resource("G"),
        topic: resource("Jobs"),
        receipt_handle: receipt(&nacked),
        invisible_duration: Some(prost_types::Duration { seconds: 3, nanos: 0 }),
        message_id: "m2".into(),
    };
    let answer = client.change_invisible_duration(from("push-1", nack)).await.unwrap().into_inner();
    assert_eq!(code(&answer.status), Code::Ok);
    let (after, again) =
        back_after(client, "G", Duration::from_secs(8)).await.expect("the nack's backoff ends");
    assert!(after >= Duration::from_millis(2500), "not before its backoff: {after:?}");
    assert_eq!(body(&again), "nacked");
    assert_eq!(ack(client, "G", "Jobs", &again).await, Code::Ok);

    // The client's stream closes: its message is no longer renewed, and comes back.
    send(client, vec![message("Jobs", "m3", "abandoned", None)]).await;
    push_receive(client, "push-1", "G").await;
    drop(stream);
    let (after, again) =
        back_after(client, "G", Duration::from_secs(8)).await.expect("not renewed once gone");
    assert!(after <= Duration::from_secs(4), "within about one invisible duration: {after:?}");
    assert_eq!(body(&again), "abandoned");
    assert_eq!(again.system_properties.as_ref().unwrap().delivery_attempt, Some(2));
    assert_eq!(ack(client, "G", "Jobs", &again).await, Code::Ok);

    // A client that says it terminates, its stream still open: the same.
    let _stream = telemetry(client, "push-2", "G").await;
    send(client, vec![message("Jobs", "m4", "left", None)]).await;
    push_receive(client, "push-2", "G").await;
    let bye = NotifyClientTerminationRequest { group: resource("G") };
    let answer = client.notify_client_termination(from("push-2", bye)).await.unwrap().into_inner();
    assert_eq!(code(&answer.status), Code::Ok);
    let (_, again) =
        back_after(client, "G", Duration::from_secs(8)).await.expect("not renewed once terminated");
    assert_eq!(body(&again), "left");
    server.stop().await;
}

/// A FIFO message of `group` on topic "Orders".
fn fifo(id: &str, group: &str) -> Message {
    let mut m = message("Orders", id, id, None);
    let system = m.system_properties.as_mut().unwrap();
    system.message_type = MessageType::Fifo as i32;
    system.message_group = Some(group.to_string());
    m
}

/// The bodies of one receive of group "G" from "Orders" (as a SimpleConsumer).
async fn orders(
    client: &mut MessagingServiceClient<Channel>,
    invisible: Duration,
    wait: Duration,
) -> Vec<Message> {
    receive(client, "G", "Orders", invisible, wait).await.0
}

fn bodies(messages: &[Message]) -> Vec<&str> {
    messages.iter().map(body).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_groups_messages_come_one_at_a_time_in_send_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    let route = client.query_route(QueryRouteRequest { topic: resource("Orders"), endpoints: None }).await;
    let queues = route.unwrap().into_inner().message_queues;
    assert!(queues.iter().all(|q| q.accept_message_types.contains(&(MessageType::Fifo as i32))));
    let sent = send(client, ["f1", "f2", "f3"].map(|id| fifo(id, "order-1")).to_vec()).await;
    assert_eq!(code(&sent.status), Code::Ok);
    let (short, none) = (Duration::from_secs(2), Duration::from_millis(500));

    // One at a time: the next waits while the first is out, through its retry too.
    let first = orders(client, short, Duration::from_secs(5)).await;
    assert_eq!(bodies(&first), ["f1"]);
    let system = first[0].system_properties.as_ref().unwrap();
    assert_eq!(
        (system.message_type, system.message_group.as_deref()),
        (MessageType::Fifo as i32, Some("order-1"))
    );
    assert!(orders(client, short, none).await.is_empty(), "f2 waits for f1");
    let again = orders(client, short, Duration::from_secs(5)).await;
    assert_eq!(bodies(&again), ["f1"], "f1's invisible duration ended: f1 again, not f2");
    assert_eq!(again[0].system_properties.as_ref().unwrap().delivery_attempt, Some(2));
    assert!(orders(client, short, none).await.is_empty(), "f2 waits for f1's second attempt too");

    // An ack opens the queue at once, for a receive already waiting.
    let mut other = server.client.clone();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let got =
            receive(&mut other, "G", "Orders", Duration::from_secs(30), Duration::from_secs(10)).await.0;
        (started.elapsed(), got)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = &mut server.client;
    assert_eq!(ack(client, "G", "Orders", &again[0]).await, Code::Ok);
    let (waited, second) = waiting.await.unwrap();
    assert_eq!(bodies(&second), ["f2"]);
    assert!(waited < Duration::from_secs(5), "woken by the ack, not by its deadline: {waited:?}");
    assert_eq!(ack(client, "G", "Orders", &second[0]).await, Code::Ok);

    // A consumer forwards f3 to the dead-letter topic: it is there, and the queue opens.
    let third = orders(client, Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(bodies(&third), ["f3"]);
    let forward = ForwardMessageToDeadLetterQueueRequest {
        group: resource("G"),
        topic: resource("Orders"),
        receipt_handle: receipt(&third[0]),
        message_id: "f3".into(),
        delivery_attempt: 1,
        max_delivery_attempts: 16,
    };
    let answer = client.forward_message_to_dead_letter_queue(forward).await.unwrap().into_inner();
    assert_eq!(code(&answer.status), Code::Ok);
    send(client, vec![fifo("f4", "order-1"), fifo("f5", "order-1")]).await;
    // The group's next receive finds f3 back, dead-letters it, and hands out f4.
    let fourth = orders(client, Duration::from_secs(6), Duration::from_secs(5)).await;
    assert_eq!(bodies(&fourth), ["f4"], "f3 went to the dead letters: the queue opened");
    let (letters, _) =
        receive(client, "Ops", "%DLQ%G", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(bodies(&letters), ["f3"]);

    // A restart keeps the queue blocked while f4 is out: its timer says so.
    server.stop().await;
    let mut server = start(dir.path()).await;
    let client = &mut server.client;
    assert!(orders(client, short, none).await.is_empty(), "f5 still waits for f4 after a restart");
    let back = orders(client, short, Duration::from_secs(10)).await;
    assert_eq!(bodies(&back), ["f4"]);
    assert_eq!(ack(client, "G", "Orders", &back[0]).await, Code::Ok);
    assert_eq!(bodies(&orders(client, short, Duration::from_secs(5)).await), ["f5"]);
    server.stop().await;
}

/// The settings answer's retry policy for a consumer of `group`.
async fn max_attempts_of(client: &mut MessagingServiceClient<Channel>, group: &str) -> i32 {
    consumer_settings(client, group).await.backoff_policy.unwrap().max_attempts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_may_have_its_own_number_of_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let options = ServeOptions {
        attempts_of_group: [("Strict".to_string(), 1)].into(),
        ..ServeOptions::loopback(HandleKey::from_bytes([3; 32]))
    };
    let mut server = start_with(dir.path(), options).await;
    let client = &mut server.client;
    assert_eq!(max_attempts_of(client, "Strict").await, 1);
    assert_eq!(max_attempts_of(client, "Lenient").await, 16, "the server's own number");
    send(client, vec![message("Jobs", "j1", "once only", None)]).await;
    let second = Duration::from_secs(1);
    let (got, _) = receive(client, "Strict", "Jobs", second, Duration::from_secs(5)).await;
    assert_eq!(bodies(&got), ["once only"]);
    // Not acked: its one attempt is spent, so it goes to the dead letters, not back.
    let (none, _) = receive(client, "Strict", "Jobs", second, Duration::from_secs(3)).await;
    assert!(none.is_empty());
    let (letters, _) =
        receive(client, "Ops", "%DLQ%Strict", Duration::from_secs(30), Duration::from_secs(5)).await;
    assert_eq!(bodies(&letters), ["once only"]);
    // Another group of the same topic still gets its 16.
    let (got, _) = receive(client, "Lenient", "Jobs", second, Duration::from_secs(5)).await;
    assert_eq!(bodies(&got), ["once only"]);
    let (again, _) = receive(client, "Lenient", "Jobs", second, Duration::from_secs(5)).await;
    assert_eq!(again[0].system_properties.as_ref().unwrap().delivery_attempt, Some(2));
    server.stop().await;
}
