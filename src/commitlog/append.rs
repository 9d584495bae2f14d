//! Appending to the commit log: one record or a batch, published whole,
//! in the tail segment or the next one (a roll), within the size cap and
//! the disk reserve.

use std::sync::atomic::Ordering;
use std::sync::{Arc, TryLockError};

use super::{CommitLog, Tail, segment};
use crate::error::{Error, Result};
use crate::format::FILE_HEADER_LEN;
use crate::format::record::{RECORD_HEADER_LEN, encode_padding};
use crate::sync::{Locked, ReadWrite};

/// A batch [`CommitLog::append_batch_planned`] writes: its records' lengths.
pub(crate) trait Planned {
    fn lens(&self) -> &[usize];
}

impl CommitLog {
    /// Appends one record of `len` bytes; `encode` fills the buffer given the
    /// record's offset. Returns the offset. A record never spans two segments.
    /// Returns the offset and whether the prefaulter should be woken.
    pub fn append(&self, len: usize, encode: impl FnOnce(&mut [u8], u64)) -> Result<(u64, bool)> {
        self.append_inner(len, encode, false)
    }

    /// Like [`append`](Self::append), but may start a segment inside the disk
    /// reserve: for the ticking thread's deliveries and cancels, which must not
    /// fail where a `put` is refused.
    pub fn append_reserved(&self, len: usize, encode: impl FnOnce(&mut [u8], u64)) -> Result<(u64, bool)> {
        self.append_inner(len, encode, true)
    }

    /// Appends records of `lens` bytes one after the other in one segment
    /// (starting the next one first if they do not fit in the rest of this
    /// one) and publishes them together: a reader sees all or none. `encode`
    /// fills record `i` given its offset. Nothing is written if the new
    /// segment cannot be made. Returns the offsets and whether the
    /// prefaulter should be woken.
    pub fn append_batch(
        &self,
        lens: &[usize],
        encode: impl FnMut(usize, &mut [u8], u64),
    ) -> Result<(Vec<u64>, bool)> {
        self.append_batch_inner(lens, encode, false)
    }

    /// Like [`append_batch`](Self::append_batch), but may start a segment
    /// inside the disk reserve, as [`append_reserved`](Self::append_reserved):
    /// for the ticking thread's deliveries of a tick, written under one lock.
    pub fn append_batch_reserved(
        &self,
        lens: &[usize],
        encode: impl FnMut(usize, &mut [u8], u64),
    ) -> Result<(Vec<u64>, bool)> {
        self.append_batch_inner(lens, encode, true)
    }

    /// Like [`append_batch_reserved`](Self::append_batch_reserved), for
    /// records whose contents, and so lengths, depend on where they go (an
    /// occurrences record names its entries' timers by their offsets):
    /// under the tail lock, `plan` is given the first record's offset and
    /// answers a plan, whose [`lens`](Planned::lens) are the records'; if
    /// they do not fit in the tail segment, the next one is started and
    /// `plan` asked again. Returns the plan it wrote and the offsets.
    pub fn append_batch_planned<P: Planned>(
        &self,
        mut plan: impl FnMut(u64) -> P,
        mut encode: impl FnMut(&P, usize, &mut [u8], u64),
    ) -> Result<(P, Vec<u64>, bool)> {
        self.check_poison()?;
        let mut tail = self.tail.locked();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let mut planned = plan(tail.end);
        if tail.end + self.batch_len(planned.lens())? > tail.base + self.segment_size {
            self.roll(&mut tail, true)?;
            planned = plan(tail.end);
            self.batch_len(planned.lens())?;
        }
        let (offsets, prefault) =
            self.write_batch(&mut tail, planned.lens(), |i, buf, at| encode(&planned, i, buf, at));
        Ok((planned, offsets, prefault))
    }

    /// Like [`append_batch`](Self::append_batch), but only if that takes no
    /// wait: `None`, with nothing written, if another append holds the tail
    /// or the batch needs a new segment (making one is file work). For an
    /// async caller, which appends on its own thread when it can and hands
    /// the batch to a thread that may block when it cannot.
    pub fn try_append_batch(
        &self,
        lens: &[usize],
        encode: impl FnMut(usize, &mut [u8], u64),
    ) -> Result<Option<(Vec<u64>, bool)>> {
        let total = self.batch_len(lens)?;
        self.check_poison()?;
        let mut tail = match self.tail.try_lock() {
            Ok(tail) => tail,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(None),
        };
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if tail.end + total > tail.base + self.segment_size {
            return Ok(None);
        }
        Ok(Some(self.write_batch(&mut tail, lens, encode)))
    }

    fn append_batch_inner(
        &self,
        lens: &[usize],
        encode: impl FnMut(usize, &mut [u8], u64),
        reserved: bool,
    ) -> Result<(Vec<u64>, bool)> {
        let total = self.batch_len(lens)?;
        self.check_poison()?;
        let mut tail = self.tail.locked();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if tail.end + total > tail.base + self.segment_size {
            self.roll(&mut tail, reserved)?;
        }
        Ok(self.write_batch(&mut tail, lens, encode))
    }

    /// The bytes of a batch of records of `lens`, if they fit in one segment.
    fn batch_len(&self, lens: &[usize]) -> Result<u64> {
        let total: u64 = lens.iter().map(|&len| len as u64).sum();
        let room = self.segment_size - FILE_HEADER_LEN as u64;
        if total > room {
            return Err(Error::invalid(
                "batch",
                format!("{total} bytes of records do not fit in one segment ({room} bytes): split the batch"),
            ));
        }
        Ok(total)
    }

    /// Writes and publishes a batch that fits in the tail segment; returns
    /// the offsets and whether the prefaulter should be woken.
    fn write_batch(
        &self,
        tail: &mut Tail,
        lens: &[usize],
        mut encode: impl FnMut(usize, &mut [u8], u64),
    ) -> (Vec<u64>, bool) {
        let (base, mut at) = (tail.base, tail.end);
        debug_assert!(at + lens.iter().map(|&len| len as u64).sum::<u64>() <= base + self.segment_size);
        let mut offsets = Vec::with_capacity(lens.len());
        for (i, &len) in lens.iter().enumerate() {
            encode(i, tail.writer.unpublished_mut((at - base) as usize, len), at);
            offsets.push(at);
            at += len as u64;
        }
        tail.writer.publish((at - base) as usize);
        tail.end = at;
        self.write_end.store(at, Ordering::Release);
        (offsets, self.needs_prefault(tail))
    }

    fn append_inner(
        &self,
        len: usize,
        encode: impl FnOnce(&mut [u8], u64),
        reserved: bool,
    ) -> Result<(u64, bool)> {
        self.check_poison()?;
        let mut tail = self.tail.locked();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if tail.end + len as u64 > tail.base + self.segment_size {
            self.roll(&mut tail, reserved)?;
        }
        let offset = tail.end;
        let local = (offset - tail.base) as usize;
        encode(tail.writer.unpublished_mut(local, len), offset);
        tail.writer.publish(local + len);
        tail.end += len as u64;
        self.write_end.store(tail.end, Ordering::Release);
        Ok((offset, self.needs_prefault(&tail)))
    }

    /// Starts the next segment: create it first (the only step that can fail for
    /// want of space), then pad the old one so readers know to move on.
    fn roll(&self, tail: &mut Tail, reserved: bool) -> Result<()> {
        let next_base = tail.base + self.segment_size;
        if !reserved {
            self.check_size_cap()?;
            self.check_free_space()?;
        }
        let next = segment::create(&self.dir, next_base, self.segment_size)?;
        let local = (tail.end - tail.base) as usize;
        let rest = self.segment_size as usize - local;
        if rest >= RECORD_HEADER_LEN {
            encode_padding(tail.writer.unpublished_mut(local, rest), tail.end);
            tail.writer.publish(self.segment_size as usize);
        }
        {
            let mut segments = self.segments.writing();
            segments.insert(next_base, Arc::clone(next.shared()));
            self.publish_table(&segments);
        }
        tracing::debug!(segment = %segment::segment_path(&self.dir, next_base).display(), "rolled to a new segment");
        *tail = Tail { writer: next, base: next_base, end: next_base + FILE_HEADER_LEN as u64 };
        self.holds_deliveries.store(true, Ordering::Release);
        self.holds_occurrences.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether an occurrences record (kind 8) may be appended: the tail
    /// segment is of version 3 (see [`holds_deliveries`](Self::holds_deliveries)).
    pub fn holds_occurrences(&self) -> bool {
        self.holds_occurrences.load(Ordering::Acquire)
    }

    /// Whether a deliveries record (kind 7) may be appended: the tail segment
    /// is of version 2, which a build that cannot read the kind refuses to
    /// open. A store written by version 1 gets delivery records (kind 2)
    /// until its next segment begins. (Segments only roll forward, so a
    /// `true` stays true for the records appended after it.)
    pub fn holds_deliveries(&self) -> bool {
        self.holds_deliveries.load(Ordering::Acquire)
    }

    /// Caps segments plus relocated copies at `bytes` for appends that may be
    /// refused (puts); `None` removes the cap.
    pub fn set_size_cap(&self, bytes: Option<u64>) {
        self.size_cap.store(bytes.unwrap_or(0), Ordering::Release);
    }

    /// Refuses a new segment that would take the log over its size cap:
    /// retention must delete an old one first.
    fn check_size_cap(&self) -> Result<()> {
        let cap = self.size_cap.load(Ordering::Acquire);
        if cap == 0 {
            return Ok(());
        }
        let used = self.disk_bytes() + self.relocated.disk_bytes()?;
        if used + self.segment_size > cap {
            return Err(Error::SizeCap { cap, used });
        }
        Ok(())
    }

    /// Refuses a new segment unless the indexes keep their reserve: a full disk
    /// then stops puts with a clear error instead of stopping index writes later.
    fn check_free_space(&self) -> Result<()> {
        let available = crate::fs::available_bytes(&self.dir)?;
        let needed = self.segment_size + self.disk_reserve;
        if available < needed {
            return Err(Error::DiskFull { dir: self.dir.clone(), needed, available });
        }
        Ok(())
    }
}
