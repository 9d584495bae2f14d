//! Walking a wheel slot's chain: from the slot's head entry back through
//! each entry's `prev` to the first, in the timer log of the slot's level.
//! The store (cascading a window) and `wheel-dump` (verifying one) walk
//! chains the same way, by this function.

use crate::format::slot::Slot;
use crate::format::timer_entry::TimerEntry;

/// What reading entry `index` of a timer log found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The entry.
    Entry(TimerEntry),
    /// Within the log's files, but never written: the chain is broken.
    Unwritten,
    /// In a file retention deleted: the chain goes on where it cannot be read.
    Deleted,
}

/// A chain as far as its timer log holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// (entry index, entry), newest first.
    pub entries: Vec<(u64, TimerEntry)>,
    /// The entry the chain goes on to whose file was deleted (`None`: the
    /// chain was read whole and matched the slot's counts).
    pub deleted_from: Option<u64>,
}

/// Why a chain does not match its slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainBreak {
    /// It points at an entry that was never written.
    Unwritten {
        /// The entry's index.
        entry: u64,
    },
    /// An entry's `prev` is not an earlier entry.
    LinksForward {
        /// The entry's index.
        entry: u64,
        /// Its `prev`.
        prev: u64,
    },
    /// It holds another number of entries than the slot counts.
    Count {
        /// What the slot counts.
        count: u32,
        /// Entries read.
        found: usize,
        /// The walk stopped at the count with more to go.
        more: bool,
    },
    /// It holds another number of cancel entries than the slot counts.
    Cancels {
        /// What the slot counts.
        cancels: u32,
        /// Cancel entries read.
        found: usize,
    },
}

impl std::fmt::Display for ChainBreak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unwritten { entry } => write!(f, "the chain points at unwritten entry {entry}"),
            Self::LinksForward { entry, prev } => write!(f, "entry {entry} links forward to {prev}"),
            Self::Count { count, found, more } => {
                let more = if *more { " or more" } else { "" };
                write!(f, "slot count is {count} but its chain holds {found}{more}")
            }
            Self::Cancels { cancels, found } => {
                write!(f, "slot says {cancels} cancel entries, its chain holds {found}")
            }
        }
    }
}

/// Why a walk stopped: the chain is broken, or reading an entry failed.
#[derive(Debug)]
pub enum WalkError<E> {
    /// The chain does not match its slot.
    Broken(ChainBreak),
    /// Reading an entry failed.
    Read(E),
}

/// Walks the chain of `slot`, newest entry first, reading entries with
/// `read`. Stops at a deleted file (see [`Chain::deleted_from`]); otherwise
/// the chain must link backwards and hold exactly the slot's `count`
/// entries, `cancels` of them cancel entries. Reads at most `count` entries.
pub fn walk<E>(slot: &Slot, mut read: impl FnMut(u64) -> Result<Lookup, E>) -> Result<Chain, WalkError<E>> {
    let count = slot.count as usize;
    let mut entries = Vec::with_capacity(count.min(1 << 20));
    let mut next = slot.head;
    while next != 0 && entries.len() < count {
        let entry = match read(next).map_err(WalkError::Read)? {
            Lookup::Entry(entry) => entry,
            Lookup::Deleted => return Ok(Chain { entries, deleted_from: Some(next) }),
            Lookup::Unwritten => return Err(WalkError::Broken(ChainBreak::Unwritten { entry: next })),
        };
        if entry.prev >= next {
            return Err(WalkError::Broken(ChainBreak::LinksForward { entry: next, prev: entry.prev }));
        }
        entries.push((next, entry));
        next = entry.prev;
    }
    if entries.len() != count || next != 0 {
        return Err(WalkError::Broken(ChainBreak::Count {
            count: slot.count,
            found: entries.len(),
            more: next != 0,
        }));
    }
    let cancels = entries.iter().filter(|(_, e)| e.cancel).count();
    if cancels != slot.cancels as usize {
        return Err(WalkError::Broken(ChainBreak::Cancels { cancels: slot.cancels, found: cancels }));
    }
    Ok(Chain { entries, deleted_from: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(prev: u64, cancel: bool) -> TimerEntry {
        TimerEntry { message_offset: 32, deliver_at_ms: 1_000, prev, cancel }
    }

    fn slot(head: u64, count: u32, cancels: u32) -> Slot {
        Slot { window: 1, head, count, level: 0, cancels }
    }

    #[test]
    fn a_chain_is_read_newest_first_and_checked_against_its_slot() {
        let log = [None, Some(entry(0, false)), Some(entry(1, true)), Some(entry(2, false))];
        let read =
            |i: u64| -> Result<Lookup, ()> { Ok(log[i as usize].map_or(Lookup::Unwritten, Lookup::Entry)) };
        let chain = walk(&slot(3, 3, 1), read).unwrap();
        assert_eq!(chain.entries.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [3, 2, 1]);
        assert_eq!(chain.deleted_from, None);
        let broken = |slot: Slot| match walk(&slot, read) {
            Err(WalkError::Broken(why)) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(broken(slot(3, 2, 1)), ChainBreak::Count { count: 2, found: 2, more: true });
        assert_eq!(broken(slot(3, 4, 1)), ChainBreak::Count { count: 4, found: 3, more: false });
        assert_eq!(broken(slot(3, 3, 0)), ChainBreak::Cancels { cancels: 0, found: 1 });
        let forward = |i: u64| -> Result<Lookup, ()> { Ok(Lookup::Entry(entry(i + 1, false))) };
        assert_eq!(
            match walk(&slot(2, 2, 0), forward) {
                Err(WalkError::Broken(why)) => why,
                other => panic!("{other:?}"),
            },
            ChainBreak::LinksForward { entry: 2, prev: 3 }
        );
        let gone = |i: u64| -> Result<Lookup, ()> {
            Ok(if i < 3 { Lookup::Deleted } else { Lookup::Entry(entry(2, false)) })
        };
        let partial = walk(&slot(3, 3, 0), gone).unwrap();
        assert_eq!((partial.entries.len(), partial.deleted_from), (1, Some(2)));
    }
}
