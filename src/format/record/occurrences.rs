//! The occurrences record (kind 8): many schedules' occurrences that fired
//! together, each delivered and its schedule's next occurrence armed, in
//! 24 bytes instead of a 60-byte occurrence record (kind 6) each.
//!
//! A timer is named by the offset of the record that made it. Here each
//! entry's own offset names the timer it arms, `R + 24 (i + 1)` for entry
//! `i` of the record at `R`: unique, in log order, inside the record's
//! segment. Byte 8 of an entry, where a record has its kind, holds
//! [`INTERIOR_MARKER`] (never a kind) and byte 9 the entry's index, so a
//! lookup by name sees at once that it landed inside a record, and where
//! the record starts. Each entry reads as the occurrence record it stands
//! for ([`OccurrencesView::entry`]); its fields are deltas from the
//! record's time and from its own name, sized for schedules of periods of
//! seconds to hours. An occurrence an entry cannot hold gets a kind-6
//! record ([`entry_fits`]).

use super::{RECORD_HEADER_LEN, RecordKind, RescheduleView, seal, write_header};
use crate::error::CorruptionKind;
use crate::format::record::OccurrenceFields;
use crate::format::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

// The fixed part, after the frame header.
const O_AT: usize = RECORD_HEADER_LEN;
const O_COUNT: usize = O_AT + 8;
const O_RESERVED: usize = O_COUNT + 2;
/// Where the first entry begins.
const O_ENTRIES: usize = O_RESERVED + 2;
/// Bytes per entry.
pub const OCCURRENCE_ENTRY_LEN: usize = 24;
const _: () = assert!(O_ENTRIES == OCCURRENCE_ENTRY_LEN, "entry i is named R + 24 (i + 1)");

// An entry's fields.
const E_SCHEDULE: usize = 0;
const E_MARKER: usize = 8;
const E_INDEX: usize = 9;
const E_LATE: usize = 10;
const E_FIRED: usize = 12;
const E_BACK: usize = 16;
const E_AHEAD: usize = 21;
const _: () = assert!(E_AHEAD + 3 == OCCURRENCE_ENTRY_LEN);

/// Byte 8 of every entry: where a record holds its kind, a byte that is
/// never one (kinds are 1..=8 and 0xFF; `0x80..=0xFE` are never kinds).
pub const INTERIOR_MARKER: u8 = 0x88;
/// The most entries one record holds (an entry's index is one byte).
pub const OCCURRENCES_MAX: usize = 256;
/// The widest `back` (fired timer's name to this entry's name) and `ahead`
/// (delivery to the next occurrence, ms) an entry holds.
const MAX_BACK: u64 = (1 << 40) - 1;
const MAX_AHEAD: u64 = (1 << 24) - 1;

/// Length of an occurrences record of `count` entries.
pub fn occurrences_len(count: usize) -> usize {
    O_ENTRIES + count * OCCURRENCE_ENTRY_LEN
}

/// The name of entry `index`'s timer in the record at `record_offset`.
pub fn entry_name(record_offset: u64, index: usize) -> u64 {
    record_offset + (O_ENTRIES + index * OCCURRENCE_ENTRY_LEN) as u64
}

/// Where the record starts whose entry is at `name`, if the bytes there
/// (from `name` on, at least 10) are marked as an entry's.
pub fn containing_record(name: u64, bytes: &[u8]) -> Option<u64> {
    let (marker, index) = (*bytes.get(E_MARKER)?, *bytes.get(E_INDEX)?);
    // A name too small for its index is not an entry's (a marker-like byte in other bytes).
    (marker == INTERIOR_MARKER).then(|| name.checked_sub(entry_name(0, usize::from(index)))).flatten()
}

/// Whether the delivering occurrence `view` (fired at its
/// `rescheduled_at_ms`) fits an entry named `name`: delivered at most 65 s
/// late, its next occurrence at most 4.66 hours ahead, its fired timer at
/// most 1 TiB of log back, at most `u32::MAX` occurrences.
pub fn entry_fits(view: &RescheduleView, name: u64) -> bool {
    let at = view.rescheduled_at_ms;
    let Some(occurrence) = view.occurrence.filter(|o| o.delivers) else { return false };
    let late = at.checked_sub(view.from_deliver_at_ms);
    let ahead = view.deliver_at_ms.checked_sub(at);
    let back = name.checked_sub(view.from_timer);
    late.is_some_and(|l| l <= u64::from(u16::MAX))
        && ahead.is_some_and(|a| a <= MAX_AHEAD)
        && back.is_some_and(|b| b <= MAX_BACK)
        && (1..=u64::from(u32::MAX)).contains(&occurrence.fired)
        && view.message_offset <= view.from_timer
}

/// Encodes an occurrences record at log `offset` into `buf`
/// ([`occurrences_len`] of `views.len()` bytes): each view a delivering
/// occurrence fired at `delivered_at_ms` that [fits](entry_fits) its
/// entry; 1..=[`OCCURRENCES_MAX`] of them.
pub fn encode_occurrences(buf: &mut [u8], offset: u64, delivered_at_ms: u64, views: &[RescheduleView]) {
    debug_assert!((1..=OCCURRENCES_MAX).contains(&views.len()));
    debug_assert_eq!(buf.len(), occurrences_len(views.len()));
    write_header(buf, RecordKind::Occurrences, buf.len());
    put_u64(buf, O_AT, delivered_at_ms);
    put_u16(buf, O_COUNT, views.len() as u16);
    put_u16(buf, O_RESERVED, 0);
    for (i, view) in views.iter().enumerate() {
        let name = entry_name(offset, i);
        debug_assert!(view.rescheduled_at_ms == delivered_at_ms && entry_fits(view, name), "{view:?}");
        let at = (name - offset) as usize;
        let fired = view.occurrence.map_or(0, |o| o.fired);
        put_u64(buf, at + E_SCHEDULE, view.message_offset);
        buf[at + E_MARKER] = INTERIOR_MARKER;
        buf[at + E_INDEX] = i as u8;
        put_u16(buf, at + E_LATE, (delivered_at_ms - view.from_deliver_at_ms) as u16);
        put_u32(buf, at + E_FIRED, fired as u32);
        put_uint(buf, at + E_BACK, 5, name - view.from_timer);
        put_uint(buf, at + E_AHEAD, 3, view.deliver_at_ms - delivered_at_ms);
    }
    seal(buf, offset, buf.len());
}

/// A decoded occurrences record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OccurrencesView<'a> {
    /// When they fired (epoch ms, the ticker's clock).
    pub delivered_at_ms: u64,
    /// The record's own offset: the entries' names follow from it.
    pub offset: u64,
    entries: &'a [u8],
}

impl<'a> OccurrencesView<'a> {
    /// Decodes the occurrences record at log `offset` whose frame and CRC
    /// were checked; every entry must be marked, numbered in order, and
    /// name a fired timer below the record and at or above its schedule.
    pub fn parse(record: &'a [u8], offset: u64) -> Result<Self, CorruptionKind> {
        let view = Self::parse_fixed(record, offset)?;
        for i in 0..view.len() {
            view.check_entry(i).map_err(|why| bad(format!("entry {i}: {why}")))?;
        }
        Ok(view)
    }

    /// Entry `index` of the occurrences record at log `offset` whose frame
    /// and CRC were checked: [`parse`](Self::parse) checking that entry
    /// alone, for a lookup of one timer by its name.
    pub fn entry_at(
        record: &[u8],
        offset: u64,
        index: usize,
    ) -> Result<(u64, RescheduleView), CorruptionKind> {
        let view = OccurrencesView::parse_fixed(record, offset)?;
        if index >= view.len() {
            return Err(bad(format!("of {} entries has no entry {index}", view.len())));
        }
        view.check_entry(index).map_err(|why| bad(format!("entry {index}: {why}")))?;
        Ok(view.entry(index))
    }

    /// The fixed part checked: length, count, reserved field.
    fn parse_fixed(record: &'a [u8], offset: u64) -> Result<Self, CorruptionKind> {
        if record.len() < O_ENTRIES {
            return Err(bad(format!("of {} bytes", record.len())));
        }
        let count = usize::from(get_u16(record, O_COUNT));
        if !(1..=OCCURRENCES_MAX).contains(&count) || record.len() != occurrences_len(count) {
            return Err(bad(format!("of {} bytes holds {count} entries", record.len())));
        }
        if get_u16(record, O_RESERVED) != 0 {
            return Err(bad("with its reserved field set".into()));
        }
        Ok(Self { delivered_at_ms: get_u64(record, O_AT), offset, entries: &record[O_ENTRIES..] })
    }

    fn check_entry(&self, i: usize) -> Result<(), String> {
        let bytes = self.entry_bytes(i);
        if bytes[E_MARKER] != INTERIOR_MARKER || usize::from(bytes[E_INDEX]) != i {
            return Err(format!("marked {:#04x} {}", bytes[E_MARKER], bytes[E_INDEX]));
        }
        let (_, view) = self.entry(i);
        let fired = view.occurrence.map_or(0, |o| o.fired);
        if fired == 0 || view.from_deliver_at_ms > self.delivered_at_ms {
            return Err(format!("{fired} fired, {} ms late", get_u16(bytes, E_LATE)));
        }
        if self.delivered_at_ms.checked_add(get_uint(bytes, E_AHEAD, 3)).is_none() {
            return Err("its next occurrence lies past the end of time".into());
        }
        // `back` covers the entry's own place: the fired timer lies below the record.
        let (back, name) = (get_uint(bytes, E_BACK, 5), entry_name(self.offset, i));
        if back <= entry_name(0, i) || back > name || view.message_offset > view.from_timer {
            return Err(format!("fired timer {} of schedule {}", view.from_timer, view.message_offset));
        }
        Ok(())
    }

    /// How many occurrences it holds.
    pub fn len(&self) -> usize {
        self.entries.len() / OCCURRENCE_ENTRY_LEN
    }

    /// Whether it holds none (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn entry_bytes(&self, i: usize) -> &'a [u8] {
        &self.entries[i * OCCURRENCE_ENTRY_LEN..(i + 1) * OCCURRENCE_ENTRY_LEN]
    }

    /// Entry `i`: its name, and the delivering occurrence record (kind 6)
    /// it stands for, as if that record were written at the name.
    pub fn entry(&self, i: usize) -> (u64, RescheduleView) {
        let bytes = self.entry_bytes(i);
        let name = entry_name(self.offset, i);
        let at = self.delivered_at_ms;
        let view = RescheduleView {
            rescheduled_at_ms: at,
            message_offset: get_u64(bytes, E_SCHEDULE),
            from_timer: name.wrapping_sub(get_uint(bytes, E_BACK, 5)),
            from_deliver_at_ms: at.wrapping_sub(u64::from(get_u16(bytes, E_LATE))),
            deliver_at_ms: at.saturating_add(get_uint(bytes, E_AHEAD, 3)),
            occurrence: Some(OccurrenceFields { fired: u64::from(get_u32(bytes, E_FIRED)), delivers: true }),
        };
        (name, view)
    }

    /// Every entry, in order (see [`entry`](Self::entry)).
    pub fn entries(&self) -> impl Iterator<Item = (u64, RescheduleView)> + '_ {
        (0..self.len()).map(|i| self.entry(i))
    }
}

fn bad(why: String) -> CorruptionKind {
    CorruptionKind::BadFrame(format!("occurrences record {why}"))
}

/// Writes the low `width` bytes of `v`, little-endian.
fn put_uint(buf: &mut [u8], at: usize, width: usize, v: u64) {
    debug_assert!(v < 1 << (8 * width), "{v} does not fit {width} bytes");
    buf[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
}

/// Reads `width` bytes, little-endian.
fn get_uint(buf: &[u8], at: usize, width: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[..width].copy_from_slice(&buf[at..at + width]);
    u64::from_le_bytes(bytes)
}
