//! What the store's files let others do: their modes, symbolic links
//! planted in the store directory, and sealed handles.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use delaywheel::{CancelOutcome, Config, Handle, ManualClock, Message, SealedHandle, Store};

/// Every directory and file under `root` (the root included), with its permission bits.
fn modes(root: &Path) -> Vec<(String, bool, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        out.push((path.display().to_string(), meta.is_dir(), meta.permissions().mode() & 0o777));
        if meta.is_dir() {
            todo.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out
}

/// A store with a timer, a delivered timer, a consumer group's progress and
/// a rolled segment: one of every kind of file, then closed.
fn write_a_store(config: Config, clock: &ManualClock) {
    let store = Store::open(config.with_clock(clock.clone())).unwrap();
    put_numbered(&store, "T", 0..400);
    store.put(Message::new("T", "later").deliver_at_ms(T0 + 3_600_000)).unwrap();
    store.put(Message::new("T", "now").deliver_at_ms(T0 + 1_000)).unwrap();
    clock.set_ms(T0 + 1_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    drain(&mut consumer, 1);
    consumer.commit();
    store.close().unwrap();
}

#[test]
fn files_are_0600_and_directories_0700_by_default() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("store");
    write_a_store(small_config(&dir), &ManualClock::new(T0));
    let found = modes(&dir);
    assert!(found.len() > 10, "{found:?}");
    for (path, is_dir, mode) in found {
        assert_eq!(mode, if is_dir { 0o700 } else { 0o600 }, "{path} is {mode:o}");
    }
}

#[test]
fn a_configured_mode_is_given_to_the_directory_and_followed_inside() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    write_a_store(small_config(dir.path()).with_dir_mode(0o750), &ManualClock::new(T0));
    for (path, is_dir, mode) in modes(dir.path()) {
        assert_eq!(mode, if is_dir { 0o750 } else { 0o640 }, "{path} is {mode:o}");
    }
    let err = Store::open(small_config(dir.path()).with_dir_mode(0o070)).err().expect("refused");
    assert!(err.to_string().contains("dir mode"), "{err}");
}

/// Opening a store with a symbolic link planted at `name` (pointing at a
/// file or directory outside) is refused naming the link, and nothing is
/// written through it.
fn refused_with_link_at(name: &str, target_is_dir: bool) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    write_a_store(small_config(dir.path()), &clock);
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("target");
    if target_is_dir {
        std::fs::create_dir(&target).unwrap();
    } else {
        std::fs::write(&target, b"precious").unwrap();
    }
    let link = dir.path().join(name);
    delaywheel_remove(&link);
    std::os::unix::fs::symlink(&target, &link).unwrap();

    let err = Store::open(small_config(dir.path()).with_clock(clock)).err().expect("refused");
    let text = err.to_string();
    assert!(text.contains(&link.display().to_string()) && text.contains("symbolic link"), "{name}: {text}");
    if target_is_dir {
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "{name}: written through");
    } else {
        assert_eq!(std::fs::read(&target).unwrap(), b"precious", "{name}: written through");
    }
}

fn delaywheel_remove(path: &Path) {
    if path.is_dir() {
        std::fs::remove_dir_all(path).unwrap();
    } else if path.exists() {
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn a_symbolic_link_planted_in_the_store_is_refused_not_followed() {
    refused_with_link_at("checkpoint", false);
    refused_with_link_at("LOCK", false);
    refused_with_link_at("timer/wheel", false);
    refused_with_link_at("commitlog/relocated/index", false);
    refused_with_link_at("timer", true);
    refused_with_link_at("consumequeue/T/0", true);
}

#[test]
fn a_symbolic_link_to_the_store_directory_itself_is_followed() {
    let outside = tempfile::tempdir().unwrap();
    let real = outside.path().join("real");
    let link = outside.path().join("link");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    write_a_store(small_config(&link), &ManualClock::new(T0));
    assert!(real.join("checkpoint").is_file());
}

fn keyed(dir: &Path, clock: &ManualClock, key: u8) -> Store {
    Store::open(small_config(dir).with_clock(clock.clone()).with_handle_key([key; 32])).unwrap()
}

#[test]
fn a_sealed_handle_cancels_and_a_forged_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = keyed(dir.path(), &clock, 1);
    let put = |body: &str| store.put(Message::new("T", body.to_string()).deliver_at_ms(T0 + 1_000)).unwrap();
    let cancelled = store.seal(put("cancelled").handle().unwrap()).unwrap();
    let kept = put("kept").handle().unwrap();

    // A client knows its own sealed handle and guesses the next timer's position.
    let forged: SealedHandle =
        format!("{}.{}", kept, cancelled.to_string().rsplit_once('.').unwrap().1).parse().unwrap();
    let err = store.cancel_sealed(forged).unwrap_err();
    assert!(err.to_string().contains("sealed handle tag"), "{err}");
    assert!(store.unseal(forged).is_err(), "unseal checks the tag too");
    assert_eq!(store.unseal(cancelled).unwrap(), cancelled.handle());
    assert_eq!(
        store.cancel_sealed(cancelled.to_string().parse().unwrap()).unwrap(),
        CancelOutcome::Cancelled
    );
    store.close().unwrap();

    // The key is the same across a restart; another key refuses the handle.
    let store = keyed(dir.path(), &clock, 2);
    assert!(store.cancel_sealed(cancelled).is_err(), "sealed with another key");
    store.close().unwrap();
    let store = keyed(dir.path(), &clock, 1);
    assert_eq!(store.cancel_sealed(cancelled).unwrap(), CancelOutcome::Cancelled, "the answer holds");
    clock.set_ms(T0 + 1_000);
    let mut consumer = store.consumer("T", 0).unwrap();
    assert_eq!(bodies(&drain_idle(&mut consumer, 1, Duration::from_millis(300))), ["kept"]);
}

#[test]
fn without_a_key_sealing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_at(dir.path(), &ManualClock::new(T0));
    let handle = Handle { offset: 0, deliver_at_ms: T0 };
    assert!(store.seal(handle).unwrap_err().to_string().contains("handle key"));
}

#[test]
fn a_file_where_the_store_directory_should_be_is_refused_and_left_alone() {
    let parent = tempfile::tempdir().unwrap();
    let file = parent.path().join("store");
    std::fs::write(&file, b"not a store").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = Store::open(small_config(&file)).err().expect("refused").to_string();
    assert!(err.contains(&file.display().to_string()), "{err}");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode, std::fs::read(&file).unwrap()), (0o644, b"not a store".to_vec()), "{err}");
}
