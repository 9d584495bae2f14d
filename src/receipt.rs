//! What a write answers: a put's [`Receipt`], the [`Handle`] that names a
//! timer, and what an [`Error::NotYetDurable`](crate::Error::NotYetDurable)
//! was about ([`Written`]). Plain values, knowing nothing of the engine, so
//! the error type can carry them.

/// What `put` returns: where the message is and when it was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    pub(crate) offset: u64,
    pub(crate) queue_id: u32,
    pub(crate) store_time_ms: u64,
    pub(crate) deliver_at_ms: Option<u64>,
    /// A put with a dedup key that wrote nothing: this is the first put's receipt.
    pub(crate) duplicate: bool,
}

impl Receipt {
    /// The commit-log offset of the message record.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The queue of its topic the message went to.
    pub fn queue_id(&self) -> u32 {
        self.queue_id
    }

    /// When the store appended it (epoch ms, by the store's clock).
    pub fn store_time_ms(&self) -> u64 {
        self.store_time_ms
    }

    /// When a timed message is due (`None` for an ordinary message).
    pub fn deliver_at_ms(&self) -> Option<u64> {
        self.deliver_at_ms
    }

    /// Whether the put wrote nothing because a message with its topic and
    /// dedup key stands (see [`Message::dedup_key`](crate::Message::dedup_key)):
    /// the receipt is then that message's, the first put's.
    pub fn is_duplicate(&self) -> bool {
        self.duplicate
    }

    /// The handle that cancels this message's timer (`None` for an ordinary message).
    pub fn handle(&self) -> Option<Handle> {
        self.deliver_at_ms.map(|deliver_at_ms| Handle { offset: self.offset, deliver_at_ms })
    }
}

/// Names a timer: its message record and its deliver time, so a cancel lands
/// where the timer is. Small and serialisable: 16 bytes, or text `offset@deliver_at_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    /// The commit-log offset of the timed message record.
    pub offset: u64,
    /// When the timer is due (epoch ms): with the offset, it names exactly one timer.
    pub deliver_at_ms: u64,
}

impl Handle {
    /// The handle as 16 bytes (offset then deliver time, little-endian).
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..].copy_from_slice(&self.deliver_at_ms.to_le_bytes());
        out
    }

    /// The inverse of [`to_bytes`](Self::to_bytes). Any 16 bytes make a
    /// handle; one that names no timer is answered `NotFound` by cancel.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        let (offset, at) = bytes.split_at(8);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        Self { offset: word(offset), deliver_at_ms: word(at) }
    }
}

impl std::fmt::Display for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.offset, self.deliver_at_ms)
    }
}

/// What an [`Error::NotYetDurable`](crate::Error::NotYetDurable) was about: the write took effect, only
/// its durability is pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// A put: the message is at the receipt's offset (and its handle, for a timer, cancels it).
    Put(Receipt),
    /// A batch put: every message stands, at its receipt's offset, in input order.
    Batch(Vec<Receipt>),
    /// A cancel answered `Cancelled` in memory: the timer will not fire
    /// unless a power loss takes the cancel record.
    Cancel(Handle),
    /// A reschedule answered `Rescheduled` in memory: the timer fires at
    /// the new time, unless a power loss takes the reschedule record (then
    /// at the old one).
    Reschedule(Handle),
    /// Consumer positions recorded in the log: they hold in memory, and
    /// after a crash unless a power loss takes their record first (then
    /// the group reads those messages again).
    Positions,
}

impl std::fmt::Display for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Put(receipt) => write!(f, "the message put at commit-log offset {}", receipt.offset),
            Self::Batch(receipts) => match (receipts.first(), receipts.last()) {
                (Some(first), Some(last)) => write!(
                    f,
                    "the batch of {} messages put at commit-log offsets {} to {}",
                    receipts.len(),
                    first.offset,
                    last.offset
                ),
                _ => write!(f, "an empty batch"),
            },
            Self::Cancel(handle) => write!(f, "the cancel of timer {handle}"),
            Self::Reschedule(handle) => write!(f, "the reschedule of timer {handle}"),
            Self::Positions => write!(f, "the consumer positions"),
        }
    }
}

/// What [`Store::schedule`](crate::Store::schedule) returns: where the
/// schedule's record is, and its handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleReceipt {
    pub(crate) receipt: Receipt,
}

impl ScheduleReceipt {
    /// The handle that names the schedule: `cancel_schedule` takes it, and
    /// each occurrence a consumer reads carries it.
    pub fn handle(&self) -> Handle {
        Handle { offset: self.receipt.offset, deliver_at_ms: self.first_occurrence_ms() }
    }

    /// When its first occurrence is due (epoch ms).
    pub fn first_occurrence_ms(&self) -> u64 {
        self.receipt.deliver_at_ms.unwrap_or_default()
    }

    /// The put's receipt of the schedule's record.
    pub fn receipt(&self) -> &Receipt {
        &self.receipt
    }

    /// Whether nothing was written because a schedule (or message) of the
    /// template's topic and dedup key stands: this is its receipt.
    pub fn is_duplicate(&self) -> bool {
        self.receipt.duplicate
    }
}

/// What [`Store::update_schedule`](crate::Store::update_schedule) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateOutcome {
    /// Replaced: the old schedule delivers nothing more (its handle answers
    /// as a cancelled schedule's), and this one, with a new handle, goes on
    /// from the first occurrence of its recurrence from now.
    Updated(ScheduleReceipt),
    /// The schedule is over (its limit or its end): nothing was written.
    Over,
    /// The schedule was cancelled (or replaced before): nothing was written.
    Cancelled,
    /// No recurring schedule with this handle.
    NotFound,
}

/// What [`Store::put_replacing`](crate::Store::put_replacing) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaceOutcome {
    /// A timer with the message's topic and dedup key was pending: this
    /// message took its place, by one record. The old timer (`replaced`,
    /// now answering `Cancelled`) never fires; this one, with a handle of its
    /// own, fires once.
    Replaced {
        /// The new message's.
        receipt: Receipt,
        /// The handle of the timer it replaced.
        replaced: Handle,
    },
    /// None was pending: the message was put, as by `put`.
    Put(Receipt),
}

impl ReplaceOutcome {
    /// The receipt of the message written.
    pub fn receipt(&self) -> Receipt {
        match self {
            Self::Replaced { receipt, .. } | Self::Put(receipt) => *receipt,
        }
    }
}

/// One occurrence of a recurring schedule, as a consumer reads it (see
/// [`ConsumedMessage::occurrence`](crate::ConsumedMessage::occurrence)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occurrence {
    /// The schedule's handle (as [`ScheduleReceipt::handle`] gave it).
    pub schedule: Handle,
    /// Which occurrence this is: 1 for the first delivered, counting
    /// delivered occurrences only (a missed one the schedule skipped has none).
    pub number: u64,
    /// When the next occurrence is due (epoch ms); `None` if this is the last.
    pub next_at_ms: Option<u64>,
}
