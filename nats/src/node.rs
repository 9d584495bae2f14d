//! A tier node: keeps its fair share of partition leases and runs an
//! [`OwnedPartition`](crate::partition) for each.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};

use crate::lease::{Leases, fair_share, preference};
use crate::partition::{Checkpoints, DelayStream, LeaseAtStop, OwnedPartition, Shared, remove_stale_stores};
use crate::settled_ids::SettledIds;
use crate::wire::Layout;
use crate::{Result, TierConfig, TierError};

/// The time limit of one request of a partition's (read, publish, acknowledge).
const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a starting node tries to make or find what it needs in
/// JetStream before it gives up.
const SET_UP_WITHIN: Duration = Duration::from_secs(60);

/// Runs `attempt` until it succeeds or [`SET_UP_WITHIN`] has passed. A
/// cluster that is starting, electing its meta leader or short of a quorum
/// for a replicated stream answers errors or nothing meanwhile (nodes
/// started with their servers met "no suitable peers for placement"), and
/// nodes starting together race to make the same stream and buckets: the
/// loser finds the winner's on its next try.
async fn set_up<T, F: Future<Output = Result<T>>>(what: &str, mut attempt: impl FnMut() -> F) -> Result<T> {
    let deadline = tokio::time::Instant::now() + SET_UP_WITHIN;
    loop {
        match attempt().await {
            Ok(done) => return Ok(done),
            // A setting the cluster contradicts does not change by waiting.
            Err(e @ TierError::Config(_)) => return Err(e),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(e) => {
                tracing::warn!(what, error = %e, "JetStream cannot set this up yet; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Runs a tier node until `shutdown` completes, then gives its partitions
/// back so the other nodes take them at once.
pub async fn run(config: TierConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    config.validate()?;
    std::fs::create_dir_all(&config.dir)
        .map_err(|source| TierError::Io { path: config.dir.clone(), source })?;
    remove_stale_stores(&config.dir)?;
    // A server down at start is connected to once it is up: the set-up
    // below tries again meanwhile (see `set_up`).
    let client = async_nats::ConnectOptions::new()
        .name(format!("delaywheel-nats {}", config.node_id))
        .request_timeout(Some(OP_TIMEOUT))
        .retry_on_initial_connect()
        .connect(config.servers.clone())
        .await
        .map_err(|e| TierError::nats(format!("connect to {}", config.servers.join(",")), e))?;
    // Calls fail fast and are retried, rather than wait out a leader election.
    let js = jetstream::context::ContextBuilder::new()
        .timeout(OP_TIMEOUT)
        .ack_timeout(OP_TIMEOUT)
        .build(client.clone());
    tokio::pin!(shutdown);
    let layout = config.layout();
    let set_up_all = async {
        let mut streams = Vec::new();
        for index in 0..layout.streams {
            let what = format!("delay stream {}", layout.stream_name(index));
            streams.push(set_up(&what, || ensure_stream(&js, &layout, config.replicas, index)).await?);
        }
        let leases = set_up("the lease bucket", || Leases::open(&js, &config)).await?;
        let settled_ids = set_up("the settled-ids bucket", || SettledIds::open(&js, &config)).await?;
        let checkpoints = set_up("the checkpoint store", || Checkpoints::open(&js, &config)).await?;
        Ok::<_, TierError>((streams, leases, settled_ids, checkpoints))
    };
    let (streams, leases, settled_ids, checkpoints) = tokio::select! {
        // Nothing is owned yet: nothing to give back.
        () = &mut shutdown => return Ok(()),
        made = set_up_all => made?,
    };
    let renew_every = config.renew_every();
    let policy = config.target_policy();
    let shared = Arc::new(Shared {
        client,
        js,
        layout,
        streams,
        config,
        policy,
        captured: Default::default(),
        takes: Default::default(),
        settled_ids,
        checkpoints,
    });
    let intake = match &shared.config.schedules {
        Some(intake) => {
            Some(set_up("the schedule intake", || crate::intake::start(shared.clone(), intake)).await?)
        }
        None => None,
    };
    let mut node = Node { shared, leases, owned: BTreeMap::new(), live: 1 };
    tracing::info!(node = %node.shared.config.node_id, "tier node started");
    let mut tick = tokio::time::interval(renew_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = tick.tick() => node.balance().await,
        }
    }
    // Publishers go to the other nodes' intake from here on.
    if let Some(intake) = intake {
        intake.abort();
    }
    node.leave().await;
    Ok(())
}

/// Creates delay stream `index` of `layout` if this is the tier's first
/// node: a work queue (a message goes when its delivery is acknowledged,
/// that is when its timer fired or was cancelled) whose messages never
/// expire, since a timer may be years ahead. Its subjects are its
/// partitions' own, so a timer on a subject no partition reads (`delay.99.x`
/// with 8 partitions, `delay.x`) is refused when it is published rather
/// than kept unread for ever. Also whether the stream (made otherwise) may
/// hold such timers.
async fn ensure_stream(
    js: &jetstream::Context,
    layout: &Layout,
    replicas: usize,
    index: u32,
) -> Result<DelayStream> {
    let name = layout.stream_name(index);
    let subjects = layout.stream_subjects(index);
    let made = js
        .get_or_create_stream(stream::Config {
            name: name.clone(),
            subjects: subjects.clone(),
            num_replicas: replicas,
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::WorkQueue,
            allow_direct: true,
            ..Default::default()
        })
        .await;
    // The server refuses a stream whose subjects another captures: the
    // tier's streams of another layout (one `DELAY`, say) hold these partitions.
    let stream = made.map_err(|e| {
        TierError::nats(
            format!("create stream {name} on {} (is the tier laid out otherwise?)", subjects.join(",")),
            e,
        )
    })?;
    let strays_possible = check_subjects(layout, index, &stream.cached_info().config.subjects)?;
    if strays_possible {
        // Made by hand or by an older node (`delay.>`): a timer on a subject
        // outside the partitions' is read by no partition (see `strays`).
        tracing::warn!(
            stream = %name,
            found = ?stream.cached_info().config.subjects,
            expected = %format!("{} … {}", subjects[0], subjects[subjects.len() - 1]),
            "the delay stream captures subjects no partition reads; the owner of partition 0 \
             moves timers there to the dead letter"
        );
        metrics::counter!("delaytier_stream_subjects_mismatch_total").increment(1);
    }
    Ok(DelayStream { stream, name, strays_possible })
}

/// Whether delay stream `index`, found with the subjects `found`, may hold
/// timers no partition reads (see `strays`). With one stream, whatever it
/// captures is taken, as before streams could be several (`delay.>`, made
/// by hand or by an older node). With several, a stream must capture
/// exactly its own partitions: one made for another stream count holds
/// partitions this layout reads elsewhere (their timers would never fire,
/// or be swept to the dead letter as strays) or lacks some of its own, so
/// it is refused, naming both, and nothing is touched.
fn check_subjects(layout: &Layout, index: u32, found: &[String]) -> Result<bool> {
    let mut wanted = layout.stream_subjects(index);
    if layout.streams == 1 {
        return Ok(found != wanted.as_slice());
    }
    let mut found = found.to_vec();
    found.sort();
    wanted.sort();
    if found == wanted {
        return Ok(false);
    }
    Err(TierError::Config(format!(
        "delay stream {} captures {} but this tier's layout ({} partitions in {} streams) puts {} \
         there: was the tier laid out with another stream count? Its streams cannot change while \
         they hold timers",
        layout.stream_name(index),
        found.join(","),
        layout.partitions,
        layout.streams,
        wanted.join(","),
    )))
}

struct Node {
    shared: Arc<Shared>,
    leases: Leases,
    owned: BTreeMap<u32, OwnedPartition>,
    /// The live nodes counted last (kept when a count fails).
    live: usize,
}

impl Node {
    /// One round: renew, count the live nodes, then take free partitions up
    /// to the fair share or give back those above it.
    async fn balance(&mut self) {
        for partition in self.leases.renew().await {
            if let Some(owned) = self.owned.remove(&partition) {
                owned.stop(LeaseAtStop::Lost).await;
            }
        }
        match self.leases.heartbeat().await {
            Ok(live) => self.live = live,
            Err(err) => tracing::warn!(%err, "heartbeat failed; the share stays as counted last"),
        }
        let share = fair_share(self.shared.config.partitions, self.live);
        while self.owned.len() > share {
            let (&partition, _) = self.owned.last_key_value().expect("more than the share is at least one");
            self.give_back(partition).await;
        }
        if self.owned.len() < share {
            self.take_free(share).await;
        }
        metrics::gauge!("delaytier_partitions_owned").set(self.owned.len() as f64);
    }

    async fn take_free(&mut self, share: usize) {
        let config = &self.shared.config;
        for partition in preference(&config.node_id, config.partitions).collect::<Vec<_>>() {
            if self.owned.len() >= share {
                break;
            }
            if self.owned.contains_key(&partition) {
                continue;
            }
            match self.leases.try_acquire(partition).await {
                Ok(true) => match OwnedPartition::start(self.shared.clone(), partition).await {
                    Ok(owned) => {
                        self.owned.insert(partition, owned);
                    }
                    Err(err) => {
                        tracing::error!(partition, %err, "cannot run the partition; giving it back");
                        let _ = self.leases.release(partition).await;
                    }
                },
                Ok(false) => {}
                Err(err) => return tracing::warn!(partition, %err, "cannot take a lease"),
            }
        }
    }

    async fn give_back(&mut self, partition: u32) {
        if let Some(owned) = self.owned.remove(&partition) {
            let lease =
                self.leases.surely_held_until(partition).map_or(LeaseAtStop::Lost, LeaseAtStop::HeldUntil);
            owned.stop(lease).await;
        }
        if let Err(err) = self.leases.release(partition).await {
            tracing::warn!(partition, %err, "cannot release a lease; it expires instead");
        }
    }

    async fn leave(mut self) {
        let held: Vec<u32> = self.leases.held().collect();
        for partition in held {
            self.give_back(partition).await;
        }
        if let Err(err) = self.leases.leave().await {
            tracing::warn!(%err, "cannot remove the heartbeat; it expires instead");
        }
        tracing::info!(node = %self.shared.config.node_id, "tier node stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_of_another_stream_count_is_refused_and_one_stream_takes_what_it_finds() {
        let subjects = |layout: &Layout, index| layout.stream_subjects(index);
        let two = Layout::new("DELAY", "delay", 8).with_streams(2);
        let three = two.clone().with_streams(3);
        // Exactly its partitions, in any order: taken, no strays.
        let mut own = subjects(&two, 1);
        own.reverse();
        assert!(!check_subjects(&two, 1, &own).unwrap());
        // Made for three streams (0, 3, 6): partition 3 is stream 1's now.
        let err = check_subjects(&two, 0, &subjects(&three, 0)).unwrap_err().to_string();
        assert!(err.contains("DELAY-0") && err.contains("delay.3.>") && err.contains("2 streams"), "{err}");
        // Made for four (0, 4): partitions 2 and 6 would have no stream.
        let four = two.clone().with_streams(4);
        assert!(check_subjects(&two, 0, &subjects(&four, 0)).is_err());
        // One stream takes a hand-made `delay.>` (strays possible) or its own subjects.
        let one = Layout::new("DELAY", "delay", 8);
        assert!(check_subjects(&one, 0, &["delay.>".to_string()]).unwrap());
        assert!(!check_subjects(&one, 0, &subjects(&one, 0)).unwrap());
    }
}
