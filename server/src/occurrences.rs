//! What a recurring schedule's occurrence tells a RocketMQ client: three
//! user properties, since the protocol has no field for them.
//! - `DW_SCHEDULE`: the schedule's handle (as `GET /schedules` names it);
//! - `DW_OCCURRENCE`: which occurrence this is (1 for the first delivered);
//! - `DW_NEXT_OCCURRENCE_MS`: when the next is due (epoch ms), absent after the last.
//!
//! The message's delivery timestamp is the occurrence's instant. A retry
//! copy keeps the three as its own properties, so a redelivery says the same.

use delaywheel::ConsumedMessage;

/// The schedule's handle.
pub const SCHEDULE: &str = "DW_SCHEDULE";
/// The occurrence's number.
pub const OCCURRENCE: &str = "DW_OCCURRENCE";
/// The next occurrence's instant.
pub const NEXT_OCCURRENCE_MS: &str = "DW_NEXT_OCCURRENCE_MS";

/// The properties of `message` if it is an occurrence read from its
/// schedule's queue (a retry copy has them among its own already).
pub(crate) fn properties(message: &ConsumedMessage) -> Vec<(&'static str, String)> {
    let Some(occurrence) = message.occurrence() else { return Vec::new() };
    let mut named =
        vec![(SCHEDULE, occurrence.schedule.to_string()), (OCCURRENCE, occurrence.number.to_string())];
    if let Some(next) = occurrence.next_at_ms {
        named.push((NEXT_OCCURRENCE_MS, next.to_string()));
    }
    named
}
