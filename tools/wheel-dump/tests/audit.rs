//! `audit`: the fate of every timed message, and exit 1 when one is lost,
//! delivered twice or delivered early.

mod common;

use common::*;
use delaywheel::internals::record::{
    DELIVERY_LEN, Record, deliveries_len, encode_deliveries, encode_delivery,
};
use serde_json::json;

fn audit_json(dir: &std::path::Path) -> (i32, serde_json::Value) {
    let out = dump(dir, &["audit", "--json"]);
    (out.status.code().unwrap(), json(&out))
}

#[test]
fn every_timer_delivered_passes() {
    let dir = all_delivered(300);
    let (code, doc) = audit_json(dir.path());
    let expected = json!({"schema_version": 1, "timer_messages": 300, "delivered": 300, "cancelled": 0,
        "pending": 0, "lost": 0, "duplicated": 0, "early": 0, "reclaimed": 0, "unreadable_log_stretches": 0,
        "unreadable_log_bytes": 0, "rescheduled": 0, "fired_after_reschedule": 0, "schedules": 0,
        "occurrences_delivered": 0, "occurrences_duplicated": 0, "occurrences_early": 0, "occurrences_missing": 0});
    assert_eq!((code, doc), (0, expected));
}

#[test]
fn delivered_cancelled_and_pending_are_told_apart() {
    let h = healthy();
    let (code, doc) = audit_json(h.path());
    let expected = json!({"schema_version": 1, "timer_messages": 5, "delivered": 2, "cancelled": 1,
        "pending": 2, "lost": 0, "duplicated": 0, "early": 0, "reclaimed": 0, "unreadable_log_stretches": 0,
        "unreadable_log_bytes": 0, "rescheduled": 0, "fired_after_reschedule": 0, "schedules": 0,
        "occurrences_delivered": 0, "occurrences_duplicated": 0, "occurrences_early": 0, "occurrences_missing": 0});
    assert_eq!((code, doc), (0, expected));
}

/// A record like the one that delivered the timer at `delivered` (a
/// delivery record, or a deliveries record of that timer alone) but naming
/// the timer at `names` (`append_copy` seals its CRC again).
fn delivery_naming(dir: &std::path::Path, delivered: u64, names: u64) -> Vec<u8> {
    let (records, _) = records(dir);
    for (at, bytes) in &records {
        match decoded(*at, bytes) {
            Record::Delivery(d) if d.message_offset == delivered => {
                let mut copy = vec![0; DELIVERY_LEN];
                encode_delivery(&mut copy, 0, d.delivered_at_ms, names);
                return copy;
            }
            Record::Deliveries(d) => {
                let Some((_, tag_hash)) = d.timers().find(|&(timer, _)| timer == delivered) else { continue };
                let mut copy = vec![0; deliveries_len(d.topic.len(), 1)];
                encode_deliveries(&mut copy, 0, d.delivered_at_ms, d.topic, d.queue_id, &[(names, tag_hash)]);
                return copy;
            }
            _ => {}
        }
    }
    panic!("no record delivered {delivered}")
}

#[test]
fn a_copied_in_duplicate_of_a_run_fails() {
    let dir = all_delivered(300);
    let (records, _) = records(dir.path());
    let run = records.iter().find(|(at, b)| matches!(decoded(*at, b), Record::Deliveries(_)));
    let (at, bytes) = run.expect("a deliveries record");
    let Record::Deliveries(d) = decoded(*at, bytes) else { unreachable!() };
    let named = d.len();
    append_copy(dir.path(), bytes.clone(), |_| {});
    let (code, doc) = audit_json(dir.path());
    assert_eq!((code, &doc["duplicated"], &doc["delivered"]), (1, &json!(named), &json!(300)), "{doc}");
}

#[test]
fn a_copied_in_duplicate_delivery_fails() {
    let h = healthy();
    let copy = copy_of(h.path());
    append_copy(copy.path(), delivery_naming(copy.path(), h.a, h.a), |_| {});
    let (code, doc) = audit_json(copy.path());
    assert_eq!(
        (code, &doc["duplicated"], &doc["delivered"], &doc["early"]),
        (1, &json!(1), &json!(2), &json!(0))
    );
    let text = stdout(&dump(copy.path(), &["audit"]));
    assert!(text.contains(&format!("{}  Orders", h.a)) && text.contains("AUDIT FAILED"), "{text}");
}

#[test]
fn an_early_delivery_fails() {
    let h = healthy();
    let copy = copy_of(h.path());
    // d is due at T0 + 2 h: a delivery record for it at T0 + 11 s is early.
    append_copy(copy.path(), delivery_naming(copy.path(), h.a, h.d), |_| {});
    let (code, doc) = audit_json(copy.path());
    assert_eq!(
        (code, &doc["early"], &doc["delivered"], &doc["pending"]),
        (1, &json!(1), &json!(3), &json!(1))
    );
}

#[test]
fn a_timer_missing_from_the_wheel_long_after_its_time_is_lost() {
    let h = healthy();
    let copy = copy_of(h.path());
    // Zero the slot holding d (as if its index were lost), then move the
    // reference time past d's deliver time + 60 s with a copied-in cancel of e
    // whose cancelled-at is late: d is then overdue and in no live slot.
    let position = delaywheel::internals::slot::slot_position(delaywheel::internals::geometry::slot_index(
        0,
        (T0 + 7_200_000) / 1000,
    ));
    write_at(&copy.path().join("timer/wheel"), position, &[0; 32]);
    let (records, _) = records(copy.path());
    let cancel = records.into_iter().find(|(at, b)| matches!(decoded(*at, b), Record::Cancel(_))).unwrap().1;
    append_copy(copy.path(), cancel, |bytes| {
        bytes[12..20].copy_from_slice(&(T0 + 3 * 3_600_000).to_le_bytes()); // cancelled at
        bytes[20..28].copy_from_slice(&h.e.to_le_bytes());
        bytes[28..36].copy_from_slice(&(T0 + 2 * 86_400_000).to_le_bytes());
    });
    let (code, doc) = audit_json(copy.path());
    assert_eq!(
        (code, &doc["lost"], &doc["cancelled"], &doc["pending"]),
        (1, &json!(1), &json!(2), &json!(0))
    );
}

/// A crash in the middle of delivering a second: a store opened without
/// delivery (what `delaywheel recover` does) counts the timers `audit`
/// counts pending, leaving out those the crashed store had delivered (it
/// used to count the whole second's slot).
#[test]
fn pending_after_a_crash_mid_second_is_what_audit_counts() {
    use delaywheel::{ManualClock, Message, Store};
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let config = |dir: &std::path::Path| {
        config(dir, &clock).with_queue_file_entries(4096).with_timer_log_file_entries(4096)
    };
    let store = Store::open(config(dir.path())).unwrap();
    for i in 0..2_000u64 {
        store.put(Message::new(TOPIC, format!("t{i}")).deliver_at_ms(T0 + 1_000 + i / 2)).unwrap();
    }
    wait_until(|| store.stats().dispatch_lag_bytes == 0);
    clock.set_ms(T0 + 1_499);
    wait_until(|| store.stats().delivered == 1_000);
    // What a kill -9 now leaves: the first half delivered, the rest loaded.
    let crashed = copy_of(dir.path());
    drop(store);
    let recovered = Store::open(config(crashed.path()).with_delivery(false)).unwrap();
    let pending = recovered.fresh_stats().unwrap().pending;
    recovered.close().unwrap();
    let (_, doc) = audit_json(crashed.path());
    assert_eq!((pending, &doc["pending"], &doc["delivered"]), (1_000, &1_000.into(), &1_000.into()));
}

/// Rescheduled timers are audited by their last timer: delivered at the new
/// time, or pending for it; a delivery record of the timer a reschedule
/// replaced (the message fired at its old time) fails the audit.
#[test]
fn rescheduled_timers_are_judged_by_their_new_time() {
    use delaywheel::{ManualClock, Message, RescheduleOutcome, Store};
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    let put =
        |body: &str, at: u64| store.put(Message::new(TOPIC, body.to_string()).deliver_at_ms(at)).unwrap();
    let fired = put("fired", T0 + 5_000);
    let moved_away = put("moved-away", T0 + 1_000);
    let twice = put("twice", T0 + 2_000);
    for (receipt, to) in
        [(&fired, T0 + 3_000), (&moved_away, T0 + 86_400_000), (&twice, T0 + 8_000), (&twice, T0 + 9_000)]
    {
        assert_eq!(store.reschedule(receipt.handle().unwrap(), to).unwrap(), RescheduleOutcome::Rescheduled);
    }
    clock.set_ms(T0 + 10_000);
    wait_until(|| store.stats().delivered == 2);
    store.close().unwrap();
    let (code, doc) = audit_json(dir.path());
    assert_eq!(
        (code, &doc["timer_messages"], &doc["delivered"], &doc["pending"], &doc["rescheduled"]),
        (0, &json!(3), &json!(2), &json!(1), &json!(3)),
        "{doc}"
    );
    assert_eq!(dump(dir.path(), &["verify"]).status.code(), Some(0));
    let slot = stdout(&dump(dir.path(), &["slot", &((T0 + 1_000) / 1000).to_string()]));
    assert!(slot.contains("rescheduled"), "the replaced timer is shown as such: {slot}");

    // A delivery of "moved-away"'s own timer, the one its reschedule replaced.
    let copy = copy_of(dir.path());
    let delivered = twice_timer(copy.path());
    append_copy(copy.path(), delivery_naming(copy.path(), delivered, moved_away.offset()), |_| {});
    let (code, doc) = audit_json(copy.path());
    assert_eq!((code, &doc["fired_after_reschedule"]), (1, &json!(1)), "{doc}");
}

/// The record the delivery of the "twice" timer names: its last reschedule record.
fn twice_timer(dir: &std::path::Path) -> u64 {
    let (records, _) = records(dir);
    let last = records.iter().rev().find(|(at, b)| matches!(decoded(*at, b), Record::Reschedule(_)));
    last.expect("a reschedule record").0
}

/// A zeroed page in the middle of the log: the audit reads past it as the
/// store does, accounts for everything after it, names the stretch it could
/// not read, and fails (it used to stop at the page, count only the timers
/// before it, and pass).
#[test]
fn a_log_it_cannot_read_whole_fails_the_audit_and_names_the_stretch() {
    let dir = all_delivered(3_000);
    let segment = dir.path().join("commitlog").join(format!("{:020}", 0));
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[40 * 1024..44 * 1024].fill(0);
    std::fs::write(&segment, bytes).unwrap();

    let (code, doc) = audit_json(dir.path());
    assert_eq!((code, &doc["unreadable_log_stretches"]), (1, &json!(1)), "{doc}");
    assert!(doc["unreadable_log_bytes"].as_u64().unwrap() >= 4096, "{doc}");
    let (timers, delivered) = (doc["timer_messages"].as_u64().unwrap(), doc["delivered"].as_u64().unwrap());
    assert!(timers > 2_900 && timers < 3_000, "every timer outside the page is read: {doc}");
    assert_eq!(delivered, timers, "and their deliveries after it: {doc}");
    let text = stdout(&dump(dir.path(), &["audit"]));
    assert!(
        text.contains("unreadable: 1 damaged stretches")
            && text.contains("00000000000000000000 at offset 409"),
        "{text}"
    );
    assert!(text.contains("AUDIT FAILED"), "{text}");
}
