//! The protocol types and the service, generated from `proto/` (a subset of
//! apache/rocketmq-apis; the field numbers are the wire contract).
#![allow(missing_docs)]
#![allow(clippy::all)]

tonic::include_proto!("apache.rocketmq.v2");
