//! Timers no partition reads. On a delay stream made by hand or by an older
//! node (`delay.>`), a producer can publish to `delay.99.x` with 8
//! partitions, to `delay.x` or to `delay.07.x`: no partition's consumer
//! (`delay.<p>.>`) matches those, so no node would ever fire them or even
//! see them. While a node owns partition 0 of such a stream, it looks for
//! these subjects every few seconds and moves their timers to
//! `<dead_letter>.unowned`. (A stream made by a node captures only the
//! partitions' subjects, and refuses such timers when they are published.)
//! A tier of several delay streams takes only streams that capture exactly
//! their partitions' subjects (see `node.rs`), so it has no strays.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::stream::DirectGetErrorKind;
use futures::{StreamExt, TryStreamExt};

use crate::error::bounded;
use crate::partition::{Shared, dead_letter, remove_source};
use crate::{Result, TierError};

/// How often the owner of a stream's first partition looks for timers no partition reads.
const STRAYS_EVERY: Duration = Duration::from_secs(5);
/// Subjects looked at per round, at most (a producer may give every timer
/// a subject of its own: the listing is then as long as the stream).
const MAX_SUBJECTS: usize = 100_000;
/// Stray subjects emptied per round, at most.
const MAX_STRAYS: usize = 1_000;
/// The time limit of one listing of the stream's subjects.
const LISTING_TIMEOUT: Duration = Duration::from_secs(10);

/// Looks for stray timers in delay stream `index` every few seconds while the task runs.
pub(crate) async fn sweep(shared: Arc<Shared>, index: u32) {
    loop {
        tokio::time::sleep(STRAYS_EVERY).await;
        if let Err(err) = sweep_once(&shared, index).await {
            tracing::warn!(%err, "looking for timers no partition reads failed; again later");
        }
    }
}

async fn sweep_once(shared: &Shared, index: u32) -> Result<()> {
    let layout = &shared.layout;
    let filter = format!("{}.>", layout.prefix);
    let listing = async {
        let subjects = shared.streams[index as usize].stream.info_with_subjects(&filter).await?;
        let strays: Vec<String> = subjects
            .take(MAX_SUBJECTS)
            .map_ok(|(subject, _)| subject)
            .try_filter(|s| std::future::ready(!layout.read_in_stream(index, s)))
            .take(MAX_STRAYS)
            .try_collect()
            .await?;
        Ok::<_, async_nats::Error>(strays)
    };
    let strays = bounded(LISTING_TIMEOUT, || format!("list the subjects of {filter}"), listing).await?;
    for subject in strays {
        bury_subject(shared, index, &subject).await?;
    }
    Ok(())
}

/// Moves every timer on a subject no partition reads to the dead letter.
async fn bury_subject(shared: &Shared, index: u32, subject: &str) -> Result<()> {
    let layout = &shared.layout;
    let stream = &shared.streams[index as usize].stream;
    loop {
        let message = match stream.direct_get_first_for_subject(subject).await {
            Ok(message) => message,
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => return Ok(()),
            Err(err) => return Err(TierError::nats(format!("read the first timer on {subject}"), err)),
        };
        let sequence = message.sequence;
        let reason = format!(
            "no partition reads {subject:?} in stream {}: the tier's {} partitions read {}.<0..{}>.>",
            shared.streams[index as usize].name,
            layout.partitions,
            layout.prefix,
            layout.partitions - 1
        );
        metrics::counter!("delaytier_unowned_total").increment(1);
        let source: Vec<(&str, &str)> = message
            .headers
            .iter()
            .flat_map(|(name, values)| values.iter().map(move |v| (name.as_ref(), v.as_str())))
            .collect();
        let from = (shared.streams[index as usize].name.as_str(), None);
        dead_letter(shared, from, sequence, &source, message.payload.clone(), "unowned", &reason).await?;
        remove_source(stream, sequence).await?;
    }
}
