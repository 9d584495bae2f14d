//! `verify`'s last step: the indexes beside the wheel and the consume
//! queues, each read by the library's own codec (`internals`):
//!
//! * `index/keys/`: every file's header (magic, entries per file, its first
//!   message offset, as named) and size; every entry's CRC (bound to its
//!   number); message offsets strictly increasing across the files, none
//!   below its file's first; each names a timed message record of the log
//!   (or one below the oldest segment: retention deleted it). In a store not
//!   closed cleanly an entry of the newest file that does not check out ends
//!   it (the open zeroes it and the replay adds it again).
//! * `index/dedup/`: the same, for the dedup index (its own magic and bucket
//!   count), but its entries are not matched against records: they name
//!   ordinary messages too, which the log's facts do not gather.
//! * `index/topic_pending`: decodes (its CRC, every count), and counts no
//!   record past the end of the log.
//! * `consumer_offsets.json`: not a symbolic link (the store refuses to read
//!   through one), and decodes in a version this build reads.
//!
//! Every one of them the store rebuilds from the log when it does not check
//! out; a problem here costs no message, but it is damage all the same.

use std::path::Path;

use delaywheel::internals::{consumer_offsets, key_index, topic_counts};

use crate::commitlog::LogFacts;
use crate::error::{DumpError, Result};
use crate::store_files::{DataFile, FileKind, StoreFiles, numbered_files};
use crate::verify::Checked;

/// Checks the three files (each may be absent: the store makes it again).
pub fn check(
    files: &StoreFiles,
    facts: &LogFacts,
    log_start: u64,
    clean: bool,
    checked: &mut Checked,
) -> Result<()> {
    check_key_index(files, facts, log_start, clean, checked, SideIndex::KEYS)?;
    check_key_index(files, facts, log_start, clean, checked, SideIndex::DEDUP)?;
    check_topic_pending(&files.layout.topic_pending(), facts, checked)?;
    check_consumer_offsets(&files.layout.consumer_offsets(), checked)
}

/// One of the two indexes of `key_index.rs`.
struct SideIndex {
    name: &'static str,
    kind: FileKind,
    geometry: fn(u64) -> key_index::Geometry,
    /// Whether every entry names a timed message record.
    names_timers: bool,
}

impl SideIndex {
    const KEYS: Self = Self {
        name: "key-index",
        kind: FileKind::KeyIndex,
        geometry: key_index::Geometry::keys,
        names_timers: true,
    };
    const DEDUP: Self = Self {
        name: "dedup-index",
        kind: FileKind::DedupIndex,
        geometry: key_index::Geometry::dedup,
        names_timers: false,
    };
}

fn check_key_index(
    files: &StoreFiles,
    facts: &LogFacts,
    log_start: u64,
    clean: bool,
    checked: &mut Checked,
    index: SideIndex,
) -> Result<()> {
    let dir = match index.kind {
        FileKind::DedupIndex => files.layout.dedup_index(),
        _ => files.layout.key_index(),
    };
    if !dir.is_dir() {
        return Ok(());
    }
    let key_files = numbered_files(&dir)?;
    let newest = key_files.keys().next_back().copied();
    let mut last = None;
    for (&first, path) in &key_files {
        let file = DataFile::open(path)?;
        let geometry = (index.geometry)(key_file_header(&file, first, &index)?);
        let per_file = geometry.per_file;
        checked.file_headers += 1;
        let entries =
            file.read(geometry.entry_position(0) as u64, per_file as usize * key_index::ENTRY_LEN)?;
        for (number, bytes) in entries.chunks_exact(key_index::ENTRY_LEN).enumerate() {
            let position = geometry.entry_position(number as u64) as u64;
            let bad = |why: String| {
                DumpError::bad_reference(path, position, format!("{} entry {number}: {why}", index.name))
            };
            if bytes.iter().all(|&b| b == 0) {
                break;
            }
            let Some(entry) = key_index::KeyEntry::decode(bytes, number as u32) else {
                if !clean && newest == Some(first) {
                    checked.needs_recovery.push(format!(
                        "{} ends at entry {number}, which does not check out: the next open cuts it and adds the rest again",
                        files.relative(path)
                    ));
                    break;
                }
                return Err(bad("does not check out (its CRC, or a link forward)".into()));
            };
            match index.kind {
                FileKind::DedupIndex => checked.dedup_index_entries += 1,
                _ => checked.key_index_entries += 1,
            }
            let at = entry.message_offset;
            if at < first || last.is_some_and(|last| at <= last) {
                return Err(bad(format!(
                    "message offset {at} is not after the previous entry's nor the file's first {first}"
                )));
            }
            last = Some(at);
            if at < log_start || (!clean && at >= facts.end.offset()) {
                continue; // deleted by retention, or appended after the log was read
            }
            if index.names_timers && facts.timed(at).is_none() {
                return Err(bad(format!("names log offset {at}, which is not a timed message record")));
            }
        }
    }
    Ok(())
}

/// The entries per file a key-index file's header gives, after checking
/// its magic, that it names its first message offset as its name does, and
/// its size.
fn key_file_header(file: &DataFile, first: u64, index: &SideIndex) -> Result<u64> {
    let header = file.header(index.kind)?;
    // Entries are numbered in 32 bits.
    if header.a == 0 || header.a > u64::from(u32::MAX) {
        return Err(DumpError::bad_reference(&file.path, 0, format!("{} entries per file", header.a)));
    }
    file.expect_field("first message offset", header.b, first)?;
    file.expect_len((index.geometry)(header.a).file_len())?;
    Ok(header.a)
}

fn check_topic_pending(path: &Path, facts: &LogFacts, checked: &mut Checked) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let bytes = std::fs::read(path).map_err(|e| DumpError::io("read", path, e))?;
    let Some(topic_counts::TopicPendingFile { through, by_topic, .. }) = topic_counts::decode(&bytes) else {
        return Err(DumpError::bad_reference(
            path,
            0,
            "does not decode (its CRC or a count): the next open counts again",
        ));
    };
    if through > facts.end.offset() {
        let why =
            format!("counts the records below {through}, past the end of the log at {}", facts.end.offset());
        return Err(DumpError::bad_reference(path, 0, why));
    }
    checked.file_headers += 1;
    checked.topic_pending_topics = by_topic.len() as u64;
    Ok(())
}

fn check_consumer_offsets(path: &Path, checked: &mut Checked) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if meta.file_type().is_symlink() {
        return Err(DumpError::bad_reference(
            path,
            0,
            "a symbolic link: the store refuses to read through one",
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| DumpError::io("read", path, e))?;
    match consumer_offsets::decode(&bytes) {
        Ok(file) => {
            checked.consumer_offsets = file.offsets.len() as u64;
            Ok(())
        }
        Err(consumer_offsets::OffsetsProblem::Garbled(why)) => Err(DumpError::bad_reference(
            path,
            0,
            format!(
                "not a consumer-offsets file ({why}): the next open rebuilds it from the positions messages"
            ),
        )),
        Err(consumer_offsets::OffsetsProblem::UnsupportedVersion(found)) => {
            let why = format!("version {found}, which this build does not read");
            Err(DumpError::bad_reference(path, 0, why))
        }
    }
}
