//! When a recurring schedule's occurrences fall: cron in time zones across
//! real daylight-saving transitions, periods, bounds, and the errors a
//! schedule that cannot be created gets. Expected instants are written
//! with their UTC offsets, as the zone's rules give them.

use std::time::Duration;

use delaywheel::{Error, Message, Recurrence, Schedule};

/// Epoch ms of an RFC 3339 instant.
fn ms(rfc3339: &str) -> u64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339).expect("a valid instant").timestamp_millis() as u64
}

fn cron(expression: &str, zone: &str) -> Schedule {
    Schedule::new(Message::new("reports", "r"), Recurrence::cron(expression).in_time_zone(zone))
}

fn next(schedule: &Schedule, after: &str, n: usize) -> Vec<u64> {
    schedule.next_occurrences(ms(after), n).expect("a valid schedule")
}

fn all(instants: &[&str]) -> Vec<u64> {
    instants.iter().map(|i| ms(i)).collect()
}

#[test]
fn weekday_mornings_in_shanghai() {
    let s = cron("0 0 9 * * MON-FRI", "Asia/Shanghai");
    // From a Saturday: Monday, Tuesday.
    assert_eq!(
        next(&s, "2026-12-05T12:00:00+08:00", 2),
        all(&["2026-12-07T09:00:00+08:00", "2026-12-08T09:00:00+08:00"])
    );
}

#[test]
fn new_york_spring_forward_fires_a_skipped_time_at_the_end_of_the_gap() {
    // 2026-03-08 02:00 EST becomes 03:00 EDT: 02:30 does not exist that day.
    let s = cron("0 30 2 * * *", "America/New_York");
    assert_eq!(
        next(&s, "2026-03-07T00:00:00-05:00", 3),
        all(&["2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"])
    );
    // Every minute of the skipped hour: one occurrence, at 03:00 EDT, then the next day.
    let s = cron("0 * 2 * * *", "America/New_York");
    assert_eq!(
        next(&s, "2026-03-08T01:59:00-05:00", 2),
        all(&["2026-03-08T03:00:00-04:00", "2026-03-09T02:00:00-04:00"])
    );
}

#[test]
fn new_york_fall_back_fires_a_repeated_time_once_at_its_first_instant() {
    // 2026-11-01 02:00 EDT becomes 01:00 EST: 01:30 happens twice.
    let s = cron("0 30 1 * * *", "America/New_York");
    assert_eq!(
        next(&s, "2026-10-31T12:00:00-04:00", 3),
        all(&["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00", "2026-11-03T01:30:00-05:00"])
    );
    // Hourly: 01:00 EDT, then 02:00 EST; the repeated hour is not walked again.
    let s = cron("@hourly", "America/New_York");
    assert_eq!(
        next(&s, "2026-11-01T00:30:00-04:00", 3),
        all(&["2026-11-01T01:00:00-04:00", "2026-11-01T02:00:00-05:00", "2026-11-01T03:00:00-05:00"])
    );
    // Created inside the repeated hour, after the first 01:30: it does not fire twice that day.
    let s = cron("0 30 1 * * *", "America/New_York");
    assert_eq!(next(&s, "2026-11-01T01:10:00-05:00", 1), all(&["2026-11-02T01:30:00-05:00"]));
}

#[test]
fn london_both_transitions() {
    // 2026-03-29 01:00 GMT becomes 02:00 BST; 2026-10-25 02:00 BST becomes 01:00 GMT.
    let s = cron("0 30 1 * * *", "Europe/London");
    assert_eq!(
        next(&s, "2026-03-28T12:00:00+00:00", 2),
        all(&["2026-03-29T02:00:00+01:00", "2026-03-30T01:30:00+01:00"])
    );
    assert_eq!(
        next(&s, "2026-10-24T12:00:00+01:00", 2),
        all(&["2026-10-25T01:30:00+01:00", "2026-10-26T01:30:00+00:00"])
    );
}

#[test]
fn lord_howe_half_hour_shifts() {
    // Australia/Lord_Howe moves by 30 minutes: +10:30 standard, +11 summer.
    // 2026-04-05 02:00 (+11) becomes 01:30 (+10:30): 01:45 happens twice.
    let s = cron("0 45 1 * * *", "Australia/Lord_Howe");
    assert_eq!(
        next(&s, "2026-04-04T12:00:00+11:00", 2),
        all(&["2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"])
    );
    // 2026-10-04 02:00 (+10:30) becomes 02:30 (+11): 02:15 does not exist.
    let s = cron("0 15 2 * * *", "Australia/Lord_Howe");
    assert_eq!(
        next(&s, "2026-10-03T12:00:00+10:30", 3),
        all(&["2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00", "2026-10-06T02:15:00+11:00"])
    );
}

#[test]
fn kolkata_has_no_transitions_across_years() {
    let s = cron("0 0 9 31 12 *", "Asia/Kolkata");
    assert_eq!(
        next(&s, "2026-06-01T00:00:00+05:30", 3),
        all(&["2026-12-31T09:00:00+05:30", "2027-12-31T09:00:00+05:30", "2028-12-31T09:00:00+05:30"])
    );
}

#[test]
fn yearly_in_new_york_across_years_keeps_local_midnight() {
    let s = cron("@yearly", "America/New_York");
    assert_eq!(
        next(&s, "2026-06-01T00:00:00Z", 3),
        all(&["2027-01-01T00:00:00-05:00", "2028-01-01T00:00:00-05:00", "2029-01-01T00:00:00-05:00"])
    );
}

#[test]
fn last_day_nth_weekday_and_nearest_weekday() {
    let s = cron("0 0 18 L * *", "UTC");
    assert_eq!(next(&s, "2027-02-01T00:00:00Z", 2), all(&["2027-02-28T18:00:00Z", "2027-03-31T18:00:00Z"]));
    // The first Monday of each month.
    let s = cron("0 0 8 * * MON#1", "UTC");
    assert_eq!(next(&s, "2026-12-06T00:00:00Z", 2), all(&["2026-12-07T08:00:00Z", "2027-01-04T08:00:00Z"]));
}

#[test]
fn every_period_counts_from_the_start() {
    let s = Schedule::new(Message::new("polls", "p"), Recurrence::every(Duration::from_secs(10)))
        .start_at_ms(1_000_000);
    assert_eq!(s.next_occurrences(0, 3).unwrap(), vec![1_000_000, 1_010_000, 1_020_000]);
    assert_eq!(s.next_occurrences(1_015_000, 2).unwrap(), vec![1_020_000, 1_030_000]);
    // Without a start, it counts from its creation.
    let s = Schedule::new(Message::new("polls", "p"), Recurrence::every(Duration::from_millis(7)));
    assert_eq!(s.next_occurrences(500, 3).unwrap(), vec![500, 507, 514]);
}

#[test]
fn the_limit_and_the_end_bound_the_occurrences() {
    let every = || {
        Schedule::new(Message::new("polls", "p"), Recurrence::every(Duration::from_secs(1)))
            .start_at_ms(5_000)
    };
    assert_eq!(every().limit(2).next_occurrences(0, 10).unwrap(), vec![5_000, 6_000]);
    // The end is exclusive.
    assert_eq!(every().end_at_ms(8_000).next_occurrences(0, 10).unwrap(), vec![5_000, 6_000, 7_000]);
}

fn refused(schedule: Schedule) -> (&'static str, String) {
    match schedule.next_occurrences(ms("2026-12-06T00:00:00Z"), 1) {
        Err(Error::Invalid { what, reason }) => (what, reason),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn a_schedule_that_cannot_fire_is_refused_naming_the_field() {
    let (what, reason) = refused(cron("0 0 25 * * *", "UTC"));
    assert_eq!(what, "cron");
    assert!(reason.contains("hour") && reason.contains("\"25\""), "{reason}");
    let (what, reason) = refused(cron("0 0 * * FOO", "UTC"));
    assert_eq!(what, "cron");
    assert!(reason.contains("6"), "{reason}");
    let (what, reason) = refused(cron("0 0 0 30 2 *", "UTC"));
    assert_eq!(what, "cron");
    assert!(reason.contains("never fire"), "{reason}");
    let (what, reason) = refused(cron("0 0 9 * * *", "Mars/Olympus_Mons"));
    assert_eq!(what, "time_zone");
    assert!(reason.contains("Mars/Olympus_Mons"), "{reason}");
    let every = |period| Schedule::new(Message::new("t", "b"), Recurrence::every(period));
    assert_eq!(refused(every(Duration::ZERO)).0, "every");
    assert_eq!(refused(every(Duration::from_secs(1)).limit(0)).0, "limit");
    assert_eq!(refused(every(Duration::from_secs(1)).start_at_ms(5_000).end_at_ms(5_000)).0, "end_at_ms");
    let timed =
        Schedule::new(Message::new("t", "b").delay(Duration::from_secs(1)), Recurrence::cron("@daily"));
    assert_eq!(refused(timed).0, "template");
    // An end before the first occurrence: nothing would ever fire, and the end is to blame.
    let (what, reason) = refused(
        cron("0 0 9 * * *", "UTC")
            .start_at_ms(ms("2026-12-07T10:00:00Z"))
            .end_at_ms(ms("2026-12-08T08:00:00Z")),
    );
    assert_eq!(what, "end_at_ms");
    assert!(reason.contains("never fire"), "{reason}");
}
