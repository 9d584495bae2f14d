//! The `retention-sim` harness, run as a user would run it.

/// The `retention-sim` harness in a short mode (the 30-day run is in the README).
#[test]
fn a_simulated_week_keeps_the_log_bounded_and_copies_far_timers_once() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_delaywheel"))
        .args(["retention-sim", "--days", "4", "--keep-hours", "24", "--per-hour", "1200"])
        .args(["--segment-size", "1048576", "--far-percent", "2", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let n = |key: &str| report[key].as_u64().unwrap_or_else(|| panic!("{key} in {report}"));
    assert!(n("segments_deleted") >= 5, "{report}");
    assert!(n("relocated_timers") > 0, "{report}");
    assert_eq!(n("copied_twice"), 0, "{report}");
    assert!(n("relocated_bytes") <= n("far_payload_bytes"), "{report}");
    assert!(n("peak_log_bytes") <= n("bound_log_bytes"), "{report}");
    assert!(n("peak_log_bytes") < n("written_log_bytes") / 2, "{report}");
}
