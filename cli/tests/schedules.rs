//! `delaywheel schedules` on a store on disk: the active schedules, each
//! with its recurrence, zone, next occurrence, count delivered and paused
//! state, read-only.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use delaywheel::{Config, ManualClock, Message, PauseOutcome, Recurrence, Schedule, Store};

const T0: u64 = 1_700_000_000_000;

fn schedules(dir: &Path, extra: &[&str]) -> Output {
    let dir = dir.to_str().unwrap();
    let mut args = vec!["schedules", "--dir", dir];
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_delaywheel")).args(args).output().unwrap()
}

fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn schedules_lists_the_active_ones_with_their_next_occurrence_and_count() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(Config::new(dir.path()).with_clock(clock.clone())).unwrap();
    let every = |topic: &str, limit: u64| {
        Schedule::new(Message::new(topic, "b").queue_id(0), Recurrence::every(Duration::from_secs(1)))
            .start_at_ms(T0 + 1_000)
            .limit(limit)
    };
    let daily = Schedule::new(
        Message::new("reports", "settlement").key("desk-7"),
        Recurrence::cron("0 0 9 * * *").in_time_zone("Asia/Shanghai"),
    );
    let daily = store.schedule(daily).unwrap().handle();
    let ticking = store.schedule(every("ticks", 100)).unwrap().handle();
    store.schedule(every("ticks", 2)).unwrap();
    let paused = store.schedule(every("ticks", 100).start_at_ms(T0 + 60_000)).unwrap().handle();
    assert_eq!(store.pause_schedule(paused).unwrap(), PauseOutcome::Paused);
    let mut consumer = store.consumer("ticks", 0).unwrap();
    // A second at a time: a jump further would miss occurrences (and fire one for them all).
    for (second, want) in [(1, 2), (2, 2), (3, 1)] {
        clock.set_ms(T0 + 1_000 * second);
        let mut got = 0;
        while got < want {
            let batch = consumer.poll(want - got, Duration::from_secs(5)).unwrap();
            assert!(!batch.is_empty(), "second {second}: {got} of {want} occurrences");
            got += batch.len();
        }
    }
    store.close().unwrap();

    let all = json_lines(&schedules(dir.path(), &["--json"]));
    let handles: Vec<&str> = all.iter().map(|l| l["handle"].as_str().unwrap()).collect();
    assert_eq!(
        handles,
        [daily.to_string(), ticking.to_string(), paused.to_string()],
        "the finished one is not listed"
    );
    assert_eq!(
        (&all[0]["topic"], &all[0]["key"], &all[0]["recurrence"], &all[0]["time_zone"]),
        (&"reports".into(), &"desk-7".into(), &"0 0 9 * * *".into(), &"Asia/Shanghai".into())
    );
    assert_eq!(
        (&all[0]["next_at_ms"], &all[0]["fired"], &all[0]["paused"]),
        (&1_700_010_000_000u64.into(), &0.into(), &false.into())
    );
    assert_eq!(
        (&all[1]["recurrence"], &all[1]["time_zone"]),
        (&"@every 1000ms".into(), &serde_json::Value::Null)
    );
    assert_eq!(
        (&all[1]["next_at_ms"], &all[1]["fired"], &all[1]["limit"]),
        (&(T0 + 4_000).into(), &3.into(), &100.into())
    );
    assert_eq!((&all[2]["paused"], &all[2]["next_at_ms"]), (&true.into(), &serde_json::Value::Null));
    let ticks = json_lines(&schedules(dir.path(), &["--topic", "ticks", "--json"]));
    assert_eq!(ticks.len(), 2);
    let text = schedules(dir.path(), &[]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("3 active schedules"));
    let missing = schedules(&dir.path().join("nothing"), &[]);
    assert_ne!(missing.status.code(), Some(0));
}
