//! `consumer_offsets.json`: the committed consumer positions, checkpointed
//! (see `offsets.rs` for how the file is kept, `wheel-format.md` for its
//! fields). Version 2 says up to where it covers the positions messages of
//! the log; version 1 (written before those existed) does not.

use serde::{Deserialize, Serialize};

/// The version this build writes.
pub const FILE_VERSION: u32 = 2;

/// The file.
#[derive(Debug, Serialize, Deserialize)]
pub struct OffsetsFile {
    /// 1 or [`FILE_VERSION`].
    pub version: u32,
    /// Every positions message below this log offset is reflected here
    /// (absent in version 1, which had no positions messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub covers_log_to: Option<u64>,
    /// Every committed position.
    pub offsets: Vec<CommittedOffset>,
}

/// A group's committed position in one queue.
#[derive(Debug, Serialize, Deserialize)]
pub struct CommittedOffset {
    /// The consumer group.
    pub group: String,
    /// The queue's topic.
    pub topic: String,
    /// The queue.
    pub queue_id: u32,
    /// The queue position the group goes on from.
    pub offset: u64,
}

/// Why bytes are not a consumer-offsets file this build reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetsProblem {
    /// Not the file at all (damaged, or not JSON of this shape): the store
    /// rebuilds it from the positions messages in the log.
    Garbled(String),
    /// A version this build does not know: the store refuses to open.
    UnsupportedVersion(u32),
}

/// Decodes the file's bytes.
pub fn decode(bytes: &[u8]) -> Result<OffsetsFile, OffsetsProblem> {
    let file: OffsetsFile =
        serde_json::from_slice(bytes).map_err(|e| OffsetsProblem::Garbled(e.to_string()))?;
    match (file.version, file.covers_log_to) {
        (1, _) | (FILE_VERSION, Some(_)) => Ok(file),
        (FILE_VERSION, None) => Err(OffsetsProblem::Garbled("version 2 without covers_log_to".into())),
        (found, _) => Err(OffsetsProblem::UnsupportedVersion(found)),
    }
}
