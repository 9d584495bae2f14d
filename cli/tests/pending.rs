//! `delaywheel pending` on a store on disk: what the live store's own
//! `Store::pending` says, read-only, also beside the live store.

use std::path::Path;
use std::process::{Command, Output};

use delaywheel::{CancelOutcome, Config, ManualClock, Message, Store};

const T0: u64 = 1_700_000_000_000;
const YEAR: u64 = 365 * 86_400_000;

fn pending(dir: &Path, extra: &[&str]) -> Output {
    let dir = dir.to_str().unwrap();
    let mut args = vec!["pending", "--dir", dir];
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_delaywheel")).args(args).output().unwrap()
}

fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn handles(lines: &[serde_json::Value]) -> Vec<String> {
    lines.iter().map(|l| l["handle"].as_str().unwrap().to_string()).collect()
}

#[test]
fn pending_lists_what_the_store_says_is_pending_beside_it_and_after_close() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(Config::new(dir.path()).with_clock(clock.clone())).unwrap();
    for (i, ahead) in [1_000, 5_000, 60_000, 3_600_000, 10 * YEAR].into_iter().enumerate() {
        let topic = if i % 2 == 0 { "orders" } else { "retries" };
        store
            .put(Message::new(topic, "b").key(format!("k{i}")).queue_id(0).deliver_at_ms(T0 + ahead))
            .unwrap();
    }
    let cancelled = store.put(Message::new("orders", "c").key("k9").deliver_at_ms(T0 + 7_000)).unwrap();
    assert_eq!(store.cancel(cancelled.handle().unwrap()).unwrap(), CancelOutcome::Cancelled);
    clock.set_ms(T0 + 2_000);
    let mut consumer = store.consumer("orders", 0).unwrap();
    assert_eq!(consumer.poll(1, std::time::Duration::from_secs(5)).unwrap().len(), 1, "k0 fired");
    store.fresh_stats().unwrap();
    let live: Vec<String> =
        store.pending(0..u64::MAX, 100).unwrap().iter().map(|p| p.handle.to_string()).collect();
    assert_eq!(live.len(), 4);

    // Beside the live store: a checkpoint has not seen k0's delivery yet,
    // its delivery record in the log says so.
    let beside = json_lines(&pending(dir.path(), &["--from", "0", "--to", "99999999999999", "--json"]));
    assert_eq!(handles(&beside), live);
    store.close().unwrap();
    let all = json_lines(&pending(dir.path(), &["--from", "0", "--to", "99999999999999", "--json"]));
    assert_eq!(handles(&all), live, "the same after close");
    assert_eq!(all[0]["key"], "k1");
    assert_eq!(all[0]["topic"], "retries");
    assert_eq!(all[0]["deliver_at_ms"], T0 + 5_000);
    assert_eq!(all[0]["deliver_at_utc"], "2023-11-14T22:13:25.000Z");
    assert!(all[0]["level"].is_null() && all[0]["queue"] == 0);

    let window = json_lines(&pending(
        dir.path(),
        &["--from", &(T0 + 5_000).to_string(), "--to", &(T0 + 60_001).to_string(), "--json"],
    ));
    assert_eq!(window.len(), 2, "half-open: +5 s and +60 s");
    let orders = json_lines(&pending(
        dir.path(),
        &["--from", "0", "--to", "99999999999999", "--topic", "orders", "--json"],
    ));
    assert_eq!(orders.iter().map(|l| l["key"].as_str().unwrap()).collect::<Vec<_>>(), ["k2", "k4"]);
    let by_key =
        json_lines(&pending(dir.path(), &["--from", "0", "--to", "99999999999999", "--key", "k3", "--json"]));
    assert_eq!(by_key.len(), 1);
    assert_eq!(by_key[0]["deliver_at_ms"], T0 + 3_600_000);

    let text = pending(dir.path(), &["--from", "0", "--to", "99999999999999"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("2023-11-14T22:13:25.000Z") && text.contains("4 pending"), "{text}");
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["--from", "10", "--to", "10"][..], &["--from", "x", "--to", "10"], &["--to", "10"]] {
        let out = pending(dir.path(), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1, "{args:?}");
    }
    let out = pending(&dir.path().join("missing"), &["--from", "0", "--to", "10"]);
    assert_eq!(out.status.code(), Some(1), "not a store");
}
