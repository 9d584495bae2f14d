//! delaywheel over the network: the part of RocketMQ 5's gRPC protocol
//! (`apache.rocketmq.v2.MessagingService`) that producers and consumers use,
//! so the official clients in any language talk to a delaywheel store
//! unchanged, and an HTTP endpoint beside it (`/metrics`, `/pending`,
//! `/healthz`).
//!
//! The gRPC endpoint checks RocketMQ's access-key signature when it is given
//! credentials ([`auth`]); without them, and always on the HTTP endpoint,
//! there is **no authentication**: both bind to loopback by default, and
//! anyone who can reach them can send, receive and recall.
//!
//! How the protocol maps onto the store:
//! - topics are created on first use; each has the store's queues;
//! - a timed send is a timed put; the receipt's recall handle names the timer
//!   (MAC'd with the server's key, so a client cannot make one up);
//! - a received message is invisible for its invisible duration: receiving
//!   puts a copy of it as a timer on the same wheel into the group's retry
//!   topic, due when the duration ends; an ack cancels that timer, and
//!   `ChangeInvisibleDuration` reschedules it. So an un-acked message comes
//!   back once per expiry, across restarts too (see [`receive`]);
//! - a recurring schedule's occurrence carries its schedule's handle, its
//!   number and the next one's instant as user properties (`occurrences.rs`);
//! - a PushConsumer's messages (received with `auto_renew`) have that timer
//!   pushed out while the client's telemetry stream is open ([`renewal`]).

#![warn(missing_docs)]

pub mod auth;
mod codes;
mod connections;
mod copies;
mod error;
mod fifo;
mod handles;
mod http;
mod metrics;
mod names;
mod occurrences;
mod operators;
mod produce;
pub mod proto;
mod receipts;
pub mod receive;
pub mod renewal;
mod same_site;
mod send;
mod server;
mod service;
mod status;
mod tls;
mod topics;

pub use auth::Credentials;
pub use connections::ConnectionLimits;
pub use error::ServeError;
pub use handles::{HandleKey, load_or_create_key};
pub use renewal::RenewPolicy;
pub use server::{ServeOptions, Server, store_config};
pub use tls::TlsIdentity;
pub use topics::DEFAULT_MAX_TOPICS;
