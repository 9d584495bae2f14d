use super::cancel::OCCURRENCE_LEN;
use super::*;
use crate::format::hex;
use crate::message::Message;
use proptest::prelude::*;

fn encode(msg: &Message, offset: u64, queue: u32, store: u64, timing: Timing) -> Vec<u8> {
    let fields = msg.fields(queue, store, timing);
    let mut buf = vec![0u8; fields.record_len()];
    encode_message(&mut buf, offset, &fields);
    buf
}

#[test]
fn message_golden_bytes_match_wheel_format_md() {
    let msg = Message::new("T", "hi").key("k").property("p", "v");
    let bytes = encode(&msg, 32, 1, 1_700_000_000_000, Timing::default());
    // The same hex stands in wheel-format.md, "Message record".
    assert_eq!(
        hex(&bytes),
        concat!(
            "a39bd822",
            "3a000000",
            "01",
            "01",
            "0000",
            "0068e5cf8b010000",
            "0000000000000000",
            "01000000",
            "0000",
            "01",
            "00",
            "0100",
            "0000",
            "06000000",
            "02000000",
            "54",
            "6b",
            "0100700100 76",
            "6869"
        )
        .replace(' ', "")
    );
}

#[test]
fn delivery_golden_bytes_match_wheel_format_md() {
    let mut buf = [0u8; DELIVERY_LEN];
    encode_delivery(&mut buf, 4096, 1_700_000_001_000, 32);
    assert_eq!(check_frame(&buf, 4096), Ok(Frame { kind: RecordKind::Delivery, len: DELIVERY_LEN }));
    assert_eq!(
        DeliveryView::parse(&buf),
        Ok(DeliveryView { delivered_at_ms: 1_700_000_001_000, message_offset: 32 })
    );
    assert_eq!(
        hex(&buf[4..]),
        concat!("1c000000", "02", "01", "0000", "e86be5cf8b010000", "2000000000000000")
    );
}

#[test]
fn deliveries_golden_bytes_match_wheel_format_md() {
    let timers = [(32, 0), (90, crate::format::queue_entry::tag_hash("a"))];
    let len = deliveries_len(1, timers.len());
    let mut buf = vec![0u8; len];
    encode_deliveries(&mut buf, 4096, 1_700_000_001_000, "T", 1, &timers);
    assert_eq!(check_frame(&buf, 4096), Ok(Frame { kind: RecordKind::Deliveries, len }));
    let view = DeliveriesView::parse(&buf).unwrap();
    assert_eq!((view.delivered_at_ms, view.queue_id, view.topic, view.len()), (1_700_000_001_000, 1, "T", 2));
    assert_eq!(view.timers().collect::<Vec<_>>(), timers);
    assert_eq!((view.timer(1), view.timer(2)), (Some(timers[1]), None));
    assert!(matches!(
        Record::decode(&buf, 4096, Frame { kind: RecordKind::Deliveries, len }),
        Ok(Record::Deliveries(_))
    ));
    // The same hex stands in wheel-format.md, "Deliveries record".
    assert_eq!(
        hex(&buf[4..]),
        concat!(
            "35000000",
            "07",
            "01",
            "0000",
            "e86be5cf8b010000",
            "01000000",
            "0200",
            "01",
            "00",
            "54",
            "2000000000000000",
            "00000000",
            "5a00000000000000",
            "3043d0c1"
        )
    );
}

#[test]
fn deliveries_that_do_not_add_up_are_refused() {
    let mut buf = vec![0u8; deliveries_len(1, 2)];
    encode_deliveries(&mut buf, 0, 5, "T", 0, &[(32, 0), (64, 0)]);
    assert!(DeliveriesView::parse(&buf[..buf.len() - 12]).is_err(), "a timer short");
    let mut no_timers = buf.clone();
    no_timers[24..26].copy_from_slice(&0u16.to_le_bytes());
    assert!(DeliveriesView::parse(&no_timers).is_err(), "no timers");
    let mut no_topic = buf.clone();
    no_topic[26] = 0;
    assert!(DeliveriesView::parse(&no_topic).is_err(), "no topic");
    let mut not_utf8 = buf.clone();
    not_utf8[28] = 0xFF;
    assert!(DeliveriesView::parse(&not_utf8).is_err(), "a topic that is not UTF-8");
    assert!(DeliveriesView::parse(&buf[..20]).is_err(), "shorter than its fixed part");
}

#[test]
fn cancel_golden_bytes_match_wheel_format_md() {
    let mut buf = [0u8; CANCEL_LEN];
    encode_cancel(&mut buf, 8192, 1_700_000_000_500, 32, 1_700_000_001_000);
    assert_eq!(check_frame(&buf, 8192), Ok(Frame { kind: RecordKind::Cancel, len: CANCEL_LEN }));
    let view = CancelView::parse(&buf).unwrap();
    assert_eq!((view.message_offset, view.deliver_at_ms), (32, 1_700_000_001_000));
    assert_eq!(
        hex(&buf[4..]),
        concat!("24000000", "03", "01", "0000", "f469e5cf8b010000", "2000000000000000", "e86be5cf8b010000")
    );
}

#[test]
fn reschedule_golden_bytes_match_wheel_format_md() {
    let view = RescheduleView {
        rescheduled_at_ms: 1_700_000_000_500,
        message_offset: 32,
        from_timer: 32,
        from_deliver_at_ms: 1_700_000_001_000,
        deliver_at_ms: 1_700_000_601_000,
        occurrence: None,
    };
    let mut buf = [0u8; RESCHEDULE_LEN];
    view.encode(&mut buf, 8192);
    assert_eq!(check_frame(&buf, 8192), Ok(Frame { kind: RecordKind::Reschedule, len: RESCHEDULE_LEN }));
    assert_eq!(RescheduleView::parse(&buf), Ok(view));
    assert_eq!(record_time_ms(RecordKind::Reschedule, &buf), Some(1_700_000_000_500));
    assert_eq!(
        hex(&buf[4..]),
        concat!(
            "34000000",
            "06",
            "01",
            "0000",
            "f469e5cf8b010000",
            "2000000000000000",
            "2000000000000000",
            "e86be5cf8b010000",
            "a893eecf8b010000"
        )
    );
}

#[test]
fn occurrence_golden_bytes_match_wheel_format_md() {
    // OccurrenceFields 3 of the schedule at 32 fired at 10:00:00 and arms the
    // next, ten seconds on: flags 3 (occurrence, delivers), 60 bytes.
    let view = RescheduleView {
        rescheduled_at_ms: 1_700_000_000_000,
        message_offset: 32,
        from_timer: 4096,
        from_deliver_at_ms: 1_700_000_000_000,
        deliver_at_ms: 1_700_000_010_000,
        occurrence: Some(OccurrenceFields { fired: 3, delivers: true }),
    };
    let mut buf = [0u8; OCCURRENCE_LEN];
    view.encode(&mut buf, 8192);
    assert_eq!(check_frame(&buf, 8192), Ok(Frame { kind: RecordKind::Reschedule, len: OCCURRENCE_LEN }));
    assert_eq!(RescheduleView::parse(&buf), Ok(view));
    assert!(view.delivers());
    assert_eq!(
        hex(&buf[4..]),
        concat!(
            "3c000000",
            "06",
            "01",
            "0300",
            "0068e5cf8b010000",
            "2000000000000000",
            "0010000000000000",
            "0068e5cf8b010000",
            "108fe5cf8b010000",
            "0300000000000000"
        )
    );
    // Skipped (a missed occurrence the policy drops): flag 1 alone.
    let skipped = RescheduleView { occurrence: Some(OccurrenceFields { fired: 3, delivers: false }), ..view };
    skipped.encode(&mut buf, 8192);
    assert_eq!(RescheduleView::parse(&buf), Ok(skipped));
    // A flag that is not defined, or a length that does not go with the flags, is damage.
    let mut odd = buf;
    odd[10] = 4;
    assert!(RescheduleView::parse(&odd).is_err());
    assert!(RescheduleView::parse(&buf[..RESCHEDULE_LEN]).is_err());
}

#[test]
fn one_property_is_read_in_place_and_a_malformed_block_is_corruption() {
    let msg = Message::new("T", "hi").property("a", "1").property("dw.schedule", "v=1").property("z", "");
    let bytes = encode(&msg, 32, 0, 1, Timing::default());
    let view = MessageView::parse(&bytes).unwrap();
    assert_eq!(view.property("dw.schedule"), Ok(Some("v=1")));
    assert_eq!(view.property("z"), Ok(Some("")));
    assert_eq!(view.property("missing"), Ok(None));
    // The last value claims more bytes than the block has.
    let z = bytes.windows(3).position(|w| w == [1, 0, b'z']).unwrap();
    let mut damaged = bytes.clone();
    damaged[z + 3] = 9;
    let view = MessageView::parse(&damaged).unwrap();
    assert_eq!(view.property("dw.schedule"), Ok(Some("v=1")), "read before the damage");
    assert!(matches!(view.property("missing"), Err(CorruptionKind::BadFrame(_))));
}

#[test]
fn a_schedule_is_a_message_record_with_flag_2() {
    let mut msg = Message::new("T", "hi");
    msg.schedule = true;
    let bytes =
        encode(&msg, 32, 0, 1_700_000_000_000, Timing { deliver_at_ms: 1_700_000_010_000, delay_level: 0 });
    assert_eq!(hex(&bytes[10..12]), "0200");
    let view = MessageView::parse(&bytes).unwrap();
    assert!(view.schedule && !view.rescheduled);
    assert_eq!(view.timer_deliver_at_ms(), Some(1_700_000_010_000));
}

#[test]
fn relocation_golden_bytes_match_wheel_format_md() {
    let view = RelocationView {
        relocated_at_ms: 1_700_000_002_000,
        segment_base: 0,
        timers: 2,
        cancels: 1,
        bytes: 300,
    };
    let mut buf = [0u8; RELOCATION_LEN];
    view.encode(&mut buf, 1 << 20);
    assert_eq!(check_frame(&buf, 1 << 20), Ok(Frame { kind: RecordKind::Relocation, len: RELOCATION_LEN }));
    assert_eq!(RelocationView::parse(&buf), Ok(view));
    assert_eq!(record_time_ms(RecordKind::Relocation, &buf), Some(1_700_000_002_000));
    assert_eq!(
        hex(&buf[4..]),
        concat!(
            "34000000",
            "04",
            "01",
            "0000",
            "d06fe5cf8b010000",
            "0000000000000000",
            "0200000000000000",
            "0100000000000000",
            "2c01000000000000"
        )
    );
}

#[test]
fn padding_frames_check() {
    let mut seg = [0u8; 100];
    encode_padding(&mut seg[40..], 1040);
    assert_eq!(check_frame(&seg[40..], 1040), Ok(Frame { kind: RecordKind::Padding, len: 60 }));
    assert!(matches!(check_frame(&seg[40..], 1041), Err(FrameError::Invalid(_))));
}

#[test]
fn zeros_are_the_end_not_corruption() {
    assert_eq!(check_frame(&[0u8; 64], 0), Err(FrameError::Empty));
}

#[test]
fn every_flipped_bit_is_caught() {
    let msg = Message::new("Topic", "body").tags("a||b");
    let bytes = encode(&msg, 4096, 0, 7, Timing { deliver_at_ms: 9, delay_level: 3 });
    for bit in 0..bytes.len() * 8 {
        let mut copy = bytes.clone();
        copy[bit / 8] ^= 1 << (bit % 8);
        assert!(check_frame(&copy, 4096).is_err(), "flipped bit {bit} passed");
    }
}

fn arb_message() -> impl Strategy<Value = Message> {
    (
        "[A-Za-z0-9_]{1,20}",
        proptest::option::of("[a-z]{0,12}"),
        proptest::option::of("[a-z|]{0,12}"),
        proptest::collection::vec(("[a-z]{0,6}", "\\PC{0,6}"), 0..4),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(topic, key, tags, props, body)| {
            let mut m = Message::new(topic, body);
            m.key = key;
            m.tags = tags;
            m.properties = props;
            m
        })
}

proptest! {
    #[test]
    fn messages_round_trip(msg in arb_message(), offset in 0u64..1 << 40, queue in 0u32..1024,
                           store in any::<u64>(), deliver in any::<u64>(), level in any::<u16>()) {
        let timing = Timing { deliver_at_ms: deliver, delay_level: level };
        let bytes = encode(&msg, offset, queue, store, timing);
        let frame = check_frame(&bytes, offset).unwrap();
        prop_assert_eq!(frame, Frame { kind: RecordKind::Message, len: bytes.len() });
        let view = MessageView::parse(&bytes).unwrap();
        prop_assert_eq!(view.topic, msg.topic.as_str());
        prop_assert_eq!(view.key, msg.key.as_deref().unwrap_or(""));
        prop_assert_eq!(view.tags, msg.tags.as_deref().unwrap_or(""));
        prop_assert_eq!(view.properties().unwrap(), msg.properties.clone());
        prop_assert_eq!(&bytes[view.body.clone()], &msg.body[..]);
        prop_assert_eq!((view.queue_id, view.store_time_ms, view.timing), (queue, store, timing));
    }
}

#[test]
fn a_dedup_key_is_the_first_property_golden_bytes_match_wheel_format_md() {
    let msg = Message::new("T", "hi").property("p", "v").dedup_key("k");
    let bytes = encode(&msg, 32, 1, 1_700_000_000_000, Timing::default());
    // Lengths: topic 1, (reserved), key 0, tags 0, properties 4 + 12 + 1 (the dedup key) + 4 + 1 + 1, body 2.
    assert_eq!(hex(&bytes[34..48]), "0100000000001700000002000000");
    let props = "0c00".to_string()
        + &hex(b"dw.dedup_key")
        + "0100"
        + &hex(b"k")
        + "0100"
        + &hex(b"p")
        + "0100"
        + &hex(b"v");
    assert_eq!(hex(&bytes[49..49 + 23]), props);
    let view = MessageView::parse(&bytes).unwrap();
    assert_eq!(view.dedup_key(), Some("k"));
    assert_eq!(view.property("p"), Ok(Some("v")));
    let plain = encode(&Message::new("T", "hi"), 32, 1, 0, Timing::default());
    assert_eq!(MessageView::parse(&plain).unwrap().dedup_key(), None);
}

/// The two occurrences of the occurrences-record example in wheel-format.md.
fn two_occurrences() -> [RescheduleView; 2] {
    let at = 1_700_000_000_000;
    let occurrence = |fired| Some(OccurrenceFields { fired, delivers: true });
    [
        // The schedule at 32, its 3rd occurrence, fired on time its timer named 4096, next in 10 s.
        RescheduleView {
            rescheduled_at_ms: at,
            message_offset: 32,
            from_timer: 4096,
            from_deliver_at_ms: at,
            deliver_at_ms: at + 10_000,
            occurrence: occurrence(3),
        },
        // The schedule at 90, its 1st occurrence, 2 ms late, its own record's timer.
        RescheduleView {
            rescheduled_at_ms: at,
            message_offset: 90,
            from_timer: 90,
            from_deliver_at_ms: at - 2,
            deliver_at_ms: at + 59_998,
            occurrence: occurrence(1),
        },
    ]
}

/// The example record, written at 8192.
fn occurrences_example() -> Vec<u8> {
    let views = two_occurrences();
    let mut buf = vec![0u8; occurrences_len(views.len())];
    encode_occurrences(&mut buf, 8192, 1_700_000_000_000, &views);
    buf
}

#[test]
fn occurrences_golden_bytes_match_wheel_format_md() {
    let buf = occurrences_example();
    assert_eq!(check_frame(&buf, 8192), Ok(Frame { kind: RecordKind::Occurrences, len: 72 }));
    // The same hex stands in wheel-format.md, "Occurrences record".
    assert_eq!(
        hex(&buf[4..]),
        concat!(
            "48000000",
            "08",
            "01",
            "0000",
            "0068e5cf8b010000",
            "0200",
            "0000",
            "2000000000000000",
            "88",
            "00",
            "0000",
            "03000000",
            "1810000000",
            "102700",
            "5a00000000000000",
            "88",
            "01",
            "0200",
            "01000000",
            "d61f000000",
            "5eea00"
        )
    );
    let view = OccurrencesView::parse(&buf, 8192).unwrap();
    assert_eq!((view.len(), view.delivered_at_ms), (2, 1_700_000_000_000));
    let entries: Vec<_> = view.entries().collect();
    assert_eq!(entries, [(8216, two_occurrences()[0]), (8240, two_occurrences()[1])]);
    // Entry 0 stands for the occurrence record of the golden example above,
    // as if written at its name.
    let mut as_record = [0u8; OCCURRENCE_LEN];
    entries[0].1.encode(&mut as_record, 8216);
    assert_eq!(hex(&as_record[4..]).get(..16), Some("3c00000006010300"));
    assert_eq!(RescheduleView::parse(&as_record), Ok(two_occurrences()[0]));
    assert_eq!(Record::decode(&buf, 8192, check_header(&buf).unwrap()), Ok(Record::Occurrences(view)));
}

#[test]
fn an_entry_names_its_record_by_its_marker_and_index() {
    let buf = occurrences_example();
    // Read at the names: the marker and index say where the record starts.
    assert_eq!(containing_record(8216, &buf[24..]), Some(8192));
    assert_eq!(containing_record(8240, &buf[48..]), Some(8192));
    assert_eq!((entry_name(8192, 0), entry_name(8192, 1)), (8216, 8240));
    // A record's own start holds its kind there, never the marker.
    assert_eq!(containing_record(8192, &buf), None);
    assert_eq!(containing_record(8216, &buf[24..33]), None, "too short to tell");
    // Marked bytes at an offset too small for their index are no entry's.
    assert_eq!(containing_record(30, &buf[48..]), None);
    assert_eq!(OccurrencesView::entry_at(&buf, 8192, 1).map(|(name, _)| name), Ok(8240));
    assert!(OccurrencesView::entry_at(&buf, 8192, 2).is_err(), "no third entry");
}

#[test]
fn an_occurrences_record_that_does_not_add_up_is_damage() {
    let good = occurrences_example();
    let parse = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = good.clone();
        edit(&mut bytes);
        OccurrencesView::parse(&bytes, 8192).map(|_| ())
    };
    assert!(parse(&|_| ()).is_ok());
    type Edit<'a> = &'a dyn Fn(&mut Vec<u8>);
    let broken: [(&str, Edit<'_>); 9] = [
        ("a count the length does not hold", &|b| b[20] = 3),
        ("no entries", &|b| b.truncate(24)),
        ("the reserved field set", &|b| b[22] = 1),
        ("an entry unmarked", &|b| b[24 + 8] = 0x06),
        ("an entry misnumbered", &|b| b[48 + 9] = 0),
        ("no occurrence fired", &|b| b[24 + 12..24 + 16].fill(0)),
        ("a fired timer at or past the record", &|b| b[24 + 16..24 + 21].copy_from_slice(&[24, 0, 0, 0, 0])),
        ("a fired timer below its schedule", &|b| {
            b[24 + 16..24 + 21].copy_from_slice(&[0x10, 0x20, 0, 0, 0])
        }),
        ("a fired timer before the log", &|b| b[24 + 16..24 + 21].copy_from_slice(&[0, 0, 0, 0, 1])),
    ];
    for (what, edit) in broken {
        assert!(matches!(parse(edit), Err(CorruptionKind::BadFrame(_))), "{what}");
    }
}

#[test]
fn an_occurrence_fits_an_entry_only_within_its_fields_widths() {
    let [view, _] = two_occurrences();
    let at = view.rescheduled_at_ms;
    let name = entry_name(8192, 0);
    assert!(entry_fits(&view, name));
    let unfit = [
        ("65.5 s late", RescheduleView { from_deliver_at_ms: at - 65_536, ..view }),
        ("next 4 h 40 m ahead", RescheduleView { deliver_at_ms: at + (1 << 24), ..view }),
        ("next before the delivery", RescheduleView { deliver_at_ms: at - 1, ..view }),
        (
            "delivering nothing",
            RescheduleView { occurrence: Some(OccurrenceFields { fired: 3, delivers: false }), ..view },
        ),
        ("no occurrence", RescheduleView { occurrence: None, ..view }),
        (
            "2^32 occurrences",
            RescheduleView { occurrence: Some(OccurrenceFields { fired: 1 << 32, delivers: true }), ..view },
        ),
    ];
    for (what, view) in unfit {
        assert!(!entry_fits(&view, name), "{what}");
    }
    assert!(entry_fits(
        &RescheduleView { from_deliver_at_ms: at - 65_535, deliver_at_ms: at + (1 << 24) - 1, ..view },
        name
    ));
    // An entry named a tebibyte of log past its fired timer, less a byte, and one named a tebibyte past it.
    assert!(entry_fits(&view, view.from_timer + (1 << 40) - 1));
    assert!(!entry_fits(&view, view.from_timer + (1 << 40)));
}
