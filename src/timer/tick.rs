//! The one ticking thread. It owns the wheel: it indexes the timers the
//! dispatcher sends it, feeds the wheel the clock's time (`Wheel::tick` is a
//! pure step), appends a delivery record for every timer that comes due, and
//! periodically syncs the wheel and publishes what a checkpoint may vouch for.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::clock::Clock;
use crate::commitlog::{CommitLog, LogReader};
use crate::durable::{Floor, FlushSignal, SegmentCounts};
use crate::error::{Error, Result};
use crate::format::checkpoint::Checkpoint;
use crate::format::queue_entry::tag_hash;
use crate::format::record::{
    MessageView, OccurrencesView, RecordKind, RescheduleView, encode_deliveries, encode_delivery,
};
use crate::message::{CancelOutcome, PauseOutcome, ReplaceAnswer, Replacement, RescheduleOutcome};
use crate::receipt::UpdateOutcome;
use crate::schedule::ScheduleUpdate;
use crate::stall::{RETRY, Stall};
use crate::stats::{HORIZONS_MS, TimerStats};
use crate::sync::Locked;
use crate::threads::StopFlag;
use crate::timer::armed_ahead::ArmedAhead;
use crate::timer::log::FaultAhead;
use crate::timer::pins_snapshot::SnapshotGate;
use crate::timer::recurring::Recurring;
use crate::timer::routes::{AHEAD_SECONDS, Planned, Routes, Vouched};
use crate::timer::wheel::restart::{RestartPlan, restart_wheel};
use crate::timer::wheel::window::{PendingEntry, TimerFate};
use crate::timer::wheel::{FilesToSync, Wheel};
use crate::timer::{NewTimer, NewTimers, Timer};

mod control;
mod occurrences;

/// The longest the thread sleeps without looking at the clock again, so a
/// clock that jumps (or a manual clock moved by a test) is noticed quickly.
const MAX_SLEEP: Duration = Duration::from_millis(20);
/// How often the gauges are refreshed (one pass over the slot counts).
const STATS_INTERVAL: Duration = Duration::from_secs(1);
/// How many times the wheel is rebuilt from the log before a damaged wheel
/// poisons the store instead (the log itself is then likely failing).
const MAX_REBUILDS: u32 = 3;
/// How often the timer log is checked for files no chain reads any more.
const RECLAIM_INTERVAL: Duration = Duration::from_secs(10);
/// Timers whose records are appended under one lock of the log's tail: few
/// enough (3 KiB as one deliveries record, 7 KiB as delivery records) that
/// a segment's padding wastes little and the dispatcher can start early,
/// many enough that the lock, the publish and a record's frame cost nothing
/// per timer.
const DELIVERY_CHUNK: usize = 256;
/// Commands handled between two looks at the clock, each timer of an
/// [`WheelCommand::Insert`] counted as one.
const COMMAND_BATCH: usize = 4096;

/// What the dispatcher tells the wheel, in commit-log order.
#[derive(Debug)]
pub(crate) enum WheelCommand {
    /// Index these timers (of timed messages and reschedule records), in
    /// commit-log order: up to [`INSERT_BATCH`](crate::timer::front::INSERT_BATCH)
    /// in one command, so a timer costs the channel a fraction of a send.
    Insert(NewTimers),
    /// Every timed record below this commit-log offset has been sent.
    Progress(u64),
    /// Cancel or reschedule the timer a handle names and answer what became of it.
    Control(Timer, Control),
    /// Refresh the gauges and answer: every command sent before this one is handled.
    Refresh(Sender<()>),
    /// Answer the first `limit` pending timers due in `window_ms` (see `wheel/window.rs`).
    Pending { window_ms: std::ops::Range<u64>, limit: usize, reply: Sender<Result<Vec<PendingEntry>>> },
    /// Answer which of these timers of messages are pending (see `wheel/window.rs`).
    PendingOf { timers: Vec<Timer>, reply: Sender<Result<Vec<Option<PendingEntry>>>> },
    /// Answer what became of this timer of a message (see `wheel/window.rs`).
    FateOf { timer: Timer, reply: Sender<Result<TimerFate>> },
    /// Answer the pending timers counted by due time between ascending bounds (see `wheel/gauges.rs`).
    PendingCounts { bounds_ms: Vec<u64>, reply: Sender<Result<Vec<u64>>> },
}

impl WheelCommand {
    /// What it counts for in [`COMMAND_BATCH`]: its timers, or one.
    fn weight(&self) -> usize {
        match self {
            Self::Insert(timers) => timers.len().max(1),
            _ => 1,
        }
    }
}

/// What a handle asks of its timer.
#[derive(Debug)]
pub(crate) enum Control {
    Cancel(Sender<Result<CancelOutcome>>),
    /// Move it to this deliver time.
    Reschedule(u64, Sender<Result<RescheduleOutcome>>),
    /// Pause (`true`) or resume the recurring schedule it is the timer of.
    Pause(bool, Sender<Result<PauseOutcome>>),
    /// Replace the recurring schedule it is the timer of by a new one.
    Update(Box<ScheduleUpdate>, Sender<Result<UpdateOutcome>>),
    /// Replace it, if pending, by this message: `None` if it was not pending.
    Replace(Box<Replacement>, Sender<Result<ReplaceAnswer>>),
}

impl Control {
    /// Answers `e`: the wheel could not tell where the timer is.
    fn fail(self, e: Error) {
        match self {
            Control::Cancel(reply) => drop(reply.send(Err(e))),
            Control::Reschedule(_, reply) => drop(reply.send(Err(e))),
            Control::Pause(_, reply) => drop(reply.send(Err(e))),
            Control::Update(_, reply) => drop(reply.send(Err(e))),
            Control::Replace(_, reply) => drop(reply.send(Err(e))),
        }
    }
}

/// What a checkpoint may vouch for on the wheel's behalf, as of its last sync.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WheelCheckpoint {
    /// Timers of every record below this commit-log offset are in the synced wheel.
    pub indexed: u64,
    /// Every timer due before this second has been delivered.
    pub tick_second: u64,
    /// Delivery records of timers due at or after `tick_second` lie at or after this offset.
    pub delivery_scan_from: u64,
    /// The near and far timer logs' ends when the wheel received the
    /// progress `indexed`: later entries hold timers the replay sends again.
    pub timer_log_ends: [u64; 2],
    /// The commit log's end at the snapshot: the delivery records of every
    /// timer due before `tick_second` lie below it (not persisted).
    pub log_end: u64,
}

/// A snapshot of the wheel the flusher makes durable: what a checkpoint may
/// vouch for, the files to sync first, and the per-segment pending counts.
pub(crate) struct WheelSnapshot {
    pub checkpoint: WheelCheckpoint,
    pub files: FilesToSync,
    pub counts: Arc<SegmentCounts>,
}

/// State shared between the ticking thread and the rest of the store.
pub(crate) struct WheelShared {
    /// The ticker's latest snapshot (the flusher syncs its files, off the ticker's path).
    pub to_sync: Mutex<Option<WheelSnapshot>>,
    /// The latest snapshot whose files have been synced, and its counts.
    pub synced: Mutex<(WheelCheckpoint, Arc<SegmentCounts>)>,
    pub stats: Arc<Mutex<TimerStats>>,
    /// Commands the ticking thread has handled (the front counts those sent).
    pub handled: AtomicU64,
    /// The latest progress handled: the wheel holds the timer of every
    /// timed record below it.
    pub progress: AtomicU64,
}

impl WheelShared {
    pub fn new(checkpoint: WheelCheckpoint, counts: Arc<SegmentCounts>) -> Self {
        Self {
            to_sync: Mutex::new(None),
            synced: Mutex::new((checkpoint, counts)),
            stats: Arc::new(Mutex::new(TimerStats::new())),
            handled: AtomicU64::new(0),
            progress: AtomicU64::new(checkpoint.indexed),
        }
    }
}

pub(crate) struct Ticker {
    pub wheel: Wheel,
    pub log: Arc<CommitLog>,
    pub clock: Arc<dyn Clock>,
    pub shared: Arc<WheelShared>,
    /// Woken after delivery records are appended.
    pub dispatch_wake: Sender<()>,
    /// Sync flush mode: the flusher, woken after deliveries and cancels are
    /// appended (the dispatcher indexes only what is durable).
    pub commit_wake: Option<Sender<()>>,
    pub flush_interval: Duration,
    /// `false`: index only, deliver nothing (`delaywheel recover`).
    pub deliver: bool,
    /// The latest `Progress` received.
    pub indexed: u64,
    /// The timer logs' ends when it was received.
    pub indexed_log_ends: [u64; 2],
    /// Cancels and reschedules of timers the dispatcher has not sent yet.
    pub deferred: Vec<(Timer, Control)>,
    /// Pending timers per commit-log segment, for retention.
    pub counts: SegmentCounts,
    /// Retention's keep time: a timer due within it of being indexed is "near".
    pub keep_ms: u64,
    /// The checkpoints on disk: the timer log is reclaimed up to what a
    /// restart from the older of the last two would read.
    pub floor: Arc<Floor>,
    /// The commit-log end at open: nothing is delivered until the replay of
    /// the records before it has reached the wheel, so a timer indexed twice
    /// (once before a crash, once by the replay) has both copies in place
    /// before either comes up, and the second copy is dropped.
    pub replay_end: u64,
    /// A token after each retention pass: look for timer-log files to delete now.
    pub reclaim_wake: Receiver<()>,
    /// Reads the messages of due timers, to check them before they are delivered.
    pub reader: LogReader,
    /// The flusher: woken in sync mode after deliveries and cancels, and asked
    /// for the rebuild checkpoint.
    pub flush: Sender<FlushSignal>,
    /// `timer/`, and the timer logs' entries per file: for a rebuild.
    pub timer_dir: PathBuf,
    pub timer_log_file_entries: u64,
    /// Timers not delivered because their message is damaged (shared with `Stats`).
    pub quarantined: Arc<AtomicU64>,
    /// Where the thread says it waits for disk space.
    pub stall: Arc<Stall>,
    /// Closed to the pins snapshot's last round when the wheel is rebuilt (its ledger is replaced).
    pub pins_gate: Arc<SnapshotGate>,
    /// Just past the newest timer's message received from the dispatcher: a
    /// rebuild indexes the log up to here.
    pub received: u64,
    /// Where each checked loaded timer goes: its topic, queue and tags.
    pub routes: Routes,
    /// Which loaded timers are recurring schedules'.
    pub recurring: Recurring,
    /// Schedules' timers a restart restored from the relocation area, to
    /// learn once the thread runs (see [`Ticker::learn_late`]).
    pub restored_schedules: Vec<Timer>,
    /// Timers it armed by its own records that the dispatcher has not sent back yet.
    pub armed_ahead: ArmedAhead,
    /// Timers whose records the check at loading read (see [`LoadCheck::retain_checked`]).
    pub checked_at_load: u64,
    /// Who faults in the timer logs' pages ahead of the appends (`dw-prefault`).
    pub fault_ahead: Option<[Arc<FaultAhead>; 2]>,
}

impl Ticker {
    /// Has `ahead` fault in the timer logs' pages ahead of the appends.
    pub fn fault_ahead_with(&mut self, ahead: [Arc<FaultAhead>; 2]) {
        self.wheel.fault_ahead_with(&ahead);
        self.fault_ahead = Some(ahead);
    }

    /// The thread's body: runs until `stop` is set and the command channel is
    /// drained (or disconnected), then syncs the wheel one last time.
    /// Damaged wheel files (a corruption met loading, cascading or
    /// indexing) are rebuilt from the commit log, and the thread goes on; so
    /// is the wheel once there is room again after a full disk stopped it
    /// mid-step (see `stall.rs`). Any other failure poisons the log: nothing
    /// fires until the store is reopened.
    pub fn run(mut self, commands: Receiver<WheelCommand>, stop: StopFlag) -> Result<()> {
        let mut rebuilds = 0;
        loop {
            let failed = match self.run_inner(&commands, &stop) {
                Ok(()) => return Ok(()),
                Err(e) if self.stall.hold("tick", &e) => match self.rebuild_when_there_is_room(&stop) {
                    Ok(true) => continue,
                    Ok(false) => return Ok(()),
                    Err(e) => e,
                },
                Err(e @ Error::Corruption { .. }) if rebuilds < MAX_REBUILDS => {
                    tracing::error!(error = %e, "the wheel's files are damaged: rebuilding the wheel from the commit log");
                    rebuilds += 1;
                    match self.rebuild() {
                        Ok(()) => continue,
                        Err(e) => e,
                    }
                }
                Err(e) => e,
            };
            tracing::error!(error = %failed, "the ticking thread stopped");
            self.log.poison(&format!("timing wheel: {failed}"));
            return Ok(());
        }
    }

    /// Retries the rebuild every [`RETRY`] until it finds room; `false` if the
    /// store closes first (its next open replays what the wheel lacks).
    fn rebuild_when_there_is_room(&mut self, stop: &StopFlag) -> Result<bool> {
        loop {
            if stop.is_set() {
                return Ok(false);
            }
            std::thread::sleep(RETRY);
            match self.rebuild() {
                Ok(()) => {
                    self.stall.release("tick");
                    return Ok(true);
                }
                Err(e) if self.stall.hold("tick", &e) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Replaces the wheel with one rebuilt from the commit log: the flusher
    /// first puts on disk a checkpoint from which any restart is right
    /// whatever the rebuild leaves (see `Flusher::rebuild_checkpoint`); then
    /// the wheel is built afresh (settled timers from the log's delivery and
    /// cancel records, relocated timers restored) and every timed message
    /// the dispatcher has already handed over is indexed into it again.
    fn rebuild(&mut self) -> Result<()> {
        // The pins snapshot folds the ledger being replaced: it goes first
        // (a restart from the rebuild checkpoint must not find it), and no
        // round of `dw-pins` publishes or begins until the new ledger is in place.
        let gate = Arc::clone(&self.pins_gate);
        let _replacing = gate.replacing();
        crate::fs::remove_all(&self.timer_dir.join(crate::format::layout::PINS_FILE))?;
        crate::fs::sync_dir(&self.timer_dir)?;
        let tick_second = self.wheel.tick_second().min(self.floor.get().map_or(u64::MAX, |m| m.tick_second));
        // Every timer received so far, also those after the last progress
        // (and the one being inserted when the old wheel failed).
        let (start, through) = (self.log.start(), self.indexed.max(self.received));
        let counts = SegmentCounts::rebuilt(self.log.segment_size(), start..through);
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.flush
            .send(FlushSignal::Rebuild { tick_second, counts: counts.clone(), reply })
            .map_err(|_| Error::Closed)?;
        answer.recv().map_err(|_| Error::Closed)??;
        let restarted = restart_wheel(RestartPlan {
            log: &self.log,
            dir: &self.timer_dir,
            entries_per_log_file: self.timer_log_file_entries,
            now_ms: self.clock.now_ms(),
            resume_at: None,
            last: Some(Checkpoint { tick_second, ..Default::default() }),
            replay_from: start,
        })?;
        let pins = self.wheel.pins();
        self.wheel = restarted.wheel;
        if let Some(ahead) = &self.fault_ahead {
            self.wheel.fault_ahead_with(ahead);
        }
        self.routes = Routes::default();
        self.recurring.clear();
        self.restored_schedules = restarted.restored_schedules;
        self.learn_restored_schedules();
        // Retention reads these: the new ledger keeps them (read from it again).
        self.wheel.load_pins(Some(pins))?;
        self.wheel.lower_durable_tick(tick_second);
        self.counts = counts;
        self.index_timers(start, through)?;
        self.armed_ahead.handed_back_below(through);
        self.indexed_log_ends = self.wheel.timer_log_ends();
        self.shared.stats.locked().rebuilds += 1;
        tracing::info!(timers = self.wheel.pending(), "the wheel is rebuilt");
        Ok(())
    }

    /// Indexes the timers of the timed messages and reschedule records of
    /// `[from, to)` (what the dispatcher already handed over). A record that
    /// does not check out is left to the dispatcher's and the ticker's
    /// checks, which skip it.
    fn index_timers(&mut self, from: u64, to: u64) -> Result<()> {
        let mut at = from;
        let mut timers = Vec::new();
        while at < to {
            let (_, next) = self.log.visit_trusted(at, |offset, kind, bytes| {
                let mut found = |deliver_at_ms, message_offset, recurring| {
                    timers.push((Timer { deliver_at_ms, message_offset }, recurring));
                };
                match kind {
                    RecordKind::Message => {
                        if let Some((due, schedule)) = MessageView::parse(bytes)
                            .ok()
                            .and_then(|v| v.timer_deliver_at_ms().map(|due| (due, v.schedule)))
                        {
                            found(due, offset, schedule);
                        }
                    }
                    RecordKind::Reschedule => {
                        if let Ok(r) = RescheduleView::parse(bytes) {
                            found(r.deliver_at_ms, offset, r.occurrence.is_some());
                        }
                    }
                    // Each entry arms its schedule's next occurrence, named by
                    // the entry. `to` may fall inside the record (its timers
                    // are sent in batches): the dispatcher sends the rest.
                    RecordKind::Occurrences => {
                        let view = OccurrencesView::parse(bytes, offset);
                        for (name, r) in
                            view.iter().flat_map(|v| v.entries()).take_while(|&(name, _)| name < to)
                        {
                            found(r.deliver_at_ms, name, true);
                        }
                    }
                    _ => {}
                }
            })?;
            let now_ms = self.clock.now_ms();
            for (timer, recurring) in timers.drain(..) {
                match recurring {
                    true => self.insert_recurring(timer, now_ms)?,
                    false => drop(self.insert(timer, now_ms)?),
                }
            }
            at = next;
        }
        Ok(())
    }

    fn run_inner(&mut self, commands: &Receiver<WheelCommand>, stop: &StopFlag) -> Result<()> {
        let mut last_sync = Instant::now();
        let mut last_stats = Instant::now();
        let mut last_reclaim = Instant::now();
        // Retention deletes nothing until the pins are read (see `durable/pins.rs`).
        self.wheel.load_pins(None)?;
        self.learn_restored_schedules();
        // The checkpoints on disk at open: the wheel reuses no slot a restart from them would reload.
        if let Some(mark) = self.floor.get() {
            self.wheel.lower_durable_tick(mark.tick_second);
        }
        self.publish_stats(false)?;
        loop {
            let mut handled = 0;
            while handled < COMMAND_BATCH {
                let Ok(command) = commands.try_recv() else { break };
                handled += command.weight();
                self.handle_counted(command)?;
            }
            if stop.is_set() && commands.is_empty() {
                return self.sync();
            }
            let now_ms = self.clock.now_ms();
            self.deliver_or_load(now_ms)?;
            // Sync only with nothing due: every timer indexed so far is then
            // either delivered or in a slot the next open reloads.
            let nothing_due = self.wheel.next_due_ms().is_none_or(|due| due > now_ms);
            if last_sync.elapsed() >= self.flush_interval && nothing_due {
                self.sync()?;
                last_sync = Instant::now();
            }
            if last_stats.elapsed() >= STATS_INTERVAL {
                self.publish_stats(false)?;
                last_stats = Instant::now();
            }
            if last_reclaim.elapsed() >= RECLAIM_INTERVAL || self.reclaim_wake.try_recv().is_ok() {
                self.reclaim_timer_log()?;
                last_reclaim = Instant::now();
            }
            match commands.recv_timeout(self.sleep_for(now_ms)) {
                Ok(command) => self.handle_counted(command)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return self.sync(),
            }
        }
    }

    /// Indexes the timers the dispatcher sent, in log order. Every one
    /// counts as received first: if the wheel fails part way, its rebuild
    /// indexes the rest from the log.
    fn insert_all(&mut self, batch: NewTimers) -> Result<()> {
        let NewTimers { timers, queues } = batch;
        debug_assert!(timers.is_sorted_by_key(|t| t.timer.message_offset), "sent in log order");
        let Some(last) = timers.last() else { return Ok(()) };
        self.received = self.received.max(last.timer.message_offset + 1);
        self.armed_ahead.handed_back_below(self.received);
        // One clock reading for the batch: it only says which timers are
        // overdue (and so fire at once), sent as they were indexed.
        let now_ms = self.clock.now_ms();
        for NewTimer { timer, recurring, route } in timers {
            if recurring {
                self.insert_recurring(timer, now_ms)?;
                continue;
            }
            let inserted = self.insert(timer, now_ms)?;
            if let Some(route) = route.filter(|_| inserted) {
                let (topic, queue_id) = &queues[usize::from(route.queue)];
                self.learn_ahead(timer, (topic, *queue_id, route.tag_hash));
            }
        }
        Ok(())
    }

    /// Keeps the route the dispatcher read for a timer just indexed into a
    /// second not yet read in, and due soon: the route vouches for the
    /// timer as that second loads, so its record is not read again then.
    fn learn_ahead(&mut self, timer: Timer, route: (&str, u32, u32)) {
        // Without delivery nothing takes the routes: none is kept.
        if !self.deliver {
            return;
        }
        let second = timer.deliver_at_ms / 1000;
        let soon = second <= self.wheel.newest_loaded_second() + AHEAD_SECONDS;
        if soon && self.wheel.not_yet_read(second) {
            self.routes.learn_ahead(second, timer, route);
        }
    }

    /// Indexes a timer, and counts it in its segment.
    fn insert(&mut self, timer: Timer, now_ms: u64) -> Result<bool> {
        let inserted = self.wheel.insert(timer)?;
        if inserted {
            // A timer already overdue fires now, not at its deliver
            // time: consumers get the retention time from now. Indexed
            // no earlier than it was stored, so "near" may include a
            // few far ones, which only keeps a segment longer.
            let fires_at = timer.deliver_at_ms.max(now_ms);
            let near = fires_at < now_ms.saturating_add(self.keep_ms);
            self.counts.indexed(timer.message_offset, fires_at, near);
        }
        Ok(inserted)
    }

    /// Indexes a recurring schedule's timer. One due in a second already
    /// loaded is not checked as its second loads: it is learnt now.
    fn insert_recurring(&mut self, timer: Timer, now_ms: u64) -> Result<()> {
        if self.insert(timer, now_ms)? && self.wheel.is_loaded(&timer) {
            self.learn_late(timer);
        }
        Ok(())
    }

    /// Learns the schedules' timers a restart restored into seconds already loaded.
    fn learn_restored_schedules(&mut self) {
        for timer in std::mem::take(&mut self.restored_schedules) {
            if self.wheel.is_loaded(&timer) {
                self.learn_late(timer);
            }
        }
    }

    /// Reads the records of a schedule's timer indexed into a second
    /// already loaded (held in the newest loaded second), so that it arms
    /// the next occurrence when it fires. One that does not check out is
    /// logged and counted, as the check at loading does: it then fires as a
    /// timed message's, once, or not at all if the ticker's own check
    /// refuses it.
    fn learn_late(&mut self, timer: Timer) {
        let (recurring, held_in) = (&mut self.recurring, self.wheel.newest_loaded_second());
        let learn = |view: &MessageView<'_>, _: u64, _: u64| {
            if view.schedule {
                recurring.learn(held_in, timer);
            }
        };
        let checked = check_timer_record(&mut self.reader, timer, learn);
        self.reader.release();
        let why = match checked {
            Ok(true) => return,
            Ok(false) => "does not name a schedule's records".to_string(),
            Err(e) => e.to_string(),
        };
        tracing::error!(message = timer.message_offset, why, "a schedule's timer does not check out");
        self.quarantined.fetch_add(1, Ordering::Relaxed);
    }

    /// Handles a command, then counts it handled (see `WheelFront::held_below`).
    fn handle_counted(&mut self, command: WheelCommand) -> Result<()> {
        let handled = self.handle(command);
        self.shared.handled.fetch_add(1, Ordering::Release);
        handled
    }

    fn handle(&mut self, command: WheelCommand) -> Result<()> {
        match command {
            WheelCommand::Insert(timers) => self.insert_all(timers),
            WheelCommand::Progress(offset) => {
                self.indexed = offset;
                self.armed_ahead.handed_back_below(offset);
                self.shared.progress.store(offset, Ordering::Release);
                // Until the replay is done, the ends stay where it began: the
                // entries past them are what a restart must not index twice
                // (see `Wheel::note_preindexed`), and the replay skips some of them.
                if offset >= self.replay_end {
                    self.indexed_log_ends = self.wheel.timer_log_ends();
                }
                // Each is tried again (its timer may have been rescheduled
                // meanwhile, to a record the dispatcher has not sent yet).
                std::mem::take(&mut self.deferred)
                    .into_iter()
                    .try_for_each(|(timer, control)| self.control(timer, control))
            }
            WheelCommand::Control(timer, control) => self.control(timer, control),
            WheelCommand::Refresh(reply) => {
                self.deliver_or_load(self.clock.now_ms())?;
                // Without delivery nothing moves, and an operator asked:
                // count exactly (see `wheel/census.rs`).
                self.publish_stats(!self.deliver)?;
                let _ = reply.send(());
                Ok(())
            }
            WheelCommand::Pending { window_ms, limit, reply } => {
                // A failed read is this caller's answer; the wheel goes on.
                let armed_ahead = self.armed_ahead.due_in(&window_ms);
                let _ = reply.send(self.wheel.pending_between(window_ms.clone(), limit, armed_ahead));
                Ok(())
            }
            WheelCommand::PendingOf { timers, reply } => {
                let _ = reply.send(self.wheel.pending_of(&timers));
                Ok(())
            }
            WheelCommand::FateOf { timer, reply } => {
                let _ = reply.send(self.wheel.fate_of(timer));
                Ok(())
            }
            WheelCommand::PendingCounts { bounds_ms, reply } => {
                let counts = self.wheel.pending_by_due_time(&bounds_ms).map(|mut counts| {
                    let armed_ahead = self.armed_ahead.due_in(&(0..u64::MAX));
                    self.wheel.count_not_yet_held(armed_ahead, &bounds_ms, &mut counts);
                    counts
                });
                let _ = reply.send(counts);
                Ok(())
            }
        }
    }

    /// How long to sleep: until the next timer is due or the next second
    /// must be prefetched, never longer than [`MAX_SLEEP`]. Not at all while a
    /// prefetch is under way: a second of a million timers takes dozens of
    /// budgets to read and sort, and must be done before the second begins.
    fn sleep_for(&self, now_ms: u64) -> Duration {
        if self.wheel.prefetching() {
            return Duration::ZERO;
        }
        let next_second = (now_ms / 1000 + 1) * 1000;
        // Without delivery, a due timer waits for nothing: the next second's loading.
        let due = self.wheel.next_due_ms().filter(|_| self.deliver);
        let next = due.map_or(next_second, |due| due.min(next_second));
        // Something already due: no sleep.
        Duration::from_millis(next.saturating_sub(now_ms)).min(MAX_SLEEP)
    }

    /// Once the replay is done: delivers what is due, or, in a store opened
    /// without delivery, loads it (so the counts leave out what fired).
    fn deliver_or_load(&mut self, now_ms: u64) -> Result<()> {
        if self.indexed < self.replay_end {
            return Ok(());
        }
        match self.deliver {
            true => self.deliver_due(now_ms),
            false => self.wheel.load_without_delivering(now_ms, self.log.write_end()),
        }
    }

    /// Delivers every timer due at `now_ms`, [`DELIVERY_CHUNK`] at a time
    /// under one lock (the dispatcher starts on a chunk while the next is
    /// written): one deliveries record per queue for the timers whose route
    /// is known (see `routes.rs`), a delivery record for each other one.
    /// Each second's timers are checked against their records as it is
    /// loaded (see [`LoadCheck::retain_checked`]), before they are due, so a hot
    /// second's delivery does not wait on a million random reads.
    fn deliver_due(&mut self, now_ms: u64) -> Result<()> {
        let due = {
            let _span = tracing::trace_span!("tick", now_ms).entered();
            let mark = self.log.write_end();
            let mut load = LoadCheck {
                reader: &mut self.reader,
                quarantined: &self.quarantined,
                counts: &mut self.counts,
                routes: &mut self.routes,
                recurring: &mut self.recurring,
                checked_at_load: &mut self.checked_at_load,
            };
            let mut check = |second: u64, timers: &mut Vec<Timer>| load.retain_checked(second, timers);
            let due = self.wheel.tick_checked(now_ms, mark, &mut check)?;
            // Seconds read in whole: their routes learnt ahead have vouched.
            self.routes.forget_ahead_through(self.wheel.newest_loaded_second());
            due
        };
        let due = self.fire_occurrences(due, now_ms)?;
        if !due.is_empty() {
            let _span = tracing::debug_span!("deliver", timers = due.len(), now_ms).entered();
            let mut stats = self.shared.stats.locked();
            let batches = self.log.holds_deliveries();
            for chunk in due.chunks(DELIVERY_CHUNK) {
                let planned = self.routes.plan(chunk, batches);
                let lens: Vec<usize> = planned.iter().map(Planned::len).collect();
                self.log.append_batch_reserved(&lens, |i, buf, offset| match &planned[i] {
                    Planned::Run { topic, queue_id, timers } => {
                        encode_deliveries(buf, offset, now_ms, topic, *queue_id, timers)
                    }
                    Planned::One(timer) => encode_delivery(buf, offset, now_ms, *timer),
                })?;
                // In firing order, so the timers of one millisecond are one run: one count each.
                for due in chunk.chunk_by(|a, b| a.deliver_at_ms == b.deliver_at_ms) {
                    let deliver_at_ms = due[0].deliver_at_ms;
                    debug_assert!(deliver_at_ms <= now_ms, "a timer fired before its time");
                    stats.record_lateness(now_ms, now_ms - deliver_at_ms, due.len() as u64);
                }
                self.counts.settled_all(chunk.iter().map(|t| t.message_offset));
                stats.delivered += chunk.len() as u64;
                self.wake_indexers();
            }
        }
        self.routes.forget_before(self.wheel.tick_second());
        self.recurring.forget_before(self.wheel.tick_second());
        Ok(())
    }

    /// Records were appended: the dispatcher indexes them (in sync mode once
    /// the flusher has made them durable).
    fn wake_indexers(&self) {
        if let Some(commit) = &self.commit_wake {
            let _ = commit.try_send(());
        }
        let _ = self.dispatch_wake.try_send(());
    }

    /// Hands the flusher a snapshot of what the wheel vouches for, with the
    /// files it must sync first. The ticker itself never waits for the disk.
    fn sync(&mut self) -> Result<()> {
        let snapshot = WheelCheckpoint {
            indexed: self.indexed,
            tick_second: self.wheel.tick_second(),
            delivery_scan_from: self.wheel.resume_mark(),
            timer_log_ends: self.indexed_log_ends,
            log_end: self.log.write_end(),
        };
        let files = self.wheel.files_to_sync();
        if let Some(mark) = self.floor.get() {
            self.wheel.set_durable_tick(mark.tick_second);
        }
        self.counts.forget_below(self.log.start());
        let counts = Arc::new(self.counts.clone());
        *self.shared.to_sync.locked() = Some(WheelSnapshot { checkpoint: snapshot, files, counts });
        Ok(())
    }

    /// Deletes the timer-log files that no chain a restart would read reaches,
    /// and the cancel-ledger files no handle needs.
    fn reclaim_timer_log(&mut self) -> Result<()> {
        if let Some(mark) = self.floor.get() {
            let _span = tracing::debug_span!("reclaim_timer_log", tick_second = mark.tick_second).entered();
            self.wheel.reclaim_timer_logs(mark.tick_second)?;
        }
        self.reclaim_ledger()
    }

    /// Deletes the cancel-ledger files no handle can ask about: their messages'
    /// segments are gone, and no relocated copy of their timers can exist.
    fn reclaim_ledger(&mut self) -> Result<()> {
        let windows = self.log.relocated().windows()?;
        let relocated_from_ms = windows.first().map_or(u64::MAX, |&(second, _)| second.saturating_mul(1000));
        self.wheel.reclaim_ledger(self.log.start(), relocated_from_ms).map(drop)
    }

    /// Publishes the wheel's gauges: from the slot counts, or `exactly` by
    /// reading every live chain (see `wheel/census.rs`).
    fn publish_stats(&mut self, exactly: bool) -> Result<()> {
        let now_ms = self.clock.now_ms();
        // On whole seconds, where the slot counts are exact.
        let bounds =
            HORIZONS_MS.map(|ahead| now_ms.saturating_add(ahead).div_ceil(1000).saturating_mul(1000));
        let (mut pending, per_level, mut by_due_time) = if exactly {
            let census = self.wheel.census(&bounds)?;
            (census.pending, census.per_level, census.by_due_time)
        } else {
            (self.wheel.pending(), self.wheel.pending_per_level(), self.wheel.pending_by_due_time(&bounds)?)
        };
        // A schedule whose occurrence fired just now is pending through its next timer,
        // which the wheel does not hold yet.
        pending += self.armed_ahead.len() as u64;
        self.wheel.count_not_yet_held(self.armed_ahead.due_in(&(0..u64::MAX)), &bounds, &mut by_due_time);
        let mut horizon = [0u64; 6];
        horizon.copy_from_slice(&by_due_time);
        let mut stats = self.shared.stats.locked();
        stats.pending = pending;
        stats.pending_per_level = per_level;
        stats.pending_by_horizon = horizon;
        stats.reindexed = self.wheel.reindexed();
        stats.disk_bytes = self.wheel.disk_bytes();
        stats.timer_log_entries = self.wheel.timer_log_entries();
        stats.refreshes += 1;
        stats.checked_at_load = self.checked_at_load;
        Ok(())
    }
}

/// Whether the record of `timer` is a timed message due then, or a
/// reschedule record to then of a timed message, checksums checked. If it
/// is, `learn` is told of the message (its view and offset) and how many
/// occurrences the timer's record says were delivered (a schedule's; 0 else).
pub(super) fn check_timer_record(
    reader: &mut LogReader,
    timer: Timer,
    mut learn: impl FnMut(&MessageView<'_>, u64, u64),
) -> Result<bool> {
    let mut timed_message = |view: &MessageView<'_>, at: u64, due: Option<u64>, fired: u64| {
        let timed = view.timer_deliver_at_ms().is_some_and(|at| due.is_none_or(|due| due == at));
        if timed {
            learn(view, at, fired);
        }
        timed
    };
    let (named, _) = reader.visit_checked(timer.message_offset, |at, kind, bytes| {
        if at != timer.message_offset {
            return None;
        }
        match kind {
            RecordKind::Message => MessageView::parse(bytes)
                .is_ok_and(|v| timed_message(&v, at, Some(timer.deliver_at_ms), 0))
                .then_some(None),
            RecordKind::Reschedule => RescheduleView::parse(bytes)
                .ok()
                .filter(|r| r.deliver_at_ms == timer.deliver_at_ms)
                .map(|r| Some((r.message_offset, r.occurrence.map_or(0, |o| o.fired)))),
            _ => None,
        }
    })?;
    match named {
        None => Ok(false),
        Some(None) => Ok(true),
        Some(Some((message, fired))) => {
            let (timed, _) = reader.visit_checked(message, |at, kind, bytes| {
                at == message
                    && kind == RecordKind::Message
                    && MessageView::parse(bytes).is_ok_and(|v| timed_message(&v, at, None, fired))
            })?;
            Ok(timed)
        }
    }
}

/// What checking a second's timers as it loads uses and learns.
struct LoadCheck<'a> {
    reader: &'a mut LogReader,
    quarantined: &'a AtomicU64,
    counts: &'a mut SegmentCounts,
    routes: &'a mut Routes,
    recurring: &'a mut Recurring,
    /// Counts the timers whose records it read.
    checked_at_load: &'a mut u64,
}

impl LoadCheck<'_> {
    /// Keeps the timers whose record is the timed message they name, due
    /// when they say, its checksum checked: a timer is never delivered for a
    /// damaged message or for another record at its offset. Each one left
    /// out is logged with its file and offset and counted
    /// (`Stats::quarantined`); it is not delivered, now or after a restart
    /// (where it is checked again). A timer that a route learnt ahead
    /// vouches for (see `routes.rs`) is kept without reading its record:
    /// the dispatcher read it and checked its checksum as it indexed it, in
    /// this run of the store. Routes are learnt in the chain's order.
    fn retain_checked(&mut self, second: u64, timers: &mut Vec<Timer>) {
        let vouched: Vec<Option<Vouched>> = timers.iter().map(|t| self.routes.vouching(second, t)).collect();
        let unread = vouched.iter().filter(|v| v.is_none()).count();
        *self.checked_at_load += unread as u64;
        // The messages lie anywhere in the log: load them all before reading any.
        let unread = timers.iter().zip(&vouched).filter(|(_, v)| v.is_none());
        let touched = unread.fold(0u8, |acc, (t, _)| acc ^ self.reader.touch(t.message_offset));
        std::hint::black_box(touched);
        let mut vouched = vouched.into_iter();
        timers.retain(|timer| match vouched.next().flatten() {
            Some(vouched) => {
                self.routes.learn_vouched(second, *timer, vouched);
                true
            }
            None => self.check(second, *timer),
        });
        self.reader.release();
    }

    /// Whether `timer`'s record checks out (learning its route or its
    /// schedule); logs and counts it if not.
    fn check(&mut self, second: u64, timer: Timer) -> bool {
        let (routes, recurring) = (&mut *self.routes, &mut *self.recurring);
        let learn = |view: &MessageView<'_>, _: u64, _: u64| match view.schedule {
            false => routes.learn(second, timer, view.topic, view.queue_id, tag_hash(view.tags)),
            true => recurring.learn(second, timer),
        };
        let why = match check_timer_record(self.reader, timer, learn) {
            Ok(true) => return true,
            Ok(false) => format!("is not a timed message (or its reschedule) due at {}", timer.deliver_at_ms),
            Err(e) => e.to_string(),
        };
        tracing::error!(
            message = timer.message_offset,
            deliver_at_ms = timer.deliver_at_ms,
            why,
            "a timer's record does not check out: it will not be delivered"
        );
        self.quarantined.fetch_add(1, Ordering::Relaxed);
        self.counts.settled(timer.message_offset);
        false
    }
}
