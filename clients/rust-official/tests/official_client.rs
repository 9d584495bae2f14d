//! Apache's own Rust client for RocketMQ 5 (crate `rocketmq` 5.0.0, from
//! apache/rocketmq-clients, used unchanged) against an in-process
//! `delaywheel serve` on loopback, plaintext, without credentials:
//!
//! - its `Producer` starts (settings on the telemetry stream, a heartbeat, the
//!   topic's route), sends normal messages and timed ones (a delivery
//!   timestamp, which this client gives in whole seconds), and gets back
//!   receipts naming the ids it made;
//! - its `SimpleConsumer` receives every message once, each timed one no
//!   sooner than its delivery timestamp, with body, tag, keys and properties
//!   as sent; it acks all but two, and those two come back, as delivery
//!   attempt 2, no sooner than the invisible duration after the receive that
//!   handed them out;
//! - a last receive finds nothing: no acked message comes back. (This client
//!   sets its call's deadline to its long poll; the server answers "no
//!   message" before that deadline, else every empty receive fails.)
//! - both shut down (`NotifyClientTermination`), then the server stops and
//!   `run` returns `Ok`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use delaywheel::Store;
use delaywheel_server::{HandleKey, ServeOptions, Server, store_config};
use rocketmq::conf::{ClientOption, ProducerOption, SimpleConsumerOption};
use rocketmq::model::common::{FilterExpression, FilterType};
use rocketmq::model::message::{Message, MessageBuilder};
use rocketmq::{Producer, SimpleConsumer};

const TOPIC: &str = "official-rust";
const GROUP: &str = "official-rust-group";
const NORMAL: usize = 20;
const TIMED: usize = 10;
/// How long a received message stays invisible before it comes back unacked.
const INVISIBLE: Duration = Duration::from_secs(3);
/// Longer than any wait for the next message below (timed ones are due at most 4 s ahead).
const LONG_POLL: Duration = Duration::from_secs(6);
/// Messages deliberately left unacked.
const UNACKED: usize = 2;

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn client_option(endpoint: &str) -> ClientOption {
    let mut option = ClientOption::default();
    option.set_access_url(endpoint);
    option.set_enable_tls(false);
    option.set_long_polling_timeout(LONG_POLL);
    option
}

/// What the test expects of a message it sent.
struct Sent {
    body: Vec<u8>,
    tag: &'static str,
    /// In seconds since the epoch, as the client takes it.
    delivery_timestamp: Option<i64>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn official_rust_client_sends_receives_and_acks() {
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(60), scenario()).await.expect("the whole test within 60 s");
    eprintln!("official client scenario took {:?}", started.elapsed());
}

async fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(store_config(dir.path())).unwrap();
    let server = Server::bind(store, ServeOptions::loopback(HandleKey::from_bytes([3; 32]))).await.unwrap();
    let endpoint = server.grpc_addr().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));

    // Producer: start (settings, heartbeat, route of TOPIC), then send.
    let mut producer_option = ProducerOption::default();
    producer_option.set_topics(vec![TOPIC]);
    let mut producer = Producer::new(producer_option, client_option(&endpoint)).expect("producer: new");
    producer.start().await.expect("producer: start");

    let mut sent: HashMap<String, Sent> = HashMap::new();
    for i in 0..NORMAL + TIMED {
        let body = format!("message {i}").into_bytes();
        let (builder, tag, delivery_timestamp) = if i < NORMAL {
            (MessageBuilder::builder().set_topic(TOPIC).set_body(body.clone()), "normal", None)
        } else {
            // Due 2 to 4 whole seconds after the current one: 1 to 4 s from now.
            let due = now_ms() / 1000 + 2 + (i % 3) as i64;
            (MessageBuilder::delay_message_builder(TOPIC, body.clone(), due), "timed", Some(due))
        };
        let properties = HashMap::from([("index", i.to_string())]);
        let mut message = builder
            .set_tag(tag)
            .set_keys(vec![format!("key-{i}")])
            .set_properties(properties)
            .build()
            .expect("producer: build a message");
        let id = message.take_message_id();
        let receipt = producer.send(message).await.unwrap_or_else(|e| panic!("producer: send {i}: {e:?}"));
        assert_eq!(receipt.message_id(), id, "producer: the receipt names the id the client made");
        sent.insert(id, Sent { body, tag, delivery_timestamp });
    }

    // SimpleConsumer: receive everything, ack all but UNACKED, which come back.
    let mut consumer_option = SimpleConsumerOption::default();
    consumer_option.set_consumer_group(GROUP);
    consumer_option.set_topics(vec![TOPIC]);
    let mut consumer =
        SimpleConsumer::new(consumer_option, client_option(&endpoint)).expect("simple consumer: new");
    consumer.start().await.expect("simple consumer: start");

    let any_tag = FilterExpression::new(FilterType::Tag, "*");
    // Message id -> when the receive that handed it out was asked for (ms).
    let mut first: HashMap<String, i64> = HashMap::new();
    let mut unacked: HashSet<String> = HashSet::new();
    let mut returned: HashSet<String> = HashSet::new();
    while first.len() < sent.len() || returned.len() < UNACKED {
        let asked = now_ms();
        let messages = consumer
            .receive_with(TOPIC, &any_tag, 32, INVISIBLE)
            .await
            .unwrap_or_else(|e| panic!("simple consumer: receive: {e:?}"));
        let answered = now_ms();
        assert!(!messages.is_empty(), "simple consumer: a receive ends with messages within the long poll");
        for message in messages {
            let id = message.message_id().to_string();
            let expected = sent.get(&id).unwrap_or_else(|| panic!("receive: {id} is a message sent"));
            match message.delivery_attempt() {
                1 => {
                    assert!(first.insert(id.clone(), asked).is_none(), "receive: {id} handed out once");
                    assert_eq!(message.topic(), TOPIC, "receive: topic of {id}");
                    assert_eq!(message.body(), expected.body, "receive: body of {id}");
                    assert_eq!(message.tag(), Some(expected.tag), "receive: tag of {id}");
                    assert_eq!(message.keys().len(), 1, "receive: keys of {id}");
                    assert!(message.properties().contains_key("index"), "receive: properties of {id}");
                    assert_eq!(
                        message.delivery_timestamp(),
                        expected.delivery_timestamp,
                        "receive: delivery timestamp of {id}"
                    );
                    if let Some(due) = expected.delivery_timestamp {
                        assert!(
                            answered >= due * 1000,
                            "timed: {id} due at {due} s, received at {answered} ms"
                        );
                    }
                    if expected.tag == "normal" && unacked.len() < UNACKED {
                        unacked.insert(id);
                        continue;
                    }
                }
                2 => {
                    assert!(
                        unacked.contains(&id),
                        "redelivery: only a message left unacked comes back ({id})"
                    );
                    assert!(returned.insert(id.clone()), "redelivery: {id} comes back once");
                    let since = answered - first[&id];
                    assert!(
                        since >= INVISIBLE.as_millis() as i64,
                        "redelivery: {id} back {since} ms after its receive, sooner than {INVISIBLE:?}"
                    );
                }
                attempt => panic!("receive: {id} as delivery attempt {attempt}"),
            }
            consumer.ack(&message).await.unwrap_or_else(|e| panic!("simple consumer: ack {id}: {e:?}"));
        }
    }
    assert_eq!(returned, unacked, "redelivery: both unacked messages came back");
    let after = consumer.receive_with(TOPIC, &any_tag, 32, INVISIBLE).await;
    let after = after.unwrap_or_else(|e| panic!("simple consumer: an empty receive answers: {e:?}"));
    assert!(after.is_empty(), "acked: nothing comes back ({} did)", after.len());

    producer.shutdown().await.expect("producer: shutdown");
    consumer.shutdown().await.expect("simple consumer: shutdown");
    stop.send(()).unwrap();
    served.await.expect("server task joins").expect("server: run returns Ok");
}
