//! A consume-queue entry (32 bytes): where a message a consumer may read
//! is in the commit log. `wheel-format.md` ("Consume queue") is the byte ruler.

use crate::error::CorruptionKind;
use crate::format::{crc_at, get_u32, get_u64, put_u32, put_u64};

/// Entry flag: the message was made visible by its timer (a delivery record).
pub const FLAG_TIMER_DELIVERY: u32 = 1;
/// Entry flag (with [`FLAG_TIMER_DELIVERY`]): the entry points at a
/// deliveries record, which names its timer's record at the index in the
/// flags' top 16 bits ([`batch_flags`], [`Entry::batch_index`]).
pub const FLAG_IN_BATCH: u32 = 2;
const BATCH_INDEX_SHIFT: u32 = 16;

/// The topic of the consumers' positions messages: reserved, no queue indexes it.
pub const POSITIONS_TOPIC: &str = "%POSITIONS%";

/// Whether a message record gets an entry, where it lies, in its topic's
/// queue: every message that is not `timed` (a timed one gets its entry
/// from the record that delivers it), but the consumers' positions, which
/// the open replays and no consumer reads. The dispatcher indexes by it,
/// a consumer repairing its queue and `wheel-dump verify` judge by it.
pub fn indexed_as_sent(topic: &str, timed: bool) -> bool {
    !timed && topic != POSITIONS_TOPIC
}

/// The flags of the entry for timer `index` of a deliveries record.
pub fn batch_flags(index: usize) -> u32 {
    debug_assert!(index <= u16::MAX as usize, "a deliveries record names at most 65,535 timers");
    FLAG_TIMER_DELIVERY | FLAG_IN_BATCH | ((index as u32) << BATCH_INDEX_SHIFT)
}

/// Bytes per consume-queue entry.
pub const ENTRY_LEN: usize = 32;

const LOG_OFFSET: usize = 0;
const RECORD_LEN: usize = LOG_OFFSET + 8;
const TAG_HASH: usize = RECORD_LEN + 4;
const TIME: usize = TAG_HASH + 4;
const FLAGS: usize = TIME + 8;
const CRC: usize = FLAGS + 4;
const _: () = assert!(CRC + 4 == ENTRY_LEN);

/// One consume-queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Offset of the message record in the commit log (never 0: offset 0 is a file header).
    pub log_offset: u64,
    /// Length of that record.
    pub record_len: u32,
    /// CRC32C of the message's tags, 0 if it has none: lets a consumer filter without reading the log.
    pub tag_hash: u32,
    /// When the message became visible: its store time, or its delivery time for a timer.
    pub time_ms: u64,
    /// Bit 0: made visible by a timer's delivery record. Bit 1: that record
    /// is a deliveries record, and bits 16..32 say which of its timers.
    /// Other bits 0.
    pub flags: u32,
}

impl Entry {
    /// Encodes the entry that sits at queue position `index`; the CRC binds it there.
    pub fn encode(&self, index: u64) -> [u8; ENTRY_LEN] {
        let mut out = [0u8; ENTRY_LEN];
        put_u64(&mut out, LOG_OFFSET, self.log_offset);
        put_u32(&mut out, RECORD_LEN, self.record_len);
        put_u32(&mut out, TAG_HASH, self.tag_hash);
        put_u64(&mut out, TIME, self.time_ms);
        put_u32(&mut out, FLAGS, self.flags);
        let crc = crc_at(index, &out[..CRC]);
        put_u32(&mut out, CRC, crc);
        out
    }

    /// Decodes the entry at `index`; `None` if it is empty or fails its CRC.
    pub fn decode(bytes: &[u8], index: u64) -> std::result::Result<Self, EntryProblem> {
        let bytes = bytes.get(..ENTRY_LEN).ok_or(EntryProblem::Empty)?;
        if bytes.iter().all(|&b| b == 0) {
            return Err(EntryProblem::Empty);
        }
        let stored = get_u32(bytes, CRC);
        let computed = crc_at(index, &bytes[..CRC]);
        if stored != computed {
            return Err(EntryProblem::Checksum { stored, computed });
        }
        Ok(Self {
            log_offset: get_u64(bytes, LOG_OFFSET),
            record_len: get_u32(bytes, RECORD_LEN),
            tag_hash: get_u32(bytes, TAG_HASH),
            time_ms: get_u64(bytes, TIME),
            flags: get_u32(bytes, FLAGS),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// Why bytes are not an entry.
pub enum EntryProblem {
    /// All zero or short: unwritten.
    Empty,
    /// It fails its CRC.
    Checksum {
        /// The CRC the bytes carry.
        stored: u32,
        /// The CRC they hash to at this index.
        computed: u32,
    },
}

impl Entry {
    /// Whether the message was made visible by its timer's delivery record.
    pub fn timer_delivery(&self) -> bool {
        self.flags & FLAG_TIMER_DELIVERY != 0
    }

    /// Which timer of the deliveries record it points at, if it points at one.
    pub fn batch_index(&self) -> Option<usize> {
        (self.flags & FLAG_IN_BATCH != 0).then_some((self.flags >> BATCH_INDEX_SHIFT) as usize)
    }
}

/// Decodes the entry at queue position `index`: `Ok(None)` if it is all zero
/// (unwritten), an error if it is short or fails its CRC.
pub fn decode_entry(bytes: &[u8], index: u64) -> std::result::Result<Option<Entry>, CorruptionKind> {
    if bytes.len() < ENTRY_LEN {
        return Err(CorruptionKind::WrongSize { expected: ENTRY_LEN as u64, found: bytes.len() as u64 });
    }
    match Entry::decode(bytes, index) {
        Ok(entry) => Ok(Some(entry)),
        Err(EntryProblem::Empty) => Ok(None),
        Err(EntryProblem::Checksum { stored, computed }) => {
            Err(CorruptionKind::ChecksumMismatch { stored, computed })
        }
    }
}

/// The tag hash stored in entries.
pub fn tag_hash(tags: &str) -> u32 {
    if tags.is_empty() { 0 } else { crc32c::crc32c(tags.as_bytes()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::hex;

    fn entry(log_offset: u64) -> Entry {
        Entry { log_offset, record_len: 100, tag_hash: 0, time_ms: 5, flags: 0 }
    }

    #[test]
    fn golden_bytes_match_wheel_format_md() {
        let e = Entry { log_offset: 32, record_len: 58, tag_hash: 0, time_ms: 1_700_000_000_000, flags: 0 };
        assert_eq!(
            hex(&e.encode(0)),
            concat!("2000000000000000", "3a000000", "00000000", "0068e5cf8b010000", "00000000", "425e50b6")
        );
    }

    #[test]
    fn a_batched_entry_says_which_timer_of_its_record() {
        for index in [0, 1, 255, 65_535] {
            let e = Entry { flags: batch_flags(index), ..entry(64) };
            assert!(e.timer_delivery());
            assert_eq!(e.batch_index(), Some(index));
        }
        assert_eq!(Entry { flags: FLAG_TIMER_DELIVERY, ..entry(64) }.batch_index(), None);
        // Entry 3 of a deliveries record at offset 4096 of 3,105 bytes (wheel-format.md).
        let e = Entry {
            log_offset: 4096,
            record_len: 3105,
            tag_hash: 0,
            time_ms: 1_700_000_001_000,
            flags: batch_flags(3),
        };
        assert_eq!(&hex(&e.encode(0))[48..56], "03000300");
    }

    #[test]
    fn entries_are_bound_to_their_index() {
        let bytes = entry(64).encode(7);
        assert_eq!(Entry::decode(&bytes, 7), Ok(entry(64)));
        assert!(matches!(Entry::decode(&bytes, 8), Err(EntryProblem::Checksum { .. })));
        assert_eq!(Entry::decode(&[0u8; ENTRY_LEN], 7), Err(EntryProblem::Empty));
    }
}
