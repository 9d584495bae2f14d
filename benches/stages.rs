//! Each serial stage of a timer's way alone, as CPU time per timer of the
//! one thread that does it (read from `/proc/self/task`, so what other
//! threads do meanwhile is not counted): the two stages that bound the
//! store on any number of cores (issue 42), judged in ns per timer.
//!
//! * `stages/tick_insert`: `dw-tick` while timers are put and indexed: the
//!   wheel's insert and its timer-log append, per timer;
//! * `stages/tick_fire`: `dw-tick` from loading the timers' second to
//!   writing their deliveries records, per timer;
//! * `stages/dispatch_put`: `dw-dispatch` per message record it indexes
//!   (checked, handed to the wheel, counted);
//! * `stages/dispatch_fired`: `dw-dispatch` per fired timer, indexing the
//!   deliveries records into the queue.
//!
//! Each iteration is a batch of [`BATCH`] timers, due 10 s ahead of a
//! manual clock and spread over one second's milliseconds: it puts them,
//! waits until they are indexed, moves the clock past them and waits until
//! the queue holds them all. The thread's CPU time is the scheduler's
//! `se.sum_exec_runtime` (ns, in `/proc/self/task/*/sched`), or where the
//! kernel has no such file its ticks (10 ms, in `stat`); the throughput
//! criterion prints is timers per CPU-second of the thread (ns per timer =
//! 10^9 / throughput).
//!
//! `cargo bench --bench stages`

use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use delaywheel::{Clock, Config, ManualClock, Message, Store};

const T0: u64 = 1_700_000_000_000;
const TOPIC: &str = "StageTopic";
const BODY: [u8; 16] = [7; 16];
/// Timers per iteration.
const BATCH: u64 = 200_000;

/// The stages, by the thread measured and the phase of a sample.
#[derive(Clone, Copy)]
enum Stage {
    TickInsert,
    TickFire,
    DispatchPut,
    DispatchFired,
}

/// CPU time used by each of the two stages' threads in the two phases of a sample.
struct Used {
    put: [Duration; 2],
    fire: [Duration; 2],
}

impl Stage {
    fn of(self, used: &Used) -> Duration {
        match self {
            Self::TickInsert => used.put[0],
            Self::DispatchPut => used.put[1],
            Self::TickFire => used.fire[0],
            Self::DispatchFired => used.fire[1],
        }
    }
}

struct Rig {
    store: Store,
    clock: ManualClock,
    delivered: u64,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = ManualClock::new(T0);
        let config = Config::new(dir.path())
            .with_segment_size(1 << 30)
            .with_queues_per_topic(1)
            .with_clock(clock.clone());
        let store = Store::open(config).expect("open store");
        Self { store, clock, delivered: 0, _dir: dir }
    }

    /// One sample of `n` timers: the CPU the ticker and the dispatcher used
    /// while they were put and indexed, and while they fired and were indexed.
    fn sample(&mut self, n: u64) -> Used {
        let due = self.clock.now_ms() + 10_000;
        let before = threads_cpu();
        let messages: Vec<Message> = (0..n)
            .map(|i| Message::new(TOPIC, &BODY[..]).queue_id(0).deliver_at_ms(due + i % 1000))
            .collect();
        for chunk in messages.chunks(4096) {
            self.store.put_batch(chunk.to_vec()).expect("put");
        }
        while self.store.stats().dispatch_lag_bytes > 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let indexed = threads_cpu();
        while self.clock.now_ms() < due + 1_000 {
            self.clock.advance_ms(100);
            std::thread::sleep(Duration::from_millis(5));
        }
        self.delivered += n;
        self.wait_queue_len(self.delivered);
        let fired = threads_cpu();
        Used { put: diff(indexed, before), fire: diff(fired, indexed) }
    }

    fn wait_queue_len(&self, len: u64) {
        let consumer = self.store.consumer(TOPIC, 0).expect("consumer");
        let deadline = Instant::now() + Duration::from_secs(300);
        while consumer.queue_len() < len {
            assert!(Instant::now() < deadline, "indexed {} of {len}", consumer.queue_len());
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// CPU time of `dw-tick` and `dw-dispatch` so far.
fn threads_cpu() -> [Duration; 2] {
    let mut used = [Duration::ZERO; 2];
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task").flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        let slot = match head.split_once('(').map(|(_, name)| name) {
            Some("dw-tick") => 0,
            Some("dw-dispatch") => 1,
            _ => continue,
        };
        let sched = std::fs::read_to_string(task.path().join("sched")).unwrap_or_default();
        used[slot] += exec_runtime(&sched).unwrap_or_else(|| stat_cpu(rest));
    }
    used
}

/// `se.sum_exec_runtime` of a `sched` file: milliseconds with six decimals.
fn exec_runtime(sched: &str) -> Option<Duration> {
    let line = sched.lines().find(|l| l.starts_with("se.sum_exec_runtime"))?;
    let ms: f64 = line.rsplit(':').next()?.trim().parse().ok()?;
    Some(Duration::from_secs_f64(ms / 1000.0))
}

/// utime and stime of a `stat` file's fields after the name (the 14th and
/// 15th fields; `rest` starts at the 3rd), in clock ticks.
fn stat_cpu(rest: &str) -> Duration {
    let ticks: u64 = rest.split_whitespace().skip(11).take(2).filter_map(|f| f.parse::<u64>().ok()).sum();
    Duration::from_secs_f64(ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
}

fn diff(after: [Duration; 2], before: [Duration; 2]) -> [Duration; 2] {
    [after[0] - before[0], after[1] - before[1]]
}

fn stages(c: &mut Criterion) {
    let mut group = c.benchmark_group("stages");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        // Sized by the thread's CPU time (25-55 ms a batch), so a few
        // seconds of it are some 100 batches: minutes of wall time.
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(BATCH));
    for (name, stage) in [
        ("tick_insert", Stage::TickInsert),
        ("tick_fire", Stage::TickFire),
        ("dispatch_put", Stage::DispatchPut),
        ("dispatch_fired", Stage::DispatchFired),
    ] {
        // A store of its own: the disk it fills is freed between stages.
        let mut rig = Rig::new();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| stage.of(&rig.sample(BATCH))).sum())
        });
    }
    group.finish();
}

criterion_group!(benches, stages);
criterion_main!(benches);
