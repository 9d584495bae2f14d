//! How a tier node is configured.

use std::path::PathBuf;
use std::time::Duration;

use crate::target::TargetPolicy;
use crate::wire::Layout;
use crate::{Result, TierError};

/// Where dead letters go unless configured otherwise: outside the default
/// delay stream's `delay.>`.
pub const DEFAULT_DEAD_LETTER: &str = "delaytier.dead";

/// Where the schedule intake listens unless configured otherwise
/// ([`TierConfig::schedules`]): `schedules.>`.
pub const DEFAULT_SCHEDULES: &str = "schedules";

/// The KV bucket of settled `Nats-Msg-Id`s unless configured otherwise
/// ([`TierConfig::dedup_bucket`]).
pub const DEFAULT_DEDUP_BUCKET: &str = "delaytier_msg_ids";

/// A tier node's settings. Every node of one tier must agree on `stream`,
/// `prefix`, `partitions`, `streams` and `lease_bucket`.
#[derive(Debug, Clone)]
pub struct TierConfig {
    /// NATS server URLs (any of the cluster's).
    pub servers: Vec<String>,
    /// Where the node keeps the local stores of the partitions it owns.
    pub dir: PathBuf,
    /// This node's name: unique in the tier, a KV key token (`[-_A-Za-z0-9]`).
    pub node_id: String,
    /// The delay stream, created by the first node if absent; with several
    /// streams, their base name (`<stream>-<index>`).
    pub stream: String,
    /// Its subjects are `<prefix>.<partition>.>`.
    pub prefix: String,
    /// How many partitions the timers are split into.
    pub partitions: u32,
    /// How many delay streams hold the partitions (see [`Layout`]): each is
    /// a Raft group with a leader of its own, so several spread the
    /// cluster's work over its servers. 1 (the default) is the layout of
    /// earlier tiers; a tier's streams cannot change while it holds timers.
    pub streams: u32,
    /// Replicas of the delay stream and the lease bucket (1 or 3 usually).
    pub replicas: usize,
    /// A lease not renewed for this long expires and another node may take
    /// the partition: the longest a dead node's timers wait.
    pub lease: Duration,
    /// The KV bucket holding the leases and the nodes' heartbeats.
    pub lease_bucket: String,
    /// Target prefixes a timer may name (`orders.`, say); empty: any subject
    /// that is not reserved (see [`crate::target`]).
    pub allow_target_prefixes: Vec<String>,
    /// Timers that cannot be fired go to `<dead_letter>.<partition>`, with
    /// their reason. It must lie outside the delay stream's subjects, or a
    /// dead letter would come back as a timer.
    pub dead_letter: String,
    /// A timer whose target's stream exists but keeps failing to acknowledge
    /// it for this long goes to the dead letter.
    pub give_up_after: Duration,
    /// How long a producer's `Nats-Msg-Id` stands after its timer settled
    /// (fired, moved to the dead letter, or cancelled): a timer with the id
    /// of a pending one never fires, nor one with the id of a timer that
    /// settled less than this ago.
    pub dedup_window: Duration,
    /// The KV bucket holding the ids of settled timers for the dedup window.
    pub dedup_bucket: String,
    /// How often an owner writes its partition's checkpoint, which the next
    /// owner takes the partition over from instead of reading every pending
    /// timer (see `partition/checkpoint.rs`); zero: never, and a takeover
    /// reads the partition whole.
    pub checkpoint_every: Duration,
    /// The object store holding the checkpoints.
    pub checkpoint_bucket: String,
    /// The schedule intake (see `intake.rs`): a message with NATS's
    /// `Nats-Schedule` headers published to `<schedules>.>` becomes a
    /// timer; `None`: no intake. No stream may capture these subjects.
    pub schedules: Option<String>,
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
            streams: 1,
            replicas: 3,
            lease: Duration::from_secs(3),
            lease_bucket: "delaytier_leases".into(),
            allow_target_prefixes: Vec::new(),
            dead_letter: DEFAULT_DEAD_LETTER.into(),
            give_up_after: Duration::from_secs(60),
            dedup_window: Duration::from_secs(24 * 3600),
            dedup_bucket: DEFAULT_DEDUP_BUCKET.into(),
            checkpoint_every: Duration::from_secs(10),
            checkpoint_bucket: "delaytier_checkpoints".into(),
            schedules: Some(DEFAULT_SCHEDULES.into()),
        }
    }

    /// Where the timers are.
    pub fn layout(&self) -> Layout {
        Layout::new(&self.stream, &self.prefix, self.partitions).with_streams(self.streams)
    }

    /// How often a node renews its leases and looks for free partitions.
    pub fn renew_every(&self) -> Duration {
        self.lease / 4
    }

    /// What this tier may publish fired timers to.
    pub fn target_policy(&self) -> TargetPolicy {
        let policy = TargetPolicy::new(&self.prefix, &self.dead_letter, self.allow_target_prefixes.clone());
        match &self.schedules {
            Some(intake) => policy.also_own(intake),
            None => policy,
        }
    }

    /// The subject of a partition's dead letters.
    pub fn dead_letter_subject(&self, partition: u32) -> String {
        format!("{}.{partition}", self.dead_letter)
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
        token("dedup bucket", &self.dedup_bucket)?;
        token("checkpoint bucket", &self.checkpoint_bucket)?;
        if self.dedup_bucket == self.lease_bucket {
            return Err(TierError::Config("the dedup bucket and the lease bucket must differ".into()));
        }
        if self.dedup_window < Duration::from_secs(1) {
            return Err(TierError::Config(format!("dedup window {:?}: at least 1 s", self.dedup_window)));
        }
        if self.servers.is_empty() {
            return Err(TierError::Config("no NATS server URL".into()));
        }
        if !(1..=4096).contains(&self.partitions) {
            return Err(TierError::Config(format!("partitions {}: must be 1..=4096", self.partitions)));
        }
        if !(1..=self.partitions).contains(&self.streams) {
            let why = format!("streams {}: must be 1..=partitions ({})", self.streams, self.partitions);
            return Err(TierError::Config(why));
        }
        if !(1..=5).contains(&self.replicas) {
            return Err(TierError::Config(format!("replicas {}: must be 1..=5", self.replicas)));
        }
        if self.lease < Duration::from_millis(400) {
            return Err(TierError::Config(format!("lease {:?}: at least 400 ms", self.lease)));
        }
        self.validate_dead_letter()?;
        self.validate_schedules()?;
        if self.give_up_after < Duration::from_millis(100) {
            return Err(TierError::Config(format!(
                "give up after {:?}: at least 100 ms",
                self.give_up_after
            )));
        }
        if let Some(bad) = self.allow_target_prefixes.iter().find(|p| p.is_empty() || p.contains(['*', '>']))
        {
            return Err(TierError::Config(format!("allowed target prefix {bad:?}: plain subject text")));
        }
        Ok(())
    }

    fn validate_schedules(&self) -> Result<()> {
        let Some(intake) = &self.schedules else { return Ok(()) };
        let bad = |why: &str| Err(TierError::Config(format!("schedules {intake:?}: {why}")));
        if crate::target::check_subject(intake).is_err() {
            return bad("not a plain subject");
        }
        let inside = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}."));
        for (theirs, what) in
            [(&self.prefix, "the delay stream's subjects"), (&self.dead_letter, "the dead letters")]
        {
            if inside(intake, theirs) || inside(theirs, intake) {
                return bad(&format!("overlaps {what}, {theirs}.>"));
            }
        }
        Ok(())
    }

    fn validate_dead_letter(&self) -> Result<()> {
        let bad = |why: &str| Err(TierError::Config(format!("dead letter {:?}: {why}", self.dead_letter)));
        if crate::target::check_subject(&self.dead_letter).is_err() {
            return bad("not a plain subject");
        }
        let inside = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}."));
        if inside(&self.dead_letter, &self.prefix) || inside(&self.prefix, &self.dead_letter) {
            return bad(&format!("overlaps the delay stream's subjects {}.>", self.prefix));
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
        let cases: [(&str, Spoil); 17] = [
            ("node id", |c| c.node_id = "a.b".into()),
            ("partitions 0", |c| c.partitions = 0),
            ("streams 0", |c| c.streams = 0),
            ("streams 9: must be 1..=partitions (8)", |c| c.streams = 9),
            ("replicas 7", |c| c.replicas = 7),
            ("lease", |c| c.lease = Duration::from_millis(10)),
            ("no NATS server", |c| c.servers.clear()),
            ("dead letter \"delay.dead\": overlaps", |c| c.dead_letter = "delay.dead".into()),
            ("dead letter \"delay\": overlaps", |c| c.dead_letter = "delay".into()),
            ("dead letter \"dead.>\": not a plain", |c| c.dead_letter = "dead.>".into()),
            ("allowed target prefix \"orders.*\"", |c| c.allow_target_prefixes = vec!["orders.*".into()]),
            ("dedup window", |c| c.dedup_window = Duration::from_millis(10)),
            ("dedup bucket \"a.b\"", |c| c.dedup_bucket = "a.b".into()),
            ("the dedup bucket and the lease bucket", |c| c.dedup_bucket = c.lease_bucket.clone()),
            ("schedules \"delay.s\": overlaps the delay stream's", |c| c.schedules = Some("delay.s".into())),
            ("schedules \"delaytier\": overlaps the dead letters", |c| {
                c.schedules = Some("delaytier".into())
            }),
            ("schedules \"s.*\": not a plain", |c| c.schedules = Some("s.*".into())),
        ];
        for (field, spoil) in cases {
            let mut config = good.clone();
            spoil(&mut config);
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }
}
