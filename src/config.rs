//! Store configuration, validated once at open.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::format::FILE_HEADER_LEN;
use crate::format::key_index::Geometry;
use crate::format::record::MAX_FIXED_MESSAGE_LEN;

/// When a `put` may return relative to its bytes reaching the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushMode {
    /// `put` returns once the record is in the page cache; a background flusher
    /// syncs every flush interval ([`Config::with_flush_interval`]). A power loss can lose that window;
    /// a killed process loses nothing (the page cache survives it).
    #[default]
    Async,
    /// `put` returns once the record is on disk. Concurrent puts share one sync.
    Sync,
}

/// What the store does with damage to the commit log that is not a torn
/// tail: a record once known durable that no longer checks out, a damaged
/// segment header. (A torn tail, the unsynced end a crash leaves, is cut in
/// either mode: that is normal.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoveryMode {
    /// Refuse: the open (or the read that meets it) fails with
    /// [`Error::Corruption`](crate::Error::Corruption) naming file and offset.
    Strict,
    /// Damage costs only what it damaged (the default): a damaged stretch of
    /// records is skipped to the next record that checks out, logged with
    /// its file, offset and length, and counted (`Stats::damaged_log_bytes`);
    /// a segment header that does not check out is written again from what
    /// the file's name and size say; everything before and after is kept.
    /// The rule is `wheel-format.md`'s "Recovery rules".
    #[default]
    Lenient,
}

/// Which scheduler holds timed messages until they are due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scheduler {
    /// One persisted hierarchical timing wheel with one-second slots, one
    /// ticking thread, delivery by reference, exactly once across crashes.
    #[default]
    Wheel,
    /// The RocketMQ 4.x design, kept as the baseline the benches compare the
    /// wheel against: one FIFO queue per delay level polled every 100 ms, the
    /// message written again into its topic when due, progress persisted
    /// periodically (at least once across crashes). Arbitrary deliver times
    /// are rounded up to the next level. See `src/schedule/`.
    Buckets,
}

/// Everything `Store::open` needs. Build with [`Config::new`] and the `with_*` setters.
#[derive(Clone)]
pub struct Config {
    pub(crate) dir: PathBuf,
    pub(crate) segment_size: u64,
    pub(crate) queue_file_entries: u64,
    pub(crate) queues_per_topic: u32,
    /// `None`: 4 MiB, or less if a smaller segment cannot hold that.
    pub(crate) max_body_bytes: Option<usize>,
    pub(crate) flush_mode: FlushMode,
    pub(crate) flush_interval: Duration,
    pub(crate) recovery_mode: RecoveryMode,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) delay_levels: String,
    pub(crate) timer_log_file_entries: u64,
    pub(crate) key_index_file_entries: u64,
    pub(crate) dedup_window: Duration,
    pub(crate) disk_reserve: Option<u64>,
    pub(crate) deliver: bool,
    pub(crate) scheduler: Scheduler,
    pub(crate) schedule_offsets_interval: Duration,
    pub(crate) max_index_lag: u64,
    pub(crate) put_timeout: Duration,
    pub(crate) retention: Retention,
    pub(crate) dir_mode: u32,
    pub(crate) handle_key: Option<HandleKey>,
}

/// The key of sealed handles ([`Config::with_handle_key`]); never printed.
#[derive(Clone)]
pub(crate) struct HandleKey(pub(crate) [u8; 32]);

/// When commit-log segments may be deleted. A segment is deleted oldest first,
/// never the one being appended to, and only once everything in it is indexed
/// and checkpointed; its pending timers are first moved to the relocation area
/// (see `wheel-format.md`), so no pending timer is ever lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Keep a segment at least this long after it was filled (`None`: no age limit).
    pub keep_for: Option<Duration>,
    /// Keep the commit log (segments and relocated copies) under this many
    /// bytes, deleting the oldest segments early if needed (`None`: no cap).
    /// When nothing can be deleted, `put` waits up to the put timeout and then
    /// fails with `Error::SizeCap`.
    pub max_log_bytes: Option<u64>,
    /// How often the retention thread looks for work.
    pub check_interval: Duration,
}

impl Default for Retention {
    /// 72 hours, no size cap, checked every 10 s.
    fn default() -> Self {
        Self {
            keep_for: Some(Duration::from_secs(72 * 3600)),
            max_log_bytes: None,
            check_interval: Duration::from_secs(10),
        }
    }
}

/// Room kept for the small files written beside the indexes (a file system
/// allocates each in whole pages).
const SMALL_FILES_RESERVE: u64 = 64 << 10;
/// The smallest segment size accepted (tests use it to roll segments quickly).
pub const MIN_SEGMENT_SIZE: u64 = 64 * 1024;

/// How long a dedup key stands after its timer fired or was cancelled, by default.
pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// RocketMQ's default delay-level table: levels 1 to 18.
pub const DEFAULT_DELAY_LEVELS: &str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";

impl Config {
    /// Defaults: 1 GiB segments, 300,000 entries per consume-queue file, 4 queues
    /// per topic, 4 MiB bodies, async flush every 200 ms, strict recovery, system clock.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            segment_size: 1 << 30,
            queue_file_entries: 300_000,
            queues_per_topic: 4,
            max_body_bytes: None,
            flush_mode: FlushMode::Async,
            flush_interval: Duration::from_millis(200),
            recovery_mode: RecoveryMode::Lenient,
            clock: Arc::new(SystemClock),
            delay_levels: DEFAULT_DELAY_LEVELS.to_string(),
            timer_log_file_entries: crate::format::timer_entry::DEFAULT_ENTRIES_PER_FILE,
            key_index_file_entries: crate::format::key_index::DEFAULT_ENTRIES_PER_FILE,
            dedup_window: DEFAULT_DEDUP_WINDOW,
            disk_reserve: None,
            deliver: true,
            scheduler: Scheduler::Wheel,
            schedule_offsets_interval: Duration::from_secs(10),
            max_index_lag: 512 << 10,
            put_timeout: Duration::from_secs(10),
            retention: Retention::default(),
            dir_mode: 0o700,
            handle_key: None,
        }
    }

    /// The permission bits of the store directory (default 0700), set when
    /// the store opens. Every directory the store makes inside it gets the
    /// same mode and every file it creates the mode without the execute bits
    /// (0600 by default), both further narrowed by the process umask. Use
    /// 0750 to let a group (a backup or monitoring account) read the store.
    pub fn with_dir_mode(mut self, mode: u32) -> Self {
        self.dir_mode = mode;
        self
    }

    /// The secret key of sealed handles: with it, [`Store::seal`](crate::Store::seal)
    /// turns a handle into a [`SealedHandle`](crate::SealedHandle) that
    /// carries a keyed MAC over its offset and deliver time, and
    /// [`Store::cancel_sealed`](crate::Store::cancel_sealed) cancels only
    /// handles sealed with this key. Use it when cancel is exposed to
    /// clients: a plain [`Handle`](crate::Handle) is a bearer token naming a
    /// log position, which anyone can make up. Keep the key secret and the
    /// same across restarts (sealed handles made before a change of key are
    /// refused after it).
    pub fn with_handle_key(mut self, key: [u8; 32]) -> Self {
        self.handle_key = Some(HandleKey(key));
        self
    }

    /// When commit-log segments are deleted (default: 72 h after they are
    /// filled, no size cap). Applies to the wheel scheduler; the bucket
    /// baseline keeps every segment.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// The legacy delay-level table, e.g. `"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"`
    /// (the default); units `s`, `m`, `h`, `d`. Checked by `Store::open`.
    pub fn with_delay_levels(mut self, table: impl Into<String>) -> Self {
        self.delay_levels = table.into();
        self
    }

    /// Bytes that must stay free beside a new commit-log segment, so the
    /// indexes can still grow when the disk fills (default: two files of
    /// each timer log, two consume-queue files, and 64 KiB for the small
    /// files rewritten beside them: segment counts, relocation index).
    pub fn with_disk_reserve(mut self, bytes: u64) -> Self {
        self.disk_reserve = Some(bytes);
        self
    }

    pub(crate) fn disk_reserve(&self) -> u64 {
        let timer_log_file = 32 + self.timer_log_file_entries * crate::format::timer_entry::ENTRY_LEN as u64;
        let queue_file = 32 + self.queue_file_entries * crate::format::queue_entry::ENTRY_LEN as u64;
        let key_index_file = crate::format::key_index::file_len(self.key_index_file_entries);
        let dedup_index_file = Geometry::dedup(self.key_index_file_entries).file_len();
        // Two timer logs (near and far), each may need a new file.
        self.disk_reserve.unwrap_or(
            4 * timer_log_file + 2 * queue_file + key_index_file + dedup_index_file + SMALL_FILES_RESERVE,
        )
    }

    /// Whether the ticking thread delivers due timers (default). With `false`
    /// the store recovers and indexes but fires nothing: for inspection. Its
    /// [`Store::fresh_stats`](crate::Store::fresh_stats) counts the pending
    /// timers exactly, reading every live chain (see the README's "Stats").
    pub fn with_delivery(mut self, deliver: bool) -> Self {
        self.deliver = deliver;
        self
    }

    /// Which scheduler holds timed messages (default: the wheel). A directory
    /// keeps the timers of the scheduler it was written with: reopen it with the same one.
    pub fn with_scheduler(mut self, scheduler: Scheduler) -> Self {
        self.scheduler = scheduler;
        self
    }

    /// How often the bucket scheduler persists its per-level progress
    /// (default 10 s, RocketMQ's `flushDelayOffsetInterval`). After a crash
    /// the buckets deliver again what they delivered in that window.
    pub fn with_schedule_offsets_interval(mut self, interval: Duration) -> Self {
        self.schedule_offsets_interval = interval;
        self
    }

    /// How far (in commit-log bytes) the indexes may fall behind before `put`
    /// waits for them (default 512 KiB, a few milliseconds of puts); while a
    /// full disk stalls an index, a timer counts until the wheel holds it. The
    /// dispatcher handles records in log order, so a timer due during a burst
    /// of puts, and its delivery record, wait behind everything put before
    /// them: a small lag keeps that wait short. It also bounds the replay
    /// after a crash, and so recovery time.
    pub fn with_max_index_lag(mut self, bytes: u64) -> Self {
        self.max_index_lag = bytes;
        self
    }

    /// How long a `put` waits (default 10 s): for the indexes to catch up,
    /// before it fails with `Error::Busy` and nothing written; and in sync
    /// mode for the disk once its record is appended, before it answers
    /// `Error::NotYetDurable` with the receipt (the message stands). A sync
    /// mode cancel waits for its cancel record the same way.
    pub fn with_put_timeout(mut self, timeout: Duration) -> Self {
        self.put_timeout = timeout;
        self
    }

    /// Entries per timer-log file (default 2 Mi, 56 MiB files).
    pub fn with_timer_log_file_entries(mut self, entries: u64) -> Self {
        self.timer_log_file_entries = entries;
        self
    }

    /// Entries per key-index file (default 1 Mi: 20 MiB files, each holding
    /// the timed messages with a key of a run of the log; see
    /// [`Store::pending_by_key`](crate::Store::pending_by_key)).
    pub fn with_key_index_file_entries(mut self, entries: u64) -> Self {
        self.key_index_file_entries = entries;
        self
    }

    /// How long a dedup key stands after its message's timer fired (from
    /// its due time) or was cancelled, or after an ordinary message was put
    /// (default 24 h; see [`Message::dedup_key`](crate::Message::dedup_key)).
    /// Days or months are fine: the dedup index stays on disk, and a key
    /// stands while its message's record is kept, so the window is bounded
    /// by retention ([`Retention::keep_for`], 72 h by default): a longer
    /// window needs a longer retention.
    pub fn with_dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    /// Commit-log segment size in bytes (default 1 GiB): a power of two of at
    /// least [`MIN_SEGMENT_SIZE`]. A store must be reopened with the size it was
    /// made with (its segments say so; another size is refused as corruption).
    pub fn with_segment_size(mut self, bytes: u64) -> Self {
        self.segment_size = bytes;
        self
    }

    /// Entries per consume-queue file (default 300,000; at most 16,777,216).
    /// Like the segment size, fixed for the life of a store.
    pub fn with_queue_file_entries(mut self, entries: u64) -> Self {
        self.queue_file_entries = entries;
        self
    }

    /// Queues per topic (default 4; 1 to 1024). A message goes to the queue its
    /// id names, or its key picks, or queue 0.
    pub fn with_queues_per_topic(mut self, queues: u32) -> Self {
        self.queues_per_topic = queues;
        self
    }

    /// The largest body `put` accepts (default 4 MiB, or less if a segment
    /// cannot hold that beside the largest metadata); a larger one is refused
    /// with [`Error::Invalid`](crate::Error::Invalid) naming the body.
    pub fn with_max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = Some(bytes);
        self
    }

    /// The largest body a message may have: as set, or 4 MiB, or what a
    /// segment can hold beside the largest metadata, whichever is smaller.
    pub fn max_body_bytes(&self) -> usize {
        // Saturating for a segment size not yet validated (`validate` refuses it).
        let room = (self.segment_size as usize).saturating_sub(FILE_HEADER_LEN + MAX_FIXED_MESSAGE_LEN);
        self.max_body_bytes.unwrap_or((4 << 20).min(room))
    }

    /// When `put` returns relative to the disk (default [`FlushMode::Async`]).
    pub fn with_flush_mode(mut self, mode: FlushMode) -> Self {
        self.flush_mode = mode;
        self
    }

    /// How often the flusher syncs and checkpoints in async mode (default 200 ms).
    pub fn with_flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = interval;
        self
    }

    /// What the store does with damage to the commit log (default
    /// [`RecoveryMode::Lenient`]: skip what is damaged, keep the rest).
    pub fn with_recovery_mode(mut self, mode: RecoveryMode) -> Self {
        self.recovery_mode = mode;
        self
    }

    /// The clock the store asks for the time (default [`SystemClock`]); a
    /// [`ManualClock`](crate::ManualClock) lets tests move through years in milliseconds.
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The store directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.segment_size < MIN_SEGMENT_SIZE || !self.segment_size.is_power_of_two() {
            return Err(Error::invalid(
                "segment size",
                format!("{} is not a power of two of at least {MIN_SEGMENT_SIZE}", self.segment_size),
            ));
        }
        let room = self.segment_size as usize - FILE_HEADER_LEN;
        // A message of the largest body and maximal metadata must fit in one segment.
        if self.max_body_bytes().saturating_add(MAX_FIXED_MESSAGE_LEN) > room {
            return Err(Error::invalid(
                "max body bytes",
                format!("{} does not fit in a {}-byte segment", self.max_body_bytes(), self.segment_size),
            ));
        }
        if self.queue_file_entries == 0 || self.queue_file_entries > 1 << 24 {
            return Err(Error::invalid("queue file entries", "must be between 1 and 16,777,216"));
        }
        if self.queues_per_topic == 0 || self.queues_per_topic > 1024 {
            return Err(Error::invalid("queues per topic", "must be between 1 and 1024"));
        }
        if self.timer_log_file_entries == 0 || self.timer_log_file_entries > 1 << 26 {
            return Err(Error::invalid("timer log file entries", "must be between 1 and 67,108,864"));
        }
        if self.key_index_file_entries == 0 || self.key_index_file_entries > 1 << 24 {
            return Err(Error::invalid("key index file entries", "must be between 1 and 16,777,216"));
        }
        if self.flush_interval.is_zero() {
            return Err(Error::invalid("flush interval", "must be positive"));
        }
        if self.retention.check_interval.is_zero() {
            return Err(Error::invalid("retention check interval", "must be positive"));
        }
        // The store itself must be able to list, create and write.
        if self.dir_mode & !0o777 != 0 || self.dir_mode & 0o700 != 0o700 {
            let why = format!(
                "{:o} must be permission bits that give the owner rwx (0700 at least)",
                self.dir_mode
            );
            return Err(Error::invalid("dir mode", why));
        }
        if let Some(cap) = self.retention.max_log_bytes
            && cap < 2 * self.segment_size
        {
            let why = format!("{cap} bytes cannot hold two {}-byte segments", self.segment_size);
            return Err(Error::invalid("retention size cap", why));
        }
        Ok(())
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("dir", &self.dir)
            .field("segment_size", &self.segment_size)
            .field("queue_file_entries", &self.queue_file_entries)
            .field("queues_per_topic", &self.queues_per_topic)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("flush_mode", &self.flush_mode)
            .field("flush_interval", &self.flush_interval)
            .field("recovery_mode", &self.recovery_mode)
            .field("delay_levels", &self.delay_levels)
            .field("scheduler", &self.scheduler)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}
