//! `wheel-dump`: read-only inspection, verification and audit of a delaywheel
//! store directory. Contract: `../shared/design.md` §6; formats: `wheel-format.md`.
//!
//! It reads with plain positioned reads (no maps, no `LOCK`), never creates,
//! changes or removes a file, and may run beside a live store.
//!
//! Exit codes: 0 done (verify: no problem; audit: nothing lost, duplicated
//! or early); 1 a problem found, or the directory is not a readable store;
//! 2 bad arguments (one line on stderr).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde::Serialize;

use wheel_dump::error::{DumpError, Result};
use wheel_dump::listing::Format;
use wheel_dump::output::{SCHEMA_VERSION, json_line};
use wheel_dump::store_files::StoreFiles;
use wheel_dump::{audit, listing, output, summary, verify};

#[derive(Parser)]
#[command(
    name = "wheel-dump",
    version,
    about = "Inspect, verify and audit a delaywheel store directory, read-only",
    after_help = "JSON: every subcommand prints one document with \"schema_version\": 1; slots, slot and \
                  log print JSON lines (a first line {\"schema_version\":1,\"listing\":...}, then one \
                  object per item).\nExit codes: 0 ok; 1 a problem found (verify, audit) or not a \
                  readable store; 2 bad arguments."
)]
struct Cli {
    /// The store directory.
    dir: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Files, sizes and versions, the checkpoint, pending timers per level and due time, queues (the default).
    Summary {
        /// Reference time of the due-time buckets, epoch ms (default: now).
        #[arg(long, value_name = "EPOCH_MS")]
        now: Option<u64>,
    },
    /// The non-empty wheel slots with their counts, optionally those overlapping [--from, --to].
    Slots {
        /// Epoch second: slots whose window ends before it are left out.
        #[arg(long, value_name = "T")]
        from: Option<u64>,
        /// Epoch second: slots whose window starts after it are left out.
        #[arg(long, value_name = "T")]
        to: Option<u64>,
    },
    /// Every timer of epoch second T, on any level, with its topic and state.
    Slot {
        /// Epoch second.
        #[arg(value_name = "T")]
        second: u64,
    },
    /// Timer-log entries in order: the near log (`timer/timerlog/`, level-0 chains), or with
    /// --far the far log (`timer/timerlog-far/`, level-1 and level-2 chains).
    Log {
        /// First entry index to print (index 0 is never used; entries in deleted files are not there).
        #[arg(long, value_name = "POS", default_value_t = 1)]
        from: u64,
        /// List the far timer log instead of the near one.
        #[arg(long)]
        far: bool,
    },
    /// Both checkpoint slots, every field, and which one a store would use.
    Checkpoint,
    /// Every checksum and cross-reference; exit 1 naming the first problem by file and offset.
    Verify,
    /// Delivered, cancelled, pending or lost for every timed message (relocated ones included;
    /// reclaimed: fired, its delivery record deleted by retention); exit 1 if any is lost,
    /// duplicated or early. Lost: due over 60 s before the latest time in the commit log.
    Audit,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // One line, as the command-line contract asks; clap's usage errors are exit 2.
            let first = e.to_string().lines().next().unwrap_or("bad arguments").to_string();
            eprintln!("{first}");
            return ExitCode::from(2);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    match run(cli) {
        Ok(code) => code,
        // A reader that stopped reading (`| head`) is not an error.
        Err(DumpError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wheel-dump: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let files = StoreFiles::locate(&cli.dir)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let format = if cli.json { Format::JsonLines } else { Format::Text };
    let code = match cli.command.unwrap_or(Command::Summary { now: None }) {
        Command::Summary { now } => {
            let summary = summary::Summary::gather(&files, now.unwrap_or_else(now_ms))?;
            if cli.json {
                json_line(&mut out, &summary)?
            } else {
                write!(out, "{}", summary.render())?
            }
            ExitCode::SUCCESS
        }
        Command::Slots { from, to } => {
            listing::slots(&files, from, to, format, &mut out).map(|()| ExitCode::SUCCESS)?
        }
        Command::Slot { second } => {
            listing::slot(&files, second, format, &mut out).map(|()| ExitCode::SUCCESS)?
        }
        Command::Log { from, far } => {
            listing::log(&files, from, far, format, &mut out).map(|()| ExitCode::SUCCESS)?
        }
        Command::Checkpoint => listing::checkpoint(&files, cli.json, &mut out).map(|()| ExitCode::SUCCESS)?,
        Command::Verify => report_verify(&files, cli.json, &mut out)?,
        Command::Audit => {
            let audit = audit::audit(&files)?;
            if cli.json {
                json_line(&mut out, &audit.counts)?
            } else {
                write!(out, "{}", audit.render())?
            }
            if audit.counts.failed() { ExitCode::from(1) } else { ExitCode::SUCCESS }
        }
    };
    out.flush()?;
    Ok(code)
}

/// Prints what `verify` found: the counts, or the first problem (exit 1).
fn report_verify(files: &StoreFiles, json: bool, out: &mut impl Write) -> Result<ExitCode> {
    #[derive(Serialize)]
    struct Problem {
        file: String,
        offset: u64,
        error: String,
    }
    #[derive(Serialize)]
    struct Report {
        schema_version: u32,
        ok: bool,
        checked: Option<verify::Checked>,
        problem: Option<Problem>,
    }
    let (checked, problem) = match verify::verify(files) {
        Ok(checked) => (Some(checked), None),
        // Only what a store's bytes can be blamed for is a finding; failing to read is an error.
        Err(e @ (DumpError::Corruption { .. } | DumpError::UnsupportedVersion { .. })) => {
            let (file, offset) = e.location().expect("a corruption names its place");
            (None, Some(Problem { file: file.display().to_string(), offset, error: e.to_string() }))
        }
        Err(e) => return Err(e),
    };
    let ok = problem.is_none();
    if json {
        json_line(out, &Report { schema_version: SCHEMA_VERSION, ok, checked, problem })?;
    } else if let Some(p) = problem {
        writeln!(out, "PROBLEM in {} at offset {}\n  {}", p.file, p.offset, p.error)?;
    } else if let Some(c) = checked {
        write!(out, "{}", render_checked(&c))?;
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn render_checked(c: &verify::Checked) -> String {
    use wheel_dump::output::thousands as n;
    let mut out = String::from("ok: every checksum and cross-reference checked\n");
    if !c.needs_recovery.is_empty() || c.timer_log_torn_at.is_some() {
        out.push_str("not closed cleanly: what the crash left needs the normal recovery (no damage):\n");
    }
    for what in &c.needs_recovery {
        out.push_str(&format!("  - {what}\n"));
    }
    if let Some(torn) = c.timer_log_torn_at {
        for (name, at) in ["timerlog/", "timerlog-far/"].iter().zip(torn) {
            if let Some(at) = at {
                out.push_str(&format!("  - {name} ends torn at entry {at}, past what the checkpoint vouches for: the next open cuts it\n"));
            }
        }
    }
    let mut t = output::Table::new(&["checked", ">count"]);
    for (what, count) in [
        ("checkpoint slots", c.checkpoint_slots),
        ("file headers", c.file_headers),
        ("commit-log records", c.records),
        ("  messages", c.messages),
        ("  of which timed", c.timed_messages),
        ("  deliveries (timers)", c.deliveries),
        ("    runs (deliveries records)", c.delivery_runs),
        ("  cancels", c.cancels),
        ("  skipped (damaged, left by lenient recovery)", c.skipped_records),
        ("timer-log entries", c.timer_log_entries),
        ("  near (timerlog/)", c.near_timer_log_entries),
        ("  far (timerlog-far/)", c.far_timer_log_entries),
        ("cancel-ledger entries", c.cancel_ledger_entries),
        ("wheel slots", c.wheel_slots),
        ("  non-empty", c.non_empty_slots),
        ("  live, chains walked", c.chains_walked),
        ("  chain entries", c.chain_entries),
        ("chain starts (timer/tails)", c.chain_starts),
        ("  unknown (no record for the window)", c.chain_starts_unknown),
        ("  torn by the crash (reset at the next open)", c.chain_starts_torn),
        ("consume queues", c.consume_queues),
        ("  entries", c.queue_entries),
        ("key-index entries (index/keys/)", c.key_index_entries),
        ("dedup-index entries (index/dedup/)", c.dedup_index_entries),
        ("topics counted (index/topic_pending)", c.topic_pending_topics),
        ("positions (consumer_offsets.json)", c.consumer_offsets),
    ] {
        // Skipped records exist only where lenient recovery met damage, torn
        // chain starts only after a crash.
        if (what.starts_with("  skipped") || what.starts_with("  torn")) && count == 0 {
            continue;
        }
        t.row(vec![what.into(), n(count)]);
    }
    let retention = c.oldest_segment > 0
        || c.relocation_index_entries > 0
        || c.relocation_window_files > 0
        || c.relocation_records > 0;
    if retention {
        for (what, count) in [
            ("relocation records in the log", c.relocation_records),
            ("relocation index entries", c.relocation_index_entries),
            ("  copies read and checked", c.relocated_copies),
            ("    timers", c.relocated_timers),
            ("    cancels", c.relocated_cancels),
            ("  window file deleted (window passed)", c.relocated_window_deleted),
            ("  unfinished pass (at or after the oldest segment)", c.relocation_unfinished),
            ("  torn at the tail (pass cut short)", c.relocation_torn),
            ("relocation window files", c.relocation_window_files),
            ("references to relocated copies (*)", c.named_relocated),
            ("references to deleted records (*)", c.named_deleted),
            ("cancel-ledger entries of deleted cancels", c.cancel_ledger_deleted),
            ("queue entries of deleted records", c.queue_entries_deleted),
        ] {
            t.row(vec![what.into(), n(count)]);
        }
    }
    out += &t.render(2);
    if retention {
        out += &format!(
            "  retention deleted the records below log offset {} (the oldest segment)\n  \
             (*) by delivery and cancel records and timer-log entries\n",
            c.oldest_segment
        );
    }
    for (name, first) in ["timerlog/", "timerlog-far/"].iter().zip(c.timer_log_first_entries) {
        if let Some(first) = first.filter(|&first| first > 1) {
            out += &format!(
                "  timer/{name} starts at entry {first}: the store deleted the files below (no live chain reached them)\n"
            );
        }
    }
    if let Some(first) = c.cancel_ledger_first_entry.filter(|&first| first > 1) {
        out += &format!(
            "  timer/{}/ starts at entry {first}: the store deleted the files below (no handle can ask about their cancels)\n",
            delaywheel::internals::layout::CANCEL_LEDGER_DIR
        );
    }
    if c.chains_gone_stale > 0 {
        out += &format!(
            "  {} live chains reach deleted timer-log files, but a newer checkpoint made their slots stale (a live store)\n",
            c.chains_gone_stale
        );
    }
    out += &format!("  the commit log ends at offset {}\n", c.log_end);
    if let Some(torn) = &c.torn_tail {
        out += &format!("  torn tail (past the checkpoint's log durable, not damage) {torn}\n");
    }
    if c.past_log_end > 0 {
        out += &format!(
            "  {} index entries name records past the log end read (a live store appending)\n",
            c.past_log_end
        );
    }
    out
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
