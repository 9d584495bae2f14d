//! Where every file of a store lives, and the rules read off the directory
//! itself: which indexes are present, and so whether a reopened store resumes
//! them at its checkpoint or rebuilds them from the commit log.
//!
//! ```text
//! LOCK                                   held while a Store is open
//! checkpoint                             index: where recovery starts
//! commitlog/<20-digit offset>            TRUTH: every record
//! commitlog/relocated/<window second>    TRUTH: copies of pending timers of deleted segments
//! commitlog/relocated/index              where each copy is
//! commitlog/relocated/compacted          the log end at the index's last compaction
//! consumequeue/<topic>/<queue>/<index>   index: per-queue entries
//! timer/wheel                            index: the wheel's slots
//! timer/tails                            index: where each slot's chain begins
//! timer/timerlog/<20-digit index>        index: level-0 slots' timer entries
//! timer/timerlog-far/<20-digit index>    index: level-1 and level-2 slots' timer entries
//! timer/cancelled/<20-digit index>       index: every cancel answered `Cancelled`
//! timer/pins                             index: the ledger's reschedules folded, up to an entry
//! timer/segment_pending                  index: pending timers per segment
//! index/keys/<20-digit offset>           index: timed messages by topic and key
//! index/topic_pending                    index: pending timers per topic
//! schedule/delay_offsets.json            bucket scheduler progress (buckets only)
//! consumer_offsets.json                  consumer progress
//! ```

use std::path::{Path, PathBuf};

use crate::format::checkpoint::Checkpoint;

/// The lock file a running store holds.
pub const LOCK_FILE: &str = "LOCK";
/// The checkpoint file.
pub const CHECKPOINT_FILE: &str = "checkpoint";
/// The commit log's directory.
pub const COMMIT_LOG_DIR: &str = "commitlog";
/// The relocation area's directory, inside [`COMMIT_LOG_DIR`].
pub const RELOCATED_DIR: &str = "relocated";
/// The relocation index's file name, inside [`RELOCATED_DIR`].
pub const RELOCATION_INDEX_FILE: &str = "index";
/// The file, inside [`RELOCATED_DIR`], holding one decimal number and a
/// newline: the commit-log end at the last compaction of the relocation
/// index. Relocation records below it may name copies the index has dropped.
pub const RELOCATION_COMPACTED_FILE: &str = "compacted";
/// The consume queues' root directory.
pub const CONSUME_QUEUE_DIR: &str = "consumequeue";
/// The timer index's directory.
pub const TIMER_DIR: &str = "timer";
/// The wheel file's name, inside [`TIMER_DIR`].
pub const WHEEL_FILE: &str = "wheel";
/// The chain starts' file name, inside [`TIMER_DIR`].
pub const TAILS_FILE: &str = "tails";
/// The near timer log's directory inside [`TIMER_DIR`]: the chains of level-0 slots.
pub const TIMER_LOG_DIR: &str = "timerlog";
/// The far timer log's directory inside [`TIMER_DIR`]: the chains of level-1 and level-2 slots.
pub const FAR_TIMER_LOG_DIR: &str = "timerlog-far";
/// The cancel ledger's directory inside [`TIMER_DIR`].
pub const CANCEL_LEDGER_DIR: &str = "cancelled";
/// The pins snapshot's file name, inside [`TIMER_DIR`].
pub const PINS_FILE: &str = "pins";
/// The segment counts' file name, inside [`TIMER_DIR`].
pub const SEGMENT_COUNTS_FILE: &str = "segment_pending";
/// The directory of the indexes by content.
pub const INDEX_DIR: &str = "index";
/// The key index's directory, inside [`INDEX_DIR`].
pub const KEY_INDEX_DIR: &str = "keys";
/// The dedup index's directory, inside [`INDEX_DIR`].
pub const DEDUP_INDEX_DIR: &str = "dedup";
/// The pending counts per topic, inside [`INDEX_DIR`].
pub const TOPIC_PENDING_FILE: &str = "topic_pending";
/// The bucket scheduler's directory (its presence marks a bucket store).
pub const BUCKETS_DIR: &str = "schedule";
/// The bucket scheduler's persisted offsets, inside [`BUCKETS_DIR`].
pub const DELAY_OFFSETS_FILE: &str = "delay_offsets.json";
/// Committed consumer offsets.
pub const CONSUMER_OFFSETS_FILE: &str = "consumer_offsets.json";

/// The paths of one store directory.
#[derive(Debug, Clone)]
pub struct Layout {
    dir: PathBuf,
}

impl Layout {
    /// The layout of the store in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `LOCK`.
    pub fn lock(&self) -> PathBuf {
        self.dir.join(LOCK_FILE)
    }

    /// `checkpoint`.
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join(CHECKPOINT_FILE)
    }

    /// `commitlog/`.
    pub fn commit_log(&self) -> PathBuf {
        self.dir.join(COMMIT_LOG_DIR)
    }

    /// `commitlog/relocated/`.
    pub fn relocated(&self) -> PathBuf {
        self.commit_log().join(RELOCATED_DIR)
    }

    /// `commitlog/relocated/index`.
    pub fn relocation_index(&self) -> PathBuf {
        self.relocated().join(RELOCATION_INDEX_FILE)
    }

    /// `commitlog/relocated/compacted`.
    pub fn relocation_compacted(&self) -> PathBuf {
        self.relocated().join(RELOCATION_COMPACTED_FILE)
    }

    /// `consumequeue/`.
    pub fn consume_queues(&self) -> PathBuf {
        self.dir.join(CONSUME_QUEUE_DIR)
    }

    /// `timer/`.
    pub fn timer(&self) -> PathBuf {
        self.dir.join(TIMER_DIR)
    }

    /// `timer/wheel`.
    pub fn wheel(&self) -> PathBuf {
        self.timer().join(WHEEL_FILE)
    }

    /// `timer/tails`.
    pub fn tails(&self) -> PathBuf {
        self.timer().join(TAILS_FILE)
    }

    /// The directory of timer log `log` (`0` near, `1` far; see
    /// [`timer_log_of`](crate::timer::geometry::timer_log_of)).
    pub fn timer_log(&self, log: usize) -> PathBuf {
        self.timer().join(if log == 0 { TIMER_LOG_DIR } else { FAR_TIMER_LOG_DIR })
    }

    /// `timer/cancelled/`.
    pub fn cancel_ledger(&self) -> PathBuf {
        self.timer().join(CANCEL_LEDGER_DIR)
    }

    /// `timer/pins`.
    pub fn pins(&self) -> PathBuf {
        self.timer().join(PINS_FILE)
    }

    /// `timer/segment_pending`.
    pub fn segment_counts(&self) -> PathBuf {
        self.timer().join(SEGMENT_COUNTS_FILE)
    }

    /// `index/keys/`.
    pub fn key_index(&self) -> PathBuf {
        self.dir.join(INDEX_DIR).join(KEY_INDEX_DIR)
    }

    /// `index/dedup/`.
    pub fn dedup_index(&self) -> PathBuf {
        self.dir.join(INDEX_DIR).join(DEDUP_INDEX_DIR)
    }

    /// `index/topic_pending`.
    pub fn topic_pending(&self) -> PathBuf {
        self.dir.join(INDEX_DIR).join(TOPIC_PENDING_FILE)
    }

    /// `schedule/`.
    pub fn buckets(&self) -> PathBuf {
        self.dir.join(BUCKETS_DIR)
    }

    /// `consumer_offsets.json`.
    pub fn consumer_offsets(&self) -> PathBuf {
        self.dir.join(CONSUMER_OFFSETS_FILE)
    }

    /// Whether `dir` holds a store: a commit log, or the `LOCK` file alone
    /// (the first open lost power before it made `commitlog/`; nothing was
    /// acknowledged, and opening it makes a fresh store).
    pub fn is_store(&self) -> bool {
        self.commit_log().is_dir() || self.lock().is_file()
    }

    /// The index holding `file`, as the directory or file that is removed to
    /// rebuild it from the log: the consume queues, the key index, the
    /// per-topic counts, or the wheel's files. `None` for the truth (the
    /// commit log and its relocated copies) and anything else.
    pub fn index_holding(&self, file: &Path) -> Option<PathBuf> {
        [self.consume_queues(), self.key_index(), self.topic_pending(), self.timer()]
            .into_iter()
            .find(|index| file.starts_with(index))
    }

    /// Whether every index a checkpoint vouches for is present (the consume
    /// queues' directory and the wheel file): only then do the indexes
    /// resume at the checkpoint; otherwise each is rebuilt from the start of
    /// the commit log.
    pub fn indexes_present(&self) -> bool {
        self.consume_queues().exists() && self.wheel().exists()
    }

    /// The checkpoint a reopened store resumes its indexes at: the newest
    /// valid one, if every index it vouches for is present.
    pub fn resume_point(&self, newest: Option<Checkpoint>) -> Option<Checkpoint> {
        newest.filter(|_| self.indexes_present())
    }
}
