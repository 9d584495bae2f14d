//! Running out of file descriptors (a server's idle connections can take
//! them all) is back-pressure, never poison: the indexes wait for a
//! descriptor, puts are refused meanwhile with `Error::Exhausted`, and every
//! acknowledged message is indexed once descriptors are back.
//!
//! One test in its own binary: it lowers the process's descriptor limit.

use std::fs::File;
use std::time::{Duration, Instant};

use delaywheel::{Config, Error, Message, Store};

/// Lowers the soft limit on open files to `limit`.
fn limit_open_files(limit: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let maximum = getrlimit(Resource::Nofile).maximum;
    let current = Some(maximum.map_or(limit, |max| limit.min(max)));
    setrlimit(Resource::Nofile, Rlimit { current, maximum }).unwrap();
}

/// Opens `/dev/null` until the process has no descriptor left; returns them.
fn take_every_descriptor() -> Vec<File> {
    let mut taken = Vec::new();
    loop {
        match File::open("/dev/null") {
            Ok(file) => taken.push(file),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                return taken;
            }
        }
    }
}

#[test]
fn no_descriptor_left_is_back_pressure_not_poison() {
    let dir = tempfile::tempdir().unwrap();
    limit_open_files(256);
    let config = Config::new(dir.path())
        .with_queues_per_topic(1)
        .with_max_index_lag(1)
        .with_put_timeout(Duration::from_secs(2));
    let store = Store::open(config).unwrap();
    store.put(Message::new("Old", "before")).unwrap();
    let mut old = store.consumer("Old", 0).unwrap();
    assert_eq!(old.poll(1, Duration::from_secs(5)).unwrap().len(), 1, "indexed before the shortage");
    let taken = take_every_descriptor();
    // A new topic needs a queue file the dispatcher cannot make now.
    let mut accepted = Vec::new();
    let refused = loop {
        let body = format!("fresh {}", accepted.len());
        match store.put(Message::new("Fresh", body.clone())) {
            Ok(_) => accepted.push(body),
            Err(e) => break e,
        }
        assert!(accepted.len() < 1_000, "never refused");
    };
    assert!(matches!(refused, Error::Exhausted { .. }), "{refused}");
    assert!(refused.to_string().contains("Too many open files"), "{refused}");
    std::thread::sleep(Duration::from_millis(500));
    store.health().expect("not poisoned while descriptors are short");
    drop(taken);
    let started = Instant::now();
    let after = loop {
        match store.put(Message::new("Fresh", "after")) {
            Ok(receipt) => break receipt,
            Err(Error::Exhausted { .. }) if started.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(after.offset() > 0);
    accepted.push("after".to_string());
    let mut consumer = store.consumer("Fresh", 0).unwrap();
    let mut got = Vec::new();
    while got.len() < accepted.len() && started.elapsed() < Duration::from_secs(20) {
        let polled = consumer.poll(100, Duration::from_millis(200)).unwrap();
        got.extend(polled.iter().map(|m| String::from_utf8(m.body().to_vec()).unwrap()));
    }
    assert_eq!(got, accepted, "every acknowledged put, once, in order");
    store.health().unwrap();
    store.close().unwrap();
}
