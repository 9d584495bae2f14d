//! `summary`: files and sizes, format versions, the checkpoint, the two
//! timer logs' entries, pending timers per wheel level and per coming time
//! bucket, the next due time, consume queues and their lengths. It reads headers, slot records and one
//! chain, so it is quick on any store. A store with retention (segments
//! deleted, or copies in `commitlog/relocated/`) also gets a retention part:
//! disk use per kind, the relocation area, and the relocation records of the
//! retained log, for which the log (bounded by retention) is scanned.

use std::path::Path;

use delaywheel::HORIZON_LABELS;
use delaywheel::internals::checkpoint::Checkpoint;
use delaywheel::internals::record::Record;
use delaywheel::internals::{self, geometry, layout, relocation};
use serde::Serialize;

use crate::commitlog::CommitLog;
use crate::error::{DumpError, Result};
use crate::indexes::{CheckpointFile, ConsumeQueue, LogSide, PlacedSlot, TimerLogs, WheelFile};
use crate::output::{SCHEMA_VERSION, Table, thousands};
use crate::store_files::{DataFile, FileKind, StoreFiles};
use crate::time::{utc_ms, utc_second};
use crate::wheel_view::{LiveChains, Resume, live_slots};

#[derive(Serialize)]
pub struct Summary {
    schema_version: u32,
    dir: String,
    files: Vec<FileInfo>,
    /// The newest valid checkpoint, if any.
    checkpoint: Option<CheckpointJson>,
    /// Whether the next open resumes the indexes at the checkpoint (otherwise it rebuilds them).
    resumes_at_checkpoint: bool,
    /// The near timer log (level-0 chains), then the far one (levels 1 and 2).
    timer_logs: Vec<TimerLogInfo>,
    /// Pending timers per level: live slot entries minus cancel entries.
    pending_per_level: [u64; geometry::LEVEL_COUNT],
    pending_total: u64,
    /// Reference time of the horizon buckets, epoch ms.
    reference_ms: u64,
    /// Pending timers due before reference + 5 s, 1 min, 5 min, 1 h, 1 d, and the rest.
    pending_by_horizon: Vec<(String, u64)>,
    next_due: Option<NextDue>,
    consume_queues: Vec<QueueInfo>,
    retention: RetentionInfo,
}

/// What retention deleted and keeps.
#[derive(Serialize)]
struct RetentionInfo {
    /// Start offset of the oldest commit-log segment on disk: every record below it was deleted.
    oldest_segment: u64,
    /// Its first record's offset (as `Stats::retention.oldest_retained_offset`).
    oldest_retained_offset: u64,
    /// Whether segments were deleted (the oldest segment does not start at 0).
    segments_deleted: bool,
    /// Bytes on disk per kind of file (as `Stats::disk`).
    disk_bytes: DiskBytes,
    /// Relocation records in the retained log; `None`: not scanned (no sign of retention).
    relocation_records: Option<RelocationRecords>,
    /// Entries in `commitlog/relocated/index` (copies, delivered ones included).
    relocation_index_entries: u64,
    relocation_window_files: u64,
}

#[derive(Serialize)]
struct DiskBytes {
    commit_log: u64,
    relocated: u64,
    consume_queues: u64,
    /// The wheel file, `timer/tails`, both timer logs and the cancel ledger.
    timer_index: u64,
}

/// One timer log's files and entries.
#[derive(Serialize)]
struct TimerLogInfo {
    /// `timer/timerlog` or `timer/timerlog-far`.
    dir: String,
    /// The wheel levels whose slots chain through it.
    levels: Vec<usize>,
    files: usize,
    /// The first entry its files hold (`None`: no files); the store deletes a
    /// log's oldest files once no live chain reaches them.
    first_entry: Option<u64>,
    /// The index the next entry gets (`None`: no files).
    end: Option<u64>,
    /// Entries on disk: from the first entry to the end.
    entries: u64,
}

#[derive(Serialize, Default)]
struct RelocationRecords {
    count: u64,
    timers: u64,
    cancels: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct FileInfo {
    path: String,
    bytes: u64,
    /// Format version from the file header; `None` for files without one.
    version: Option<u32>,
}

#[derive(Serialize)]
pub struct CheckpointJson {
    pub position: u64,
    pub sequence: u64,
    pub clean: bool,
    pub log_durable: u64,
    pub dispatched: u64,
    pub written_at_ms: u64,
    pub tick_second: u64,
    pub delivery_scan_from: u64,
    pub timer_log_end: u64,
    pub far_timer_log_end: u64,
}

impl CheckpointJson {
    pub fn new(position: u64, cp: &Checkpoint) -> Self {
        Self {
            position,
            sequence: cp.sequence,
            clean: cp.clean,
            log_durable: cp.log_durable,
            dispatched: cp.dispatched,
            written_at_ms: cp.written_at_ms,
            tick_second: cp.tick_second,
            delivery_scan_from: cp.delivery_scan_from,
            timer_log_end: cp.timer_log_end,
            far_timer_log_end: cp.far_timer_log_end,
        }
    }
}

#[derive(Serialize)]
struct NextDue {
    /// The earliest deliver time in the earliest live level-0 slot, or the
    /// start of the earliest live coarser window (its timers are not due before).
    at_ms: u64,
    level: usize,
    exact: bool,
}

#[derive(Serialize)]
struct QueueInfo {
    topic: String,
    queue_id: u32,
    entries: u64,
    files: usize,
}

impl Summary {
    pub fn gather(files: &StoreFiles, reference_ms: u64) -> Result<Self> {
        let checkpoint = CheckpointFile::read(files)?;
        let resume = Resume::new(files, &checkpoint)?;
        let wheel = WheelFile::read(files)?;
        let logs = TimerLogs::open(files)?;
        let live = match &wheel {
            Some(wheel) => live_slots(wheel, &resume)?,
            None => Vec::new(),
        };
        let mut entries = [0u64; geometry::LEVEL_COUNT];
        let mut cancels = [0u64; geometry::LEVEL_COUNT];
        let mut horizon = vec![0u64; HORIZON_LABELS.len()];
        for slot in &live {
            entries[slot.level] += u64::from(slot.slot.count);
            cancels[slot.level] += u64::from(slot.slot.cancels);
            let due_ms = slot.start_second().saturating_mul(1000);
            let bucket = delaywheel::HORIZONS_MS
                .iter()
                .position(|&ahead| due_ms < reference_ms.saturating_add(ahead))
                .unwrap_or(delaywheel::HORIZONS_MS.len());
            horizon[bucket] += u64::from(slot.net_timers());
        }
        let pending_per_level = geometry::net_pending(entries, cancels);
        let next_due = match &wheel {
            Some(wheel) => next_due(files, &resume, wheel, &logs, &live)?,
            None => None,
        };
        let mut queues = Vec::new();
        for q in &files.queues {
            let queue = ConsumeQueue::open(q)?;
            queues.push(QueueInfo {
                topic: q.topic.clone(),
                queue_id: q.queue_id,
                entries: queue.len()?,
                files: queue.file_count(),
            });
        }
        let mut timer_logs = Vec::new();
        for log in &logs.0 {
            let (first_entry, end) = (log.first(), log.end()?);
            timer_logs.push(TimerLogInfo {
                dir: files.relative(&files.timer_log_dir(log.side.index())),
                levels: (0..geometry::LEVEL_COUNT).filter(|&l| LogSide::of_level(l) == log.side).collect(),
                files: log.files().count(),
                first_entry,
                end,
                entries: end.zip(first_entry).map_or(0, |(end, first)| end.saturating_sub(first)),
            });
        }
        let file_infos = file_infos(files)?;
        let retention = retention(files, &file_infos)?;
        Ok(Self {
            schema_version: SCHEMA_VERSION,
            dir: files.dir.display().to_string(),
            files: file_infos,
            checkpoint: resume.checkpoint.map(|(position, cp)| CheckpointJson::new(position, &cp)),
            resumes_at_checkpoint: resume.resumes,
            timer_logs,
            pending_per_level,
            pending_total: pending_per_level.iter().sum(),
            reference_ms,
            pending_by_horizon: HORIZON_LABELS.iter().map(|l| l.to_string()).zip(horizon).collect(),
            next_due,
            consume_queues: queues,
            retention,
        })
    }

    pub fn render(&self) -> String {
        let mut out = format!("store {}\n\nfiles\n", self.dir);
        let mut table = Table::new(&["path", ">bytes", ">version"]);
        for f in &self.files {
            let version = f.version.map_or("-".to_string(), |v| v.to_string());
            table.row(vec![f.path.clone(), thousands(f.bytes), version]);
        }
        out += &table.render(2);
        out += "\ncheckpoint\n";
        match &self.checkpoint {
            Some(cp) => out += &render_checkpoint(cp),
            None => out += "  none valid: the next open rebuilds every index from the commit log\n",
        }
        if self.checkpoint.is_some() && !self.resumes_at_checkpoint {
            out +=
                "  an index directory is missing: the next open rebuilds every index from the commit log\n";
        }
        out += "\ntimer logs\n";
        let mut table = Table::new(&["log", "chains of", ">files", ">first entry", ">end", ">entries"]);
        for l in &self.timer_logs {
            let levels = match l.levels.as_slice() {
                [level] => format!("level {level}"),
                levels => {
                    format!("levels {}", levels.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(", "))
                }
            };
            let or_dash = |n: Option<u64>| n.map_or("-".to_string(), thousands);
            table.row(vec![
                format!("{}/", l.dir),
                levels,
                l.files.to_string(),
                or_dash(l.first_entry),
                or_dash(l.end),
                thousands(l.entries),
            ]);
        }
        out += &table.render(2);
        if self.timer_logs.iter().any(|l| l.first_entry.is_some_and(|first| first > 1)) {
            out += "  (entries below a log's first entry were in files deleted once no live chain reached them)\n";
        }
        out += "\npending timers (live wheel slots, as of the checkpoint's tick second)\n";
        let mut table = Table::new(&["level", ">slot covers", ">pending"]);
        for (level, n) in self.pending_per_level.iter().enumerate() {
            let covers = format!("{} s", thousands(1 << geometry::LEVELS[level].window_shift));
            table.row(vec![level.to_string(), covers, thousands(*n)]);
        }
        table.row(vec!["total".into(), String::new(), thousands(self.pending_total)]);
        out += &table.render(2);
        out += &format!("\npending by due time, from {}\n", utc_ms(self.reference_ms));
        let mut table = Table::new(&["due within", ">pending"]);
        for (label, n) in &self.pending_by_horizon {
            table.row(vec![label.clone(), thousands(*n)]);
        }
        out += &table.render(2);
        out += &match &self.next_due {
            Some(d) if d.exact => {
                format!("\nnext due  {}  {}  (level {})\n", d.at_ms, utc_ms(d.at_ms), d.level)
            }
            Some(d) => format!(
                "\nnext due  not before {}  {}  (level {} window)\n",
                d.at_ms,
                utc_ms(d.at_ms),
                d.level
            ),
            None => "\nnext due  nothing pending\n".to_string(),
        };
        out += "\nconsume queues\n";
        let mut table = Table::new(&["topic", ">queue", ">entries", ">files"]);
        for q in &self.consume_queues {
            table.row(vec![
                q.topic.clone(),
                q.queue_id.to_string(),
                thousands(q.entries),
                q.files.to_string(),
            ]);
        }
        out += &if table.is_empty() { "  none\n".to_string() } else { table.render(2) };
        out += &self.render_retention();
        out
    }

    /// The retention part, for a store where retention did something.
    fn render_retention(&self) -> String {
        let r = &self.retention;
        let Some(records) = &r.relocation_records else { return String::new() };
        let mut out = String::from("\nretention\n");
        if r.segments_deleted {
            out += &format!(
                "  oldest retained segment  commitlog/{:020} (log offset {}): records below it were deleted\n",
                r.oldest_segment,
                thousands(r.oldest_segment)
            );
        } else {
            out += "  oldest retained segment  commitlog/00000000000000000000: no segment was deleted\n";
        }
        out += "\n";
        let mut t = Table::new(&["on disk", ">bytes"]);
        let d = &r.disk_bytes;
        for (what, n) in [
            ("commit-log segments", d.commit_log),
            ("relocation area", d.relocated),
            ("consume queues", d.consume_queues),
            ("wheel, tails, timer logs, ledger", d.timer_index),
        ] {
            t.row(vec![what.into(), thousands(n)]);
        }
        out += &t.render(2);
        out += "\n";
        let mut t = Table::new(&["relocation", ">count"]);
        for (what, n) in [
            ("relocation records in the retained log", records.count),
            ("  timers copied", records.timers),
            ("  cancels copied", records.cancels),
            ("  bytes copied", records.bytes),
            ("relocation index entries", r.relocation_index_entries),
            ("relocation window files", r.relocation_window_files),
        ] {
            t.row(vec![what.into(), thousands(n)]);
        }
        out += &t.render(2);
        if records.timers + records.cancels < r.relocation_index_entries {
            out += "  (the relocation records of earlier passes went with the segments deleted after them)\n";
        }
        out
    }
}

/// The retention part. The log is scanned for relocation records only when
/// retention left a sign (a deleted segment, copies or window files): its
/// log is then bounded by the retention time.
fn retention(files: &StoreFiles, file_infos: &[FileInfo]) -> Result<RetentionInfo> {
    let bytes = |prefix: &str| -> u64 {
        file_infos.iter().filter(|f| f.path.starts_with(prefix)).map(|f| f.bytes).sum()
    };
    let relocated_prefix = format!("commitlog/{}/", layout::RELOCATED_DIR);
    let disk_bytes = DiskBytes {
        commit_log: bytes("commitlog/") - bytes(&relocated_prefix),
        relocated: bytes(&relocated_prefix),
        consume_queues: bytes("consumequeue/"),
        timer_index: bytes("timer/wheel")
            + bytes(&files.relative(&files.tails))
            + bytes(&format!("{}/", files.relative(&files.timer_log_dir(0))))
            + bytes(&format!("{}/", files.relative(&files.timer_log_dir(1))))
            + bytes(&format!("{}/", files.relative(&files.cancel_ledger_dir()))),
    };
    // The index's header was checked with the files; its entries are counted, not read.
    let index_bytes = bytes(&files.relative(&files.relocation_index));
    let relocation_index_entries =
        index_bytes.saturating_sub(internals::FILE_HEADER_LEN as u64) / relocation::INDEX_ENTRY_LEN as u64;
    let relocation_window_files = files.relocation_windows.len() as u64;
    let oldest_segment = files.log_start();
    let seen = oldest_segment > 0 || relocation_index_entries > 0 || relocation_window_files > 0;
    let relocation_records = if seen {
        let mut records = RelocationRecords::default();
        CommitLog::open(files)?.scan(|_, _, record| {
            if let Record::Relocation(r) = record {
                records.count += 1;
                records.timers += r.timers;
                records.cancels += r.cancels;
                records.bytes += r.bytes;
            }
            Ok(())
        })?;
        Some(records)
    } else {
        None
    };
    Ok(RetentionInfo {
        oldest_segment,
        oldest_retained_offset: oldest_segment + internals::FILE_HEADER_LEN as u64,
        segments_deleted: oldest_segment > 0,
        disk_bytes,
        relocation_records,
        relocation_index_entries,
        relocation_window_files,
    })
}

/// The checkpoint's fields as indented lines.
pub fn render_checkpoint(cp: &CheckpointJson) -> String {
    let mut t = Table::new(&["field", ">value", "meaning"]);
    let clean = if cp.clean { "written by a clean close" } else { "not a clean close: recovery replays" };
    t.row(vec!["clean".into(), if cp.clean { "yes" } else { "no" }.into(), clean.into()]);
    let mut row =
        |name: &str, value: u64, meaning: &str| t.row(vec![name.into(), value.to_string(), meaning.into()]);
    row("position", cp.position, "byte position of the slot");
    row("sequence", cp.sequence, "the valid slot with the highest sequence is used");
    row("log durable", cp.log_durable, "commit-log bytes below were on disk");
    row("dispatched", cp.dispatched, "records below are in the indexes");
    row("written at", cp.written_at_ms, &utc_ms(cp.written_at_ms));
    row("tick second", cp.tick_second, &utc_second(cp.tick_second));
    row("delivery scan", cp.delivery_scan_from, "deliveries of pending timers lie at or after");
    row("timer-log end", cp.timer_log_end, "near timer log (timerlog/) end at the wheel's progress");
    row(
        "far timer-log end",
        cp.far_timer_log_end,
        "far timer log (timerlog-far/) end at the same; 0 = unknown",
    );
    t.render(2)
}

/// The earliest due time in the live slots: exact on level 0 (the chains of
/// its earliest slots are read from the near timer log until one holds a
/// timer not cancelled), a window start for coarser levels.
fn next_due(
    files: &StoreFiles,
    resume: &Resume,
    wheel: &WheelFile,
    logs: &TimerLogs,
    live: &[PlacedSlot],
) -> Result<Option<NextDue>> {
    let mut level0: Vec<&PlacedSlot> = live.iter().filter(|s| s.level == 0).collect();
    level0.sort_by_key(|s| s.start_second());
    let mut chains = LiveChains::new(files, resume);
    for slot in level0 {
        // A running store may have delivered it and deleted its chain since.
        let Some(entries) = chains.chain(wheel, slot, logs)? else { continue };
        let cancelled: Vec<u64> =
            entries.iter().filter(|(_, e)| e.cancel).map(|(_, e)| e.message_offset).collect();
        let at_ms = entries
            .iter()
            .filter(|(_, e)| !e.cancel && !cancelled.contains(&e.message_offset))
            .map(|(_, e)| e.deliver_at_ms)
            .min();
        if let Some(at_ms) = at_ms {
            return Ok(Some(NextDue { at_ms, level: 0, exact: true }));
        }
    }
    let earliest = |level: usize| {
        live.iter().filter(|s| s.level == level && s.net_timers() > 0).map(PlacedSlot::start_second).min()
    };
    Ok([1, 2].into_iter().find_map(|level| {
        earliest(level).map(|second| NextDue { at_ms: second.saturating_mul(1000), level, exact: false })
    }))
}

/// Every file of the store with its size and, for data files, header version.
fn file_infos(files: &StoreFiles) -> Result<Vec<FileInfo>> {
    let mut out = Vec::new();
    let mut add = |path: &Path, kind: Option<FileKind>| -> Result<()> {
        if !path.is_file() {
            return Ok(());
        }
        let file = match DataFile::open(path) {
            Ok(file) => file,
            // A running store deleted it since it was listed (retention, or
            // a timer-log file no chain reaches any more).
            Err(DumpError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let version = match kind {
            Some(kind) => Some(file.header(kind)?.version),
            None => None,
        };
        out.push(FileInfo { path: files.relative(path), bytes: file.len, version });
        Ok(())
    };
    add(&files.dir.join("LOCK"), None)?;
    add(&files.checkpoint, None)?;
    add(&files.dir.join("consumer_offsets.json"), None)?;
    for path in files.segments.values() {
        add(path, Some(FileKind::CommitLog))?;
    }
    add(&files.relocation_index, Some(FileKind::RelocationIndex))?;
    for path in files.relocation_windows.values() {
        add(path, Some(FileKind::RelocationWindow))?;
    }
    for queue in &files.queues {
        for path in queue.files.values() {
            add(path, Some(FileKind::ConsumeQueue))?;
        }
    }
    add(&files.wheel, Some(FileKind::Wheel))?;
    add(&files.tails, Some(FileKind::Tails))?;
    for log in &files.timer_logs {
        for path in log.values() {
            add(path, Some(FileKind::TimerLog))?;
        }
    }
    for path in files.cancel_ledger.values() {
        add(path, Some(FileKind::CancelLedger))?;
    }
    add(&files.segment_pending, Some(FileKind::SegmentPending))?;
    add(&files.pins, Some(FileKind::Pins))?;
    Ok(out)
}
