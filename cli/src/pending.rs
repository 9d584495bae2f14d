//! `delaywheel pending`: the pending timers of a store on disk due in
//! `[--from, --to)`, read-only (the reading is `wheel-dump`'s, so it may run
//! beside a live store and never changes a file).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use wheel_dump::pending::{Filter, PendingTimer, list};
use wheel_dump::store_files::StoreFiles;

use crate::Failure;

#[derive(Args, Debug)]
pub struct PendingArgs {
    /// The store directory.
    #[arg(long)]
    dir: PathBuf,
    /// Epoch ms: the first deliver time listed.
    #[arg(long, value_name = "MS")]
    from: u64,
    /// Epoch ms: deliver times before this are listed.
    #[arg(long, value_name = "MS")]
    to: u64,
    /// Only this topic's timers.
    #[arg(long)]
    topic: Option<String>,
    /// Only the timers of messages with this key.
    #[arg(long)]
    key: Option<String>,
    /// One JSON object per line, one line per timer.
    #[arg(long)]
    json: bool,
}

pub fn run(args: PendingArgs) -> Result<(), Failure> {
    if args.from >= args.to {
        return Err(Failure::Usage(format!("--from {} is not before --to {}", args.from, args.to)));
    }
    let files = StoreFiles::locate(&args.dir)?;
    let filter = Filter { topic: args.topic, key: args.key };
    let timers = list(&files, args.from..args.to, &filter)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = if args.json { write_json(&mut out, &timers) } else { write_text(&mut out, &timers) };
    match written.and_then(|()| out.flush()) {
        // A reader that stopped reading (`| head`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn write_json(out: &mut impl Write, timers: &[PendingTimer]) -> std::io::Result<()> {
    for timer in timers {
        serde_json::to_writer(&mut *out, timer)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

fn write_text(out: &mut impl Write, timers: &[PendingTimer]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24}  {:<20} {:>5}  {:<24} {:>5}  handle",
        "deliver at (UTC)", "topic", "queue", "key", "level"
    )?;
    for t in timers {
        let level = t.level.map_or("-".to_string(), |l| l.to_string());
        let key = t.key.as_deref().unwrap_or("-");
        writeln!(
            out,
            "{:<24}  {:<20} {:>5}  {:<24} {:>5}  {}",
            t.deliver_at_utc, t.topic, t.queue, key, level, t.handle
        )?;
    }
    writeln!(out, "{} pending", timers.len())
}
