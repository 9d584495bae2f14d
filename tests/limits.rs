//! The store within the process's limits: a small file-descriptor limit.

mod common;

use std::process::Command;

use common::*;
use delaywheel::{Message, Store};

const CHILD: &str = "DELAYWHEEL_LIMITS_CHILD";
const TOPICS: usize = 160;

/// 160 topics (a consume-queue file each, plus segments and the wheel's
/// files) under `ulimit -n 64`: a mapped file keeps no descriptor, so the
/// store works and reopens (it used to be poisoned with EMFILE, and the
/// reopen refused).
#[test]
fn many_queues_fit_in_a_small_descriptor_limit() {
    if std::env::var_os(CHILD).is_some() {
        return many_queues();
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -n 64 && exec "$0" --exact many_queues_fit_in_a_small_descriptor_limit --test-threads 1"#)
        .arg(exe)
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn many_queues() {
    let dir = tempfile::tempdir().unwrap();
    let config = || small_config(dir.path()).with_queues_per_topic(1);
    let store = Store::open(config()).unwrap();
    for t in 0..TOPICS {
        for i in 0..100 {
            store.put(Message::new(format!("T{t}"), format!("{t}-{i}"))).unwrap();
        }
    }
    store.close().unwrap();
    let store = Store::open(config()).unwrap();
    for t in 0..TOPICS {
        let mut consumer = store.consumer(&format!("T{t}"), 0).unwrap();
        assert_eq!(drain(&mut consumer, 100).len(), 100, "topic T{t}");
    }
    store.health().unwrap();
    store.close().unwrap();
}
