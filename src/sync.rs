//! Locks taken whether or not an earlier holder panicked. Library code does
//! not panic, so a poisoned lock can only follow a bug already reported
//! where it happened; refusing every later call over it would turn that one
//! bug into an outage of the whole store. Writers leave the data behind
//! each lock consistent between statements, and the commit log, not memory,
//! is the truth recovery rebuilds from.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

/// [`Mutex::lock`] and [`Mutex::try_lock`], past a poisoning.
pub(crate) trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
    /// `None` if another thread holds it.
    fn try_locked(&self) -> Option<MutexGuard<'_, T>>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn try_locked(&self) -> Option<MutexGuard<'_, T>> {
        match self.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// [`RwLock::read`] and [`RwLock::write`], past a poisoning.
pub(crate) trait ReadWrite<T: ?Sized> {
    fn reading(&self) -> RwLockReadGuard<'_, T>;
    fn writing(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWrite<T> for RwLock<T> {
    fn reading(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn writing(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}
