//! Epoch times as UTC text, without a date crate: Howard Hinnant's
//! `civil_from_days` (<http://howardhinnant.github.io/date_algorithms.html>).

/// Year, month (1..=12) and day (1..=31) of the day `days` after 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // year of era, 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of year from March 1st
    let mp = (5 * doy + 2) / 153; // month from March, 0..=11
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `2026-11-30T11:36:03Z` for an epoch second.
pub fn utc_second(epoch_secs: u64) -> String {
    let (days, rest) = (epoch_secs / 86_400, epoch_secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest / 60 % 60, rest % 60)
}

/// `2026-11-30T11:36:03.250Z` for an epoch millisecond.
pub fn utc_ms(epoch_ms: u64) -> String {
    let second = utc_second(epoch_ms / 1000);
    format!("{}.{:03}Z", second.trim_end_matches('Z'), epoch_ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(utc_second(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_second(951_782_400), "2000-02-29T00:00:00Z"); // a leap day of a century leap year
        assert_eq!(utc_second(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(utc_second(4_107_542_399), "2100-02-28T23:59:59Z"); // 2100 is not a leap year
        assert_eq!(utc_second(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(utc_ms(253_402_300_799_999), "9999-12-31T23:59:59.999Z"); // the latest deliver time
        assert_eq!(utc_ms(1_700_000_000_250), "2023-11-14T22:13:20.250Z");
    }

    #[test]
    fn days_round_trip_through_the_calendar() {
        // Every day for 1,000 years follows the one before it.
        let mut prev = civil_from_days(-1);
        for days in 0..365_243 {
            let (y, m, d) = civil_from_days(days);
            let next_day = (y, m, d) == (prev.0, prev.1, prev.2 + 1);
            let next_month =
                d == 1 && ((y, m) == (prev.0, prev.1 + 1) || (y, m, prev.1) == (prev.0 + 1, 1, 12));
            assert!(next_day || next_month, "{prev:?} then {:?}", (y, m, d));
            prev = (y, m, d);
        }
    }
}
