//! Pins: the messages whose timer was rescheduled, with the timer that
//! counts now (the latest reschedule record's) and when it is due.
//!
//! A rescheduled timer is named by its reschedule record and needs its
//! message until it fires, however long after the message's own deliver
//! time that is; retention goes by deliver times, so it asks here: a pinned
//! message is relocated, and its copy's window kept, by the pin's time.
//!
//! The pins are the cancel ledger's reschedule entries (each message's
//! latest), read from the ledger when the ticking thread starts and kept up
//! to date by it as it writes them: nothing of them is on disk but the
//! ledger. A pin stays after its timer fired or was cancelled (the ledger
//! does not know deliveries), which only keeps its message until the pin's
//! time has passed retention's `needed_from`; it goes with its ledger file.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use crate::sync::Locked;

/// The timer a pinned message's handle reaches now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pin {
    /// The reschedule record whose timer it is.
    pub timer: u64,
    /// When it is due.
    pub deliver_at_ms: u64,
}

/// The pins, shared by the ticking thread (which writes them) and retention.
#[derive(Debug, Default)]
pub(crate) struct Pins(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// Read from the ledger since the ticking thread started: until then
    /// retention deletes nothing.
    ready: bool,
    by_message: BTreeMap<u64, Pin>,
}

impl Pins {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.0.locked()
    }

    /// Every pin, read whole from the ledger.
    pub fn replace_all(&self, by_message: BTreeMap<u64, Pin>) {
        *self.inner() = Inner { ready: true, by_message };
    }

    /// Whether the pins were read from the ledger.
    pub fn ready(&self) -> bool {
        self.inner().ready
    }

    /// The message at `message_offset` is now due as `pin` says.
    pub fn set(&self, message_offset: u64, pin: Pin) {
        self.inner().by_message.insert(message_offset, pin);
    }

    pub fn get(&self, message_offset: u64) -> Option<Pin> {
        self.inner().by_message.get(&message_offset).copied()
    }

    /// The pins of messages in `messages` due at or after `from_ms`.
    pub fn due_from(&self, messages: Range<u64>, from_ms: u64) -> Vec<(u64, Pin)> {
        let inner = self.inner();
        let found = inner.by_message.range(messages).filter(|(_, pin)| pin.deliver_at_ms >= from_ms);
        found.map(|(&message, &pin)| (message, pin)).collect()
    }
}
