use super::*;
use crate::config::RecoveryMode;
use crate::format::get_u32;
use crate::format::record;

const SEG: u64 = 64 * 1024;

fn plan(start: Option<u64>, durable: u64) -> RecoveryPlan {
    RecoveryPlan { start, durable, clean_end: None, mode: RecoveryMode::Strict }
}

fn append_bytes(log: &CommitLog, payload: &[u8]) -> u64 {
    // A Delivery-kind frame is the simplest record to build by hand.
    let len = record::RECORD_HEADER_LEN + payload.len();
    log.append(len, |buf, offset| {
        crate::format::put_u32(buf, 4, len as u32);
        buf[8] = RecordKind::Delivery as u8;
        buf[9] = record::RECORD_VERSION;
        buf[12..].copy_from_slice(payload);
        let crc = crate::format::crc_at(offset, &buf[4..]);
        crate::format::put_u32(buf, 0, crc);
    })
    .unwrap()
    .0
}

#[test]
fn appends_roll_over_segments_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let (log, report) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    assert_eq!(report.end, FILE_HEADER_LEN as u64);
    let payload = vec![7u8; 1000];
    let offsets: Vec<u64> = (0..200).map(|_| append_bytes(&log, &payload)).collect();
    assert!(log.write_end() > 2 * SEG, "200 KB of records span several 64 KiB segments");
    for &offset in &offsets {
        let record = log.read(offset).unwrap();
        assert_eq!((record.offset, record.kind), (offset, RecordKind::Delivery));
        assert_eq!(&record.bytes[record::RECORD_HEADER_LEN..], &payload[..]);
        assert!(offset % SEG + record.bytes.len() as u64 <= SEG, "no record spans segments");
    }
    // A record that would cross a boundary starts the next segment after its header.
    assert!(offsets.iter().any(|o| o % SEG == FILE_HEADER_LEN as u64 && *o > 0));
}

#[test]
fn reopen_finds_the_same_end_and_a_torn_tail_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    let first = append_bytes(&log, b"first");
    let second = append_bytes(&log, b"second");
    let end = log.write_end();
    log.flush().unwrap();
    drop(log);

    let (log, report) = CommitLog::open(dir.path(), SEG, 0, &plan(Some(first), first)).unwrap();
    assert_eq!((report.end, report.torn_at), (end, None));
    drop(log);

    // Damage the second record's body: it was never vouched durable (durable = its offset).
    let path = segment::segment_path(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[second as usize + 14] ^= 0xFF;
    std::fs::write(&path, &bytes).unwrap();
    let (log, report) = CommitLog::open(dir.path(), SEG, 0, &plan(Some(first), second)).unwrap();
    assert_eq!((report.end, report.torn_at), (second, Some(second)));
    assert_eq!(report.truncated_bytes, end - second);
    assert_eq!(log.read(first).unwrap().bytes.len(), 17);
    let again = append_bytes(&log, b"again");
    assert_eq!(again, second, "appends resume at the cut");
    drop(log);
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(get_u32(&on_disk, again as usize + 4), 17, "the new record replaced the torn one");
    assert!(on_disk[again as usize + 17..].iter().all(|&b| b == 0), "nothing stale past the end");
}

#[test]
fn damage_below_the_durable_mark_is_corruption_unless_lenient() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    let first = append_bytes(&log, b"first");
    let second = append_bytes(&log, b"second");
    let end = log.write_end();
    log.flush().unwrap();
    drop(log);
    let path = segment::segment_path(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[first as usize + 13] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();

    let err = CommitLog::open(dir.path(), SEG, 0, &plan(Some(first), end)).err().unwrap();
    match err {
        Error::Corruption { file, offset, kind: CorruptionKind::ChecksumMismatch { .. } } => {
            assert_eq!((file, offset), (path.clone(), first));
        }
        other => panic!("expected a checksum corruption, got {other}"),
    }
    let lenient = RecoveryPlan { mode: RecoveryMode::Lenient, ..plan(Some(first), end) };
    let (log, report) = CommitLog::open(dir.path(), SEG, 0, &lenient).unwrap();
    assert_eq!(report.end, end, "lenient recovery keeps what follows the damage");
    assert_eq!(report.skipped, vec![(first, second - first)], "the damaged record is marked skipped");
    assert!(log.read(second).unwrap().bytes.ends_with(b"second"));
}

#[test]
fn a_missing_middle_segment_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    let payload = vec![1u8; 4000];
    while log.write_end() < 3 * SEG {
        append_bytes(&log, &payload);
    }
    drop(log);
    std::fs::remove_file(segment::segment_path(dir.path(), SEG)).unwrap();
    let err = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).err().unwrap();
    assert!(
        matches!(&err, Error::Corruption { file, kind: CorruptionKind::MissingFile, .. }
            if *file == segment::segment_path(dir.path(), SEG)),
        "{err}"
    );
}

/// Every record read back in order, as the dispatcher walks them.
fn walk(log: &CommitLog, from: u64) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    let mut at = from;
    while at < log.write_end() {
        let ((kind, len), next) = log.visit_trusted(at, |_, kind, bytes| (kind, bytes.len())).unwrap();
        if kind != RecordKind::Padding {
            out.push((at, len));
        }
        at = next;
    }
    out
}

#[test]
fn a_record_that_exactly_fills_a_segment_is_followed_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    // 16 records of 4094 bytes fill the 65,504 bytes after the header exactly.
    let payload = vec![9u8; 4094 - record::RECORD_HEADER_LEN];
    let offsets: Vec<u64> = (0..17).map(|_| append_bytes(&log, &payload)).collect();
    assert_eq!(offsets[15] + 4094, SEG, "the 16th record ends at the segment's end");
    assert_eq!(offsets[16], SEG + FILE_HEADER_LEN as u64);
    assert_eq!(walk(&log, 32).len(), 17);
    log.close();
    let end = log.write_end();
    drop(log);
    let clean = RecoveryPlan { clean_end: Some(end), ..plan(Some(end), end) };
    let (log, report) = CommitLog::open(dir.path(), SEG, 0, &clean).unwrap();
    assert_eq!(report.end, end);
    assert_eq!(walk(&log, 32).len(), 17);
}

#[test]
fn a_segment_ending_a_few_bytes_short_reopens_with_the_dispatcher_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    let full = vec![1u8; 4094 - record::RECORD_HEADER_LEN];
    for _ in 0..15 {
        append_bytes(&log, &full);
    }
    append_bytes(&log, &full[..full.len() - 5]);
    log.close();
    let end = log.write_end();
    assert_eq!(SEG - end, 5);
    drop(log);
    // The dispatcher's next offset is the first record of a segment not yet created.
    let next = normalize(end, SEG);
    assert_eq!(next, SEG + FILE_HEADER_LEN as u64);
    let (log, report) = CommitLog::open(dir.path(), SEG, 0, &plan(Some(next), end)).unwrap();
    assert_eq!(report.torn_at, None);
    assert_eq!(append_bytes(&log, b"next"), next);
    assert_eq!(walk(&log, 32).len(), 17);
}

#[test]
fn normalize_skips_headers_and_short_tails() {
    let h = FILE_HEADER_LEN as u64;
    assert_eq!(normalize(0, SEG), h);
    assert_eq!(normalize(h, SEG), h);
    assert_eq!(normalize(SEG, SEG), SEG + h);
    assert_eq!(normalize(SEG - 12, SEG), SEG - 12);
    assert_eq!(normalize(SEG - 11, SEG), SEG + h);
}

#[test]
fn a_reader_sees_new_and_deleted_segments_as_the_log_does() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    let log = Arc::new(log);
    let mut reader = LogReader::new(Arc::clone(&log));
    let first = append_bytes(&log, &[1u8; 100]);
    assert_eq!(reader.read(first).unwrap().bytes, log.read(first).unwrap().bytes);
    // Rolls after the reader copied the table: the copy must be refreshed.
    let payload = vec![9u8; 1000];
    let offsets: Vec<u64> = (0..200).map(|_| append_bytes(&log, &payload)).collect();
    for &offset in &offsets {
        let (seen, next) =
            reader.visit_trusted(offset, |at, kind, bytes| (at, kind, bytes.to_vec())).unwrap();
        let record = log.read(offset).unwrap();
        assert_eq!(seen, (record.offset, record.kind, record.bytes.to_vec()));
        assert_eq!(next, log.visit_checked(offset, |_, _, _| ()).unwrap().1);
        assert_eq!(reader.read(offset).unwrap().bytes, record.bytes);
    }
    // Deleted after the copy was made: the reader, like the log, no longer finds it.
    log.delete_oldest_segment(0).unwrap();
    assert!(matches!(log.read(first), Err(Error::Reclaimed { .. })));
    assert!(matches!(reader.read(first), Err(Error::Reclaimed { .. })));
    assert!(matches!(reader.visit_checked(first, |_, _, _| ()), Err(Error::Reclaimed { .. })));
}

#[test]
fn a_released_reader_keeps_no_deleted_segment_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    let log = Arc::new(log);
    let first = append_bytes(&log, &[1u8; 100]);
    for _ in 0..100 {
        append_bytes(&log, &[2u8; 1000]);
    }
    let mut reader = LogReader::new(Arc::clone(&log));
    reader.read(first).unwrap();
    let segment0 = Arc::downgrade(&log.segment(0).unwrap());
    log.delete_oldest_segment(0).unwrap();
    assert!(segment0.upgrade().is_some(), "the reader's table still maps it");
    reader.release();
    assert!(segment0.upgrade().is_none(), "released: the deleted file's space can be freed");
}

#[test]
fn a_reader_shares_records_published_after_it_last_looked() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    let log = Arc::new(log);
    let mut reader = LogReader::new(Arc::clone(&log));
    let mut held = Vec::new();
    // Each read comes after an append the reader's shared bytes do not
    // cover yet, then one it does; across a segment roll too.
    for i in 0..300u32 {
        let offset = append_bytes(&log, &i.to_le_bytes().repeat(50));
        let record = reader.read(offset).unwrap();
        assert_eq!(record.bytes, log.read(offset).unwrap().bytes);
        held.push((offset, record.bytes));
        let (first, _) = &held[held.len() / 2];
        assert_eq!(reader.read(*first).unwrap().bytes, log.read(*first).unwrap().bytes);
    }
    reader.release();
    for (offset, bytes) in &held {
        assert_eq!(*bytes, log.read(*offset).unwrap().bytes, "a record read stays as it was");
    }
}

#[test]
fn the_prefaulter_keeps_at_most_half_a_small_segment_ahead() {
    assert_eq!(prefault_window(1 << 30), PREFAULT_AHEAD);
    assert_eq!(prefault_window(16 << 20), 8 << 20);
    let dir = tempfile::tempdir().unwrap();
    let segment = 24u64 << 20;
    let (log, _) = CommitLog::open(dir.path(), segment, 0, &plan(None, 0)).unwrap();
    append_bytes(&log, b"first");
    while log.prefault_ahead() {}
    let faulted = log.segment(0).unwrap().prefaulted();
    assert!(faulted > 0, "pages ahead of the writer are faulted in");
    assert!(
        faulted <= (segment / 2) as usize + PREFAULT_CHUNK,
        "{faulted} bytes faulted ahead in a segment of {segment}: most of it would stay resident"
    );
}

/// Appends an occurrences record of `views` (fired at `at`), as the ticking thread would.
fn append_occurrences(log: &CommitLog, at: u64, views: &[record::RescheduleView]) -> u64 {
    let len = record::occurrences_len(views.len());
    log.append(len, |buf, offset| record::encode_occurrences(buf, offset, at, views)).unwrap().0
}

/// Two delivering occurrences fired at `at` of the timers named `fired`.
fn occurrences_of(fired: [u64; 2], at: u64) -> [record::RescheduleView; 2] {
    fired.map(|timer| record::RescheduleView {
        rescheduled_at_ms: at,
        message_offset: timer,
        from_timer: timer,
        from_deliver_at_ms: at,
        deliver_at_ms: at + 1_000,
        occurrence: Some(record::OccurrenceFields { fired: 1, delivers: true }),
    })
}

#[test]
fn a_lookup_of_an_entry_reads_the_occurrence_record_it_stands_for_and_a_walk_reads_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    let fired = [append_bytes(&log, b"a"), append_bytes(&log, b"b")];
    let views = occurrences_of(fired, 5_000);
    let at = append_occurrences(&log, 5_000, &views);
    let after = append_bytes(&log, b"after");
    for (i, view) in views.iter().enumerate() {
        let name = record::entry_name(at, i);
        let record = log.read(name).unwrap();
        assert_eq!((record.offset, record.kind), (name, RecordKind::Reschedule));
        assert_eq!(record::RescheduleView::parse(&record.bytes), Ok(*view));
        assert_eq!(
            check_frame(&record.bytes, name).map(|f| f.len),
            Ok(record.bytes.len()),
            "sealed at its name"
        );
        let (seen, next) = log.visit_checked(name, |offset, kind, _| (offset, kind)).unwrap();
        assert_eq!(
            (seen, next),
            ((name, RecordKind::Reschedule), after),
            "the record after the entries' follows"
        );
        assert!(!log.starts_record(name), "no record starts at an entry");
    }
    assert!(log.starts_record(at));
    // A walk steps over the record whole.
    let (kind, next) = log.visit_trusted(at, |_, kind, _| kind).unwrap();
    assert_eq!((kind, next), (RecordKind::Occurrences, after));
}

#[test]
fn an_entry_whose_marks_do_not_lead_to_its_record_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    let fired = [append_bytes(&log, b"a"), append_bytes(&log, b"b")];
    let at = append_occurrences(&log, 5_000, &occurrences_of(fired, 5_000));
    let name = record::entry_name(at, 1);
    log.flush().unwrap();
    drop(log);
    let path = segment::segment_path(dir.path(), 0);
    let reopen = |edit: &dyn Fn(&mut [u8])| {
        let mut bytes = std::fs::read(&path).unwrap();
        let original = bytes.clone();
        edit(&mut bytes[name as usize..]);
        std::fs::write(&path, &bytes).unwrap();
        let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(Some(at + 72), at + 72)).unwrap();
        let looked_up = log.read(name).map(|r| r.kind);
        drop(log);
        std::fs::write(&path, &original).unwrap();
        looked_up
    };
    assert!(matches!(reopen(&|_| ()), Ok(RecordKind::Reschedule)));
    // Its index says entry 0: the record would start 24 bytes later, where none does.
    assert!(matches!(reopen(&|e| e[9] = 0), Err(Error::Corruption { .. })));
    // Its marker gone: no record starts at the name either.
    assert!(matches!(reopen(&|e| e[8] = 0), Err(Error::Corruption { .. })));
    // Marked as entry 2: its record would start 24 bytes before the real one, inside the record before.
    assert!(matches!(reopen(&|e| e[9] = 2), Err(Error::Corruption { .. })));
}

#[test]
fn a_reader_checks_an_occurrences_record_once_for_its_entries_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = CommitLog::open(dir.path(), SEG, 0, &plan(None, 0)).unwrap();
    let log = Arc::new(log);
    let fired = [append_bytes(&log, b"a"), append_bytes(&log, b"b")];
    let at = append_occurrences(&log, 5_000, &occurrences_of(fired, 5_000));
    log.flush().unwrap();
    let mut reader = LogReader::new(Arc::clone(&log));
    assert!(reader.read(record::entry_name(at, 0)).is_ok(), "checksum checked");
    // The record changes under the map after that (entry 1's lateness: still well-formed).
    let path = segment::segment_path(dir.path(), 0);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[1], at + 48 + 10).unwrap();
    let second = record::entry_name(at, 1);
    assert!(reader.read(second).is_ok(), "its checksum is not taken again");
    assert!(matches!(log.read(second), Err(Error::Corruption { .. })), "without the reader's memory it is");
    reader.release();
    assert!(matches!(reader.read(second), Err(Error::Corruption { .. })), "a released reader checks again");
}
