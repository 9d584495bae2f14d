//! The store's background threads: each has one job and a name
//! (`dw-<job>`), is told to stop by its own signal, and is stopped in
//! the reverse order of its start, so a thread that feeds another stops first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;

use crate::error::{Error, Result};

/// A flag that asks a thread to finish, and the channel that wakes it to see it.
#[derive(Clone)]
pub(crate) struct StopFlag {
    flag: Arc<AtomicBool>,
    wake: Option<Sender<()>>,
}

impl StopFlag {
    /// A flag for a thread that sleeps on `wake` (or on nothing, if `None`).
    pub fn new(wake: Option<Sender<()>>) -> Self {
        Self { flag: Arc::new(AtomicBool::new(false)), wake }
    }

    /// Whether the thread was asked to finish.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.flag.store(true, Ordering::Release);
        if let Some(wake) = &self.wake {
            let _ = wake.try_send(());
        }
    }
}

/// How a thread is asked to stop.
pub(crate) enum Stop {
    Flag(StopFlag),
    /// Anything else: a closure that sends the thread its stop message.
    Call(Box<dyn FnOnce() + Send + Sync>),
}

/// One running background thread.
struct Worker {
    name: &'static str,
    stop: Stop,
    handle: JoinHandle<Result<()>>,
}

/// The running threads, in the order they were started.
#[derive(Default)]
pub(crate) struct Threads {
    workers: Vec<Worker>,
}

impl Threads {
    /// Starts `dw-<name>` running `body` (short, so the kernel keeps the
    /// whole name: `top -H` and `/proc` show 15 bytes); `stop` is how it will
    /// be asked to finish.
    pub fn spawn(
        &mut self,
        name: &'static str,
        stop: Stop,
        body: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let handle = std::thread::Builder::new()
            .name(format!("dw-{name}"))
            .spawn(body)
            .map_err(|e| Error::io("spawn thread", format!("dw-{name}"), e))?;
        self.workers.push(Worker { name, stop, handle });
        Ok(())
    }

    /// The first thread that is no longer running although it was not asked
    /// to stop (it returned an error or panicked).
    pub fn stopped_early(&self) -> Option<&'static str> {
        self.workers.iter().find(|w| w.handle.is_finished()).map(|w| w.name)
    }

    /// Stops every thread, the last started first, each joined before the
    /// next is asked; `after(name)` runs once a thread has finished (the
    /// store's steps between two stops). Returns the first failure: a thread
    /// that panicked, named, or else the first error a thread returned.
    pub fn stop_all(mut self, mut after: impl FnMut(&str)) -> Result<()> {
        let mut panicked = None;
        let mut failed = None;
        while let Some(worker) = self.workers.pop() {
            match worker.stop {
                Stop::Flag(flag) => flag.set(),
                Stop::Call(call) => call(),
            }
            match worker.handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(_) => panicked = panicked.or(Some(worker.name)),
            }
            after(worker.name);
        }
        if let Some(name) = panicked {
            return Err(Error::invalid("shutdown", format!("the dw-{name} thread panicked")));
        }
        failed.map_or(Ok(()), Err)
    }
}
