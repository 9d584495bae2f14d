//! The gRPC `MessagingService`: each RPC checks its request, runs the store
//! work on the blocking pool (the runtime never waits on the store), and
//! answers with the protocol's status codes.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use delaywheel::{Clock, SystemClock};
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status as GrpcStatus, Streaming};

use crate::names;
use crate::produce::Checked;
use crate::proto::messaging_service_server::MessagingService;
use crate::proto::*;
use crate::receive::{
    DEFAULT_BATCH, DEFAULT_LONG_POLL, Filter, Received, Request as ReceiveRequest, check_group,
    check_readable_topic,
};
use crate::renewal::CLIENT_ID;
use crate::send::timestamp;
use crate::server::Shared;
use crate::status::{Refusal, ok, status_of};

type Answer<T> = Result<Response<T>, GrpcStatus>;
type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, GrpcStatus>> + Send>>;

/// Longest long poll a receive may ask for.
const MAX_LONG_POLL: Duration = Duration::from_secs(300);
/// Invisible durations a receive accepts: RocketMQ's range.
const INVISIBLE_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(12 * 3600);
/// Invisible durations a change accepts: 0 is a nack that brings the message back at once.
const CHANGE_RANGE: std::ops::RangeInclusive<Duration> = Duration::ZERO..=Duration::from_secs(12 * 3600);
/// Most messages one receive hands out.
const MAX_BATCH: i32 = 1024;
/// What a long poll leaves of its call's deadline for the answer to reach the client.
const DEADLINE_RESERVE: Duration = Duration::from_millis(100);

/// The service over one store.
pub(crate) struct Service {
    shared: Arc<Shared>,
}

impl Service {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Runs store work on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Shared) -> T + Send + 'static,
    ) -> Result<T, GrpcStatus> {
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || work(&shared))
            .await
            .map_err(|e| GrpcStatus::internal(format!("the store task failed: {e}")))
    }

    /// Appends a checked send and answers once it is durable. The append
    /// runs here when it takes no wait (most do: a copy into the log's
    /// mapped tail), else on the blocking pool; the durability is awaited
    /// here, not on the pool (a thread asleep per request until the sync
    /// cost more than the send).
    async fn send(&self, checked: Checked) -> Result<SendMessageResponse, GrpcStatus> {
        let submitted = match self.shared.try_submit_send(&checked) {
            Ok(Some(tickets)) => Ok(checked.submitted(tickets)),
            Ok(None) => self.blocking(move |shared| shared.submit_send(checked)).await?,
            Err(refused) => Err(refused),
        };
        Ok(match submitted {
            Ok(mut submitted) => {
                let durable = submitted.durable(self.shared.store.put_timeout()).await;
                self.shared.sent(submitted, durable)
            }
            Err(refused) => refused,
        })
    }
}

fn unimplemented<T>(rpc: &str, why: &str) -> Answer<T> {
    Err(GrpcStatus::unimplemented(format!("delaywheel does not implement {rpc}: {why}")))
}

/// The client a request comes from, if it says (every official client does).
fn client_of<T>(request: &Request<T>) -> Option<String> {
    let id = request.metadata().get(CLIENT_ID)?.to_str().ok()?;
    (!id.is_empty()).then(|| id.to_string())
}

/// How long the client waits for the answer to `request` (its `grpc-timeout`:
/// up to 8 digits and a unit, H M S m u n), if it says.
fn deadline_of<T>(request: &Request<T>) -> Option<Duration> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (amount, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    let amount: u64 = amount.parse().ok().filter(|_| (1..=8).contains(&amount.len()))?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// The store's name of the topic a consumer reads (`resource`), checked.
fn readable_topic(resource: &Option<Resource>, field: &str) -> Result<String, Refusal> {
    let topic = names::topic(resource, field)?;
    check_readable_topic(&topic, field)?;
    Ok(topic)
}

/// The store's name of the consumer group `resource`, checked.
fn consumer_group(resource: &Option<Resource>, field: &str) -> Result<String, Refusal> {
    let group = names::group(resource, field)?;
    check_group(&group, field)?;
    Ok(group)
}

fn duration_of(d: &prost_types::Duration) -> Option<Duration> {
    (d.seconds >= 0 && (0..1_000_000_000).contains(&d.nanos))
        .then(|| Duration::new(d.seconds as u64, d.nanos as u32))
}

fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

#[tonic::async_trait]
impl MessagingService for Service {
    async fn query_route(&self, request: Request<QueryRouteRequest>) -> Answer<QueryRouteResponse> {
        let request = request.into_inner();
        let topic = match readable_topic(&request.topic, "topic.name") {
            Ok(topic) => topic,
            Err(refusal) => {
                return Ok(Response::new(QueryRouteResponse {
                    status: Some(refusal.status()),
                    message_queues: vec![],
                }));
            }
        };
        // Topics are made on first use: every valid name has the store's queues.
        let message_queues = self.shared.queues(&topic, request.endpoints);
        Ok(Response::new(QueryRouteResponse { status: Some(ok()), message_queues }))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Answer<HeartbeatResponse> {
        let request = request.into_inner();
        let mut result = Ok(());
        if request.group.as_ref().is_some_and(|g| !g.name.is_empty()) {
            result =
                consumer_group(&request.group, "group.name").map(|group| self.shared.groups.know(&group));
        }
        Ok(Response::new(HeartbeatResponse { status: Some(status_of(result)) }))
    }

    async fn send_message(&self, request: Request<SendMessageRequest>) -> Answer<SendMessageResponse> {
        let answer = match self.shared.check_send(request.into_inner().messages) {
            Ok(checked) => self.send(checked).await?,
            Err(refused) => refused,
        };
        Ok(Response::new(answer))
    }

    async fn query_assignment(
        &self,
        request: Request<QueryAssignmentRequest>,
    ) -> Answer<QueryAssignmentResponse> {
        let request = request.into_inner();
        let checked = readable_topic(&request.topic, "topic.name").and_then(|topic| {
            let group = names::group(&request.group, "group.name")?;
            self.shared.groups.check(&group, "group.name").map(|()| topic)
        });
        let topic = match checked {
            Ok(topic) => topic,
            Err(refusal) => {
                return Ok(Response::new(QueryAssignmentResponse {
                    status: Some(refusal.status()),
                    assignments: vec![],
                }));
            }
        };
        // One endpoint holds every queue: each client of the group is assigned all of them
        // (receives share the queues safely, as the module `receive` says).
        let assignments = self
            .shared
            .queues(&topic, request.endpoints)
            .into_iter()
            .map(|q| Assignment { message_queue: Some(q) });
        Ok(Response::new(QueryAssignmentResponse { status: Some(ok()), assignments: assignments.collect() }))
    }

    type ReceiveMessageStream = Streamed<ReceiveMessageResponse>;

    async fn receive_message(
        &self,
        request: Request<ReceiveMessageRequest>,
    ) -> Answer<Self::ReceiveMessageStream> {
        let client = client_of(&request);
        let deadline = deadline_of(&request);
        let request = request.into_inner();
        let answers = match self.receive_request(&request) {
            Err(refusal) => vec![ReceiveMessageResponse {
                content: Some(receive_message_response::Content::Status(refusal.status())),
            }],
            Ok(mut receive) => {
                // A client whose call ends with its long poll (Rust's) still hears "no message".
                if let Some(deadline) = deadline {
                    receive.wait = receive.wait.min(deadline.saturating_sub(DEADLINE_RESERVE));
                }
                let receive = Arc::new(receive);
                let received = self.receive(&receive).await?;
                if let (Ok(received), Some(client), true) = (&received, &client, request.auto_renew) {
                    let timers = received.iter().map(|r| r.timer);
                    self.shared.renewals.lease(client, timers, receive.invisible);
                }
                self.receive_answers(received, &receive, receive.invisible)
            }
        };
        Ok(Response::new(Box::pin(tokio_stream::iter(answers.into_iter().map(Ok)))))
    }

    async fn ack_message(&self, request: Request<AckMessageRequest>) -> Answer<AckMessageResponse> {
        let client = client_of(&request);
        let request = request.into_inner();
        // The receipts name the group (their tags are made for it): a group well formed is enough here.
        let checked = readable_topic(&request.topic, "topic.name")
            .and_then(|topic| Ok((consumer_group(&request.group, "group.name")?, topic)));
        let (group, topic) = match checked {
            Ok(names) => names,
            Err(refusal) => {
                return Ok(Response::new(AckMessageResponse {
                    status: Some(refusal.status()),
                    entries: vec![],
                }));
            }
        };
        let answer = self
            .blocking(move |shared| shared.ack(client.as_deref(), &group, &topic, request.entries))
            .await?;
        Ok(Response::new(answer))
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        request: Request<ForwardMessageToDeadLetterQueueRequest>,
    ) -> Answer<ForwardMessageToDeadLetterQueueResponse> {
        let request = request.into_inner();
        let checked = readable_topic(&request.topic, "topic.name")
            .and_then(|topic| Ok((consumer_group(&request.group, "group.name")?, topic)));
        let status = match checked {
            Err(refusal) => refusal.status(),
            Ok((group, topic)) => {
                let handle = request.receipt_handle;
                self.blocking(move |shared| status_of(shared.forward(&group, &topic, &handle))).await?
            }
        };
        Ok(Response::new(ForwardMessageToDeadLetterQueueResponse { status: Some(status) }))
    }

    type PullMessageStream = Streamed<PullMessageResponse>;

    async fn pull_message(&self, _: Request<PullMessageRequest>) -> Answer<Self::PullMessageStream> {
        unimplemented("PullMessage", "use ReceiveMessage (the SimpleConsumer and PushConsumer model)")
    }

    async fn update_offset(&self, _: Request<UpdateOffsetRequest>) -> Answer<UpdateOffsetResponse> {
        unimplemented("UpdateOffset", "offsets move by acks")
    }

    async fn get_offset(&self, _: Request<GetOffsetRequest>) -> Answer<GetOffsetResponse> {
        unimplemented("GetOffset", "offsets move by acks")
    }

    async fn query_offset(&self, _: Request<QueryOffsetRequest>) -> Answer<QueryOffsetResponse> {
        unimplemented("QueryOffset", "offsets move by acks")
    }

    async fn end_transaction(&self, _: Request<EndTransactionRequest>) -> Answer<EndTransactionResponse> {
        unimplemented("EndTransaction", "transactional messages are not supported")
    }

    type TelemetryStream = Streamed<TelemetryCommand>;

    async fn telemetry(
        &self,
        request: Request<Streaming<TelemetryCommand>>,
    ) -> Answer<Self::TelemetryStream> {
        // While it is open, the client's PushConsumer messages are renewed.
        let connection = client_of(&request).map(|client| self.shared.renewals.connect(&client));
        let mut inbound = request.into_inner();
        let (replies, stream) = tokio::sync::mpsc::channel(8);
        let shared = Arc::clone(&self.shared);
        let mut stopping = shared.stop_signal();
        tokio::spawn(async move {
            let _connection = connection;
            loop {
                let command = tokio::select! {
                    command = inbound.next() => command,
                    _ = stopping.wait_for(|stop| *stop) => None,
                };
                // The client closed the stream, broke it, or the server is stopping.
                let Some(Ok(command)) = command else { break };
                if let Some(telemetry_command::Command::Settings(settings)) = command.command
                    && replies.send(Ok(shared.settings_reply(settings))).await.is_err()
                {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(stream))))
    }

    async fn notify_client_termination(
        &self,
        request: Request<NotifyClientTerminationRequest>,
    ) -> Answer<NotifyClientTerminationResponse> {
        // Its unacked messages come back after their invisible duration, no longer renewed.
        if let Some(client) = client_of(&request) {
            self.shared.renewals.terminate(&client);
        }
        let group = request.into_inner().group;
        let named = group.as_ref().is_some_and(|g| !g.name.is_empty());
        let result = if named { consumer_group(&group, "group.name").map(drop) } else { Ok(()) };
        Ok(Response::new(NotifyClientTerminationResponse { status: Some(status_of(result)) }))
    }

    async fn change_invisible_duration(
        &self,
        request: Request<ChangeInvisibleDurationRequest>,
    ) -> Answer<ChangeInvisibleDurationResponse> {
        let client = client_of(&request);
        let request = request.into_inner();
        let answer = match self.change_request(&request) {
            Err(refusal) => ChangeInvisibleDurationResponse {
                status: Some(refusal.status()),
                receipt_handle: String::new(),
            },
            Ok((group, topic, invisible)) => {
                let receipt = request.receipt_handle;
                let change = move |shared: &Shared| {
                    shared.change_invisible(client.as_deref(), (&group, &topic), &receipt, invisible)
                };
                self.blocking(change).await?
            }
        };
        Ok(Response::new(answer))
    }

    async fn recall_message(&self, request: Request<RecallMessageRequest>) -> Answer<RecallMessageResponse> {
        let request = request.into_inner();
        let answer = self.blocking(move |shared| shared.recall(&request)).await?;
        Ok(Response::new(answer))
    }

    async fn sync_lite_subscription(
        &self,
        _: Request<SyncLiteSubscriptionRequest>,
    ) -> Answer<SyncLiteSubscriptionResponse> {
        unimplemented("SyncLiteSubscription", "lite topics are not supported")
    }
}

impl Service {
    /// A receive's long poll: looks (on the blocking pool, briefly), and
    /// between looks waits here, on the group's queues, its deadline and the
    /// server's stop. Dropped with its client, it stops where it is.
    async fn receive(
        &self,
        request: &Arc<ReceiveRequest>,
    ) -> Result<Result<Vec<Received>, Refusal>, GrpcStatus> {
        let deadline = tokio::time::Instant::now() + request.wait;
        let mut stop = self.shared.stop_signal();
        let asked = Arc::clone(request);
        let readers = self.blocking(move |shared| {
            let made = [
                asked.topic.clone(),
                crate::receive::retry_topic(&asked.group, &asked.topic),
                format!("{}{}", crate::receive::DLQ_PREFIX, asked.group),
            ];
            shared.topics.admit(made.iter().map(String::as_str), "message_queue.topic.name")?;
            shared.groups.readers(&shared.store, &asked)
        });
        let readers = match readers.await? {
            Ok(readers) => readers,
            Err(refusal) => return Ok(Err(refusal)),
        };
        loop {
            let (asked, looked_at) = (Arc::clone(request), Arc::clone(&readers));
            let taken =
                self.blocking(move |shared| shared.groups.take_now(&shared.store, &looked_at, &asked));
            let (received, seen) = match taken.await? {
                Ok(taken) => taken,
                Err(refusal) => return Ok(Err(refusal)),
            };
            if !received.is_empty() {
                // Once this returns, the messages are the timers' to bring back, never the queues'.
                let synced = self.blocking(|shared| shared.store.sync_offsets()).await?;
                return Ok(synced.map(|()| received).map_err(Refusal::from));
            }
            if tokio::time::Instant::now() >= deadline || *stop.borrow() {
                return Ok(Ok(received));
            }
            tokio::select! {
                () = readers.changed(&seen) => {}
                () = tokio::time::sleep_until(deadline) => {}
                _ = stop.wait_for(|stopping| *stopping) => {}
            }
        }
    }

    fn receive_request(&self, request: &ReceiveMessageRequest) -> Result<ReceiveRequest, Refusal> {
        let group = consumer_group(&request.group, "group.name")?;
        let topic = request.message_queue.as_ref().map(|q| q.topic.clone()).unwrap_or_default();
        let topic = readable_topic(&topic, "message_queue.topic.name")?;
        let max = match request.batch_size {
            0 => DEFAULT_BATCH,
            n if (1..=MAX_BATCH).contains(&n) => n as usize,
            n => {
                let why = format!("{n} is not from 1 to {MAX_BATCH} (or 0: {DEFAULT_BATCH})");
                return Err(Refusal::field(Code::BadRequest, "batch_size", why));
            }
        };
        let invisible = match &request.invisible_duration {
            // A PushConsumer names none: it asks the server to keep its messages invisible.
            None if request.auto_renew => Some(self.shared.renewals.policy().invisible),
            asked => asked.as_ref().and_then(duration_of),
        };
        let invisible = invisible.filter(|d| INVISIBLE_RANGE.contains(d)).ok_or_else(|| {
            Refusal::field(
                Code::IllegalInvisibleTime,
                "invisible_duration",
                "missing (without auto_renew), or not from 1 s to 12 h",
            )
        })?;
        let wait = match &request.long_polling_timeout {
            None => DEFAULT_LONG_POLL,
            Some(d) => duration_of(d).filter(|d| *d <= MAX_LONG_POLL).ok_or_else(|| {
                Refusal::field(
                    Code::IllegalPollingTime,
                    "long_polling_timeout",
                    "negative, or longer than 300 s",
                )
            })?,
        };
        let filter = match &request.filter_expression {
            Some(f) if f.r#type == FilterType::Sql as i32 => {
                return Err(Refusal::field(
                    Code::IllegalFilterExpression,
                    "filter_expression",
                    "SQL filters are not supported",
                ));
            }
            Some(f) => Filter::parse(&f.expression),
            None => Filter::All,
        };
        // Groups are made on first use, as topics are (a client's first receive may
        // overtake its settings on the telemetry stream).
        self.shared.groups.know(&group);
        Ok(ReceiveRequest { group, topic, max, invisible, wait, filter })
    }

    fn receive_answers(
        &self,
        received: Result<Vec<Received>, Refusal>,
        request: &ReceiveRequest,
        invisible: Duration,
    ) -> Vec<ReceiveMessageResponse> {
        use receive_message_response::Content;
        let received = match received {
            Ok(received) => received,
            Err(refusal) => {
                return vec![ReceiveMessageResponse { content: Some(Content::Status(refusal.status())) }];
            }
        };
        let now_ms = SystemClock.now_ms();
        let metrics = &self.shared.metrics;
        let mut answers = Vec::with_capacity(received.len() + 2);
        for r in &received {
            metrics.received.increment(1);
            match (r.origin.attempt, r.origin.deliver_at_ms) {
                (1, Some(due)) => metrics.receive_lateness.record(now_ms.saturating_sub(due) as f64 / 1000.0),
                (1, None) => {}
                _ => metrics.redelivered.increment(1),
            }
            let receipt = self.shared.key.receipt_handle(&request.group, &request.topic, r.timer);
            answers.push(ReceiveMessageResponse {
                content: Some(Content::Message(to_proto(r, receipt, invisible))),
            });
        }
        let status = if received.is_empty() {
            Refusal::new(Code::MessageNotFound, "no new message").status()
        } else {
            ok()
        };
        answers.push(ReceiveMessageResponse { content: Some(Content::Status(status)) });
        answers.push(ReceiveMessageResponse { content: Some(Content::DeliveryTimestamp(timestamp(now_ms))) });
        answers
    }

    /// The group, the topic and the new invisible duration of a change, checked.
    fn change_request(
        &self,
        request: &ChangeInvisibleDurationRequest,
    ) -> Result<(String, String, Duration), Refusal> {
        let topic = readable_topic(&request.topic, "topic.name")?;
        let group = consumer_group(&request.group, "group.name")?;
        let invisible = request.invisible_duration.as_ref().and_then(duration_of);
        let invisible = invisible.filter(|d| CHANGE_RANGE.contains(d)).ok_or_else(|| {
            Refusal::field(Code::IllegalInvisibleTime, "invisible_duration", "missing, or not from 0 to 12 h")
        })?;
        Ok((group, topic, invisible))
    }
}

/// The body's MD5 in upper-case hex, as RocketMQ's proxy gives every
/// received message: clients check it (the Node and C# ones refuse a message without one).
fn md5_hex(body: &[u8]) -> String {
    use md5::Digest as _;
    hex::encode_upper(md5::Md5::digest(body))
}

/// The protocol message for a handed-out message.
fn to_proto(received: &Received, receipt: String, invisible: Duration) -> Message {
    use crate::send::property;
    let message = &received.message;
    let origin = &received.origin;
    let mut user_properties = std::collections::HashMap::new();
    let mut get = std::collections::HashMap::new();
    for (name, value) in message.properties() {
        if name.starts_with("__") {
            get.insert(name.as_str(), value.as_str());
        } else {
            user_properties.insert(name.clone(), value.clone());
        }
    }
    for (name, value) in crate::occurrences::properties(message) {
        user_properties.insert(name.to_string(), value);
    }
    let keys = get.get(property::KEYS).map(|k| k.split(' ').map(String::from).collect()).unwrap_or_default();
    let gzip = get.get(property::ENCODING) == Some(&"gzip");
    let message_group = get.get(property::MESSAGE_GROUP).copied();
    let born_ms = get.get(property::BORN_MS).and_then(|v| v.parse().ok()).unwrap_or(origin.store_ms);
    let system = SystemProperties {
        tag: message.tags().map(String::from),
        keys,
        message_id: get.get(property::MESSAGE_ID).map_or_else(String::new, |v| v.to_string()),
        body_digest: Some(Digest { r#type: DigestType::Md5 as i32, checksum: md5_hex(message.body()) }),
        body_encoding: if gzip { Encoding::Gzip } else { Encoding::Identity } as i32,
        message_type: match (origin.deliver_at_ms, message_group) {
            (Some(_), _) => MessageType::Delay,
            (None, Some(_)) => MessageType::Fifo,
            (None, None) => MessageType::Normal,
        } as i32,
        message_group: message_group.map(String::from),
        born_timestamp: Some(timestamp(born_ms)),
        born_host: get.get(property::BORN_HOST).map_or_else(String::new, |v| v.to_string()),
        store_timestamp: Some(timestamp(origin.store_ms)),
        store_host: "delaywheel".to_string(),
        delivery_timestamp: origin.deliver_at_ms.map(timestamp),
        receipt_handle: Some(receipt),
        queue_id: origin.queue_id as i32,
        queue_offset: Some(origin.queue_offset as i64),
        invisible_duration: Some(proto_duration(invisible)),
        delivery_attempt: Some(origin.attempt as i32),
        ..Default::default()
    };
    Message {
        topic: Some(names::resource(&origin.topic)),
        user_properties,
        system_properties: Some(system),
        body: message.body().to_vec(),
    }
}
