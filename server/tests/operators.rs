//! The JSON behind the operators' page, over HTTP against an in-process
//! server: counts by due time, search by key, cancel and reschedule (off
//! without `allow_cancel`), and the answers to bad input.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::{http, http_get, http_with};
use delaywheel::{Message, Recurrence, Schedule, Store};
use delaywheel_server::{HandleKey, ServeOptions, Server, store_config};
use serde_json::Value;

struct Running {
    http: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<Result<(), delaywheel_server::ServeError>>,
}

async fn serve(store: Store, allow_cancel: bool) -> Running {
    let options = ServeOptions { allow_cancel, ..ServeOptions::loopback(HandleKey::from_bytes([5; 32])) };
    let server = Server::bind(store, options).await.unwrap();
    let http = server.http_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let served = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    Running { http, stop, served }
}

impl Running {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.served.await.unwrap().unwrap();
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test]
async fn counts_search_cancel_and_reschedule_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(store_config(dir.path())).unwrap();
    let from = now_ms() / 1000 * 1000 + 60_000;
    for i in 0..120u64 {
        store.put(Message::new("orders", "m").deliver_at_ms(from + i * 1_000 + i % 7)).unwrap();
    }
    let keyed = Message::new("orders", "pay?").key("order-42").deliver_at_ms(from + 3_600_000);
    let handle = store.put(keyed).unwrap().handle().unwrap().to_string();
    let server = serve(store, true).await;

    let (status, body) =
        http_get(server.http, &format!("/pending/counts?from={from}&step=1000&buckets=120")).await;
    assert!(status.ends_with("200 OK"), "{status}: {body}");
    let counts = json(&body);
    assert_eq!(counts["counts"].as_array().unwrap().len(), 120);
    assert!(counts["counts"].as_array().unwrap().iter().all(|c| c == 1), "one timer a second: {body}");
    assert_eq!((counts["before"].as_u64(), counts["after"].as_u64()), (Some(0), Some(1)));

    let (status, body) = http_get(server.http, "/pending?topic=orders&key=order-42").await;
    assert!(status.ends_with("200 OK"), "{status}: {body}");
    let found = json(&body);
    assert_eq!(found["timers"][0]["handle"], handle.as_str(), "{body}");

    let (_, overview) = http_get(server.http, "/overview").await;
    let overview = json(&overview);
    assert_eq!(overview["pending"], 121);
    assert_eq!(overview["allow_cancel"], true);

    let later = from + 7_200_000;
    let reschedule = format!(r#"{{"deliver_at_ms": {later}}}"#);
    let (status, body) =
        http(server.http, "POST", &format!("/timers/{handle}/reschedule"), &reschedule).await;
    assert!(status.ends_with("200 OK") && body.contains("rescheduled"), "{status}: {body}");
    let (_, found) = http_get(server.http, "/pending?topic=orders&key=order-42").await;
    assert_eq!(json(&found)["timers"][0]["deliver_at_ms"], later, "the new time, the same handle");

    let (status, body) = http(server.http, "POST", &format!("/timers/{handle}/cancel"), "").await;
    assert!(status.ends_with("200 OK") && body.contains(r#""outcome":"cancelled""#), "{status}: {body}");
    let (_, found) = http_get(server.http, "/pending?topic=orders&key=order-42").await;
    assert_eq!(json(&found)["timers"].as_array().unwrap().len(), 0, "cancelled: no longer pending");
    let (status, body) =
        http(server.http, "POST", &format!("/timers/{handle}/reschedule"), &reschedule).await;
    assert!(status.ends_with("409 Conflict") && body.contains("cancelled"), "{status}: {body}");

    for (method, path, body, answer, names) in [
        ("POST", "/timers/nonsense/cancel", "", "400", "handle"),
        ("POST", "/timers/7@1700000000000/cancel", "", "404", "not_found"),
        ("POST", &format!("/timers/{handle}/reschedule") as &str, "{}", "400", "deliver_at_ms"),
        ("GET", "/pending/counts?step=1000", "", "400", "buckets"),
        ("GET", "/pending/counts?step=1000&buckets=99999", "", "400", "buckets"),
        ("GET", "/pending?topic=orders", "", "400", "key"),
    ] {
        let (status, text) = http(server.http, method, path, body).await;
        assert!(status.contains(answer) && text.contains(names), "{method} {path}: {status}: {text}");
    }
    let (status, page) = http_get(server.http, "/").await;
    assert!(status.ends_with("200 OK") && page.contains("<svg id=\"chart\""), "{status}");
    // Nothing from elsewhere: no script, style or image by URL; the one URL is SVG's namespace name.
    assert!(!page.contains(" src=") && !page.contains(" href=") && !page.contains("@import"));
    assert_eq!(page.matches("http").count(), page.matches("http://www.w3.org/2000/svg").count());
    server.stop().await;
}

#[tokio::test]
async fn schedules_lists_the_active_ones_and_names_a_bad_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(store_config(dir.path())).unwrap();
    let later = now_ms() + 3_600_000;
    let hourly = Schedule::new(Message::new("reports", "r").key("desk-7"), Recurrence::cron("@hourly"))
        .start_at_ms(later);
    let hourly = store.schedule(hourly).unwrap().handle();
    let every =
        Schedule::new(Message::new("polls", "p"), Recurrence::every(std::time::Duration::from_secs(10)))
            .start_at_ms(later);
    let paused = store.schedule(every).unwrap().handle();
    assert_eq!(store.pause_schedule(paused).unwrap(), delaywheel::PauseOutcome::Paused);
    store.put(Message::new("orders", "plain").deliver_at_ms(later)).unwrap();
    store.fresh_stats().unwrap();
    let server = serve(store, false).await;

    let (status, body) = http_get(server.http, "/schedules").await;
    assert!(status.contains("200"), "{status}: {body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    let listed = doc["schedules"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{doc}");
    assert_eq!(listed[0]["handle"], hourly.to_string());
    assert_eq!((&listed[0]["recurrence"], &listed[0]["time_zone"]), (&"@hourly".into(), &"UTC".into()));
    assert_eq!(
        (&listed[0]["key"], &listed[0]["fired"], &listed[0]["paused"]),
        (&"desk-7".into(), &0.into(), &false.into())
    );
    assert!(listed[0]["next_at_ms"].as_u64().unwrap() >= later);
    assert_eq!((&listed[1]["handle"], &listed[1]["paused"]), (&paused.to_string().into(), &true.into()));
    assert_eq!(
        (&listed[1]["recurrence"], &listed[1]["next_at_ms"]),
        (&"@every 10000ms".into(), &Value::Null)
    );
    let (_, body) = http_get(server.http, "/schedules?topic=polls&limit=1").await;
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((doc["schedules"].as_array().unwrap().len(), &doc["more"]), (1, &false.into()));
    let (_, body) = http_get(server.http, "/schedules?limit=1").await;
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["more"], true);
    let (_, metrics) = http_get(server.http, "/metrics").await;
    assert!(metrics.contains("delaywheel_schedule_occurrences_total 0"), "{metrics}");
    assert!(metrics.contains("delaywheel_schedules_active 2\n"), "{metrics}");
    assert!(metrics.contains("delaywheel_schedules_paused 1\n"), "{metrics}");
    for (path, names) in [("/schedules?limit=0", "limit:"), ("/schedules?from=1", "from:")] {
        let (status, body) = http_get(server.http, path).await;
        assert!(status.contains("400") && body.contains(names), "{path}: {status} {body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn schedules_are_found_by_key_paused_resumed_and_cancelled_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(store_config(dir.path())).unwrap();
    let later = now_ms() + 3_600_000;
    let hourly = Schedule::new(Message::new("reports", "r").key("desk-7"), Recurrence::cron("@hourly"))
        .start_at_ms(later);
    let handle = store.schedule(hourly).unwrap().handle();
    let other = Schedule::new(Message::new("reports", "o").key("desk-8"), Recurrence::cron("@daily"));
    store.schedule(other).unwrap();
    let server = serve(store, true).await;

    let (_, body) = http_get(server.http, "/schedules?topic=reports&key=desk-7").await;
    let listed = json(&body)["schedules"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1, "{body}");
    assert_eq!(listed[0]["handle"], handle.to_string());
    let (status, body) = http_get(server.http, "/schedules?key=desk-7").await;
    assert!(status.contains("400") && body.contains("topic:"), "{status}: {body}");

    let post = |action: &str| format!("/schedules/{handle}/{action}");
    for (action, answer, outcome) in [
        ("pause", "200", "paused"),
        ("pause", "200", "unchanged"),
        ("resume", "200", "resumed"),
        ("cancel", "200", "cancelled"),
        ("pause", "409", "cancelled"),
        ("cancel", "200", "cancelled"),
    ] {
        let (status, body) = http(server.http, "POST", &post(action), "").await;
        assert!(status.contains(answer) && json(&body)["outcome"] == outcome, "{action}: {status}: {body}");
    }
    let (_, overview) = http_get(server.http, "/overview").await;
    assert_eq!(json(&overview)["schedules"], serde_json::json!({ "active": 1, "paused": 0 }));
    for (path, answer) in [
        ("/schedules/1@2/pause".to_string(), "404"),
        (format!("/schedules/{handle}/stop"), "404"),
        ("/schedules/nonsense/pause".to_string(), "400"),
    ] {
        let (status, body) = http(server.http, "POST", &path, "").await;
        assert!(status.contains(answer), "{path}: {status}: {body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn without_allow_cancel_the_mutating_endpoints_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(store_config(dir.path())).unwrap();
    let timer = store.put(Message::new("orders", "m").deliver_at_ms(now_ms() + 3_600_000)).unwrap();
    let handle = timer.handle().unwrap();
    let server = serve(store, false).await;
    let (status, body) = http(server.http, "POST", &format!("/timers/{handle}/cancel"), "").await;
    assert!(status.contains("403") && body.contains("--allow-cancel"), "{status}: {body}");
    let (status, _) =
        http(server.http, "POST", &format!("/timers/{handle}/reschedule"), r#"{"deliver_at_ms": 1}"#).await;
    assert!(status.contains("403"), "{status}");
    for action in ["pause", "resume", "cancel"] {
        let (status, _) = http(server.http, "POST", &format!("/schedules/{handle}/{action}"), "").await;
        assert!(status.contains("403"), "{action}: {status}");
    }
    let (_, found) = http_get(server.http, "/pending").await;
    assert_eq!(json(&found)["timers"][0]["handle"], handle.to_string(), "still pending");
    server.stop().await;
}

#[tokio::test]
async fn other_sites_can_neither_change_nor_read_nor_frame() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(store_config(dir.path())).unwrap();
    let timer = store.put(Message::new("orders", "m").deliver_at_ms(now_ms() + 3_600_000)).unwrap();
    let handle = timer.handle().unwrap();
    let server = serve(store, true).await;
    let addr = server.http;
    let cancel = format!("/timers/{handle}/cancel");
    let reschedule = format!("/timers/{handle}/reschedule");
    // A form posted by another site's page.
    let form = format!(
        "Host: {addr}\r\nOrigin: http://evil.example\r\nContent-Type: application/x-www-form-urlencoded\r\n"
    );
    let (head, _) = http_with(addr, "POST", &cancel, &form, "").await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    // A "simple" cross-site request whose text/plain body is JSON, without an Origin.
    let plain = format!("Host: {addr}\r\nContent-Type: text/plain\r\n");
    let (head, _) = http_with(addr, "POST", &reschedule, &plain, r#"{"deliver_at_ms": 1}"#).await;
    assert!(head.starts_with("HTTP/1.1 415"), "{head}");
    let cross = format!("Host: {addr}\r\nSec-Fetch-Site: cross-site\r\nContent-Type: application/json\r\n");
    let (head, _) = http_with(addr, "POST", &cancel, &cross, "").await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    // DNS rebinding: the browser sends the attacker's name as the Host.
    let rebound = "Host: evil.example:8080\r\n";
    let (head, _) = http_with(addr, "GET", "/pending", rebound, "").await;
    assert!(head.starts_with("HTTP/1.1 421"), "{head}");
    let (_, found) = http_get(addr, "/pending").await;
    assert_eq!(json(&found)["timers"][0]["handle"], handle.to_string(), "still pending");
    assert_eq!(json(&found)["timers"][0]["deliver_at_ms"], timer.deliver_at_ms().unwrap(), "not rescheduled");
    // The page cannot be framed.
    let (head, _) = http_with(addr, "GET", "/", &format!("Host: {addr}\r\n"), "").await;
    assert!(head.to_ascii_lowercase().contains("content-security-policy: frame-ancestors 'none'"), "{head}");
    // The same requests from the page itself still work.
    let own = format!("Host: {addr}\r\nOrigin: http://{addr}\r\nContent-Type: application/json\r\n");
    let (head, body) = http_with(addr, "POST", &cancel, &own, "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}: {body}");
    server.stop().await;
}
