//! The recurring schedules' timers among those loaded: which schedule each
//! belongs to, how many occurrences it has delivered, and the plan its
//! next occurrence follows. The ticker learns them where it reads a timer's
//! records anyway (checking a second as it is loaded), or reads them for a
//! schedule's timer indexed into a second already loaded, so that when one
//! fires it arms the next occurrence in the same record that delivers it.
//!
//! Kept for the loaded seconds only (memory follows the timers loaded, as
//! `routes.rs`'s routes do); plans are kept by schedule, up to a bound, so
//! a schedule firing every second does not parse its spec every second.

use std::collections::HashMap;
use std::sync::Arc;

use crate::format::record::MessageView;
use crate::schedule::{Plan, plan_of};
use crate::timer::Timer;

/// Plans kept before the cache starts over.
const PLANS_KEPT: usize = 1 << 16;

/// What the ticker knows of a loaded timer of a recurring schedule.
#[derive(Debug, Clone)]
pub(crate) struct Armed {
    /// The schedule's record (its message).
    pub schedule: u64,
    /// Occurrences delivered before this timer's.
    pub fired: u64,
    pub plan: Arc<Plan>,
    /// The loaded second the wheel holds it in: once the wheel's tick
    /// second has passed it, the timer was handed out or cancelled.
    held_in: u64,
}

/// Keyed by offsets the store wrote, never by what a client chose: a fast
/// hash that needs no resistance to chosen keys (SipHash stood out in a
/// profile of the ticking thread at 100 k occurrences/s; foldhash took about
/// 5% off its CPU time, two pairs of runs side by side).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

#[derive(Default)]
pub(crate) struct Recurring {
    armed: FastMap<Timer, Armed>,
    plans: FastMap<u64, Arc<Plan>>,
    /// The last second [`forget_before`](Self::forget_before) swept at.
    swept: u64,
}

impl Recurring {
    /// Notes that `timer` (held in the wheel's loaded `second`) belongs to
    /// the schedule `view` at `schedule`, with `fired` occurrences
    /// delivered before it. An error says what is
    /// wrong with the schedule's spec: the timer then fires as a timed
    /// message's, once (the caller logs it).
    pub fn learn(
        &mut self,
        (timer, second): (Timer, u64),
        schedule: u64,
        fired: u64,
        view: &MessageView<'_>,
    ) -> Result<(), String> {
        let plan = match self.plans.get(&schedule) {
            Some(plan) => Arc::clone(plan),
            None => {
                let plan = Arc::new(plan_of(view)?);
                if self.plans.len() >= PLANS_KEPT {
                    self.plans.clear();
                }
                self.plans.insert(schedule, Arc::clone(&plan));
                plan
            }
        };
        self.armed.insert(timer, Armed { schedule, fired, plan, held_in: second });
        Ok(())
    }

    /// Takes what is known of `timer`, if it is a schedule's.
    pub fn take(&mut self, timer: &Timer) -> Option<Armed> {
        if self.armed.is_empty() {
            return None;
        }
        self.armed.remove(timer)
    }

    /// Whether no loaded timer is known to be a schedule's.
    pub fn is_empty(&self) -> bool {
        self.armed.is_empty()
    }

    /// Forgets the timers that will not fire: held in a loaded second the
    /// wheel has handed out (the timer was cancelled while loaded).
    pub fn forget_before(&mut self, second: u64) {
        if !self.armed.is_empty() && second > self.swept {
            self.swept = second;
            self.armed.retain(|_, armed| armed.held_in >= second);
        }
    }

    /// Forgets everything (the wheel is rebuilt).
    pub fn clear(&mut self) {
        self.armed.clear();
        self.plans.clear();
    }
}
