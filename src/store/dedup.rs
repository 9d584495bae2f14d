//! Puts with a dedup key (see `dedup.rs`): the lookup of the message that
//! stands for a key, and how long it stands.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;

use super::Store;
use crate::config::FlushMode;
use crate::dedup::{Dedup, Recent};
use crate::error::{Error, Result};
use crate::format::record::Timing;
use crate::format::record::{CancelView, MessageView, RecordKind};
use crate::message::{Message, Receipt, ReplaceAnswer, Replacement, Written};
use crate::receipt::ReplaceOutcome;
use crate::sync::ReadWrite;
use crate::timer::Timer;
use crate::timer::wheel::window::TimerFate;

/// The message that stands for a dedup key: its receipt, marked as a
/// duplicate's, where its record ends, and whether it is a recurring schedule's.
pub(super) struct Standing {
    pub receipt: Receipt,
    end: u64,
    schedule: bool,
}

impl Store {
    /// Appends `message`, whose dedup key is `key`, unless a message of its
    /// topic with that key stands: then writes nothing and returns that
    /// message's receipt and where its record ends.
    pub(super) fn append_deduplicated(&self, message: &Message, key: &str) -> Result<(Receipt, u64)> {
        self.check_message(message)?;
        self.wait_dedup_ready()?;
        let (hash, mut recent) = self.dedup.shard(message.topic(), key);
        // Read before the index: every record below it is in the index.
        recent.forget_below(self.dispatched.load(Ordering::Acquire));
        if let Some(standing) = self.standing(message.topic(), key, hash, &recent)? {
            return Ok((standing.receipt, standing.end));
        }
        let (receipt, end) = self.append_new(message)?;
        recent.push(hash, receipt.offset);
        Ok((receipt, end))
    }

    /// The shard of `topic` and `key`, locked and brought up to date, with
    /// their hash, for a put that writes in place of what the key names.
    pub(super) fn dedup_shard(&self, topic: &str, key: &str) -> Result<(u32, MutexGuard<'_, Recent>)> {
        if !*self.accepting.reading() {
            return Err(Error::Closed);
        }
        self.wait_dedup_ready()?;
        let (hash, mut recent) = self.dedup.shard(topic, key);
        recent.forget_below(self.dispatched.load(Ordering::Acquire));
        Ok((hash, recent))
    }

    /// Waits, once, until the dispatcher has passed the log's end at open.
    fn wait_dedup_ready(&self) -> Result<()> {
        if let Some(open_end) = self.dedup.open_end() {
            let started = std::time::Instant::now();
            // In sync mode the dispatcher takes only what is durable.
            let _ = self.wakes.commit.try_send(());
            while self.dispatched.load(Ordering::Acquire) < open_end {
                self.health()?;
                if started.elapsed() >= self.config.put_timeout {
                    let lag_bytes = open_end - self.dispatched.load(Ordering::Acquire).min(open_end);
                    return Err(Error::Busy { lag_bytes, waited_ms: started.elapsed().as_millis() as u64 });
                }
                let _ = self.wakes.dispatch.try_send(());
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            self.dedup.set_caught_up();
        }
        Ok(())
    }

    /// The newest message of `topic` with dedup key `key` (hash `hash`),
    /// if it still stands.
    fn standing(&self, topic: &str, key: &str, hash: u32, recent: &Recent) -> Result<Option<Standing>> {
        match self.newest_keyed(topic, key, hash, recent)? {
            // The newest message with the key decides: older ones settled before it.
            Some((standing, timer)) => Ok(self.stands(&standing, timer)?.then_some(standing)),
            None => Ok(None),
        }
    }

    /// The newest message of `topic` with dedup key `key` (hash `hash`),
    /// with its own timer if it is timed.
    ///
    /// Candidates are read newest first, and the first that is the key's
    /// is the answer. The index is asked file by file from the newest, so a
    /// recent key costs one file's lookup, not one per file: each round
    /// reads the candidates at or above the file's first offset, its own
    /// and those in `recent`, before any below it. (`recent` may be older
    /// than the index: a replacement a timed-out call left with the ticking
    /// thread is in the index only.)
    pub(super) fn newest_keyed(
        &self,
        topic: &str,
        key: &str,
        hash: u32,
        recent: &Recent,
    ) -> Result<Option<(Standing, Option<Timer>)>> {
        let mut unread: Vec<u64> = recent.of(hash).collect();
        let mut below = u64::MAX;
        loop {
            let file = self.keys.dedup.newest_candidates_below(hash, below);
            let floor = file.as_ref().map_or(0, |(first, _)| *first);
            let mut round = unread.split_off(unread.partition_point(|&offset| offset < floor));
            if let Some((_, in_file)) = &file {
                round.extend(in_file);
                round.sort_unstable();
                round.dedup();
            }
            for &offset in round.iter().rev() {
                if let Some(found) = self.read_keyed(offset, topic, key)? {
                    return Ok(Some(found));
                }
            }
            match file {
                Some((first, _)) => below = first,
                None => return Ok(None),
            }
        }
    }

    /// Waits until everything written so far is indexed (in sync mode, the
    /// committer is woken: the indexes take only what is durable).
    pub(super) fn wait_all_indexed(&self) -> Result<()> {
        let _ = self.wakes.commit.try_send(());
        self.wait_indexed_to(self.log.write_end())
    }

    /// Puts `message` in place of the pending timer of its topic and dedup
    /// key, if there is one (see [`ReplaceOutcome`]); else puts it.
    ///
    /// The replacement is one record, the new message's, naming the old
    /// timer, which it settles as a cancel record would: the old timer never
    /// fires, the new one fires once, and a crash keeps one of them, never
    /// both, never neither. It is written by the ticking thread, which alone
    /// knows the old timer is still pending as it writes. The new message
    /// has a handle of its own (the old handle answers `Cancelled`); its
    /// dedup key names the latest. Racing puts of one key are taken one at
    /// a time. Durable as a put is.
    ///
    /// ```
    /// use std::time::Duration;
    /// use delaywheel::{Config, Message, ReplaceOutcome, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(Config::new(dir.path()))?;
    /// let reminder = |body: &str, secs| Message::new("Reminders", body.to_string()).dedup_key("cart-7").delay(Duration::from_secs(secs));
    /// assert!(matches!(store.put_replacing(reminder("first", 600))?, ReplaceOutcome::Put(_)));
    /// // The cart changed: the reminder moves and says something else; only this one fires.
    /// let ReplaceOutcome::Replaced { receipt, replaced } = store.put_replacing(reminder("updated", 900))? else {
    ///     unreachable!("the first is pending")
    /// };
    /// assert_ne!(receipt.handle(), Some(replaced));
    /// # store.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Errors, with nothing written: [`Error::Invalid`] naming `dedup_key`
    /// for a message without one, `timing` for one that is not timed, or
    /// the field of a message `put` would refuse; else those of
    /// [`put`](Self::put) and of [`cancel`](Self::cancel).
    pub fn put_replacing(&self, message: Message) -> Result<ReplaceOutcome> {
        let Some(key) = message.dedup_key.as_deref() else {
            return Err(Error::invalid(
                "dedup_key",
                "put_replacing finds the timer to replace by the dedup key",
            ));
        };
        if message.is_untimed() {
            return Err(Error::invalid(
                "timing",
                "put_replacing puts a timer: give it a deliver time or a delay",
            ));
        }
        let queue_id = self.check_message(&message)?;
        let (hash, mut recent) = self.dedup_shard(message.topic(), key)?;
        // Moved to the ticking thread and back, not copied, if not pending.
        let mut replacement = Box::new(Replacement { message, queue_id, timing: Timing::default() });
        // One wait for room at the size cap, however many looks.
        let started = std::time::Instant::now();
        for look in 0..2 {
            let message = &replacement.message;
            let key = message.dedup_key.as_deref().expect("checked above");
            let Some((standing, Some(timer))) = self.newest_keyed(message.topic(), key, hash, &recent)?
            else {
                break;
            };
            if standing.schedule {
                let why = "names a recurring schedule: replace it with schedule_replacing";
                return Err(Error::invalid("dedup_key", why));
            }
            let now_ms = self.config.clock.now_ms();
            let (deliver_at_ms, delay_level) = message.resolve_timing(now_ms, &self.levels)?;
            replacement.timing = Timing { deliver_at_ms, delay_level };
            match self.replace_when_room(timer, replacement, started)? {
                Ok(receipt) => {
                    recent.push(hash, receipt.offset);
                    drop(recent);
                    if self.config.flush_mode == FlushMode::Sync {
                        self.wait_durable_for(self.log.write_end(), Written::Put(receipt))?;
                    }
                    let replaced = standing.receipt.handle().expect("a timed message has a handle");
                    return Ok(ReplaceOutcome::Replaced { receipt, replaced });
                }
                Err(back) => replacement = back,
            }
            // Not pending: a replacement a timed-out call left with the
            // ticking thread may have written a newer timer of the key. Look
            // again once everything written is indexed.
            if look == 0 {
                self.wait_all_indexed()?;
            }
        }
        let message = replacement.message;
        let (receipt, end) = self.append_new(&message)?;
        recent.push(hash, receipt.offset);
        drop(recent);
        if self.config.flush_mode == FlushMode::Sync {
            self.wait_durable_for(end, Written::Put(receipt))?;
        }
        Ok(ReplaceOutcome::Put(receipt))
    }

    /// Has the ticking thread write `replacement` in place of `timer`: its
    /// receipt, or the replacement back if the timer was not pending. At
    /// the size cap it waits for retention to make room, up to the put
    /// timeout since `started`, and asks again, as a put waits (then fails
    /// with [`Error::SizeCap`]); the timer may fire meanwhile.
    fn replace_when_room(
        &self,
        timer: Timer,
        mut replacement: Box<Replacement>,
        started: std::time::Instant,
    ) -> Result<std::result::Result<Receipt, Box<Replacement>>> {
        loop {
            match self.scheduler.replace(timer, replacement)? {
                // The replacement is freed here, by the thread whose allocator made it.
                ReplaceAnswer::Written(receipt, _freed_here) => return Ok(Ok(receipt)),
                ReplaceAnswer::NotPending(back) => return Ok(Err(back)),
                ReplaceAnswer::OverSizeCap(back, e) => {
                    if !self.await_room(started) {
                        return Err(e);
                    }
                    replacement = back;
                }
            }
        }
    }

    /// The message at `offset` if it is of `topic` with dedup key `key`,
    /// with its own timer if it is timed.
    fn read_keyed(&self, offset: u64, topic: &str, key: &str) -> Result<Option<(Standing, Option<Timer>)>> {
        let visited = self.log.visit_checked(offset, |at, kind, bytes| {
            let view =
                MessageView::parse(bytes).ok().filter(|_| at == offset && kind == RecordKind::Message)?;
            if view.topic != topic || view.dedup_key() != Some(key) {
                return None;
            }
            let deliver_at_ms = view.timer_deliver_at_ms();
            let receipt = Receipt {
                offset,
                queue_id: view.queue_id,
                store_time_ms: view.store_time_ms,
                deliver_at_ms,
                duplicate: true,
            };
            let timer = deliver_at_ms.map(|deliver_at_ms| Timer { deliver_at_ms, message_offset: offset });
            Some((Standing { receipt, end: offset + bytes.len() as u64, schedule: view.schedule }, timer))
        });
        match visited {
            Ok((found, _)) => Ok(found),
            // Retention deleted it: its window is bounded by retention.
            Err(Error::Reclaimed { .. }) => Ok(None),
            Err(e @ Error::Corruption { .. }) => {
                tracing::warn!(offset, error = %e, "a message the dedup index names does not check out: passed over");
                Ok(None)
            }
            // Not knowing whether the key stands, the put writes nothing.
            Err(e) => Err(e),
        }
    }

    /// Whether the message `standing` (with its own `timer`, if timed) stands now.
    fn stands(&self, standing: &Standing, timer: Option<Timer>) -> Result<bool> {
        let now_ms = self.config.clock.now_ms();
        let window_ms = self.dedup.window_ms();
        let within = |from_ms: u64| now_ms < from_ms.saturating_add(window_ms);
        if self.within_window_of_put(standing) {
            return Ok(true);
        }
        let Some(timer) = timer else { return Ok(false) };
        // The wheel answers for the timers it holds.
        self.wait_indexed_to(standing.end)?;
        Ok(match self.scheduler.fate_of(timer)? {
            TimerFate::Pending => true,
            TimerFate::Delivered { deliver_at_ms } => within(deliver_at_ms),
            TimerFate::Cancelled { record_offset: Some(record), deliver_at_ms } => {
                within(self.cancelled_at(record).unwrap_or(deliver_at_ms))
            }
            // The ledger forgot the cancel: the latest it can have been is the due time.
            TimerFate::Cancelled { record_offset: None, deliver_at_ms } => within(deliver_at_ms),
        })
    }

    /// Whether `standing` was put less than the dedup window ago: whatever
    /// became of its timer then, it settled after it was put, so it stands.
    fn within_window_of_put(&self, standing: &Standing) -> bool {
        let now_ms = self.config.clock.now_ms();
        now_ms < standing.receipt.store_time_ms.saturating_add(self.dedup.window_ms())
    }

    /// When the cancel record at `offset` was written (an update's record:
    /// when it was put); `None` if it does not read.
    fn cancelled_at(&self, offset: u64) -> Option<u64> {
        let visited = self.log.visit_checked(offset, |_, kind, bytes| match kind {
            RecordKind::Cancel => CancelView::parse(bytes).ok().map(|c| c.cancelled_at_ms),
            RecordKind::Message => MessageView::parse(bytes).ok().map(|m| m.store_time_ms),
            _ => None,
        });
        visited.ok().and_then(|(at, _)| at)
    }
}

/// What a put of a batch with dedup keys does with one message.
enum Answer {
    /// Appended: the position among the messages appended.
    Appended(usize),
    /// A duplicate of a message that stands.
    Standing(Standing),
    /// A duplicate of an earlier message of the batch, by its position in the batch.
    Earlier(usize),
}

/// Whether a put may wait (see [`Store::try_submit_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waits {
    AsLongAsNeeded,
    /// Gives up, with nothing written, where it would wait.
    Never,
}

impl Store {
    /// [`append_deduplicated`](Self::append_deduplicated) for a checked
    /// batch: appends, all or nothing, the messages whose dedup key does not
    /// stand (a key twice in the batch stands from its first message on);
    /// returns each message's receipt, in input order, and where the last
    /// record they name ends. `None`, with nothing written, where it would
    /// wait and `waits` is [`Waits::Never`].
    pub(super) fn batch_deduplicated(
        &self,
        messages: &[Message],
        queue_ids: Vec<u32>,
        waits: Waits,
    ) -> Result<Option<(Vec<Receipt>, u64)>> {
        if waits == Waits::Never
            && self.dedup.open_end().is_some_and(|end| self.dispatched.load(Ordering::Acquire) < end)
        {
            return Ok(None);
        }
        self.wait_dedup_ready()?;
        let keys: Vec<Option<(&str, u32, usize)>> = (messages.iter())
            .map(|m| m.dedup_key.as_deref().map(|key| (key, Dedup::locate(m.topic(), key))))
            .map(|keyed| keyed.map(|(key, (hash, shard))| (key, hash, shard)))
            .collect();
        let wanted = keys.iter().flatten().map(|&(_, _, shard)| shard);
        let Some(mut shards) = self.dedup.lock_shards(wanted, waits == Waits::AsLongAsNeeded) else {
            return Ok(None);
        };
        let dispatched = self.dispatched.load(Ordering::Acquire);
        shards.values_mut().for_each(|recent| recent.forget_below(dispatched));
        let (mut answers, mut fresh, mut fresh_queues) = (Vec::new(), Vec::new(), Vec::new());
        let mut first_of = HashMap::new();
        for (i, (message, keyed)) in messages.iter().zip(&keys).enumerate() {
            let answer = match *keyed {
                None => None,
                Some((key, hash, shard)) => match first_of.entry((message.topic(), key)) {
                    Entry::Occupied(first) => Some(Answer::Earlier(*first.get())),
                    Entry::Vacant(first) => {
                        first.insert(i);
                        let newest = self.newest_keyed(message.topic(), key, hash, &shards[&shard])?;
                        let Some(stands) = self.stands_if_known(newest, waits)? else { return Ok(None) };
                        stands.map(Answer::Standing)
                    }
                },
            };
            answers.push(answer.unwrap_or_else(|| {
                fresh.push(message.clone());
                fresh_queues.push(queue_ids[i]);
                Answer::Appended(fresh.len() - 1)
            }));
        }
        let positions: Vec<usize> = (answers.iter().enumerate())
            .filter_map(|(i, answer)| matches!(answer, Answer::Appended(_)).then_some(i))
            .collect();
        let appended = match waits {
            Waits::AsLongAsNeeded => self.append_checked_batch(&fresh, fresh_queues).map(Some),
            Waits::Never => self.try_append_checked_batch(&fresh, fresh_queues),
        };
        let appended = appended.map_err(|e| match e {
            Error::InBatch { index, source } => Error::InBatch { index: positions[index], source },
            e => e,
        })?;
        let Some((appended, mut end)) = appended else { return Ok(None) };
        for (receipt, &i) in appended.iter().zip(&positions) {
            if let Some((_, hash, shard)) = keys[i] {
                shards.get_mut(&shard).expect("locked above").push(hash, receipt.offset);
            }
        }
        let mut receipts: Vec<Receipt> = Vec::with_capacity(messages.len());
        for answer in answers {
            receipts.push(match answer {
                Answer::Appended(n) => appended[n],
                Answer::Standing(standing) => {
                    end = end.max(standing.end);
                    standing.receipt
                }
                Answer::Earlier(first) => Receipt { duplicate: true, ..receipts[first] },
            });
        }
        Ok(Some((receipts, end)))
    }

    /// Whether the newest message of a key (`newest`, with its own timer)
    /// stands: `Some(Some(it))` if it does, `Some(None)` if not or if there is
    /// none; `None` where telling would wait and `waits` is [`Waits::Never`]
    /// (the ticking thread must say what became of its timer).
    fn stands_if_known(
        &self,
        newest: Option<(Standing, Option<Timer>)>,
        waits: Waits,
    ) -> Result<Option<Option<Standing>>> {
        let Some((standing, timer)) = newest else { return Ok(Some(None)) };
        if waits == Waits::Never && timer.is_some() && !self.within_window_of_put(&standing) {
            return Ok(None);
        }
        Ok(Some(self.stands(&standing, timer)?.then_some(standing)))
    }
}
