//! The crate's one error type.

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call failed; `path` names the file or directory it was about.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done: `"open"`, `"msync"`, `"rename"`, …
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// Bytes on disk are not what a writer of this format could have left.
    #[error("corrupt data in {} at offset {offset}: {kind}", file.display())]
    Corruption {
        /// The damaged file.
        file: PathBuf,
        /// The byte position in it of the record, entry or slot that does not check out.
        offset: u64,
        /// What is wrong.
        kind: CorruptionKind,
    },

    /// A file was written by a format version this build does not know.
    #[error("{} has format version {found}, this build reads versions up to {supported}", file.display())]
    UnsupportedVersion {
        /// The file.
        file: PathBuf,
        /// The version its header states.
        found: u32,
        /// The newest version this build reads (and the one it writes).
        supported: u32,
    },

    /// Too little disk space: for a new segment and the room the indexes
    /// keep to grow (nothing was written), or for a new index file (the
    /// indexes wait until there is room; what was acknowledged is kept and
    /// indexed then).
    #[error("disk full: {} has {available} bytes free, {needed} are needed", dir.display())]
    DiskFull {
        /// The directory that needs the space.
        dir: PathBuf,
        /// Bytes needed: a new segment and the index reserve, or a new index file.
        needed: u64,
        /// Bytes free.
        available: u64,
    },

    /// The system refused the indexes a resource they need to go on (open
    /// files, memory): they wait and retry, and what was acknowledged is
    /// kept and indexed once it is back. Nothing was written. Retry later.
    #[error("out of system resources (retry later): {reason}")]
    Exhausted {
        /// The failure the indexes met, naming the call and the file.
        reason: String,
    },

    /// The indexes are too far behind the commit log and did not catch up
    /// within the put timeout; nothing was written. Retry later.
    #[error(
        "store is busy: the indexes are {lag_bytes} bytes behind the commit log after waiting {waited_ms} ms"
    )]
    Busy {
        /// How far behind the commit log the indexes were when the put gave up.
        lag_bytes: u64,
        /// How long it waited.
        waited_ms: u64,
    },

    /// A message of a [`put_batch`](crate::Store::put_batch) is not
    /// acceptable (`source` says why): nothing of the batch was written.
    #[error("message {index} of the batch: {source}")]
    InBatch {
        /// Its position in the batch, from 0.
        index: usize,
        /// What is wrong with it.
        source: Box<Error>,
    },

    /// Sync flush mode only: the record is in the commit log, but was not yet
    /// on disk when the put timeout passed. It is not an error in the sense
    /// of "nothing happened": the put (or cancel) took effect and becomes
    /// durable at the next flush unless a power loss comes first. Do not put
    /// the message again (it would be delivered twice); wait with
    /// [`Store::wait_durable`](crate::Store::wait_durable), or cancel the
    /// timer by its handle.
    #[error(
        "{written} is in the commit log but not yet on disk after {waited_ms} ms; it stands (do not put it again): Store::wait_durable waits for it"
    )]
    NotYetDurable {
        /// What was written: the put's receipt or the cancelled handle.
        written: crate::receipt::Written,
        /// How long it waited.
        waited_ms: u64,
    },

    /// Another process (or another `Store` in this one) holds the directory.
    #[error("store directory {} is locked by another process", dir.display())]
    Locked {
        /// The store directory.
        dir: PathBuf,
    },

    /// A background step failed (a flush, the dispatcher, the ticking
    /// thread) in a way the store cannot recover from while open; what the
    /// page cache holds may not be what is on disk, so writes are refused
    /// until the store is reopened (recovery then starts from the disk).
    #[error("store is poisoned, reopen it: {reason}")]
    Poisoned {
        /// What failed, naming the step (`flush: …`, `dispatcher: …`,
        /// `timing wheel: …`) and the file.
        reason: String,
    },

    /// [`Consumer::poll`](crate::Consumer::poll) met a consume-queue entry,
    /// or the record it points at, that does not check out. The consumer's
    /// position stays at it (the messages before it were returned by the
    /// poll); `consumer.seek(position + 1)` skips it.
    #[error("entry {position} of queue {topic}/{queue_id} is unreadable: {source}; seek to {} to skip it", position + 1)]
    BadEntry {
        /// The queue's topic.
        topic: String,
        /// The queue.
        queue_id: u32,
        /// The entry's position in the queue (what `Consumer::position` returns).
        position: u64,
        /// What is wrong: usually [`Error::Corruption`] naming the file and offset.
        #[source]
        source: Box<Error>,
    },

    /// The message or a configuration value is not acceptable.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// The field or setting: `"topic"`, `"body"`, `"segment size"`, …
        what: &'static str,
        /// Why it is not acceptable.
        reason: String,
    },

    /// Retention deleted the segment of the record at this commit-log offset,
    /// and the record was not a pending timer (so it was not relocated), or
    /// its relocated copy's window has passed and was deleted too.
    #[error("the record at commit-log offset {offset} was deleted by retention")]
    Reclaimed {
        /// The record's commit-log offset.
        offset: u64,
    },

    /// Retention cannot bring the commit log under its size cap: every byte
    /// left is in segments it may not delete yet (not yet indexed or
    /// checkpointed) or in pending timers' copies. Nothing was written.
    #[error(
        "the commit log is at its size cap of {cap} bytes ({used} used) and nothing more can be reclaimed yet"
    )]
    SizeCap {
        /// The configured cap.
        cap: u64,
        /// Bytes the segments and relocated copies take now.
        used: u64,
    },

    /// The ticking thread did not answer: it is waiting for disk space (see
    /// `Store::health`), rebuilding the wheel from the log (it dropped the
    /// question when answering it met damage), or has a long backlog within
    /// the put timeout. Nothing is lost; ask again.
    #[error(
        "the ticking thread did not answer after {waited_ms} ms (waiting for room, rebuilding, or busy); retry"
    )]
    TickerBusy {
        /// How long the call waited.
        waited_ms: u64,
    },

    /// The store is closed or closing.
    #[error("store is closed")]
    Closed,
}

/// What exactly is wrong with corrupt bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorruptionKind {
    /// A stored CRC32C does not match the bytes it covers.
    ChecksumMismatch {
        /// The CRC the bytes carry.
        stored: u32,
        /// The CRC they hash to.
        computed: u32,
    },
    /// The file does not start with the magic of its kind.
    BadMagic,
    /// A file header whose own CRC does not match.
    BadHeader,
    /// A file is not the size its header and configuration require.
    WrongSize {
        /// The size the format requires.
        expected: u64,
        /// The size found.
        found: u64,
    },
    /// A record frame that cannot be valid (length, kind or version).
    BadFrame(String),
    /// A file that must exist between two others is missing.
    MissingFile,
    /// A record or entry points somewhere it cannot.
    BadReference(String),
}

impl fmt::Display for CorruptionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ChecksumMismatch { stored, computed } => {
                write!(f, "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")
            }
            Self::BadMagic => f.write_str("bad magic"),
            Self::BadHeader => f.write_str("file header fails its checksum"),
            Self::WrongSize { expected, found } => {
                write!(f, "file is {found} bytes, expected {expected}")
            }
            Self::BadFrame(why) => write!(f, "bad record frame: {why}"),
            Self::MissingFile => f.write_str("a file is missing from the sequence"),
            Self::BadReference(why) => write!(f, "bad reference: {why}"),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        // Every file the store opens is opened with O_NOFOLLOW: ELOOP then
        // means a symbolic link was planted where the store's file is.
        let source = match rustix::io::Errno::from_io_error(&source) {
            Some(rustix::io::Errno::LOOP) => symlink_refused(),
            _ => source,
        };
        Self::Io { op, path: path.into(), source }
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid { what, reason: reason.into() }
    }

    pub(crate) fn corruption(file: impl Into<PathBuf>, offset: u64, kind: CorruptionKind) -> Self {
        Self::Corruption { file: file.into(), offset, kind }
    }
}

/// The error for a symbolic link met where the store expects its own file
/// or directory.
pub(crate) fn symlink_refused() -> std::io::Error {
    std::io::Error::other("is a symbolic link; the store does not follow links inside its directory")
}
