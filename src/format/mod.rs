//! Shared pieces of every on-disk layout: little-endian field helpers and the
//! 32-byte self-identifying header that starts every data file.
//!
//! `wheel-format.md` is the byte ruler for everything here; the golden-bytes
//! tests at the bottom keep the two in step.

use std::path::Path;

use crate::error::{CorruptionKind, Error, Result};

pub mod chain;
pub mod checkpoint;
pub mod consumer_offsets;
pub mod key_index;
pub mod layout;
pub mod pins;
pub mod queue_entry;
pub mod record;
pub mod relocation;
pub mod segment_counts;
pub mod slot;
pub mod tail;
pub mod timer_entry;
pub mod topic_counts;
pub mod walk;

/// Size of the header at the start of every commit-log segment and consume-queue file.
pub const FILE_HEADER_LEN: usize = 32;

// Offsets inside the file header, chained so nothing shifts silently.
const MAGIC_OFFSET: usize = 0;
const VERSION_OFFSET: usize = MAGIC_OFFSET + 8;
const FIELD_A_OFFSET: usize = VERSION_OFFSET + 4;
const FIELD_B_OFFSET: usize = FIELD_A_OFFSET + 8;
const HEADER_CRC_OFFSET: usize = FIELD_B_OFFSET + 8;
const _: () = assert!(HEADER_CRC_OFFSET + 4 == FILE_HEADER_LEN);

/// Magic of a commit-log segment file.
pub const COMMITLOG_MAGIC: [u8; 8] = *b"DWCLOG\0\0";
/// Magic of a consume-queue file.
pub const CONSUME_QUEUE_MAGIC: [u8; 8] = *b"DWCQUE\0\0";
/// Magic of a timer-log file.
pub const TIMER_LOG_MAGIC: [u8; 8] = *b"DWTLOG\0\0";
/// Magic of the cancel ledger's files (the timer-log layout).
pub const CANCEL_LEDGER_MAGIC: [u8; 8] = *b"DWCNCL\0\0";
/// Magic of the wheel file.
pub const WHEEL_MAGIC: [u8; 8] = *b"DWWHEL\0\0";
/// Magic of a relocation-area window file (copies of relocated timers).
pub const RELOCATED_MAGIC: [u8; 8] = *b"DWRELO\0\0";
/// Magic of the relocation area's index.
pub const RELOCATION_INDEX_MAGIC: [u8; 8] = *b"DWRIDX\0\0";
/// Magic of `timer/tails`, where each wheel slot's chain begins.
pub const TAILS_MAGIC: [u8; 8] = *b"DWTAIL\0\0";
/// Magic of `timer/segment_pending`, the per-segment pending-timer counts.
pub const SEGMENT_PENDING_MAGIC: [u8; 8] = *b"DWSPND\0\0";
/// Magic of a key-index file (`index/keys/`).
pub const KEY_INDEX_MAGIC: [u8; 8] = *b"DWKEYS\0\0";
/// Magic of a dedup-index file (`index/dedup/`).
pub const DEDUP_INDEX_MAGIC: [u8; 8] = *b"DWDEDUP\0";
/// Magic of `index/topic_pending`, the pending timers per topic.
pub const TOPIC_PENDING_MAGIC: [u8; 8] = *b"DWTOPC\0\0";
/// Magic of `timer/pins`, the snapshot of the cancel ledger's reschedule entries.
pub const PINS_MAGIC: [u8; 8] = *b"DWPINS\0\0";
/// The format version of every file but commit-log segments: the only one
/// this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// The format version of the commit-log segments this build writes: version
/// 2 segments may hold deliveries records (kind 7), version 3 segments
/// occurrences records (kind 8). It reads versions 1 and 2 too.
pub const COMMITLOG_VERSION: u32 = 3;

/// The format versions this build reads for files of kind `magic`; it writes the last.
pub fn versions(magic: [u8; 8]) -> std::ops::RangeInclusive<u32> {
    if magic == COMMITLOG_MAGIC { 1..=COMMITLOG_VERSION } else { FORMAT_VERSION..=FORMAT_VERSION }
}

/// The header that makes a data file self-identifying: magic, format version,
/// two kind-specific numbers and a CRC32C over the first 28 bytes.
///
/// * commit log: `a` = segment size in bytes, `b` = the segment's start offset;
/// * consume queue: `a` = entries per file, `b` = index of the file's first entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// Which kind of file this is.
    pub magic: [u8; 8],
    /// The format version it was written with.
    pub version: u32,
    /// Kind-specific (see above).
    pub a: u64,
    /// Kind-specific (see above).
    pub b: u64,
}

/// Why a file header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderProblem {
    /// The file does not start with the expected magic.
    BadMagic,
    /// The header fails its CRC.
    BadChecksum,
    /// A valid header of another format version.
    UnsupportedVersion(u32),
}

impl HeaderProblem {
    /// What is wrong, as corruption, or `Err(version)` for a valid header of
    /// a format version this build does not read.
    pub fn kind(self) -> std::result::Result<CorruptionKind, u32> {
        match self {
            Self::BadMagic => Ok(CorruptionKind::BadMagic),
            Self::BadChecksum => Ok(CorruptionKind::BadHeader),
            Self::UnsupportedVersion(found) => Err(found),
        }
    }
}

impl FileHeader {
    /// A header of the version this build writes for `magic` (see [`versions`]).
    pub fn new(magic: [u8; 8], a: u64, b: u64) -> Self {
        Self { magic, version: *versions(magic).end(), a, b }
    }

    /// The header's 32 bytes, CRC included.
    pub fn encode(&self) -> [u8; FILE_HEADER_LEN] {
        let mut out = [0u8; FILE_HEADER_LEN];
        out[MAGIC_OFFSET..VERSION_OFFSET].copy_from_slice(&self.magic);
        put_u32(&mut out, VERSION_OFFSET, self.version);
        put_u64(&mut out, FIELD_A_OFFSET, self.a);
        put_u64(&mut out, FIELD_B_OFFSET, self.b);
        let crc = crc32c::crc32c(&out[..HEADER_CRC_OFFSET]);
        put_u32(&mut out, HEADER_CRC_OFFSET, crc);
        out
    }

    /// Decodes and checks a header; the magic is checked first so a foreign
    /// file is named as such rather than as a checksum failure.
    pub fn decode(bytes: &[u8], magic: [u8; 8]) -> Result<Self, HeaderProblem> {
        if bytes.len() < FILE_HEADER_LEN || bytes[MAGIC_OFFSET..VERSION_OFFSET] != magic {
            return Err(HeaderProblem::BadMagic);
        }
        let stored = get_u32(bytes, HEADER_CRC_OFFSET);
        if crc32c::crc32c(&bytes[..HEADER_CRC_OFFSET]) != stored {
            return Err(HeaderProblem::BadChecksum);
        }
        let version = get_u32(bytes, VERSION_OFFSET);
        if !versions(magic).contains(&version) {
            return Err(HeaderProblem::UnsupportedVersion(version));
        }
        Ok(Self { magic, version, a: get_u64(bytes, FIELD_A_OFFSET), b: get_u64(bytes, FIELD_B_OFFSET) })
    }
}

/// Checks a file header read from `path` against what its name and the
/// configuration say; returns its format version.
pub fn check_file_header(path: &Path, bytes: &[u8], magic: [u8; 8], a: u64, b: u64) -> Result<u32> {
    let header = FileHeader::decode(bytes, magic).map_err(|problem| match problem.kind() {
        Ok(kind) => Error::corruption(path, 0, kind),
        Err(found) => {
            Error::UnsupportedVersion { file: path.to_path_buf(), found, supported: *versions(magic).end() }
        }
    })?;
    if header.a != a || header.b != b {
        let why = format!("header says ({}, {}), expected ({a}, {b})", header.a, header.b);
        return Err(Error::corruption(path, 0, CorruptionKind::BadReference(why)));
    }
    Ok(header.version)
}

/// File names of segments and consume-queue files: a 20-digit, zero-padded number.
pub fn numbered_file_name(n: u64) -> String {
    format!("{n:020}")
}

/// The inverse of [`numbered_file_name`]; `None` for anything else (temp files, strays).
pub fn parse_numbered_file_name(name: &str) -> Option<u64> {
    if name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()) { name.parse().ok() } else { None }
}

/// What field `a` records in the header of the oldest numbered file of kind
/// `magic` in `dir`, if one reads: the entries per file of an index, the
/// bytes per segment of the commit log. An index keeps the
/// file size it was made with, whatever the configuration of a later open
/// says (the configuration sizes the files of new indexes). A header that
/// does not read is left to the open, which checks every file.
pub fn recorded_per_file(dir: &Path, magic: [u8; 8]) -> Option<u64> {
    use std::io::Read;
    let oldest = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| parse_numbered_file_name(&e.file_name().to_string_lossy()).map(|n| (n, e.path())))
        .min()?;
    let mut header = [0u8; FILE_HEADER_LEN];
    std::fs::File::open(oldest.1).ok()?.read_exact(&mut header).ok()?;
    FileHeader::decode(&header, magic).ok().map(|h| h.a).filter(|&a| a > 0)
}

/// The segment size of the commit log in `dir`: what its oldest segment's
/// header says, or, if that header does not check out (lenient recovery
/// writes it again), that file's length: segments are made at full size.
pub fn segment_size_on_disk(dir: &Path) -> Option<u64> {
    recorded_per_file(dir, COMMITLOG_MAGIC).or_else(|| {
        let oldest = std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter(|e| parse_numbered_file_name(&e.file_name().to_string_lossy()).is_some())
            .min_by_key(|e| e.file_name())?;
        oldest.metadata().ok().map(|m| m.len()).filter(|&len| len > 0)
    })
}

/// The entries per file an existing index in `dir` was made with, else
/// `configured`; logged when the two differ.
pub fn adopted_per_file(dir: &Path, magic: [u8; 8], configured: u64) -> u64 {
    match recorded_per_file(dir, magic) {
        Some(recorded) if recorded != configured => {
            tracing::info!(dir = %dir.display(), recorded, configured,
                "an index keeps the entries per file it was made with");
            recorded
        }
        _ => configured,
    }
}

// Callers check lengths before calling these; a short slice is a bug, not bad data.
pub fn put_u16(buf: &mut [u8], at: usize, v: u16) {
    buf[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
pub fn get_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}
pub fn get_u32(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}
pub fn get_u64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// CRC32C bound to a position: the position's 8 little-endian bytes are
/// hashed first, so a valid record copied to another offset does not pass.
pub fn crc_at(position: u64, bytes: &[u8]) -> u32 {
    // A short record (a delivery, a cancel, an index entry) is hashed in one
    // call over a copy: two calls cost twice the crate's per-call setup,
    // which for 28 bytes is most of the work. Same value either way.
    const SHORT: usize = 56;
    if bytes.len() <= SHORT {
        let mut joined = [0u8; 8 + SHORT];
        joined[..8].copy_from_slice(&position.to_le_bytes());
        joined[8..8 + bytes.len()].copy_from_slice(bytes);
        return crc32c::crc32c(&joined[..8 + bytes.len()]);
    }
    crc32c::crc32c_append(crc32c::crc32c(&position.to_le_bytes()), bytes)
}

/// Lowercase hex, for golden-bytes tests and dumps.
#[cfg(test)]
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every decoder of bytes read from disk refuses bytes that are too
    /// short or garbage with an error, never a panic, and reads all-zero
    /// bytes as unwritten.
    #[test]
    fn decoders_refuse_short_or_garbage_bytes_and_read_zeros_as_unwritten() {
        use crate::format::checkpoint::Checkpoint;
        use crate::format::record::{Frame, Record, RecordKind, check_header_in};
        use crate::format::{queue_entry, relocation, segment_counts, slot, tail, timer_entry};
        for len in [0, 1, 11, 27, 31, 95] {
            let bytes = vec![0xA5u8; len];
            assert!(FileHeader::decode(&bytes, WHEEL_MAGIC).is_err());
            assert!(check_header_in(&bytes, len).is_err());
            assert!(queue_entry::decode_entry(&bytes, 1).is_err());
            assert!(timer_entry::TimerEntry::decode(&bytes, 1).is_err());
            assert!(slot::Slot::decode_record(&bytes, 1).is_err());
            assert!(Checkpoint::decode_slot(&bytes).is_err());
            assert!(tail::decode_record(&bytes, 1).is_err());
            assert!(relocation::IndexEntry::decode(&bytes, 32).is_err());
            assert!(segment_counts::decode(&bytes).is_none());
        }
        let frame = Frame { kind: RecordKind::Message, len: 100 };
        assert!(Record::decode(&[1u8; 20], 32, frame).is_err());
        let zeros = [0u8; 128];
        assert!(matches!(check_header_in(&zeros, 128), Err(record::FrameError::Empty)));
        assert_eq!(queue_entry::decode_entry(&zeros, 1), Ok(None));
        assert_eq!(timer_entry::TimerEntry::decode(&zeros, 1), Ok(None));
        assert_eq!(slot::Slot::decode_record(&zeros, 1), Ok(None));
        assert_eq!(Checkpoint::decode_slot(&zeros), Ok(None));
        assert_eq!(tail::decode_record(&zeros, 1), Ok(None));
    }

    #[test]
    fn header_golden_bytes_match_wheel_format_md() {
        let h = FileHeader::new(COMMITLOG_MAGIC, 1 << 30, 0);
        // The same hex stands in wheel-format.md, "File header".
        assert_eq!(hex(&h.encode()), "4457434c4f4700000300000000000040000000000000000000000000a166f063");
    }

    #[test]
    fn commit_log_segments_of_versions_1_and_2_still_read_and_version_4_is_refused() {
        let path = Path::new("commitlog/00000000000000000000");
        for version in [1, 2] {
            let old = FileHeader { version, ..FileHeader::new(COMMITLOG_MAGIC, 1 << 30, 0) };
            assert_eq!(FileHeader::decode(&old.encode(), COMMITLOG_MAGIC), Ok(old));
            let read = check_file_header(path, &old.encode(), COMMITLOG_MAGIC, 1 << 30, 0).unwrap();
            assert_eq!(read, version);
        }
        let future = FileHeader { version: 4, ..FileHeader::new(COMMITLOG_MAGIC, 1 << 30, 0) }.encode();
        let err = check_file_header(path, &future, COMMITLOG_MAGIC, 1 << 30, 0).unwrap_err();
        assert!(matches!(err, Error::UnsupportedVersion { found: 4, supported: 3, .. }), "{err}");
        // Every other file keeps version 1 only.
        let queue = FileHeader { version: 2, ..FileHeader::new(CONSUME_QUEUE_MAGIC, 300_000, 0) };
        assert_eq!(
            FileHeader::decode(&queue.encode(), CONSUME_QUEUE_MAGIC),
            Err(HeaderProblem::UnsupportedVersion(2))
        );
    }

    #[test]
    fn header_round_trip_and_refusals() {
        let h = FileHeader::new(CONSUME_QUEUE_MAGIC, 300_000, 600_000);
        let bytes = h.encode();
        assert_eq!(FileHeader::decode(&bytes, CONSUME_QUEUE_MAGIC), Ok(h));
        assert_eq!(FileHeader::decode(&bytes, COMMITLOG_MAGIC), Err(HeaderProblem::BadMagic));
        let mut flipped = bytes;
        flipped[FIELD_A_OFFSET] ^= 1;
        assert_eq!(FileHeader::decode(&flipped, CONSUME_QUEUE_MAGIC), Err(HeaderProblem::BadChecksum));
        let future = FileHeader { version: 9, ..h }.encode();
        assert_eq!(
            FileHeader::decode(&future, CONSUME_QUEUE_MAGIC),
            Err(HeaderProblem::UnsupportedVersion(9))
        );
    }

    #[test]
    fn file_names_round_trip() {
        for n in [0, 1, 1 << 30, u64::MAX] {
            let name = numbered_file_name(n);
            assert_eq!(name.len(), 20);
            assert_eq!(parse_numbered_file_name(&name), Some(n));
        }
        assert_eq!(parse_numbered_file_name("00000000000000000001.tmp"), None);
        assert_eq!(parse_numbered_file_name("0000000000000000000x"), None);
        assert_eq!(parse_numbered_file_name("1"), None);
    }

    #[test]
    fn crc_at_short_and_long_inputs_hash_position_then_bytes() {
        let bytes: Vec<u8> = (0..200u8).collect();
        for len in [0, 1, 24, 55, 56, 57, 200] {
            let expected = crc32c::crc32c(&[&7u64.to_le_bytes()[..], &bytes[..len]].concat());
            assert_eq!(crc_at(7, &bytes[..len]), expected, "{len} bytes");
        }
    }

    #[test]
    fn crc_at_depends_on_position() {
        assert_ne!(crc_at(0, b"abc"), crc_at(1, b"abc"));
    }
}
