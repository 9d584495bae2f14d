//! The dispatcher: the one thread that turns commit-log records into index
//! entries. It tails the log from the checkpoint's `dispatched` offset, so
//! after a crash it simply replays what the indexes may have missed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::commitlog::CommitLog;
use crate::commitlog::record::{MessageView, RecordKind};
use crate::consume_queue::{ConsumeQueue, Entry, QueueRegistry, tag_hash};
use crate::error::Result;

/// Routes records to the indexes.
pub(crate) struct Dispatcher {
    log: Arc<CommitLog>,
    queues: Arc<QueueRegistry>,
    next: u64,
    /// Every record below this offset is indexed (read by the flusher for checkpoints).
    progress: Arc<AtomicU64>,
}

impl Dispatcher {
    pub fn new(log: Arc<CommitLog>, queues: Arc<QueueRegistry>, from: u64, progress: Arc<AtomicU64>) -> Self {
        progress.store(from, Ordering::Release);
        Self { log, queues, next: from, progress }
    }

    /// Indexes every record published so far. Returns how many records it indexed.
    pub fn dispatch_available(&mut self) -> Result<usize> {
        let end = self.log.write_end();
        let mut touched: Vec<Arc<ConsumeQueue>> = Vec::new();
        let mut count = 0;
        let result = loop {
            if self.next >= end {
                break Ok(count);
            }
            let indexed =
                self.log.visit_trusted(self.next, |offset, kind, bytes| self.index(offset, kind, bytes));
            let (queue, next) = match indexed {
                Ok((Ok(queue), next)) => (queue, next),
                Ok((Err(e), _)) | Err(e) => break Err(e),
            };
            if let Some(queue) = queue
                && !touched.iter().any(|q| Arc::ptr_eq(q, &queue))
            {
                touched.push(queue);
            }
            self.next = next;
            count += 1;
        };
        // Wake consumers for what was indexed, even if a later record failed.
        self.progress.store(self.next, Ordering::Release);
        touched.iter().for_each(|q| q.notify());
        result
    }

    /// Indexes one record; returns the consume queue it went to, if any.
    fn index(&self, offset: u64, kind: RecordKind, bytes: &[u8]) -> Result<Option<Arc<ConsumeQueue>>> {
        match kind {
            RecordKind::Message => {
                let view = MessageView::parse(bytes).map_err(|kind| self.log.corruption_at(offset, kind))?;
                let queue = self.queues.get_or_create(view.topic, view.queue_id);
                queue.append(&Entry {
                    log_offset: offset,
                    record_len: bytes.len() as u32,
                    tag_hash: tag_hash(view.tags),
                    time_ms: view.store_time_ms,
                    flags: 0,
                })?;
                Ok(Some(queue))
            }
            // Padding is skipped by the log itself; deliveries and cancels
            // concern the timer, which builds on this dispatcher.
            RecordKind::Delivery | RecordKind::Cancel | RecordKind::Padding => Ok(None),
        }
    }

    pub fn next(&self) -> u64 {
        self.next
    }
}
