//! Finding a store's files and reading them read-only: `File::open` and
//! positioned reads (`pread`), no maps, no `LOCK`, nothing ever written.
//! A live store may be appending while we read; readers here never assume a
//! file stands still beyond the bytes they read.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use delaywheel::CorruptionKind;
use delaywheel::internals::layout::Layout;
use delaywheel::internals::{self, FileHeader};

use crate::error::{DumpError, Result};

/// The kinds of self-identifying data files, each known by the magic its
/// header starts with (the library's constants).
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
    /// `timer/pins`: the cancel ledger's reschedules folded, up to an entry.
    Pins,
    /// `timer/tails`: where each wheel slot's chain begins.
    Tails,
    /// `index/keys/<first message offset>`: timed messages by topic and key.
    KeyIndex,
    /// `index/dedup/<first message offset>`: messages by topic and dedup key.
    DedupIndex,
}

impl FileKind {
    pub fn magic(self) -> [u8; 8] {
        match self {
            Self::CommitLog => internals::COMMITLOG_MAGIC,
            Self::ConsumeQueue => internals::CONSUME_QUEUE_MAGIC,
            Self::TimerLog => internals::TIMER_LOG_MAGIC,
            Self::CancelLedger => internals::CANCEL_LEDGER_MAGIC,
            Self::Wheel => internals::WHEEL_MAGIC,
            Self::RelocationWindow => internals::RELOCATED_MAGIC,
            Self::RelocationIndex => internals::RELOCATION_INDEX_MAGIC,
            Self::SegmentPending => internals::SEGMENT_PENDING_MAGIC,
            Self::Pins => internals::PINS_MAGIC,
            Self::Tails => internals::TAILS_MAGIC,
            Self::KeyIndex => internals::KEY_INDEX_MAGIC,
            Self::DedupIndex => internals::DEDUP_INDEX_MAGIC,
        }
    }
}

/// Every file of a store directory, by role. Numbered files are keyed by
/// the number in their name (a segment's start offset, a file's first index).
#[derive(Debug)]
pub struct StoreFiles {
    pub dir: PathBuf,
    pub checkpoint: PathBuf,
    pub segments: BTreeMap<u64, PathBuf>,
    pub queues: Vec<QueueFiles>,
    pub wheel: PathBuf,
    /// The files of the near timer log (`timer/timerlog/`, `[0]`) and of the
    /// far one (`timer/timerlog-far/`, `[1]`); see [`geometry::timer_log_of`].
    /// Retention deletes a log's oldest files: they may start past index 0.
    pub timer_logs: [BTreeMap<u64, PathBuf>; 2],
    /// The cancel ledger's files (`timer/cancelled/`), by first entry index.
    /// Retention deletes its oldest files too: they may start past index 0.
    pub cancel_ledger: BTreeMap<u64, PathBuf>,
    /// `timer/tails`, where each slot's chain begins (may not exist).
    pub tails: PathBuf,
    /// `timer/segment_pending` (may not exist).
    pub segment_pending: PathBuf,
    /// `timer/pins`, the pins snapshot (may not exist).
    pub pins: PathBuf,
    /// `commitlog/relocated/`: the relocation area's directory.
    pub relocated_dir: PathBuf,
    /// `commitlog/relocated/index` (may not exist).
    pub relocation_index: PathBuf,
    /// `commitlog/relocated/compacted` (may not exist).
    pub relocation_compacted: PathBuf,
    /// The relocation window files, by their window's first second.
    pub relocation_windows: BTreeMap<u64, PathBuf>,
    /// Where every file of the store lives, as the store lays them out.
    pub layout: Layout,
}

/// The files of one consume queue.
#[derive(Debug)]
pub struct QueueFiles {
    pub topic: String,
    pub queue_id: u32,
    pub files: BTreeMap<u64, PathBuf>,
}

impl StoreFiles {
    /// Finds the files of the store in `dir`. A store has a `commitlog/` directory.
    pub fn locate(dir: &Path) -> Result<Self> {
        let not_a_store = |why: &str| DumpError::NotAStore { dir: dir.to_path_buf(), why: why.to_string() };
        if !dir.is_dir() {
            return Err(not_a_store("no such directory"));
        }
        let layout = Layout::new(dir);
        let commitlog = layout.commit_log();
        if !layout.is_store() {
            return Err(not_a_store("it has no commitlog/ directory (nor the LOCK of a first open)"));
        }
        let mut queues = Vec::new();
        let queue_root = layout.consume_queues();
        for topic_dir in sorted_dirs(&queue_root)? {
            let topic = file_name(&topic_dir);
            for queue_dir in sorted_dirs(&topic_dir)? {
                // A queue directory is named by its queue id; anything else is not ours.
                let Ok(queue_id) = file_name(&queue_dir).parse::<u32>() else { continue };
                queues.push(QueueFiles {
                    topic: topic.clone(),
                    queue_id,
                    files: numbered_files(&queue_dir)?,
                });
            }
        }
        queues.sort_by(|a, b| (&a.topic, a.queue_id).cmp(&(&b.topic, b.queue_id)));
        let relocated_dir = layout.relocated();
        Ok(Self {
            dir: dir.to_path_buf(),
            checkpoint: layout.checkpoint(),
            // A first open that lost power before it made commitlog/: an empty store.
            segments: if commitlog.is_dir() { numbered_files(&commitlog)? } else { BTreeMap::new() },
            queues,
            wheel: layout.wheel(),
            timer_logs: [numbered_files(&layout.timer_log(0))?, numbered_files(&layout.timer_log(1))?],
            cancel_ledger: numbered_files(&layout.cancel_ledger())?,
            tails: layout.tails(),
            segment_pending: layout.segment_counts(),
            pins: layout.pins(),
            relocation_index: layout.relocation_index(),
            relocation_compacted: layout.relocation_compacted(),
            relocation_windows: numbered_files(&relocated_dir)?,
            relocated_dir,
            layout,
        })
    }

    /// The path of the relocation window file that starts at second `window`
    /// (it may not exist: retention deletes a window once it has passed).
    pub fn relocation_window(&self, window: u64) -> PathBuf {
        self.relocated_dir.join(internals::numbered_file_name(window))
    }

    /// The first log offset of the oldest commit-log segment on disk (`0` if
    /// there is none): records below it were deleted by retention.
    pub fn log_start(&self) -> u64 {
        self.segments.keys().next().copied().unwrap_or(0)
    }

    /// The directory of timer log `log` (`0` near, `1` far).
    pub fn timer_log_dir(&self, log: usize) -> PathBuf {
        self.layout.timer_log(log)
    }

    /// The files of timer log `log` as they are now. A live store creates
    /// them as it goes (and deletes the oldest), so a reader that has just
    /// read a wheel slot lists them again: the slot may point into a file
    /// created after [`locate`](Self::locate).
    pub fn timer_log_now(&self, log: usize) -> Result<BTreeMap<u64, PathBuf>> {
        numbered_files(&self.timer_log_dir(log))
    }

    /// The cancel ledger's directory, `timer/cancelled/`.
    pub fn cancel_ledger_dir(&self) -> PathBuf {
        self.layout.cancel_ledger()
    }

    /// The cancel ledger's files as they are now: a live store creates them
    /// as cancels come (and retention deletes the oldest), as for the timer logs.
    pub fn cancel_ledger_now(&self) -> Result<BTreeMap<u64, PathBuf>> {
        numbered_files(&self.cancel_ledger_dir())
    }

    /// `path` relative to the store directory, for listings.
    pub fn relative(&self, path: &Path) -> String {
        path.strip_prefix(&self.dir).unwrap_or(path).display().to_string()
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Sub-directories of `dir`, sorted; none if `dir` does not exist.
fn sorted_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = list(dir)?.into_iter().filter(|p| p.is_dir()).collect();
    out.sort();
    Ok(out)
}

/// The files of `dir` named by a 20-digit number (temporary and discarded files are skipped).
pub fn numbered_files(dir: &Path) -> Result<BTreeMap<u64, PathBuf>> {
    Ok(list(dir)?
        .into_iter()
        .filter_map(|path| internals::parse_numbered_file_name(&file_name(&path)).map(|n| (n, path)))
        .collect())
}

fn list(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DumpError::io("list", dir, e)),
    };
    entries.map(|e| e.map(|e| e.path()).map_err(|err| DumpError::io("list", dir, err))).collect()
}

/// A file opened read-only, read with `pread`.
#[derive(Debug)]
pub struct DataFile {
    pub path: PathBuf,
    file: File,
    pub len: u64,
}

impl DataFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| DumpError::io("open", path, e))?;
        let len = file.metadata().map_err(|e| DumpError::io("stat", path, e))?.len();
        Ok(Self { path: path.to_path_buf(), file, len })
    }

    /// Reads `len` bytes at `offset`; bytes past the file's end are a corruption
    /// (every file of a store is created at its full size).
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        // The length comes from the store's bytes: checked against the file
        // before anything is allocated for it.
        if offset.checked_add(len as u64).is_none_or(|end| end > self.len) {
            let why = format!("{len} bytes at {offset} lie past the file's end ({} bytes)", self.len);
            return Err(DumpError::bad_reference(&self.path, offset, why));
        }
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                let why = format!("{len} bytes at {offset} lie past the file's end ({} bytes)", self.len);
                DumpError::bad_reference(&self.path, offset, why)
            } else {
                DumpError::io("read", &self.path, e)
            }
        })?;
        Ok(buf)
    }

    /// Reads and checks the file header of a file of `kind`.
    pub fn header(&self, kind: FileKind) -> Result<FileHeader> {
        let bytes = self.read(0, internals::FILE_HEADER_LEN)?;
        FileHeader::decode(&bytes, kind.magic()).map_err(|problem| match problem.kind() {
            Ok(kind) => DumpError::corruption(&self.path, 0, kind),
            Err(found) => DumpError::UnsupportedVersion {
                file: self.path.clone(),
                found,
                supported: *internals::versions(kind.magic()).end(),
            },
        })
    }

    /// Checks that the file is `expected` bytes long.
    pub fn expect_len(&self, expected: u64) -> Result<()> {
        if self.len != expected {
            let kind = CorruptionKind::WrongSize { expected, found: self.len };
            return Err(DumpError::corruption(&self.path, 0, kind));
        }
        Ok(())
    }

    /// Checks a header field against what the file's name or its neighbours say.
    pub fn expect_field(&self, what: &str, found: u64, expected: u64) -> Result<()> {
        if found != expected {
            let why = format!("header says {what} {found}, expected {expected}");
            return Err(DumpError::bad_reference(&self.path, 0, why));
        }
        Ok(())
    }
}

/// Sequential reads of one file through a buffer, so a scan costs one
/// `pread` per chunk rather than one per record.
pub struct ChunkReader<'a> {
    file: &'a DataFile,
    start: u64,
    buf: Vec<u8>,
}

/// Bytes read per `pread` by a [`ChunkReader`].
const CHUNK: usize = 1 << 20;

impl<'a> ChunkReader<'a> {
    pub fn new(file: &'a DataFile) -> Self {
        Self { file, start: 0, buf: Vec::new() }
    }

    /// The `len` bytes at `offset`.
    pub fn get(&mut self, offset: u64, len: usize) -> Result<&[u8]> {
        let end = offset + len as u64;
        if offset < self.start || end > self.start + self.buf.len() as u64 {
            let want = (len.max(CHUNK) as u64).min(self.file.len.saturating_sub(offset)).max(len as u64);
            self.buf = self.file.read(offset, want as usize)?;
            self.start = offset;
        }
        let at = (offset - self.start) as usize;
        Ok(&self.buf[at..at + len])
    }
}

/// One file of a numbered sequence, opened, with its header checked against its name.
pub struct SequenceFile {
    pub first: u64,
    pub file: DataFile,
}

/// Opens a numbered file sequence (segments, timer-log, cancel-ledger or
/// queue files) of `kind`: every header must be valid, agree on `a` (the segment size or the
/// entries per file) and carry its name's number as `b`; the files must be
/// contiguous (a gap is a missing file) and `size(a)` bytes each.
pub fn open_sequence(
    files: &BTreeMap<u64, PathBuf>,
    kind: FileKind,
    step: impl Fn(u64) -> u64,
    size: impl Fn(u64) -> u64,
) -> Result<(Vec<SequenceFile>, Option<u64>)> {
    let mut out: Vec<SequenceFile> = Vec::new();
    let mut a = None;
    for (&first, path) in files {
        let file = match DataFile::open(path) {
            Ok(file) => file,
            // Retention deletes the oldest files of a live store while we
            // read: one gone from the front since it was listed was deleted.
            Err(DumpError::Io { source, .. })
                if out.is_empty() && source.kind() == std::io::ErrorKind::NotFound =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        let header = file.header(kind)?;
        let a_now = *a.get_or_insert(header.a);
        file.expect_field("a", header.a, a_now)?;
        file.expect_field("b", header.b, first)?;
        if a_now == 0 {
            return Err(DumpError::bad_reference(path, 0, "header says a is 0"));
        }
        file.expect_len(size(a_now))?;
        if let Some(prev) = out.last()
            && prev.first.checked_add(step(a_now)) != Some(first)
        {
            let missing = path.with_file_name(format!("{:020}", prev.first.saturating_add(step(a_now))));
            return Err(DumpError::corruption(missing, 0, CorruptionKind::MissingFile));
        }
        out.push(SequenceFile { first, file });
    }
    Ok((out, a))
}
