//! What the gRPC tests share: an in-process server on ephemeral ports, a
//! tonic client from the same `.proto`, and the requests they make.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use delaywheel::Store;
use delaywheel_server::proto::messaging_service_client::MessagingServiceClient;
use delaywheel_server::proto::*;
use delaywheel_server::{HandleKey, ServeOptions, Server, store_config};
use tonic::transport::Channel;

pub struct Running {
    pub client: MessagingServiceClient<Channel>,
    pub grpc: std::net::SocketAddr,
    pub http: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<Result<(), delaywheel_server::ServeError>>,
}

pub async fn start(dir: &std::path::Path) -> Running {
    start_with(dir, ServeOptions::loopback(HandleKey::from_bytes([3; 32]))).await
}

pub async fn start_with(dir: &std::path::Path, options: ServeOptions) -> Running {
    let config = store_config(dir).with_queues_per_topic(2);
    start_on(Store::open(config).unwrap(), options).await
}

pub async fn start_on(store: Store, options: ServeOptions) -> Running {
    let server = Server::bind(store, options).await.unwrap();
    let (grpc, http) = (server.grpc_addr(), server.http_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let served = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let client = MessagingServiceClient::connect(format!("http://{grpc}")).await.unwrap();
    Running { client, grpc, http, stop, served }
}

impl Running {
    pub async fn stop(self) {
        drop(self.client);
        self.stop.send(()).unwrap();
        self.served.await.unwrap().unwrap();
    }
}

pub fn resource(name: &str) -> Option<Resource> {
    Some(Resource { resource_namespace: String::new(), name: name.to_string() })
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

pub fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 }
}

pub fn message(topic: &str, id: &str, body: &str, deliver_at_ms: Option<i64>) -> Message {
    Message {
        topic: resource(topic),
        user_properties: [("color".to_string(), "blue".to_string())].into(),
        system_properties: Some(SystemProperties {
            message_id: id.to_string(),
            keys: vec!["order-1".to_string()],
            tag: Some("created".to_string()),
            message_type: if deliver_at_ms.is_some() { MessageType::Delay } else { MessageType::Normal }
                as i32,
            delivery_timestamp: deliver_at_ms.map(timestamp),
            body_encoding: Encoding::Identity as i32,
            ..Default::default()
        }),
        body: body.as_bytes().to_vec(),
    }
}

pub async fn send(
    client: &mut MessagingServiceClient<Channel>,
    messages: Vec<Message>,
) -> SendMessageResponse {
    client.send_message(SendMessageRequest { messages }).await.unwrap().into_inner()
}

pub fn code(status: &Option<Status>) -> Code {
    Code::try_from(status.as_ref().unwrap().code).unwrap()
}

pub async fn heartbeat(client: &mut MessagingServiceClient<Channel>, group: &str) {
    let request = HeartbeatRequest { group: resource(group), client_type: ClientType::SimpleConsumer as i32 };
    let answer = client.heartbeat(request).await.unwrap().into_inner();
    assert_eq!(code(&answer.status), Code::Ok);
}

/// A receive of up to 32 messages of any tag.
pub fn receive_request(
    group: &str,
    topic: &str,
    invisible: Duration,
    wait: Duration,
) -> ReceiveMessageRequest {
    ReceiveMessageRequest {
        group: resource(group),
        message_queue: Some(MessageQueue { topic: resource(topic), ..Default::default() }),
        filter_expression: Some(FilterExpression { r#type: FilterType::Tag as i32, expression: "*".into() }),
        batch_size: 32,
        invisible_duration: Some(prost_types::Duration { seconds: invisible.as_secs() as i64, nanos: 0 }),
        auto_renew: false,
        long_polling_timeout: Some(prost_types::Duration { seconds: wait.as_secs() as i64, nanos: 0 }),
        attempt_id: None,
    }
}

/// The messages and the status of one receive.
pub async fn receive(
    client: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    invisible: Duration,
    wait: Duration,
) -> (Vec<Message>, Status) {
    receive_with(client, receive_request(group, topic, invisible, wait)).await
}

/// The messages and the status of the receive `request`.
pub async fn receive_with(
    client: &mut MessagingServiceClient<Channel>,
    request: ReceiveMessageRequest,
) -> (Vec<Message>, Status) {
    let mut stream = client.receive_message(request).await.unwrap().into_inner();
    let (mut messages, mut status) = (Vec::new(), None);
    while let Some(answer) = stream.message().await.unwrap() {
        match answer.content.unwrap() {
            receive_message_response::Content::Message(m) => messages.push(m),
            receive_message_response::Content::Status(s) => status = Some(s),
            receive_message_response::Content::DeliveryTimestamp(_) => {}
        }
    }
    (messages, status.expect("a receive always ends with a status"))
}

pub async fn ack(
    client: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    m: &Message,
) -> Code {
    let system = m.system_properties.as_ref().unwrap();
    let entry = AckMessageEntry {
        message_id: system.message_id.clone(),
        receipt_handle: system.receipt_handle.clone().unwrap(),
    };
    let request = AckMessageRequest { group: resource(group), topic: resource(topic), entries: vec![entry] };
    code(&client.ack_message(request).await.unwrap().into_inner().status)
}

pub fn body(m: &Message) -> &str {
    std::str::from_utf8(&m.body).unwrap()
}

/// What a PushConsumer of `group` first sends on its telemetry stream: its settings.
pub fn consumer_settings_command(group: &str) -> TelemetryCommand {
    let settings = Settings {
        client_type: Some(ClientType::PushConsumer as i32),
        pub_sub: Some(settings::PubSub::Subscription(Subscription {
            group: resource(group),
            ..Default::default()
        })),
        ..Default::default()
    };
    TelemetryCommand { status: None, command: Some(telemetry_command::Command::Settings(settings)) }
}

/// The settings a consumer of `group` gets back on its telemetry stream.
pub async fn consumer_settings(client: &mut MessagingServiceClient<Channel>, group: &str) -> Settings {
    let (sender, commands) = tokio::sync::mpsc::channel(1);
    sender.send(consumer_settings_command(group)).await.unwrap();
    let mut replies =
        client.telemetry(tokio_stream::wrappers::ReceiverStream::new(commands)).await.unwrap().into_inner();
    let reply = replies.message().await.unwrap().unwrap();
    match reply.command {
        Some(telemetry_command::Command::Settings(settings)) => settings,
        other => panic!("not settings: {other:?}"),
    }
}
