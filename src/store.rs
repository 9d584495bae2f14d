//! The façade: `Store` opens (recovering) a directory, owns the background
//! threads, and offers put, consume and close.
//!
//! Directory layout (see `wheel-format.md`):
//! ```text
//! LOCK                                   held while a Store is open
//! checkpoint                             index: where recovery starts
//! commitlog/<20-digit offset>            TRUTH: every record
//! consumequeue/<topic>/<queue>/<index>   index: per-queue entries
//! consumer_offsets.json                  consumer progress
//! ```

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::checkpoint::{Checkpoint, CheckpointFile};
use crate::commitlog::record::{Timing, encode_message, message_len};
use crate::commitlog::{CommitLog, RecoveryPlan, RecoveryReport};
use crate::config::{Config, FlushMode};
use crate::consume_queue::QueueRegistry;
use crate::consumer::{Consumer, OffsetStore};
use crate::dispatcher::Dispatcher;
use crate::error::{Error, Result};
use crate::flusher::{FlushSignal, Flusher};
use crate::message::{Message, Receipt, validate_topic};

/// The consumer group of [`Store::consumer`].
pub const DEFAULT_GROUP: &str = "default";
/// How long a sync-mode put waits for the disk before giving up.
const SYNC_PUT_TIMEOUT: Duration = Duration::from_secs(30);

/// An open store. Dropping it stops its threads; [`close`](Store::close) also reports errors.
pub struct Store {
    config: Config,
    log: Arc<CommitLog>,
    queues: Arc<QueueRegistry>,
    offsets: Arc<OffsetStore>,
    dispatch_wake: Sender<()>,
    prefault_wake: Sender<()>,
    flush_signal: Sender<FlushSignal>,
    threads: Option<Threads>,
    recovery: RecoveryReport,
    _lock: File,
}

/// The background threads, each with one job.
struct Threads {
    /// Tells the dispatcher and the prefaulter to finish.
    stop: Arc<AtomicBool>,
    /// Indexes records into consume queues.
    dispatcher: JoinHandle<()>,
    /// Faults in commit-log pages ahead of the writer.
    prefaulter: JoinHandle<()>,
    /// Syncs to disk and writes checkpoints.
    flusher: JoinHandle<Result<()>>,
}

impl Store {
    /// Opens the store in `config.dir`, creating it if needed and recovering it
    /// if it was not closed cleanly.
    pub fn open(config: Config) -> Result<Self> {
        config.validate()?;
        let dir = config.dir.clone();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        let lock = lock_dir(&dir)?;
        let _span = tracing::info_span!("open", dir = %dir.display()).entered();

        let mut checkpoint = CheckpointFile::open(&dir.join("checkpoint"))?;
        let last = checkpoint.last();
        let queue_root = dir.join("consumequeue");
        // Without a checkpoint or without the queues, rebuild every index from the log's start.
        let trusted = last.filter(|_| queue_root.exists());
        let plan = RecoveryPlan {
            start: trusted.map(|cp| cp.dispatched),
            durable: last.map_or(0, |cp| cp.log_durable),
            clean_end: last.filter(|cp| cp.clean).map(|cp| cp.log_durable),
            mode: config.recovery_mode,
        };
        let (log, recovery) = CommitLog::open(&dir.join("commitlog"), config.segment_size, &plan)?;
        let log = Arc::new(log);
        // Records the recovery validated may still be only in the page cache.
        log.flush()?;
        let replay_from = plan.start.unwrap_or(0).clamp(log.start(), log.write_end());
        let queues = Arc::new(QueueRegistry::open(&queue_root, config.queue_file_entries, replay_from)?);
        let offsets = Arc::new(OffsetStore::open(&dir.join("consumer_offsets.json"))?);
        // Clear the clean flag before anything is appended.
        checkpoint.write(Checkpoint {
            log_durable: log.durable_end(),
            dispatched: replay_from,
            written_at_ms: config.clock.now_ms(),
            ..Default::default()
        })?;

        let dispatched = Arc::new(AtomicU64::new(replay_from));
        let dispatcher =
            Dispatcher::new(Arc::clone(&log), Arc::clone(&queues), replay_from, Arc::clone(&dispatched));
        let flusher = Flusher {
            log: Arc::clone(&log),
            queues: Arc::clone(&queues),
            offsets: Arc::clone(&offsets),
            checkpoint,
            dispatched,
            clock: Arc::clone(&config.clock),
            interval: config.flush_interval,
        };
        let (dispatch_wake, dispatch_rx) = crossbeam_channel::bounded(1);
        let (prefault_wake, prefault_rx) = crossbeam_channel::bounded(1);
        let (flush_signal, flush_rx) = crossbeam_channel::bounded(1);
        let threads = spawn_threads(dispatcher, dispatch_rx, prefault_rx, flusher, flush_rx)?;
        tracing::info!(end = recovery.end, replay_from, "store open");
        Ok(Self {
            config,
            log,
            queues,
            offsets,
            dispatch_wake,
            prefault_wake,
            flush_signal,
            threads: Some(threads),
            recovery,
            _lock: lock,
        })
    }

    /// Appends a message. In async flush mode it returns once the message is in
    /// the page cache; in sync mode once it is on disk.
    pub fn put(&self, message: Message) -> Result<Receipt> {
        message.validate(self.config.max_body_bytes())?;
        let queue_id = message.resolve_queue(self.config.queues_per_topic)?;
        if self.threads.is_none() {
            return Err(Error::Closed);
        }
        let store_time_ms = self.config.clock.now_ms();
        let len = message_len(&message);
        let (offset, prefault) = self.log.append(len, |buf, offset| {
            encode_message(buf, offset, &message, queue_id, store_time_ms, Timing::default());
        })?;
        let _ = self.dispatch_wake.try_send(());
        if prefault {
            let _ = self.prefault_wake.try_send(());
        }
        if self.config.flush_mode == FlushMode::Sync {
            let _ = self.flush_signal.try_send(FlushSignal::Wake);
            self.log.wait_durable(offset + len as u64, SYNC_PUT_TIMEOUT)?;
        }
        Ok(Receipt { offset, queue_id, store_time_ms })
    }

    /// A consumer of `topic`'s queue `queue_id` in the [`DEFAULT_GROUP`].
    pub fn consumer(&self, topic: &str, queue_id: u32) -> Result<Consumer> {
        self.consumer_in_group(DEFAULT_GROUP, topic, queue_id)
    }

    /// A consumer of `topic`'s queue `queue_id` that commits offsets for `group`.
    pub fn consumer_in_group(&self, group: &str, topic: &str, queue_id: u32) -> Result<Consumer> {
        validate_topic(topic)?;
        if queue_id >= self.config.queues_per_topic {
            let why =
                format!("{queue_id} is not below the {} queues of a topic", self.config.queues_per_topic);
            return Err(Error::invalid("queue id", why));
        }
        let queue = self.queues.get_or_create(topic, queue_id);
        Ok(Consumer::new(Arc::clone(&self.log), queue, Arc::clone(&self.offsets), group))
    }

    /// What recovery found when this store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Bytes of commit-log and consume-queue files.
    pub fn disk_bytes(&self) -> u64 {
        self.log.disk_bytes() + self.queues.disk_bytes()
    }

    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// Stops accepting puts, indexes everything written, syncs, writes a clean
    /// checkpoint and joins the threads.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        let Some(threads) = self.threads.take() else {
            return Ok(());
        };
        self.log.close();
        threads.stop.store(true, Ordering::Release);
        let _ = self.dispatch_wake.try_send(());
        let _ = self.prefault_wake.try_send(());
        let dispatcher = threads.dispatcher.join();
        let prefaulter = threads.prefaulter.join();
        let _ = self.flush_signal.send(FlushSignal::Stop);
        let flushed = threads.flusher.join();
        if dispatcher.is_err() || prefaulter.is_err() {
            return Err(Error::invalid("shutdown", "a background thread panicked"));
        }
        flushed.unwrap_or_else(|_| Err(Error::invalid("shutdown", "the flusher thread panicked")))?;
        self.log.check_poison()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "store did not close cleanly");
        }
    }
}

/// Takes the directory's `LOCK` file, exclusively.
fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join("LOCK");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io("open", &path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(Error::Locked { dir: dir.to_path_buf() }),
        Err(TryLockError::Error(e)) => Err(Error::io("lock", &path, e)),
    }
}

fn spawn_threads(
    mut dispatcher: Dispatcher,
    dispatch_wake: Receiver<()>,
    prefault_wake: Receiver<()>,
    flusher: Flusher,
    flush_signals: Receiver<FlushSignal>,
) -> Result<Threads> {
    let stop = Arc::new(AtomicBool::new(false));
    let spawn = |name: &str| std::thread::Builder::new().name(format!("delaywheel-{name}"));
    let spawn_err = |e| Error::io("spawn thread", "delaywheel", e);

    let (log, stopping) = (Arc::clone(&flusher.log), Arc::clone(&stop));
    let dispatcher = spawn("dispatch")
        .spawn(move || {
            loop {
                if let Err(e) = dispatcher.dispatch_available() {
                    tracing::error!(error = %e, "dispatcher stopped");
                    log.poison(&format!("dispatcher: {e}"));
                    return;
                }
                // Stop only once everything appended before close is indexed.
                if stopping.load(Ordering::Acquire) && dispatcher.next() >= log.write_end() {
                    return;
                }
                let _ = dispatch_wake.recv_timeout(Duration::from_millis(100));
            }
        })
        .map_err(spawn_err)?;

    let (log, stopping) = (Arc::clone(&flusher.log), Arc::clone(&stop));
    let prefaulter = spawn("prefault")
        .spawn(move || {
            while !stopping.load(Ordering::Acquire) {
                if !log.prefault_ahead() {
                    let _ = prefault_wake.recv_timeout(Duration::from_millis(100));
                }
            }
        })
        .map_err(spawn_err)?;

    let flusher = spawn("flush").spawn(move || flusher.run(flush_signals)).map_err(spawn_err)?;
    Ok(Threads { stop, dispatcher, prefaulter, flusher })
}
