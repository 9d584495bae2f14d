//! Prometheus metrics through the `metrics` facade: counters the gRPC
//! service bumps as it answers, and the store's gauges, read at each scrape.
//!
//! Each server has its own recorder (not the process-wide one), so several
//! servers in one process (the tests) keep their numbers apart.

use delaywheel::{HORIZON_LABELS, Stats};
use metrics::{Counter, Histogram, Recorder as _};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::receive::Lag;

/// Buckets of the receive-lateness histogram, in seconds.
const LATENESS_BUCKETS: [f64; 12] = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0, 30.0];

pub(crate) struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    pub sends: Counter,
    pub timed_sends: Counter,
    pub send_refusals: Counter,
    pub recalls: Counter,
    pub received: Counter,
    pub redelivered: Counter,
    pub acks: Counter,
    /// Connections closed at accept: the listener held its most.
    pub connections_refused: Counter,
    /// Receive time minus deliver time of timed messages handed out the first time.
    pub receive_lateness: Histogram,
}

impl Metrics {
    pub fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("delaywheel_receive_lateness_seconds".into()),
                &LATENESS_BUCKETS,
            )
            .expect("the buckets are not empty")
            .build_recorder();
        let handle = recorder.handle();
        let counter = |name: &'static str, help: &'static str| {
            recorder.describe_counter(name.into(), None, help.into());
            metrics::with_local_recorder(&recorder, || metrics::counter!(name))
        };
        let sends = counter("delaywheel_grpc_sends_total", "Messages stored by SendMessage");
        let timed_sends =
            counter("delaywheel_grpc_timed_sends_total", "Timed messages stored by SendMessage");
        let send_refusals = counter("delaywheel_grpc_send_refusals_total", "Messages SendMessage refused");
        let recalls = counter("delaywheel_grpc_recalls_total", "Timers cancelled by RecallMessage");
        let received = counter("delaywheel_grpc_received_total", "Messages handed out by ReceiveMessage");
        let redelivered = counter(
            "delaywheel_grpc_redelivered_total",
            "Messages handed out again after their invisible duration",
        );
        let acks = counter("delaywheel_grpc_acks_total", "Messages acked");
        let connections_refused = counter(
            "delaywheel_connections_refused_total",
            "Connections closed as soon as accepted: the listener held its most",
        );
        let receive_lateness = metrics::with_local_recorder(&recorder, || {
            metrics::histogram!("delaywheel_receive_lateness_seconds")
        });
        Self {
            recorder,
            handle,
            sends,
            timed_sends,
            send_refusals,
            recalls,
            received,
            redelivered,
            acks,
            connections_refused,
            receive_lateness,
        }
    }

    /// The text a scrape returns: the store's gauges as of `stats`, the lags, then everything.
    pub fn render(&self, stats: &Stats, lags: &[Lag]) -> String {
        metrics::with_local_recorder(&self.recorder, || {
            use metrics::{counter, gauge};
            gauge!("delaywheel_pending_timers").set(stats.pending as f64);
            for (level, count) in stats.pending_per_level.iter().enumerate() {
                gauge!("delaywheel_pending_timers_by_level", "level" => level.to_string()).set(*count as f64);
            }
            for (label, count) in HORIZON_LABELS.iter().zip(stats.pending_by_horizon) {
                gauge!("delaywheel_pending_timers_by_horizon", "within" => *label).set(count as f64);
            }
            counter!("delaywheel_deliveries_total").absolute(stats.delivered);
            counter!("delaywheel_schedule_occurrences_total").absolute(stats.occurrences_delivered);
            if let Some(schedules) = stats.schedules {
                gauge!("delaywheel_schedules_active").set(schedules.active as f64);
                gauge!("delaywheel_schedules_paused").set(schedules.paused as f64);
            }
            counter!("delaywheel_early_deliveries_total").absolute(stats.early);
            let lateness = &stats.lateness_ms;
            for (quantile, ms) in [
                ("0.5", lateness.p50),
                ("0.9", lateness.p90),
                ("0.99", lateness.p99),
                ("0.999", lateness.p999),
                ("1", lateness.max),
            ] {
                gauge!("delaywheel_delivery_lateness_ms", "quantile" => quantile).set(ms as f64);
            }
            let recent = &stats.recent_lateness_ms;
            for (quantile, ms) in [("0.5", recent.p50), ("0.99", recent.p99), ("1", recent.max)] {
                gauge!("delaywheel_delivery_lateness_recent_ms", "quantile" => quantile).set(ms as f64);
            }
            let disk = &stats.disk;
            for (kind, bytes) in [
                ("commit_log", disk.commit_log),
                ("relocated", disk.relocated),
                ("consume_queues", disk.consume_queues),
                ("timer_index", disk.timer_index),
                ("key_index", disk.key_index),
            ] {
                gauge!("delaywheel_disk_bytes", "kind" => kind).set(bytes as f64);
            }
            gauge!("delaywheel_retention_relocated_bytes").set(stats.retention.relocated_bytes as f64);
            gauge!("delaywheel_dispatch_lag_bytes").set(stats.dispatch_lag_bytes as f64);
            for lag in lags {
                let labels = [
                    ("group", lag.group.clone()),
                    ("topic", lag.topic.clone()),
                    ("queue", lag.queue.to_string()),
                ];
                gauge!("delaywheel_consumer_lag_messages", &labels).set(lag.behind as f64);
            }
        });
        self.handle.render()
    }
}
