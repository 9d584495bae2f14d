//! The errors of starting and stopping a server (requests are answered with
//! the protocol's status codes instead: see `status.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why a server could not start, or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A listener could not bind its address.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// The handle key file could not be read or written, or is damaged.
    #[error("handle key {path}: {reason}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The TLS certificate or key could not be read, or do not make an identity.
    #[error("TLS {path}: {reason}")]
    Tls {
        /// The certificate or key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A listener failed while serving.
    #[error("{listener} listener: {reason}")]
    Serve {
        /// `gRPC` or `HTTP`.
        listener: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The store refused to open or close.
    #[error(transparent)]
    Store(#[from] delaywheel::Error),
}
