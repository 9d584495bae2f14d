//! Snapshot tests: the text and JSON output of every subcommand on the
//! healthy fixture (`common::healthy`). Times come from a manual clock and
//! offsets from a fixed sequence of puts, so the output is the same on every
//! run; the temporary directory's path is replaced by `<DIR>`.
//!
//! What the snapshots show, checked by hand against the fixture: messages at
//! log offsets 32 (a, due T0+5 s), 94 (b, level 2 = 5 s), 149 (c, cancelled),
//! 240 (d, level 18 = 2 h), 295 (e, T0+2 days, level 1) and 350 (ordinary);
//! a and b delivered at T0+11 s, a delivery record each (as one deliveries
//! record they would take 58 bytes against 56); the close's checkpoint at tick second
//! T0+13 s; the near timer log holds a, b, c, c's cancel entry and d (level
//! 0), the far timer log e (level 1); `timer/tails` records where each of
//! the four slots' chains begins; the cancel ledger (`timer/cancelled/`)
//! holds one entry, c's cancel. Only the three live slots' chains are
//! walked by verify (4 entries); the stale slot of a and b is not followed.

mod common;

use common::*;

/// Runs one subcommand on a fresh healthy fixture's output and compares.
fn check(h: &Healthy, args: &[&str], expected: &str) {
    let out = dump(h.path(), args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    let got = stdout(&out).replace(h.path().to_str().unwrap(), "<DIR>");
    assert_eq!(got, expected, "wheel-dump DIR {}", args.join(" "));
}

#[test]
fn every_subcommand_prints_what_the_fixture_holds() {
    let h = healthy();
    assert_eq!([h.a, h.b, h.c, h.d, h.e, h.m], [32, 94, 149, 240, 295, 350], "the fixture's layout");
    check(&h, &["summary", "--now", "1700000011000"], SUMMARY_TEXT);
    check(&h, &["summary", "--now", "1700000011000", "--json"], SUMMARY_JSON);
    check(&h, &["slots"], SLOTS_TEXT);
    check(&h, &["slots", "--json"], SLOTS_JSON);
    check(&h, &["slot", "1700000005"], SLOT_TEXT);
    check(&h, &["slot", "1700000005", "--json"], SLOT_JSON);
    check(&h, &["log"], LOG_TEXT);
    check(&h, &["log", "--json"], LOG_JSON);
    check(&h, &["log", "--far"], FAR_LOG_TEXT);
    check(&h, &["log", "--far", "--json"], FAR_LOG_JSON);
    check(&h, &["checkpoint"], CHECKPOINT_TEXT);
    check(&h, &["checkpoint", "--json"], CHECKPOINT_JSON);
    check(&h, &["verify"], VERIFY_TEXT);
    check(&h, &["verify", "--json"], VERIFY_JSON);
    check(&h, &["audit"], AUDIT_TEXT);
    check(&h, &["audit", "--json"], AUDIT_JSON);
}

const SUMMARY_TEXT: &str = r#"store <DIR>

files
  path                                            bytes  version
  LOCK                                                0        -
  checkpoint                                      1,024        -
  commitlog/00000000000000000000                 65,536        3
  commitlog/relocated/index                          32        1
  consumequeue/Orders/0/00000000000000000000      2,080        1
  timer/wheel                                 2,426,912        1
  timer/tails                                 1,820,192        1
  timer/timerlog/00000000000000000000             1,824        1
  timer/timerlog-far/00000000000000000000         1,824        1
  timer/cancelled/00000000000000000000        1,835,040        1
  timer/segment_pending                              84        1

checkpoint
  field                      value  meaning
  clean                        yes  written by a clean close
  position                       0  byte position of the slot
  sequence                       2  the valid slot with the highest sequence is used
  log durable                  469  commit-log bytes below were on disk
  dispatched                   469  records below are in the indexes
  written at         1700000011000  2023-11-14T22:13:31.000Z
  tick second           1700000013  2023-11-14T22:13:33Z
  delivery scan                469  deliveries of pending timers lie at or after
  timer-log end                  6  near timer log (timerlog/) end at the wheel's progress
  far timer-log end              2  far timer log (timerlog-far/) end at the same; 0 = unknown

timer logs
  log                  chains of    files  first entry  end  entries
  timer/timerlog/      level 0          1            1    6        5
  timer/timerlog-far/  levels 1, 2      1            1    2        1

pending timers (live wheel slots, as of the checkpoint's tick second)
  level    slot covers  pending
  0                1 s        1
  1           32,768 s        1
  2      134,217,728 s        0
  total                       2

pending by due time, from 2023-11-14T22:13:31.000Z
  due within  pending
  5s                0
  1m                0
  5m                0
  1h                0
  1d                1
  beyond            1

next due  1700007200000  2023-11-15T00:13:20.000Z  (level 0)

consume queues
  topic   queue  entries  files
  Orders      0        3      1
"#;

const SUMMARY_JSON: &str = r#"{"schema_version":1,"dir":"<DIR>","files":[{"path":"LOCK","bytes":0,"version":null},{"path":"checkpoint","bytes":1024,"version":null},{"path":"commitlog/00000000000000000000","bytes":65536,"version":3},{"path":"commitlog/relocated/index","bytes":32,"version":1},{"path":"consumequeue/Orders/0/00000000000000000000","bytes":2080,"version":1},{"path":"timer/wheel","bytes":2426912,"version":1},{"path":"timer/tails","bytes":1820192,"version":1},{"path":"timer/timerlog/00000000000000000000","bytes":1824,"version":1},{"path":"timer/timerlog-far/00000000000000000000","bytes":1824,"version":1},{"path":"timer/cancelled/00000000000000000000","bytes":1835040,"version":1},{"path":"timer/segment_pending","bytes":84,"version":1}],"checkpoint":{"position":0,"sequence":2,"clean":true,"log_durable":469,"dispatched":469,"written_at_ms":1700000011000,"tick_second":1700000013,"delivery_scan_from":469,"timer_log_end":6,"far_timer_log_end":2},"resumes_at_checkpoint":true,"timer_logs":[{"dir":"timer/timerlog","levels":[0],"files":1,"first_entry":1,"end":6,"entries":5},{"dir":"timer/timerlog-far","levels":[1,2],"files":1,"first_entry":1,"end":2,"entries":1}],"pending_per_level":[1,1,0],"pending_total":2,"reference_ms":1700000011000,"pending_by_horizon":[["5s",0],["1m",0],["5m",0],["1h",0],["1d",1],["beyond",1]],"next_due":{"at_ms":1700007200000,"level":0,"exact":true},"consume_queues":[{"topic":"Orders","queue_id":0,"entries":3,"files":1}],"retention":{"oldest_segment":0,"oldest_retained_offset":32,"segments_deleted":false,"disk_bytes":{"commit_log":65536,"relocated":32,"consume_queues":2080,"timer_index":6085792},"relocation_records":null,"relocation_index_entries":0,"relocation_window_files":0}}
"#;

const SLOTS_TEXT: &str = r#"level   slot      window  start (epoch s)  start (UTC)           seconds  count  cancels  state
0      41605  1700000005       1700000005  2023-11-14T22:13:25Z        1      2        0  stale
0      41620  1700000020       1700000020  2023-11-14T22:13:40Z        1      2        1  live
0      48800  1700007200       1700007200  2023-11-15T00:13:20Z        1      1        0  live
1       2733       51885       1700167680  2023-11-16T20:48:00Z   32,768      1        0  live
4 non-empty slots, 3 live (live: not yet loaded at the checkpoint's tick second 1700000013, 2023-11-14T22:13:33Z)
"#;

const SLOTS_JSON: &str = r#"{"schema_version":1,"listing":"slots","tick_second":1700000013}
{"level":0,"slot":41605,"position":1331392,"window":1700000005,"start_second":1700000005,"start_utc":"2023-11-14T22:13:25Z","seconds":1,"count":2,"cancels":0,"live":false}
{"level":0,"slot":41620,"position":1331872,"window":1700000020,"start_second":1700000020,"start_utc":"2023-11-14T22:13:40Z","seconds":1,"count":2,"cancels":1,"live":true}
{"level":0,"slot":48800,"position":1561632,"window":1700007200,"start_second":1700007200,"start_utc":"2023-11-15T00:13:20Z","seconds":1,"count":1,"cancels":0,"live":true}
{"level":1,"slot":2733,"position":2186688,"window":51885,"start_second":1700167680,"start_utc":"2023-11-16T20:48:00Z","seconds":32768,"count":1,"cancels":0,"live":true}
"#;

const SLOT_TEXT: &str = r#"second 1700000005  2023-11-14T22:13:25Z
level  entry  kind   deliver at (ms)  deliver at (UTC)          message offset  topic   delay level  state
0          1  timer    1700000005000  2023-11-14T22:13:25.000Z              32  Orders            0  delivered
0          2  timer    1700000005000  2023-11-14T22:13:25.000Z              94  Orders            2  delivered
2 entries
"#;

const SLOT_JSON: &str = r#"{"schema_version":1,"listing":"slot","tick_second":1700000013}
{"level":0,"entry":1,"kind":"timer","deliver_at_ms":1700000005000,"deliver_at_utc":"2023-11-14T22:13:25.000Z","message_offset":32,"topic":"Orders","delay_level":0,"state":"delivered"}
{"level":0,"entry":2,"kind":"timer","deliver_at_ms":1700000005000,"deliver_at_utc":"2023-11-14T22:13:25.000Z","message_offset":94,"topic":"Orders","delay_level":2,"state":"delivered"}
"#;

const LOG_TEXT: &str = r#"     index  kind      message offset  deliver at (ms)  deliver at (UTC)                prev
         1  timer                 32    1700000005000  2023-11-14T22:13:25.000Z           0
         2  timer                 94    1700000005000  2023-11-14T22:13:25.000Z           1
         3  timer                149    1700000020000  2023-11-14T22:13:40.000Z           0
         4  cancel               149    1700000020000  2023-11-14T22:13:40.000Z           3
         5  timer                240    1700007200000  2023-11-15T00:13:20.000Z           0
end of the timer log at index 6
"#;

const LOG_JSON: &str = r#"{"schema_version":1,"listing":"log","from":1}
{"index":1,"kind":"timer","message_offset":32,"deliver_at_ms":1700000005000,"deliver_at_utc":"2023-11-14T22:13:25.000Z","prev":0}
{"index":2,"kind":"timer","message_offset":94,"deliver_at_ms":1700000005000,"deliver_at_utc":"2023-11-14T22:13:25.000Z","prev":1}
{"index":3,"kind":"timer","message_offset":149,"deliver_at_ms":1700000020000,"deliver_at_utc":"2023-11-14T22:13:40.000Z","prev":0}
{"index":4,"kind":"cancel","message_offset":149,"deliver_at_ms":1700000020000,"deliver_at_utc":"2023-11-14T22:13:40.000Z","prev":3}
{"index":5,"kind":"timer","message_offset":240,"deliver_at_ms":1700007200000,"deliver_at_utc":"2023-11-15T00:13:20.000Z","prev":0}
"#;

const FAR_LOG_JSON: &str = r#"{"schema_version":1,"listing":"far-log","from":1}
{"index":1,"kind":"timer","message_offset":295,"deliver_at_ms":1700172800000,"deliver_at_utc":"2023-11-16T22:13:20.000Z","prev":0}
"#;

const FAR_LOG_TEXT: &str = r#"     index  kind      message offset  deliver at (ms)  deliver at (UTC)                prev
         1  timer                295    1700172800000  2023-11-16T22:13:20.000Z           0
end of the far timer log (timer/timerlog-far/) at index 2
"#;

const CHECKPOINT_TEXT: &str = r#"checkpoint  1,024 bytes

slot at 0: valid  (trusted: the one a store uses)
  field                      value  meaning
  clean                        yes  written by a clean close
  position                       0  byte position of the slot
  sequence                       2  the valid slot with the highest sequence is used
  log durable                  469  commit-log bytes below were on disk
  dispatched                   469  records below are in the indexes
  written at         1700000011000  2023-11-14T22:13:31.000Z
  tick second           1700000013  2023-11-14T22:13:33Z
  delivery scan                469  deliveries of pending timers lie at or after
  timer-log end                  6  near timer log (timerlog/) end at the wheel's progress
  far timer-log end              2  far timer log (timerlog-far/) end at the same; 0 = unknown

slot at 512: valid
  field                      value  meaning
  clean                         no  not a clean close: recovery replays
  position                     512  byte position of the slot
  sequence                       1  the valid slot with the highest sequence is used
  log durable                   32  commit-log bytes below were on disk
  dispatched                    32  records below are in the indexes
  written at         1700000000000  2023-11-14T22:13:20.000Z
  tick second           1700000000  2023-11-14T22:13:20Z
  delivery scan                 32  deliveries of pending timers lie at or after
  timer-log end                  1  near timer log (timerlog/) end at the wheel's progress
  far timer-log end              1  far timer log (timerlog-far/) end at the same; 0 = unknown
"#;

const CHECKPOINT_JSON: &str = r#"{"schema_version":1,"path":"checkpoint","exists":true,"bytes":1024,"slots":[{"position":0,"state":"valid","problem":null,"checkpoint":{"position":0,"sequence":2,"clean":true,"log_durable":469,"dispatched":469,"written_at_ms":1700000011000,"tick_second":1700000013,"delivery_scan_from":469,"timer_log_end":6,"far_timer_log_end":2}},{"position":512,"state":"valid","problem":null,"checkpoint":{"position":512,"sequence":1,"clean":false,"log_durable":32,"dispatched":32,"written_at_ms":1700000000000,"tick_second":1700000000,"delivery_scan_from":32,"timer_log_end":1,"far_timer_log_end":1}}],"newest":0,"trusted":0}
"#;

const VERIFY_TEXT: &str = r#"ok: every checksum and cross-reference checked
  checked                                count
  checkpoint slots                           2
  file headers                              11
  commit-log records                         9
    messages                                 6
    of which timed                           5
    deliveries (timers)                      2
      runs (deliveries records)              0
    cancels                                  1
  timer-log entries                          6
    near (timerlog/)                         5
    far (timerlog-far/)                      1
  cancel-ledger entries                      1
  wheel slots                           75,840
    non-empty                                4
    live, chains walked                      3
    chain entries                            4
  chain starts (timer/tails)                 3
    unknown (no record for the window)       0
  consume queues                             1
    entries                                  3
  key-index entries (index/keys/)            1
  dedup-index entries (index/dedup/)         0
  topics counted (index/topic_pending)       1
  positions (consumer_offsets.json)          0
  the commit log ends at offset 469
"#;

const VERIFY_JSON: &str = r#"{"schema_version":1,"ok":true,"checked":{"checkpoint_slots":2,"file_headers":11,"records":9,"messages":6,"timed_messages":5,"deliveries":2,"cancels":1,"log_end":469,"torn_tail":null,"timer_log_entries":6,"near_timer_log_entries":5,"far_timer_log_entries":1,"timer_log_first_entries":[1,1],"cancel_ledger_entries":1,"cancel_ledger_deleted":0,"cancel_ledger_first_entry":1,"wheel_slots":75840,"non_empty_slots":4,"chains_walked":3,"chain_entries":4,"chains_gone_stale":0,"chain_starts":3,"chain_starts_unknown":0,"consume_queues":1,"queue_entries":3,"key_index_entries":1,"dedup_index_entries":0,"topic_pending_topics":1,"consumer_offsets":0,"past_log_end":0,"oldest_segment":0,"relocation_records":0,"relocation_index_entries":0,"relocation_unfinished":0,"relocation_torn":0,"relocation_window_files":0,"relocated_copies":0,"relocated_timers":0,"relocated_cancels":0,"relocated_window_deleted":0,"named_relocated":0,"named_deleted":0,"queue_entries_deleted":0,"segment_counts":1,"snapshot_pins":null},"problem":null}
"#;

const AUDIT_TEXT: &str = r#"timed messages              count
timer messages                  5
delivered                       2
cancelled                       1
pending                         2
  of which awaiting replay      0
lost                            0
duplicated                      0
early                           0
unsettled, not overdue          0
reference time 2023-11-14T22:13:31.000Z (the latest time in the commit log); lost = due over 60 s before it

audit ok
"#;

const AUDIT_JSON: &str = r#"{"schema_version":1,"timer_messages":5,"delivered":2,"cancelled":1,"pending":2,"lost":0,"duplicated":0,"early":0,"reclaimed":0,"unreadable_log_stretches":0,"unreadable_log_bytes":0,"rescheduled":0,"fired_after_reschedule":0,"schedules":0,"occurrences_delivered":0,"occurrences_duplicated":0,"occurrences_early":0,"occurrences_missing":0}
"#;
