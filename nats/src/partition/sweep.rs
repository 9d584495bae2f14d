//! The sweep: fired timers whose acknowledgement was lost, found and
//! removed from the stream.

use std::time::{Duration, Instant};

use async_nats::jetstream::stream::DirectGetErrorKind;
use futures::StreamExt;

use super::{Part, remove_source};

/// How often the sweep looks for fired timers still in the stream.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// A fired timer's acknowledgement has surely been applied after this.
const ACK_SETTLES: Duration = Duration::from_secs(5);
/// How long the consumer's count must keep saying that no acknowledgement
/// was lost before the sweep forgets a fired timer unchecked.
const COUNT_VOUCHES: Duration = Duration::from_secs(20);

impl Part {
    /// Deletes fired timers whose acknowledgement was lost.
    ///
    /// The server confirms an acknowledgement before its consumer's replicas
    /// have it: when the consumer's leader dies then, the new leader still
    /// counts the timer as handed out and unacknowledged, so the stream keeps
    /// it, and the partition's next owner would fire it again (outside the
    /// duplicate window, if that is later than two minutes). Seen here with
    /// `kill -9` of a NATS server: 97 of 4,000 fired timers left behind.
    /// Every few seconds the sweep compares the consumer's unacknowledged
    /// count with what this node holds; if the consumer has more, it looks up
    /// the timers fired lately and deletes those still in the stream.
    pub(super) async fn sweep(self) {
        let name = super::consumer_name(self.partition);
        loop {
            tokio::time::sleep(SWEEP_EVERY).await;
            let (settled, held) = {
                let mut index = self.pending.lock().expect("index lock");
                let cut = index.fired.partition_point(|(at, _)| at.elapsed() >= ACK_SETTLES);
                let settled: Vec<(Instant, u64)> = index.fired.drain(..cut).collect();
                (settled, index.timers.len() - index.unconfirmed + index.left.len())
            };
            if settled.is_empty() {
                continue;
            }
            match self.delay_stream().stream.consumer_info(&name).await {
                Ok(info) if info.num_ack_pending <= held => {
                    // The count says no acknowledgement was lost. Right after
                    // the consumer's leader changed it can say so before it
                    // counts what the old leader lost (seen: 2 of 4,000 left
                    // after a kill -9), so a fired timer is forgotten only
                    // once the count has vouched for it over COUNT_VOUCHES.
                    let recent = settled.iter().filter(|(at, _)| at.elapsed() < ACK_SETTLES + COUNT_VOUCHES);
                    let mut index = self.pending.lock().expect("index lock");
                    for &kept in recent.rev() {
                        index.fired.push_front(kept);
                    }
                    continue;
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(%err, "sweep: cannot read the consumer; checking the fired timers");
                }
            }
            let stream = &self.delay_stream().stream;
            // Some(sequence): it could not be checked now; look again next round.
            let checks: Vec<(usize, Option<u64>)> =
                futures::stream::iter(settled.into_iter().map(|(_, s)| s))
                    .map(|sequence| async move {
                        match stream.direct_get(sequence).await {
                            Ok(_) => match remove_source(stream, sequence).await {
                                Ok(deleted) => (deleted as usize, None),
                                Err(_) => (0, Some(sequence)),
                            },
                            Err(err) if err.kind() == DirectGetErrorKind::NotFound => (0, None),
                            Err(_) => (0, Some(sequence)),
                        }
                    })
                    .buffer_unordered(64)
                    .collect()
                    .await;
            let left: usize = checks.iter().map(|(n, _)| n).sum();
            let again = checks.iter().filter_map(|(_, s)| *s);
            let mut index = self.pending.lock().expect("index lock");
            for sequence in again {
                index.fired.push_front((Instant::now() - ACK_SETTLES, sequence));
            }
            drop(index);
            if left > 0 {
                metrics::counter!("delaytier_lost_acks_total").increment(left as u64);
                tracing::warn!(left, "sweep: deleted fired timers whose acknowledgement was lost");
            }
        }
    }
}
