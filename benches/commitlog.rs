//! Append throughput of the commit log through `Store::put`, one producer
//! thread, async flush (the dispatcher indexes on the other core meanwhile).
//!
//! `cargo bench --bench commitlog`

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use delaywheel::{Config, Message, Store};

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

criterion_group!(benches, append);
criterion_main!(benches);
