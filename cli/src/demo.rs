//! `delaywheel demo`: the order-timeout story. A shop creates orders; each
//! gets a payment timeout on a legacy delay level (level 2 = 5 s, level 3 =
//! 10 s) or a receipt confirmation at an arbitrary time 1-15 s ahead. A
//! quarter of the orders with a timeout are paid in time, and their timeout is
//! cancelled. The rest land in their topics when due; the demo checks each
//! arrived once and never early, that no cancelled one arrived, and reports lateness.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use delaywheel::{CancelOutcome, Clock, Config, Message, Store, SystemClock};

use crate::{Failure, store_dir};

#[derive(Args, Debug, Default)]
pub struct DemoArgs {
    /// Store directory (default: a temporary directory, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// How many orders to create.
    #[arg(long, default_value_t = 20_000)]
    orders: u64,
}

const TIMEOUTS: &str = "OrderTimeout";
const RECEIPTS: &str = "ReceiptConfirm";

pub fn run(args: DemoArgs) -> Result<(), Failure> {
    let orders = if args.orders == 0 { 20_000 } else { args.orders };
    let (dir, _tmp) = store_dir(args.dir, "delaywheel-demo-")?;
    println!("delaywheel demo: {orders} orders with payment timeouts and receipt confirmations");
    println!("store: {}", dir.display());
    let config = Config::new(&dir).with_queues_per_topic(1).with_segment_size(64 << 20);
    let store = Store::open(config)?;
    let clock = SystemClock;
    let mut rng = fastrand::Rng::with_seed(7);

    let started = Instant::now();
    let mut latest_due = 0;
    let mut paid = vec![false; orders as usize];
    for order in 0..orders {
        let body = format!("order-{order}");
        let message = match order % 3 {
            0 => Message::new(TIMEOUTS, body).delay_level(2),
            1 => Message::new(TIMEOUTS, body).delay_level(3),
            _ => Message::new(RECEIPTS, body).deliver_at_ms(clock.now_ms() + rng.u64(1_000..15_000)),
        };
        let receipt = store.put(message.key(format!("order-{order}")))?;
        latest_due = latest_due.max(receipt.deliver_at_ms().unwrap_or(0));
        // A quarter of the orders with a payment timeout are paid in time.
        if order % 3 != 2 && rng.u8(0..4) == 0 {
            let handle = receipt.handle().ok_or("a timed message without a handle")?;
            if store.cancel(handle)? != CancelOutcome::Cancelled {
                return Err(Failure::Run(format!("order-{order}: the timeout could not be cancelled")));
            }
            paid[order as usize] = true;
        }
    }
    let cancelled = paid.iter().filter(|&&p| p).count() as u64;
    println!(
        "created {orders} orders in {:.2} s: {} payment timeouts (levels 2 and 3: 5 s, 10 s), {} receipt confirmations (1-15 s); {cancelled} orders paid, their timeouts cancelled",
        started.elapsed().as_secs_f64(),
        orders - orders / 3,
        orders / 3
    );

    let mut seen = vec![0u8; orders as usize];
    let mut lateness = crate::lateness_histogram();
    let mut early = 0u64;
    let mut timeouts = store.consumer(TIMEOUTS, 0)?;
    let mut receipts = store.consumer(RECEIPTS, 0)?;
    let deadline_ms = latest_due + 30_000;
    let mut last_line = Instant::now();
    let mut delivered = 0u64;
    while delivered < orders - cancelled && clock.now_ms() < deadline_ms {
        for consumer in [&mut timeouts, &mut receipts] {
            for m in consumer.poll(4096, Duration::from_millis(2))? {
                let now = clock.now_ms();
                let due = m.deliver_at_ms().ok_or("a delivery without a deliver time")?;
                early += u64::from(now < due || m.delivered_at_ms() < due);
                lateness.saturating_record(now.saturating_sub(due));
                let order: usize = std::str::from_utf8(m.body())?.trim_start_matches("order-").parse()?;
                let slot = seen.get_mut(order).ok_or("an order nobody created")?;
                *slot = slot.saturating_add(1);
                delivered += 1;
            }
            consumer.commit();
        }
        if last_line.elapsed() >= Duration::from_millis(500) {
            // Fresh: a second-old count beside a live one could add up past the total.
            let pending = store.fresh_stats()?.pending;
            let line = format!(
                "  waiting: {delivered} of {} timers delivered, {pending} pending",
                orders - cancelled
            );
            if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                print!("\r{line}   ");
                std::io::Write::flush(&mut std::io::stdout())?;
            } else if last_line.elapsed() >= Duration::from_secs(2) {
                println!("{line}");
            } else {
                continue;
            }
            last_line = Instant::now();
        }
    }
    println!();
    drop((timeouts, receipts));
    store.close()?;

    let lost = seen.iter().zip(&paid).filter(|&(&n, &paid)| n == 0 && !paid).count();
    let fired_after_cancel = seen.iter().zip(&paid).filter(|&(&n, &paid)| n > 0 && paid).count();
    let duplicated: u64 = seen.iter().map(|&n| u64::from(n.saturating_sub(1))).sum();
    println!("delivered  {}", delivered - duplicated);
    println!("cancelled  {cancelled} (fired anyway: {fired_after_cancel})");
    println!("lost       {lost}");
    println!("duplicated {duplicated}");
    println!("early      {early}");
    println!(
        "lateness ms (delivery seen by the consumer minus deliver time): p50 {} p90 {} p99 {} p99.9 {} max {}",
        lateness.value_at_quantile(0.5),
        lateness.value_at_quantile(0.9),
        lateness.value_at_quantile(0.99),
        lateness.value_at_quantile(0.999),
        lateness.max()
    );
    if lost > 0 || duplicated > 0 || early > 0 || fired_after_cancel > 0 {
        return Err(Failure::Run(format!(
            "{lost} lost, {duplicated} duplicated, {early} early, {fired_after_cancel} fired after a cancel"
        )));
    }
    Ok(())
}
