//! Consumer groups that commit how far they got.
//!
//! Two groups read the same topic independently: `billing` processes every
//! message and commits as it goes; `audit` reads some and commits. After the
//! store is closed and reopened (a restart of the service), each group goes
//! on from its own committed position, and nothing is handed to it twice.
//!
//! ```sh
//! cargo run --example consumer_group
//! ```

use std::time::Duration;

use delaywheel::{Config, ConsumedMessage, Consumer, Message, Store};

const TOPIC: &str = "Payments";

fn bodies(messages: &[delaywheel::ConsumedMessage]) -> Vec<String> {
    messages.iter().map(|m| String::from_utf8_lossy(m.body()).into_owned()).collect()
}

/// Polls until `want` messages came, or none came for a second. A poll
/// returns as soon as anything is there, so one poll may return fewer.
fn take(consumer: &mut Consumer, want: usize) -> Result<Vec<ConsumedMessage>, delaywheel::Error> {
    let mut got = Vec::new();
    while got.len() < want {
        let batch = consumer.poll(want - got.len(), Duration::from_secs(1))?;
        if batch.is_empty() {
            break;
        }
        got.extend(batch);
    }
    Ok(got)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let config = || Config::new(dir.path()).with_queues_per_topic(1);
    let store = Store::open(config())?;
    for i in 1..=6 {
        store.put(Message::new(TOPIC, format!("payment-{i}")))?;
    }

    let mut billing = store.consumer_in_group("billing", TOPIC, 0)?;
    let got = take(&mut billing, 6)?;
    println!("billing processed {:?}", bodies(&got));
    billing.commit();

    let mut audit = store.consumer_in_group("audit", TOPIC, 0)?;
    let got = take(&mut audit, 2)?;
    println!("audit processed {:?}, then stopped", bodies(&got));
    audit.commit();

    // More payments arrive, then the service restarts.
    store.put(Message::new(TOPIC, "payment-7"))?;
    store.close()?;
    let store = Store::open(config())?;

    let mut billing = store.consumer_in_group("billing", TOPIC, 0)?;
    let got = take(&mut billing, 100)?;
    println!("after the restart billing goes on with {:?}", bodies(&got));
    assert_eq!(bodies(&got), ["payment-7"]);
    billing.commit();

    let mut audit = store.consumer_in_group("audit", TOPIC, 0)?;
    let got = take(&mut audit, 100)?;
    println!("after the restart audit goes on with {:?}", bodies(&got));
    assert_eq!(bodies(&got), ["payment-3", "payment-4", "payment-5", "payment-6", "payment-7"]);
    audit.commit();
    store.close()?;
    Ok(())
}
