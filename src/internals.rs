//! The on-disk format's own codecs and layout rules, for tools that read a
//! store without opening it (`tools/wheel-dump`). Not a stable API: it is
//! the engine's own vocabulary, exposed so a tool and the store cannot
//! disagree about a byte or a rule. Behind the `internals` feature.
//!
//! Everything here decodes bytes the caller read (with plain `pread`s, no
//! maps, no lock) and never panics on bad bytes: a slice that is too short or
//! bytes that fail their checks give a [`CorruptionKind`](crate::CorruptionKind).

pub use crate::format::{
    CANCEL_LEDGER_MAGIC, COMMITLOG_MAGIC, COMMITLOG_VERSION, CONSUME_QUEUE_MAGIC, DEDUP_INDEX_MAGIC,
    FILE_HEADER_LEN, FORMAT_VERSION, FileHeader, HeaderProblem, KEY_INDEX_MAGIC, PINS_MAGIC, RELOCATED_MAGIC,
    RELOCATION_INDEX_MAGIC, SEGMENT_PENDING_MAGIC, TAILS_MAGIC, TIMER_LOG_MAGIC, TOPIC_PENDING_MAGIC,
    WHEEL_MAGIC, chain, checkpoint, consumer_offsets, key_index, layout, numbered_file_name,
    parse_numbered_file_name, pins, queue_entry, record, recorded_per_file, relocation, segment_counts,
    segment_size_on_disk, slot, tail, timer_entry, topic_counts, versions, walk,
};
pub use crate::message::validate_topic;
pub use crate::timer::geometry;
pub use crate::timer::ledger::LEDGER_ENTRIES_PER_FILE;

/// How late a schedule's occurrence may come up before its missed-run policy
/// decides (one slot): `wheel-dump audit` excuses only occurrences skipped later than this.
pub use crate::schedule::MISSED_AFTER_MS;
/// The timer an update's schedule record settles (by the store's own reading of its spec).
pub use crate::schedule::replaced_by;
/// A schedule record's spec (its `dw.schedule` property), as the store reads it.
pub use crate::schedule::{PAUSED_AT_MS, Replaced, SPEC_PROPERTY, Spec as ScheduleSpec};
