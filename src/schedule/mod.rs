//! Recurring schedules: a message template and a recurrence (`recurrence.rs`),
//! bounded by a start, an end and a number of occurrences, with a policy
//! for occurrences the store could not fire on time.
//!
//! What is here is pure: checking a schedule as a put checks a message (an
//! error names the field, and nothing is written), and computing which
//! occurrence comes next, from the previous one and the clock alone, so a
//! preview, the ticking thread and recovery agree on it.

mod recurrence;
mod spec;

use std::time::Duration;

use crate::error::{Error, Result};
use crate::format::record::{MessageView, REPLACES_PROPERTY};
use crate::message::{MAX_DELIVER_AT_MS, Message};
pub use recurrence::Recurrence;
use recurrence::Rule;
pub use spec::{Replaced, SPEC_PROPERTY, Spec};

/// How late an occurrence may come up before it counts as missed: one
/// slot of the wheel. An occurrence fired later than this (the store was
/// closed, or the clock jumped forward) follows the schedule's
/// [`MissedRuns`] policy.
pub const MISSED_AFTER_MS: u64 = 1_000;

/// A paused schedule's timer is due at this instant, the last millisecond
/// of the year 9999 (no occurrence falls on it): resuming it moves it to the
/// first occurrence from then.
pub const PAUSED_AT_MS: u64 = MAX_DELIVER_AT_MS;

/// What happens to occurrences that came due while the store could not
/// fire them (it was closed, or the wall clock jumped forward).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissedRuns {
    /// One occurrence, at once, for all that were missed; then on schedule
    /// (what NATS's schedules do).
    #[default]
    FireOnce,
    /// Every missed occurrence due within `window` before now, at once and
    /// in order; older ones are dropped.
    FireAll {
        /// How far back missed occurrences are caught up.
        window: Duration,
    },
    /// None: the next occurrence is the first one not yet due.
    Skip,
}

/// A recurring schedule: each occurrence delivers the template to its topic.
#[derive(Debug, Clone)]
pub struct Schedule {
    template: Message,
    recurrence: Recurrence,
    start_at_ms: Option<u64>,
    end_at_ms: Option<u64>,
    limit: Option<u64>,
    missed: MissedRuns,
}

impl Schedule {
    /// Delivers `template` (topic, body, key, tags, properties; no deliver
    /// time: each occurrence gives it one) at every occurrence of `recurrence`.
    pub fn new(template: Message, recurrence: Recurrence) -> Self {
        Self {
            template,
            recurrence,
            start_at_ms: None,
            end_at_ms: None,
            limit: None,
            missed: MissedRuns::default(),
        }
    }

    /// No occurrence before this instant (epoch ms); an `every` schedule
    /// counts its periods from here. Without it, from the moment it is created.
    pub fn start_at_ms(mut self, epoch_ms: u64) -> Self {
        self.start_at_ms = Some(epoch_ms);
        self
    }

    /// No occurrence at or after this instant (epoch ms).
    pub fn end_at_ms(mut self, epoch_ms: u64) -> Self {
        self.end_at_ms = Some(epoch_ms);
        self
    }

    /// At most this many occurrences, in all.
    pub fn limit(mut self, occurrences: u64) -> Self {
        self.limit = Some(occurrences);
        self
    }

    /// What happens to occurrences missed while the store could not fire them.
    pub fn missed_runs(mut self, policy: MissedRuns) -> Self {
        self.missed = policy;
        self
    }

    /// The message each occurrence delivers.
    pub fn template(&self) -> &Message {
        &self.template
    }

    /// How it recurs.
    pub fn recurrence(&self) -> &Recurrence {
        &self.recurrence
    }

    /// The first `n` occurrences at or after `from_ms` (epoch ms), as a
    /// schedule created at `from_ms` fires them with the store open
    /// throughout (its limit counted from there). An error says what is
    /// wrong with the schedule, as creating it would.
    pub fn next_occurrences(&self, from_ms: u64, n: usize) -> Result<Vec<u64>> {
        let plan = self.plan(from_ms)?;
        let mut out = Vec::with_capacity(n.min(1024));
        let mut next = plan.first(from_ms);
        while let Some(at) = next
            && out.len() < n
        {
            out.push(at);
            next = plan.after(at, out.len() as u64);
        }
        Ok(out)
    }

    /// The schedule less its template, as its record keeps it: the start
    /// resolved (the one given, or `created_ms`).
    pub(crate) fn spec(&self, created_ms: u64) -> Result<Spec> {
        if let Some(start) = self.start_at_ms.filter(|&s| s > MAX_DELIVER_AT_MS) {
            return Err(Error::invalid(
                "start_at_ms",
                format!(
                    "{start} is past the latest deliver time, {MAX_DELIVER_AT_MS} (the end of the year 9999)"
                ),
            ));
        }
        Ok(Spec {
            recurrence: self.recurrence.clone(),
            // 0 marks an ordinary message on disk: a start of 0 is kept as 1, as a deliver time is.
            start_ms: self.start_at_ms.unwrap_or(created_ms).clamp(1, MAX_DELIVER_AT_MS),
            end_ms: self.end_at_ms,
            limit: self.limit,
            missed: self.missed,
            replaces: None,
        })
    }

    /// Checks the schedule as one created at `created_ms` (the store's clock
    /// then) and returns the plan its occurrences follow. An error names
    /// the field: a cron expression that does not parse or never fires, an
    /// unknown time zone, a period of 0, an end not after the start, a
    /// limit of 0, or a template with a deliver time.
    pub(crate) fn plan(&self, created_ms: u64) -> Result<Plan> {
        self.checked(created_ms).map(|(_, plan)| plan)
    }

    /// [`plan`](Self::plan), with the spec it was made from.
    pub(crate) fn checked(&self, created_ms: u64) -> Result<(Spec, Plan)> {
        if !self.template.is_untimed() {
            return Err(Error::invalid(
                "template",
                "a schedule's template has no deliver time, delay or delay level: each occurrence gives it one",
            ));
        }
        let spec = self.spec(created_ms)?;
        let plan = spec.plan()?;
        if plan.first(created_ms).is_none() {
            let from = plan.start_ms.max(created_ms);
            // With no end in the way, the recurrence itself never fires.
            let unbounded = plan.rule.next_after(from.saturating_sub(1)).is_some();
            let field = match (&self.recurrence, unbounded) {
                (_, true) => "end_at_ms",
                (Recurrence::Cron { .. }, false) => "cron",
                (Recurrence::Every { .. }, false) => "every",
            };
            let until =
                self.end_at_ms.map_or("the year 10000 (5000 for cron)".to_string(), |end| end.to_string());
            return Err(Error::invalid(
                field,
                format!("no occurrence falls from {from} until {until}: the schedule would never fire"),
            ));
        }
        Ok((spec, plan))
    }
}

/// A checked schedule's occurrences: which comes next, by the previous one
/// and the clock alone.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    rule: Rule,
    start_ms: u64,
    end_ms: u64,
    limit: u64,
    missed: MissedRuns,
}

/// What the ticking thread does when a schedule's armed occurrence comes
/// up: deliver it or not, and which occurrence to arm next (`None`: the
/// schedule is over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Firing {
    pub deliver: bool,
    pub next: Option<u64>,
}

impl Plan {
    /// The first occurrence of a schedule created at `created_ms`: at or
    /// after its start and its creation (an occurrence before its creation
    /// was not missed: it never was the schedule's).
    pub fn first(&self, created_ms: u64) -> Option<u64> {
        let from = self.start_ms.max(created_ms);
        debug_assert!(from > 0, "a start of 0 is kept as 1");
        self.rule.next_after(from - 1).filter(|&at| at < self.end_ms)
    }

    /// The occurrence on schedule after the one at `previous`, with `fired`
    /// occurrences delivered so far; `None` once the schedule is over (its
    /// end or its limit).
    pub fn after(&self, previous: u64, fired: u64) -> Option<u64> {
        if fired >= self.limit {
            return None;
        }
        self.rule.next_after(previous).filter(|&at| at < self.end_ms)
    }

    /// The occurrence to arm when a paused schedule is resumed at `now_ms`,
    /// `fired` delivered: the first from `now_ms` on (the ones that fell
    /// while it was paused were not missed: it was paused).
    pub fn resume_at(&self, now_ms: u64, fired: u64) -> Option<u64> {
        if fired >= self.limit {
            return None;
        }
        self.rule.next_after(now_ms.saturating_sub(1)).filter(|&at| at < self.end_ms)
    }

    /// The armed occurrence due at `due_ms` comes up with the clock at
    /// `now_ms`, `fired` occurrences delivered before it.
    ///
    /// It is missed if it comes up more than [`MISSED_AFTER_MS`] late (the
    /// store was closed, or the clock jumped forward), and the policy
    /// decides: `FireOnce` delivers it, standing for every one missed, and
    /// arms the first occurrence after `now_ms`; `Skip` delivers nothing and
    /// arms the first occurrence not missed; `FireAll` delivers it if it fell
    /// within the window (a slot of grace, since the ticker comes to each a
    /// little later than the last), else delivers nothing and arms the first
    /// occurrence within the window; those come up in order, one after
    /// another. The end bounds which occurrences there are, so a schedule
    /// whose missed occurrences were all before its end and are skipped ends
    /// without a delivery.
    pub fn on_fire(&self, due_ms: u64, now_ms: u64, fired: u64) -> Firing {
        let missed_before = now_ms.saturating_sub(MISSED_AFTER_MS);
        let deliver =
            |next_after: u64| Firing { deliver: true, next: self.after(next_after, fired.saturating_add(1)) };
        let skip_to = |from: u64| Firing {
            deliver: false,
            // `from` > `due_ms` >= 1: there is an instant before it.
            next: self.rule.next_after(from - 1).filter(|&at| at < self.end_ms),
        };
        if due_ms >= missed_before {
            return deliver(due_ms);
        }
        match self.missed {
            MissedRuns::FireOnce => deliver(now_ms),
            MissedRuns::Skip => skip_to(missed_before),
            MissedRuns::FireAll { window } => {
                let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
                let oldest = now_ms.saturating_sub(window_ms).min(missed_before);
                if due_ms.saturating_add(MISSED_AFTER_MS) >= oldest {
                    deliver(due_ms)
                } else {
                    skip_to(oldest)
                }
            }
        }
    }
}

/// An update the caller checked, for the ticking thread to write once it
/// knows which timer of the old schedule is armed (the record names it).
#[derive(Debug, Clone)]
pub(crate) struct ScheduleUpdate {
    /// The new template (no deliver time, no spec property).
    pub template: Message,
    /// The new spec, less what it replaces.
    pub spec: Spec,
    /// The new schedule's first occurrence.
    pub first_ms: u64,
    /// The queue of its topic.
    pub queue_id: u32,
}

impl ScheduleUpdate {
    /// The new schedule's record as a message: the template with the spec
    /// naming `replaced`, due at its first occurrence.
    pub fn record(&self, replaced: Replaced) -> Result<Message> {
        let spec = Spec { replaces: Some(replaced), ..self.spec.clone() };
        let mut message =
            self.template.clone().property(SPEC_PROPERTY, spec.encode()?).deliver_at_ms(self.first_ms);
        message.schedule = true;
        Ok(message)
    }
}

/// The timer the timed message record `view` settles, if it is a
/// schedule's update or a message put in place of a pending timer
/// (`Store::put_replacing`, its `dw.replaces` property). A spec or property
/// that does not read settles nothing (the ticker quarantines a schedule's).
///
/// Every timed record the dispatcher indexes asks this, so it reads the one
/// line in place rather than decode the spec.
pub fn replaced_by(view: &MessageView<'_>) -> Option<Replaced> {
    if !view.schedule {
        let text = view.property(REPLACES_PROPERTY).ok()??;
        return view.timer_deliver_at_ms().and_then(|_| spec::replaced(text).ok());
    }
    let text = view.property(SPEC_PROPERTY).ok()??;
    let line = text.lines().find_map(|line| line.strip_prefix(spec::REPLACES))?;
    spec::replaced(line).ok()
}

/// The plan of the schedule whose record is `view`, from its spec property;
/// the error says what does not read.
pub(crate) fn plan_of(view: &MessageView<'_>) -> std::result::Result<Plan, String> {
    let text = view
        .property(SPEC_PROPERTY)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("a schedule record without its {SPEC_PROPERTY:?} property"))?;
    spec::plan_of_text(text).map_err(|why| format!("the schedule's spec: {why}"))
}

#[cfg(test)]
mod tests;
