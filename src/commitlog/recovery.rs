//! Finding the end of the log on open.
//!
//! Validation starts at the checkpoint (not at the beginning of time) and walks
//! records until the first one that is not valid. That point is the end.
//! If it lies below the last offset the checkpoint knew to be durable, a record
//! that was once on disk is damaged: that is corruption in the middle, and
//! strict recovery refuses to open. Otherwise it is a torn tail: the bytes
//! after the end are zeroed (so they can never be mistaken for records later)
//! and any later segment is set aside as `*.discarded`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::RecoveryMode;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::walk::{self, Lead, SegmentReader};
use crate::format::{COMMITLOG_VERSION, FILE_HEADER_LEN, parse_numbered_file_name};
use crate::mmap::{MapWriter, Mapped};

use super::segment;
use crate::format::record::{
    self, FrameError, RECORD_HEADER_LEN, RecordKind, check_frame, encode_padding, encode_skipped,
};

/// What the checkpoint tells recovery.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecoveryPlan {
    /// Where validation starts: a record boundary known to be valid.
    pub start: Option<u64>,
    /// Everything below this was on disk when the checkpoint was written.
    pub durable: u64,
    /// The end recorded by a clean close, if the last close was clean.
    pub clean_end: Option<u64>,
    pub mode: RecoveryMode,
}

/// What recovery found, for logs, `delaywheel recover` and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Offset just past the last valid record.
    pub end: u64,
    /// Bytes validated from the checkpoint to the end.
    pub scanned_bytes: u64,
    /// Where a damaged record was found and cut off, if anywhere.
    pub torn_at: Option<u64>,
    /// Bytes of damaged data zeroed after the end (the contiguous damaged run).
    pub truncated_bytes: u64,
    /// Later segments set aside because they lay past the end.
    pub discarded: Vec<PathBuf>,
    /// Stretches of damaged bytes lenient recovery marked skipped, the log
    /// going on after them: (log offset, length).
    pub skipped: Vec<(u64, u64)>,
    /// Segments whose damaged header lenient recovery wrote again.
    pub repaired_headers: Vec<PathBuf>,
    /// Segments found cut short, made whole again by lenient recovery (the
    /// records past their old end are lost; what follows is kept).
    pub restored_segments: Vec<PathBuf>,
    /// Indexes that did not check out at open, removed and rebuilt from
    /// the log (lenient recovery): their directories or files.
    pub rebuilt_indexes: Vec<PathBuf>,
    /// The sequence number of the checkpoint slot recovery trusted (the
    /// newest the store can have written); `None` if none stood, and the
    /// whole log was replayed.
    pub trusted_checkpoint: Option<u64>,
}

pub(super) struct Recovered {
    pub segments: BTreeMap<u64, Arc<Mapped>>,
    pub tail: MapWriter,
    pub tail_base: u64,
    pub end: u64,
    pub report: RecoveryReport,
}

impl Recovered {
    /// Offset of the first record of the oldest segment.
    pub fn segments_start(&self) -> u64 {
        self.segments.keys().next().map_or(0, |base| base + FILE_HEADER_LEN as u64)
    }
}

pub(super) fn recover(dir: &Path, size: u64, plan: &RecoveryPlan) -> Result<Recovered> {
    let _span = tracing::info_span!("commitlog_recovery", dir = %dir.display()).entered();
    let bases = list_segments(dir, size)?;
    let Some(&first) = bases.first() else {
        return start_fresh(dir, size, plan);
    };
    let mut report = RecoveryReport::default();
    let mut writers = open_segments(dir, size, &bases, plan.mode, &mut report)?;
    let header = FILE_HEADER_LEN as u64;
    let start = plan.start.unwrap_or(first + header).max(first + header);
    let last = bases[bases.len() - 1];
    // The dispatcher may stand at the first record of a segment not created yet.
    if start > last.saturating_add(size + header) {
        let why = format!("checkpoint offset {start} lies past the last segment");
        return Err(Error::corruption(
            segment::segment_path(dir, last),
            0,
            CorruptionKind::BadReference(why),
        ));
    }

    let end = find_end(dir, &mut writers, size, plan, start, &mut report)?;
    report.end = end;
    // An end below the start (a start the torn tail took) scanned nothing.
    report.scanned_bytes = end.saturating_sub(start);

    let tail_base = end - end % size;
    let mut segments = BTreeMap::new();
    let mut tail = None;
    for (base, mut writer) in writers {
        if base < tail_base {
            writer.publish(size as usize);
            segments.insert(base, Arc::clone(writer.shared()));
        } else if base == tail_base {
            tail = Some(writer);
        } else {
            report.discarded.push(set_aside(dir, base)?);
        }
    }
    let mut tail = match tail {
        Some(writer) => writer,
        // The end is the first record of a segment that was never created.
        None => segment::create(dir, tail_base, size)?,
    };
    let local_end = (end - tail_base) as usize;
    // After a clean close nothing unsynced lies past the end; otherwise zero it.
    if plan.clean_end != Some(end) || report.torn_at.is_some() {
        report.truncated_bytes = damaged_run(&tail, local_end);
        tail.zero_tail(local_end)?;
    }
    tail.publish(local_end);
    segments.insert(tail_base, Arc::clone(tail.shared()));
    if report.torn_at.is_some() || !report.discarded.is_empty() {
        tracing::warn!(
            end,
            truncated_bytes = report.truncated_bytes,
            discarded = report.discarded.len(),
            "recovered a torn tail"
        );
    }
    tracing::info!(end, scanned_bytes = report.scanned_bytes, "commit log recovered");
    Ok(Recovered { segments, tail, tail_base, end, report })
}

/// Opens every segment. A header that does not check out (a bad magic or
/// checksum, a size or base other than the file's) is refused in strict
/// mode; in lenient mode it is written again, in the format version its
/// version field names if this build knows it, else that of the nearest
/// segment whose header checks out (the next one, else the one before),
/// else this build's, and reported. A version this build does not
/// know is always refused: that is no damage.
fn open_segments(
    dir: &Path,
    size: u64,
    bases: &[u64],
    mode: RecoveryMode,
    report: &mut RecoveryReport,
) -> Result<BTreeMap<u64, MapWriter>> {
    let mut writers = BTreeMap::new();
    let mut versions = BTreeMap::new();
    let mut damaged = Vec::new();
    for &base in bases {
        let (writer, header) = segment::open_unchecked(dir, base, size)?;
        match header {
            Ok(version) => {
                versions.insert(base, version);
            }
            Err(e @ Error::Corruption { .. }) if mode == RecoveryMode::Lenient => damaged.push((base, e)),
            Err(e) => return Err(e),
        }
        writers.insert(base, writer);
    }
    for (base, problem) in damaged {
        let writer = writers.get_mut(&base).expect("opened above");
        let nearest = versions.range(base..).next().or_else(|| versions.range(..base).next_back());
        let recorded = Some(segment::version(writer)).filter(|v| (1..=COMMITLOG_VERSION).contains(v));
        let version = recorded.or(nearest.map(|(_, &v)| v)).unwrap_or(COMMITLOG_VERSION);
        segment::rewrite_header(writer, base, size, version)?;
        let path = segment::segment_path(dir, base);
        tracing::error!(file = %path.display(), %problem, version, "a damaged segment header was written again");
        report.repaired_headers.push(path);
    }
    Ok(writers)
}

fn start_fresh(dir: &Path, size: u64, plan: &RecoveryPlan) -> Result<Recovered> {
    let header = FILE_HEADER_LEN as u64;
    if plan.durable > header {
        let why = format!("the checkpoint knows {} durable bytes but there are no segments", plan.durable);
        return Err(Error::corruption(segment::segment_path(dir, 0), 0, CorruptionKind::BadReference(why)));
    }
    let tail = segment::create(dir, 0, size)?;
    let segments = BTreeMap::from([(0, Arc::clone(tail.shared()))]);
    let report = RecoveryReport { end: header, ..Default::default() };
    Ok(Recovered { segments, tail, tail_base: 0, end: header, report })
}

/// Where the log's files end (see [`walk::files_end`]).
pub(crate) fn files_end(dir: &Path, size: u64) -> Result<u64> {
    let last = if dir.is_dir() { list_segments(dir, size)?.last().copied() } else { None };
    Ok(walk::files_end(last, size))
}

/// Whether the records from `from` lead exactly to `to`, by the rule of
/// [`walk::leads_to`], over the segments' maps; in strict mode damage
/// between them is `Corruption` naming the segment and offset.
pub(crate) fn leads_to(dir: &Path, size: u64, from: u64, to: u64, mode: RecoveryMode) -> Result<bool> {
    let mut segments = Maps { dir, size, open: BTreeMap::new() };
    match walk::leads_to(&mut segments, size, from, to, mode == RecoveryMode::Strict)? {
        Lead::Reached => Ok(true),
        Lead::NotReached => Ok(false),
        Lead::Damaged { base, local, kind } => {
            Err(Error::corruption(segment::segment_path(dir, base), local as u64, kind))
        }
    }
}

/// The segments a walk reads, mapped as it reaches them.
struct Maps<'a> {
    dir: &'a Path,
    size: u64,
    open: BTreeMap<u64, MapWriter>,
}

impl SegmentReader for Maps<'_> {
    type Error = Error;

    fn read(&mut self, base: u64, local: usize, len: usize) -> Result<Option<Cow<'_, [u8]>>> {
        let writer = match self.open.entry(base) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                if !segment::segment_path(self.dir, base).exists() {
                    return Ok(None);
                }
                // Its header is recovery's to judge (and, lenient, to write again).
                e.insert(segment::open_unchecked(self.dir, base, self.size)?.0)
            }
        };
        Ok(Some(Cow::Borrowed(writer.view(local, len))))
    }
}

/// Lenient recovery's first step, before the checkpoint is checked against
/// the log: every segment cut short is made whole again (see
/// `segment::restore_if_short`). Returns their paths.
pub(crate) fn restore_short_segments(dir: &Path, size: u64) -> Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut restored = Vec::new();
    for base in list_segments(dir, size)? {
        if segment::restore_if_short(dir, base, size)? {
            restored.push(segment::segment_path(dir, base));
        }
    }
    Ok(restored)
}

/// Segment bases in order, checked to be contiguous; leftover `.tmp` files from
/// an interrupted segment creation are removed (they never held a record).
fn list_segments(dir: &Path, size: u64) -> Result<Vec<u64>> {
    let mut bases = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list", dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(base) = parse_numbered_file_name(&name) {
            bases.push(base);
        } else if name.ends_with(".tmp") {
            crate::fs::remove_file(&entry.path())?;
        }
    }
    bases.sort_unstable();
    for (i, &base) in bases.iter().enumerate() {
        let expected = (i as u64).checked_mul(size).and_then(|d| bases[0].checked_add(d)).unwrap_or(u64::MAX);
        if base % size != 0 || base != expected || base > u64::MAX - 2 * size {
            return Err(Error::corruption(
                segment::segment_path(dir, expected),
                0,
                CorruptionKind::MissingFile,
            ));
        }
    }
    Ok(bases)
}

/// Walks records from `start`; returns the end and why the walk stopped, if
/// it stopped on something other than a missing segment.
fn scan(writers: &BTreeMap<u64, MapWriter>, size: u64, start: u64) -> (u64, Option<FrameError>) {
    let normalize = |at: u64| super::normalize(at, size);
    let mut end = normalize(start);
    loop {
        let base = end - end % size;
        let Some(writer) = writers.get(&base) else {
            return (end, None);
        };
        let local = (end - base) as usize;
        match check_frame(writer.view(local, size as usize - local), end) {
            Ok(frame) if frame.kind == RecordKind::Padding => end = base + size + FILE_HEADER_LEN as u64,
            Ok(frame) => end = normalize(end + frame.len as u64),
            Err(problem) => return (end, Some(problem)),
        }
    }
}

/// Walks the log from `start` to its end: the first record that is not
/// valid, unless it is damage in the middle. A bad record below the durable
/// mark is damage; so is one, when no checkpoint says how far the log was
/// durable, that a valid record follows. Damage refuses the open
/// ([`RecoveryMode::Strict`]) or is marked skipped and the walk goes on past
/// it (lenient); anything else is a torn tail and ends the log.
fn find_end(
    dir: &Path,
    writers: &mut BTreeMap<u64, MapWriter>,
    size: u64,
    plan: &RecoveryPlan,
    start: u64,
    report: &mut RecoveryReport,
) -> Result<u64> {
    let mut from = start;
    loop {
        let (end, problem) = scan(writers, size, from);
        // Stopping on a missing segment below the durable mark is damage too.
        let problem = match problem {
            Some(problem) => problem,
            None if end < plan.durable => FrameError::Invalid(CorruptionKind::MissingFile),
            None => return Ok(end),
        };
        let damaged_durable = end < plan.durable;
        // Past the durable mark a bad record is a torn tail, unless no
        // checkpoint says where that mark is: then what follows decides.
        let may_be_damage = plan.durable == 0 && matches!(problem, FrameError::Invalid(_));
        if !damaged_durable && !may_be_damage {
            if let FrameError::Invalid(kind) = &problem {
                let (path, offset) = (segment::segment_path(dir, end - end % size), end % size);
                tracing::warn!(file = %path.display(), offset, %kind, "truncating torn tail");
                report.torn_at = Some(end);
            }
            return Ok(end);
        }
        let next = next_valid_record(writers, size, end);
        if next.is_none() && !damaged_durable {
            // No checkpoint, and nothing valid after the bad record: a torn tail.
            tracing::warn!(offset = end, "truncating torn tail (no checkpoint, nothing valid after it)");
            report.torn_at = Some(end);
            return Ok(end);
        }
        let kind = match problem {
            FrameError::Empty => CorruptionKind::BadFrame("zeros where a durable record should be".into()),
            FrameError::Invalid(kind) => kind,
        };
        match damaged(dir, writers, size, plan, (end, next), kind, report)? {
            Some(next) => from = next,
            None => return Ok(end),
        }
    }
}

/// Damage at `end` (the next valid record, if any, at `next`): an error in
/// strict mode; in lenient mode the stretch is marked skipped and the walk
/// goes on at the returned `next` (`None`: nothing valid follows, the log
/// ends at `end`).
fn damaged(
    dir: &Path,
    writers: &mut BTreeMap<u64, MapWriter>,
    size: u64,
    plan: &RecoveryPlan,
    (end, next): (u64, Option<u64>),
    kind: CorruptionKind,
    report: &mut RecoveryReport,
) -> Result<Option<u64>> {
    let (path, offset) = (segment::segment_path(dir, end - end % size), end % size);
    if plan.mode == RecoveryMode::Strict {
        // Below the durable mark the damage speaks for itself; without a
        // checkpoint, what follows it is why it is not a torn tail.
        let kind = match next {
            Some(next) if plan.durable == 0 => CorruptionKind::BadFrame(format!(
                "{kind}; a valid record follows at log offset {next}, so this is damage, not a torn tail \
                 (RecoveryMode::Lenient skips it)"
            )),
            _ => kind,
        };
        return Err(Error::corruption(path, offset, kind));
    }
    let Some(next) = next else {
        tracing::error!(file = %path.display(), offset, %kind, lost_bytes = plan.durable.saturating_sub(end),
            "lenient recovery: nothing valid after a damaged durable record; the log ends there");
        report.torn_at = Some(end);
        return Ok(None);
    };
    mark_skipped(writers, size, end, next)?;
    tracing::error!(file = %path.display(), offset, %kind, skipped_bytes = next - end,
        "lenient recovery: damaged bytes skipped, the log goes on after them");
    report.skipped.push((end, next - end));
    Ok(Some(next))
}

/// The first offset after `after` where a valid record (its CRC checked)
/// starts, in this segment or a later one.
fn next_valid_record(writers: &BTreeMap<u64, MapWriter>, size: u64, after: u64) -> Option<u64> {
    let header = FILE_HEADER_LEN as u64;
    writers.range(after - after % size..).find_map(|(&base, writer)| {
        let first = if base <= after { after + 1 } else { base + header };
        let view = writer.view(0, size as usize);
        record::next_valid_record(view, base, (first - base) as usize).map(|local| base + local as u64)
    })
}

/// Marks `[from, to)` skipped: padding to the end of each segment it leaves,
/// and a skipped record for the rest, made durable before the walk goes on.
fn mark_skipped(writers: &mut BTreeMap<u64, MapWriter>, size: u64, mut from: u64, to: u64) -> Result<()> {
    while from < to {
        let base = from - from % size;
        let local = (from - base) as usize;
        let until = if to - to % size == base { (to - base) as usize } else { size as usize };
        let writer = writers.get_mut(&base).expect("a segment the walk read");
        let room = until - local;
        if room >= RECORD_HEADER_LEN {
            let buf = writer.unpublished_mut(local, room);
            if until == size as usize {
                encode_padding(buf, from)
            } else {
                encode_skipped(buf, from)
            }
            writer.shared().flush(local, RECORD_HEADER_LEN)?;
        }
        from = if until == size as usize { base + size + FILE_HEADER_LEN as u64 } else { to };
    }
    Ok(())
}

/// Length of the damaged run after the end: up to the first all-zero 4 KiB page.
fn damaged_run(tail: &MapWriter, local_end: usize) -> u64 {
    const PAGE: usize = 4096;
    let len = tail.shared().len();
    let mut at = local_end;
    let mut last_nonzero = local_end;
    while at < len {
        let until = ((at / PAGE) + 1) * PAGE;
        let chunk = tail.view(at, until.min(len) - at);
        match chunk.iter().rposition(|&b| b != 0) {
            Some(i) => last_nonzero = at + i + 1,
            None => break,
        }
        at = until;
    }
    (last_nonzero - local_end) as u64
}

fn set_aside(dir: &Path, base: u64) -> Result<PathBuf> {
    let from = segment::segment_path(dir, base);
    let to = from.with_extension("discarded");
    crate::fs::rename(&from, &to)?;
    crate::fs::sync_dir(dir)?;
    tracing::warn!(segment = %from.display(), "set aside a segment past the recovered end");
    Ok(to)
}
