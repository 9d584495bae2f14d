//! The wheel's side of the scheduler seam: timers, progress and cancels go
//! to the ticking thread over its command channel; the thread alone decides
//! what fires.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::consume_queue::ConsumeQueue;
use crate::error::{Error, Result};
use crate::format::record::{MessageView, RescheduleView, check_crc};
use crate::message::{CancelOutcome, PauseOutcome, ReplaceAnswer, Replacement, RescheduleOutcome};
use crate::receipt::UpdateOutcome;
use crate::schedule::ScheduleUpdate;
use crate::scheduler::SchedulerFront;
use crate::stats::TimerStats;
use crate::sync::Locked;
use crate::timer::tick::{Control, WheelCommand, WheelShared};
use crate::timer::wheel::window::{PendingEntry, TimerFate};
use crate::timer::{NewTimers, Timer};

/// Timers sent to the ticking thread in one command (at most).
pub(crate) const INSERT_BATCH: usize = 256;

/// The wheel's front.
pub(crate) struct WheelFront {
    pub commands: Sender<WheelCommand>,
    pub shared: Arc<WheelShared>,
    /// Commands sent to the ticking thread (it counts those it handled).
    pub sent: AtomicU64,
    /// How long a cancel or a refresh waits for the ticking thread's answer.
    pub timeout: Duration,
    /// Timers the dispatcher indexed and the ticking thread has not been
    /// sent yet: they go [`INSERT_BATCH`] at a time, and the rest before
    /// the dispatcher publishes its progress ([`hand_over`](SchedulerFront::hand_over)).
    /// One command per timer cost both threads a channel operation each.
    unsent: Mutex<NewTimers>,
}

impl WheelFront {
    pub fn new(commands: Sender<WheelCommand>, shared: Arc<WheelShared>, timeout: Duration) -> Self {
        let unsent = Mutex::new(NewTimers::with_capacity(INSERT_BATCH));
        Self { commands, shared, sent: AtomicU64::new(0), timeout, unsent }
    }

    /// Queues a timer the dispatcher indexed (with its message's topic,
    /// queue id and tags, if it is a timed message's); sends the batch once full.
    fn queue(&self, timer: Timer, recurring: bool, route: Option<(&str, u32, &str)>) -> Result<()> {
        let mut unsent = self.unsent.locked();
        unsent.push(timer, recurring, route);
        if unsent.len() < INSERT_BATCH {
            return Ok(());
        }
        // Sent under the lock: batches go in the order their timers came.
        let full = std::mem::replace(&mut *unsent, NewTimers::with_capacity(INSERT_BATCH));
        self.send(WheelCommand::Insert(full))
    }

    fn send(&self, command: WheelCommand) -> Result<()> {
        // Counted before it can be handled, so handled >= sent means it was.
        self.sent.fetch_add(1, Ordering::AcqRel);
        self.commands.send(command).map_err(|_| Error::invalid("dispatch", "the ticking thread has stopped"))
    }

    /// Sends a command that answers, and waits for the answer.
    fn ask<T>(&self, command: impl FnOnce(Sender<T>) -> WheelCommand) -> Result<T> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        let asked = Instant::now();
        // Only a thread that is gone refuses the question.
        self.send(command(reply)).map_err(|_| Error::Closed)?;
        answer.recv_timeout(self.timeout).map_err(|_| unanswered(asked.elapsed()))
    }
}

/// A question the ticking thread took and did not answer: it is waiting for
/// disk space, or it dropped the question because answering met damage and
/// it is rebuilding the wheel, or it is busy. The caller may ask again (a
/// thread that is gone refuses the next question with [`Error::Closed`]).
/// Both used to be `Closed`: `delaywheel drain` gave up at once on a full
/// disk, and `recover` on a timer-log entry the store repairs itself.
fn unanswered(waited: Duration) -> Error {
    Error::TickerBusy { waited_ms: waited.as_millis() as u64 }
}

impl SchedulerFront for WheelFront {
    fn index(&self, offset: u64, record: &[u8], view: &MessageView<'_>) -> Result<Option<Arc<ConsumeQueue>>> {
        let timer = Timer { deliver_at_ms: view.timing.deliver_at_ms, message_offset: offset };
        // The route vouches for the record as its second loads (see
        // `routes.rs`), so its checksum is checked now, while it is in the
        // cache: the ticker then delivers no message it did not see checked.
        // A schedule's route is its occurrences', learnt as its records are read.
        let vouched = !view.schedule && check_crc(record, offset).is_ok();
        let route = vouched.then_some((view.topic, view.queue_id, view.tags));
        self.queue(timer, view.schedule, route)?;
        Ok(None)
    }

    fn index_rescheduled(&self, offset: u64, view: &RescheduleView) -> Result<()> {
        let timer = Timer { deliver_at_ms: view.deliver_at_ms, message_offset: offset };
        // Its message is pinned by the record's ledger entry (see `durable/pins.rs`).
        self.queue(timer, view.occurrence.is_some(), None)
    }

    fn hand_over(&self) -> Result<()> {
        let mut unsent = self.unsent.locked();
        if unsent.is_empty() {
            return Ok(());
        }
        let rest = std::mem::replace(&mut *unsent, NewTimers::with_capacity(INSERT_BATCH));
        self.send(WheelCommand::Insert(rest))
    }

    fn indexed_below(&self, offset: u64) -> Result<()> {
        self.hand_over()?;
        self.send(WheelCommand::Progress(offset))
    }

    fn cancel(&self, timer: Timer) -> Result<CancelOutcome> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Cancel(reply)))?
    }

    fn cancel_many(&self, timers: &[Timer]) -> Result<Vec<CancelOutcome>> {
        // All asked before any answer is awaited: the ticking thread takes
        // them in one go, and the caller waits once, not once per timer.
        let answers = timers
            .iter()
            .map(|&timer| {
                let (reply, answer) = crossbeam_channel::bounded(1);
                self.send(WheelCommand::Control(timer, Control::Cancel(reply))).map_err(|_| Error::Closed)?;
                Ok(answer)
            })
            .collect::<Result<Vec<_>>>()?;
        answers
            .into_iter()
            .map(|answer| answer.recv_timeout(self.timeout).map_err(|_| Error::Closed)?)
            .collect()
    }

    fn pause_schedule(&self, timer: Timer, pause: bool) -> Result<PauseOutcome> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Pause(pause, reply)))?
    }

    fn update_schedule(&self, timer: Timer, update: ScheduleUpdate) -> Result<UpdateOutcome> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Update(Box::new(update), reply)))?
    }

    fn replace(&self, timer: Timer, replacement: Box<Replacement>) -> Result<ReplaceAnswer> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Replace(replacement, reply)))?
    }

    fn reschedule(&self, timer: Timer, deliver_at_ms: u64) -> Result<RescheduleOutcome> {
        self.ask(|reply| WheelCommand::Control(timer, Control::Reschedule(deliver_at_ms, reply)))?
    }

    fn stats(&self) -> TimerStats {
        self.shared.stats.locked().clone()
    }

    fn held_below(&self, dispatched: u64) -> u64 {
        // Read in this order: every command sent before the dispatcher
        // published `dispatched` is counted in `sent`.
        let sent = self.sent.load(Ordering::Acquire);
        if self.shared.handled.load(Ordering::Acquire) >= sent {
            return dispatched;
        }
        self.shared.progress.load(Ordering::Acquire).min(dispatched)
    }

    fn refresh(&self) -> Result<()> {
        self.ask(WheelCommand::Refresh)
    }

    fn pending(&self, window_ms: std::ops::Range<u64>, limit: usize) -> Result<Vec<PendingEntry>> {
        self.ask(|reply| WheelCommand::Pending { window_ms, limit, reply })?
    }

    fn pending_of(&self, timers: Vec<Timer>) -> Result<Vec<Option<PendingEntry>>> {
        self.ask(|reply| WheelCommand::PendingOf { timers, reply })?
    }

    fn fate_of(&self, timer: Timer) -> Result<TimerFate> {
        self.ask(|reply| WheelCommand::FateOf { timer, reply })?
    }

    fn pending_counts(&self, bounds_ms: Vec<u64>) -> Result<Vec<u64>> {
        self.ask(|reply| WheelCommand::PendingCounts { bounds_ms, reply })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::segment_counts::SegmentCounts;
    use crate::timer::tick::WheelCheckpoint;

    /// The timers of an insert command: offset, and whether recurring.
    fn inserted(command: WheelCommand) -> Vec<(u64, bool)> {
        match command {
            WheelCommand::Insert(batch) => {
                batch.timers.iter().map(|t| (t.timer.message_offset, t.recurring)).collect()
            }
            other => panic!("expected timers, got {other:?}"),
        }
    }

    /// A front to a ticking thread that is not there, and what it is sent.
    fn test_front() -> (WheelFront, crossbeam_channel::Receiver<WheelCommand>) {
        let (commands, ticker) = crossbeam_channel::unbounded();
        let shared =
            WheelShared::new(WheelCheckpoint::default(), Arc::new(SegmentCounts::rebuilt(1 << 20, 0..0)));
        (WheelFront::new(commands, Arc::new(shared), Duration::from_secs(1)), ticker)
    }

    /// Timers go to the ticking thread a batch at a time, in the order
    /// indexed, and what is held goes before the progress that covers it.
    #[test]
    fn timers_are_sent_in_batches_and_all_before_the_progress() {
        let (front, ticker) = test_front();
        let timer = |offset| Timer { deliver_at_ms: 1_000, message_offset: offset };
        for offset in 1..=INSERT_BATCH as u64 + 2 {
            front.queue(timer(offset), offset == 2, None).expect("sent");
        }
        let first = inserted(ticker.try_recv().expect("a full batch is sent at once"));
        assert_eq!(first, (1..=INSERT_BATCH as u64).map(|o| (o, o == 2)).collect::<Vec<_>>());
        assert!(ticker.try_recv().is_err(), "the rest waits for the progress");
        front.indexed_below(INSERT_BATCH as u64 + 3).expect("sent");
        let rest = inserted(ticker.try_recv().expect("the rest"));
        assert_eq!(rest, [(INSERT_BATCH as u64 + 1, false), (INSERT_BATCH as u64 + 2, false)]);
        assert!(matches!(ticker.try_recv(), Ok(WheelCommand::Progress(p)) if p == INSERT_BATCH as u64 + 3));
        front.hand_over().expect("nothing to send");
        assert!(ticker.try_recv().is_err(), "an empty batch is not sent");
        assert_eq!(front.sent.load(Ordering::Acquire), 3);
    }

    /// A timed message's route goes with its timer once its checksum is
    /// checked; a damaged record's, a schedule's and a reschedule's do not,
    /// nor a queue's past the batch's table: the ticker reads those records.
    #[test]
    fn routes_go_with_the_timers_of_checked_timed_messages() {
        use crate::format::record::{MessageFields, Timing, encode_message};
        use crate::message::Message;
        let (front, ticker) = test_front();
        let timing = Timing { deliver_at_ms: 5_000, delay_level: 0 };
        let record = |message: &Message, offset: u64, queue: u32, schedule: bool| {
            let fields = MessageFields { schedule, ..message.fields(queue, 1_000, timing) };
            let mut buf = vec![0u8; fields.record_len()];
            encode_message(&mut buf, offset, &fields);
            buf
        };
        let mut offset = 32;
        let mut index = |message: &Message, queue: u32, damage: bool, schedule: bool| {
            let mut bytes = record(message, offset, queue, schedule);
            let view_bytes = bytes.clone();
            if damage {
                let last = bytes.len() - 1;
                bytes[last] ^= 1;
            }
            let view = MessageView::parse(&view_bytes).expect("a message record");
            front.index(offset, &bytes, &view).expect("queued");
            offset += bytes.len() as u64;
        };
        let plain = Message::new("T", "m").tags("a");
        index(&plain, 0, false, false);
        index(&plain, 0, true, false);
        index(&plain, 0, false, true);
        for queue in 1..=crate::timer::routes::AHEAD_QUEUES as u32 {
            index(&plain, queue, false, false);
        }
        front.hand_over().expect("sent");
        let WheelCommand::Insert(batch) = ticker.try_recv().expect("a batch") else { panic!("not a batch") };
        let routed: Vec<Option<u16>> = batch.timers.iter().map(|t| t.route.map(|r| r.queue)).collect();
        assert_eq!(routed[..3], [Some(0), None, None], "a damaged record's and a schedule's go without");
        assert_eq!(
            batch.timers[0].route.map(|r| r.tag_hash),
            Some(crate::format::queue_entry::tag_hash("a"))
        );
        assert_eq!(
            routed[3..].iter().filter(|r| r.is_some()).count(),
            crate::timer::routes::AHEAD_QUEUES - 1
        );
        assert_eq!(routed.last(), Some(&None), "a queue past the table goes without");
        assert_eq!(batch.queues.len(), crate::timer::routes::AHEAD_QUEUES);
    }

    /// A question dropped unanswered (the thread rebuilding its wheel) or
    /// left waiting (the thread waiting for disk space) is busy, not closed.
    #[test]
    fn a_ticker_that_does_not_answer_is_busy() {
        let wait = Duration::from_millis(20);
        let (reply, answer) = crossbeam_channel::bounded::<()>(1);
        let started = Instant::now();
        let late = answer.recv_timeout(wait).map_err(|_| unanswered(started.elapsed()));
        assert!(matches!(late, Err(Error::TickerBusy { waited_ms }) if waited_ms >= 20), "{late:?}");
        drop(reply);
        let dropped = answer.recv_timeout(wait).map_err(|_| unanswered(started.elapsed()));
        assert!(matches!(dropped, Err(Error::TickerBusy { .. })), "{dropped:?}");
    }
}
