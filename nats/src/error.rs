//! The tier's one error type.

/// What can go wrong in the delay tier.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// A NATS or JetStream call failed; `what` names the call.
    #[error("NATS: {what}: {source}")]
    Nats {
        /// The call that failed, with its subject or stream.
        what: String,
        /// What the client reported.
        source: async_nats::Error,
    },
    /// The local store failed.
    #[error("local store: {0}")]
    Store(#[from] delaywheel::Error),
    /// A file of the node's directory could not be made or removed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A handle's text is not `partition:sequence`.
    #[error("bad timer handle {0:?}: expected partition:sequence")]
    BadHandle(String),
    /// A timer message lacks a header the tier needs, or has a bad one.
    #[error("delay stream sequence {sequence}: {problem}")]
    BadTimer {
        /// Its sequence in the delay stream.
        sequence: u64,
        /// Which header is missing or what is wrong with it.
        problem: String,
    },
    /// A timer's target is one the tier refuses to publish to.
    #[error("{header} header: {reason}")]
    BadTarget {
        /// The header naming the target.
        header: &'static str,
        /// Why it is refused.
        reason: crate::target::Refused,
    },
    /// A partition's owner answered a request with an error.
    #[error("the partition's owner answered: {0}")]
    Owner(String),
    /// A partition's checkpoint does not read (see `partition/checkpoint.rs`):
    /// its next owner reads the whole partition instead.
    #[error("checkpoint {object}: {problem}")]
    BadCheckpoint {
        /// The object's name.
        object: String,
        /// What is wrong, with the offset where it shows.
        problem: String,
    },
    /// The configuration is not usable.
    #[error("configuration: {0}")]
    Config(String),
}

impl TierError {
    /// Wraps a NATS client error with the call that produced it.
    pub(crate) fn nats(what: impl Into<String>, source: impl Into<async_nats::Error>) -> Self {
        TierError::Nats { what: what.into(), source: source.into() }
    }
}

/// Runs a NATS call with a time limit, so one stuck call (a stream's leader
/// being elected again, say) cannot hold up the lease loop or a partition.
pub(crate) async fn bounded<T, E: Into<async_nats::Error>>(
    limit: std::time::Duration,
    what: impl FnOnce() -> String,
    call: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(TierError::nats(what(), err)),
        Err(elapsed) => Err(TierError::nats(what(), elapsed)),
    }
}

/// The tier's result.
pub type Result<T, E = TierError> = std::result::Result<T, E>;
