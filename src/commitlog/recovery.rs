//! Finding the end of the log on open.
//!
//! Validation starts at the checkpoint (not at the beginning of time) and walks
//! records until the first one that is not valid. That point is the end.
//! If it lies below the last offset the checkpoint knew to be durable, a record
//! that was once on disk is damaged: that is corruption in the middle, and
//! strict recovery refuses to open. Otherwise it is a torn tail: the bytes
//! after the end are zeroed (so they can never be mistaken for records later)
//! and any later segment is set aside as `*.discarded`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::RecoveryMode;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::{FILE_HEADER_LEN, parse_numbered_file_name};
use crate::mmap::{MapWriter, Mapped};

use super::segment;
use crate::format::record::{FrameError, RecordKind, check_frame};

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
    let mut writers = BTreeMap::new();
    for &base in &bases {
        writers.insert(base, segment::open(dir, base, size)?);
    }
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

    let (end, problem) = scan(&writers, size, start);
    let mut report = RecoveryReport { end, scanned_bytes: end.saturating_sub(start), ..Default::default() };
    // Stopping on a missing segment below the durable mark is damage too.
    let problem =
        problem.or_else(|| (end < plan.durable).then_some(FrameError::Invalid(CorruptionKind::MissingFile)));
    if let Some(problem) = problem {
        judge(dir, size, plan, end, problem, &mut report)?;
    }

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

/// Decides whether a bad record at `end` is a torn tail or corruption in the middle.
fn judge(
    dir: &Path,
    size: u64,
    plan: &RecoveryPlan,
    end: u64,
    problem: FrameError,
    report: &mut RecoveryReport,
) -> Result<()> {
    let base = end - end % size;
    let path = segment::segment_path(dir, base);
    if end < plan.durable {
        let kind = match problem {
            FrameError::Empty => CorruptionKind::BadFrame("zeros where a durable record should be".into()),
            FrameError::Invalid(kind) => kind,
        };
        if plan.mode == RecoveryMode::Strict {
            return Err(Error::corruption(path, end - base, kind));
        }
        tracing::error!(file = %path.display(), offset = end - base, %kind, lost_bytes = plan.durable - end,
            "lenient recovery: dropping the log after a damaged durable record");
        report.torn_at = Some(end);
    } else if let FrameError::Invalid(kind) = problem {
        tracing::warn!(file = %path.display(), offset = end - base, %kind, "truncating torn tail");
        report.torn_at = Some(end);
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
