//! Timers no partition reads. On a delay stream made by hand or by an older
//! node (`delay.>`), a producer can publish to `delay.99.x` with 8
//! partitions, to `delay.x` or to `delay.07.x`: no partition's consumer
//! (`delay.<p>.>`) matches those, so no node would ever fire them or even
//! see them. While a node owns partition 0 on such a stream, it looks for
//! these subjects every few seconds and moves their timers to
//! `<dead_letter>.unowned`. (A stream made by a node captures only the
//! partitions' subjects, and refuses such timers when they are published.)

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::stream::DirectGetErrorKind;
use futures::{StreamExt, TryStreamExt};

use crate::error::bounded;
use crate::partition::{Shared, dead_letter, remove_source};
use crate::{Result, TierError};

/// How often the owner of partition 0 looks for timers no partition reads.
const STRAYS_EVERY: Duration = Duration::from_secs(5);
/// Subjects looked at per round, at most (a producer may give every timer
/// a subject of its own: the listing is then as long as the stream).
const MAX_SUBJECTS: usize = 100_000;
/// Stray subjects emptied per round, at most.
const MAX_STRAYS: usize = 1_000;
/// The time limit of one listing of the stream's subjects.
const LISTING_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a partition's consumer reads `subject`: `<prefix>.<p>.<more>` with
/// `p` written as the partition's filter writes it, below `partitions`.
pub(crate) fn read_by_a_partition(prefix: &str, partitions: u32, subject: &str) -> bool {
    let Some(rest) = subject.strip_prefix(prefix).and_then(|r| r.strip_prefix('.')) else {
        return false;
    };
    let Some((token, more)) = rest.split_once('.') else {
        return false; // `delay.7` is not under `delay.7.>`
    };
    !more.is_empty() && token.parse::<u32>().is_ok_and(|p| p < partitions && p.to_string() == token)
}

/// Looks for stray timers every few seconds while the task runs.
pub(crate) async fn sweep(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(STRAYS_EVERY).await;
        if let Err(err) = sweep_once(&shared).await {
            tracing::warn!(%err, "looking for timers no partition reads failed; again later");
        }
    }
}

async fn sweep_once(shared: &Shared) -> Result<()> {
    let config = &shared.config;
    let filter = format!("{}.>", config.prefix);
    let listing = async {
        let subjects = shared.stream.info_with_subjects(&filter).await?;
        let strays: Vec<String> = subjects
            .take(MAX_SUBJECTS)
            .map_ok(|(subject, _)| subject)
            .try_filter(|s| std::future::ready(!read_by_a_partition(&config.prefix, config.partitions, s)))
            .take(MAX_STRAYS)
            .try_collect()
            .await?;
        Ok::<_, async_nats::Error>(strays)
    };
    let strays = bounded(LISTING_TIMEOUT, || format!("list the subjects of {filter}"), listing).await?;
    for subject in strays {
        bury_subject(shared, &subject).await?;
    }
    Ok(())
}

/// Moves every timer on a subject no partition reads to the dead letter.
async fn bury_subject(shared: &Shared, subject: &str) -> Result<()> {
    let config = &shared.config;
    loop {
        let message = match shared.stream.direct_get_first_for_subject(subject).await {
            Ok(message) => message,
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => return Ok(()),
            Err(err) => return Err(TierError::nats(format!("read the first timer on {subject}"), err)),
        };
        let sequence = message.sequence;
        let reason = format!(
            "no partition reads {subject:?}: the tier's {} partitions read {}.<0..{}>.>",
            config.partitions,
            config.prefix,
            config.partitions - 1
        );
        metrics::counter!("delaytier_unowned_total").increment(1);
        let source: Vec<(&str, &str)> = message
            .headers
            .iter()
            .flat_map(|(name, values)| values.iter().map(move |v| (name.as_ref(), v.as_str())))
            .collect();
        dead_letter(shared, None, sequence, &source, message.payload.clone(), "unowned", &reason).await?;
        remove_source(&shared.stream, sequence).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_partitions_own_subjects_are_read() {
        for read in ["delay.0.timer", "delay.7.a.b", "delay.3.x"] {
            assert!(read_by_a_partition("delay", 8, read), "{read}");
        }
        for stray in [
            "delay.8.timer",
            "delay.99.x",
            "delay.x.timer",
            "delay.07.timer",
            "delay.7",
            "delay.7.",
            "delay",
            "delayed.1.x",
            "delay.-1.x",
            "delay.+1.x",
        ] {
            assert!(!read_by_a_partition("delay", 8, stray), "{stray}");
        }
    }
}
