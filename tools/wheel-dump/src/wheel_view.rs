//! The wheel as a reopened store would see it: which slots are live at the
//! checkpoint's tick second, and which timers their chains hold.
//!
//! A level-0 slot is live when its second is at or after the tick second; a
//! level-1 or level-2 slot while its window has not been cascaded. Slots are
//! never cleared, so every other non-empty slot is stale: its timers were
//! delivered, or copied into finer slots by a cascade. This view is as of the
//! last checkpoint: a live store may have moved on since (it delivers from
//! slots this view still calls live; the commit log's delivery records say so).

use std::collections::HashSet;

use delaywheel::Checkpoint;
use delaywheel::inspect;

use crate::error::Result;
use crate::indexes::{CheckpointFile, PlacedSlot, TimerLog, WheelFile, chain};
use crate::store_files::StoreFiles;

/// What the next open would resume from.
pub struct Resume {
    /// The newest valid checkpoint and its byte position, if any.
    pub checkpoint: Option<(u64, Checkpoint)>,
    /// Whether the next open resumes the indexes at the checkpoint (a valid
    /// checkpoint, `consumequeue/` and `timer/wheel` all present); otherwise
    /// it rebuilds every index from the start of the commit log.
    pub resumes: bool,
}

impl Resume {
    pub fn new(files: &StoreFiles, checkpoint: &CheckpointFile) -> Self {
        let newest = checkpoint.newest();
        let indexes_present = files.dir.join("consumequeue").is_dir() && files.wheel.is_file();
        Self { checkpoint: newest, resumes: newest.is_some() && indexes_present }
    }

    /// The tick second live slots are judged by, if the wheel is resumed.
    pub fn tick_second(&self) -> Option<u64> {
        self.checkpoint.filter(|_| self.resumes).map(|(_, cp)| cp.tick_second)
    }

    pub fn is_live(&self, slot: &PlacedSlot) -> bool {
        self.tick_second().is_some_and(|tick| inspect::slot_is_live(slot.level, slot.slot.window, tick))
    }
}

/// The live slots of a wheel, in file order.
pub fn live_slots(wheel: &WheelFile, resume: &Resume) -> Result<Vec<PlacedSlot>> {
    let mut out = Vec::new();
    for slot in wheel.slots() {
        let slot = slot?;
        if slot.slot.count > 0 && resume.is_live(&slot) {
            out.push(slot);
        }
    }
    Ok(out)
}

/// Message offsets in the chains of live slots: timers, and cancel entries.
#[derive(Debug, Default)]
pub struct Membership {
    pub timers: HashSet<u64>,
    pub cancel_entries: HashSet<u64>,
}

impl Membership {
    /// Walks the chain of every live slot, reading the timer log once.
    pub fn of(wheel: &WheelFile, log: &TimerLog, resume: &Resume) -> Result<Self> {
        let entries = log.load()?;
        let mut out = Self::default();
        for slot in live_slots(wheel, resume)? {
            let lookup = |i: u64| Ok(entries.get(i as usize).copied().flatten());
            for (_, entry) in chain(wheel, &slot, lookup)? {
                let set = if entry.cancel { &mut out.cancel_entries } else { &mut out.timers };
                set.insert(entry.message_offset);
            }
        }
        Ok(out)
    }

    /// In a live slot and not dropped by a cancel entry there.
    pub fn pending(&self, message_offset: u64) -> bool {
        self.timers.contains(&message_offset) && !self.cancel_entries.contains(&message_offset)
    }
}
