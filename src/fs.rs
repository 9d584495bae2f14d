//! Small file-system steps every file kind shares: positioned writes,
//! syncs, durable directory changes, and whole-file replacement. Every
//! durability point of the store goes through here (or `Mapped::flush`), so
//! the crash recorder (feature `crash-recorder`) sees them all.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::error::{Error, Result, symlink_refused};

/// Options for opening a file inside the store: never through a symbolic
/// link (`O_NOFOLLOW`: a link planted in the store directory is refused,
/// not written through), and created with the mode its directory grants
/// without the execute bits, so a store directory of 0700 (the default, see
/// [`Config::with_dir_mode`](crate::Config::with_dir_mode)) makes files of 0600.
pub(crate) fn file_options(path: &Path) -> OpenOptions {
    let mut options = OpenOptions::new();
    options.custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32).mode(dir_mode(parent(path)) & 0o666);
    options
}

fn parent(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or_else(|| Path::new("."))
}

/// The permission bits of `dir` (0700 if it cannot be read: the narrowest
/// a store makes).
fn dir_mode(dir: &Path) -> u32 {
    std::fs::metadata(dir).map(|m| m.mode() & 0o777).unwrap_or(0o700)
}

/// Creates the store directory (and its missing parents) if needed and
/// gives it `mode`: the directory the store owns, whose mode every
/// directory and file made inside it follows. The directory itself may be
/// a symbolic link an operator made; links inside it are refused.
pub(crate) fn create_store_dir(dir: &Path, mode: u32) -> Result<()> {
    if !dir.is_dir() {
        if !parent(dir).is_dir() {
            create_dir(parent(dir))?;
        }
        match std::fs::DirBuilder::new().mode(mode).create(dir) {
            Ok(()) => sync_parent_dir(dir)?,
            // Made meanwhile by another opener; a file of that name is refused.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(Error::io("create directory", dir, e)),
        }
    }
    // The umask may have narrowed the mode at creation; an existing
    // directory may have any mode: the configured one is what counts.
    if dir_mode(dir) != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("chmod", dir, e))?;
    }
    Ok(())
}

/// Bytes free to an unprivileged writer on the file system holding `dir`.
pub(crate) fn available_bytes(dir: &Path) -> Result<u64> {
    let vfs = rustix::fs::statvfs(dir).map_err(|e| Error::io("statvfs", dir, e.into()))?;
    Ok(vfs.f_bavail.saturating_mul(vfs.f_frsize))
}

/// Whether an I/O error means the disk (or the quota) is full.
pub(crate) fn is_no_space(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    matches!(Errno::from_io_error(e), Some(Errno::NOSPC | Errno::DQUOT))
}

/// Writes all of `bytes` at `offset` (a positioned write: no seek, no shared cursor).
pub(crate) fn write_all_at(file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, bytes, offset)
}

/// `fsync` of `file` (at `path`): its bytes and size are durable.
pub(crate) fn sync_all(file: &File, path: &Path) -> Result<()> {
    file.sync_all().map_err(|e| Error::io("fsync", path, e))?;
    #[cfg(feature = "crash-recorder")]
    crate::recorder::synced_file(path);
    Ok(())
}

/// `fdatasync` of `file` (at `path`): its bytes are durable (and its size,
/// if that changed).
pub(crate) fn sync_data(file: &File, path: &Path) -> Result<()> {
    file.sync_data().map_err(|e| Error::io("fdatasync", path, e))?;
    #[cfg(feature = "crash-recorder")]
    crate::recorder::synced_file(path);
    Ok(())
}

/// `fsync` of the directory holding `path`, so a create, rename or delete is durable.
pub(crate) fn sync_parent_dir(path: &Path) -> Result<()> {
    sync_dir(parent_dir(path))
}

/// The directory holding `path`: a path of one relative component (`data`)
/// has the empty path as its parent, which names no directory; it is `.`.
fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or_else(|| Path::new("."))
}

/// `fsync` of a directory: its entries (files created, renamed or removed) are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io("fsync directory", dir, e))?;
    #[cfg(feature = "crash-recorder")]
    crate::recorder::synced_dir(dir);
    Ok(())
}

/// Renames `from` to `to` (durable once their directory is synced).
pub(crate) fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| Error::io("rename", from, e))?;
    #[cfg(feature = "crash-recorder")]
    crate::recorder::renamed(from, to);
    Ok(())
}

/// Removes a file (durable once its directory is synced).
pub(crate) fn remove_file(path: &Path) -> Result<()> {
    std::fs::remove_file(path).map_err(|e| Error::io("remove", path, e))?;
    #[cfg(feature = "crash-recorder")]
    crate::recorder::unlinked(path);
    Ok(())
}

/// Removes a file, or a directory and everything in it (nothing if it does
/// not exist); durable once the parent directory is synced.
pub(crate) fn remove_all(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("stat", path, e)),
    };
    if !meta.is_dir() {
        return remove_file(path);
    }
    for entry in std::fs::read_dir(path).map_err(|e| Error::io("list", path, e))? {
        remove_all(&entry.map_err(|e| Error::io("list", path, e))?.path())?;
    }
    std::fs::remove_dir(path).map_err(|e| Error::io("remove directory", path, e))
}

/// Creates `dir` and its missing parents, each made durable in its parent,
/// so files synced inside it cannot vanish with it after a power loss.
/// Made with the mode of its parent; a symbolic link where the directory
/// should be is refused (the store never writes through a link).
pub(crate) fn create_dir(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(meta) if meta.file_type().is_symlink() => return Err(Error::io("open", dir, symlink_refused())),
        Ok(_) => return Err(Error::io("create directory", dir, std::io::ErrorKind::AlreadyExists.into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("stat", dir, e)),
    }
    if !parent(dir).is_dir() {
        create_dir(parent(dir))?;
    }
    match std::fs::DirBuilder::new().mode(dir_mode(parent(dir))).create(dir) {
        Ok(()) => {}
        // Made meanwhile by another thread: it syncs its own.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(Error::io("create directory", dir, e)),
    }
    sync_parent_dir(dir)
}

/// Temp file, fsync, rename, directory fsync: the file is either old or new, never torn.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<File> {
        let mut file = file_options(&tmp).write(true).create(true).truncate(true).open(&tmp)?;
        std::io::Write::write_all(&mut file, bytes)?;
        Ok(file)
    };
    let file = write().map_err(|e| Error::io("write", &tmp, e))?;
    sync_all(&file, &tmp)?;
    rename(&tmp, path)?;
    sync_parent_dir(path)
}

/// The store's exclusive hold on its directory, for as long as it is open.
pub(crate) struct DirLock {
    _dir: File,
    _file: File,
}

impl DirLock {
    /// Locks the directory `dir` itself (a lock file can be unlinked from
    /// under a running store, and a second process would then lock a new
    /// one), and its lock file `lock` too, which is what earlier versions
    /// lock. [`Error::Locked`] if another process holds either.
    pub(crate) fn acquire(dir: &Path, lock: &Path) -> Result<Self> {
        let held = File::open(dir).map_err(|e| Error::io("open", dir, e))?;
        try_lock(&held, dir, dir)?;
        let file = file_options(lock)
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock)
            .map_err(|e| Error::io("open", lock, e))?;
        try_lock(&file, lock, dir)?;
        Ok(Self { _dir: held, _file: file })
    }
}

/// How long a lock held elsewhere is waited for before [`Error::Locked`]. A
/// lock is held by an open file description, and a child this process
/// forks shares the store's until it execs (or exits): a store closed and
/// opened again while another thread spawns a process finds its own lock
/// held for that moment. (Seen in CI: `wheel-dump`'s tests spawn the tool
/// from parallel threads.)
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

fn try_lock(file: &File, path: &Path, dir: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Err(Error::Locked { dir: dir.to_path_buf() }),
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("lock", path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// A child forked while a store was open shares its lock until it
    /// execs: an open right after the close waits for that rather than
    /// failing as `Locked` (wheel-dump's tests failed so in CI). A lock
    /// held for good is still refused, after the wait.
    #[test]
    fn a_lock_a_forked_child_shares_for_a_moment_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("lock");
        let held = DirLock::acquire(dir.path(), &lock).unwrap();
        // What fork gives the child: the same open file descriptions.
        let child = (held._dir.try_clone().unwrap(), held._file.try_clone().unwrap());
        drop(held);
        let exec = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(child);
        });
        let again = DirLock::acquire(dir.path(), &lock);
        exec.join().unwrap();
        let again = again.unwrap_or_else(|e| panic!("{e}"));
        let started = Instant::now();
        assert!(matches!(DirLock::acquire(dir.path(), &lock), Err(Error::Locked { .. })));
        assert!(started.elapsed() >= LOCK_WAIT);
        drop(again);
    }
}
