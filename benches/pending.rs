//! What `Store::pending` costs: a 5-minute window holding `IN_WINDOW`
//! timers, on a store with `PENDING` timers in all (the rest spread over the
//! next 30 days, most of them on level 1, about 115 of them in the window
//! too), whole and with a limit of 100. The
//! store's clock is a manual one, so nothing fires while it is measured.
//! `by_key`: `Store::pending_by_key` of one key of them (each has its own).
//!
//! `cargo bench --bench pending` (`DELAYWHEEL_BENCH_PENDING=N` sets `PENDING`).

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use delaywheel::{Config, ManualClock, Message, Store};

const T0: u64 = 1_700_000_000_000;
const IN_WINDOW: u64 = 100_000;
const WINDOW_MS: u64 = 300_000;
const DAY_MS: u64 = 86_400_000;

fn store_with_pending(dir: &std::path::Path, pending: u64) -> Store {
    let clock = ManualClock::new(T0);
    let store = Store::open(Config::new(dir).with_clock(clock)).expect("open");
    let body = vec![7u8; 64];
    // The window is an hour from now; the others anywhere in the next 30 days.
    let window_start = T0 + 3_600_000;
    let mut batch = Vec::with_capacity(1_000);
    for i in 0..pending {
        let at = if i < IN_WINDOW {
            window_start + i * WINDOW_MS / IN_WINDOW
        } else {
            T0 + 60_000 + fastrand::u64(0..30 * DAY_MS)
        };
        batch.push(Message::new("bench", body.clone()).key(format!("order-{i}")).deliver_at_ms(at));
        if batch.len() == 1_000 {
            store.put_batch(std::mem::take(&mut batch)).expect("put");
        }
    }
    store.put_batch(batch).expect("put");
    store.fresh_stats().expect("indexed");
    store
}

fn pending_window(c: &mut Criterion) {
    let pending =
        std::env::var("DELAYWHEEL_BENCH_PENDING").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store_with_pending(dir.path(), pending);
    let window = T0 + 3_600_000..T0 + 3_600_000 + WINDOW_MS;
    let mut group = c.benchmark_group(format!("pending_{pending}"));
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    for limit in [100usize, usize::MAX] {
        group.throughput(Throughput::Elements(limit.min(IN_WINDOW as usize) as u64));
        group.bench_with_input(
            BenchmarkId::new("5_min_window", limit.min(IN_WINDOW as usize)),
            &limit,
            |b, &limit| {
                b.iter(|| {
                    let found = store.pending(window.clone(), limit).expect("pending");
                    // The timers spread over 30 days put a few more in the window.
                    assert!(found.len() as u64 >= (limit as u64).min(IN_WINDOW));
                })
            },
        );
    }
    // One key among the `pending`, each timer with its own key.
    group.throughput(Throughput::Elements(1));
    group.bench_function("by_key", |b| {
        b.iter(|| {
            let key = format!("order-{}", fastrand::u64(0..pending));
            assert_eq!(store.pending_by_key("bench", &key, 10).expect("by key").len(), 1);
        })
    });
    group.finish();
    store.close().expect("close");
}

criterion_group!(benches, pending_window);
criterion_main!(benches);
