//! What moving a timer costs: `Store::reschedule` against what it replaces,
//! a cancel followed by a put of the message again (not atomic, and a new
//! handle), a cancel alone, and `Store::put_replacing` (a new body and
//! time in place of the pending timer of a dedup key, found by the key), and
//! a put answered as a duplicate (the key's lookup alone);
//! each on timers a day ahead, one timer per operation, on a manual clock
//! (nothing fires). Criterion runs the five side by side in one run.
//!
//! `cargo bench --bench timer_control`

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use delaywheel::{
    CancelOutcome, Config, Handle, ManualClock, Message, ReplaceOutcome, RescheduleOutcome, Store,
};

const T0: u64 = 1_700_000_000_000;
const DAY_MS: u64 = 86_400_000;

fn message(i: u64) -> Message {
    Message::new("bench", vec![7u8; 128]).deliver_at_ms(T0 + DAY_MS + i % 3_600_000)
}

/// Handles of `n` fresh timers, put outside the measurement.
fn handles(store: &Store, n: u64, next: &mut u64) -> Vec<Handle> {
    let batch: Vec<Message> = (*next..*next + n).map(message).collect();
    *next += n;
    let receipts = store.put_batch(batch).expect("put");
    store.fresh_stats().expect("indexed");
    receipts.iter().map(|r| r.handle().expect("a timer")).collect()
}

/// Puts `n` fresh timers with dedup keys `k<i>` outside the measurement; their `i`s.
fn keyed(store: &Store, n: u64, next: &mut u64) -> std::ops::Range<u64> {
    let keys = *next..*next + n;
    *next += n;
    store
        .put_batch(keys.clone().map(|i| message(i).dedup_key(format!("k{i}"))).collect::<Vec<_>>())
        .expect("put");
    store.fresh_stats().expect("indexed");
    keys
}

fn timer_control(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(Config::new(dir.path()).with_clock(ManualClock::new(T0))).expect("open");
    let mut next = 0;
    let mut group = c.benchmark_group("timer_control");
    group.sample_size(20).measurement_time(Duration::from_secs(5));
    group.bench_function("reschedule", |b| {
        b.iter_custom(|iters| {
            let pool = handles(&store, iters, &mut next);
            let started = Instant::now();
            for (i, &h) in pool.iter().enumerate() {
                let to = h.deliver_at_ms + 600_000 + i as u64;
                assert_eq!(store.reschedule(h, to).expect("reschedule"), RescheduleOutcome::Rescheduled);
            }
            started.elapsed()
        })
    });
    group.bench_function("cancel_then_put", |b| {
        b.iter_custom(|iters| {
            let pool = handles(&store, iters, &mut next);
            let started = Instant::now();
            for (i, &h) in pool.iter().enumerate() {
                assert_eq!(store.cancel(h).expect("cancel"), CancelOutcome::Cancelled);
                let again =
                    Message::new("bench", vec![7u8; 128]).deliver_at_ms(h.deliver_at_ms + 600_000 + i as u64);
                store.put(again).expect("put");
            }
            started.elapsed()
        })
    });
    // The replacements are built outside the measurement, as reschedule's
    // handles are: what is timed is the store's work, not the caller's.
    group.bench_function("put_replacing", |b| {
        b.iter_custom(|iters| {
            let keys = keyed(&store, iters, &mut next);
            let replacements: Vec<Message> = keys
                .map(|i| {
                    let at = T0 + DAY_MS + 600_000 + i % 3_600_000;
                    Message::new("bench", vec![7u8; 128]).dedup_key(format!("k{i}")).deliver_at_ms(at)
                })
                .collect();
            let started = Instant::now();
            for again in replacements {
                let outcome = store.put_replacing(again).expect("put_replacing");
                assert!(matches!(outcome, ReplaceOutcome::Replaced { .. }));
            }
            started.elapsed()
        })
    });
    // What put_replacing's lookup costs alone: a put answered as a duplicate.
    group.bench_function("duplicate_put", |b| {
        b.iter_custom(|iters| {
            let keys = keyed(&store, iters, &mut next);
            let again: Vec<Message> = keys
                .map(|i| {
                    Message::new("bench", vec![7u8; 128])
                        .dedup_key(format!("k{i}"))
                        .deliver_at_ms(T0 + DAY_MS)
                })
                .collect();
            let started = Instant::now();
            for again in again {
                assert!(store.put(again).expect("put").is_duplicate());
            }
            started.elapsed()
        })
    });
    group.bench_function("cancel", |b| {
        b.iter_custom(|iters| {
            let pool = handles(&store, iters, &mut next);
            let started = Instant::now();
            for &h in &pool {
                assert_eq!(store.cancel(h).expect("cancel"), CancelOutcome::Cancelled);
            }
            started.elapsed()
        })
    });
    group.finish();
    store.close().expect("close");
}

criterion_group!(benches, timer_control);
criterion_main!(benches);
