//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod kill;

use std::path::Path;
use std::time::Duration;

use delaywheel::{Config, ConsumedMessage, Consumer, ManualClock, Message, Store};

/// The epoch ms the manual-clock tests start at.
pub const T0: u64 = 1_700_000_000_000;

/// A store on [`small_config`] driven by a manual clock.
pub fn store_at(dir: &Path, clock: &ManualClock) -> Store {
    Store::open(small_config(dir).with_clock(clock.clone())).unwrap()
}

/// 64 KiB segments, small queue files, bodies up to 8 KiB: everything rolls quickly.
pub fn small_config(dir: &Path) -> Config {
    Config::new(dir).with_segment_size(64 * 1024).with_queue_file_entries(64).with_max_body_bytes(8 * 1024)
}

/// Like [`small_config`], but the flusher never checkpoints on its own during a
/// test, so everything put after open lies past the checkpoint.
pub fn no_periodic_flush(dir: &Path) -> Config {
    small_config(dir).with_flush_interval(Duration::from_secs(3600))
}

/// Copies a store directory while its store is live: what a `kill -9` at this
/// instant would leave (the page cache survives the process).
pub fn crash_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            crash_copy(&entry.path(), &target);
        } else {
            // A temporary file may be renamed away while we copy: it is gone either way.
            match std::fs::copy(entry.path(), target) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => drop(other.unwrap()),
            }
        }
    }
}

/// Polls until `want` messages arrived or nothing arrives for two seconds.
pub fn drain(consumer: &mut Consumer, want: usize) -> Vec<ConsumedMessage> {
    drain_idle(consumer, want, Duration::from_secs(2))
}

/// Polls until `want` messages arrived or nothing arrives for `idle`.
pub fn drain_idle(consumer: &mut Consumer, want: usize, idle: Duration) -> Vec<ConsumedMessage> {
    let mut got = Vec::new();
    while got.len() < want {
        let batch = consumer.poll(want - got.len(), idle).unwrap();
        if batch.is_empty() {
            break;
        }
        got.extend(batch);
    }
    got
}

pub fn bodies(messages: &[ConsumedMessage]) -> Vec<String> {
    messages.iter().map(|m| String::from_utf8(m.body().to_vec()).unwrap()).collect()
}

pub fn put_numbered(store: &Store, topic: &str, range: std::ops::Range<usize>) -> Vec<delaywheel::Receipt> {
    range.map(|i| store.put(Message::new(topic, format!("m{i}")).queue_id(0)).unwrap()).collect()
}

pub fn numbered(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}
