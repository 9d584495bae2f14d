//! Back-pressure from a full disk. A background thread that cannot make an
//! index file for want of space does not poison the store: it records why
//! here, waits [`RETRY`], and tries again from where it stopped; what was
//! acknowledged stays in the commit log and is indexed once there is room.
//! Meanwhile `put` answers [`Error::DiskFull`] as soon as the indexes lag
//! by more than they may, instead of waiting out the put timeout.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};

/// How long a stalled thread waits before it tries again.
pub(crate) const RETRY: Duration = Duration::from_millis(200);

/// Which threads are stalled, and on what.
#[derive(Default)]
pub(crate) struct Stall {
    /// By thread: the directory that needs space, bytes needed, bytes free.
    stalled: Mutex<BTreeMap<&'static str, (PathBuf, u64, u64)>>,
    /// Whether `stalled` holds anything: every put looks, without the lock.
    any: AtomicBool,
}

impl Stall {
    /// Records that `thread` stopped on `error` if it is a full disk, and
    /// says whether it was (anything else is not back-pressure).
    pub fn hold(&self, thread: &'static str, error: &Error) -> bool {
        let Error::DiskFull { dir, needed, available } = error else { return false };
        let mut stalled = self.stalled.lock().unwrap_or_else(|e| e.into_inner());
        self.any.store(true, Ordering::Release);
        if stalled.insert(thread, (dir.clone(), *needed, *available)).is_none() {
            tracing::warn!(thread, error = %error, "disk full: the indexes wait for room, puts are refused meanwhile");
        }
        true
    }

    /// `thread` got on again.
    pub fn release(&self, thread: &'static str) {
        let mut stalled = self.stalled.lock().unwrap_or_else(|e| e.into_inner());
        if stalled.remove(thread).is_some() {
            tracing::info!(thread, "there is room again: the indexes go on");
        }
        self.any.store(!stalled.is_empty(), Ordering::Release);
    }

    /// Whether some thread waits for room now.
    pub fn is_stalled(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// [`Error::DiskFull`] while a thread is stalled.
    pub fn check(&self) -> Result<()> {
        let stalled = self.stalled.lock().unwrap_or_else(|e| e.into_inner());
        match stalled.values().next() {
            Some((dir, needed, available)) => {
                Err(Error::DiskFull { dir: dir.clone(), needed: *needed, available: *available })
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_full_disk_stalls_and_each_thread_releases_its_own() {
        let stall = Stall::default();
        let full = Error::DiskFull { dir: PathBuf::from("/q"), needed: 10, available: 1 };
        assert!(!stall.hold("dispatch", &Error::Closed));
        assert!(stall.check().is_ok());
        assert!(stall.hold("dispatch", &full));
        assert!(stall.hold("tick", &full));
        stall.release("dispatch");
        assert!(matches!(stall.check(), Err(Error::DiskFull { needed: 10, .. })));
        assert!(stall.is_stalled());
        stall.release("tick");
        assert!(stall.check().is_ok());
        assert!(!stall.is_stalled());
    }
}
