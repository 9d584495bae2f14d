//! `delaywheel perf` bursts: every timer due at one millisecond, read by
//! several consumers, each on its own queue.

use std::process::Command;

#[test]
fn a_same_millisecond_burst_over_three_consumers_is_delivered_once_and_never_early() {
    let output = Command::new(env!("CARGO_BIN_EXE_delaywheel"))
        .args(["perf", "--messages", "20000", "--same-millisecond", "--consumers", "3", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    // "pending" is read fresh: a second-old gauge still counted the burst as pending.
    for (key, want) in [
        ("delivered", 20_000),
        ("pending", 0),
        ("lost", 0),
        ("duplicated", 0),
        ("early", 0),
        ("consumers", 3),
    ] {
        assert_eq!(report[key], want, "{key}: {report}");
    }
    let seen = report["burst_last_seen_ms"].as_u64().expect("the burst's last sighting");
    let wheel = report["burst_last_delivered_ms"].as_u64().expect("the wheel's last delivery");
    assert!(wheel <= seen, "seen after the wheel delivered: {report}");
    assert!(report["burst_per_sec"].as_f64().unwrap() > 0.0);
    // The instant comes after the last put: every delivery counts as after the puts too.
    assert!(report["lateness_ms"]["max"].as_u64().unwrap() > 0, "a burst of 20,000 takes time: {report}");
    assert_eq!(report["lateness_after_puts_ms"], report["lateness_ms"], "{report}");
    // Which stage bounds the run: the store's threads by name, and the process.
    let cpu = &report["thread_cpu_secs"];
    for stage in ["dw-dispatch", "dw-tick", "dw-flush"] {
        assert!(cpu["threads"][stage].as_f64().is_some(), "{stage}: {cpu}");
    }
    let ticker = cpu["threads"]["dw-tick"].as_f64().unwrap();
    assert!(ticker > 0.0, "the ticker delivered 20,000 timers: {cpu}");
    assert!(cpu["process"].as_f64().unwrap() >= ticker, "{cpu}");
    // The producers and consumers, which have exited by the report, report as they end.
    let producers = cpu["threads"]["perf-producers"].as_f64().expect("the producers' CPU");
    assert!(producers > 0.0 && cpu["threads"]["perf-consumers"].as_f64().unwrap() > 0.0, "{cpu}");
    let per_put = report["producer_cpu_us_per_put"].as_f64().unwrap();
    assert!((per_put - producers * 1e6 / 20_000.0).abs() < 1e-6, "{per_put} µs a put: {cpu}");
}

#[test]
fn consumers_must_be_at_least_one() {
    let output = Command::new(env!("CARGO_BIN_EXE_delaywheel"))
        .args(["perf", "--messages", "10", "--consumers", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&output.stderr).contains("--consumers"));
}

/// `--no-wait` with cancels reports once the timers not cancelled are in
/// the wheel: cancelled timers are neither pending nor delivered, and the
/// wait used to run its whole 600 s for them.
#[test]
fn no_wait_with_cancels_reports_once_the_rest_are_indexed() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_delaywheel"))
        .args(["perf", "--messages", "2000", "--delay-ms", "3600000..3700000", "--no-wait"])
        .args(["--cancel-ratio", "0.5", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("perf --no-wait --cancel-ratio 0.5 still waiting after 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let (pending, cancelled) = (report["pending"].as_u64().unwrap(), report["cancelled"].as_u64().unwrap());
    assert!(cancelled > 0, "{report}");
    assert_eq!(pending + cancelled, 2000, "{report}");
}

/// `perf --schedules`: every occurrence of every schedule, once, in order,
/// at its instant, on `every` and on cron, and bad arguments refused.
#[test]
fn schedules_deliver_every_occurrence_once_in_order() {
    let run = |extra: &[&str]| {
        let mut args = vec!["perf", "--schedules", "500", "--run-secs", "2", "--consumers", "2", "--json"];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_delaywheel")).args(args).output().unwrap()
    };
    for extra in [&["--every-ms", "200"][..], &["--cron", "* * * * * *", "--time-zone", "Asia/Kolkata"]] {
        let output = run(extra);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let stdout = String::from_utf8(output.stdout).unwrap();
        let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        for (key, want) in
            [("schedules", 500), ("lost", 0), ("duplicated", 0), ("early", 0), ("off_schedule", 0)]
        {
            assert_eq!(report[key], want, "{key}: {report}");
        }
        // Two seconds, at five a second or one: at least 500 each way.
        assert!(report["occurrences_delivered"].as_u64().unwrap() >= 1_000, "{report}");
        for key in ["create_per_sec", "heap_peak_bytes"] {
            assert!(report[key].as_f64().unwrap() > 0.0, "{key}: {report}");
        }
        assert!(report["lateness_ms"]["p99"].as_u64().is_some(), "{report}");
        // Occurrences that fire in the same millisecond share an occurrences
        // record: less than the 60-byte occurrence record each took alone.
        let own = report["occurrence_log_bytes_per_occurrence"].as_f64().unwrap();
        assert!(own > 24.0 && own < 60.0, "{own}: {report}");
    }
    let refused = run(&[]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--every-ms"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
