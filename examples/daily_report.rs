//! A settlement report every weekday at 09:00 Shanghai time, as a
//! recurring schedule: one record, each occurrence a delivery with its
//! number and the next instant. A manual clock walks a week of them in an
//! instant, across a reopen of the store (the schedule goes on where it
//! was), and the report is paused for the weekend of a holiday.
//!
//! ```sh
//! cargo run --example daily_report
//! ```

use std::time::Duration;

use delaywheel::{Config, ManualClock, Message, Recurrence, Schedule, Store};

const REPORTS: &str = "Reports";

/// 2026-03-02 00:00 UTC, a Monday (08:00 in Shanghai).
const MONDAY: u64 = 1_772_409_600_000;

/// `ms` as a day of the walked fortnight and a UTC time of day.
fn utc(ms: u64) -> String {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    let since = ms - MONDAY;
    let (day, in_day) = (since / 86_400_000, since % 86_400_000);
    format!("{} {:02}:{:02} UTC", DAYS[day as usize % 7], in_day / 3_600_000, in_day / 60_000 % 60)
}

/// Moves the clock to `at` and prints the report delivered by then.
fn run_until(store: &Store, clock: &ManualClock, at: u64) -> Result<(), Box<dyn std::error::Error>> {
    clock.set_ms(at);
    let mut consumer = store.consumer(REPORTS, 0)?;
    for m in consumer.poll(10, Duration::from_millis(500))? {
        let o = m.occurrence().ok_or("a report is an occurrence")?;
        let due = m.deliver_at_ms().ok_or("an occurrence has its instant")?;
        println!(
            "report #{} due {}, delivered {} ms late; next {}",
            o.number,
            utc(due),
            m.delivered_at_ms() - due,
            o.next_at_ms.map_or("none".into(), utc)
        );
    }
    consumer.commit();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(MONDAY);
    let config = || Config::new(dir.path()).with_clock(clock.clone()).with_queues_per_topic(1);
    let store = Store::open(config())?;
    let report = Schedule::new(
        Message::new(REPORTS, "settlement report").key("desk-7"),
        Recurrence::cron("0 0 9 * * MON-FRI").in_time_zone("Asia/Shanghai"),
    );
    println!("next five: {:?}", report.next_occurrences(MONDAY, 5)?.into_iter().map(utc).collect::<Vec<_>>());
    let handle = store.schedule(report)?.handle();

    let day = 86_400_000;
    // Monday to Wednesday, 09:00 Shanghai (01:00 UTC).
    for d in 0..3 {
        run_until(&store, &clock, MONDAY + d * day + 3_600_000)?;
    }
    // The store closes for the night and opens again: the schedule goes on.
    store.close()?;
    let store = Store::open(config())?;
    run_until(&store, &clock, MONDAY + 3 * day + 3_600_000)?;
    // Friday is a holiday: no report until Monday.
    store.pause_schedule(handle)?;
    run_until(&store, &clock, MONDAY + 4 * day + 3_600_000)?;
    println!("Friday: paused, no report");
    // Monday, before 09:00 in Shanghai: resumed, the next is today's.
    clock.set_ms(MONDAY + 7 * day);
    store.resume_schedule(handle)?;
    run_until(&store, &clock, MONDAY + 7 * day + 3_600_000)?;
    store.cancel_schedule(handle)?;
    store.close()?;
    Ok(())
}
