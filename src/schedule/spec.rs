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
        if let Some(end) = self.end_ms
            && end <= self.start_ms
        {
            return Err(Error::invalid(
                "end_at_ms",
                format!("{end} is not after the start, {}", self.start_ms),
            ));
        }
        if self.limit == Some(0) {
            return Err(Error::invalid("limit", "0 occurrences: the schedule would never fire"));
        }
        Ok(Plan {
            rule: Rule::new(&self.recurrence, self.start_ms)?,
            start_ms: self.start_ms,
            end_ms: self.end_ms.unwrap_or(u64::MAX),
            limit: self.limit.unwrap_or(u64::MAX),
            missed: self.missed,
        })
    }

    /// The spec as text. A cron expression or zone name with a line break
    /// is refused, naming the field: the text is one field per line.
    pub(crate) fn encode(&self) -> Result<String> {
        let mut out = format!("v={VERSION}\n");
        match &self.recurrence {
            Recurrence::Cron { expression, time_zone } => {
                for (field, value) in [("cron", expression), ("time_zone", time_zone)] {
                    if value.contains(['\n', '\r']) {
                        return Err(Error::invalid(field, format!("{value:?} holds a line break")));
                    }
                }
                out += &format!("cron={expression}\ntz={time_zone}\n");
            }
            Recurrence::Every { period_ms } => out += &format!("every_ms={period_ms}\n"),
        }
        out += &format!("start_at_ms={}\n", self.start_ms);
        if let Some(end) = self.end_ms {
            out += &format!("end_at_ms={end}\n");
        }
        if let Some(limit) = self.limit {
            out += &format!("limit={limit}\n");
        }
        out += &match self.missed {
            MissedRuns::FireOnce => "missed=fire_once".to_string(),
            MissedRuns::Skip => "missed=skip".to_string(),
            MissedRuns::FireAll { window } => format!("missed=fire_all:{}", window.as_millis()),
        };
        if let Some(replaced) = self.replaces {
            out += &format!("\n{REPLACES}{}@{}", replaced.timer_offset, replaced.deliver_at_ms);
        }
        Ok(out)
    }

    /// Reads a spec written by [`encode`](Self::encode). The error says
    /// which line is wrong (the caller names the record).
    pub fn decode(text: &str) -> std::result::Result<Self, String> {
        let mut fields = std::collections::HashMap::new();
        for line in text.lines() {
            let (key, value) =
                line.split_once('=').ok_or_else(|| format!("line {line:?} is not key=value"))?;
            if fields.insert(key, value).is_some() {
                return Err(format!("{key} appears twice"));
            }
        }
        match fields.remove("v") {
            Some(VERSION) => {}
            Some(other) => return Err(format!("version {other:?}: this build reads version {VERSION}")),
            None => return Err("no version".into()),
        }
        let number = |fields: &mut std::collections::HashMap<&str, &str>, key: &str| {
            fields
                .remove(key)
                .map(|v| v.parse::<u64>().map_err(|_| format!("{key}={v:?} is not a number")))
                .transpose()
        };
        let recurrence = match (fields.remove("cron"), fields.remove("tz"), number(&mut fields, "every_ms")?)
        {
            (Some(cron), Some(tz), None) => Recurrence::cron(cron).in_time_zone(tz),
            (None, None, Some(period_ms)) => Recurrence::Every { period_ms },
            _ => return Err("not one of cron with tz, or every_ms".into()),
        };
        let start_ms = number(&mut fields, "start_at_ms")?.ok_or("no start_at_ms")?;
        let end_ms = number(&mut fields, "end_at_ms")?;
        let limit = number(&mut fields, "limit")?;
        let missed = match fields.remove("missed") {
            Some("fire_once") => MissedRuns::FireOnce,
            Some("skip") => MissedRuns::Skip,
            Some(other) => {
                let window = other
                    .strip_prefix("fire_all:")
                    .and_then(|ms| ms.parse::<u64>().ok())
                    .ok_or_else(|| format!("missed={other:?} is not a policy"))?;
                MissedRuns::FireAll { window: Duration::from_millis(window) }
            }
            None => return Err("no missed".into()),
        };
        let replaces = fields.remove("replaces").map(replaced).transpose()?;
        if let Some(key) = fields.keys().next() {
            return Err(format!("unknown field {key}"));
        }
        Ok(Self { recurrence, start_ms, end_ms, limit, missed, replaces })
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
