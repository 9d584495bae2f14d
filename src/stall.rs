//! Back-pressure from a shortage that passes: a full disk, or the system out
//! of open files or memory (a server's idle connections can take every
//! descriptor). A background thread that cannot make an index file for
//! want of them does not poison the store: it records why here, waits
//! [`RETRY`], and tries again from where it stopped (making a file again is
//! harmless: see `Mapped::create`); what was acknowledged stays in the
//! commit log and is indexed once the resource is back. Meanwhile `put`
//! answers [`Error::DiskFull`] or [`Error::Exhausted`] as soon as the
//! indexes lag by more than they may, instead of waiting out the put timeout.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::sync::Locked;

/// How long a stalled thread waits before it tries again.
pub(crate) const RETRY: Duration = Duration::from_millis(200);

/// Which threads are stalled, and on what.
#[derive(Default)]
pub(crate) struct Stall {
    /// By thread: what it waits for.
    stalled: Mutex<BTreeMap<&'static str, Shortage>>,
    /// Whether `stalled` holds anything: every put looks, without the lock.
    any: AtomicBool,
}

/// What a stalled thread waits for.
#[derive(Debug, Clone)]
enum Shortage {
    /// Room on disk: the directory that needs it, bytes needed, bytes free.
    Space(PathBuf, u64, u64),
    /// Descriptors or memory: the failure, as the error said it.
    Resources(String),
}

impl Shortage {
    /// The shortage `error` reports, if it reports one.
    fn of(error: &Error) -> Option<Self> {
        use rustix::io::Errno;
        match error {
            Error::DiskFull { dir, needed, available } => Some(Self::Space(dir.clone(), *needed, *available)),
            Error::Io { source, .. }
                if matches!(
                    Errno::from_io_error(source),
                    Some(Errno::MFILE | Errno::NFILE | Errno::NOMEM)
                ) =>
            {
                Some(Self::Resources(error.to_string()))
            }
            _ => None,
        }
    }

    fn to_error(&self) -> Error {
        match self {
            Self::Space(dir, needed, available) => {
                Error::DiskFull { dir: dir.clone(), needed: *needed, available: *available }
            }
            Self::Resources(reason) => Error::Exhausted { reason: reason.clone() },
        }
    }
}

impl Stall {
    /// Records that `thread` stopped on `error` if it is a shortage that
    /// passes, and says whether it was (anything else is not back-pressure).
    pub fn hold(&self, thread: &'static str, error: &Error) -> bool {
        let Some(shortage) = Shortage::of(error) else { return false };
        let mut stalled = self.stalled.locked();
        self.any.store(true, Ordering::Release);
        if stalled.insert(thread, shortage).is_none() {
            tracing::warn!(thread, error = %error, "the indexes wait for the resource, puts are refused meanwhile");
        }
        true
    }

    /// `thread` got on again.
    pub fn release(&self, thread: &'static str) {
        let mut stalled = self.stalled.locked();
        if stalled.remove(thread).is_some() {
            tracing::info!(thread, "the resource is back: the indexes go on");
        }
        self.any.store(!stalled.is_empty(), Ordering::Release);
    }

    /// Whether some thread waits for room now.
    pub fn is_stalled(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// [`Error::DiskFull`] or [`Error::Exhausted`] while a thread is stalled.
    pub fn check(&self) -> Result<()> {
        let stalled = self.stalled.locked();
        stalled.values().next().map_or(Ok(()), |shortage| Err(shortage.to_error()))
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

    #[test]
    fn running_out_of_descriptors_or_memory_stalls_other_io_errors_do_not() {
        let stall = Stall::default();
        let io = |errno: rustix::io::Errno| Error::Io {
            op: "fsync directory",
            path: PathBuf::from("/q"),
            source: std::io::Error::from_raw_os_error(errno.raw_os_error()),
        };
        assert!(!stall.hold("dispatch", &io(rustix::io::Errno::IO)));
        assert!(!stall.is_stalled());
        assert!(stall.hold("dispatch", &io(rustix::io::Errno::MFILE)));
        let Err(Error::Exhausted { reason }) = stall.check() else { panic!("{:?}", stall.check()) };
        assert!(reason.contains("fsync directory /q"), "{reason}");
        assert!(stall.hold("tick", &io(rustix::io::Errno::NOMEM)));
        stall.release("dispatch");
        stall.release("tick");
        assert!(stall.check().is_ok());
    }
}
