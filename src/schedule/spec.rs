//! A schedule's recurrence and bounds as the schedule record keeps them:
//! text, in one property of the record (`wheel-format.md`, "Schedules"),
//! `key=value` lines:
//!
//! ```text
//! v=1
//! cron=0 0 9 * * MON-FRI      (or every_ms=10000)
//! tz=Asia/Shanghai            (cron only)
//! start_at_ms=1796515200000   (always: the start given, or the creation time)
//! end_at_ms=…                 (optional)
//! limit=…                     (optional)
//! missed=fire_once            (or skip, or fire_all:<window ms>)
//! replaces=8192@1796515200000 (an update: the timer of the schedule it replaces)
//! ```
//!
//! Text, so `wheel-dump` and an operator read it as it is; the start is
//! written resolved, so the plan a record gives is the same at every read.

use std::time::Duration;

use super::{MissedRuns, Plan, Recurrence, Rule};
use crate::error::{Error, Result};

/// The property of a schedule record that holds its spec.
pub const SPEC_PROPERTY: &str = "dw.schedule";

/// The line of an update's spec that names the timer it replaces.
pub(super) const REPLACES: &str = "replaces=";

/// The value of a `replaces` line: `offset@deliver_at_ms`.
pub(super) fn replaced(text: &str) -> std::result::Result<Replaced, String> {
    let named = text.split_once('@').and_then(|(offset, at)| Some((offset.parse().ok()?, at.parse().ok()?)));
    let (timer_offset, deliver_at_ms) =
        named.ok_or_else(|| format!("replaces={text:?} is not offset@deliver_at_ms"))?;
    Ok(Replaced { timer_offset, deliver_at_ms })
}

/// The spec's version: a record of a later one is refused, naming it.
const VERSION: &str = "1";

/// A schedule less its template, its start resolved: what the record's
/// `dw.schedule` property says (tools read it through `internals`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// How it recurs.
    pub recurrence: Recurrence,
    /// Its start (epoch ms): the one given, or its creation time.
    pub start_ms: u64,
    /// No occurrence at or after this (epoch ms).
    pub end_ms: Option<u64>,
    /// At most this many occurrences delivered.
    pub limit: Option<u64>,
    /// What becomes of missed occurrences.
    pub missed: MissedRuns,
    /// For an update ([`Store::update_schedule`](crate::Store::update_schedule)):
    /// the armed timer of the schedule it replaces, which its record settles.
    pub replaces: Option<Replaced>,
}

/// The timer an update's record settles: the replaced schedule's armed
/// one, named by its record (the schedule's or its latest occurrence's)
/// and its deliver time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replaced {
    /// The offset of the record the timer is named by.
    pub timer_offset: u64,
    /// When it was due (the paused instant if the schedule was paused).
    pub deliver_at_ms: u64,
}

impl Spec {
    /// The plan its occurrences follow: the recurrence checked, the end after the start.
    pub(crate) fn plan(&self) -> Result<Plan> {
        plan(Rule::new(&self.recurrence, self.start_ms)?, self.start_ms, self.end_ms, self.limit, self.missed)
    }

    /// The spec as text. A cron expression or zone name with a line break
    /// is refused, naming the field: the text is one field per line.
    pub(crate) fn encode(&self) -> Result<String> {
        use std::fmt::Write;
        // One string, written in place: creating schedules spent a tenth of
        // its time formatting pieces of this and appending them.
        let mut out = String::with_capacity(96);
        let mut line = |args: std::fmt::Arguments<'_>| {
            let _ = out.write_fmt(args);
        };
        line(format_args!("v={VERSION}\n"));
        match &self.recurrence {
            Recurrence::Cron { expression, time_zone } => {
                for (field, value) in [("cron", expression), ("time_zone", time_zone)] {
                    if value.contains(['\n', '\r']) {
                        return Err(Error::invalid(field, format!("{value:?} holds a line break")));
                    }
                }
                line(format_args!("cron={expression}\ntz={time_zone}\n"));
            }
            Recurrence::Every { period_ms } => line(format_args!("every_ms={period_ms}\n")),
        }
        line(format_args!("start_at_ms={}\n", self.start_ms));
        if let Some(end) = self.end_ms {
            line(format_args!("end_at_ms={end}\n"));
        }
        if let Some(limit) = self.limit {
            line(format_args!("limit={limit}\n"));
        }
        match self.missed {
            MissedRuns::FireOnce => line(format_args!("missed=fire_once")),
            MissedRuns::Skip => line(format_args!("missed=skip")),
            MissedRuns::FireAll { window } => line(format_args!("missed=fire_all:{}", window.as_millis())),
        }
        if let Some(replaced) = self.replaces {
            line(format_args!("\n{REPLACES}{}@{}", replaced.timer_offset, replaced.deliver_at_ms));
        }
        Ok(out)
    }

    /// Reads a spec written by [`encode`](Self::encode). The error says
    /// which line is wrong (the caller names the record).
    pub fn decode(text: &str) -> std::result::Result<Self, String> {
        let lines = Lines::read(text)?;
        let recurrence = match lines.recurrence()? {
            Recurs::Cron { expression, time_zone } => Recurrence::cron(expression).in_time_zone(time_zone),
            Recurs::Every { period_ms } => Recurrence::Every { period_ms },
        };
        Ok(Self {
            recurrence,
            start_ms: lines.start_ms()?,
            end_ms: number("end_at_ms", lines.end_at_ms)?,
            limit: number("limit", lines.limit)?,
            missed: lines.missed()?,
            replaces: lines.replaces.map(replaced).transpose()?,
        })
    }
}

/// The plan of the spec `text`, read in place: the ticking thread reads one
/// each time a schedule's timer is loaded, so nothing is allocated (a
/// million schedules every 10 s decode 100,000 specs a second).
pub(crate) fn plan_of_text(text: &str) -> std::result::Result<Plan, String> {
    let lines = Lines::read(text)?;
    let (recurs, start_ms) = (lines.recurrence()?, lines.start_ms()?);
    let (end_ms, limit) = (number("end_at_ms", lines.end_at_ms)?, number("limit", lines.limit)?);
    let missed = lines.missed()?;
    lines.replaces.map(replaced).transpose()?;
    let rule = match recurs {
        Recurs::Cron { expression, time_zone } => Rule::cron(expression, time_zone),
        Recurs::Every { period_ms } => Rule::every(period_ms, start_ms),
    };
    rule.and_then(|rule| plan(rule, start_ms, end_ms, limit, missed)).map_err(|e| e.to_string())
}

/// A plan of `rule` within its bounds: the end after the start, a limit of one at least.
fn plan(
    rule: Rule,
    start_ms: u64,
    end_ms: Option<u64>,
    limit: Option<u64>,
    missed: MissedRuns,
) -> Result<Plan> {
    if let Some(end) = end_ms
        && end <= start_ms
    {
        return Err(Error::invalid("end_at_ms", format!("{end} is not after the start, {start_ms}")));
    }
    if limit == Some(0) {
        return Err(Error::invalid("limit", "0 occurrences: the schedule would never fire"));
    }
    Ok(Plan { rule, start_ms, end_ms: end_ms.unwrap_or(u64::MAX), limit: limit.unwrap_or(u64::MAX), missed })
}

/// The value of line `key` as a number, if there is one.
fn number(key: &str, value: Option<&str>) -> std::result::Result<Option<u64>, String> {
    value.map(|v| v.parse::<u64>().map_err(|_| format!("{key}={v:?} is not a number"))).transpose()
}

/// A spec's lines, borrowed from its text: each known key at most once,
/// the version this build reads, no other key.
#[derive(Default)]
struct Lines<'a> {
    cron: Option<&'a str>,
    tz: Option<&'a str>,
    every_ms: Option<&'a str>,
    start_at_ms: Option<&'a str>,
    end_at_ms: Option<&'a str>,
    limit: Option<&'a str>,
    missed: Option<&'a str>,
    replaces: Option<&'a str>,
}

/// A recurrence as [`Lines`] borrow it.
enum Recurs<'a> {
    Cron { expression: &'a str, time_zone: &'a str },
    Every { period_ms: u64 },
}

impl<'a> Lines<'a> {
    fn read(text: &'a str) -> std::result::Result<Self, String> {
        let mut lines = Lines::default();
        let mut version = None;
        for line in text.lines() {
            let (key, value) =
                line.split_once('=').ok_or_else(|| format!("line {line:?} is not key=value"))?;
            let field = match key {
                "v" => &mut version,
                "cron" => &mut lines.cron,
                "tz" => &mut lines.tz,
                "every_ms" => &mut lines.every_ms,
                "start_at_ms" => &mut lines.start_at_ms,
                "end_at_ms" => &mut lines.end_at_ms,
                "limit" => &mut lines.limit,
                "missed" => &mut lines.missed,
                "replaces" => &mut lines.replaces,
                _ => return Err(format!("unknown field {key}")),
            };
            if field.replace(value).is_some() {
                return Err(format!("{key} appears twice"));
            }
        }
        match version {
            Some(VERSION) => Ok(lines),
            Some(other) => Err(format!("version {other:?}: this build reads version {VERSION}")),
            None => Err("no version".into()),
        }
    }

    fn recurrence(&self) -> std::result::Result<Recurs<'a>, String> {
        match (self.cron, self.tz, number("every_ms", self.every_ms)?) {
            (Some(expression), Some(time_zone), None) => Ok(Recurs::Cron { expression, time_zone }),
            (None, None, Some(period_ms)) => Ok(Recurs::Every { period_ms }),
            _ => Err("not one of cron with tz, or every_ms".into()),
        }
    }

    fn start_ms(&self) -> std::result::Result<u64, String> {
        number("start_at_ms", self.start_at_ms)?.ok_or_else(|| "no start_at_ms".into())
    }

    fn missed(&self) -> std::result::Result<MissedRuns, String> {
        match self.missed {
            Some("fire_once") => Ok(MissedRuns::FireOnce),
            Some("skip") => Ok(MissedRuns::Skip),
            Some(other) => {
                let window = other
                    .strip_prefix("fire_all:")
                    .and_then(|ms| ms.parse::<u64>().ok())
                    .ok_or_else(|| format!("missed={other:?} is not a policy"))?;
                Ok(MissedRuns::FireAll { window: Duration::from_millis(window) })
            }
            None => Err("no missed".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_reads_back_as_written() {
        let specs = [
            Spec {
                recurrence: Recurrence::cron("0 0 9 * * MON-FRI").in_time_zone("Asia/Shanghai"),
                start_ms: 1_796_515_200_000,
                end_ms: Some(1_900_000_000_000),
                limit: Some(12),
                missed: MissedRuns::FireAll { window: Duration::from_secs(60) },
                replaces: Some(Replaced { timer_offset: 8_192, deliver_at_ms: 1_796_515_200_000 }),
            },
            Spec {
                recurrence: Recurrence::Every { period_ms: 10_000 },
                start_ms: 5,
                end_ms: None,
                limit: None,
                missed: MissedRuns::Skip,
                replaces: None,
            },
        ];
        for spec in specs {
            let text = spec.encode().unwrap();
            assert_eq!(Spec::decode(&text), Ok(spec.clone()), "{text}");
            // The ticker reads the same plan in place.
            let (read, planned) = (plan_of_text(&text).unwrap(), spec.plan().unwrap());
            assert_eq!(read.first(1_800_000_000_000), planned.first(1_800_000_000_000), "{text}");
            assert_eq!(read.after(1_800_000_000_000, 3), planned.after(1_800_000_000_000, 3), "{text}");
        }
        let golden = "v=1\nevery_ms=10000\nstart_at_ms=5\nmissed=fire_once";
        let spec = Spec::decode(golden).unwrap();
        assert_eq!(spec.encode().unwrap(), golden);
        // An update's spec, as wheel-format.md shows it.
        let golden = "v=1\nevery_ms=10000\nstart_at_ms=5\nmissed=fire_once\nreplaces=4096@1700000000000";
        let spec = Spec::decode(golden).unwrap();
        assert_eq!(spec.replaces, Some(Replaced { timer_offset: 4096, deliver_at_ms: 1_700_000_000_000 }));
        assert_eq!(spec.encode().unwrap(), golden);
    }

    #[test]
    fn a_damaged_spec_says_what_is_wrong() {
        let cases = [
            ("v=2\nevery_ms=1\nstart_at_ms=1\nmissed=skip", "version \"2\""),
            ("every_ms=1\nstart_at_ms=1\nmissed=skip", "no version"),
            ("v=1\nevery_ms=x\nstart_at_ms=1\nmissed=skip", "every_ms=\"x\""),
            ("v=1\ncron=* * * * * *\nstart_at_ms=1\nmissed=skip", "not one of"),
            ("v=1\nevery_ms=1\nstart_at_ms=1\nmissed=later", "missed=\"later\""),
            ("v=1\nevery_ms=1\nstart_at_ms=1\nmissed=skip\nextra=1", "unknown field extra"),
            ("v=1\nevery_ms=1\nevery_ms=2", "twice"),
            ("v=1\nnonsense", "not key=value"),
            ("v=1\nevery_ms=1\nstart_at_ms=1\nmissed=skip\nreplaces=12", "replaces=\"12\""),
        ];
        for (text, why) in cases {
            let err = Spec::decode(text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
            let err = plan_of_text(text).err().unwrap_or_default();
            assert!(err.contains(why), "the ticker's read of {text:?}: {err}");
        }
        let broken = Spec {
            recurrence: Recurrence::cron("0 0 9 * * *\nlimit=1"),
            start_ms: 1,
            end_ms: None,
            limit: None,
            missed: MissedRuns::FireOnce,
            replaces: None,
        };
        assert!(matches!(broken.encode(), Err(Error::Invalid { what: "cron", .. })));
    }
}
