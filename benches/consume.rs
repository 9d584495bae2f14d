//! A consumer alone: how long one thread takes to read a queue's messages
//! once they are indexed. In a hot millisecond (`perf --same-millisecond`)
//! the consumer is the thread that finishes last, so its cost per message
//! bounds the burst.
//!
//! * `consume/timers`: a million timers due at one millisecond, delivered
//!   (manual clock) and indexed before timing: each is reached through its
//!   deliveries record, as in the burst;
//! * `consume/ordinary`: a million ordinary messages, for comparison.
//!
//! Each iteration reads the whole queue again from position 0 with one
//! consumer (`seek`), so the messages (185 MB) are as cold as the page cache
//! and the CPU caches leave them between iterations.
//!
//! `cargo bench --bench consume`

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use delaywheel::{Clock, Config, Consumer, ManualClock, Message, Store};

const T0: u64 = 1_700_000_000_000;
const TOPIC: &str = "BenchTopic";
const N: u64 = 1_000_000;
const POLL_BATCH: usize = 4096;
/// When the timers are due: far enough ahead that their second is not loaded while they are put.
const DUE_MS: u64 = T0 + 10_000;

/// A store holding `N` messages in queue 0 of `TOPIC`, every one indexed.
struct Filled {
    store: Store,
    _dir: tempfile::TempDir,
}

impl Filled {
    /// `timed`: each message is a timer due at `DUE_MS`, and the clock has
    /// moved past it in steps, so the ticker loads its second before it is
    /// due (and learns where each timer goes, as in a burst).
    fn new(timed: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = ManualClock::new(T0);
        let config = Config::new(dir.path())
            .with_segment_size(1 << 30)
            .with_queues_per_topic(1)
            .with_clock(clock.clone());
        let store = Store::open(config).expect("open store");
        let body = vec![7u8; 128];
        let batch: Vec<Message> = (0..N)
            .map(|_| {
                let message = Message::new(TOPIC, body.clone()).queue_id(0);
                if timed { message.deliver_at_ms(DUE_MS) } else { message }
            })
            .collect();
        for chunk in batch.chunks(4096) {
            store.put_batch(chunk.to_vec()).expect("put");
        }
        let filled = Self { store, _dir: dir };
        filled.wait_indexed();
        let before = filled.store.stats().log_bytes;
        while timed && clock.now_ms() <= DUE_MS {
            clock.advance_ms(100);
            std::thread::sleep(Duration::from_millis(20));
        }
        filled.wait_queue_len(N);
        if timed {
            // Runs of timers as deliveries records (12 bytes a timer), not delivery records (28).
            let per_timer = (filled.store.stats().log_bytes - before) / N;
            assert!(per_timer < 16, "{per_timer} bytes of delivery records per timer");
        }
        filled
    }

    fn wait_indexed(&self) {
        while self.store.stats().dispatch_lag_bytes > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn wait_queue_len(&self, len: u64) {
        let consumer = self.store.consumer(TOPIC, 0).expect("consumer");
        let deadline = Instant::now() + Duration::from_secs(300);
        while consumer.queue_len() < len {
            assert!(Instant::now() < deadline, "indexed {} of {len}", consumer.queue_len());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Reads the whole queue from position 0; the time it took.
fn read_all(consumer: &mut Consumer) -> Duration {
    consumer.seek(0);
    let started = Instant::now();
    let mut got = 0u64;
    let mut checksum = 0u8;
    while got < N {
        let batch = consumer.poll(POLL_BATCH, Duration::from_secs(10)).expect("poll");
        assert!(!batch.is_empty(), "stalled at {got} of {N}");
        got += batch.len() as u64;
        checksum ^= batch.iter().fold(0, |acc, m| acc ^ m.body()[0]);
    }
    std::hint::black_box(checksum);
    started.elapsed()
}

fn consume(c: &mut Criterion) {
    let mut group = c.benchmark_group("consume");
    group.sample_size(10).throughput(Throughput::Elements(N));
    for (name, timed) in [("timers", true), ("ordinary", false)] {
        let filled = Filled::new(timed);
        let mut consumer = filled.store.consumer(TOPIC, 0).expect("consumer");
        group.bench_function(name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| read_all(&mut consumer)).sum())
        });
    }
    group.finish();
}

criterion_group!(benches, consume);
criterion_main!(benches);
