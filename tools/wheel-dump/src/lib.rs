//! The reading side of `wheel-dump`, as a library: the same read-only view
//! of a store directory serves the `wheel-dump` binary and `delaywheel
//! pending`. It reads with plain positioned reads (no maps, no `LOCK`), never
//! creates, changes or removes a file, and may run beside a live store.
//! The modules are the tool's own, public for the two binaries of this
//! workspace, not a published API.

// A file's entry count is a `Result` (read from the disk), not a collection size.
#![allow(clippy::len_without_is_empty)]

pub mod audit;
pub mod commitlog;
pub mod error;
pub mod indexes;
pub mod listing;
pub mod output;
pub mod pending;
pub mod relocated;
pub mod schedules;
pub mod side_indexes;
pub mod store_files;
pub mod summary;
pub mod time;
pub mod verify;
pub mod wheel_view;
