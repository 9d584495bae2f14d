//! Recovery: one contract, [`recover`]. The commit log is recovered first (it
//! is the truth: its end is found, a torn tail cut), then every index is told
//! where it resumes: at the checkpoint if all of them are there, otherwise
//! from the oldest segment. The wheel's side is `timer::wheel::restart`; the consume
//! queues cut themselves back to the checkpoint when they open, and the
//! dispatcher's replay from there rebuilds the rest.

use std::sync::Arc;

use crate::checkpoint::CheckpointFile;
use crate::commitlog::{
    CommitLog, RecoveryPlan, RecoveryReport, files_end, leads_to, restore_short_segments,
};
use crate::config::{Config, RecoveryMode};
use crate::error::Result;
use crate::format::checkpoint;
use crate::format::layout::Layout;
use crate::timer::wheel::restart::{RestartPlan, Restarted, restart_wheel};

/// What recovery hands the store before its threads start.
pub(crate) struct Recovered {
    pub log: Arc<CommitLog>,
    pub report: RecoveryReport,
    pub checkpoint: CheckpointFile,
    /// The wheel, and where the dispatcher's replay starts.
    pub timers: Restarted,
}

/// The checkpoint file, trusting the slot [`checkpoint::trusted`] picks: the
/// newest the store can have written. A slot passed over is a damaged
/// checkpoint: logged, and the previous slot, or a replay of the whole log,
/// is used.
fn open_checkpoint(config: &Config, layout: &Layout) -> Result<CheckpointFile> {
    let (dir, size, path) = (layout.commit_log(), config.segment_size, layout.checkpoint());
    let mut file = CheckpointFile::open(&path)?;
    let trusted = checkpoint::trusted(
        file.slots(),
        (files_end(&dir, size)?, size),
        |from, to| leads_to(&dir, size, from, to, config.recovery_mode),
        |cp, why| {
            tracing::error!(file = %path.display(), sequence = cp.sequence, dispatched = cp.dispatched, why,
                "a checkpoint slot the store cannot have written: not trusted")
        },
    )?;
    file.trust(trusted);
    Ok(file)
}

/// Recovers the commit log and decides where the indexes resume.
pub(crate) fn recover(config: &Config, layout: &Layout) -> Result<Recovered> {
    let restored = match config.recovery_mode {
        RecoveryMode::Lenient => restore_short_segments(&layout.commit_log(), config.segment_size)?,
        RecoveryMode::Strict => Vec::new(),
    };
    let checkpoint = open_checkpoint(config, layout)?;
    let last = checkpoint.last();
    let resume_at = layout.resume_point(last);
    let plan = RecoveryPlan {
        start: resume_at.map(|cp| cp.dispatched),
        durable: last.map_or(0, |cp| cp.log_durable),
        clean_end: last.filter(|cp| cp.clean).map(|cp| cp.log_durable),
        mode: config.recovery_mode,
    };
    let (log, mut report) =
        CommitLog::open(&layout.commit_log(), config.segment_size, config.disk_reserve(), &plan)?;
    report.restored_segments = restored;
    report.trusted_checkpoint = last.map(|cp| cp.sequence);
    let log = Arc::new(log);
    // Records the recovery validated may still be only in the page cache.
    log.flush()?;
    let timers = restart_wheel(RestartPlan {
        log: &log,
        dir: &layout.timer(),
        entries_per_log_file: config.timer_log_file_entries,
        now_ms: config.clock.now_ms(),
        resume_at,
        last,
        replay_from: plan.start.unwrap_or(0).clamp(log.start(), log.write_end()),
    })?;
    Ok(Recovered { log, report, checkpoint, timers })
}
