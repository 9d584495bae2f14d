//! When a recurring schedule's occurrences fall: a 6-field cron expression
//! evaluated in an IANA time zone, or a fixed period anchored at a start.
//!
//! Cron is evaluated on wall-clock time (parsed by `croner`, with the time
//! zone's rules from `chrono-tz`; no rule is written here), and each wall
//! time it names becomes an instant by one rule, the one cron daemons and
//! Quartz's defaults share for fixed times:
//!
//! * a wall time that does not exist (the hour a spring-forward skips)
//!   fires at the first instant after the gap (02:30 on the day New York
//!   springs forward fires at 03:00 EDT; two such wall times fire once);
//! * a wall time that occurs twice (the hour a fall-back repeats) fires
//!   once, at its first instant, and the repeated stretch of wall time is
//!   not walked again (an hourly job fires at 01:00 EDT, then 02:00 EST).
//!
//! So occurrences strictly increase, and the occurrence after an instant is
//! a pure function of that instant: recovery and previews compute the same.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use crate::error::{Error, Result};
use crate::sync::Locked;

/// The names of a cron expression's six fields, for errors.
const FIELDS: [&str; 6] = ["second", "minute", "hour", "day-of-month", "month", "day-of-week"];

/// The longest a wall time may fall into a gap: Samoa skipped a whole day
/// in 2011; two days bound the search for the gap's end.
const MAX_GAP_SECONDS: i64 = 2 * 86_400;

/// The latest occurrence computed: the last millisecond of the year 9999
/// but one (the last marks a paused schedule's timer, `PAUSED_AT_MS`). (A
/// cron expression finds none past the year 5000, croner's search limit.)
const LAST_MS: u64 = super::PAUSED_AT_MS - 1;

/// How a schedule recurs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recurrence {
    /// A 6-field cron expression (`sec min hour day-of-month month
    /// day-of-week`, with ranges, steps, lists, names, `L`, `W` and `#`, or
    /// `@yearly`, `@monthly`, `@weekly`, `@daily`, `@hourly`), in an IANA
    /// time zone (`UTC` by default).
    Cron {
        /// The expression, as given.
        expression: String,
        /// The IANA name of the zone it is evaluated in.
        time_zone: String,
    },
    /// Every `period_ms` milliseconds from the schedule's start.
    Every {
        /// The period, at least 1 ms.
        period_ms: u64,
    },
}

impl Recurrence {
    /// A cron expression evaluated in UTC (see [`in_time_zone`](Self::in_time_zone)).
    pub fn cron(expression: impl Into<String>) -> Self {
        Self::Cron { expression: expression.into(), time_zone: "UTC".into() }
    }

    /// Every `period`, from the schedule's start.
    pub fn every(period: std::time::Duration) -> Self {
        Self::Every { period_ms: u64::try_from(period.as_millis()).unwrap_or(u64::MAX) }
    }

    /// The same cron expression evaluated in the IANA zone `name`
    /// (`Asia/Shanghai`); an `Every` is left as it is (a period has no zone).
    pub fn in_time_zone(self, name: impl Into<String>) -> Self {
        match self {
            Self::Cron { expression, .. } => Self::Cron { expression, time_zone: name.into() },
            every => every,
        }
    }

    /// The first occurrence strictly after `after_ms` (epoch ms), an
    /// `Every` counting its periods from `anchor_ms`; `None` if none falls
    /// before the year 10000 (the year 5000 for a cron expression). The
    /// error names what is wrong with the recurrence (the cron's field, the
    /// zone, the period), as creating a schedule would.
    ///
    /// ```
    /// use delaywheel::Recurrence;
    /// let noon = Recurrence::cron("0 0 12 * * *").in_time_zone("Asia/Shanghai");
    /// // 2026-01-01T00:00:00Z is 08:00 in Shanghai: noon there is 04:00 UTC.
    /// assert_eq!(noon.next_after(0, 1_767_225_600_000)?, Some(1_767_225_600_000 + 4 * 3_600_000));
    /// # Ok::<(), delaywheel::Error>(())
    /// ```
    pub fn next_after(&self, anchor_ms: u64, after_ms: u64) -> Result<Option<u64>> {
        Ok(Rule::new(self, anchor_ms)?.next_after(after_ms))
    }
}

/// A recurrence checked and ready to compute occurrences.
#[derive(Debug, Clone)]
pub(crate) enum Rule {
    Cron { cron: Arc<Cron>, zone: Tz },
    Every { period_ms: u64, anchor_ms: u64 },
}

impl Rule {
    /// Checks `recurrence` (the error names the field and what is wrong);
    /// an `Every` counts from `anchor_ms`.
    pub fn new(recurrence: &Recurrence, anchor_ms: u64) -> Result<Self> {
        match recurrence {
            Recurrence::Cron { expression, time_zone } => Self::cron(expression, time_zone),
            &Recurrence::Every { period_ms } => Self::every(period_ms, anchor_ms),
        }
    }

    /// The cron `expression` evaluated in the zone named `time_zone`.
    pub fn cron(expression: &str, time_zone: &str) -> Result<Self> {
        let zone = Tz::from_str(time_zone).map_err(|_| {
            Error::invalid("time_zone", format!("{time_zone:?} is not an IANA time zone name"))
        })?;
        Ok(Self::Cron { cron: shared_cron(expression)?, zone })
    }

    /// Every `period_ms` from `anchor_ms`.
    pub fn every(period_ms: u64, anchor_ms: u64) -> Result<Self> {
        if period_ms == 0 {
            return Err(Error::invalid("every", "a period of 0 ms never advances"));
        }
        Ok(Self::Every { period_ms, anchor_ms })
    }

    /// The first occurrence strictly after `after_ms`, if one falls before
    /// the year 10000 (the year 5000 for a cron expression).
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        // Past the last instant nothing falls, and a wall time there may be
        // past what the calendar library holds.
        if after_ms >= LAST_MS {
            return None;
        }
        let next = match self {
            Self::Every { period_ms, anchor_ms } => {
                if after_ms < *anchor_ms {
                    Some(*anchor_ms)
                } else {
                    let periods = (after_ms - anchor_ms) / period_ms + 1;
                    periods.checked_mul(*period_ms).and_then(|d| d.checked_add(*anchor_ms))
                }
            }
            Self::Cron { cron, zone } => next_cron(cron, *zone, after_ms),
        };
        next.filter(|&at| at <= LAST_MS)
    }
}

/// The parsed cron expressions, shared by every rule made from the same
/// text: croner keeps a byte per value of each field, the years' included,
/// about 6.5 KB an expression, and a million schedules (whose plans the
/// ticking thread holds while their second is loaded) mostly share a few
/// expressions. Kept while unused too, so creating schedules does not parse
/// the expression each time (it took 40% of a producer's time); once the map
/// has doubled since the last sweep, the entries no rule holds are swept,
/// so it stays within twice the expressions in use, or [`UNUSED_KEPT`].
#[derive(Default)]
struct SharedCrons {
    by_text: HashMap<String, Arc<Cron>>,
    sweep_at: usize,
}

/// Parsed expressions no rule holds that are kept at least (about 1.7 MB).
const UNUSED_KEPT: usize = 256;

/// The parse of `expression`, shared (see [`SharedCrons`]).
fn shared_cron(expression: &str) -> Result<Arc<Cron>> {
    static SHARED: OnceLock<Mutex<SharedCrons>> = OnceLock::new();
    let mut shared = SHARED.get_or_init(Mutex::default).locked();
    if let Some(cron) = shared.by_text.get(expression) {
        return Ok(Arc::clone(cron));
    }
    let cron = Arc::new(parse_cron(expression)?);
    if shared.by_text.len() >= shared.sweep_at {
        shared.by_text.retain(|_, cron| Arc::strong_count(cron) > 1);
        shared.sweep_at = (2 * shared.by_text.len()).max(UNUSED_KEPT);
    }
    shared.by_text.insert(expression.to_owned(), Arc::clone(&cron));
    Ok(cron)
}

/// Parses a 6-field expression or an alias; a field that does not parse is named.
fn parse_cron(expression: &str) -> Result<Cron> {
    let parser = CronParser::builder().seconds(Seconds::Required).year(Year::Disallowed).build();
    let parsed = parser.parse(expression);
    let fields: Vec<&str> = expression.split_whitespace().collect();
    match parsed {
        Ok(cron) => Ok(cron),
        Err(e) if fields.len() == FIELDS.len() => {
            // Which field: the first that fails with every other field `*`.
            let culprit = (0..FIELDS.len()).find(|&i| {
                let probe: Vec<&str> =
                    (0..FIELDS.len()).map(|j| if j == i { fields[i] } else { "*" }).collect();
                parser.parse(&probe.join(" ")).is_err()
            });
            Err(Error::invalid(
                "cron",
                match culprit {
                    Some(i) => format!("{expression:?}: the {} field {:?}: {e}", FIELDS[i], fields[i]),
                    None => format!("{expression:?}: {e}"),
                },
            ))
        }
        Err(e) => Err(Error::invalid(
            "cron",
            format!(
                "{expression:?} has {} fields; a schedule's cron has 6 ({}) or is @yearly, @monthly, @weekly, @daily or @hourly: {e}",
                fields.len(),
                FIELDS.join(" ")
            ),
        )),
    }
}

/// The first instant strictly after `after_ms` that a wall time the
/// expression names in `zone` becomes (see the module docs).
fn next_cron(cron: &Cron, zone: Tz, after_ms: u64) -> Option<u64> {
    let after = DateTime::<Utc>::from_timestamp_millis(i64::try_from(after_ms).ok()?)?;
    // Occurrences fall on whole seconds: the next one after `after_ms` is
    // the next one after its second.
    let mut wall = after.with_timezone(&zone).naive_local().with_nanosecond(0)?;
    loop {
        // Wall times are searched as if in UTC, which has neither gaps nor repeats.
        let next_wall = cron.find_next_occurrence(&Utc.from_utc_datetime(&wall), false).ok()?.naive_utc();
        let at_ms = u64::try_from(instant_of(next_wall, zone)?.timestamp_millis()).ok()?;
        if at_ms > after_ms {
            return Some(at_ms);
        }
        // The first instant of a repeated wall time already passed.
        wall = next_wall;
    }
}

/// The instant a wall time becomes in `zone`: its only instant, the first
/// of two, or the end of the gap it falls in.
fn instant_of(wall: NaiveDateTime, zone: Tz) -> Option<DateTime<Tz>> {
    match zone.from_local_datetime(&wall) {
        LocalResult::Single(at) => Some(at),
        LocalResult::Ambiguous(first, _) => Some(first),
        LocalResult::None => (1..=MAX_GAP_SECONDS).find_map(|s| {
            let later = wall + chrono::Duration::seconds(s);
            zone.from_local_datetime(&later).earliest()
        }),
    }
}
