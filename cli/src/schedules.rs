//! `delaywheel schedules`: the active recurring schedules of a store on
//! disk, read-only (the reading is `wheel-dump`'s, as `pending`'s is).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use wheel_dump::schedules::{ScheduleEntry, list};
use wheel_dump::store_files::StoreFiles;

use crate::Failure;

#[derive(Args, Debug)]
pub struct SchedulesArgs {
    /// The store directory.
    #[arg(long)]
    dir: PathBuf,
    /// Only this topic's schedules.
    #[arg(long)]
    topic: Option<String>,
    /// One JSON object per line, one line per schedule.
    #[arg(long)]
    json: bool,
}

pub fn run(args: SchedulesArgs) -> Result<(), Failure> {
    let files = StoreFiles::locate(&args.dir)?;
    let schedules = list(&files, args.topic.as_deref())?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = if args.json { write_json(&mut out, &schedules) } else { write_text(&mut out, &schedules) };
    match written.and_then(|()| out.flush()) {
        // A reader that stopped reading (`| head`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn write_json(out: &mut impl Write, schedules: &[ScheduleEntry]) -> std::io::Result<()> {
    for schedule in schedules {
        serde_json::to_writer(&mut *out, schedule)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

fn write_text(out: &mut impl Write, schedules: &[ScheduleEntry]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24}  {:<20} {:<24} {:<20} {:>8}  handle",
        "next (UTC)", "topic", "recurrence", "time zone", "fired"
    )?;
    for s in schedules {
        let next = match (&s.next_at_utc, s.paused) {
            (_, true) => "paused",
            (Some(at), false) => at.as_str(),
            (None, false) => "-",
        };
        let recurrence = s.problem.as_ref().map_or(s.recurrence.as_str(), |_| "(spec does not read)");
        writeln!(
            out,
            "{next:<24}  {:<20} {recurrence:<24} {:<20} {:>8}  {}",
            s.topic,
            s.time_zone.as_deref().unwrap_or("-"),
            s.fired,
            s.handle
        )?;
    }
    writeln!(out, "{} active schedules", schedules.len())
}
