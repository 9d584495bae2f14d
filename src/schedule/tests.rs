use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// Every second from 0, created at 0.
fn every_second(missed: MissedRuns) -> Plan {
    Schedule::new(Message::new("t", "b"), Recurrence::every(Duration::from_secs(1)))
        .start_at_ms(1_000)
        .missed_runs(missed)
        .plan(0)
        .expect("a valid schedule")
}

#[test]
fn on_time_the_next_occurrence_follows_the_previous_whatever_the_policy() {
    for policy in
        [MissedRuns::FireOnce, MissedRuns::Skip, MissedRuns::FireAll { window: Duration::from_secs(5) }]
    {
        let plan = every_second(policy);
        assert_eq!(plan.first(0), Some(1_000));
        // Fired 300 ms late: not missed.
        assert_eq!(plan.next(1_000, 1_300, 1), Some(2_000), "{policy:?}");
        // Fired up to a slot late: still not missed.
        assert_eq!(plan.next(1_000, 3_000, 1), Some(2_000), "{policy:?}");
    }
}

#[test]
fn fire_once_stands_one_occurrence_for_all_missed_then_keeps_the_schedule() {
    let plan = every_second(MissedRuns::FireOnce);
    // Closed from 1_500 to 10_000: 2_000 .. 9_000 were missed.
    assert_eq!(plan.next(1_000, 10_000, 1), Some(10_000));
    assert_eq!(plan.next(10_000, 10_005, 2), Some(11_000));
}

#[test]
fn fire_all_catches_up_within_the_window_in_order() {
    let plan = every_second(MissedRuns::FireAll { window: Duration::from_secs(3) });
    assert_eq!(plan.next(1_000, 10_000, 1), Some(7_000));
    assert_eq!(plan.next(7_000, 10_001, 2), Some(8_000));
    assert_eq!(plan.next(8_000, 10_002, 3), Some(9_000));
    assert_eq!(plan.next(9_000, 10_003, 4), Some(10_000));
}

#[test]
fn skip_drops_every_missed_occurrence() {
    let plan = every_second(MissedRuns::Skip);
    assert_eq!(plan.next(1_000, 10_500, 1), Some(10_000));
}

#[test]
fn the_limit_counts_fired_occurrences_and_the_end_stops_catching_up() {
    let plan = Schedule::new(Message::new("t", "b"), Recurrence::every(Duration::from_secs(1)))
        .start_at_ms(1_000)
        .limit(3)
        .end_at_ms(20_000)
        .plan(0)
        .unwrap();
    assert_eq!(plan.next(2_000, 2_000, 2), Some(3_000));
    assert_eq!(plan.next(3_000, 3_000, 3), None);
    assert_eq!(plan.next(2_000, 50_000, 2), None, "a catch-up past the end");
}

const ZONES: [&str; 6] =
    ["America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata", "Pacific/Chatham", "UTC"];
const CRONS: [&str; 5] = ["0 */15 * * * *", "@hourly", "0 30 2 * * *", "0 45 1 * * SUN", "*/7 * * * * *"];

proptest! {
    /// The occurrence after an instant is later than it, and a pure
    /// function of the previous occurrence: asked from any instant between
    /// the two, the answer is the same (what recovery and previews rely on).
    #[test]
    fn occurrences_increase_and_depend_only_on_the_previous(
        zone in 0..ZONES.len(),
        cron in 0..CRONS.len(),
        // 2000 .. 2060
        at in 946_684_800_000u64..2_840_140_800_000,
        back in 0u64..1_000_000_000,
    ) {
        let rule = Rule::new(&Recurrence::cron(CRONS[cron]).in_time_zone(ZONES[zone]), 0).unwrap();
        let next = rule.next_after(at).unwrap();
        prop_assert!(next > at);
        prop_assert_eq!(next % 1000, 0, "occurrences fall on whole seconds");
        let between = next - 1 - back.min(next - 1 - at);
        prop_assert_eq!(rule.next_after(between), Some(next));
        prop_assert!(rule.next_after(next).unwrap() > next);
    }
}
