//! The producers of `perf`: each puts its share of the messages one at a
//! time (`Store::put`), in batches (`--batch`, `Store::put_batch`), or
//! pipelined (`--inflight`, `Store::submit` with up to N tickets
//! outstanding), and records how long each put took to be acknowledged.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use delaywheel::{CancelOutcome, Clock, Message, PutTicket, Receipt, Store, SystemClock};
use hdrhistogram::Histogram;

use super::{FlushArg, Ledger, PerfArgs, Workload, thread_cpu};
use crate::Failure;

/// How long a producer waits for a ticket before it calls the run failed.
const TICKET_TIMEOUT: Duration = Duration::from_secs(60);

/// Which put a producer makes.
#[derive(Clone, Copy, Debug)]
pub enum PutPath {
    One,
    Batch(usize),
    Inflight(usize),
}

impl PutPath {
    pub fn of(args: &PerfArgs) -> Self {
        match (args.batch, args.inflight) {
            (Some(n), _) => Self::Batch(n),
            (_, Some(n)) => Self::Inflight(n),
            _ => Self::One,
        }
    }

    pub fn name(self) -> String {
        match self {
            Self::One => "put".into(),
            Self::Batch(n) => format!("put_batch of {n}"),
            Self::Inflight(n) => format!("submit, {n} in flight"),
        }
    }
}

/// Put latency in microseconds, up to an hour.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// One producer's share of the run.
struct Producer {
    store: Arc<Store>,
    ledger: Arc<Ledger>,
    workload: Workload,
    rng: fastrand::Rng,
    body_bytes: usize,
    cancel_ratio: f64,
    /// Whether each message gets a key (`--keys`).
    keys: bool,
    /// Whether each message gets a dedup key (`--dedup-keys`).
    dedup_keys: bool,
    /// The topic's queues: message `id` goes to queue `id % queues`.
    queues: u32,
    pace: Pace,
    latest_due: u64,
    /// Whether put latency is recorded: not for one async put at a time,
    /// which returns from the page cache, so that the burst measures the
    /// store and not two clock reads per put.
    timed: bool,
    latency_us: Histogram<u64>,
}

impl Producer {
    fn message(&mut self, id: u64) -> Message {
        let mut body = BytesMut::with_capacity(self.body_bytes);
        body.put_u64_le(id);
        body.put_bytes(b'x', self.body_bytes - 8);
        let queue = (id % u64::from(self.queues)) as u32;
        let message = self.workload.message(body.freeze(), queue, &mut self.rng, SystemClock.now_ms());
        let message = if self.keys { message.key(format!("order-{id}")) } else { message };
        if self.dedup_keys { message.dedup_key(format!("order-{id}")) } else { message }
    }

    /// The put of `id`, made at `since`, is acknowledged with `receipt`; cancels it now and then.
    fn acknowledged(&mut self, id: u64, receipt: Receipt, since: Option<Instant>) -> Result<(), String> {
        if let Some(since) = since {
            self.latency_us.saturating_record(since.elapsed().as_micros() as u64);
        }
        self.latest_due = self.latest_due.max(receipt.deliver_at_ms().unwrap_or(receipt.store_time_ms()));
        self.ledger.acknowledge(id);
        if self.cancel_ratio > 0.0 && self.rng.f64() < self.cancel_ratio {
            let handle = receipt.handle().ok_or("a timed message without a handle")?;
            self.ledger.cancelling(id);
            let outcome = self.store.cancel(handle).map_err(|e| e.to_string())?;
            self.ledger.cancel_answered(id, outcome == CancelOutcome::Cancelled);
        }
        Ok(())
    }

    fn run(&mut self, ids: std::ops::Range<u64>, path: PutPath) -> Result<(), String> {
        match path {
            PutPath::One => self.one_at_a_time(ids),
            PutPath::Batch(n) => self.in_batches(ids, n),
            PutPath::Inflight(n) => self.pipelined(ids, n),
        }
    }

    fn one_at_a_time(&mut self, ids: std::ops::Range<u64>) -> Result<(), String> {
        for (n, id) in ids.enumerate() {
            self.pace.wait(n as u64);
            let message = self.message(id);
            let since = self.timed.then(Instant::now);
            let receipt = self.store.put(message).map_err(|e| e.to_string())?;
            self.acknowledged(id, receipt, since)?;
        }
        Ok(())
    }

    fn in_batches(&mut self, ids: std::ops::Range<u64>, size: usize) -> Result<(), String> {
        let first = ids.start;
        let ids: Vec<u64> = ids.collect();
        for chunk in ids.chunks(size) {
            self.pace.wait(chunk[0] - first);
            let messages: Vec<Message> = chunk.iter().map(|&id| self.message(id)).collect();
            let since = Instant::now();
            let receipts = self.store.put_batch(messages).map_err(|e| e.to_string())?;
            for (&id, receipt) in chunk.iter().zip(receipts) {
                self.acknowledged(id, receipt, Some(since))?;
            }
        }
        Ok(())
    }

    fn pipelined(&mut self, ids: std::ops::Range<u64>, inflight: usize) -> Result<(), String> {
        let mut outstanding: VecDeque<(u64, Instant, PutTicket)> = VecDeque::with_capacity(inflight);
        for (n, id) in ids.enumerate() {
            self.pace.wait(n as u64);
            let message = self.message(id);
            let since = Instant::now();
            outstanding.push_back((id, since, self.store.submit(message).map_err(|e| e.to_string())?));
            // Tickets resolve in log order, so the oldest tells for the rest.
            while let Some((_, _, oldest)) = outstanding.front() {
                let full = outstanding.len() >= inflight;
                if !full && !oldest.is_durable().map_err(|e| e.to_string())? {
                    break;
                }
                let (id, since, ticket) = outstanding.pop_front().expect("front exists");
                let receipt = ticket.wait(TICKET_TIMEOUT).map_err(|e| e.to_string())?;
                self.acknowledged(id, receipt, Some(since))?;
            }
        }
        for (id, since, ticket) in outstanding {
            let receipt = ticket.wait(TICKET_TIMEOUT).map_err(|e| e.to_string())?;
            self.acknowledged(id, receipt, Some(since))?;
        }
        Ok(())
    }
}

/// What the producers did: the latest deliver time, the put latencies
/// (microseconds) of all producers, and the CPU seconds they used.
pub struct Produced {
    pub latest_due: u64,
    pub latency_us: Histogram<u64>,
    pub cpu_secs: f64,
}

/// Puts every message from `producers` threads (`perf-producer-N`).
pub fn put_all(
    store: &Arc<Store>,
    ledger: &Arc<Ledger>,
    workload: Workload,
    args: &PerfArgs,
) -> Result<Produced, Failure> {
    let per_producer = args.messages.div_ceil(args.producers as u64);
    let path = PutPath::of(args);
    let threads: Vec<_> = (0..args.producers as u64)
        .map(|p| {
            let ids = (p * per_producer)..((p + 1) * per_producer).min(args.messages);
            let mut producer = Producer {
                store: Arc::clone(store),
                ledger: Arc::clone(ledger),
                workload,
                rng: fastrand::Rng::with_seed(0x5eed ^ p),
                body_bytes: args.body_bytes,
                cancel_ratio: args.cancel_ratio,
                keys: args.keys,
                dedup_keys: args.dedup_keys,
                queues: args.consumers,
                pace: Pace::new(args.rate, args.producers as u64),
                latest_due: 0,
                timed: args.flush == FlushArg::Sync || !matches!(path, PutPath::One),
                latency_us: latency_histogram(),
            };
            std::thread::Builder::new().name(format!("perf-producer-{p}")).spawn(move || {
                producer.run(ids, path)?;
                let cpu_secs = thread_cpu::this_thread_secs();
                Ok::<_, String>(Produced {
                    latest_due: producer.latest_due,
                    latency_us: producer.latency_us,
                    cpu_secs,
                })
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut all = Produced { latest_due: 0, latency_us: latency_histogram(), cpu_secs: 0.0 };
    for thread in threads {
        let one = thread.join().map_err(|_| "a producer thread panicked")??;
        all.latest_due = all.latest_due.max(one.latest_due);
        all.latency_us.add(one.latency_us).map_err(|e| format!("merging put latencies: {e}"))?;
        all.cpu_secs += one.cpu_secs;
    }
    Ok(all)
}

/// A producer's schedule under `--rate`: put `n` is not made before `n / per_second`.
struct Pace {
    started: Instant,
    per_second: u64,
}

impl Pace {
    fn new(rate: u64, producers: u64) -> Self {
        Self { started: Instant::now(), per_second: rate.div_ceil(producers) }
    }

    fn wait(&self, n: u64) {
        if self.per_second == 0 {
            return;
        }
        let due = Duration::from_secs_f64(n as f64 / self.per_second as f64);
        if let Some(ahead) = due.checked_sub(self.started.elapsed()) {
            std::thread::sleep(ahead);
        }
    }
}
