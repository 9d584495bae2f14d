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

use delaywheel::{Config, Message, Store};

const TOPIC: &str = "Payments";

fn bodies(messages: &[delaywheel::ConsumedMessage]) -> Vec<String> {
    messages.iter().map(|m| String::from_utf8_lossy(m.body()).into_owned()).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let config = || Config::new(dir.path()).with_queues_per_topic(1);
    let store = Store::open(config())?;
    for i in 1..=6 {
        store.put(Message::new(TOPIC, format!("payment-{i}")))?;
    }

    let mut billing = store.consumer_in_group("billing", TOPIC, 0)?;
    let got = billing.poll(100, Duration::from_secs(1))?;
    println!("billing processed {:?}", bodies(&got));
    billing.commit();

    let mut audit = store.consumer_in_group("audit", TOPIC, 0)?;
    let got = audit.poll(2, Duration::from_secs(1))?;
    println!("audit processed {:?}, then stopped", bodies(&got));
    audit.commit();

    // More payments arrive, then the service restarts.
    store.put(Message::new(TOPIC, "payment-7"))?;
    store.close()?;
    let store = Store::open(config())?;

    let mut billing = store.consumer_in_group("billing", TOPIC, 0)?;
    let got = billing.poll(100, Duration::from_secs(1))?;
    println!("after the restart billing goes on with {:?}", bodies(&got));
    assert_eq!(bodies(&got), ["payment-7"]);
    billing.commit();

    let mut audit = store.consumer_in_group("audit", TOPIC, 0)?;
    let got = audit.poll(100, Duration::from_secs(1))?;
    println!("after the restart audit goes on with {:?}", bodies(&got));
    assert_eq!(bodies(&got).first().map(String::as_str), Some("payment-3"));
    audit.commit();
    store.close()?;
    Ok(())
}
