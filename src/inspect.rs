//! A stable, read-only view of every file kind in a store directory, for
//! tools that inspect a store without opening it (`tools/wheel-dump`).
//!
//! Everything here is pure decoding of bytes the caller read (with plain
//! `pread`s, no maps, no lock): it never touches the disk and never panics on
//! bad bytes — a slice that is too short or bytes that fail their checks give
//! a [`CorruptionKind`]. The decoders are the store's own (this module only
//! wraps them), so a tool and the store cannot disagree about a byte.
//! The byte ruler for all of it is `wheel-format.md`.
//!
//! The caller names the file and byte position when it reports an error:
//! the functions here know only the bytes and the position they are bound to
//! (a log offset, an entry index or a slot index).

use crate::error::CorruptionKind;
use crate::format::checkpoint::Checkpoint;
use crate::format::record::{
    self, CancelView, DeliveryView, FrameError, MessageView, RECORD_HEADER_LEN as RECORD_HEADER,
    RelocationView,
};
use crate::format::{self, HeaderProblem};
use crate::timer::geometry::{self as wheel, LEVELS};
use crate::timer::ledger;

/// Bytes of the header that starts every commit-log segment, consume-queue,
/// timer-log, cancel-ledger, wheel, relocation and segment-counts file.
pub const FILE_HEADER_LEN: usize = format::FILE_HEADER_LEN;
/// The file format version this build reads.
pub const FORMAT_VERSION: u32 = format::FORMAT_VERSION;

/// The kinds of self-identifying data files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    CommitLog,
    ConsumeQueue,
    TimerLog,
    /// `timer/cancelled/<first index>`: the cancel ledger (the timer-log layout).
    CancelLedger,
    Wheel,
    /// `commitlog/relocated/<window second>`: copies of relocated records.
    RelocationWindow,
    /// `commitlog/relocated/index`: where each relocated record's copy is.
    RelocationIndex,
    /// `timer/segment_pending`: pending timers per commit-log segment.
    SegmentPending,
    /// `timer/tails`: where each wheel slot's chain begins.
    Tails,
}

impl FileKind {
    fn magic(self) -> [u8; 8] {
        match self {
            Self::CommitLog => format::COMMITLOG_MAGIC,
            Self::ConsumeQueue => format::CONSUME_QUEUE_MAGIC,
            Self::TimerLog => format::TIMER_LOG_MAGIC,
            Self::CancelLedger => format::CANCEL_LEDGER_MAGIC,
            Self::Wheel => format::WHEEL_MAGIC,
            Self::RelocationWindow => format::RELOCATED_MAGIC,
            Self::RelocationIndex => format::RELOCATION_INDEX_MAGIC,
            Self::SegmentPending => format::SEGMENT_PENDING_MAGIC,
            Self::Tails => format::TAILS_MAGIC,
        }
    }
}

/// A checked file header.
///
/// `a`: segment size (commit log), entries per file (consume queue, timer
/// log, cancel ledger), [`WHEEL_GEOMETRY_ID`], [`RELOCATION_WINDOW_SECS`]
/// (relocation window), [`RELOCATION_ENTRY_LEN`] (relocation index) or the offset below which the
/// segment counts cover every insert, [`TAIL_RECORD_LEN`] (tails); `b`: the
/// segment's start offset, the index of the file's first entry, `0` (wheel),
/// the window's first second (relocation window), [`RELOCATION_WINDOW_SECS`]
/// (relocation index), the number of segment-count entries or
/// [`WHEEL_TOTAL_SLOTS`] (tails).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    pub kind: FileKind,
    pub version: u32,
    pub a: u64,
    pub b: u64,
}

/// Why a file header was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Wrong magic, or a header failing its checksum.
    Corrupt(CorruptionKind),
    /// A valid header of a format version this build does not read.
    UnsupportedVersion { found: u32, supported: u32 },
}

/// Decodes and checks the header at the start of a file of `kind`.
pub fn decode_file_header(bytes: &[u8], kind: FileKind) -> Result<FileHeader, HeaderError> {
    format::FileHeader::decode(bytes, kind.magic())
        .map(|h| FileHeader { kind, version: h.version, a: h.a, b: h.b })
        .map_err(|problem| match problem {
            HeaderProblem::BadMagic => HeaderError::Corrupt(CorruptionKind::BadMagic),
            HeaderProblem::BadChecksum => HeaderError::Corrupt(CorruptionKind::BadHeader),
            HeaderProblem::UnsupportedVersion(found) => {
                HeaderError::UnsupportedVersion { found, supported: FORMAT_VERSION }
            }
        })
}

/// The number a data file's name carries (20 zero-padded digits), or `None`
/// for anything else (temporary and discarded files, strays).
pub fn parse_file_number(name: &str) -> Option<u64> {
    format::parse_numbered_file_name(name)
}

// ---------------------------------------------------------------- commit log

/// Bytes of every record's frame header.
pub const RECORD_HEADER_LEN: usize = RECORD_HEADER;

/// Bytes of a delivery record.
pub const DELIVERY_RECORD_LEN: usize = record::DELIVERY_LEN;

/// What a commit-log record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    Message,
    Delivery,
    Cancel,
    /// Retention relocated a segment's pending timers and deleted the segment.
    Relocation,
    /// Filler to the end of the segment: the next record starts the next segment.
    Padding,
}

/// A record's frame header, checked for kind, version and length (not the CRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFrame {
    pub kind: RecordKind,
    /// Total length, frame included (a padding record runs to the segment's end).
    pub len: usize,
}

/// Checks the frame header at the start of `header` (at least
/// [`RECORD_HEADER_LEN`] bytes); `room` is how many bytes run from the record
/// to the end of its segment. `Ok(None)`: an all-zero header, the end of the log.
pub fn record_frame(header: &[u8], room: usize) -> Result<Option<RecordFrame>, CorruptionKind> {
    match record::check_header_in(header, room) {
        Ok(frame) => Ok(Some(RecordFrame { kind: kind_of(frame.kind), len: frame.len })),
        Err(FrameError::Empty) => Ok(None),
        Err(FrameError::Invalid(kind)) => Err(kind),
    }
}

fn kind_of(kind: record::RecordKind) -> RecordKind {
    match kind {
        record::RecordKind::Message => RecordKind::Message,
        record::RecordKind::Delivery => RecordKind::Delivery,
        record::RecordKind::Cancel => RecordKind::Cancel,
        record::RecordKind::Relocation => RecordKind::Relocation,
        record::RecordKind::Padding => RecordKind::Padding,
    }
}

/// A decoded message record (the body is not copied, only measured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRecord {
    pub store_time_ms: u64,
    /// `0`: an ordinary message; otherwise a timed one.
    pub deliver_at_ms: u64,
    pub queue_id: u32,
    /// Legacy delay level, `0` = none.
    pub delay_level: u16,
    pub topic: String,
    pub key: String,
    pub tags: String,
    pub body_len: usize,
    /// The bucket scheduler's copy of a delivered timed message (record flag
    /// bit 0): indexed into its topic at once, never a timer itself.
    pub rescheduled: bool,
}

impl MessageRecord {
    /// Whether this record is a timer: timed, and not a bucket scheduler's copy.
    pub fn is_timer(&self) -> bool {
        self.deliver_at_ms != 0 && !self.rescheduled
    }
}

/// A decoded delivery record: the timer of the message at `message_offset` fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryRecord {
    pub delivered_at_ms: u64,
    pub message_offset: u64,
}

/// A decoded cancel record: the timer of the message at `message_offset`
/// (due at `deliver_at_ms`) was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelRecord {
    pub cancelled_at_ms: u64,
    pub message_offset: u64,
    pub deliver_at_ms: u64,
}

/// A decoded relocation record: the `timers` pending timers and the
/// `cancels` cancels of timers not yet due of the segment starting at
/// `segment_base` (`bytes` of records in all) were copied to the relocation
/// area, after which the segment was deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelocationRecord {
    pub relocated_at_ms: u64,
    pub segment_base: u64,
    pub timers: u64,
    pub cancels: u64,
    pub bytes: u64,
}

/// A decoded, checksummed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Message(MessageRecord),
    Delivery(DeliveryRecord),
    Cancel(CancelRecord),
    Relocation(RelocationRecord),
    Padding,
}

/// Checks the CRC of the record at log `offset` and decodes it. `bytes` holds
/// the record's `frame.len` bytes; for padding its 12-byte header is enough
/// (its CRC covers only the header).
pub fn decode_record(bytes: &[u8], offset: u64, frame: RecordFrame) -> Result<Record, CorruptionKind> {
    let covered = if frame.kind == RecordKind::Padding { RECORD_HEADER_LEN } else { frame.len };
    let record = bytes.get(..covered).ok_or_else(|| {
        CorruptionKind::BadFrame(format!("record of {} bytes, {} available", covered, bytes.len()))
    })?;
    record::check_crc(record, offset)?;
    Ok(match frame.kind {
        RecordKind::Message => Record::Message(decode_message(record)?),
        RecordKind::Delivery => {
            let d = DeliveryView::parse(record)?;
            Record::Delivery(DeliveryRecord {
                delivered_at_ms: d.delivered_at_ms,
                message_offset: d.message_offset,
            })
        }
        RecordKind::Cancel => {
            let c = CancelView::parse(record)?;
            Record::Cancel(CancelRecord {
                cancelled_at_ms: c.cancelled_at_ms,
                message_offset: c.message_offset,
                deliver_at_ms: c.deliver_at_ms,
            })
        }
        RecordKind::Relocation => {
            let r = RelocationView::parse(record)?;
            Record::Relocation(RelocationRecord {
                relocated_at_ms: r.relocated_at_ms,
                segment_base: r.segment_base,
                timers: r.timers,
                cancels: r.cancels,
                bytes: r.bytes,
            })
        }
        RecordKind::Padding => Record::Padding,
    })
}

fn decode_message(record: &[u8]) -> Result<MessageRecord, CorruptionKind> {
    let view = MessageView::parse(record)?;
    // The topic names a directory: the dispatcher refuses what `put` could not have written.
    if crate::message::validate_topic(view.topic).is_err() {
        return Err(CorruptionKind::BadFrame(format!("message record names topic {:?}", view.topic)));
    }
    view.properties()?;
    Ok(MessageRecord {
        store_time_ms: view.store_time_ms,
        deliver_at_ms: view.timing.deliver_at_ms,
        queue_id: view.queue_id,
        delay_level: view.timing.delay_level,
        topic: view.topic.to_string(),
        key: view.key.to_string(),
        tags: view.tags.to_string(),
        body_len: view.body.len(),
        rescheduled: view.rescheduled,
    })
}

/// Where the record at or after log `offset` starts: past a segment header,
/// or at the next segment when fewer than [`RECORD_HEADER_LEN`] bytes remain.
pub fn normalize_log_offset(offset: u64, segment_size: u64) -> u64 {
    crate::commitlog::normalize(offset, segment_size)
}

// ------------------------------------------------------------- consume queue

/// Bytes per consume-queue entry.
pub const QUEUE_ENTRY_LEN: usize = crate::format::queue_entry::ENTRY_LEN;

/// One consume-queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueEntry {
    /// The record that made the message visible: the message, or a timer's delivery record.
    pub log_offset: u64,
    pub record_len: u32,
    /// CRC32C of the message's tags, `0` if none.
    pub tag_hash: u32,
    /// When the message became visible, epoch ms.
    pub time_ms: u64,
    /// Made visible by a timer's delivery record (flag bit 0).
    pub timer_delivery: bool,
    /// The raw flags field (bits other than 0 are reserved, `0`).
    pub flags: u32,
}

/// Decodes the entry at queue position `index`. `Ok(None)`: all zero, unwritten.
pub fn decode_queue_entry(bytes: &[u8], index: u64) -> Result<Option<QueueEntry>, CorruptionKind> {
    use crate::format::queue_entry::{Entry, EntryProblem, FLAG_TIMER_DELIVERY};
    if bytes.len() < QUEUE_ENTRY_LEN {
        return Err(CorruptionKind::WrongSize {
            expected: QUEUE_ENTRY_LEN as u64,
            found: bytes.len() as u64,
        });
    }
    match Entry::decode(bytes, index) {
        Ok(e) => Ok(Some(QueueEntry {
            log_offset: e.log_offset,
            record_len: e.record_len,
            tag_hash: e.tag_hash,
            time_ms: e.time_ms,
            timer_delivery: e.flags & FLAG_TIMER_DELIVERY != 0,
            flags: e.flags,
        })),
        Err(EntryProblem::Empty) => Ok(None),
        Err(EntryProblem::Checksum { stored, computed }) => {
            Err(CorruptionKind::ChecksumMismatch { stored, computed })
        }
    }
}

/// The tag hash a consume-queue entry stores for a message with `tags`.
pub fn tag_hash(tags: &str) -> u32 {
    crate::format::queue_entry::tag_hash(tags)
}

// ----------------------------------------------------------------- timer log

/// Bytes per timer-log entry.
pub const TIMER_ENTRY_LEN: usize = crate::format::timer_entry::ENTRY_LEN;

/// One timer-log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerLogEntry {
    /// The message record in the commit log.
    pub message_offset: u64,
    pub deliver_at_ms: u64,
    /// Index of the previous entry of the same slot, `0` = none.
    pub prev: u64,
    /// A cancel entry: it removes the timer of `message_offset` from its slot.
    pub cancel: bool,
}

/// Decodes timer-log entry `index`. `Ok(None)`: all zero, unwritten.
pub fn decode_timer_entry(bytes: &[u8], index: u64) -> Result<Option<TimerLogEntry>, CorruptionKind> {
    let entry = crate::format::timer_entry::TimerEntry::decode(bytes, index)?;
    Ok(entry.map(|e| TimerLogEntry {
        message_offset: e.message_offset,
        deliver_at_ms: e.deliver_at_ms,
        prev: e.prev,
        cancel: e.cancel,
    }))
}

/// The near timer log's directory inside `timer/`: the chains of level-0 slots.
pub const TIMER_LOG_DIR: &str = "timerlog";
/// The far timer log's directory inside `timer/`: the chains of level-1 and level-2 slots.
pub const FAR_TIMER_LOG_DIR: &str = crate::format::layout::FAR_TIMER_LOG_DIR;

/// Which timer log the chains of `level`'s slots run through (a slot's
/// `head` and every `prev` in its chain index that log): `0` the near log
/// ([`TIMER_LOG_DIR`]) for level 0, `1` the far log ([`FAR_TIMER_LOG_DIR`])
/// for levels 1 and 2.
pub fn timer_log_of(level: usize) -> usize {
    usize::from(level > 0)
}

// ------------------------------------------------------------- cancel ledger

/// The cancel ledger's directory inside `timer/`: one entry per cancel the
/// store answered `Cancelled`, in commit-log order of the cancel records.
pub const CANCEL_LEDGER_DIR: &str = crate::format::layout::CANCEL_LEDGER_DIR;
/// Entries per cancel-ledger file (its header's `a`); entries are
/// [`TIMER_ENTRY_LEN`] bytes, laid out as in a timer log.
pub const CANCEL_LEDGER_ENTRIES_PER_FILE: u64 = ledger::LEDGER_ENTRIES_PER_FILE;

/// One cancel-ledger entry: the store answered `Cancelled` for the timer of
/// `message_offset`, due at `deliver_at_ms`, whose cancel record is at
/// `cancel_record_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelLedgerEntry {
    pub message_offset: u64,
    pub deliver_at_ms: u64,
    /// The commit-log offset of the cancel record (the timer-log `prev` field).
    pub cancel_record_offset: u64,
    /// Bit 63 of the deliver-at field, which the store sets on every entry.
    pub cancel_bit: bool,
}

/// Decodes cancel-ledger entry `index` (the timer-log layout, so the same
/// decoder and CRC). `Ok(None)`: all zero, unwritten.
pub fn decode_cancel_ledger_entry(
    bytes: &[u8],
    index: u64,
) -> Result<Option<CancelLedgerEntry>, CorruptionKind> {
    Ok(decode_timer_entry(bytes, index)?.map(|e| CancelLedgerEntry {
        message_offset: e.message_offset,
        deliver_at_ms: e.deliver_at_ms,
        cancel_record_offset: e.prev,
        cancel_bit: e.cancel,
    }))
}

// --------------------------------------------------------------- chain starts

/// The chain starts' file name, inside `timer/`.
pub const TAILS_FILE: &str = "tails";
/// Bytes per `timer/tails` record (also the header's `a`).
pub const TAIL_RECORD_LEN: usize = crate::format::tail::TAIL_LEN;
/// The `timer/tails` file's exact size: the header, then one record per wheel slot.
pub const TAILS_FILE_LEN: u64 = FILE_HEADER_LEN as u64 + WHEEL_TOTAL_SLOTS * TAIL_RECORD_LEN as u64;

/// Byte position of slot `index`'s record in `timer/tails`.
pub fn tail_position(index: u64) -> u64 {
    FILE_HEADER_LEN as u64 + index * TAIL_RECORD_LEN as u64
}

/// One `timer/tails` record: the slot's chain for `window` starts at entry
/// `first_entry` of the slot's timer log. The store uses it only while
/// `window` is the slot's window; otherwise the chain's start is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailRecord {
    pub window: u64,
    pub first_entry: u64,
}

/// Decodes the `timer/tails` record of slot `slot_index`. `Ok(None)`: all
/// zero, never written; an error: it fails its CRC (which binds it to its slot).
pub fn decode_tail_record(bytes: &[u8], slot_index: u64) -> Result<Option<TailRecord>, CorruptionKind> {
    let bytes = bytes
        .get(..TAIL_RECORD_LEN)
        .ok_or(CorruptionKind::WrongSize { expected: TAIL_RECORD_LEN as u64, found: bytes.len() as u64 })?;
    if bytes.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let (window, first_entry) = (format::get_u64(bytes, 0), format::get_u64(bytes, 8));
    // The store's own encoding of these fields, CRC included.
    let expected = crate::format::tail::encode(slot_index, window, first_entry);
    if bytes[..20] != expected[..20] {
        return Err(CorruptionKind::ChecksumMismatch {
            stored: format::get_u32(bytes, 16),
            computed: format::get_u32(&expected, 16),
        });
    }
    Ok(Some(TailRecord { window, first_entry }))
}

// --------------------------------------------------------------------- wheel

/// How many levels the wheel has.
pub const WHEEL_LEVELS: usize = LEVELS.len();
/// Bytes per slot record in the wheel file.
pub const WHEEL_SLOT_LEN: usize = crate::format::slot::SLOT_LEN;
/// Slot records in the wheel file, over all levels.
pub const WHEEL_TOTAL_SLOTS: u64 = wheel::TOTAL_SLOTS;
/// The wheel file's exact size.
pub const WHEEL_FILE_LEN: u64 = FILE_HEADER_LEN as u64 + WHEEL_TOTAL_SLOTS * WHEEL_SLOT_LEN as u64;
/// The wheel file header's `a`: the geometry the file is laid out for.
pub const WHEEL_GEOMETRY_ID: u64 = wheel::GEOMETRY_ID;

/// One wheel slot record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelSlot {
    /// The absolute window the slot holds: an epoch second on level 0,
    /// `second >> window_shift(level)` above.
    pub window: u64,
    /// Timer-log index of the chain's newest entry, `0` = none.
    pub head: u64,
    /// Entries in the chain, cancel entries included.
    pub count: u32,
    pub level: u32,
    /// How many of the `count` entries are cancel entries.
    pub cancels: u32,
}

/// Decodes slot record `slot_index` (counted over all levels). `Ok(None)`: all zero, never used.
pub fn decode_wheel_slot(bytes: &[u8], slot_index: u64) -> Result<Option<WheelSlot>, CorruptionKind> {
    if bytes.get(..WHEEL_SLOT_LEN).is_some_and(|b| b.iter().all(|&x| x == 0)) {
        return Ok(None);
    }
    let s = crate::format::slot::Slot::decode(bytes, slot_index)?;
    Ok(Some(WheelSlot { window: s.window, head: s.head, count: s.count, level: s.level, cancels: s.cancels }))
}

/// Slots of `level`.
pub fn level_slots(level: usize) -> u64 {
    LEVELS[level].slots
}

/// A slot of `level` covers `1 << window_shift(level)` seconds.
pub fn window_shift(level: usize) -> u32 {
    LEVELS[level].window_shift
}

/// The window of `level` that holds epoch second `second`.
pub fn window_of(level: usize, second: u64) -> u64 {
    second >> window_shift(level)
}

/// The first epoch second of `window` on `level`.
pub fn window_start(level: usize, window: u64) -> u64 {
    window.saturating_mul(1 << window_shift(level))
}

/// Index (over all levels) of the slot that holds `window` of `level`.
pub fn slot_index(level: usize, window: u64) -> u64 {
    wheel::slot_index(level, window)
}

/// The level and window position of slot `index` (counted over all levels), or `None` past the last slot.
pub fn slot_level(index: u64) -> Option<(usize, u64)> {
    let mut first = 0;
    for (level, l) in LEVELS.iter().enumerate() {
        if index < first + l.slots {
            return Some((level, index - first));
        }
        first += l.slots;
    }
    None
}

/// Byte position of slot `index` in the wheel file.
pub fn slot_position(index: u64) -> u64 {
    FILE_HEADER_LEN as u64 + index * WHEEL_SLOT_LEN as u64
}

/// Whether a slot holding `window` of `level` still holds timers the store
/// would load after reopening at a checkpoint with `tick_second`: a level-0
/// second from the tick second on, or a coarser window not yet cascaded.
pub fn slot_is_live(level: usize, window: u64, tick_second: u64) -> bool {
    let loaded_through = tick_second.saturating_sub(1);
    match level {
        0 => window > loaded_through,
        _ => wheel::not_yet_cascaded(level, window, loaded_through),
    }
}

/// Pending timers per level from the entry counts of live slots and how many
/// of those entries are cancel entries: a cancel entry removes one timer on
/// its own level or a coarser one (where the timer waits to be cascaded).
/// This is how the store's own `Stats::pending_per_level` counts.
pub fn net_pending(entries: [u64; WHEEL_LEVELS], cancels: [u64; WHEEL_LEVELS]) -> [u64; WHEEL_LEVELS] {
    wheel::net_pending(entries, cancels)
}

/// How far ahead [`crate::HORIZON_LABELS`]' first five buckets reach, in ms.
pub const HORIZONS_MS: [u64; 5] = crate::timer::tick::HORIZONS_MS;

// ---------------------------------------------------------- relocation area

/// The relocation area's directory, inside `commitlog/`.
pub const RELOCATED_DIR: &str = crate::format::layout::RELOCATED_DIR;
/// The relocation index's file name, inside [`RELOCATED_DIR`].
pub const RELOCATION_INDEX_FILE: &str = "index";
/// Seconds of deliver time one relocation window file covers.
pub const RELOCATION_WINDOW_SECS: u64 = crate::format::relocation::WINDOW_SECS;
/// Bytes per relocation index entry.
pub const RELOCATION_ENTRY_LEN: usize = crate::format::relocation::INDEX_ENTRY_LEN;

/// One relocation index entry: the copy of the record at `original_offset`
/// is `len` bytes at `position` of the window file of `deliver_at_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelocationEntry {
    pub original_offset: u64,
    /// Of the timer, or of the cancelled timer: names the window file.
    pub deliver_at_ms: u64,
    /// Byte position of the copy in its window file.
    pub position: u64,
    pub len: u32,
}

impl RelocationEntry {
    /// The first second of the window whose file holds the copy (the file's name).
    pub fn window(&self) -> u64 {
        relocation_window_of(self.deliver_at_ms)
    }
}

/// Decodes the relocation index entry stored at byte `position` of the
/// index file (its CRC binds it there).
pub fn decode_relocation_entry(bytes: &[u8], position: u64) -> Result<RelocationEntry, CorruptionKind> {
    let e = crate::format::relocation::IndexEntry::decode(bytes, position)?;
    Ok(RelocationEntry {
        original_offset: e.original_offset,
        deliver_at_ms: e.deliver_at_ms,
        position: e.position,
        len: e.len,
    })
}

/// The first second of the relocation window that holds copies due at `deliver_at_ms`.
pub fn relocation_window_of(deliver_at_ms: u64) -> u64 {
    crate::format::relocation::window_of(deliver_at_ms)
}

// ------------------------------------------------------------ segment counts

/// The segment counts' file name, inside `timer/`.
pub const SEGMENT_PENDING_FILE: &str = crate::format::layout::SEGMENT_COUNTS_FILE;

/// The per-segment pending-timer counts (`timer/segment_pending`), an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentPendingCounts {
    /// Every timer's insert below this commit-log offset is counted.
    pub covered_below: u64,
    /// Segments holding pending timers (or cancels of timers not yet due):
    /// (segment start offset, count). Segments not listed hold none.
    pub segments: Vec<(u64, u64)>,
}

/// Decodes a whole `timer/segment_pending` file of a log with `segment_size`
/// segments. Check its header first with [`decode_file_header`]
/// ([`FileKind::SegmentPending`]): an error here is about the bytes after
/// the header (they fail their checksum or do not fit the file).
pub fn decode_segment_pending(
    bytes: &[u8],
    segment_size: u64,
) -> Result<SegmentPendingCounts, CorruptionKind> {
    let (counts, covered_below) = crate::durable::SegmentCounts::decode(bytes, segment_size.max(1))
        .ok_or_else(|| {
            CorruptionKind::BadFrame("segment counts that fail their checksum or do not fit the file".into())
        })?;
    Ok(SegmentPendingCounts { covered_below, segments: counts.iter().collect() })
}

// ---------------------------------------------------------------- checkpoint

/// Byte positions of the checkpoint file's two slots.
pub const CHECKPOINT_SLOT_POSITIONS: [u64; 2] = crate::format::checkpoint::SLOT_POSITIONS;
/// Bytes of one checkpoint slot.
pub const CHECKPOINT_SLOT_LEN: usize = crate::format::checkpoint::SLOT_LEN;
/// The checkpoint file's size.
pub const CHECKPOINT_FILE_LEN: u64 = crate::format::checkpoint::FILE_LEN;

/// Decodes one checkpoint slot. `Ok(None)`: all zero, never written; an
/// error: torn, damaged or of another version.
pub fn decode_checkpoint_slot(bytes: &[u8]) -> Result<Option<Checkpoint>, CorruptionKind> {
    if bytes.get(..CHECKPOINT_SLOT_LEN).is_some_and(|b| b.iter().all(|&x| x == 0)) {
        return Ok(None);
    }
    Checkpoint::check(bytes).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_or_garbage_bytes_are_errors_not_panics() {
        for len in [0, 1, 11, 27, 31, 95] {
            let bytes = vec![0xA5u8; len];
            assert!(decode_file_header(&bytes, FileKind::Wheel).is_err());
            assert!(record_frame(&bytes, len).is_err());
            assert!(decode_queue_entry(&bytes, 1).is_err());
            assert!(decode_timer_entry(&bytes, 1).is_err());
            assert!(decode_wheel_slot(&bytes, 1).is_err());
            assert!(decode_checkpoint_slot(&bytes).is_err());
        }
        let frame = RecordFrame { kind: RecordKind::Message, len: 100 };
        assert!(decode_record(&[1u8; 20], 32, frame).is_err());
    }

    #[test]
    fn zeros_are_unwritten() {
        let zeros = [0u8; 128];
        assert_eq!(record_frame(&zeros, 128), Ok(None));
        assert_eq!(decode_queue_entry(&zeros, 1), Ok(None));
        assert_eq!(decode_timer_entry(&zeros, 1), Ok(None));
        assert_eq!(decode_wheel_slot(&zeros, 1), Ok(None));
        assert_eq!(decode_checkpoint_slot(&zeros), Ok(None));
    }

    #[test]
    fn slot_geometry_matches_wheel_format_md() {
        // wheel-format.md: first_slot is 0, 65,600, 73,792; 75,840 slots in all.
        assert_eq!([0, 1, 2].map(|l| slot_index(l, 0)), [0, 65_600, 73_792]);
        assert_eq!(WHEEL_TOTAL_SLOTS, 75_840);
        assert_eq!(slot_level(65_599), Some((0, 65_599)));
        assert_eq!(slot_level(65_600), Some((1, 0)));
        assert_eq!(slot_level(75_839), Some((2, 2047)));
        assert_eq!(slot_level(75_840), None);
        assert_eq!(slot_position(3), 32 + 3 * 32);
        assert_eq!(window_of(1, 1 << 15), 1);
        assert_eq!(window_start(2, 1), 1 << 27);
        // A level-0 second is live from the tick second on.
        assert!(slot_is_live(0, 100, 100) && !slot_is_live(0, 99, 100));
    }

    #[test]
    fn relocation_entries_and_segment_counts_decode_what_the_store_encodes() {
        let entry = crate::format::relocation::IndexEntry {
            original_offset: 0x40,
            deliver_at_ms: 1_000,
            position: 32,
            len: 100,
        };
        let decoded = decode_relocation_entry(&entry.encode(32), 32).unwrap();
        assert_eq!(
            decoded,
            RelocationEntry { original_offset: 0x40, deliver_at_ms: 1_000, position: 32, len: 100 }
        );
        assert_eq!(decoded.window(), 0);
        assert!(decode_relocation_entry(&entry.encode(32), 64).is_err(), "bound to its position");
        assert!(decode_relocation_entry(&[0u8; 31], 32).is_err());
        assert_eq!(relocation_window_of(1_800_000_000_000), 1_800_000_000 - 1_800_000_000 % (1 << 20));

        let mut counts = crate::durable::SegmentCounts::new(1000);
        counts.indexed(1_500, 10, true);
        counts.indexed(5_500, 20, false);
        let bytes = counts.encode(6_000);
        let header = decode_file_header(&bytes, FileKind::SegmentPending).unwrap();
        assert_eq!((header.a, header.b), (6_000, 2));
        let decoded = decode_segment_pending(&bytes, 1000).unwrap();
        assert_eq!(
            decoded,
            SegmentPendingCounts { covered_below: 6_000, segments: vec![(1_000, 1), (5_000, 1)] }
        );
        let mut flipped = bytes.clone();
        flipped[FILE_HEADER_LEN + 20] ^= 1;
        assert!(decode_segment_pending(&flipped, 1000).is_err());
        assert!(decode_segment_pending(&bytes[..bytes.len() - 1], 1000).is_err());
    }

    #[test]
    fn cancel_ledger_entries_decode_what_the_store_encodes() {
        // wheel-format.md's example: message 32 due at 1,700,000,001,000, cancel record 4096, entry 1.
        let entry = crate::format::timer_entry::TimerEntry {
            message_offset: 32,
            deliver_at_ms: 1_700_000_001_000,
            prev: 4096,
            cancel: true,
        };
        let bytes = entry.encode(1);
        assert_eq!(format::hex(&bytes[8..16]), "e86be5cf8b010080", "bit 63 set");
        let want = CancelLedgerEntry {
            message_offset: 32,
            deliver_at_ms: 1_700_000_001_000,
            cancel_record_offset: 4096,
            cancel_bit: true,
        };
        assert_eq!(decode_cancel_ledger_entry(&bytes, 1), Ok(Some(want)));
        assert!(decode_cancel_ledger_entry(&bytes, 2).is_err(), "bound to its index");
        assert_eq!(decode_cancel_ledger_entry(&[0u8; 28], 1), Ok(None));

        let header = format::FileHeader::new(format::CANCEL_LEDGER_MAGIC, CANCEL_LEDGER_ENTRIES_PER_FILE, 0);
        let header = header.encode();
        assert_eq!(&header[..8], b"DWCNCL\0\0");
        let decoded = decode_file_header(&header, FileKind::CancelLedger).unwrap();
        assert_eq!((decoded.a, decoded.b), (65_536, 0), "wheel-format.md: a = 65,536 entries per file");
        assert!(decode_file_header(&header, FileKind::TimerLog).is_err(), "not a timer log");
        assert_eq!(CANCEL_LEDGER_DIR, "cancelled");
    }

    #[test]
    fn tail_records_decode_what_the_store_encodes() {
        let bytes = crate::format::tail::encode(5, 1_700_000_000, 42);
        let header = format::FileHeader::new(format::TAILS_MAGIC, TAIL_RECORD_LEN as u64, WHEEL_TOTAL_SLOTS);
        let header = decode_file_header(&header.encode(), FileKind::Tails).unwrap();
        assert_eq!((header.a, header.b), (24, 75_840), "wheel-format.md: a = 24, b = the slot count");
        assert_eq!(TAILS_FILE_LEN, 32 + 24 * 75_840);
        assert_eq!(tail_position(5), 32 + 5 * 24);
        assert_eq!(
            decode_tail_record(&bytes, 5),
            Ok(Some(TailRecord { window: 1_700_000_000, first_entry: 42 }))
        );
        assert!(decode_tail_record(&bytes, 6).is_err(), "bound to its slot");
        let mut flipped = bytes;
        flipped[9] ^= 1;
        assert!(matches!(decode_tail_record(&flipped, 5), Err(CorruptionKind::ChecksumMismatch { .. })));
        assert_eq!(decode_tail_record(&[0u8; 24], 5), Ok(None));
        assert!(decode_tail_record(&bytes[..23], 5).is_err());
        assert_eq!([0, 1, 2].map(timer_log_of), [0, 1, 1]);
    }

    #[test]
    fn decodes_what_the_store_encodes() {
        let slot =
            crate::format::slot::Slot { window: 1_700_000_000, head: 5, count: 2, level: 0, cancels: 1 };
        let decoded = decode_wheel_slot(&slot.encode(3), 3).unwrap().unwrap();
        assert_eq!((decoded.window, decoded.head, decoded.count, decoded.cancels), (1_700_000_000, 5, 2, 1));
        assert!(decode_wheel_slot(&slot.encode(3), 4).is_err(), "bound to its index");

        let mut delivery = [0u8; record::DELIVERY_LEN];
        record::encode_delivery(&mut delivery, 4096, 7, 32);
        let frame = record_frame(&delivery, 1000).unwrap().unwrap();
        assert_eq!(frame, RecordFrame { kind: RecordKind::Delivery, len: delivery.len() });
        assert_eq!(
            decode_record(&delivery, 4096, frame),
            Ok(Record::Delivery(DeliveryRecord { delivered_at_ms: 7, message_offset: 32 }))
        );
        assert!(decode_record(&delivery, 4097, frame).is_err(), "bound to its offset");
        assert!(record_frame(&delivery, 20).is_err(), "does not fit the room left");
    }
}
