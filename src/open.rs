//! Opening a store: take the directory's lock, check the scheduler it was
//! written with, recover (`recovery.rs`), build the components, clear the
//! clean flag, and start the background threads in order.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use crossbeam_channel::{Receiver, Sender};

use crate::buckets::{BucketFront, DelayOffsets, Poller, SCHEDULE_TOPIC, ScheduleCommand};
use crate::checkpoint::CheckpointFile;
use crate::commitlog::{CommitLog, LogReader};
use crate::committer::Committer;
use crate::config::{Config, FlushMode, RecoveryMode, Scheduler};
use crate::consume_queue::QueueRegistry;
use crate::dispatcher::{DispatchPlan, Dispatcher};
use crate::durable::FlushSignal;
use crate::durable::{Floor, Pins, SegmentCounts};
use crate::error::{Error, Result};
use crate::flusher::Flusher;
use crate::format::checkpoint::Checkpoint;
use crate::format::layout::Layout;
use crate::key_index::KeyIndexes;
use crate::offsets::{self, OffsetStore};
use crate::prefault::Prefaulter;
use crate::recovery::{Recovered, recover};
use crate::retention::Retainer;
use crate::scheduler::SchedulerFront;
use crate::stall::Stall;
use crate::stats::{RetentionCounters, TimerStats};
use crate::store::{Store, Wakes};
use crate::threads::{Stop, StopFlag, Threads};
use crate::timer::WheelFront;
use crate::timer::levels::DelayLevels;
use crate::timer::log::FaultAhead;
use crate::timer::pins_snapshot::{PinsSnapshotter, SnapshotGate};
use crate::timer::tick::{Ticker, WheelCheckpoint, WheelCommand, WheelShared};
use crate::timer::wheel::restart::Restarted;
use crate::topic_counts::TopicCounts;

/// Commands in flight to the ticking thread (bounded: a dispatcher faster
/// than the wheel waits instead of growing memory). The dispatcher's carry
/// up to [`INSERT_BATCH`](crate::timer::front::INSERT_BATCH) timers each:
/// some 65,536 timers in flight at most, as when each was a command.
const WHEEL_QUEUE: usize = 256;

/// The receiving ends of the channels that wake or command each thread.
struct Inboxes {
    dispatch: Receiver<()>,
    prefault: Receiver<()>,
    flush: Receiver<FlushSignal>,
    commit: Receiver<()>,
    retention: Receiver<()>,
    wheel: Receiver<WheelCommand>,
    timer_log_reclaim: Receiver<()>,
}

/// The running store's moving parts.
struct Started {
    scheduler: Arc<dyn SchedulerFront>,
    retainer: Option<Arc<Retainer>>,
    threads: Threads,
}

/// What the threads of a store are built from, between recovery and start.
struct Parts {
    config: Config,
    layout: Layout,
    log: Arc<CommitLog>,
    queues: Arc<QueueRegistry>,
    keys: Arc<KeyIndexes>,
    topics: Option<Arc<TopicCounts>>,
    offsets: Arc<OffsetStore>,
    shared: Arc<WheelShared>,
    floor: Arc<Floor>,
    /// Shared by the ticking thread and `dw-pins` (see `timer/pins_snapshot.rs`).
    pins_gate: Arc<SnapshotGate>,
    /// Where the dispatcher's replay starts.
    replay_from: u64,
    dispatched: Arc<AtomicU64>,
    wakes: Wakes,
    wheel_commands: Sender<WheelCommand>,
    timer_log_reclaim: Sender<()>,
    counters: Arc<RetentionCounters>,
    /// Threads waiting for disk space (see `stall.rs`).
    stall: Arc<Stall>,
    /// The first second the wheel had not delivered at this open (see `Retainer`).
    open_tick_second: u64,
    opened_at_ms: u64,
}

impl Store {
    /// Opens the store in `config.dir`, creating it if needed and recovering it
    /// if it was not closed cleanly.
    ///
    /// Errors: [`Error::Locked`] if another process (or another `Store` in
    /// this one) still has the directory open after half a second (a child
    /// process forked meanwhile shares the lock until it execs);
    /// [`Error::Invalid`] for a bad
    /// configuration or a directory written with the other scheduler;
    /// [`Error::Corruption`] or [`Error::UnsupportedVersion`] naming the file
    /// and offset of bytes recovery cannot accept; [`Error::Io`] naming the
    /// path of a failed file operation.
    pub fn open(config: Config) -> Result<Self> {
        config.validate()?;
        let levels = DelayLevels::parse(&config.delay_levels)?;
        let layout = Layout::new(config.dir.clone());
        crate::fs::create_store_dir(layout.dir(), config.dir_mode)?;
        let lock = crate::fs::DirLock::acquire(layout.dir(), &layout.lock())?;
        let _span = tracing::info_span!("open", dir = %layout.dir().display()).entered();
        check_scheduler(&layout, config.scheduler)?;
        let mut rebuilt = Vec::new();
        let (mut report, timers, (parts, inboxes, counts, checkpoint)) = loop {
            let Recovered { log, report, checkpoint, timers } = recover(&config, &layout)?;
            match Parts::assemble(config.clone(), layout.clone(), log, &timers, checkpoint) {
                Ok(assembled) => break (report, timers, assembled),
                Err(e) => remove_damaged_index(&config, &layout, e, &mut rebuilt)?,
            }
        };
        report.rebuilt_indexes = rebuilt;
        let replay_from = timers.replay_from;
        let Started { scheduler, retainer, threads } =
            parts.start(timers, counts, checkpoint, inboxes, &levels)?;
        tracing::info!(end = report.end, replay_from, scheduler = ?parts.config.scheduler, "store open");
        let window_ms = u64::try_from(parts.config.dedup_window.as_millis()).unwrap_or(u64::MAX);
        let dedup = crate::dedup::Dedup::new(window_ms, parts.log.write_end());
        Ok(Store {
            config: parts.config,
            levels,
            log: parts.log,
            queues: parts.queues,
            keys: parts.keys,
            dedup,
            topics: parts.topics,
            offsets: parts.offsets,
            wheel: parts.shared,
            accepting: RwLock::new(true),
            wakes: parts.wakes,
            scheduler,
            dispatched: parts.dispatched,
            threads: Some(threads),
            recovery: report,
            retention: parts.counters,
            stall: parts.stall,
            retainer,
            _lock: lock,
        })
    }
}

impl Parts {
    /// Opens the indexes beside the recovered log, records the checkpoints
    /// on disk in the floor, and writes the checkpoint that clears the clean
    /// flag (and records the replay start) before anything is appended.
    fn assemble(
        config: Config,
        layout: Layout,
        log: Arc<CommitLog>,
        timers: &Restarted,
        mut checkpoint: CheckpointFile,
    ) -> Result<(Self, Inboxes, SegmentCounts, CheckpointFile)> {
        let Restarted { wheel, replay_from, delivery_scan_from, fresh, .. } = timers;
        let (replay_from, end) = (*replay_from, log.write_end());
        // Segment counts: rebuilt by the replay; a fresh wheel's replay sees every segment.
        let counts = if *fresh {
            SegmentCounts::rebuilt(config.segment_size, replay_from..end)
        } else {
            SegmentCounts::load(&layout.timer(), config.segment_size, replay_from, end)
        };
        let open_counts = Arc::new(counts.clone());
        let queues =
            Arc::new(QueueRegistry::open(&layout.consume_queues(), config.queue_file_entries, replay_from)?);
        let keys = Arc::new(KeyIndexes::open(&layout, config.key_index_file_entries, &log, replay_from)?);
        let topics = (config.scheduler == Scheduler::Wheel)
            .then(|| Arc::new(TopicCounts::open(&layout.topic_pending(), &log, replay_from)));
        let offsets = Arc::new(offsets::open(&layout.consumer_offsets(), &log)?);
        let now_ms = config.clock.now_ms();
        let wheel_checkpoint = WheelCheckpoint {
            indexed: replay_from,
            tick_second: wheel.tick_second(),
            delivery_scan_from: *delivery_scan_from,
            timer_log_ends: wheel.replay_start_ends(),
            log_end: end,
        };
        let floor = Arc::new(Floor::default());
        let last = checkpoint.last();
        if let Some(last) = last {
            floor.record(&last, end, Arc::clone(&open_counts));
        }
        // A wheel built afresh starts at now, but the timers the replay finds
        // overdue fire from now on: only the last checkpoint's tick (0 without
        // one) vouches for what fired before.
        let open_tick_second =
            if *fresh { last.map_or(0, |last| last.tick_second) } else { wheel_checkpoint.tick_second };
        let written = checkpoint.write(Checkpoint {
            log_durable: log.durable_end(),
            dispatched: replay_from,
            written_at_ms: now_ms,
            tick_second: wheel_checkpoint.tick_second,
            delivery_scan_from: *delivery_scan_from,
            timer_log_end: wheel_checkpoint.timer_log_ends[0],
            far_timer_log_end: wheel_checkpoint.timer_log_ends[1],
            ..Default::default()
        })?;
        let vouched = Checkpoint { tick_second: written.tick_second.min(open_tick_second), ..written };
        floor.record(&vouched, end, Arc::clone(&open_counts));
        let shared = Arc::new(WheelShared::new(wheel_checkpoint, open_counts));
        let (wakes, inboxes, wheel_commands, timer_log_reclaim) = channels();
        let parts = Self {
            config,
            layout,
            log,
            queues,
            keys,
            topics,
            offsets,
            shared,
            floor,
            pins_gate: Arc::default(),
            replay_from,
            dispatched: Arc::new(AtomicU64::new(replay_from)),
            wakes,
            wheel_commands,
            timer_log_reclaim,
            counters: Arc::new(RetentionCounters::default()),
            stall: Arc::new(Stall::default()),
            open_tick_second,
            opened_at_ms: now_ms,
        };
        Ok((parts, inboxes, counts, checkpoint))
    }

    /// Starts the threads: the flusher first (its final cycle syncs what the
    /// committer, stopped just before it, left) and the dispatcher (which feeds
    /// the others) last but retention, so stopping them in reverse stops
    /// every producer of work before what it feeds.
    fn start(
        &self,
        timers: Restarted,
        counts: SegmentCounts,
        checkpoint: CheckpointFile,
        inboxes: Inboxes,
        levels: &DelayLevels,
    ) -> Result<Started> {
        let mut threads = Threads::default();
        let flusher = self.flusher(checkpoint);
        let wake_flusher = self.wakes.flush.clone();
        let stop_flusher = Stop::Call(Box::new(move || drop(wake_flusher.send(FlushSignal::Stop))));
        threads.spawn("flush", stop_flusher, move || flusher.run(inboxes.flush))?;
        let committer = Committer { log: Arc::clone(&self.log), dispatch_wake: self.wakes.dispatch.clone() };
        let stop = StopFlag::new(Some(self.wakes.commit.clone()));
        threads.spawn("commit", Stop::Flag(stop.clone()), move || committer.run(inboxes.commit, stop))?;
        let timer_logs = [(); 2].map(|()| Arc::new(FaultAhead::new(self.wakes.prefault.clone())));
        let prefaulter = Prefaulter {
            log: Arc::clone(&self.log),
            queues: Arc::clone(&self.queues),
            timer_logs: timer_logs.clone(),
        };
        let stop = StopFlag::new(Some(self.wakes.prefault.clone()));
        threads
            .spawn("prefault", Stop::Flag(stop.clone()), move || prefaulter.run(inboxes.prefault, stop))?;
        let pins = timers.wheel.pins();
        let mut ticker = self.ticker(timers, counts, inboxes.timer_log_reclaim);
        ticker.fault_ahead_with(timer_logs);
        let stop = StopFlag::new(None);
        let wheel = inboxes.wheel;
        threads.spawn("tick", Stop::Flag(stop.clone()), move || ticker.run(wheel, stop))?;
        let snapshotter = PinsSnapshotter::new(
            self.layout.timer(),
            Arc::clone(&self.floor),
            Arc::clone(&self.pins_gate),
            self.config.flush_interval,
        );
        let (wake, inbox) = crossbeam_channel::bounded(1);
        let stop = StopFlag::new(Some(wake));
        threads.spawn("pins", Stop::Flag(stop.clone()), move || snapshotter.run(inbox, stop))?;
        let scheduler = self.scheduler_front(levels, &mut threads)?;
        let plan = DispatchPlan {
            from: self.replay_from,
            queues_per_topic: self.config.queues_per_topic,
            durable_only: self.config.flush_mode == FlushMode::Sync,
            replay_end: self.log.write_end(),
        };
        let dispatcher = Dispatcher::new(
            Arc::clone(&self.log),
            (Arc::clone(&self.queues), Arc::clone(&self.keys), self.topics.clone(), Arc::clone(&scheduler)),
            plan,
            Arc::clone(&self.dispatched),
            (Arc::clone(&self.counters.quarantined), Arc::clone(&self.stall)),
        );
        let stop = StopFlag::new(Some(self.wakes.dispatch.clone()));
        let wake = inboxes.dispatch;
        threads.spawn("dispatch", Stop::Flag(stop.clone()), move || dispatcher.run(wake, stop))?;
        let retainer = self.retainer(pins);
        if let Some(retainer) = retainer.clone() {
            let stop = StopFlag::new(Some(self.wakes.retention.clone()));
            let wake = inboxes.retention;
            threads.spawn("retention", Stop::Flag(stop.clone()), move || retainer.run(wake, stop))?;
        }
        Ok(Started { scheduler, retainer, threads })
    }

    fn flusher(&self, checkpoint: CheckpointFile) -> Flusher {
        Flusher {
            log: Arc::clone(&self.log),
            queues: Arc::clone(&self.queues),
            keys: Arc::clone(&self.keys),
            topics: self.topics.clone(),
            offsets: Arc::clone(&self.offsets),
            wheel: Arc::clone(&self.shared),
            checkpoint,
            dispatched: Arc::clone(&self.dispatched),
            clock: Arc::clone(&self.config.clock),
            interval: self.config.flush_interval,
            floor: Arc::clone(&self.floor),
            counts_path: self.layout.segment_counts(),
            counts_written: std::time::Instant::now(),
            vouched_before_last: None,
            dispatch_wake: self.wakes.dispatch.clone(),
        }
    }

    fn ticker(&self, timers: Restarted, counts: SegmentCounts, reclaim_wake: Receiver<()>) -> Ticker {
        let indexed = timers.replay_from;
        let indexed_log_ends = timers.wheel.replay_start_ends();
        Ticker {
            restored_schedules: timers.restored_schedules,
            wheel: timers.wheel,
            log: Arc::clone(&self.log),
            clock: Arc::clone(&self.config.clock),
            shared: Arc::clone(&self.shared),
            dispatch_wake: self.wakes.dispatch.clone(),
            commit_wake: (self.config.flush_mode == FlushMode::Sync).then(|| self.wakes.commit.clone()),
            flush_interval: self.config.flush_interval,
            deliver: self.config.deliver,
            indexed,
            indexed_log_ends,
            deferred: Vec::new(),
            counts,
            keep_ms: self.config.retention.keep_for.map_or(0, |keep| keep.as_millis() as u64),
            floor: Arc::clone(&self.floor),
            replay_end: self.log.write_end(),
            reclaim_wake,
            reader: LogReader::new(Arc::clone(&self.log)),
            quarantined: Arc::clone(&self.counters.quarantined),
            flush: self.wakes.flush.clone(),
            timer_dir: self.layout.timer(),
            timer_log_file_entries: self.config.timer_log_file_entries,
            stall: Arc::clone(&self.stall),
            received: indexed,
            routes: Default::default(),
            recurring: Default::default(),
            armed_ahead: Default::default(),
            checked_at_load: 0,
            fault_ahead: None,
            pins_gate: Arc::clone(&self.pins_gate),
        }
    }

    /// The scheduler's front, starting the bucket poller's thread for the baseline.
    fn scheduler_front(
        &self,
        levels: &DelayLevels,
        threads: &mut Threads,
    ) -> Result<Arc<dyn SchedulerFront>> {
        let wheel =
            WheelFront::new(self.wheel_commands.clone(), Arc::clone(&self.shared), self.config.put_timeout);
        if self.config.scheduler == Scheduler::Wheel {
            return Ok(Arc::new(wheel));
        }
        let (front, poller, commands) = self.buckets(levels, wheel)?;
        let stop = StopFlag::new(None);
        threads.spawn("schedule", Stop::Flag(stop.clone()), move || poller.run(commands, stop))?;
        Ok(Arc::new(front))
    }

    /// The bucket scheduler's front and its poller, with each level's queue
    /// and its restored offset. The wheel, empty, keeps ticking beside it:
    /// the checkpoint's wheel fields come from it, as for a wheel store.
    fn buckets(
        &self,
        levels: &DelayLevels,
        idle_wheel: WheelFront,
    ) -> Result<(BucketFront, Poller, Receiver<ScheduleCommand>)> {
        let offsets = DelayOffsets::open(&self.layout.buckets())?;
        let level_queues = (1..=levels.len() as u16)
            .map(|level| {
                (self.queues.get_or_create(SCHEDULE_TOPIC, u32::from(level) - 1), offsets.get(level))
            })
            .collect();
        let stats = Arc::new(std::sync::Mutex::new(TimerStats::new()));
        let (commands, command_rx) = crossbeam_channel::bounded(64);
        let front = BucketFront {
            levels: levels.clone(),
            queues: Arc::clone(&self.queues),
            log: Arc::clone(&self.log),
            commands,
            stats: Arc::clone(&stats),
            dispatched: Arc::clone(&self.dispatched),
            timeout: self.config.put_timeout,
            idle_wheel,
        };
        let poller = Poller {
            log: Arc::clone(&self.log),
            queues: level_queues,
            offsets,
            clock: Arc::clone(&self.config.clock),
            stats,
            dispatch_wake: self.wakes.dispatch.clone(),
            commit_wake: (self.config.flush_mode == FlushMode::Sync).then(|| self.wakes.commit.clone()),
            dispatched: Arc::clone(&self.dispatched),
            replay_end: self.log.write_end(),
            cancelled: Default::default(),
            persist_interval: self.config.schedule_offsets_interval,
            deliver: self.config.deliver,
        };
        Ok((front, poller, command_rx))
    }

    /// Retention, for the wheel scheduler only (the bucket baseline keeps every segment).
    fn retainer(&self, pins: Arc<Pins>) -> Option<Arc<Retainer>> {
        (self.config.scheduler == Scheduler::Wheel).then(|| {
            self.log.set_size_cap(self.config.retention.max_log_bytes);
            Arc::new(Retainer {
                log: Arc::clone(&self.log),
                queues: Arc::clone(&self.queues),
                keys: Arc::clone(&self.keys),
                topics: self.topics.clone(),
                timer_log_reclaim: self.timer_log_reclaim.clone(),
                clock: Arc::clone(&self.config.clock),
                policy: self.config.retention,
                floor: Arc::clone(&self.floor),
                counters: Arc::clone(&self.counters),
                running: Default::default(),
                opened_at_ms: self.opened_at_ms,
                open_tick_second: self.open_tick_second,
                pins,
            })
        })
    }
}

/// Every channel that wakes or commands a thread: the senders the store
/// keeps, the receivers the threads take.
fn channels() -> (Wakes, Inboxes, Sender<WheelCommand>, Sender<()>) {
    let (dispatch, dispatch_rx) = crossbeam_channel::bounded(1);
    let (prefault, prefault_rx) = crossbeam_channel::bounded(1);
    let (flush, flush_rx) = crossbeam_channel::bounded(1);
    let (commit, commit_rx) = crossbeam_channel::bounded(1);
    let (retention, retention_rx) = crossbeam_channel::bounded(1);
    let (wheel, wheel_rx) = crossbeam_channel::bounded(WHEEL_QUEUE);
    let (reclaim, reclaim_rx) = crossbeam_channel::bounded(1);
    let wakes = Wakes { dispatch, prefault, flush, commit, retention };
    let inboxes = Inboxes {
        dispatch: dispatch_rx,
        prefault: prefault_rx,
        flush: flush_rx,
        commit: commit_rx,
        retention: retention_rx,
        wheel: wheel_rx,
        timer_log_reclaim: reclaim_rx,
    };
    (wakes, inboxes, wheel, reclaim)
}

/// Refuses to open a store with the other scheduler than the one it was
/// written with: the pending timers of one are not in the other's index, so
/// they would silently never fire. A store written by the buckets has a
/// `schedule/` directory; one with log segments and none is the wheel's.
fn check_scheduler(layout: &Layout, scheduler: Scheduler) -> Result<()> {
    let bucket_store = layout.buckets().exists();
    let has_log = std::fs::read_dir(layout.commit_log()).is_ok_and(|mut entries| entries.next().is_some());
    let written_with = match (bucket_store, has_log) {
        (true, _) => Scheduler::Buckets,
        (false, true) => Scheduler::Wheel,
        (false, false) => return Ok(()),
    };
    if written_with != scheduler {
        let why = format!(
            "{} was written with Scheduler::{written_with:?}; open it with that scheduler",
            layout.dir().display()
        );
        return Err(Error::invalid("scheduler", why));
    }
    Ok(())
}

/// An index that does not check out at open (a consume queue, the key
/// index, the wheel's files) is rebuilt from the commit log in lenient mode:
/// the directory or file holding it is removed, with a warning naming it, and
/// the open starts over (without it, every index resumes from the first
/// segment). Only the truth (the log and the relocated copies) can refuse
/// an open; so can an index that is damaged again after its rebuild.
fn remove_damaged_index(
    config: &Config,
    layout: &Layout,
    e: Error,
    rebuilt: &mut Vec<PathBuf>,
) -> Result<()> {
    let Error::Corruption { file, .. } = &e else { return Err(e) };
    let Some(index) = layout.index_holding(file).filter(|i| !rebuilt.contains(i)) else { return Err(e) };
    if config.recovery_mode == RecoveryMode::Strict {
        return Err(e);
    }
    tracing::warn!(index = %index.display(), error = %e,
        "an index does not check out: removing it, to rebuild it from the commit log");
    if index.is_dir() {
        std::fs::remove_dir_all(&index).map_err(|io| Error::io("remove", &index, io))?;
    } else {
        crate::fs::remove_file(&index)?;
    }
    crate::fs::sync_parent_dir(&index)?;
    rebuilt.push(index);
    Ok(())
}
