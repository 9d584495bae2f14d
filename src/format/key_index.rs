//! The layout of the key index and of the dedup index (see `key_index.rs`
//! for how they are kept): one file per run of commit-log offsets, each a
//! hash table of chains. The two differ only in their magic and in how many
//! entries share a bucket (64 and 8).
//!
//! ```text
//! header (32 B): magic DWKEYS, a = entries per file (N), b = first message offset
//! heads  (4B B): u32 per bucket (B: the greatest power of two <= max(1, N / 64), N / 8 for dedup), the newest entry of its chain + 1 (0: empty)
//! entries (20N B): message_offset u64 | key_hash u32 | prev u32 | crc32c u32
//! ```
//!
//! An entry's bucket is `key_hash % B` (its low bits); `prev` is the previous entry of the
//! same bucket + 1 (0: none), always an earlier entry of the same file. The
//! CRC is over the entry's number in its file (u64 LE) followed by bytes
//! 0..16, so an entry read at the wrong place or a torn one does not check out.

use crate::format::{FILE_HEADER_LEN, crc_at, get_u32, get_u64, put_u32, put_u64};

/// Entries per key-index file by default (1 Mi entries, 16 Ki buckets, 20 MiB).
pub const DEFAULT_ENTRIES_PER_FILE: u64 = 1 << 20;

/// Bytes per entry.
pub const ENTRY_LEN: usize = 20;
const MESSAGE_OFFSET: usize = 0;
const KEY_HASH: usize = MESSAGE_OFFSET + 8;
const PREV: usize = KEY_HASH + 4;
const CRC: usize = PREV + 4;
const _: () = assert!(CRC + 4 == ENTRY_LEN);
/// Bytes per bucket head.
pub const HEAD_LEN: usize = 4;

/// One indexed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyEntry {
    /// The message's commit-log offset.
    pub message_offset: u64,
    /// [`key_hash`] of its topic and key.
    pub key_hash: u32,
    /// The previous entry of its bucket + 1; 0 if none.
    pub prev: u32,
}

/// The hash of a topic and key that picks a bucket: CRC32C of the topic, a
/// zero byte and the key (a topic holds no zero byte).
pub fn key_hash(topic: &str, key: &str) -> u32 {
    let crc = crc32c::crc32c_append(crc32c::crc32c(topic.as_bytes()), &[0]);
    crc32c::crc32c_append(crc, key.as_bytes())
}

/// Entries per bucket of a full key-index file. Few buckets keep the heads small
/// enough to stay in the L2 cache (64 KiB for the default 1 Mi entries)
/// while the dispatcher writes them at random: with one bucket per entry
/// (4 MiB of heads) each add missed the cache, and the 1 M burst's puts,
/// which wait for the dispatcher, fell by a quarter; with one per 8 by 15%;
/// with one per 64 within the noise. A lookup walks about 64 entries per file.
pub const ENTRIES_PER_BUCKET: u64 = 64;

/// Entries per bucket of a full dedup-index file: every put with a dedup
/// key looks its key up, so chains are kept short (512 KiB of heads for
/// 1 Mi entries; a lookup walks about 8 entries per file).
pub const DEDUP_ENTRIES_PER_BUCKET: u64 = 8;

/// The shape of one index file: entries per file and per bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Entries per file (`N`, the header's `a`).
    pub per_file: u64,
    /// Entries per bucket of a full file (fixed per kind of index).
    pub per_bucket: u64,
}

impl Geometry {
    /// A key-index file of `per_file` entries.
    pub fn keys(per_file: u64) -> Self {
        Self { per_file, per_bucket: ENTRIES_PER_BUCKET }
    }

    /// A dedup-index file of `per_file` entries.
    pub fn dedup(per_file: u64) -> Self {
        Self { per_file, per_bucket: DEDUP_ENTRIES_PER_BUCKET }
    }

    /// The buckets: a power of two, so a bucket is a mask of the hash (a
    /// division was most of an add's cost).
    pub fn buckets(&self) -> u64 {
        let wanted = (self.per_file / self.per_bucket).max(1);
        1 << wanted.ilog2()
    }

    /// Bytes of the bucket heads.
    pub fn heads_len(&self) -> usize {
        self.buckets() as usize * HEAD_LEN
    }

    /// Where the head of the bucket of `key_hash` lies.
    pub fn head_position(&self, key_hash: u32) -> usize {
        FILE_HEADER_LEN + (u64::from(key_hash) & (self.buckets() - 1)) as usize * HEAD_LEN
    }

    /// Where entry `number` lies.
    pub fn entry_position(&self, number: u64) -> usize {
        FILE_HEADER_LEN + self.heads_len() + number as usize * ENTRY_LEN
    }

    /// The size of a file.
    pub fn file_len(&self) -> u64 {
        self.entry_position(self.per_file) as u64
    }
}

/// The buckets of a key-index file of `per_file` entries.
pub fn buckets(per_file: u64) -> u64 {
    Geometry::keys(per_file).buckets()
}

/// Bytes of the bucket heads of a key-index file of `per_file` entries.
pub fn heads_len(per_file: u64) -> usize {
    Geometry::keys(per_file).heads_len()
}

/// Where the head of the bucket of `key_hash` lies in a key-index file of `per_file` entries.
pub fn head_position(per_file: u64, key_hash: u32) -> usize {
    Geometry::keys(per_file).head_position(key_hash)
}

/// Where entry `number` of a key-index file of `per_file` entries lies.
pub fn entry_position(per_file: u64, number: u64) -> usize {
    Geometry::keys(per_file).entry_position(number)
}

/// The size of a key-index file of `per_file` entries.
pub fn file_len(per_file: u64) -> u64 {
    Geometry::keys(per_file).file_len()
}

impl KeyEntry {
    /// The entry's bytes as entry `number` of its file.
    pub fn encode(&self, number: u32) -> [u8; ENTRY_LEN] {
        let mut out = [0u8; ENTRY_LEN];
        put_u64(&mut out, MESSAGE_OFFSET, self.message_offset);
        put_u32(&mut out, KEY_HASH, self.key_hash);
        put_u32(&mut out, PREV, self.prev);
        let crc = crc_at(u64::from(number), &out[..CRC]);
        put_u32(&mut out, CRC, crc);
        out
    }

    /// Decodes entry `number`: `None` if its bytes do not check out (never
    /// written, torn, or damaged).
    pub fn decode(bytes: &[u8], number: u32) -> Option<Self> {
        if bytes.len() < ENTRY_LEN || get_u32(bytes, CRC) != crc_at(u64::from(number), &bytes[..CRC]) {
            return None;
        }
        let entry = Self {
            message_offset: get_u64(bytes, MESSAGE_OFFSET),
            key_hash: get_u32(bytes, KEY_HASH),
            prev: get_u32(bytes, PREV),
        };
        // A chain only points back.
        (entry.prev <= number).then_some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::hex;

    #[test]
    fn golden_bytes_match_wheel_format_md() {
        assert_eq!(key_hash("OrderTopic", "order-42"), 0x1f1f_3ec0, "the hash is part of the format");
        let e = KeyEntry { message_offset: 32, key_hash: 0x1f1f_3ec0, prev: 0 };
        let bytes = e.encode(0);
        assert_eq!(&hex(&bytes)[..32], concat!("2000000000000000", "c03e1f1f", "00000000"));
        assert_eq!(KeyEntry::decode(&bytes, 0), Some(e));
        assert_eq!(KeyEntry::decode(&bytes, 1), None, "bound to its number");
        assert_eq!(KeyEntry::decode(&[0; ENTRY_LEN], 0), None, "an unwritten entry");
        let forward = KeyEntry { prev: 5, ..e }.encode(3);
        assert_eq!(KeyEntry::decode(&forward, 3), None, "a chain never points forward");
        assert_eq!(file_len(4), 32 + 4 + 80, "one bucket");
        assert_eq!(file_len(1024), 32 + 64 + 1024 * 20, "sixteen buckets");
        assert_eq!(buckets(1500), 16, "a power of two");
        assert_eq!(head_position(1024, 21), 32 + 5 * 4);
        let dedup = Geometry::dedup(1024);
        assert_eq!(dedup.buckets(), 128, "one bucket per 8 entries");
        assert_eq!(dedup.file_len(), 32 + 512 + 1024 * 20);
    }
}
