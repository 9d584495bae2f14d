//! A put that is retried, and a timeout that two replicas both schedule:
//! with a dedup key, each writes one timer.
//!
//! A service puts the 30-minute timeout of an order with the order id as
//! its dedup key. Its first put times out in the caller (in sync mode the
//! store answers `NotYetDurable`: the message stands), so it retries; a
//! second replica handles the same order and puts the same timeout. Each
//! extra put answers the first receipt, marked as a duplicate, and one
//! timeout fires. Then the customer changes the order: `put_replacing`
//! moves the timeout and changes its body by one record.
//!
//! ```sh
//! cargo run --example retried_put
//! ```

use std::time::Duration;

use delaywheel::{Config, Error, FlushMode, ManualClock, Message, ReplaceOutcome, Store, Written};

const TIMEOUTS: &str = "OrderTimeout";

fn timeout(order: &str, body: &str, after: Duration) -> Message {
    Message::new(TIMEOUTS, body.to_string()).queue_id(0).dedup_key(order).delay(after)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(1_767_225_600_000); // 2026-01-01T00:00:00Z
    // A put timeout far shorter than a sync, so the first put "times out".
    let config = Config::new(dir.path())
        .with_clock(clock.clone())
        .with_flush_mode(FlushMode::Sync)
        .with_put_timeout(Duration::from_nanos(1));
    let store = Store::open(config)?;

    let half_hour = Duration::from_secs(30 * 60);
    let first = match store.put(timeout("order-42", "cancel order-42 if unpaid", half_hour)) {
        Ok(receipt) => receipt,
        Err(Error::NotYetDurable { written: Written::Put(receipt), .. }) => {
            println!("the put timed out waiting for the disk, but the message stands: retrying anyway");
            receipt
        }
        Err(e) => return Err(e.into()),
    };
    let answers = [
        store.put(timeout("order-42", "cancel order-42 if unpaid", half_hour)), // the retry
        store.put(timeout("order-42", "cancel order-42 if unpaid", half_hour)), // another replica
    ];
    for answer in answers {
        let receipt = match answer {
            Ok(receipt) | Err(Error::NotYetDurable { written: Written::Put(receipt), .. }) => receipt,
            Err(e) => return Err(e.into()),
        };
        assert!(receipt.is_duplicate() && receipt.handle() == first.handle());
        println!(
            "a second put of order-42's timeout wrote nothing: it answers the first ({})",
            first.offset()
        );
    }
    store.wait_durable(&first, Duration::from_secs(10))?;
    store.close()?;

    // The customer adds an item ten minutes later: the timeout restarts with
    // the new total. (Reopened with the default put timeout; a duplicate is
    // recognised across restarts too: the dedup index is rebuilt from the log.)
    let store =
        Store::open(Config::new(dir.path()).with_clock(clock.clone()).with_flush_mode(FlushMode::Sync))?;
    clock.advance_ms(10 * 60_000);
    let moved = store.put_replacing(timeout("order-42", "cancel order-42 (2 items) if unpaid", half_hour))?;
    let ReplaceOutcome::Replaced { receipt, replaced } = moved else { unreachable!("the first is pending") };
    assert_eq!(Some(replaced), first.handle());
    println!("order-42's timeout moved to {} ms, by one record", receipt.deliver_at_ms().unwrap_or(0));

    clock.advance_ms(45 * 60_000);
    let mut consumer = store.consumer(TIMEOUTS, 0)?;
    let mut fired = Vec::new();
    for wait in [Duration::from_secs(5), Duration::from_millis(300)] {
        for m in consumer.poll(10, wait)? {
            fired.push(String::from_utf8(m.body().to_vec())?);
        }
    }
    assert_eq!(fired, ["cancel order-42 (2 items) if unpaid"]);
    println!("one timeout fired: {}", fired[0]);
    store.close()?;
    Ok(())
}
