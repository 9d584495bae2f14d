//! Idempotent puts: a put with a dedup key writes nothing while a message of
//! its topic with that key stands, and answers that message's receipt.
//!
//! Where a key stands is the log's truth, found through two indexes: the
//! dedup index (`index/dedup/`, see `key_index.rs`), kept by the dispatcher
//! and rebuilt by recovery like every index, for the records the dispatcher
//! has reached; and, for the records appended since that it has not reached
//! yet, [`Recent`], a list per shard of keys. Every candidate either names is
//! read from the log and checked (checksum, topic, dedup key): an entry is
//! only a hint, and one left by a record a crash took names nothing.
//!
//! A put holds its key's shard from the lookup to the append, so racing puts
//! of one key make one message and duplicates (a batch holds the shards of
//! all its keys, taken in shard order). Before the first lookup, the
//! dispatcher must have passed the log's end at open: what was appended
//! before then is in the index, what after, in [`Recent`].
//!
//! How long a key stands (see `Message::dedup_key`): from the put until the
//! window after the latest of the put, the timer's due time (for a timer
//! that fired) and its cancel (for one cancelled); always while its timer is
//! pending. A lookup inside the window after the put (the common retry)
//! needs nothing more; a later one asks the ticking thread what became of
//! the timer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::format::key_index::key_hash;
use crate::sync::Locked;

/// Shards of [`Recent`]: puts of different keys rarely wait for each other.
const SHARDS: usize = 64;

/// The dedup state of one store beside its index.
pub(crate) struct Dedup {
    window_ms: u64,
    shards: Box<[Mutex<Recent>]>,
    /// The log's end at open.
    open_end: u64,
    /// Whether the dispatcher passed `open_end`.
    caught_up: AtomicBool,
}

/// The records with a dedup key this process appended that the dedup index
/// may not hold yet: (key hash, record offset), in offset order.
#[derive(Default)]
pub(crate) struct Recent(Vec<(u32, u64)>);

impl Dedup {
    pub fn new(window_ms: u64, open_end: u64) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::default()).collect();
        Self { window_ms, shards, open_end, caught_up: AtomicBool::new(false) }
    }

    /// How long a key stands after its message settled (ms).
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The log's end at open, which the dispatcher must pass before the first lookup.
    pub fn open_end(&self) -> Option<u64> {
        (!self.caught_up.load(Ordering::Acquire)).then_some(self.open_end)
    }

    /// The dispatcher passed the log's end at open.
    pub fn set_caught_up(&self) {
        self.caught_up.store(true, Ordering::Release);
    }

    /// The hash of `topic` and `key`, and their shard.
    pub fn locate(topic: &str, key: &str) -> (u32, usize) {
        let hash = key_hash(topic, key);
        (hash, hash as usize % SHARDS)
    }

    /// The shard of `topic` and `key`, locked, with its hash.
    pub fn shard(&self, topic: &str, key: &str) -> (u32, MutexGuard<'_, Recent>) {
        let (hash, shard) = Self::locate(topic, key);
        (hash, self.shards[shard].locked())
    }

    /// Locks the shards `wanted` (repeats allowed), in shard order, so puts
    /// that lock several never wait for each other in a cycle; if not
    /// `wait`, `None` where one is held (none is kept locked then).
    pub fn lock_shards(
        &self,
        wanted: impl Iterator<Item = usize>,
        wait: bool,
    ) -> Option<BTreeMap<usize, MutexGuard<'_, Recent>>> {
        let wanted: BTreeSet<usize> = wanted.collect();
        let lock = |shard: usize| match wait {
            true => Some(self.shards[shard].locked()),
            false => self.shards[shard].try_locked(),
        };
        wanted.into_iter().map(|shard| Some((shard, lock(shard)?))).collect()
    }
}

impl Recent {
    /// Forgets the records below `dispatched`: the index holds them.
    pub fn forget_below(&mut self, dispatched: u64) {
        let held = self.0.partition_point(|&(_, offset)| offset < dispatched);
        self.0.drain(..held);
    }

    /// The offsets of the records of `hash`, oldest first.
    pub fn of(&self, hash: u32) -> impl Iterator<Item = u64> + '_ {
        self.0.iter().filter(move |&&(h, _)| h == hash).map(|&(_, offset)| offset)
    }

    /// A record of `hash` appended at `offset`, after every other.
    pub fn push(&mut self, hash: u32, offset: u64) {
        debug_assert!(self.0.last().is_none_or(|&(_, last)| last < offset), "appended in log order");
        self.0.push((hash, offset));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_forgets_what_the_index_holds_and_lists_by_hash() {
        let mut recent = Recent::default();
        recent.push(7, 100);
        recent.push(9, 200);
        recent.push(7, 300);
        assert_eq!(recent.of(7).collect::<Vec<_>>(), [100, 300]);
        recent.forget_below(200);
        assert_eq!(recent.of(7).collect::<Vec<_>>(), [300]);
        assert_eq!(recent.of(9).collect::<Vec<_>>(), [200]);
    }
}
