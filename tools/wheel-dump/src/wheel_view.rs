//! The wheel as a reopened store would see it: which slots are live at the
//! checkpoint's tick second, and which timers their chains hold.
//!
//! A level-0 slot is live when its second is at or after the tick second; a
//! level-1 or level-2 slot while its window has not been cascaded. Slots are
//! never cleared, so every other non-empty slot is stale: its timers were
//! delivered, or copied into finer slots by a cascade. This view is as of the
//! last checkpoint: a live store may have moved on since (it delivers from
//! slots this view still calls live; the commit log's delivery records say so).
//!
//! A level-0 slot chains through the near timer log, a coarser one through
//! the far log. Only the chains of live slots are sure to be readable: the
//! store deletes a timer log's oldest files once no live chain reaches them,
//! so a stale slot's chain may lead into deleted files.

use std::collections::HashSet;

use delaywheel::internals::checkpoint::Checkpoint;
use delaywheel::internals::geometry;
use delaywheel::internals::timer_entry::TimerEntry;

use crate::commitlog::CommitLog;
use crate::error::Result;
use crate::indexes::{CheckpointFile, Entries, LoadedLogs, PlacedSlot, WheelFile, read_chain, whole_chain};
use crate::store_files::StoreFiles;

/// What the next open would resume from.
#[derive(Debug, Clone, Copy)]
pub struct Resume {
    /// The checkpoint the next open trusts and its byte position, if any.
    pub checkpoint: Option<(u64, Checkpoint)>,
    /// Whether the next open resumes the indexes at the checkpoint (a valid
    /// checkpoint, `consumequeue/` and `timer/wheel` all present); otherwise
    /// it rebuilds every index from the start of the commit log.
    pub resumes: bool,
}

impl Resume {
    pub fn new(files: &StoreFiles, checkpoint: &CheckpointFile) -> Result<Self> {
        let trusted = checkpoint.trusted(&CommitLog::open(files)?)?;
        // The store's own rule: the indexes resume only if all of them are present.
        let resumes = files.layout.resume_point(trusted.map(|(_, cp)| cp)).is_some();
        Ok(Self { checkpoint: trusted, resumes })
    }

    /// The tick second live slots are judged by, if the wheel is resumed.
    pub fn tick_second(&self) -> Option<u64> {
        self.checkpoint.filter(|_| self.resumes).map(|(_, cp)| cp.tick_second)
    }

    pub fn is_live(&self, slot: &PlacedSlot) -> bool {
        self.tick_second().is_some_and(|tick| geometry::slot_is_live(slot.level, slot.slot.window, tick))
    }

    /// Whether the checkpoint was written by a clean close (nothing runs the store).
    pub fn clean(&self) -> bool {
        self.checkpoint.is_some_and(|(_, cp)| cp.clean)
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

/// Reads the chains of live slots. A running store deletes the timer-log
/// files that no chain a restart could read reaches, judged by its newest
/// checkpoints; so when a chain of a slot live at the checkpoint read first
/// reaches a deleted file, the checkpoint is read again: if the slot is
/// stale by the newest one now, the store moved on while we read (not a
/// problem), otherwise the chain is broken.
pub struct LiveChains<'a> {
    files: &'a StoreFiles,
    resume: Resume,
    /// The checkpoint read again, once needed.
    later: Option<Resume>,
}

impl<'a> LiveChains<'a> {
    pub fn new(files: &'a StoreFiles, resume: &Resume) -> Self {
        Self { files, resume: *resume, later: None }
    }

    /// The whole chain of a slot live at the first checkpoint, newest first;
    /// `Ok(None)` if a live store has made it stale since and deleted some of it.
    pub fn chain(
        &mut self,
        wheel: &WheelFile,
        slot: &PlacedSlot,
        logs: &impl Entries,
    ) -> Result<Option<Vec<(u64, TimerEntry)>>> {
        let chain = read_chain(wheel, slot, logs)?;
        if chain.deleted_from.is_some() && !self.resume.clean() {
            if self.later.is_none() {
                self.later = Some(Resume::new(self.files, &CheckpointFile::read(self.files)?)?);
            }
            if self.later.as_ref().is_some_and(|later| !later.is_live(slot)) {
                return Ok(None);
            }
        }
        whole_chain(chain, wheel, slot, logs).map(Some)
    }
}

/// Message offsets in the chains of live slots: timers, and cancel entries.
#[derive(Debug, Default)]
pub struct Membership {
    pub timers: HashSet<u64>,
    pub cancel_entries: HashSet<u64>,
}

impl Membership {
    /// Walks the chain of every live slot, through the timer log of its level.
    pub fn of(files: &StoreFiles, wheel: &WheelFile, logs: &LoadedLogs, resume: &Resume) -> Result<Self> {
        let mut out = Self::default();
        let mut chains = LiveChains::new(files, resume);
        for slot in live_slots(wheel, resume)? {
            let Some(chain) = chains.chain(wheel, &slot, logs)? else { continue };
            for (_, entry) in chain {
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
