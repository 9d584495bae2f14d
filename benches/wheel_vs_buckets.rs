//! The timing wheel against RocketMQ 4.x's 18 buckets, on the same store and
//! the same work, side by side (`BenchmarkId`s `wheel` and `buckets`):
//!
//! * `enqueue`: put N legacy-level messages until the dispatcher has indexed them;
//! * `deliver`: N level-1 messages come due at once (manual clock, no
//!   sleeping): time until a consumer has them all;
//! * `mixed`: a simulated hour in 5-minute steps, puts at every legacy level
//!   up to 1 h interleaved with the deliveries that come due;
//! * `arbitrary`: N arbitrary delays up to a minute (the buckets round them up
//!   to the next level), the clock jumps past them all, a consumer takes them.
//!
//! How *late* arbitrary delays arrive needs a real clock: after the criterion
//! groups, one run per scheduler with the system clock prints its lateness.
//!
//! `cargo bench --bench wheel_vs_buckets`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use delaywheel::{Config, Consumer, ManualClock, Message, Scheduler, Store};

const T0: u64 = 1_700_000_000_000;
const TOPIC: &str = "BenchTopic";
const N: usize = 20_000;
const SCHEDULERS: [(&str, Scheduler); 2] = [("wheel", Scheduler::Wheel), ("buckets", Scheduler::Buckets)];

/// A fresh store on a manual clock (dropped with its directory after the iteration).
struct Bench {
    store: Store,
    clock: ManualClock,
    _dir: tempfile::TempDir,
}

impl Bench {
    fn open(scheduler: Scheduler) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = ManualClock::new(T0);
        let config = Config::new(dir.path())
            .with_segment_size(256 << 20)
            .with_queues_per_topic(1)
            .with_clock(clock.clone())
            .with_scheduler(scheduler);
        let bench = Self { store: Store::open(config).expect("open store"), clock, _dir: dir };
        bench.warm_up();
        bench
    }

    /// Creates the files a run will write (each level's queue for the buckets,
    /// the topic's queue for both), so no iteration times file creation.
    fn warm_up(&self) {
        // One message per level, cancelled at once: it never arrives.
        for level in 1..=18u16 {
            let receipt = self.store.put(Message::new(TOPIC, "warm-up").queue_id(0).delay_level(level));
            let handle = receipt.expect("put").handle().expect("a timed message");
            self.store.cancel(handle).expect("cancel");
        }
        self.put(Message::new(TOPIC, "warm-up"));
        let mut consumer = self.store.consumer(TOPIC, 0).expect("consumer");
        take(&mut consumer, 1);
        consumer.commit();
        self.wait_indexed();
    }

    fn put(&self, message: Message) {
        self.store.put(message.queue_id(0)).expect("put");
    }

    /// Waits until the dispatcher has indexed everything put.
    fn wait_indexed(&self) {
        while self.store.stats().dispatch_lag_bytes > 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Takes `count` messages from `consumer` (panics after a minute without progress).
fn take(consumer: &mut Consumer, count: usize) {
    let mut got = 0;
    while got < count {
        let batch = consumer.poll(count - got, Duration::from_secs(60)).expect("poll");
        assert!(!batch.is_empty(), "deliveries stalled at {got} of {count}");
        got += batch.len();
    }
}

fn level_message(i: usize, levels: u16) -> Message {
    Message::new(TOPIC, format!("m{i}")).delay_level(1 + (i % usize::from(levels)) as u16)
}

/// Runs `one_run` (a fresh store per run, returning the time it measured) as
/// the group `name`, once per scheduler, side by side.
fn compare(c: &mut Criterion, name: &str, elements: u64, one_run: impl Fn(Scheduler) -> Duration) {
    let mut group = c.benchmark_group(name);
    group.sample_size(10).throughput(Throughput::Elements(elements));
    for (label, scheduler) in SCHEDULERS {
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| one_run(scheduler)).sum())
        });
    }
    group.finish();
}

fn enqueue(c: &mut Criterion) {
    compare(c, "enqueue", N as u64, |scheduler| {
        let bench = Bench::open(scheduler);
        let started = Instant::now();
        (0..N).for_each(|i| bench.put(level_message(i, 18)));
        bench.wait_indexed();
        started.elapsed()
    });
}

fn deliver(c: &mut Criterion) {
    compare(c, "deliver", N as u64, |scheduler| {
        let bench = Bench::open(scheduler);
        (0..N).for_each(|i| bench.put(level_message(i, 1)));
        bench.wait_indexed();
        let mut consumer = bench.store.consumer(TOPIC, 0).expect("consumer");
        let started = Instant::now();
        bench.clock.advance_ms(1_000);
        take(&mut consumer, N);
        started.elapsed()
    });
}

/// Levels 1 to 17 of the default table: 1 s to 1 h.
const MIXED_LEVELS: u16 = 17;
const MIXED_STEP_MS: u64 = 5 * 60_000;
const MIXED_STEPS: u64 = 12;
const MIXED_PER_STEP: usize = 2_000;

fn mixed(c: &mut Criterion) {
    let table: Vec<u64> = delaywheel::DelayLevels::default().delays().map(|d| d.as_millis() as u64).collect();
    compare(c, "mixed_hour", MIXED_STEPS * MIXED_PER_STEP as u64, |scheduler| mixed_hour(scheduler, &table));
}

/// One simulated hour: each step puts a batch, moves the clock on and takes
/// every message that has come due (the deliver times are known at put).
fn mixed_hour(scheduler: Scheduler, table: &[u64]) -> Duration {
    let bench = Bench::open(scheduler);
    let mut consumer = bench.store.consumer(TOPIC, 0).expect("consumer");
    let mut due: BTreeMap<u64, usize> = BTreeMap::new();
    let mut delivered = 0;
    let started = Instant::now();
    for step in 0..MIXED_STEPS {
        let now = T0 + step * MIXED_STEP_MS;
        for i in (0..MIXED_PER_STEP).map(|i| step as usize * MIXED_PER_STEP + i) {
            *due.entry(now + table[i % usize::from(MIXED_LEVELS)]).or_default() += 1;
            bench.put(level_message(i, MIXED_LEVELS));
        }
        bench.clock.set_ms(now + MIXED_STEP_MS);
        let due_now: usize = due.range(..=now + MIXED_STEP_MS).map(|(_, n)| n).sum();
        take(&mut consumer, due_now - delivered);
        delivered = due_now;
    }
    started.elapsed()
}

fn arbitrary(c: &mut Criterion) {
    compare(c, "arbitrary", N as u64, |scheduler| {
        let bench = Bench::open(scheduler);
        let mut rng = fastrand::Rng::with_seed(7);
        let started = Instant::now();
        for i in 0..N {
            bench.put(Message::new(TOPIC, format!("m{i}")).deliver_at_ms(T0 + rng.u64(0..60_000)));
        }
        let mut consumer = bench.store.consumer(TOPIC, 0).expect("consumer");
        bench.clock.advance_ms(120_000);
        take(&mut consumer, N);
        started.elapsed()
    });
    print_real_lateness();
}

/// Puts 20,000 messages due uniformly within the next 3 s on the system clock
/// and prints how late each scheduler delivers them (consumer side).
fn print_real_lateness() {
    for (name, scheduler) in SCHEDULERS {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = Config::new(dir.path()).with_segment_size(256 << 20).with_queues_per_topic(1);
        let store = Store::open(config.with_scheduler(scheduler)).expect("open store");
        let mut consumer = store.consumer(TOPIC, 0).expect("consumer");
        let mut rng = fastrand::Rng::with_seed(11);
        let now = || delaywheel::Clock::now_ms(&delaywheel::SystemClock);
        let start = now();
        for i in 0..N {
            store
                .put(
                    Message::new(TOPIC, format!("m{i}")).queue_id(0).deliver_at_ms(start + rng.u64(0..3_000)),
                )
                .expect("put");
        }
        let mut late =
            hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
        let mut early = 0;
        while late.len() + early < N as u64 {
            for m in consumer.poll(N, Duration::from_secs(30)).expect("poll") {
                let due = m.deliver_at_ms().expect("timed");
                match now().checked_sub(due) {
                    Some(ms) => late.saturating_record(ms),
                    None => early += 1,
                }
            }
        }
        eprintln!(
            "arbitrary/lateness/{name}: {} delays in 0..3 s, consumer-side lateness p50 {} ms, p99 {} ms, max {} ms, early {early}",
            N,
            late.value_at_quantile(0.5),
            late.value_at_quantile(0.99),
            late.max()
        );
        store.close().expect("close");
    }
}

criterion_group!(benches, enqueue, deliver, mixed, arbitrary);
criterion_main!(benches);
