//! Who owns which partition: leases in a JetStream KV bucket.
//!
//! The bucket's entries expire `lease` after they were last written
//! (`max_age`), so a node that stops renewing loses everything it held
//! without anyone deciding it is dead. A node takes a partition by creating
//! its key (only one create of an absent key succeeds), keeps it by updating
//! at the revision it last wrote (an update at a stale revision fails, so a
//! node that stalled past its lease learns it lost it), and gives it back by
//! deleting at that revision. Each node also writes a heartbeat key; the
//! number of live heartbeats sets each node's fair share, so a second node
//! gets half the partitions without any membership protocol of ours.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use futures::TryStreamExt;

use crate::error::bounded;
use crate::{Result, TierConfig, TierError};

const NODE_PREFIX: &str = "node.";

/// How many partitions one of `live_nodes` nodes should hold: the ceiling, so
/// every partition has room somewhere.
pub(crate) fn fair_share(partitions: u32, live_nodes: usize) -> usize {
    (partitions as usize).div_ceil(live_nodes.max(1))
}

/// The order a node tries free partitions in: starting from a place its name
/// picks, so two nodes starting together mostly want different partitions.
pub(crate) fn preference(node_id: &str, partitions: u32) -> impl Iterator<Item = u32> {
    let start = crc32c::crc32c(node_id.as_bytes()) % partitions;
    (0..partitions).map(move |i| (start + i) % partitions)
}

fn partition_key(partition: u32) -> String {
    format!("partition.{partition}")
}

/// This node's leases, with the revision each was last written at.
pub(crate) struct Leases {
    kv: kv::Store,
    node_id: String,
    held: BTreeMap<u32, Lease>,
    /// Each call's time limit: a round must end well inside a lease.
    limit: Duration,
    /// How long a lease lasts unrenewed.
    lease: Duration,
}

/// A lease held: the revision it was last written at, and when.
#[derive(Clone, Copy)]
struct Lease {
    revision: u64,
    renewed_at: Instant,
}

impl Leases {
    /// Opens the lease bucket, creating it if this is the tier's first node.
    pub(crate) async fn open(js: &jetstream::Context, config: &TierConfig) -> Result<Self> {
        let bucket = &config.lease_bucket;
        let kv = match js.get_key_value(bucket).await {
            Ok(kv) => kv,
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: bucket.clone(),
                    history: 1,
                    max_age: config.lease,
                    num_replicas: config.replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| TierError::nats(format!("create KV bucket {bucket}"), e))?,
        };
        Ok(Leases {
            kv,
            node_id: config.node_id.clone(),
            held: BTreeMap::new(),
            limit: config.renew_every(),
            lease: config.lease,
        })
    }

    /// The partitions held now.
    pub(crate) fn held(&self) -> impl Iterator<Item = u32> + '_ {
        self.held.keys().copied()
    }

    /// Until when this node may still act as the owner of `partition`
    /// without renewing: half a lease after the last renewal, leaving the
    /// other half for clocks and the bucket to disagree. `None` if not held.
    pub(crate) fn surely_held_until(&self, partition: u32) -> Option<Instant> {
        self.held.get(&partition).map(|lease| lease.renewed_at + self.lease / 2)
    }

    /// Tells the other nodes this one is alive, and counts the live ones.
    pub(crate) async fn heartbeat(&self) -> Result<usize> {
        let key = format!("{NODE_PREFIX}{}", self.node_id);
        bounded(self.limit, || format!("put {key}"), self.kv.put(&key, self.node_id.clone().into())).await?;
        // Counted from the bucket stream's subjects: one request, where
        // listing keys makes a consumer (which hung for a minute here once a
        // server had died).
        let filter = format!("{}{NODE_PREFIX}>", self.kv.prefix);
        let subjects = async {
            let subjects = self.kv.stream.info_with_subjects(&filter).await?;
            subjects.try_collect::<Vec<(String, usize)>>().await.map_err(async_nats::Error::from)
        };
        Ok(bounded(self.limit, || "count the live nodes".into(), subjects).await?.len())
    }

    /// Renews every lease held, all at once; returns those that were lost.
    ///
    /// A lease is lost when the bucket says so (the key expired or another
    /// node wrote it), or when no renewal succeeded for a whole lease. A
    /// renewal that only failed to get an answer (the bucket's leader being
    /// elected again after a server died, which took about 5 s here) keeps
    /// the lease until then: no other node can take it while the bucket
    /// cannot answer either.
    pub(crate) async fn renew(&mut self) -> Vec<u32> {
        let (kv, node_id, limit) = (&self.kv, &self.node_id, self.limit);
        let renewals = self.held.iter().map(|(&partition, lease)| async move {
            let key = partition_key(partition);
            let update = kv.update(&key, node_id.clone().into(), lease.revision);
            (partition, tokio::time::timeout(limit, update).await)
        });
        // The server's clock of each lease starts when it stores the renewal,
        // after this: counting from here errs on the safe side.
        let round = Instant::now();
        let renewed = futures::future::join_all(renewals).await;
        let mut lost = Vec::new();
        for (partition, renewed) in renewed {
            let lease = self.held.get_mut(&partition).expect("renewing what is held");
            match renewed {
                Ok(Ok(revision)) => *lease = Lease { revision, renewed_at: round },
                Ok(Err(err)) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    tracing::warn!(partition, %err, "lease lost: expired or taken");
                    lost.push(partition);
                }
                Ok(Err(_)) | Err(_) if lease.renewed_at.elapsed() < self.lease => {
                    tracing::warn!(partition, "lease not renewed this round; still valid");
                }
                Ok(Err(_)) | Err(_) => {
                    tracing::warn!(partition, "lease lost: not renewed for a whole lease");
                    lost.push(partition);
                }
            }
        }
        for partition in &lost {
            self.held.remove(partition);
        }
        lost
    }

    /// Takes a free partition; false if another node holds it.
    pub(crate) async fn try_acquire(&mut self, partition: u32) -> Result<bool> {
        let started = Instant::now();
        let create = self.kv.create(partition_key(partition), self.node_id.clone().into());
        match tokio::time::timeout(self.limit, create).await {
            Ok(Ok(revision)) => {
                self.held.insert(partition, Lease { revision, renewed_at: started });
                Ok(true)
            }
            Ok(Err(err)) if err.kind() == kv::CreateErrorKind::AlreadyExists => {
                self.take_back(partition).await
            }
            Ok(Err(err)) => Err(TierError::nats(format!("take lease of partition {partition}"), err)),
            Err(elapsed) => Err(TierError::nats(format!("take lease of partition {partition}"), elapsed)),
        }
    }

    /// A lease still naming this node (it lost it to a failed renewal, or it
    /// is this node restarted): this node's again, at its revision.
    async fn take_back(&mut self, partition: u32) -> Result<bool> {
        let key = partition_key(partition);
        let entry = bounded(self.limit, || format!("read {key}"), self.kv.entry(&key)).await?;
        let Some(entry) =
            entry.filter(|e| e.operation == kv::Operation::Put && e.value == self.node_id.as_bytes())
        else {
            return Ok(false);
        };
        let started = Instant::now();
        let update = self.kv.update(&key, self.node_id.clone().into(), entry.revision);
        match tokio::time::timeout(self.limit, update).await {
            Ok(Ok(revision)) => {
                self.held.insert(partition, Lease { revision, renewed_at: started });
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Gives a partition back, so another node may take it at once.
    pub(crate) async fn release(&mut self, partition: u32) -> Result<()> {
        let Some(lease) = self.held.remove(&partition) else { return Ok(()) };
        let delete = self.kv.delete_expect_revision(partition_key(partition), Some(lease.revision));
        bounded(self.limit, || format!("release lease of partition {partition}"), delete).await
    }

    /// Removes the heartbeat, so the others count one node fewer at once
    /// (purged from the stream: a delete marker would still be counted).
    pub(crate) async fn leave(&self) -> Result<()> {
        let subject = format!("{}{NODE_PREFIX}{}", self.kv.prefix, self.node_id);
        bounded(
            self.limit,
            || format!("purge {subject}"),
            self.kv.stream.purge().filter(&subject).into_future(),
        )
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fair_share_leaves_room_for_every_partition() {
        assert_eq!(fair_share(8, 1), 8);
        assert_eq!(fair_share(8, 2), 4);
        assert_eq!(fair_share(8, 3), 3);
        assert_eq!(fair_share(8, 0), 8);
        for nodes in 1..10 {
            assert!(fair_share(8, nodes) * nodes >= 8);
        }
    }

    #[test]
    fn each_node_tries_every_partition_once_from_its_own_start() {
        let mut order: Vec<u32> = preference("node-a", 8).collect();
        assert_eq!(order.len(), 8);
        order.sort();
        assert_eq!(order, (0..8).collect::<Vec<_>>());
        let starts: std::collections::HashSet<u32> =
            (0..20).map(|i| preference(&format!("node-{i}"), 8).next().unwrap()).collect();
        assert!(starts.len() > 3, "{starts:?}");
    }
}
