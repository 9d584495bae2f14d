//! A checkpoint slot (96 bytes): how far the log was durable and the indexes
//! built when it was written. The checkpoint file holds two of them (see
//! `checkpoint.rs`). `wheel-format.md` ("Checkpoint") is the byte ruler.

use crate::error::CorruptionKind;
use crate::format::record::record_start;
use crate::format::{get_u32, get_u64, put_u32, put_u64};

const MAGIC: [u8; 8] = *b"DWCKPT\0\0";
const VERSION: u32 = 1;
/// Byte position of each of the two slots.
pub const SLOT_POSITIONS: [u64; 2] = [0, 512];
/// Bytes of one slot.
pub const SLOT_LEN: usize = 96;
/// The checkpoint file's size.
pub const FILE_LEN: u64 = 1024;

const MAGIC_OFFSET: usize = 0;
const VERSION_OFFSET: usize = MAGIC_OFFSET + 8;
const FLAGS_OFFSET: usize = VERSION_OFFSET + 4;
const SEQUENCE_OFFSET: usize = FLAGS_OFFSET + 4;
const LOG_DURABLE_OFFSET: usize = SEQUENCE_OFFSET + 8;
const DISPATCHED_OFFSET: usize = LOG_DURABLE_OFFSET + 8;
const WRITTEN_AT_OFFSET: usize = DISPATCHED_OFFSET + 8;
const TICK_SECOND_OFFSET: usize = WRITTEN_AT_OFFSET + 8;
const DELIVERY_SCAN_OFFSET: usize = TICK_SECOND_OFFSET + 8;
const TIMER_LOG_END_OFFSET: usize = DELIVERY_SCAN_OFFSET + 8;
const FAR_TIMER_LOG_END_OFFSET: usize = TIMER_LOG_END_OFFSET + 8;
const RESERVED_OFFSET: usize = FAR_TIMER_LOG_END_OFFSET + 8;
const CRC_OFFSET: usize = SLOT_LEN - 4;
const _: () = assert!(RESERVED_OFFSET <= CRC_OFFSET);

/// Set when the checkpoint was written by a clean close.
const FLAG_CLEAN: u32 = 1;

/// One checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// Grows by one per checkpoint written: the valid slot with the higher one is read.
    pub sequence: u64,
    /// Every commit-log byte below this offset was on disk.
    pub log_durable: u64,
    /// Every record below this offset is in the consume queues and (timers)
    /// in the wheel, and those index entries were on disk.
    pub dispatched: u64,
    /// Wall-clock time of the write, epoch ms.
    pub written_at_ms: u64,
    /// Every timer due before this epoch second had been delivered.
    pub tick_second: u64,
    /// Delivery records of timers due at or after `tick_second` lie at or after this log offset.
    pub delivery_scan_from: u64,
    /// The near timer log's end (next entry index) when the wheel had
    /// received every timer below `dispatched`: later entries are of records
    /// the replay reads again (or of later cascades).
    pub timer_log_end: u64,
    /// The same for the far timer log; `0` if unknown (written by an older build).
    pub far_timer_log_end: u64,
    /// Written by a clean close: the log ends exactly at `log_durable`.
    pub clean: bool,
}

impl Checkpoint {
    /// Why the store cannot have written this checkpoint, naming the field;
    /// `None` if nothing contradicts it. `files_end` is where the commit
    /// log's files end (past the last segment), in segments of `segment_size` bytes. A writer keeps `dispatched`
    /// and the delivery scan at or below the durable mark, the durable mark
    /// within the log's files, and the tick second at most two seconds past
    /// the clock when it writes (the wheel loads the next second while the
    /// current one runs, and its tick second is the one after the last
    /// loaded; a clock moved back between them is the one honest way to
    /// break that, and it costs a replay of the whole log).
    pub fn contradiction(&self, files_end: u64, segment_size: u64) -> Option<String> {
        // Offsets compared as the records they name: a close that ends in
        // the last bytes of a segment records its durable end there, and
        // `dispatched` as the next segment's first record, the same place.
        let record = |offset: u64| match segment_size {
            0 => offset,
            size => record_start(offset, size),
        };
        if self.log_durable > files_end {
            return Some(format!(
                "log durable {} lies past the log's files (they end at {files_end})",
                self.log_durable
            ));
        }
        if record(self.dispatched) > record(self.log_durable) {
            return Some(format!(
                "dispatched {} lies past log durable {}",
                self.dispatched, self.log_durable
            ));
        }
        if record(self.delivery_scan_from) > record(self.log_durable) {
            let (from, durable) = (self.delivery_scan_from, self.log_durable);
            return Some(format!("delivery scan from {from} lies past log durable {durable}"));
        }
        if self.tick_second > self.written_at_ms / 1000 + 2 {
            let (tick, at) = (self.tick_second, self.written_at_ms);
            return Some(format!("tick second {tick} lies after the time it was written ({at} ms)"));
        }
        None
    }

    /// The slot's 96 bytes, CRC included.
    pub fn encode(&self) -> [u8; SLOT_LEN] {
        let mut out = [0u8; SLOT_LEN];
        out[MAGIC_OFFSET..VERSION_OFFSET].copy_from_slice(&MAGIC);
        put_u32(&mut out, VERSION_OFFSET, VERSION);
        put_u32(&mut out, FLAGS_OFFSET, if self.clean { FLAG_CLEAN } else { 0 });
        put_u64(&mut out, SEQUENCE_OFFSET, self.sequence);
        put_u64(&mut out, LOG_DURABLE_OFFSET, self.log_durable);
        put_u64(&mut out, DISPATCHED_OFFSET, self.dispatched);
        put_u64(&mut out, WRITTEN_AT_OFFSET, self.written_at_ms);
        put_u64(&mut out, TICK_SECOND_OFFSET, self.tick_second);
        put_u64(&mut out, DELIVERY_SCAN_OFFSET, self.delivery_scan_from);
        put_u64(&mut out, TIMER_LOG_END_OFFSET, self.timer_log_end);
        put_u64(&mut out, FAR_TIMER_LOG_END_OFFSET, self.far_timer_log_end);
        let crc = crc32c::crc32c(&out[..CRC_OFFSET]);
        put_u32(&mut out, CRC_OFFSET, crc);
        out
    }

    /// A slot's checkpoint, or `None` if the slot is empty, torn or of another version.
    pub fn decode(slot: &[u8]) -> Option<Self> {
        Self::check(slot).ok()
    }

    /// A slot's checkpoint: `Ok(None)` if the slot is all zero (never
    /// written), an error if it is torn, damaged or of another version.
    pub fn decode_slot(slot: &[u8]) -> std::result::Result<Option<Self>, CorruptionKind> {
        if slot.get(..SLOT_LEN).is_some_and(|b| b.iter().all(|&x| x == 0)) {
            return Ok(None);
        }
        Self::check(slot).map(Some)
    }

    /// A slot's checkpoint, or why it is not one (an empty slot has a bad magic).
    pub fn check(slot: &[u8]) -> std::result::Result<Self, CorruptionKind> {
        let slot = slot
            .get(..SLOT_LEN)
            .ok_or(CorruptionKind::WrongSize { expected: SLOT_LEN as u64, found: slot.len() as u64 })?;
        if slot[..8] != MAGIC {
            return Err(CorruptionKind::BadMagic);
        }
        let (stored, computed) = (get_u32(slot, CRC_OFFSET), crc32c::crc32c(&slot[..CRC_OFFSET]));
        if stored != computed {
            return Err(CorruptionKind::ChecksumMismatch { stored, computed });
        }
        let version = get_u32(slot, VERSION_OFFSET);
        if version != VERSION {
            return Err(CorruptionKind::BadFrame(format!(
                "checkpoint version {version}, this build reads {VERSION}"
            )));
        }
        Ok(Self {
            sequence: get_u64(slot, SEQUENCE_OFFSET),
            log_durable: get_u64(slot, LOG_DURABLE_OFFSET),
            dispatched: get_u64(slot, DISPATCHED_OFFSET),
            written_at_ms: get_u64(slot, WRITTEN_AT_OFFSET),
            tick_second: get_u64(slot, TICK_SECOND_OFFSET),
            delivery_scan_from: get_u64(slot, DELIVERY_SCAN_OFFSET),
            timer_log_end: get_u64(slot, TIMER_LOG_END_OFFSET),
            far_timer_log_end: get_u64(slot, FAR_TIMER_LOG_END_OFFSET),
            clean: get_u32(slot, FLAGS_OFFSET) & FLAG_CLEAN != 0,
        })
    }
}

/// The checkpoint recovery trusts, of a checkpoint file's valid `slots`:
/// the newest that nothing contradicts (see [`Checkpoint::contradiction`]:
/// `files_end`, [`walk::files_end`](super::walk::files_end), and the segment size)
/// and whose `dispatched` the records from the next older such slot's lead
/// to (`leads_to(from, to)`, a walk of the log only the caller can make:
/// [`walk::leads_to`](super::walk::leads_to)). A lone slot has none to
/// check its `dispatched` against. `distrusted` hears of each slot passed
/// over, and why. `None`: no slot stands, and the whole log is replayed.
pub fn trusted<E>(
    slots: &[Checkpoint],
    (files_end, segment_size): (u64, u64),
    mut leads_to: impl FnMut(u64, u64) -> Result<bool, E>,
    mut distrusted: impl FnMut(&Checkpoint, &str),
) -> Result<Option<Checkpoint>, E> {
    let mut candidates = Vec::with_capacity(slots.len());
    for cp in slots {
        match cp.contradiction(files_end, segment_size) {
            None => candidates.push(*cp),
            Some(why) => distrusted(cp, &why),
        }
    }
    candidates.sort_by_key(|cp| std::cmp::Reverse(cp.sequence));
    for (i, cp) in candidates.iter().enumerate() {
        let proven = match candidates.get(i + 1) {
            Some(older) if older.dispatched < cp.dispatched => leads_to(older.dispatched, cp.dispatched)?,
            _ => true,
        };
        if proven {
            return Ok(Some(*cp));
        }
        distrusted(
            cp,
            "its dispatched offset is not where the log's records from the previous checkpoint's lead",
        );
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::hex;

    #[test]
    fn golden_bytes_match_wheel_format_md() {
        let cp = Checkpoint {
            sequence: 2,
            log_durable: 4096,
            dispatched: 1024,
            written_at_ms: 1,
            tick_second: 1_700_000_000,
            delivery_scan_from: 1024,
            timer_log_end: 5,
            far_timer_log_end: 2,
            clean: true,
        };
        assert_eq!(
            hex(&cp.encode()),
            concat!(
                "4457434b50540000",
                "01000000",
                "01000000",
                "0200000000000000",
                "0010000000000000",
                "0004000000000000",
                "0100000000000000",
                "00f1536500000000",
                "0004000000000000",
                "0500000000000000",
                "0200000000000000",
                "000000000000000000000000",
                "c7b89a75"
            )
        );
    }

    #[test]
    fn every_flipped_bit_invalidates_a_slot() {
        let bytes =
            Checkpoint { sequence: 9, log_durable: 7, dispatched: 5, written_at_ms: 3, ..Default::default() }
                .encode();
        for bit in 0..SLOT_LEN * 8 {
            let mut copy = bytes;
            copy[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(Checkpoint::decode(&copy), None, "bit {bit}");
        }
    }
}
