//! An order is cancelled if it is not paid within 30 minutes.
//!
//! Every order puts a timeout timer due 30 minutes after it was placed; a
//! payment cancels that timer. A timeout that fires means the order was not
//! paid: the service cancels the order. A manual clock moves the half hour
//! in an instant, so this runs in well under a second:
//!
//! ```sh
//! cargo run --example order_timeout
//! ```

use std::collections::HashMap;
use std::time::Duration;

use delaywheel::{CancelOutcome, Clock, Config, Handle, ManualClock, Message, Store};

const TIMEOUTS: &str = "OrderTimeout";
const PAY_WITHIN: Duration = Duration::from_secs(30 * 60);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(1_767_225_600_000); // 2026-01-01T00:00:00Z
    let store = Store::open(Config::new(dir.path()).with_clock(clock.clone()).with_queues_per_topic(1))?;

    // Three orders are placed; each gets a timeout 30 minutes ahead. The
    // handle is what the payment service keeps to cancel the timeout.
    let mut timeouts: HashMap<&str, Handle> = HashMap::new();
    for order in ["order-1", "order-2", "order-3"] {
        let receipt = store.put(Message::new(TIMEOUTS, order).key(order).delay(PAY_WITHIN))?;
        timeouts.insert(order, receipt.handle().expect("a timed message has a handle"));
    }

    // Ten minutes later, order-1 and order-3 are paid: their timeouts are cancelled.
    clock.advance_ms(10 * 60_000);
    for order in ["order-1", "order-3"] {
        let outcome = store.cancel(timeouts[order])?;
        assert_eq!(outcome, CancelOutcome::Cancelled);
        println!("{order} paid: its timeout is cancelled");
    }

    // Half an hour after the orders, only order-2's timeout fires.
    clock.advance_ms(20 * 60_000 + 1_000);
    let mut consumer = store.consumer(TIMEOUTS, 0)?;
    let mut unpaid = Vec::new();
    // Wait for the timeout that fires, then a little longer: nothing else may come.
    for wait in [Duration::from_secs(5), Duration::from_millis(300)] {
        for m in consumer.poll(10, wait)? {
            let late_ms = m.delivered_at_ms() - m.deliver_at_ms().unwrap_or(0);
            let order = String::from_utf8(m.body().to_vec())?;
            println!("{order} was not paid in time: cancelling the order ({late_ms} ms after its deadline)");
            unpaid.push(order);
        }
    }
    consumer.commit();
    assert_eq!(unpaid, ["order-2"]);

    // A payment that arrives after the timeout fired learns that it is too late.
    assert_eq!(store.cancel(timeouts["order-2"])?, CancelOutcome::AlreadyDelivered);
    println!("order-2 paid at {}: too late, its timeout had fired", clock.now_ms());
    store.close()?;
    Ok(())
}
