//! Schedules in the forms of NATS's own message schedules, read as
//! nats-server reads them (`server/scheduler.go`, 2.12 and later): from
//! NATS's headers at the schedule intake (`intake.rs`), and from the tier's
//! names for them on the timers in the delay stream (JetStream refuses
//! `Nats-Schedule` on a stream that does not run NATS's schedules):
//!
//! * `Nats-Schedule` (`Delay-Schedule`): `@at <RFC 3339>` (once), `@every
//!   <Go duration>` (at least a second), a 6-field cron expression (seconds
//!   first), or `@yearly`/`@annually`, `@monthly`, `@weekly`,
//!   `@daily`/`@midnight`, `@hourly`;
//! * `Nats-Schedule-Time-Zone` (`Delay-Schedule-Time-Zone`): the IANA zone
//!   of a cron expression (refused with `@at` and `@every`, as NATS refuses it);
//! * `Nats-Schedule-TTL` (`Delay-Schedule-TTL`): the `Nats-TTL` each
//!   occurrence carries (`never`, a Go duration of at least a second, or
//!   whole seconds).
//!
//! When occurrences fall is computed as NATS computes it: `@every` from the
//! time the stream stored the schedule, cron strictly after it, and an
//! occurrence missed (the tier was down) fires once, the next following the
//! later of its time and now. Unlike NATS's, `@at` keeps its milliseconds,
//! a subject may carry any number of schedules, and the time-zone rules are
//! `chrono-tz`'s, through the core's [`Recurrence`].

use std::time::Duration;

use delaywheel::{MAX_DELIVER_AT_MS, Recurrence};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::headers::value_of;
use crate::wire;

/// The shortest period NATS allows an `@every` (and a TTL given as a duration).
const MIN_PERIOD: Duration = Duration::from_secs(1);

/// The headers a schedule is read from.
pub(crate) struct Names {
    pattern: &'static str,
    time_zone: &'static str,
    ttl: &'static str,
    rollup: &'static str,
}

/// The tier's names, on the timers in the delay stream.
pub(crate) const TIER_NAMES: Names = Names {
    pattern: wire::SCHEDULE,
    time_zone: wire::SCHEDULE_TIME_ZONE,
    ttl: wire::SCHEDULE_TTL,
    rollup: wire::SCHEDULE_ROLLUP,
};
/// NATS's names, at the schedule intake.
pub(crate) const NATS_NAMES: Names = Names {
    pattern: wire::NATS_SCHEDULE,
    time_zone: wire::NATS_SCHEDULE_TIME_ZONE,
    ttl: wire::NATS_SCHEDULE_TTL,
    rollup: wire::NATS_SCHEDULE_ROLLUP,
};

/// A timer's schedule (`Delay-Schedule` and its kin), checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NatsSchedule {
    pattern: Pattern,
    /// `Nats-Schedule-TTL`, as given.
    ttl: Option<String>,
    /// Whether each occurrence replaces the last on its subject
    /// (`Nats-Schedule-Rollup: sub`).
    rollup: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// `@at`: once, at this instant (epoch ms).
    At(u64),
    /// `@every` or cron.
    Recurring(Recurrence),
}

impl NatsSchedule {
    /// The schedule a timer's headers describe, `None` if they have no
    /// `Delay-Schedule`; what is wrong names the header (and the cron's field).
    pub fn read(headers: &[(&str, &str)]) -> Result<Option<Self>, String> {
        Self::read_named(headers, &TIER_NAMES)
    }

    /// [`read`](Self::read) from the headers `names` names.
    pub fn read_named(headers: &[(&str, &str)], names: &Names) -> Result<Option<Self>, String> {
        let Some(pattern) = value_of(headers, names.pattern)? else { return Ok(None) };
        let zone = value_of(headers, names.time_zone)?.filter(|z| !z.is_empty());
        let ttl = value_of(headers, names.ttl)?.filter(|t| !t.is_empty());
        if let Some(ttl) = ttl {
            check_ttl(ttl, names)?;
        }
        // As NATS: only `sub` (an occurrence that rolled up its whole
        // target stream would purge it).
        let rollup = match value_of(headers, names.rollup)? {
            None | Some("") => false,
            Some("sub") => true,
            Some(other) => return Err(format!("{} {other:?}: only sub", names.rollup)),
        };
        let pattern = read_pattern(pattern.trim(), zone, names)?;
        Ok(Some(Self { pattern, ttl: ttl.map(str::to_string), rollup }))
    }

    /// Whether it fires more than once.
    pub fn repeats(&self) -> bool {
        matches!(self.pattern, Pattern::Recurring(_))
    }

    /// The TTL each occurrence carries, as given.
    pub fn ttl(&self) -> Option<&str> {
        self.ttl.as_deref()
    }

    /// The `Nats-Rollup` each occurrence carries.
    pub fn rollup(&self) -> Option<&'static str> {
        self.rollup.then_some("sub")
    }

    /// When a schedule the stream stored at `stored_ms` first fires.
    pub fn first(&self, stored_ms: u64) -> Result<u64, String> {
        let first = match &self.pattern {
            Pattern::At(at_ms) => Some(*at_ms),
            Pattern::Recurring(recurrence) => next_of(recurrence, stored_ms, stored_ms)?,
        };
        first.ok_or_else(|| "the schedule never fires after it was stored".to_string())
    }

    /// When the schedule fires after the occurrence due at `due_ms`, fired
    /// at `now_ms`: `None` after its last (an `@at`'s only one). Missed
    /// occurrences fire once: the next follows the later of the two.
    pub fn next(&self, due_ms: u64, now_ms: u64) -> Option<u64> {
        match &self.pattern {
            Pattern::At(_) => None,
            // Checked when it was read: an error here is as good as no next.
            Pattern::Recurring(recurrence) => next_of(recurrence, due_ms, due_ms.max(now_ms)).ok().flatten(),
        }
    }
}

/// The occurrence of `recurrence` strictly after `after_ms`, an `@every`
/// counting from `anchor_ms`.
fn next_of(recurrence: &Recurrence, anchor_ms: u64, after_ms: u64) -> Result<Option<u64>, String> {
    let next = recurrence.next_after(anchor_ms, after_ms).map_err(|e| e.to_string())?;
    Ok(next.filter(|&at| at <= MAX_DELIVER_AT_MS))
}

fn read_pattern(pattern: &str, zone: Option<&str>, names: &Names) -> Result<Pattern, String> {
    let header = names.pattern;
    let refuse_zone = |form: &str| match zone {
        Some(zone) => Err(format!("{} {zone:?}: {form} takes no time zone", names.time_zone)),
        None => Ok(()),
    };
    if let Some(at) = pattern.strip_prefix("@at ") {
        refuse_zone("@at")?;
        return parse_rfc3339_ms(at.trim(), header).map(Pattern::At);
    }
    if let Some(every) = pattern.strip_prefix("@every ") {
        refuse_zone("@every")?;
        let period = parse_go_duration(every.trim()).filter(|&d| d >= MIN_PERIOD).ok_or_else(|| {
            format!("{header} {pattern:?}: the period must be a duration of at least 1s (like 90s, 1h30m)")
        })?;
        return Ok(Pattern::Recurring(Recurrence::every(period)));
    }
    // NATS's own expansions of the aliases (its `@weekly` is Sunday's midnight).
    let expression = match pattern {
        "@yearly" | "@annually" => "0 0 0 1 1 *",
        "@monthly" => "0 0 0 1 * *",
        "@weekly" => "0 0 0 * * 0",
        "@daily" | "@midnight" => "0 0 0 * * *",
        "@hourly" => "0 0 * * * *",
        cron if cron.starts_with('@') => {
            return Err(format!(
                "{} {cron:?}: not @at, @every, @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly",
                header
            ));
        }
        cron => cron,
    };
    let recurrence = Recurrence::cron(expression).in_time_zone(zone.unwrap_or("UTC"));
    // Checked now, so a timer that will not parse is refused as it is read.
    recurrence.next_after(0, 0).map_err(|e| match zone {
        Some(zone) => format!("{header} {pattern:?} in {} {zone:?}: {e}", names.time_zone),
        None => format!("{header} {pattern:?}: {e}"),
    })?;
    Ok(Pattern::Recurring(recurrence))
}

/// An RFC 3339 instant in epoch milliseconds (finer digits dropped).
fn parse_rfc3339_ms(text: &str, header: &str) -> Result<u64, String> {
    let at = OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|e| format!("{header} \"@at {text}\": not an RFC 3339 time: {e}"))?;
    let ms = at.unix_timestamp_nanos() / 1_000_000;
    u64::try_from(ms)
        .ok()
        .filter(|&ms| ms <= MAX_DELIVER_AT_MS)
        .ok_or_else(|| format!("{header} \"@at {text}\": before 1970 or after the year 9999"))
}

/// An instant as NATS writes `Nats-Schedule-Next`: RFC 3339 in UTC.
pub(crate) fn rfc3339(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|at| at.format(&Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// `Nats-Schedule-TTL` as NATS takes it: `never`, a duration of at least a
/// second, or a whole number of seconds.
fn check_ttl(ttl: &str, names: &Names) -> Result<(), String> {
    let fits = ttl.eq_ignore_ascii_case("never")
        || parse_go_duration(ttl).is_some_and(|d| d >= MIN_PERIOD)
        || ttl.parse::<u64>().is_ok();
    if fits {
        Ok(())
    } else {
        Err(format!("{} {ttl:?}: not never, a duration of at least 1s, or seconds", names.ttl))
    }
}

/// A duration as Go's `time.ParseDuration` writes it (`1h30m`, `1.5s`,
/// `300ms`; units ns, us, µs, ms, s, m, h), if it is one and not negative.
fn parse_go_duration(text: &str) -> Option<Duration> {
    let text = text.strip_prefix('+').unwrap_or(text);
    match text {
        "" => return None,
        "0" => return Some(Duration::ZERO),
        _ => {}
    }
    let mut rest = text;
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
        nanos = nanos.checked_add(whole.checked_mul(unit_nanos)?)?;
        let mut scale = unit_nanos;
        for digit in fraction.chars() {
            scale /= 10;
            nanos = nanos.checked_add(u128::from(digit.to_digit(10)?) * scale)?;
        }
        rest = after;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<Option<NatsSchedule>, String> {
        NatsSchedule::read(pairs)
    }

    fn schedule(pattern: &str) -> NatsSchedule {
        read(&[(wire::SCHEDULE, pattern)]).unwrap().unwrap()
    }

    /// 2026-12-07T09:00:00Z.
    const STORED: u64 = 1_796_634_000_000;

    #[test]
    fn go_durations_read_as_go_reads_them() {
        let ms = |text| parse_go_duration(text).map(|d| d.as_millis());
        assert_eq!(ms("1s"), Some(1_000));
        assert_eq!(ms("1h30m"), Some(5_400_000));
        assert_eq!(ms("1.5s"), Some(1_500));
        assert_eq!(ms("2m3.25s"), Some(123_250));
        assert_eq!(ms("300ms"), Some(300));
        assert_eq!(ms(".5h"), Some(1_800_000));
        assert_eq!(ms("0"), Some(0));
        assert_eq!(parse_go_duration("1500us"), Some(Duration::from_micros(1_500)));
        for bad in ["", "1", "s", "1x", "-1s", "1s-", "1..5s", ".s", "99999999999999999999999h"] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn each_form_fires_when_nats_would_fire_it() {
        let none: &[(&str, &str)] = &[("Delay-At", "5")];
        assert_eq!(read(none).unwrap(), None);

        let at = schedule("@at 2026-12-07T09:00:05.250Z");
        assert!(!at.repeats());
        assert_eq!(at.first(STORED).unwrap(), STORED + 5_250, "milliseconds kept");
        assert_eq!(at.next(STORED + 5_250, STORED + 5_300), None);
        assert_eq!(schedule("@at 2026-12-07T10:00:00+01:00").first(0).unwrap(), STORED);

        let every = schedule("@every 1m30s");
        assert!(every.repeats());
        assert_eq!(every.first(STORED + 7).unwrap(), STORED + 7 + 90_000, "a period after it was stored");
        let first = STORED + 90_000;
        assert_eq!(every.next(first, first + 3), Some(first + 90_000));
        // Fired three periods late: once, and the next keeps to the grid.
        assert_eq!(every.next(first, first + 270_001), Some(first + 360_000));

        let cron = schedule("*/10 * * * * *");
        assert_eq!(cron.first(STORED).unwrap(), STORED + 10_000, "strictly after it was stored");
        assert_eq!(cron.next(STORED + 10_000, STORED + 10_002), Some(STORED + 20_000));

        let daily = schedule("@daily");
        assert_eq!(daily.first(STORED).unwrap(), STORED - 9 * 3_600_000 + 86_400_000);
        let weekly = schedule("@weekly");
        // 2026-12-07 is a Monday: NATS's @weekly is Sunday's midnight.
        assert_eq!(weekly.first(STORED).unwrap(), STORED - 9 * 3_600_000 + 6 * 86_400_000);
    }

    #[test]
    fn a_cron_runs_in_its_time_zone() {
        let shanghai = read(&[(wire::SCHEDULE, "0 0 9 * * *"), (wire::SCHEDULE_TIME_ZONE, "Asia/Shanghai")])
            .unwrap()
            .unwrap();
        // 09:00 in Shanghai is 01:00 UTC, the next day from 09:00 UTC.
        assert_eq!(shanghai.first(STORED).unwrap(), STORED + 16 * 3_600_000);
    }

    #[test]
    fn occurrences_carry_the_ttl_given() {
        let with_ttl = read(&[(wire::SCHEDULE, "@every 5s"), (wire::SCHEDULE_TTL, "30s")]).unwrap().unwrap();
        assert_eq!(with_ttl.ttl(), Some("30s"));
        for ok in ["never", "NEVER", "1s", "60"] {
            assert!(read(&[(wire::SCHEDULE, "@every 5s"), (wire::SCHEDULE_TTL, ok)]).is_ok(), "{ok}");
        }
    }

    #[test]
    fn a_malformed_schedule_is_refused_naming_the_header_and_field() {
        let refused = |pairs: &[(&str, &str)]| NatsSchedule::read_named(pairs, &NATS_NAMES).unwrap_err();
        let minute = refused(&[(wire::NATS_SCHEDULE, "0 61 * * * *")]);
        assert!(minute.contains("Nats-Schedule") && minute.contains("minute"), "{minute}");
        let fields = refused(&[(wire::NATS_SCHEDULE, "* * * * *")]);
        assert!(fields.contains("5 fields"), "{fields}");
        let at = refused(&[(wire::NATS_SCHEDULE, "@at tomorrow")]);
        assert!(at.contains("RFC 3339"), "{at}");
        let fast = refused(&[(wire::NATS_SCHEDULE, "@every 500ms")]);
        assert!(fast.contains("at least 1s"), "{fast}");
        let zone =
            refused(&[(wire::NATS_SCHEDULE, "@every 5s"), (wire::NATS_SCHEDULE_TIME_ZONE, "Europe/Paris")]);
        assert!(zone.contains("Nats-Schedule-Time-Zone"), "{zone}");
        let unknown_zone =
            refused(&[(wire::NATS_SCHEDULE, "@hourly"), (wire::NATS_SCHEDULE_TIME_ZONE, "Mars/Olympus")]);
        assert!(unknown_zone.contains("Mars/Olympus"), "{unknown_zone}");
        let ttl = refused(&[(wire::NATS_SCHEDULE, "@every 5s"), (wire::NATS_SCHEDULE_TTL, "500ms")]);
        assert!(ttl.contains("Nats-Schedule-TTL"), "{ttl}");
        let rollup = refused(&[(wire::NATS_SCHEDULE, "@hourly"), (wire::NATS_SCHEDULE_ROLLUP, "all")]);
        assert!(rollup.contains("Nats-Schedule-Rollup") && rollup.contains("only sub"), "{rollup}");
        let alias = refused(&[(wire::NATS_SCHEDULE, "@fortnightly")]);
        assert!(alias.contains("@fortnightly"), "{alias}");
        let twice = refused(&[(wire::NATS_SCHEDULE, "@hourly"), ("nats-schedule", "@daily")]);
        assert!(twice.contains("more than one"), "{twice}");
        let in_the_stream = read(&[(wire::SCHEDULE, "0 61 * * * *")]).unwrap_err();
        assert!(
            in_the_stream.contains("Delay-Schedule") && in_the_stream.contains("minute"),
            "{in_the_stream}"
        );
        let never = schedule("0 0 0 30 2 *").first(STORED).unwrap_err();
        assert!(never.contains("never fires"), "{never}");
    }

    #[test]
    fn next_is_written_as_nats_writes_it() {
        assert_eq!(rfc3339(STORED), "2026-12-07T09:00:00Z");
        assert_eq!(rfc3339(STORED + 250), "2026-12-07T09:00:00.25Z");
    }
}
