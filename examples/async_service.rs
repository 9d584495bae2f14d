//! An async (tokio) service: a request handler puts timed messages, and the
//! deliveries are consumed on a blocking thread and handed to async code.
//!
//! The store's calls can wait (for back-pressure, or for the disk in sync
//! flush mode), so async code never calls them on a runtime thread: puts go
//! through `spawn_blocking`, and the consumer, which sleeps in `poll`, runs
//! on a blocking thread of its own and sends what it gets over a channel.
//!
//! ```sh
//! cargo run --example async_service
//! ```

use std::sync::Arc;
use std::time::Duration;

use delaywheel::{Config, Message, Receipt, Store};
use tokio::sync::mpsc;

const REMINDERS: &str = "Reminder";

/// The handler of a "remind me" request: puts a reminder due after `delay`.
async fn handle_request(store: Arc<Store>, user: String, delay: Duration) -> delaywheel::Result<Receipt> {
    let message = Message::new(REMINDERS, format!("remind {user}")).key(user).delay(delay);
    tokio::task::spawn_blocking(move || store.put(message)).await.expect("the put task panicked")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(Config::new(dir.path()).with_queues_per_topic(1))?);

    // The consumer: a blocking thread that polls and forwards to async code.
    let (deliveries, mut delivered) = mpsc::channel(64);
    let consumer_store = Arc::clone(&store);
    let consumer = tokio::task::spawn_blocking(move || -> delaywheel::Result<()> {
        let mut consumer = consumer_store.consumer(REMINDERS, 0)?;
        // Until the service drops its end of the channel.
        while !deliveries.is_closed() {
            let batch = consumer.poll(64, Duration::from_millis(100))?;
            consumer.commit();
            for m in batch {
                let late_ms = m.delivered_at_ms().saturating_sub(m.deliver_at_ms().unwrap_or(0));
                let text = String::from_utf8_lossy(m.body()).into_owned();
                if deliveries.blocking_send((text, late_ms)).is_err() {
                    return Ok(()); // the service is shutting down
                }
            }
        }
        Ok(())
    });

    // Three requests come in at once, from handlers running concurrently.
    let requests = [("ada", 1_000), ("grace", 200), ("edsger", 600)].map(|(user, ms)| {
        tokio::spawn(handle_request(Arc::clone(&store), user.to_string(), Duration::from_millis(ms)))
    });
    for request in requests {
        let receipt = request.await??;
        println!("reminder stored at log offset {}", receipt.offset());
    }

    // The reminders arrive in deliver-time order.
    let mut order = Vec::new();
    while order.len() < 3 {
        let (text, late_ms) = tokio::time::timeout(Duration::from_secs(5), delivered.recv())
            .await?
            .ok_or("the consumer stopped")?;
        println!("{text} ({late_ms} ms late)");
        order.push(text);
    }
    assert_eq!(order, ["remind grace", "remind edsger", "remind ada"]);

    drop(delivered);
    consumer.await??;
    Arc::into_inner(store).ok_or("the store is still shared")?.close()?;
    Ok(())
}
