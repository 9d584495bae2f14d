//! The tool's one error type: every failure names the file, and corruption
//! names the byte offset in it.

use std::path::PathBuf;

use delaywheel::CorruptionKind;

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The directory does not hold a store (exit 1: the argument parsed, its content is wrong).
    #[error("{} is not a delaywheel store: {why}", dir.display())]
    NotAStore { dir: PathBuf, why: String },

    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Bytes on disk that a writer of this format could not have left.
    #[error("corrupt data in {} at offset {offset}: {kind}", file.display())]
    Corruption { file: PathBuf, offset: u64, kind: CorruptionKind },

    #[error("{} has format version {found}, this tool reads versions up to {supported}", file.display())]
    UnsupportedVersion { file: PathBuf, found: u32, supported: u32 },

    /// The store's timers are held by the bucket scheduler, whose deliveries
    /// are copies that do not name their originals: nothing to audit them by.
    #[error(
        "{} holds the bucket scheduler's timers (it has {}): audit reads the wheel's delivery records and cannot audit a bucket store",
        dir.display(), marker.display()
    )]
    BucketStore { dir: PathBuf, marker: PathBuf },

    /// Writing to stdout failed (a closed pipe, for instance).
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
}

pub type Result<T, E = DumpError> = std::result::Result<T, E>;

impl DumpError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { op, path: path.into(), source }
    }

    pub fn corruption(file: impl Into<PathBuf>, offset: u64, kind: CorruptionKind) -> Self {
        Self::Corruption { file: file.into(), offset, kind }
    }

    /// A reference that points where it cannot.
    pub fn bad_reference(file: impl Into<PathBuf>, offset: u64, why: impl Into<String>) -> Self {
        Self::corruption(file, offset, CorruptionKind::BadReference(why.into()))
    }

    /// The file and byte offset a corruption names, if it is one.
    pub fn location(&self) -> Option<(&PathBuf, u64)> {
        match self {
            Self::Corruption { file, offset, .. } => Some((file, *offset)),
            Self::UnsupportedVersion { file, .. } => Some((file, 0)),
            _ => None,
        }
    }
}
