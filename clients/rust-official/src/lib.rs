//! Nothing to link: this crate holds `tests/official_client.rs`, which runs
//! Apache's own Rust RocketMQ 5 client (crate `rocketmq` 5.0.0, unchanged)
//! against an in-process `delaywheel serve`.
