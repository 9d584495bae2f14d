//! Retries with exponential backoff through the legacy delay levels.
//!
//! A job that fails is put again at the next delay level (1 s, 5 s, 10 s,
//! 30 s, 1 min, … in RocketMQ's default table), with its attempt number in a
//! property, until it succeeds or runs out of attempts. A manual clock moves
//! to each retry's due time in an instant:
//!
//! ```sh
//! cargo run --example retry_backoff
//! ```

use std::time::Duration;

use delaywheel::{Clock, Config, ConsumedMessage, ManualClock, Message, Store};

const RETRIES: &str = "JobRetry";
/// Levels 1 to 5: 1 s, 5 s, 10 s, 30 s, 1 min.
const MAX_ATTEMPTS: u16 = 5;

/// The job: it fails until its fourth attempt (a flaky downstream service).
fn run_job(attempt: u16) -> Result<(), String> {
    if attempt < 4 { Err(format!("downstream timed out (attempt {attempt})")) } else { Ok(()) }
}

fn attempt_of(m: &ConsumedMessage) -> u16 {
    m.properties().iter().find(|(k, _)| k == "attempt").and_then(|(_, v)| v.parse().ok()).unwrap_or(1)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(1_767_225_600_000);
    let store = Store::open(Config::new(dir.path()).with_clock(clock.clone()).with_queues_per_topic(1))?;
    let start = clock.now_ms();

    // The first attempt failed at once: retry it at level 1.
    let first = Message::new(RETRIES, "send-invoice-42").property("attempt", "1").delay_level(1);
    let mut due = store.put(first)?.deliver_at_ms();

    let mut consumer = store.consumer(RETRIES, 0)?;
    while let Some(at) = due.take() {
        // Move the clock to the retry's due time and wait for it to arrive.
        clock.set_ms(at);
        let m = consumer.poll(1, Duration::from_secs(5))?.pop().ok_or("the retry did not arrive")?;
        consumer.commit();
        let attempt = attempt_of(&m);
        let after_s = (m.delivered_at_ms() - start) / 1000;
        match run_job(attempt) {
            Ok(()) => println!("attempt {attempt} at +{after_s}s: done"),
            Err(why) if attempt < MAX_ATTEMPTS => {
                let next = attempt + 1;
                let delay = store.delay_levels().delays().nth(usize::from(next - 1)).unwrap_or_default();
                println!("attempt {attempt} at +{after_s}s failed: {why}; next in {delay:?}");
                let retry = Message::new(RETRIES, m.body().clone()).property("attempt", next.to_string());
                due = store.put(retry.delay_level(next))?.deliver_at_ms();
            }
            Err(why) => println!("attempt {attempt} failed: {why}; giving up"),
        }
    }
    // 1 s before the first retry, then 5, 10 and 30 s: the fourth attempt succeeds 46 s in.
    assert_eq!((clock.now_ms() - start) / 1000, 46);
    store.close()?;
    Ok(())
}
