//! Append throughput of the commit log through `Store::put`, one producer
//! thread, async flush (the dispatcher indexes on the other core meanwhile);
//! and durable puts in sync flush mode through `Store::put_batch`, one
//! producer, batches of 1 to 4,096 (one sync each, shared with nothing else).
//!
//! `cargo bench --bench commitlog`

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use delaywheel::{Config, FlushMode, Message, Store};

fn append(c: &mut Criterion) {
    let mut group = c.benchmark_group("append");
    group.sample_size(20).measurement_time(Duration::from_secs(6)).warm_up_time(Duration::from_secs(2));
    for body_bytes in [128usize, 4096] {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(Config::new(dir.path())).expect("open store");
        let body = Bytes::from(vec![b'x'; body_bytes]);
        group.throughput(Throughput::Elements(1));
        group.bench_with_input(BenchmarkId::new("put_async", body_bytes), &body, |b, body| {
            b.iter_custom(|iters| {
                let started = Instant::now();
                for _ in 0..iters {
                    store.put(Message::new("BenchTopic", body.clone())).expect("put");
                }
                started.elapsed()
            })
        });
        store.close().expect("close");
    }
    group.finish();
}

fn put_batch_sync(c: &mut Criterion) {
    let mut group = c.benchmark_group("put_batch_sync");
    group.sample_size(10).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(Config::new(dir.path()).with_flush_mode(FlushMode::Sync)).expect("open store");
    let body = Bytes::from(vec![b'x'; 128]);
    for size in [1usize, 16, 256, 4096] {
        group.throughput(Throughput::Elements(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let batch: Vec<Message> =
                        (0..size).map(|_| Message::new("BenchTopic", body.clone())).collect();
                    let started = Instant::now();
                    store.put_batch(batch).expect("put_batch");
                    spent += started.elapsed();
                }
                spent
            })
        });
    }
    store.close().expect("close");
    group.finish();
}

criterion_group!(benches, append, put_batch_sync);
criterion_main!(benches);
