//! Retries with exponential backoff through the legacy delay levels.
//!
//! A job that fails is put again at the next delay level (1 s, 5 s, 10 s,
//! 30 s, 1 min, … in RocketMQ's default table), with its attempt number in a
//! property, until it succeeds or runs out of attempts. A manual clock moves
//! through the waits in an instant:
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
    store.put(Message::new(RETRIES, "send-invoice-42").property("attempt", "1").delay_level(1))?;

    let mut consumer = store.consumer(RETRIES, 0)?;
    let mut done = false;
    while !done {
        // Move the clock a second at a time until the next retry is due.
        clock.advance_ms(1_000);
        for m in consumer.poll(10, Duration::from_millis(50))? {
            let attempt = attempt_of(&m);
            let after_s = (m.delivered_at_ms() - start) / 1000;
            match run_job(attempt) {
                Ok(()) => {
                    println!("attempt {attempt} at +{after_s}s: done");
                    done = true;
                }
                Err(why) if attempt < MAX_ATTEMPTS => {
                    let next = attempt + 1;
                    let delay = store.delay_levels().delays().nth(usize::from(next - 1)).unwrap_or_default();
                    println!("attempt {attempt} at +{after_s}s failed: {why}; next in {delay:?}");
                    let body = m.body().clone();
                    let retry = Message::new(RETRIES, body).property("attempt", next.to_string());
                    store.put(retry.delay_level(next))?;
                }
                Err(why) => {
                    println!("attempt {attempt} failed: {why}; giving up");
                    done = true;
                }
            }
        }
        consumer.commit();
    }
    // 1 s before the first retry, then 5, 10 and 30 s: the fourth attempt succeeds 46 s in.
    assert_eq!((clock.now_ms() - start) / 1000, 46);
    store.close()?;
    Ok(())
}
