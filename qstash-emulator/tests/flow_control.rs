//! Flow control (`Upstash-Flow-Control-Key` / `-Value`) over real HTTP: a destination on
//! 127.0.0.1 that is slow and counts the deliveries it has open at once and when each started.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redrive_qstash_emulator::{Emulator, RunningEmulator};
use serde_json::{Value, json};

const TOKEN: &str = "test-token";

async fn emulator() -> RunningEmulator {
    Emulator::builder().token(TOKEN).time_scale(0.01).start_local().await.unwrap()
}

/// What the destination saw on one path: deliveries open now, the most open at once, the starts.
#[derive(Default)]
struct Seen {
    open: usize,
    peak: usize,
    starts: Vec<Instant>,
}

/// A destination whose every answer takes `slow`; `seen(path)` tells what one path saw.
#[derive(Clone)]
struct SlowDestination {
    base: String,
    seen: Arc<Mutex<std::collections::HashMap<String, Seen>>>,
}

impl SlowDestination {
    async fn start(slow: Duration) -> SlowDestination {
        let seen: Arc<Mutex<std::collections::HashMap<String, Seen>>> = Arc::default();
        let state = seen.clone();
        let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
            let seen = state.clone();
            async move {
                let path = uri.path().to_owned();
                {
                    let mut all = seen.lock().unwrap();
                    let s = all.entry(path.clone()).or_default();
                    s.open += 1;
                    s.peak = s.peak.max(s.open);
                    s.starts.push(Instant::now());
                }
                tokio::time::sleep(slow).await;
                seen.lock().unwrap().get_mut(&path).unwrap().open -= 1;
                "ok"
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        SlowDestination { base: format!("http://{addr}"), seen }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// (peak open at once, start times) of `path`.
    fn seen(&self, path: &str) -> (usize, Vec<Instant>) {
        let all = self.seen.lock().unwrap();
        all.get(path).map_or((0, vec![]), |s| (s.peak, s.starts.clone()))
    }

    /// Waits until `path` saw `n` starts and none is open; panics after `timeout`.
    async fn wait_done(&self, path: &str, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let all = self.seen.lock().unwrap();
                if all.get(path).is_some_and(|s| s.starts.len() >= n && s.open == 0) {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "{path}: {n} deliveries did not finish in {timeout:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn publish(emu: &RunningEmulator, url: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut request =
        reqwest::Client::new().post(format!("{}/v2/publish/{url}", emu.url())).bearer_auth(TOKEN).body("{}");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(emu: &RunningEmulator, path: &str) -> (u16, Value) {
    let response = reqwest::Client::new().get(format!("{}{path}", emu.url())).bearer_auth(TOKEN).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallelism_caps_a_keys_deliveries_in_flight_and_the_rest_wait() {
    let emu = emulator().await;
    // Each delivery takes long enough that none ends while the twelve are published and the key
    // is read, even on a loaded machine (at 500 ms, two had ended there once).
    let dest = SlowDestination::start(Duration::from_secs(2)).await;
    let fc = [("Upstash-Flow-Control-Key", "emails"), ("Upstash-Flow-Control-Value", "parallelism=2")];
    for _ in 0..8 {
        assert_eq!(publish(&emu, &dest.url("/limited"), &fc).await.0, 201);
    }
    // The same destination without a key is not held: the destination is not what limits.
    for _ in 0..4 {
        assert_eq!(publish(&emu, &dest.url("/free"), &[]).await.0, 201);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, key) = get(&emu, "/v2/flowControl/emails").await;
    assert_eq!(status, 200);
    assert_eq!(key["parallelismMax"], json!(2));
    assert_eq!(key["parallelismCount"], json!(2), "{key}");
    assert_eq!(key["waitListSize"], json!(6), "the rest wait: {key}");

    dest.wait_done("/limited", 8, Duration::from_secs(30)).await;
    dest.wait_done("/free", 4, Duration::from_secs(30)).await;
    let (peak, starts) = dest.seen("/limited");
    assert_eq!(peak, 2, "never more than 2 in flight, and the limit is used");
    assert_eq!(starts.len(), 8, "every message delivered once: waiting is not a failure");
    assert_eq!(dest.seen("/free").0, 4, "messages without a key all run at once");
    assert!(emu.deliveries().iter().all(|d| d.delivered() && d.retried == 0), "no retry was spent on waiting");
    let (_, key) = get(&emu, "/v2/flowControl/emails").await;
    assert_eq!((key["parallelismCount"].clone(), key["waitListSize"].clone()), (json!(0), json!(0)));
    assert_eq!(get(&emu, "/v2/flowControl/unknown").await.0, 404);
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_starts_at_most_rate_deliveries_per_period() {
    let emu = emulator().await;
    let dest = SlowDestination::start(Duration::from_millis(10)).await;
    let fc = [("Upstash-Flow-Control-Key", "api"), ("Upstash-Flow-Control-Value", "rate=3, period=1s")];
    let began = Instant::now();
    for _ in 0..9 {
        assert_eq!(publish(&emu, &dest.url("/rated"), &fc).await.0, 201);
    }
    dest.wait_done("/rated", 9, Duration::from_secs(10)).await;
    let (_, mut starts) = dest.seen("/rated");
    starts.sort();
    // Windows of one second, each opened as the last closed: 3 at once, then 3 a second later.
    let first = starts[0];
    assert!(starts[2] - first < Duration::from_millis(500), "the first window's 3 start at once");
    for k in 1..3 {
        let since = starts[3 * k] - first;
        assert!(since >= Duration::from_millis(950), "start {} came {since:?} after the first", 3 * k);
        assert!(since >= Duration::from_millis(950) * k as u32, "window {k} opened at {since:?}");
    }
    assert!(began.elapsed() < Duration::from_secs(5), "the rate is kept, not exceeded the other way");
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_message_shows_its_flow_control() {
    let emu = emulator().await;
    let dest = SlowDestination::start(Duration::from_millis(200)).await;
    let fc = [
        ("Upstash-Flow-Control-Key", "k"),
        ("Upstash-Flow-Control-Value", "parallelism=1,rate=10,period=1m"),
        ("Upstash-Not-Before", "4102444800"),
    ];
    let (_, published) = publish(&emu, &dest.url("/later"), &fc).await;
    let id = published["messageId"].as_str().unwrap();
    let (status, message) = get(&emu, &format!("/v2/messages/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(message["flowControlKey"], json!("k"));
    assert_eq!((message["parallelism"].clone(), message["rate"].clone()), (json!(1), json!(10)));
    assert_eq!(message["period"], json!(60), "the period in seconds, as QStash shows it");
    emu.shutdown().await;
}

#[tokio::test]
async fn flow_control_headers_qstash_cannot_read_are_refused() {
    let emu = emulator().await;
    let url = "http://127.0.0.1:9/x";
    let key = ("Upstash-Flow-Control-Key", "k");
    for value in ["parallelism=0", "rate=2, period=500ms", "rate=2, period=1.5s", "rate=1, period=8d", "speed=3", "3"] {
        let (status, body) = publish(&emu, url, &[key, ("Upstash-Flow-Control-Value", value)]).await;
        assert_eq!(status, 400, "{value}: {body}");
        assert!(body["error"].as_str().unwrap().contains("Upstash-Flow-Control-Value"), "{body}");
    }
    assert_eq!(publish(&emu, url, &[key]).await.0, 400, "a key without limits");
    assert_eq!(publish(&emu, url, &[("Upstash-Flow-Control-Value", "parallelism=1")]).await.0, 400);
    for value in ["rate=2, period=90", "parallelism=1, period=2m", "rate=5,period=7d"] {
        assert_eq!(publish(&emu, url, &[key, ("Upstash-Flow-Control-Value", value)]).await.0, 201, "{value}");
    }
    assert_eq!(emu.messages_accepted(), 3, "nothing refused was kept");
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_message_keeps_its_own_limits_so_the_highest_passes_while_they_mix() {
    let emu = emulator().await;
    let dest = SlowDestination::start(Duration::from_millis(600)).await;
    let key = ("Upstash-Flow-Control-Key", "mixed");
    for value in ["parallelism=1", "parallelism=1", "parallelism=3", "parallelism=3"] {
        let (status, _) = publish(&emu, &dest.url("/mixed"), &[key, ("Upstash-Flow-Control-Value", value)]).await;
        assert_eq!(status, 201);
    }
    dest.wait_done("/mixed", 4, Duration::from_secs(10)).await;
    let (peak, starts) = dest.seen("/mixed");
    assert_eq!(peak, 3, "the newer messages' parallelism of 3 passed while an older one of 1 waited");
    let mut starts = starts;
    starts.sort();
    assert!(starts[3] - starts[0] >= Duration::from_millis(550), "the second old message waited for its 1");
    let (_, state) = get(&emu, "/v2/flowControl/mixed").await;
    assert_eq!(state["parallelismMax"], json!(3), "the key shows its latest message's limits");
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_for_its_retry_does_not_hold_its_keys_parallelism() {
    let emu = emulator().await;
    // /fail answers 500 with a long Retry-After; /ok answers at once.
    let ok_seen = Arc::new(Mutex::new(None::<Instant>));
    let seen = ok_seen.clone();
    let app = axum::Router::new()
        .route(
            "/fail",
            axum::routing::post(|| async {
                (axum::http::StatusCode::INTERNAL_SERVER_ERROR, [("Retry-After", "60")], "down")
            }),
        )
        .route(
            "/ok",
            axum::routing::post(move || {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().get_or_insert_with(Instant::now);
                    "ok"
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let fc = [("Upstash-Flow-Control-Key", "one-at-a-time"), ("Upstash-Flow-Control-Value", "parallelism=1")];
    let started = Instant::now();
    assert_eq!(publish(&emu, &format!("{base}/fail"), &fc).await.0, 201);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(publish(&emu, &format!("{base}/ok"), &fc).await.0, 201);
    let deadline = Instant::now() + Duration::from_secs(5);
    while ok_seen.lock().unwrap().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivered = *ok_seen.lock().unwrap();
    assert!(
        delivered.is_some_and(|at| at.duration_since(started) < Duration::from_secs(5)),
        "the second message is delivered while the first waits a minute for its retry"
    );
    emu.shutdown().await;
}
