//! What `perf` saw of every message, by id: acknowledged, delivered how
//! often, cancelled. A timer due now can be delivered (and consumed) before
//! its put returns, so an acknowledgement and a delivery are recorded apart
//! and in either order: the first delivery counts as delivered, a later one
//! as a duplicate, and a message acknowledged and never delivered as lost.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

pub struct Ledger {
    acked: Vec<AtomicBool>,
    /// Deliveries seen, per id (saturating at 255).
    deliveries: Vec<AtomicU8>,
    /// Cancelled with the answer `Cancelled`: must never be delivered.
    cancelled: Vec<AtomicBool>,
    pub fired_after_cancel: AtomicU64,
    pub cancelled_count: AtomicU64,
    pub delivered: AtomicU64,
    pub duplicated: AtomicU64,
    pub early: AtomicU64,
    /// The latest delivery instant the wheel recorded (a delivery record's time).
    pub last_delivered_ms: AtomicU64,
    /// When the last put returned (epoch ms; `u64::MAX` until then).
    pub puts_done_ms: AtomicU64,
}

impl Ledger {
    pub fn new(messages: u64) -> Self {
        Self {
            acked: (0..messages).map(|_| AtomicBool::new(false)).collect(),
            deliveries: (0..messages).map(|_| AtomicU8::new(0)).collect(),
            cancelled: (0..messages).map(|_| AtomicBool::new(false)).collect(),
            fired_after_cancel: AtomicU64::new(0),
            cancelled_count: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            duplicated: AtomicU64::new(0),
            early: AtomicU64::new(0),
            last_delivered_ms: AtomicU64::new(0),
            puts_done_ms: AtomicU64::new(u64::MAX),
        }
    }

    /// The put of `id` returned.
    pub fn acknowledge(&self, id: u64) {
        self.acked[id as usize].store(true, Ordering::Release);
    }

    /// A delivery of `id` was consumed; an error for an id never put.
    pub fn deliver(&self, id: u64) -> Result<(), String> {
        let slot =
            self.deliveries.get(id as usize).ok_or_else(|| format!("a delivery with unknown id {id}"))?;
        if self.is_cancelled(id) {
            self.fired_after_cancel.fetch_add(1, Ordering::AcqRel);
        }
        let before = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_add(1)));
        match before {
            Ok(0) => self.delivered.fetch_add(1, Ordering::AcqRel),
            _ => self.duplicated.fetch_add(1, Ordering::AcqRel),
        };
        Ok(())
    }

    /// About to cancel `id`: marked first, so a delivery racing the answer is not counted as lost.
    pub fn cancelling(&self, id: u64) {
        self.cancelled[id as usize].store(true, Ordering::Release);
    }

    /// The cancel of `id` was answered: `Cancelled` or not.
    pub fn cancel_answered(&self, id: u64, cancelled: bool) {
        if cancelled {
            self.cancelled_count.fetch_add(1, Ordering::AcqRel);
        } else {
            self.cancelled[id as usize].store(false, Ordering::Release);
        }
    }

    fn is_cancelled(&self, id: u64) -> bool {
        self.cancelled[id as usize].load(Ordering::Acquire)
    }

    /// Acknowledged, not cancelled, never delivered.
    pub fn lost(&self) -> u64 {
        let delivered = |id: usize| self.deliveries[id].load(Ordering::Acquire) > 0;
        (0..self.acked.len())
            .filter(|&id| {
                self.acked[id].load(Ordering::Acquire) && !delivered(id) && !self.is_cancelled(id as u64)
            })
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_before_its_put_returns_counts_once_and_not_as_lost() {
        let ledger = Ledger::new(3);
        ledger.deliver(0).unwrap();
        ledger.acknowledge(0);
        ledger.acknowledge(1);
        ledger.deliver(1).unwrap();
        ledger.acknowledge(2);
        assert_eq!(ledger.delivered.load(Ordering::Acquire), 2);
        assert_eq!(ledger.duplicated.load(Ordering::Acquire), 0);
        assert_eq!(ledger.lost(), 1, "only 2, never delivered");
        ledger.deliver(0).unwrap();
        assert_eq!(ledger.duplicated.load(Ordering::Acquire), 1);
        assert!(ledger.deliver(3).is_err(), "an id never put");
    }

    #[test]
    fn a_cancelled_message_is_not_lost_and_its_delivery_is_reported() {
        let ledger = Ledger::new(2);
        for id in 0..2 {
            ledger.acknowledge(id);
            ledger.cancelling(id);
        }
        ledger.cancel_answered(0, true);
        ledger.cancel_answered(1, false);
        assert_eq!(ledger.lost(), 1, "1 was not cancelled after all");
        ledger.deliver(0).unwrap();
        assert_eq!(ledger.fired_after_cancel.load(Ordering::Acquire), 1);
    }
}
