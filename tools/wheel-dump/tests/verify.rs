//! `verify` on a healthy store and on copies with one flipped bit (or a torn
//! checkpoint slot): it names the damaged file and the exact byte offset.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use delaywheel::internals::{self, geometry};

/// Runs `verify --json` and returns (exit code, problem file, problem offset).
fn problem(dir: &Path) -> (i32, PathBuf, u64) {
    let out = dump(dir, &["verify", "--json"]);
    let doc = json(&out);
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["ok"], false, "{doc}");
    let p = &doc["problem"];
    (out.status.code().unwrap(), PathBuf::from(p["file"].as_str().unwrap()), p["offset"].as_u64().unwrap())
}

#[test]
fn a_healthy_store_passes_with_counts() {
    let h = healthy();
    let out = dump(h.path(), &["verify", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let checked = &json(&out)["checked"];
    assert_eq!(
        checked["records"], 9,
        "six messages, two deliveries (58 bytes as a run against 56), one cancel"
    );
    assert_eq!(checked["timer_log_entries"], 6);
    assert_eq!(
        (&checked["near_timer_log_entries"], &checked["far_timer_log_entries"]),
        (&5.into(), &1.into())
    );
    assert_eq!(checked["chains_walked"], 3, "the live slots: c's second, d's second, e's level-1 window");
    assert_eq!(checked["chain_entries"], 4, "c, its cancel entry, d and e");
    assert_eq!((&checked["chain_starts"], &checked["chain_starts_unknown"]), (&3.into(), &0.into()));
    assert_eq!(checked["queue_entries"], 3);
}

#[test]
fn a_flipped_bit_in_a_wheel_slot_is_named() {
    let h = healthy();
    let copy = copy_of(h.path());
    // The slot of d's second (due at T0 + 2 h, level 0).
    let position = internals::slot::slot_position(geometry::slot_index(0, (T0 + 7_200_000) / 1000));
    assert_eq!(position, 32 + 48_800 * 32, "wheel-format.md: slot i at 32 + i * 32");
    let wheel = copy.path().join("timer/wheel");
    flip_bit(&wheel, position + 8);
    assert_eq!(problem(copy.path()), (1, wheel, position));
}

#[test]
fn a_flipped_bit_in_a_timer_log_entry_is_named() {
    let h = healthy();
    let copy = copy_of(h.path());
    let file = copy.path().join("timer/timerlog/00000000000000000000");
    // Entry 2 (b's timer) at 32 + 2 * 28.
    flip_bit(&file, 88 + 3);
    assert_eq!(problem(copy.path()), (1, file, 88));
}

#[test]
fn a_flipped_bit_in_a_commit_log_record_is_named() {
    let h = healthy();
    let copy = copy_of(h.path());
    let segment = segment0(copy.path());
    // Inside b's body; segment 0 starts at log offset 0, so file offset = log offset.
    flip_bit(&segment, h.b + 50);
    assert_eq!(problem(copy.path()), (1, segment, h.b));
}

#[test]
fn a_flipped_bit_in_a_consume_queue_entry_is_named() {
    let h = healthy();
    let copy = copy_of(h.path());
    let file = copy.path().join("consumequeue/Orders/0/00000000000000000000");
    // Entry 1 at 32 + 1 * 32.
    flip_bit(&file, 64 + 5);
    assert_eq!(problem(copy.path()), (1, file, 64));
}

/// A zeroed entry followed by written ones (a zeroed page of a queue file)
/// is named in the queue file; it used to be named as a log record with no
/// entry, in the commit log.
#[test]
fn a_zeroed_stretch_of_a_consume_queue_is_named_in_the_queue() {
    let h = healthy();
    let copy = copy_of(h.path());
    let file = copy.path().join("consumequeue/Orders/0/00000000000000000000");
    write_at(&file, 64, &[0; 32]);
    assert_eq!(problem(copy.path()), (1, file, 64));
}

#[test]
fn a_torn_checkpoint_slot_is_named() {
    let h = healthy();
    let copy = copy_of(h.path());
    assert_eq!(json(&dump(copy.path(), &["checkpoint", "--json"]))["newest"], 0, "close wrote slot 0");
    let file = copy.path().join("checkpoint");
    write_at(&file, 20, &[0xFF; 10]);
    assert_eq!(problem(copy.path()), (1, file.clone(), 0));
    // The store would fall back to the other slot; the listing says which.
    let doc = json(&dump(copy.path(), &["checkpoint", "--json"]));
    assert_eq!((doc["slots"][0]["state"].as_str(), doc["newest"].as_u64()), (Some("invalid"), Some(512)));
}

/// Writes `liar` (with a valid checksum) over the checkpoint slot at 512,
/// where the fixture's older slot is.
fn plant_slot(dir: &Path, liar: &internals::checkpoint::Checkpoint) {
    write_at(&dir.join("checkpoint"), 512, &liar.encode());
}

/// wheel-dump and the store trust the same checkpoint, by the library's one
/// rule, where the newest valid slot is one the store cannot have written:
/// it names log offsets past the log's files, or a `dispatched` the log's
/// records do not lead to. wheel-dump used to take the newest valid slot,
/// and verify passed both.
#[test]
fn wheel_dump_trusts_the_checkpoint_the_store_trusts() {
    let h = healthy();
    let doc = json(&dump(h.path(), &["checkpoint", "--json"]));
    let real: internals::checkpoint::Checkpoint =
        internals::checkpoint::Checkpoint::decode(&std::fs::read(h.path().join("checkpoint")).unwrap())
            .unwrap();
    assert_eq!((doc["trusted"].as_u64(), real.sequence), (Some(0), 2), "close wrote slot 0, the second");
    let contradicts = internals::checkpoint::Checkpoint { sequence: 3, log_durable: 1 << 40, ..real };
    let no_lead = internals::checkpoint::Checkpoint {
        sequence: 3,
        clean: false,
        log_durable: real.log_durable + 100,
        dispatched: real.dispatched + 1,
        ..real
    };
    for (liar, why) in [(contradicts, "lies past the log's files"), (no_lead, "do not lead|not where")] {
        let copy = copy_of(h.path());
        plant_slot(copy.path(), &liar);
        let doc = json(&dump(copy.path(), &["checkpoint", "--json"]));
        assert_eq!((doc["newest"].as_u64(), doc["trusted"].as_u64()), (Some(512), Some(0)), "{liar:?}");
        let out = dump(copy.path(), &["verify"]);
        assert_eq!(out.status.code(), Some(1), "verify names the slot: {}", stdout(&out));
        let report = format!("{}{}", stdout(&out), stderr(&out));
        assert!(report.contains("at offset 512") || report.contains("512"), "{report}");
        assert!(why.split('|').any(|w| report.contains(w)), "{report}");
        let clock = delaywheel::ManualClock::new(T0 + 20_000);
        let store = delaywheel::Store::open(config(copy.path(), &clock)).unwrap();
        assert_eq!(store.recovery_report().trusted_checkpoint, Some(real.sequence), "the store: {liar:?}");
        store.close().unwrap();
    }
}

#[test]
fn the_text_report_names_file_and_offset() {
    let h = healthy();
    let copy = copy_of(h.path());
    let segment = segment0(copy.path());
    flip_bit(&segment, h.d + 20);
    let out = dump(copy.path(), &["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let first = stdout(&out).lines().next().unwrap().to_string();
    assert_eq!(first, format!("PROBLEM in {} at offset {}", segment.display(), h.d));
}

#[test]
fn a_perf_like_store_with_every_timer_delivered_passes() {
    let dir = all_delivered(300);
    let out = dump(dir.path(), &["verify", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let checked = &json(&out)["checked"];
    assert_eq!(checked["deliveries"], 300);
    // Timers checked as their second was loaded fire as runs, each run one
    // deliveries record; the rest (indexed into a second already loaded)
    // one delivery record each.
    let (runs, records) = (checked["delivery_runs"].as_u64().unwrap(), checked["records"].as_u64().unwrap());
    assert!(runs > 0 && records < 300 + 300 - runs, "{checked}");
}

#[test]
fn an_empty_queue_file_made_ahead_of_need_is_not_counted_as_entries() {
    let h = healthy();
    let copy = copy_of(h.path());
    // A crash can leave the next file of a queue, made ahead of need, empty.
    let dir = copy.path().join("consumequeue/Orders/0");
    let first = std::fs::read(dir.join("00000000000000000000")).unwrap();
    let per_file = u64::from_le_bytes(first[12..20].try_into().unwrap());
    let mut spare = vec![0u8; first.len()];
    spare[..20].copy_from_slice(&first[..20]);
    spare[20..28].copy_from_slice(&per_file.to_le_bytes());
    let crc = crc32c::crc32c(&spare[..28]);
    spare[28..32].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(dir.join(format!("{per_file:020}")), spare).unwrap();

    let doc = json(&dump(copy.path(), &["summary", "--json"]));
    assert_eq!(doc["consume_queues"][0]["entries"], 3, "{doc}");
    assert_eq!(doc["consume_queues"][0]["files"], 2);
    let verified = dump(copy.path(), &["verify"]);
    assert!(verified.status.success(), "{}", stderr(&verified));
}

/// A slot count of `u32::MAX` under a valid checksum: `verify` names the
/// slot, and the store delivers the slot's timer; neither sizes a buffer by
/// the count (both used to abort allocating 171 GB).
#[test]
fn a_huge_slot_count_is_named_not_allocated() {
    let h = healthy();
    let copy = copy_of(h.path());
    let index = geometry::slot_index(0, (T0 + 7_200_000) / 1000);
    let position = internals::slot::slot_position(index);
    let wheel = copy.path().join("timer/wheel");
    let bytes = std::fs::read(&wheel).unwrap();
    let at = position as usize;
    let mut slot = internals::slot::Slot::decode(&bytes[at..at + internals::slot::SLOT_LEN], index).unwrap();
    slot.count = u32::MAX;
    write_at(&wheel, position, &slot.encode(index));
    assert_eq!(problem(copy.path()), (1, wheel, position));

    let clock = delaywheel::ManualClock::new(T0 + 11_000);
    let store = delaywheel::Store::open(config(copy.path(), &clock)).unwrap();
    clock.set_ms(T0 + 7_201_000);
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let mut offsets = Vec::new();
    let started = std::time::Instant::now();
    while !offsets.contains(&h.d) && started.elapsed() < std::time::Duration::from_secs(10) {
        let batch = consumer.poll(10, std::time::Duration::from_millis(200)).unwrap();
        offsets.extend(batch.iter().filter(|m| m.deliver_at_ms().is_some()).map(|m| m.log_offset()));
    }
    assert_eq!(offsets, [h.a, h.b, h.d], "a and b were delivered before; d, due at T0 + 2 h, now");
    store.health().unwrap();
}

/// A clean close whose log ends in the last bytes of a segment (too few for
/// a record header, so the next record starts the next segment) is no
/// problem: the checkpoint's end and the log's are the same place.
#[test]
fn a_clean_close_in_the_last_bytes_of_a_segment_passes() {
    use delaywheel::{ManualClock, Message, Store};
    const SEGMENT: u64 = 64 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    let put = |len: u64| store.put(Message::new(TOPIC, vec![7u8; len as usize])).unwrap().offset();
    let first = put(100);
    let fixed = put(100) - first - 100;
    let mut next = first + 2 * (fixed + 100);
    let target = SEGMENT - 6;
    while target - next > 8_000 + fixed {
        assert_eq!(put(8_000), next);
        next += fixed + 8_000;
    }
    assert_eq!(put(target - next - fixed), next);
    store.close().unwrap();
    let out = dump(dir.path(), &["verify", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    // The store trusts that close's checkpoint too (its dispatched is the
    // next segment's first record, its log durable the same place unrounded).
    let written = json(&dump(dir.path(), &["checkpoint", "--json"]));
    let sequence = written["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["checkpoint"]["sequence"].as_u64())
        .max();
    let store = Store::open(config(dir.path(), &clock)).unwrap();
    assert_eq!(store.recovery_report().trusted_checkpoint, sequence);
    store.close().unwrap();
}

#[test]
fn positions_messages_need_no_queue_entry() {
    let dir = tempfile::tempdir().unwrap();
    let clock = delaywheel::ManualClock::new(T0);
    let store = delaywheel::Store::open(config(dir.path(), &clock)).unwrap();
    for i in 0..3 {
        store.put(delaywheel::Message::new(TOPIC, format!("m{i}"))).unwrap();
    }
    let mut consumer = store.consumer_in_group("g", TOPIC, 0).unwrap();
    let got = consumer.poll(3, std::time::Duration::from_secs(5)).unwrap();
    assert_eq!(got.len(), 3);
    consumer.commit();
    store.sync_offsets().unwrap();
    drop(consumer);
    store.close().unwrap();
    let out = dump(dir.path(), &["verify", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(json(&out)["checked"]["records"], 4, "three messages and one positions message");
}

/// The indexes beside the wheel and the queues are checked too (they were
/// not read at all): a flipped bit in a key-index entry or in
/// `index/topic_pending`, a garbled `consumer_offsets.json` and one planted
/// as a symbolic link are each named.
#[test]
fn the_key_index_the_topic_counts_and_the_consumer_offsets_are_checked() {
    let h = healthy();
    let healthy_report = json(&dump(h.path(), &["verify", "--json"]));
    assert_eq!(healthy_report["ok"], true, "{healthy_report}");
    assert!(healthy_report["checked"]["key_index_entries"].as_u64().unwrap() > 0, "{healthy_report}");

    let copy = copy_of(h.path());
    let keys = std::fs::read_dir(copy.path().join("index/keys")).unwrap().next().unwrap().unwrap().path();
    let header = std::fs::read(&keys).unwrap();
    let per_file = internals::FileHeader::decode(&header, internals::KEY_INDEX_MAGIC).unwrap().a;
    let entry0 = internals::key_index::entry_position(per_file, 0) as u64;
    flip_bit(&keys, entry0 + 3);
    assert_eq!(problem(copy.path()), (1, keys, entry0));

    let copy = copy_of(h.path());
    let counts = copy.path().join("index/topic_pending");
    assert!(counts.exists(), "a closed store has its counts");
    flip_bit(&counts, 40);
    assert_eq!(problem(copy.path()), (1, counts, 0));

    let copy = copy_of(h.path());
    let offsets = copy.path().join("consumer_offsets.json");
    std::fs::write(&offsets, b"{\"version\": 2, \"offs").unwrap();
    assert_eq!(problem(copy.path()), (1, offsets.clone(), 0));
    let elsewhere = copy.path().join("../planted.json");
    std::fs::write(&elsewhere, b"{\"version\": 2, \"covers_log_to\": 32, \"offsets\": []}").unwrap();
    std::fs::remove_file(&offsets).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &offsets).unwrap();
    assert_eq!(problem(copy.path()), (1, offsets, 0));
    std::fs::remove_file(elsewhere).unwrap();
}

/// `timer/pins` is read through its checksum: a whole one is counted, a
/// flipped bit fails `verify`, naming the file.
#[test]
fn the_pins_snapshot_is_read_through_its_checksum() {
    use internals::pins::{Covers, Encoder, FilePin};
    let h = healthy();
    let copy = copy_of(h.path());
    let path = copy.path().join("timer/pins");
    let covers = Covers { covered: 3, fingerprint: [0; 28] };
    let mut encoder = Encoder::new(Vec::new(), &covers).unwrap();
    for message in [32, 64] {
        encoder.push(FilePin { message, timer: message + 1_000, deliver_at_ms: T0 }).unwrap();
    }
    std::fs::write(&path, encoder.finish().unwrap().0).unwrap();
    let out = dump(copy.path(), &["verify", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(json(&out)["checked"]["snapshot_pins"], 2);
    flip_bit(&path, 32 + 28 + 24 + 3);
    assert_eq!(problem(copy.path()), (1, path, 0));
}
