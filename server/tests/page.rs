//! The operators' page in a real browser: headless Chromium, driven over
//! WebDriver (`chromedriver`), against an in-process server over a store
//! holding a known set of timers. The chart must show exactly the timers put
//! in the next five minutes, second by second; a search by key must list
//! its timer, and its Cancel button (confirmed in the dialog) must cancel
//! it: the library then finds it cancelled, and it never fires. A recurring
//! schedule is listed with its next occurrence, and its Pause button pauses it.
//!
//! Needs `chromium` and `chromedriver` (Debian's `chromium` and
//! `chromium-driver`, installed by `tools/browser/install.sh`, which `.ci/run`
//! calls). Without them the test prints SKIPPED and passes, unless
//! `DELAYWHEEL_BROWSER_TEST=required` (as `.ci/run` sets), when it fails.
//! The page's screenshot is saved as `target/tmp/page.png`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use delaywheel::{CancelOutcome, ManualClock, Message, Recurrence, Schedule, Store};
use delaywheel_server::{HandleKey, ServeOptions, Server, store_config};
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

const TOPIC: &str = "orders";
/// Timers due each second, from `AHEAD_FROM` seconds ahead for `SECONDS`.
const PER_SECOND: u64 = 5;
const AHEAD_FROM: u64 = 30;
const SECONDS: u64 = 240;

/// `name` on the PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// `chromedriver` on a free loopback port, stopped when dropped.
struct Driver {
    child: Child,
    addr: SocketAddr,
}

impl Driver {
    fn start(binary: &Path) -> Self {
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let child = Command::new(binary)
            .arg(format!("--port={}", addr.port()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let started = Instant::now();
        while TcpStream::connect(addr).is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "chromedriver does not listen on {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, addr }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn browser(driver: &Driver, chromium: &Path) -> Client {
    let options = json!({
        "binary": chromium,
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,1600"],
    });
    let capabilities = json!({ "browserName": "chrome", "goog:chromeOptions": options });
    let Value::Object(capabilities) = capabilities else { unreachable!() };
    ClientBuilder::new(HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://{}", driver.addr))
        .await
        .expect("a Chromium session")
}

/// Polls `script` (JavaScript returning a value) until `done` accepts it.
async fn wait_for(client: &Client, script: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let value = client.execute(script, vec![]).await.unwrap();
        if done(&value) {
            return value;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{script}: still {value}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_charts_the_wheel_and_cancels_a_timer_from_a_click() {
    let (Some(chromedriver), Some(chromium)) = (on_path("chromedriver"), on_path("chromium")) else {
        let required = std::env::var("DELAYWHEEL_BROWSER_TEST").is_ok_and(|v| v == "required");
        assert!(!required, "chromium and chromedriver are missing: run tools/browser/install.sh");
        println!(
            "SKIPPED: chromium or chromedriver not on the PATH (tools/browser/install.sh installs them)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64 / 1000 * 1000;
    let clock = ManualClock::new(now);
    let store = Store::open(store_config(dir.path()).with_clock(clock.clone())).unwrap();
    for second in AHEAD_FROM..AHEAD_FROM + SECONDS {
        for i in 0..PER_SECOND {
            let at = now + second * 1000 + i * 100;
            store.put(Message::new(TOPIC, "unpaid?").queue_id(0).deliver_at_ms(at)).unwrap();
        }
    }
    let hours = now + 2 * 3_600_000;
    for key in ["order-42", "order-7"] {
        store.put(Message::new(TOPIC, key).key(key).queue_id(0).deliver_at_ms(hours)).unwrap();
    }
    let report = Schedule::new(Message::new("reports", "daily").key("desk-7"), Recurrence::cron("@daily"))
        .start_at_ms(hours);
    let report = store.schedule(report).unwrap().handle();
    let options =
        ServeOptions { allow_cancel: true, ..ServeOptions::loopback(HandleKey::from_bytes([9; 32])) };
    let server = Server::bind(store, options).await.unwrap();
    let http = server.http_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));

    let driver = Driver::start(&chromedriver);
    let client = browser(&driver, &chromium).await;
    client.goto(&format!("http://{http}/")).await.unwrap();
    wait_for(&client, "return document.body.dataset.ready || null", |v| v == "1").await;

    // The 5-minute chart: one bar per second, each with the timers put in that second.
    let total = client.find(Locator::Id("chart-total")).await.unwrap().attr("data-count").await.unwrap();
    assert_eq!(total.as_deref(), Some("1200"), "the chart's total over the next 5 minutes");
    let bars = client
        .execute("return [...document.querySelectorAll('#chart rect.bar')].map(b => [+b.dataset.from, +b.dataset.count])", vec![])
        .await
        .unwrap();
    let bars: Vec<(u64, u64)> = serde_json::from_value(bars).unwrap();
    assert_eq!(bars.iter().map(|b| b.1).sum::<u64>(), SECONDS * PER_SECOND);
    for (from, count) in &bars {
        let second = (from - now) / 1000;
        assert!((AHEAD_FROM..AHEAD_FROM + SECONDS).contains(&second), "a bar at {second} s ahead");
        assert_eq!(*count, PER_SECOND, "the bar of second {second}");
    }

    // Search by key, then Cancel, confirmed in the dialog.
    client.find(Locator::Id("topic")).await.unwrap().send_keys(TOPIC).await.unwrap();
    client.find(Locator::Id("key")).await.unwrap().send_keys("order-42").await.unwrap();
    client.find(Locator::Css("#by-key button")).await.unwrap().click().await.unwrap();
    let rows = "return document.querySelectorAll('#results button.cancel').length";
    wait_for(&client, rows, |v| v == 1).await;
    let row = client.find(Locator::Css("#results tr:nth-child(2)")).await.unwrap().text().await.unwrap();
    assert!(row.contains("order-42") && row.contains(TOPIC), "{row}");
    let handle = client.find(Locator::Css("#results button.cancel")).await.unwrap().attr("data-handle").await;
    let handle: delaywheel::Handle = handle.unwrap().expect("a handle on the button").parse().unwrap();
    let screenshot = client.screenshot().await.unwrap();
    let saved = Path::new(env!("CARGO_TARGET_TMPDIR")).join("page.png");
    std::fs::write(&saved, screenshot).unwrap();
    println!("screenshot: {}", saved.display());
    client.find(Locator::Css("#results button.cancel")).await.unwrap().click().await.unwrap();
    client.accept_alert().await.unwrap();
    wait_for(&client, "return document.getElementById('found').textContent", |v| {
        v.as_str().is_some_and(|t| t.contains("cancelled"))
    })
    .await;

    // The schedule is listed, and paused from its button.
    let listed = "return document.querySelectorAll('#schedules button.pause').length";
    wait_for(&client, listed, |v| v == 1).await;
    let row = client.find(Locator::Css("#schedules tr:nth-child(2)")).await.unwrap().text().await.unwrap();
    assert!(row.contains("desk-7") && row.contains("@daily (UTC)") && row.contains("active"), "{row}");
    let next = (hours / 86_400_000 + 1) * 86_400_000;
    let shown = client
        .execute("return document.querySelector('#schedules tr:nth-child(2) td').textContent", vec![])
        .await
        .unwrap();
    let shown_ms = client
        .execute("return Date.parse(arguments[0].replace(' ', 'T') + 'Z')", vec![shown.clone()])
        .await
        .unwrap();
    assert_eq!(shown_ms.as_u64(), Some(next), "the next occurrence: {shown}");
    client.find(Locator::Css("#schedules button.pause")).await.unwrap().click().await.unwrap();
    wait_for(&client, "return document.getElementById('schedules-note').textContent", |v| {
        v.as_str().is_some_and(|t| t.contains("paused"))
    })
    .await;
    wait_for(&client, "return document.querySelectorAll('#schedules button.resume').length", |v| v == 1)
        .await;
    client.close().await.unwrap();
    drop(driver);
    stop.send(()).unwrap();
    served.await.unwrap().unwrap();

    // Through the library: cancelled, and past its time it never fires; its neighbour does.
    clock.set_ms(hours + 60_000);
    let store = Store::open(store_config(dir.path()).with_clock(clock.clone())).unwrap();
    assert_eq!(store.cancel(handle).unwrap(), CancelOutcome::Cancelled, "the page's cancel stands");
    assert!(store.pending_by_key(TOPIC, "order-42", 10).unwrap().is_empty());
    let paused = store.schedule_of(report).unwrap().and_then(|s| s.schedule).map(|s| s.paused);
    assert_eq!(paused, Some(true), "the page's pause stands");
    let mut consumer = store.consumer(TOPIC, 0).unwrap();
    let mut keys = Vec::new();
    let want = (SECONDS * PER_SECOND + 1) as usize;
    while keys.len() < want {
        let batch = consumer.poll(want - keys.len(), Duration::from_secs(10)).unwrap();
        assert!(!batch.is_empty(), "{} of {want} delivered", keys.len());
        keys.extend(batch.iter().map(|m| m.key().map(String::from)));
    }
    assert!(consumer.poll(1, Duration::from_millis(500)).unwrap().is_empty(), "nothing more fires");
    assert!(keys.contains(&Some("order-7".into())) && !keys.contains(&Some("order-42".into())));
    store.close().unwrap();
}
