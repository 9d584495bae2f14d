//! Property: whatever point a crash tears the log at, recovery keeps exactly
//! the records that lie wholly before it, in order, and nothing else.

mod common;

use std::time::Duration;

use common::*;
use delaywheel::{Message, Store};
use proptest::prelude::*;

const SEG: u64 = 64 * 1024;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_truncation_recovers_a_prefix(
        sizes in proptest::collection::vec(0usize..3000, 1..60),
        cut_fraction in 0.0f64..1.0,
        garbage in any::<bool>(),
    ) {
        let live = tempfile::tempdir().unwrap();
        let store = Store::open(no_periodic_flush(live.path())).unwrap();
        let mut offsets = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            let body = format!("{i:04}").into_bytes().into_iter().cycle().take(size.max(4)).collect::<Vec<u8>>();
            offsets.push(store.put(Message::new("T", body).queue_id(0)).unwrap().offset());
        }
        let crashed = tempfile::tempdir().unwrap();
        crash_copy(live.path(), crashed.path());
        drop(store);

        // Tear the log at a random point between the first record and the end.
        let first = offsets[0];
        let last_seg = offsets.last().unwrap() / SEG;
        let end_of_data = last_seg * SEG + SEG; // anything after the last record is zeros anyway
        let cut = first + ((end_of_data - first) as f64 * cut_fraction) as u64;
        // A segment's 32-byte header is synced before the segment is renamed
        // into place, so a crash never tears it: cut at or after it.
        let cut = cut.max(cut - cut % SEG + 32);
        let seg_base = cut - cut % SEG;
        let path = crashed.path().join("commitlog").join(format!("{seg_base:020}"));
        let mut bytes = std::fs::read(&path).unwrap();
        let local = (cut - seg_base) as usize;
        if garbage {
            bytes[local..].iter_mut().enumerate().for_each(|(i, b)| *b = (i as u8).wrapping_mul(31) | 1);
        } else {
            bytes[local..].fill(0);
        }
        std::fs::write(&path, bytes).unwrap();
        for later in (seg_base / SEG + 1)..=last_seg {
            let _ = std::fs::remove_file(crashed.path().join("commitlog").join(format!("{:020}", later * SEG)));
        }

        let store = Store::open(small_config(crashed.path())).unwrap();
        let mut consumer = store.consumer("T", 0).unwrap();
        let got = drain_idle(&mut consumer, sizes.len(), Duration::from_millis(300));
        // A record survives if and only if it ends at or before the cut. A
        // record here is 49 bytes of frame, fixed fields and topic "T", plus its body.
        let record_end = |i: usize| offsets[i] + 49 + sizes[i].max(4) as u64;
        let kept = (0..sizes.len()).take_while(|&i| record_end(i) <= cut).count();
        prop_assert_eq!(got.len(), kept);
        for (i, m) in got.iter().enumerate() {
            prop_assert_eq!(m.log_offset(), offsets[i], "a prefix, in order");
            let expected = format!("{i:04}").into_bytes().into_iter().cycle().take(sizes[i].max(4)).collect::<Vec<u8>>();
            prop_assert_eq!(&m.body()[..], &expected[..]);
        }
        // The end is at or before the cut, or (when only padding followed the
        // last whole record) the first record of the next segment.
        let end = store.recovery_report().end;
        let next_segment = cut - cut % SEG + SEG + 32;
        prop_assert!(end <= cut || end == next_segment, "recovered end {} is past the cut {}", end, cut);
    }
}
