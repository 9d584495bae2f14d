//! What a consumer does with a receipt handle: ack (the invisibility timer
//! is cancelled), change the invisible duration (it is rescheduled), or
//! forward the message to the dead letters. A receipt names its timer,
//! tagged for its group and topic: one from another group, forged or
//! expired acts on nothing and answers `INVALID_RECEIPT_HANDLE`.

use std::time::Duration;

use delaywheel::{CancelOutcome, Clock, RescheduleOutcome, SystemClock};

use crate::proto::*;
use crate::server::Shared;
use crate::status::{Refusal, ok, status_of};

/// A receipt handle that acks or changes nothing, and why.
fn bad_receipt(why: impl std::fmt::Display) -> Refusal {
    Refusal::field(Code::InvalidReceiptHandle, "receipt_handle", why)
}

impl Shared {
    pub(crate) fn ack(
        &self,
        client: Option<&str>,
        group: &str,
        topic: &str,
        entries: Vec<AckMessageEntry>,
    ) -> AckMessageResponse {
        // Every receipt is checked first; the valid ones are cancelled in one batch (one wait for the disk).
        let opened: Vec<_> = entries
            .iter()
            .map(|e| self.key.open_receipt(group, topic, &e.receipt_handle).map_err(bad_receipt))
            .collect();
        let timers: Vec<_> = opened.iter().filter_map(|o| o.as_ref().ok().copied()).collect();
        timers.iter().for_each(|&timer| self.renewals.release(client, timer));
        let mut outcomes = match self.store.cancel_batch(&timers) {
            Ok(outcomes) => outcomes.into_iter(),
            Err(e) => {
                let refusal = Refusal::from(e);
                return AckMessageResponse { status: Some(refusal.status()), entries: vec![] };
            }
        };
        let mut all_ok = true;
        let results: Vec<_> = entries
            .into_iter()
            .zip(opened)
            .map(|(entry, opened)| {
                let acked = opened.and_then(|timer| {
                    let outcome = outcomes.next().expect("one outcome per timer");
                    if outcome == CancelOutcome::Cancelled {
                        self.groups.acked(group, topic, timer);
                    }
                    self.ack_outcome(outcome)
                });
                let status = status_of(acked);
                all_ok &= status.code == Code::Ok as i32;
                AckMessageResultEntry {
                    message_id: entry.message_id,
                    receipt_handle: entry.receipt_handle,
                    status: Some(status),
                }
            })
            .collect();
        let status = if all_ok || results.len() == 1 {
            results.first().and_then(|r| r.status.clone()).unwrap_or_else(ok)
        } else {
            Refusal::new(Code::MultipleResults, "some entries were not acked: see each entry's status")
                .status()
        };
        AckMessageResponse { status: Some(status), entries: results }
    }

    pub(crate) fn ack_outcome(&self, outcome: CancelOutcome) -> Result<(), Refusal> {
        match outcome {
            CancelOutcome::Cancelled => {
                self.metrics.acks.increment(1);
                Ok(())
            }
            CancelOutcome::AlreadyDelivered => {
                Err(bad_receipt("expired: the invisible duration ended and the message was handed out again"))
            }
            CancelOutcome::NotFound => Err(bad_receipt("names no received message")),
        }
    }

    /// Sends the message of `receipt` to the group's dead-letter topic: its
    /// timer comes due now, marked so that its copy becomes a dead letter (see `fifo`).
    pub(crate) fn forward(&self, group: &str, topic: &str, receipt: &str) -> Result<(), Refusal> {
        let timer = self.key.open_receipt(group, topic, receipt).map_err(bad_receipt)?;
        if !self.groups.forward(group, topic, timer) {
            return Err(bad_receipt("names no message this server handed out since it started"));
        }
        let _exclusive = self.renewals.exclusive();
        self.renewals.release(None, timer);
        match self.store.reschedule(timer, SystemClock.now_ms())? {
            RescheduleOutcome::Rescheduled => Ok(()),
            RescheduleOutcome::AlreadyDelivered => {
                Err(bad_receipt("expired: the message was handed out again"))
            }
            RescheduleOutcome::Cancelled => Err(bad_receipt("the message was acked")),
            RescheduleOutcome::NotFound => Err(bad_receipt("names no received message")),
        }
    }

    pub(crate) fn change_invisible(
        &self,
        client: Option<&str>,
        (group, topic): (&str, &str),
        receipt: &str,
        invisible: Duration,
    ) -> ChangeInvisibleDurationResponse {
        let result = self.key.open_receipt(group, topic, receipt).map_err(bad_receipt).and_then(|timer| {
            // The client takes the timer over from the renewer (see `renewal`).
            let _exclusive = self.renewals.exclusive();
            self.renewals.release(client, timer);
            let due = SystemClock.now_ms().saturating_add(invisible.as_millis() as u64);
            match self.store.reschedule(timer, due)? {
                RescheduleOutcome::Rescheduled => Ok(()),
                RescheduleOutcome::AlreadyDelivered => {
                    Err(bad_receipt("expired: the message was handed out again"))
                }
                RescheduleOutcome::Cancelled => Err(bad_receipt("the message was acked")),
                RescheduleOutcome::NotFound => Err(bad_receipt("names no received message")),
            }
        });
        // The timer keeps its handle when rescheduled, so the receipt stays the same.
        let receipt_handle = if result.is_ok() { receipt.to_string() } else { String::new() };
        ChangeInvisibleDurationResponse { status: Some(status_of(result)), receipt_handle }
    }
}
