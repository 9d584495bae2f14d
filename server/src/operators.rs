//! The operators' page and the JSON behind it, on the HTTP endpoint:
//! - `GET /`: the page (`page.html`, compiled in: nothing is fetched from elsewhere);
//! - `GET /overview`: pending timers by level and horizon, deliveries,
//!   lateness, disk by kind, retention, consumer lag;
//! - `GET /pending/counts?from=MS&step=MS&buckets=N`: pending timers per
//!   interval, from the wheel's slot counts ([`delaywheel::Store::pending_counts`]);
//! - `POST /timers/{handle}/cancel` and `POST /timers/{handle}/reschedule`
//!   (body `{"deliver_at_ms": MS}`), and `POST /schedules/{handle}/pause`,
//!   `/resume` and `/cancel` for recurring schedules, which act only with
//!   [`ServeOptions::allow_cancel`](crate::ServeOptions::allow_cancel), since
//!   the endpoint has no authentication.
//!
//! Bad input answers 400 naming the field, an unknown handle 404, a timer
//! that already fired (or was cancelled), or a schedule that is over or
//! cancelled, 409.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use delaywheel::{
    CancelOutcome, Handle, MAX_COUNT_BOUNDS, MAX_DELIVER_AT_MS, PauseOutcome, RescheduleOutcome,
};
use serde_json::{Value, json};

use crate::http::{error, on_store};
use crate::server::Shared;

const PAGE: &str = include_str!("page.html");

pub(crate) async fn page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}

/// What the page shows besides the chart and the search: the store's
/// stats, fresh (everything put before the request counted).
pub(crate) async fn overview(State(shared): State<Arc<Shared>>) -> Response {
    let snapshot = on_store(&shared, |shared| {
        Ok::<_, delaywheel::Error>((shared.store.fresh_stats()?, shared.groups.lags()))
    })
    .await;
    let (stats, lags) = match snapshot {
        Ok(Ok(snapshot)) => snapshot,
        Ok(Err(e)) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(response) => return response,
    };
    let horizon: serde_json::Map<String, Value> =
        (delaywheel::HORIZON_LABELS.iter().zip(stats.pending_by_horizon))
            .map(|(label, count)| (label.to_string(), json!(count)))
            .collect();
    let lags: Vec<Value> = lags
        .iter()
        .map(|l| json!({ "group": l.group, "topic": l.topic, "queue": l.queue, "behind": l.behind }))
        .collect();
    let (disk, retention) = (&stats.disk, &stats.retention);
    let summary =
        |l: &delaywheel::Lateness| json!({ "count": l.count, "p50": l.p50, "p99": l.p99, "max": l.max });
    Json(json!({
        "now_ms": delaywheel::Clock::now_ms(&delaywheel::SystemClock),
        "pending": stats.pending,
        "pending_per_level": stats.pending_per_level,
        "pending_by_horizon": horizon,
        "delivered": stats.delivered,
        "lateness_ms": summary(&stats.lateness_ms),
        "recent_lateness_ms": summary(&stats.recent_lateness_ms),
        "disk_bytes": {
            "commit_log": disk.commit_log,
            "relocated": disk.relocated,
            "consume_queues": disk.consume_queues,
            "timer_index": disk.timer_index,
            "key_index": disk.key_index,
        },
        "retention": {
            "relocated_timers": retention.relocated_timers,
            "relocated_bytes": retention.relocated_bytes,
            "segments_deleted": retention.segments_deleted,
        },
        "lags": lags,
        "schedules": stats.schedules.map(|s| json!({ "active": s.active, "paused": s.paused })),
        "occurrences_delivered": stats.occurrences_delivered,
        "allow_cancel": shared.allow_cancel,
    }))
    .into_response()
}

/// The chart's intervals: `buckets` of `step` ms from `from` (default: now, on a whole second).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Intervals {
    pub from: u64,
    pub step: u64,
    pub buckets: usize,
}

impl Intervals {
    pub fn parse(query: &HashMap<String, String>, now_ms: u64) -> Result<Self, String> {
        if let Some(unknown) = query.keys().find(|k| !["from", "step", "buckets"].contains(&k.as_str())) {
            return Err(format!("{unknown}: not a parameter (from, step, buckets)"));
        }
        let number = |name: &str| -> Result<Option<u64>, String> {
            query
                .get(name)
                .map(|text| text.parse::<u64>())
                .transpose()
                .map_err(|_| format!("{name}: {:?} is not a non-negative integer", query[name]))
        };
        let from = number("from")?.unwrap_or(now_ms / 1000 * 1000);
        let step = number("step")?.ok_or("step: missing (the interval's length in ms)")?;
        let buckets = number("buckets")?.ok_or("buckets: missing (how many intervals)")?;
        if step == 0 {
            return Err("step: 0 ms, at least 1".into());
        }
        let most = MAX_COUNT_BOUNDS as u64 - 1;
        if buckets == 0 || buckets > most {
            return Err(format!("buckets: {buckets} is not from 1 to {most}"));
        }
        let end = step.checked_mul(buckets).and_then(|span| span.checked_add(from));
        if end.is_none_or(|end| end > MAX_DELIVER_AT_MS + 1) {
            return Err(format!("step: {buckets} intervals of {step} ms from {from} pass the year 9999"));
        }
        Ok(Self { from, step, buckets: buckets as usize })
    }

    fn bounds(&self) -> Vec<u64> {
        (0..=self.buckets as u64).map(|i| self.from + i * self.step).collect()
    }
}

pub(crate) async fn pending_counts(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let now_ms = delaywheel::Clock::now_ms(&delaywheel::SystemClock);
    let intervals = match Intervals::parse(&query, now_ms) {
        Ok(intervals) => intervals,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let bounds = intervals.bounds();
    let counted = on_store(&shared, move |shared| shared.store.pending_counts(&bounds)).await;
    let counts = match counted {
        Ok(Ok(counts)) => counts,
        Ok(Err(e)) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(response) => return response,
    };
    let (before, after) = (counts[0], counts[counts.len() - 1]);
    Json(json!({
        "from": intervals.from,
        "step_ms": intervals.step,
        "counts": &counts[1..counts.len() - 1],
        "before": before,
        "after": after,
    }))
    .into_response()
}

/// The handle in the path, or the answer that refuses the request.
fn handle_to_change(shared: &Shared, text: &str) -> Result<Handle, (StatusCode, String)> {
    if !shared.allow_cancel {
        let why = "cancel, reschedule, pause and resume are off: start the server with --allow-cancel";
        return Err((StatusCode::FORBIDDEN, why.into()));
    }
    text.parse::<Handle>().map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))
}

fn outcome(status: StatusCode, outcome: &str, handle: &str) -> Response {
    (status, Json(json!({ "outcome": outcome, "handle": handle }))).into_response()
}

pub(crate) async fn cancel(State(shared): State<Arc<Shared>>, Path(text): Path<String>) -> Response {
    let handle = match handle_to_change(&shared, &text) {
        Ok(handle) => handle,
        Err((status, message)) => return error(status, message),
    };
    match on_store(&shared, move |shared| shared.store.cancel(handle)).await {
        Ok(Ok(CancelOutcome::Cancelled)) => outcome(StatusCode::OK, "cancelled", &text),
        Ok(Ok(CancelOutcome::AlreadyDelivered)) => outcome(StatusCode::CONFLICT, "already_delivered", &text),
        Ok(Ok(CancelOutcome::NotFound)) => outcome(StatusCode::NOT_FOUND, "not_found", &text),
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(response) => response,
    }
}

pub(crate) async fn reschedule(
    State(shared): State<Arc<Shared>>,
    Path(text): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let handle = match handle_to_change(&shared, &text) {
        Ok(handle) => handle,
        Err((status, message)) => return error(status, message),
    };
    let deliver_at_ms = match deliver_at_of(&body) {
        Ok(at) => at,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    match on_store(&shared, move |shared| shared.store.reschedule(handle, deliver_at_ms)).await {
        Ok(Ok(RescheduleOutcome::Rescheduled)) => outcome(StatusCode::OK, "rescheduled", &text),
        Ok(Ok(RescheduleOutcome::AlreadyDelivered)) => {
            outcome(StatusCode::CONFLICT, "already_delivered", &text)
        }
        Ok(Ok(RescheduleOutcome::Cancelled)) => outcome(StatusCode::CONFLICT, "cancelled", &text),
        Ok(Ok(RescheduleOutcome::NotFound)) => outcome(StatusCode::NOT_FOUND, "not_found", &text),
        Ok(Err(e @ delaywheel::Error::Invalid { .. })) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(response) => response,
    }
}

/// What `POST /schedules/{handle}/{action}` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScheduleAction {
    Pause,
    Resume,
    Cancel,
}

/// `POST /schedules/{handle}/{action}`: pauses, resumes or cancels a
/// recurring schedule (with `--allow-cancel`). `unchanged` (already so) is
/// 200, `over` and `cancelled` 409, `not_found` 404.
pub(crate) async fn change_schedule(
    State(shared): State<Arc<Shared>>,
    Path((text, action)): Path<(String, String)>,
) -> Response {
    let action = match action.as_str() {
        "pause" => ScheduleAction::Pause,
        "resume" => ScheduleAction::Resume,
        "cancel" => ScheduleAction::Cancel,
        other => {
            return error(StatusCode::NOT_FOUND, format!("{other}: not an action (pause, resume, cancel)"));
        }
    };
    let handle = match handle_to_change(&shared, &text) {
        Ok(handle) => handle,
        Err((status, message)) => return error(status, message),
    };
    let done = on_store(&shared, move |shared| {
        let store = &shared.store;
        match action {
            ScheduleAction::Pause => store.pause_schedule(handle),
            ScheduleAction::Resume => store.resume_schedule(handle),
            ScheduleAction::Cancel => store.cancel_schedule(handle).map(|outcome| match outcome {
                CancelOutcome::Cancelled => PauseOutcome::Cancelled,
                CancelOutcome::AlreadyDelivered => PauseOutcome::Over,
                CancelOutcome::NotFound => PauseOutcome::NotFound,
            }),
        }
    })
    .await;
    let answer = match done {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(response) => return response,
    };
    match (action, answer) {
        (ScheduleAction::Cancel, PauseOutcome::Cancelled) => outcome(StatusCode::OK, "cancelled", &text),
        (_, PauseOutcome::Paused) => outcome(StatusCode::OK, "paused", &text),
        (_, PauseOutcome::Resumed) => outcome(StatusCode::OK, "resumed", &text),
        (_, PauseOutcome::Unchanged) => outcome(StatusCode::OK, "unchanged", &text),
        (_, PauseOutcome::Over) => outcome(StatusCode::CONFLICT, "over", &text),
        (_, PauseOutcome::Cancelled) => outcome(StatusCode::CONFLICT, "cancelled", &text),
        (_, PauseOutcome::NotFound) => outcome(StatusCode::NOT_FOUND, "not_found", &text),
    }
}

/// `deliver_at_ms` of a reschedule's JSON body.
fn deliver_at_of(body: &[u8]) -> Result<u64, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("body: not JSON ({e})"))?;
    let at = value.get("deliver_at_ms").ok_or("deliver_at_ms: missing from the body")?;
    at.as_u64().ok_or_else(|| format!("deliver_at_ms: {at} is not epoch milliseconds"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn bad_intervals_name_the_parameter() {
        for (pairs, names) in [
            (vec![("buckets", "3")], "step:"),
            (vec![("step", "1000")], "buckets:"),
            (vec![("step", "0"), ("buckets", "3")], "step:"),
            (vec![("step", "1000"), ("buckets", "0")], "buckets:"),
            (vec![("step", "1000"), ("buckets", "10081")], "buckets:"),
            (vec![("step", "x"), ("buckets", "3")], "step:"),
            (vec![("from", "-1"), ("step", "1"), ("buckets", "3")], "from:"),
            (vec![("step", "18446744073709551615"), ("buckets", "3")], "step:"),
            (vec![("stpe", "1")], "stpe:"),
        ] {
            let err = Intervals::parse(&query(&pairs), 1_700_000_000_500).unwrap_err();
            assert!(err.starts_with(names), "{pairs:?}: {err}");
        }
        let parsed = Intervals::parse(&query(&[("step", "1000"), ("buckets", "300")]), 1_700_000_000_500);
        assert_eq!(parsed.unwrap(), Intervals { from: 1_700_000_000_000, step: 1000, buckets: 300 });
    }

    #[test]
    fn a_reschedule_body_names_what_is_wrong() {
        assert_eq!(deliver_at_of(br#"{"deliver_at_ms": 42}"#), Ok(42));
        for (body, names) in [
            (&b"nope"[..], "body:"),
            (br#"{}"#, "deliver_at_ms:"),
            (br#"{"deliver_at_ms": -5}"#, "deliver_at_ms:"),
            (br#"{"deliver_at_ms": "soon"}"#, "deliver_at_ms:"),
        ] {
            let err = deliver_at_of(body).unwrap_err();
            assert!(err.starts_with(names), "{body:?}: {err}");
        }
    }
}
