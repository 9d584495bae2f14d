use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::error::Error;

/// Every second from 1 s, created at 0.
fn every_second(missed: MissedRuns) -> Plan {
    Schedule::new(Message::new("t", "b"), Recurrence::every(Duration::from_secs(1)))
        .start_at_ms(1_000)
        .missed_runs(missed)
        .plan(0)
        .expect("a valid schedule")
}

fn delivers(next: Option<u64>) -> Firing {
    Firing { deliver: true, next }
}

fn skips_to(next: Option<u64>) -> Firing {
    Firing { deliver: false, next }
}

#[test]
fn on_time_the_next_occurrence_follows_the_previous_whatever_the_policy() {
    for policy in
        [MissedRuns::FireOnce, MissedRuns::Skip, MissedRuns::FireAll { window: Duration::from_secs(5) }]
    {
        let plan = every_second(policy);
        assert_eq!(plan.first(0), Some(1_000));
        // Up 300 ms late: not missed.
        assert_eq!(plan.on_fire(1_000, 1_300, 0), delivers(Some(2_000)), "{policy:?}");
        // Up to a slot late: still not missed.
        assert_eq!(plan.on_fire(1_000, 2_000, 0), delivers(Some(2_000)), "{policy:?}");
    }
}

#[test]
fn fire_once_stands_one_occurrence_for_all_missed_then_keeps_the_schedule() {
    let plan = every_second(MissedRuns::FireOnce);
    // Closed from 1_500 to 10_000: 2_000, armed, comes up at 10_000 and
    // stands for 2_000 .. 9_000; the schedule goes on after now.
    assert_eq!(plan.on_fire(2_000, 10_000, 1), delivers(Some(11_000)));
    assert_eq!(plan.on_fire(2_000, 10_300, 1), delivers(Some(11_000)));
}

#[test]
fn fire_all_catches_up_within_the_window_in_order() {
    let plan = every_second(MissedRuns::FireAll { window: Duration::from_secs(3) });
    // 2_000 is older than the window: skipped to its oldest occurrence.
    assert_eq!(plan.on_fire(2_000, 10_000, 1), skips_to(Some(7_000)));
    // Each comes up a little later than the last, within a slot of grace.
    assert_eq!(plan.on_fire(7_000, 10_001, 1), delivers(Some(8_000)));
    assert_eq!(plan.on_fire(8_000, 10_002, 2), delivers(Some(9_000)));
    assert_eq!(plan.on_fire(9_000, 10_003, 3), delivers(Some(10_000)));
    assert_eq!(plan.on_fire(10_000, 10_004, 4), delivers(Some(11_000)));
}

#[test]
fn skip_drops_every_missed_occurrence() {
    let plan = every_second(MissedRuns::Skip);
    assert_eq!(plan.on_fire(2_000, 10_500, 1), skips_to(Some(10_000)));
    assert_eq!(plan.on_fire(10_000, 10_501, 1), delivers(Some(11_000)));
}

#[test]
fn the_limit_counts_fired_occurrences_and_the_end_bounds_which_there_are() {
    let plan = Schedule::new(Message::new("t", "b"), Recurrence::every(Duration::from_secs(1)))
        .start_at_ms(1_000)
        .limit(3)
        .end_at_ms(20_000)
        .plan(0)
        .unwrap();
    assert_eq!(plan.on_fire(2_000, 2_000, 1), delivers(Some(3_000)));
    assert_eq!(plan.on_fire(3_000, 3_000, 2), delivers(None), "the third is the last");
    // Closed from 2_500 to 50_000: the occurrences missed before the end
    // are caught up once (FireOnce's stand-in), and nothing after it.
    assert_eq!(plan.on_fire(2_000, 50_000, 1), delivers(None));
    let skip = Schedule::new(Message::new("t", "b"), Recurrence::every(Duration::from_secs(1)))
        .start_at_ms(1_000)
        .end_at_ms(20_000)
        .missed_runs(MissedRuns::Skip)
        .plan(0)
        .unwrap();
    assert_eq!(skip.on_fire(3_000, 50_000, 2), skips_to(None), "nothing left to fire before the end");
}

#[test]
fn fire_all_never_drops_an_occurrence_that_was_not_missed() {
    // A window shorter than the lateness that counts as missed.
    let plan = every_second(MissedRuns::FireAll { window: Duration::from_millis(100) });
    assert_eq!(plan.on_fire(2_000, 10_000, 1), skips_to(Some(9_000)));
    assert_eq!(plan.on_fire(9_000, 10_001, 1), delivers(Some(10_000)));
}

#[test]
fn instants_at_the_end_of_time_find_nothing_and_never_panic() {
    for zone in ["Asia/Tokyo", "America/New_York", "UTC"] {
        let rule = Rule::new(&Recurrence::cron("@hourly").in_time_zone(zone), 0).unwrap();
        // The last is within a day of the calendar library's last instant.
        for at in [MAX_DELIVER_AT_MS - 1, MAX_DELIVER_AT_MS, u64::MAX, 8_210_266_870_000_000] {
            assert_eq!(rule.next_after(at), None, "{zone} {at}");
        }
    }
    let every = || Schedule::new(Message::new("t", "b"), Recurrence::every(Duration::from_secs(1)));
    match every().next_occurrences(u64::MAX, 3) {
        Err(Error::Invalid { what, reason }) => {
            assert!(what == "every" && reason.contains("never fire"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    match every().start_at_ms(u64::MAX).next_occurrences(0, 1) {
        Err(Error::Invalid { what, .. }) => assert_eq!(what, "start_at_ms"),
        other => panic!("{other:?}"),
    }
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

/// A million schedules of one expression hold one parse of it (croner's is
/// about 6.5 KB), not a million: 10,000 cron schedules due at one second
/// took 65 MB of heap in `perf --schedules 10000 --cron`.
#[test]
fn rules_of_one_expression_share_its_parse() {
    let parse_of = |recurrence: Recurrence| match Rule::new(&recurrence, 0).unwrap() {
        Rule::Cron { cron, .. } => cron,
        Rule::Every { .. } => unreachable!("a cron recurrence"),
    };
    let utc = parse_of(Recurrence::cron("7 */5 * * * *"));
    let shanghai = parse_of(Recurrence::cron("7 */5 * * * *").in_time_zone("Asia/Shanghai"));
    let other = parse_of(Recurrence::cron("8 */5 * * * *"));
    assert!(std::sync::Arc::ptr_eq(&utc, &shanghai));
    assert!(!std::sync::Arc::ptr_eq(&utc, &other));
    // Kept once no rule holds it: creating schedules one after another
    // parsed the expression each time (40% of a producer's time).
    let kept = std::sync::Arc::downgrade(&utc);
    drop((utc, shanghai));
    let again = parse_of(Recurrence::cron("7 */5 * * * *"));
    assert!(kept.upgrade().is_some_and(|kept| std::sync::Arc::ptr_eq(&kept, &again)));
    let rule = Rule::Cron { cron: again, zone: chrono_tz::Tz::UTC };
    assert_eq!(rule.next_after(0), Some(7_000));
}

/// What the NATS tier asks of a recurrence: the occurrence after an instant,
/// a period counted from its anchor, and the field a bad one gets wrong.
#[test]
fn the_next_occurrence_after_an_instant_keeps_to_the_anchor_and_names_what_is_wrong() {
    let every = Recurrence::every(Duration::from_millis(1_500));
    assert_eq!(every.next_after(10_000, 0).unwrap(), Some(10_000));
    assert_eq!(every.next_after(10_000, 10_000).unwrap(), Some(11_500));
    assert_eq!(every.next_after(10_000, 14_000).unwrap(), Some(14_500));
    assert_eq!(Recurrence::cron("*/10 * * * * *").next_after(0, 10_000).unwrap(), Some(20_000));
    let bad_minute = Recurrence::cron("0 61 * * * *").next_after(0, 0).unwrap_err();
    assert!(matches!(&bad_minute, Error::Invalid { what: "cron", .. }), "{bad_minute}");
    assert!(bad_minute.to_string().contains("minute"), "{bad_minute}");
    let zone = Recurrence::cron("0 0 * * * *").in_time_zone("Mars/Olympus").next_after(0, 0).unwrap_err();
    assert!(matches!(zone, Error::Invalid { what: "time_zone", .. }));
    assert_eq!(Recurrence::cron("0 0 0 30 2 *").next_after(0, 0).unwrap(), None, "February 30th never comes");
}
