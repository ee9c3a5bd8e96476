//! The emulator's own behaviour, against a small app that answers as an SDK would and checks
//! every call's signature: the event id's dedupe and its window, reruns past it, retries and
//! their limits (`X-Inngest-No-Retry`, `Retry-After`), answers that are not an SDK's, the failure
//! event, cancel, and the API's refusals (a wrong event key, a wrong bearer, bad bodies).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hmac::{KeyInit, Mac};
use redrive_inngest_emulator::{Emulator, RunStatus};
use serde_json::{Value, json};

/// What the app answers for each function: a closure of the attempt.
type Answer = Arc<dyn Fn(u64) -> Response + Send + Sync>;

#[derive(Clone)]
struct App {
    key: String,
    answers: Arc<Mutex<Vec<(String, Answer)>>>,
    /// (function, attempt, the signature verified) of every call.
    seen: Arc<Mutex<Vec<(String, u64, bool)>>>,
    /// Calls of `app-limited` in flight, and the most at once.
    in_flight: Arc<(std::sync::atomic::AtomicUsize, std::sync::atomic::AtomicUsize)>,
}

fn mac(key: &str, body: &[u8], t: &str) -> String {
    let key = key.splitn(3, '-').nth(2).unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(body);
    mac.update(t.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// As an SDK answers: its header, and its response signed.
fn sdk(status: StatusCode, key: &str, body: Value, headers: &[(&str, &str)]) -> Response {
    let bytes = body.to_string();
    let t = chrono::Utc::now().timestamp().to_string();
    let signature = format!("t={t}&s={}", mac(key, bytes.as_bytes(), &t));
    let mut response = (status, bytes).into_response();
    let h = response.headers_mut();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("x-inngest-sdk", "test:v1".parse().unwrap());
    h.insert("x-inngest-signature", signature.parse().unwrap());
    for (name, value) in headers {
        h.insert(axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
    }
    response
}

async fn call(State(app): State<App>, uri: axum::http::Uri, headers: HeaderMap, body: Bytes) -> Response {
    let function = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("fnId="))
        .unwrap_or_default()
        .to_owned();
    let signature = headers.get("x-inngest-signature").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let (t, s) = signature.split_once("&s=").unwrap_or_default();
    let verified = mac(&app.key, &body, t.trim_start_matches("t=")) == s;
    let request: Value = serde_json::from_slice(&body).unwrap();
    let attempt = request["ctx"]["attempt"].as_u64().unwrap();
    app.seen.lock().unwrap().push((function.clone(), attempt, verified));
    if !verified {
        return (StatusCode::UNAUTHORIZED, "bad signature").into_response();
    }
    if function == "app-limited" {
        use std::sync::atomic::Ordering::SeqCst;
        let now = app.in_flight.0.fetch_add(1, SeqCst) + 1;
        app.in_flight.1.fetch_max(now, SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        app.in_flight.0.fetch_sub(1, SeqCst);
    }
    let answer = app.answers.lock().unwrap().iter().find(|(f, _)| *f == function).map(|(_, a)| Arc::clone(a));
    match answer {
        Some(answer) => answer(attempt),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// An emulator and an app registered on it with `functions` (id, event, retries); the app's
/// answers are set with `answer`.
async fn setup(window: Duration, functions: &[(&str, &str, u32)]) -> (Emulator, App, String) {
    let emu = Emulator::builder().time_scale(0.0).dedupe_window(window).start_local().await.unwrap();
    let app = App {
        key: emu.signing_key().to_owned(),
        answers: Arc::default(),
        seen: Arc::default(),
        in_flight: Arc::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api/inngest", listener.local_addr().unwrap());
    let router = axum::Router::new().route("/api/inngest", axum::routing::post(call)).with_state(app.clone());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let configs: Vec<Value> = functions
        .iter()
        .map(|(id, event, retries)| {
            json!({ "id": id, "name": id, "triggers": [{ "event": event }], "concurrency": [{ "limit": 2 }],
                    "steps": { "step": { "id": "step", "name": "step",
                        "runtime": { "type": "http", "url": format!("{url}?fnId={id}&stepId=step") },
                        "retries": { "attempts": retries } } } })
        })
        .collect();
    let registered = reqwest::Client::new()
        .post(format!("{}/fn/register", emu.url()))
        .bearer_auth(emu.signing_key())
        .json(&json!({ "url": url, "v": "0.1", "appName": "test-app", "functions": configs }))
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status(), 200);
    (emu, app, url)
}

impl App {
    fn answer(&self, function: &str, answer: impl Fn(u64) -> Response + Send + Sync + 'static) {
        self.answers.lock().unwrap().push((function.to_owned(), Arc::new(answer)));
    }

    fn attempts(&self, function: &str) -> Vec<u64> {
        self.seen.lock().unwrap().iter().filter(|(f, _, _)| f == function).map(|(_, a, _)| *a).collect()
    }
}

async fn post_events(emu: &Emulator, key: &str, body: Value) -> (StatusCode, Value) {
    let response = reqwest::Client::new().post(format!("{}/e/{key}", emu.url())).json(&body).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn an_event_id_runs_a_function_once_within_the_window_and_again_after_it() {
    let (emu, app, _) = setup(Duration::from_millis(600), &[("app-charge", "shop/charge", 0)]).await;
    let key = app.key.clone();
    app.answer("app-charge", move |_| sdk(StatusCode::OK, &key, json!({ "charged": true }), &[]));
    let event = json!({ "name": "shop/charge", "id": "order-7", "data": { "cents": 1200 } });
    let (status, body) = post_events(&emu, emu.event_key(), json!([event.clone()])).await;
    assert_eq!(
        (status, body["status"].clone(), body["ids"].as_array().map(Vec::len)),
        (StatusCode::OK, json!(200), Some(1))
    );
    // A single object is taken too, and the same id within the window starts nothing.
    let (status, _) = post_events(&emu, emu.event_key(), event.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let runs = emu
        .wait_for_runs(Duration::from_secs(10), |r| r.iter().all(|r| r.status == RunStatus::Completed))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(emu.runs().len(), 1, "{runs:#?}");
    assert_eq!(runs[0].output, Some(json!({ "charged": true })));
    // Past the window the same id runs again; a rerun runs at once, window or not.
    tokio::time::sleep(Duration::from_millis(700)).await;
    post_events(&emu, emu.event_key(), json!([event])).await;
    let rerun = reqwest::Client::new()
        .post(format!("{}/v2/runs/{}/rerun", emu.url(), runs[0].id))
        .bearer_auth(emu.signing_key())
        .send()
        .await
        .unwrap();
    assert_eq!(rerun.status(), 200);
    let rerun: Value = rerun.json().await.unwrap();
    let runs = emu
        .wait_for_runs(Duration::from_secs(10), |r| r.len() == 3 && r.iter().all(|r| r.status == RunStatus::Completed))
        .await
        .unwrap();
    let new = runs.iter().find(|r| Some(r.id.as_str()) == rerun["data"]["run_id"].as_str()).expect("the rerun");
    assert_eq!(new.original_run_id.as_deref(), Some(runs[0].id.as_str()));
    assert!(app.seen.lock().unwrap().iter().all(|(_, _, verified)| *verified), "every call signed with the key");
}

#[tokio::test]
async fn errors_are_retried_to_the_functions_attempts_and_the_failure_event_follows() {
    let (emu, app, _) = setup(
        Duration::from_secs(60),
        &[
            ("app-flaky", "t/flaky", 2),
            ("app-final", "t/final", 5),
            ("app-after", "t/after", 3),
            ("app-notsdk", "t/notsdk", 1),
        ],
    )
    .await;
    let key = app.key.clone();
    app.answer("app-flaky", move |n| {
        sdk(StatusCode::INTERNAL_SERVER_ERROR, &key, json!({ "message": format!("boom {n}") }), &[])
    });
    let key = app.key.clone();
    app.answer("app-final", move |_| {
        sdk(
            StatusCode::INTERNAL_SERVER_ERROR,
            &key,
            json!({ "message": "for good" }),
            &[("x-inngest-no-retry", "true")],
        )
    });
    let key = app.key.clone();
    let started = Instant::now();
    app.answer("app-after", move |n| match n {
        0 => sdk(StatusCode::INTERNAL_SERVER_ERROR, &key, json!({}), &[("retry-after", "1")]),
        _ => sdk(StatusCode::OK, &key, json!(n), &[]),
    });
    // A 200 without the SDK's header is not the function's answer.
    app.answer("app-notsdk", |_| (StatusCode::OK, "{}").into_response());
    for name in ["t/flaky", "t/final", "t/after", "t/notsdk"] {
        post_events(&emu, emu.event_key(), json!([{ "name": name, "data": {} }])).await;
    }
    let runs = emu
        .wait_for_runs(Duration::from_secs(20), |runs| {
            runs.len() >= 4 && runs.iter().all(|r| r.status != RunStatus::Running)
        })
        .await
        .unwrap();
    let status = |f: &str| runs.iter().find(|r| r.function_id == f).map(|r| r.status);
    assert_eq!(app.attempts("app-flaky"), [0, 1, 2]);
    assert_eq!(status("app-flaky"), Some(RunStatus::Failed));
    assert_eq!(app.attempts("app-final"), [0], "X-Inngest-No-Retry: true ends the run");
    assert_eq!(app.attempts("app-after"), [0, 1]);
    assert_eq!(status("app-after"), Some(RunStatus::Completed));
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After was waited out at any time scale");
    assert_eq!(app.attempts("app-notsdk"), [0, 1]);
    assert_eq!(status("app-notsdk"), Some(RunStatus::Failed));
    let flaky = runs.iter().find(|r| r.function_id == "app-flaky").unwrap();
    assert_eq!(flaky.error, Some(json!({ "message": "boom 2" })), "the last error");

    // Each failed run is announced once, with its function, run, event and error.
    let failed: Vec<Value> = emu.events().into_iter().filter(|e| e["name"] == "inngest/function.failed").collect();
    assert_eq!(failed.len(), 3, "one for each failed run: {failed:#?}");
    let announced = failed.iter().find(|e| e["data"]["run_id"] == flaky.id.as_str()).expect("the flaky run's");
    assert_eq!(announced["data"]["function_id"], "app-flaky");
    assert_eq!(announced["data"]["event"]["name"], "t/flaky");
    assert_eq!(announced["data"]["error"], json!({ "message": "boom 2" }));
}

#[tokio::test]
async fn a_failure_handler_gets_the_failed_run_and_a_cancelled_run_is_not_called_again() {
    let (emu, app, url) = setup(Duration::from_secs(60), &[("app-slow", "t/slow", 4)]).await;
    // A failure handler, registered as the SDKs do.
    let failure = json!({ "id": "app-slow-failure", "name": "slow (failure)",
        "triggers": [{ "event": "inngest/function.failed", "expression": "event.data.function_id == 'app-slow'" }],
        "steps": { "step": { "id": "step", "name": "step",
            "runtime": { "type": "http", "url": format!("{url}?fnId=app-slow-failure&stepId=step") }, "retries": { "attempts": 0 } } } });
    let slow = json!({ "id": "app-slow", "name": "slow", "triggers": [{ "event": "t/slow" }],
        "steps": { "step": { "id": "step", "name": "step",
            "runtime": { "type": "http", "url": format!("{url}?fnId=app-slow&stepId=step") }, "retries": { "attempts": 4 } } } });
    let registered = reqwest::Client::new()
        .post(format!("{}/fn/register", emu.url()))
        .bearer_auth(emu.signing_key())
        .json(&json!({ "url": url, "appname": "test-app", "functions": [slow, failure] }))
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status(), 200, "the Python SDK's spelling, appname");
    let key = app.key.clone();
    app.answer("app-slow", move |n| {
        sdk(StatusCode::BAD_REQUEST, &key, json!({ "message": format!("refused {n}") }), &[])
    });
    let key = app.key.clone();
    app.answer("app-slow-failure", move |_| sdk(StatusCode::OK, &key, json!("noted"), &[]));
    post_events(&emu, emu.event_key(), json!([{ "name": "t/slow", "id": "e-1", "data": { "n": 1 } }])).await;
    let runs = emu
        .wait_for_runs(Duration::from_secs(10), |r| {
            r.iter().any(|r| r.function_id == "app-slow-failure" && r.status == RunStatus::Completed)
        })
        .await
        .unwrap();
    assert_eq!(app.attempts("app-slow"), [0], "a 4xx without the header is not retried");
    let handler = runs.iter().find(|r| r.function_id == "app-slow-failure").unwrap();
    let original = runs.iter().find(|r| r.function_id == "app-slow").unwrap();
    assert_eq!(handler.event["name"], "inngest/function.failed");
    assert_eq!(handler.event["data"]["function_id"], "app-slow");
    assert_eq!(handler.event["data"]["run_id"], original.id.as_str());
    assert_eq!(handler.event["data"]["event"]["id"], "e-1");
    assert_eq!(handler.event["data"]["error"], json!({ "message": "refused 0" }));
    assert_eq!(handler.output, Some(json!("noted")));

    // A run cancelled while it waits for its retry is not called again.
    let key = app.key.clone();
    app.answers.lock().unwrap().clear();
    app.answer("app-slow", move |_| sdk(StatusCode::INTERNAL_SERVER_ERROR, &key, json!({}), &[("retry-after", "2")]));
    post_events(&emu, emu.event_key(), json!([{ "name": "t/slow", "id": "e-2", "data": {} }])).await;
    let run = emu
        .wait_for_runs(Duration::from_secs(10), |r| r.iter().any(|r| r.event["id"] == "e-2"))
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.event["id"] == "e-2")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancelled = reqwest::Client::new()
        .delete(format!("{}/v1/runs/{}", emu.url(), run.id))
        .bearer_auth(emu.signing_key())
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 204);
    let before = app.attempts("app-slow").len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(app.attempts("app-slow").len(), before, "no call after the cancel");
    let got = emu.runs().into_iter().find(|r| r.id == run.id).unwrap();
    assert_eq!(got.status, RunStatus::Cancelled);
}

#[tokio::test]
async fn the_api_refuses_a_wrong_key_a_wrong_bearer_and_bodies_it_cannot_take() {
    let (emu, _app, _) = setup(Duration::from_secs(60), &[]).await;
    let (status, body) = post_events(&emu, "not-the-key", json!([{ "name": "a/b" }])).await;
    assert_eq!((status, body["status"].clone()), (StatusCode::UNAUTHORIZED, json!(401)));
    for bad in [json!([{ "data": {} }]), json!("text"), json!([{ "name": "inngest/function.failed" }])] {
        let (status, body) = post_events(&emu, emu.event_key(), bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(body["error"].as_str().is_some(), "{body}");
    }
    let http = reqwest::Client::new();
    for bearer in [None, Some("signkey-test-00"), Some("wrong")] {
        let mut request =
            http.post(format!("{}/fn/register", emu.url())).json(&json!({ "appName": "x", "functions": [] }));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        assert_eq!(request.send().await.unwrap().status(), 401, "{bearer:?}");
        let mut request = http.get(format!("{}/v1/runs/x", emu.url()));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        assert_eq!(request.send().await.unwrap().status(), 401, "{bearer:?}");
    }
    // The hashed bearer the SDKs send, with and without the prefix.
    let raw = hex::decode(emu.signing_key().splitn(3, '-').nth(2).unwrap()).unwrap();
    let hashed = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(raw));
    for bearer in [hashed.clone(), format!("signkey-test-{hashed}")] {
        let response = http.get(format!("{}/v1/runs/none", emu.url())).bearer_auth(bearer).send().await.unwrap();
        assert_eq!(response.status(), 404, "authorized, and no such run");
    }
    let refused = http
        .post(format!("{}/fn/register", emu.url()))
        .bearer_auth(emu.signing_key())
        .json(&json!({ "appName": "x", "functions": [{ "id": "no-steps" }] }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert!(Emulator::builder().start("0.0.0.0:0".parse().unwrap()).await.is_err(), "loopback only");
}

#[tokio::test]
async fn a_functions_concurrency_limit_holds_its_calls_in_flight() {
    let (emu, app, _) = setup(Duration::from_secs(60), &[("app-limited", "t/limited", 0)]).await;
    let key = app.key.clone();
    app.answer("app-limited", move |_| sdk(StatusCode::OK, &key, json!(null), &[]));
    let events: Vec<Value> = (0..8).map(|n| json!({ "name": "t/limited", "data": { "n": n } })).collect();
    post_events(&emu, emu.event_key(), Value::Array(events)).await;
    let runs = emu
        .wait_for_runs(Duration::from_secs(10), |r| r.len() == 8 && r.iter().all(|r| r.status == RunStatus::Completed))
        .await
        .unwrap();
    assert_eq!(runs.len(), 8);
    let most = app.in_flight.1.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(most, 2, "a limit of 2: at most two calls in flight, and two reached");
}
