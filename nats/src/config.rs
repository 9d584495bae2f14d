//! How a tier node is configured.

use std::path::PathBuf;
use std::time::Duration;

use crate::{Result, TierError};

/// A tier node's settings. Every node of one tier must agree on `stream`,
/// `prefix`, `partitions` and `lease_bucket`.
#[derive(Debug, Clone)]
pub struct TierConfig {
    /// NATS server URLs (any of the cluster's).
    pub servers: Vec<String>,
    /// Where the node keeps the local stores of the partitions it owns.
    pub dir: PathBuf,
    /// This node's name: unique in the tier, a KV key token (`[-_A-Za-z0-9]`).
    pub node_id: String,
    /// The delay stream, created by the first node if absent.
    pub stream: String,
    /// Its subjects are `<prefix>.<partition>.>`.
    pub prefix: String,
    /// How many partitions the delay stream is split into.
    pub partitions: u32,
    /// Replicas of the delay stream and the lease bucket (1 or 3 usually).
    pub replicas: usize,
    /// A lease not renewed for this long expires and another node may take
    /// the partition: the longest a dead node's timers wait.
    pub lease: Duration,
    /// The KV bucket holding the leases and the nodes' heartbeats.
    pub lease_bucket: String,
}

impl TierConfig {
    /// The defaults: stream `DELAY` on `delay.<p>.>`, 8 partitions, R3, 3 s leases.
    pub fn new(servers: Vec<String>, dir: impl Into<PathBuf>, node_id: impl Into<String>) -> Self {
        TierConfig {
            servers,
            dir: dir.into(),
            node_id: node_id.into(),
            stream: "DELAY".into(),
            prefix: "delay".into(),
            partitions: 8,
            replicas: 3,
            lease: Duration::from_secs(3),
            lease_bucket: "delaytier_leases".into(),
        }
    }

    /// How often a node renews its leases and looks for free partitions.
    pub fn renew_every(&self) -> Duration {
        self.lease / 4
    }

    /// Refuses settings the tier cannot run with, naming the field.
    pub fn validate(&self) -> Result<()> {
        let token = |name: &str, value: &str| {
            let ok = !value.is_empty()
                && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if ok { Ok(()) } else { Err(TierError::Config(format!("{name} {value:?}: use [-_A-Za-z0-9]"))) }
        };
        token("node id", &self.node_id)?;
        token("stream", &self.stream)?;
        token("subject prefix", &self.prefix)?;
        token("lease bucket", &self.lease_bucket)?;
        if self.servers.is_empty() {
            return Err(TierError::Config("no NATS server URL".into()));
        }
        if !(1..=4096).contains(&self.partitions) {
            return Err(TierError::Config(format!("partitions {}: must be 1..=4096", self.partitions)));
        }
        if !(1..=5).contains(&self.replicas) {
            return Err(TierError::Config(format!("replicas {}: must be 1..=5", self.replicas)));
        }
        if self.lease < Duration::from_millis(400) {
            return Err(TierError::Config(format!("lease {:?}: at least 400 ms", self.lease)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_the_tier_cannot_use_are_refused_by_name() {
        let good = TierConfig::new(vec!["nats://127.0.0.1:4222".into()], "/tmp/x", "node-1");
        good.validate().unwrap();
        type Spoil = fn(&mut TierConfig);
        let cases: [(&str, Spoil); 5] = [
            ("node id", |c| c.node_id = "a.b".into()),
            ("partitions 0", |c| c.partitions = 0),
            ("replicas 7", |c| c.replicas = 7),
            ("lease", |c| c.lease = Duration::from_millis(10)),
            ("no NATS server", |c| c.servers.clear()),
        ];
        for (field, spoil) in cases {
            let mut config = good.clone();
            spoil(&mut config);
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }
}
