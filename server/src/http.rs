//! The HTTP endpoint: `GET /metrics` (Prometheus text), `GET /pending`
//! (the pending timers due in a window, or of one topic and key, as JSON),
//! `GET /schedules` (the active recurring schedules, as JSON),
//! `GET /healthz`, and the operators' page with the JSON behind it
//! (`operators.rs`), each behind the defences of `same_site.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use delaywheel::MAX_DELIVER_AT_MS;
use serde_json::json;

use crate::server::Shared;
use crate::{operators, same_site};

/// Default and largest `limit` of `/pending`.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 10_000;

/// The endpoint's routes for an endpoint bound to `bound`, behind [`same_site::guard`].
pub(crate) fn router(shared: Arc<Shared>, bound: std::net::SocketAddr) -> Router {
    let hosts = Arc::new(same_site::Hosts::of(bound));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/pending", get(pending))
        .route("/schedules", get(schedules))
        .route("/", get(operators::page))
        .route("/overview", get(operators::overview))
        .route("/pending/counts", get(operators::pending_counts))
        .route("/timers/{handle}/cancel", post(operators::cancel))
        .route("/timers/{handle}/reschedule", post(operators::reschedule))
        .route("/schedules/{handle}/{action}", post(operators::change_schedule))
        .with_state(shared)
        .layer(axum::middleware::from_fn_with_state(hosts, same_site::guard))
}

/// A JSON error naming what was wrong.
pub(crate) fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// Runs `work` on the blocking pool: the store's calls may wait for its threads.
pub(crate) async fn on_store<T: Send + 'static>(
    shared: &Arc<Shared>,
    work: impl FnOnce(&Shared) -> T + Send + 'static,
) -> Result<T, Response> {
    let shared = Arc::clone(shared);
    tokio::task::spawn_blocking(move || work(&shared))
        .await
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, format!("the store task failed: {e}")))
}

async fn healthz(State(shared): State<Arc<Shared>>) -> Response {
    match shared.store.health() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let rendered =
        on_store(&shared, |shared| shared.metrics.render(&shared.store.stats(), &shared.groups.lags())).await;
    match rendered {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(response) => response,
    }
}

/// What `/pending` asks for: a window, or one topic's key.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Window(std::ops::Range<u64>, usize),
    Key { topic: String, key: String, limit: usize },
}

/// `topic` and `key` together, or a window; with either, `limit`.
fn asked(query: &HashMap<String, String>) -> Result<Asked, String> {
    match (query.get("topic"), query.get("key")) {
        (None, None) => window(query).map(|(range, limit)| Asked::Window(range, limit)),
        (Some(topic), Some(key)) => {
            let mut rest = query.clone();
            rest.retain(|name, _| name != "topic" && name != "key");
            if let Some(name) = rest.keys().find(|k| k.as_str() != "limit") {
                return Err(format!("{name}: not a parameter with topic and key (limit)"));
            }
            let (_, limit) = window(&rest)?;
            Ok(Asked::Key { topic: topic.clone(), key: key.clone(), limit })
        }
        (Some(_), None) => Err("key: missing (a search by key names topic and key)".into()),
        (None, Some(_)) => Err("topic: missing (a search by key names topic and key)".into()),
    }
}

/// `from` and `to` (epoch ms, half-open, default: everything) and `limit`.
fn window(query: &HashMap<String, String>) -> Result<(std::ops::Range<u64>, usize), String> {
    let number = |name: &str, default: u64| match query.get(name) {
        None => Ok(default),
        Some(text) => {
            text.parse::<u64>().map_err(|_| format!("{name}: {text:?} is not a non-negative integer"))
        }
    };
    let from = number("from", 0)?;
    let to = number("to", MAX_DELIVER_AT_MS + 1)?;
    if from > to {
        return Err(format!("from: {from} is after to ({to})"));
    }
    let limit = number("limit", DEFAULT_LIMIT as u64)?;
    if limit == 0 || limit > MAX_LIMIT as u64 {
        return Err(format!("limit: {limit} is not from 1 to {MAX_LIMIT}"));
    }
    if let Some(unknown) = query.keys().find(|k| !["from", "to", "limit"].contains(&k.as_str())) {
        return Err(format!("{unknown}: not a parameter (from, to, limit)"));
    }
    Ok((from..to, limit as usize))
}

async fn pending(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let asked = match asked(&query) {
        Ok(asked) => asked,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let limit = match &asked {
        Asked::Window(_, limit) | Asked::Key { limit, .. } => *limit,
    };
    // One more than asked tells whether there are more.
    let found = on_store(&shared, move |shared| match asked {
        Asked::Window(window, limit) => shared.store.pending(window, limit + 1),
        Asked::Key { topic, key, limit } => shared.store.pending_by_key(&topic, &key, limit + 1),
    })
    .await;
    let mut timers = match found {
        Ok(Ok(timers)) => timers,
        Ok(Err(e @ delaywheel::Error::Invalid { .. })) => {
            return error(StatusCode::BAD_REQUEST, e.to_string());
        }
        Ok(Err(e)) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(response) => return response,
    };
    let more = timers.len() > limit;
    timers.truncate(limit);
    let timers: Vec<_> = timers
        .iter()
        .map(|t| {
            json!({
                "handle": t.handle.to_string(),
                "topic": &*t.topic,
                "queue": t.queue,
                "key": t.key,
                "dedup_key": t.dedup_key,
                "deliver_at_ms": t.deliver_at_ms,
                "level": t.delay_level,
                "wheel_level": t.wheel_level,
            })
        })
        .collect();
    axum::Json(json!({ "timers": timers, "more": more })).into_response()
}

/// What `/schedules` asks for: a topic, if any, or a topic's key; and a limit.
#[derive(Debug, PartialEq, Eq)]
struct SchedulesAsked {
    topic: Option<String>,
    key: Option<String>,
    limit: usize,
}

fn schedules_asked(query: &HashMap<String, String>) -> Result<SchedulesAsked, String> {
    if let Some(unknown) = query.keys().find(|k| !["topic", "key", "limit"].contains(&k.as_str())) {
        return Err(format!("{unknown}: not a parameter (topic, key, limit)"));
    }
    if query.contains_key("key") && !query.contains_key("topic") {
        return Err("topic: missing (a search by key names topic and key)".into());
    }
    let limit = match query.get("limit") {
        None => DEFAULT_LIMIT,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|limit| (1..=MAX_LIMIT).contains(limit))
            .ok_or_else(|| format!("limit: {text:?} is not from 1 to {MAX_LIMIT}"))?,
    };
    Ok(SchedulesAsked { topic: query.get("topic").cloned(), key: query.get("key").cloned(), limit })
}

/// `GET /schedules[?topic=T[&key=K]&limit=N]`: the active recurring
/// schedules, by next occurrence (paused ones last), as `Store::schedules`
/// (or with a key, `Store::schedules_by_key`) reads them.
async fn schedules(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let SchedulesAsked { topic, key, limit } = match schedules_asked(&query) {
        Ok(asked) => asked,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let found = on_store(&shared, move |shared| match (topic, key) {
        (Some(topic), Some(key)) => shared.store.schedules_by_key(&topic, &key, limit + 1),
        (topic, _) => shared.store.schedules(topic.as_deref(), limit + 1),
    })
    .await;
    let mut listed = match found {
        Ok(Ok(listed)) => listed,
        Ok(Err(e @ delaywheel::Error::Invalid { .. })) => {
            return error(StatusCode::BAD_REQUEST, e.to_string());
        }
        Ok(Err(e)) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(response) => return response,
    };
    let more = listed.len() > limit;
    listed.truncate(limit);
    let schedules: Vec<_> = listed.iter().filter_map(schedule_json).collect();
    axum::Json(json!({ "schedules": schedules, "more": more })).into_response()
}

fn schedule_json(timer: &delaywheel::PendingTimer) -> Option<serde_json::Value> {
    let schedule = timer.schedule.as_ref()?;
    let (recurrence, time_zone) = match &schedule.recurrence {
        Some(delaywheel::Recurrence::Cron { expression, time_zone }) => {
            (Some(expression.clone()), Some(time_zone))
        }
        Some(delaywheel::Recurrence::Every { period_ms }) => (Some(format!("@every {period_ms}ms")), None),
        None => (None, None),
    };
    Some(json!({
        "handle": timer.handle.to_string(),
        "topic": &*timer.topic,
        "queue": timer.queue,
        "key": timer.key,
        "dedup_key": timer.dedup_key,
        "recurrence": recurrence,
        "time_zone": time_zone,
        "next_at_ms": (!schedule.paused).then_some(timer.deliver_at_ms),
        "fired": schedule.fired,
        "paused": schedule.paused,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_bad_window_names_the_parameter() {
        for (pairs, names) in [
            (vec![("from", "x")], "from:"),
            (vec![("to", "-1")], "to:"),
            (vec![("from", "5"), ("to", "4")], "from:"),
            (vec![("limit", "0")], "limit:"),
            (vec![("limit", "10001")], "limit:"),
            (vec![("form", "1")], "form:"),
        ] {
            let err = window(&query(&pairs)).unwrap_err();
            assert!(err.starts_with(names), "{pairs:?}: {err}");
        }
        assert_eq!(window(&query(&[("from", "1"), ("to", "9"), ("limit", "3")])).unwrap(), (1..9, 3));
    }

    #[test]
    fn a_search_by_key_names_topic_and_key() {
        let by_key = asked(&query(&[("topic", "orders"), ("key", "order-42")])).unwrap();
        assert_eq!(
            by_key,
            Asked::Key { topic: "orders".into(), key: "order-42".into(), limit: DEFAULT_LIMIT }
        );
        for (pairs, names) in [
            (vec![("topic", "orders")], "key:"),
            (vec![("key", "order-42")], "topic:"),
            (vec![("topic", "orders"), ("key", "k"), ("from", "1")], "from:"),
            (vec![("topic", "orders"), ("key", "k"), ("limit", "0")], "limit:"),
        ] {
            let err = asked(&query(&pairs)).unwrap_err();
            assert!(err.starts_with(names), "{pairs:?}: {err}");
        }
    }
}
