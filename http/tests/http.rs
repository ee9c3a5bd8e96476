//! The layer in an axum app on a real listener, with reqwest, on PostgreSQL's effect ledger
//! (and SQLite's and the memory backend's).

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use redrive_core::kit::{Begin, Hold, Ledger};
use redrive_core::{IdempotencyKey, MemoryBackend, ProviderKey};
use redrive_http::{Idempotency, IdempotencyScope};
use redrive_postgres::{PgBackend, PgConfig};
use serde_json::Value;

/// Charges made, as the provider would count them, and the chunks of streamed answers sent.
#[derive(Default)]
struct Charges {
    made: AtomicU32,
    chunks_sent: AtomicU32,
}

/// Charges `amount`; a negative amount is declined (402); `slow` takes 600 ms after the charge;
/// `big` answers 100 KiB.
async fn charge(State(charges): State<Arc<Charges>>, body: String) -> Response {
    let n = charges.made.fetch_add(1, Ordering::SeqCst) + 1;
    if body.contains("slow") {
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    if body.contains("-") {
        return (StatusCode::PAYMENT_REQUIRED, [(header::CONTENT_TYPE, "application/json")], r#"{"error":"declined"}"#)
            .into_response();
    }
    if body.contains("big") {
        return (StatusCode::CREATED, "x".repeat(100 * 1024)).into_response();
    }
    let headers = [(header::CONTENT_TYPE, "application/json"), (header::LOCATION, "/charges/1")];
    (StatusCode::CREATED, headers, format!(r#"{{"charge":{n}}}"#)).into_response()
}

/// The application's authentication: the client named by a header, as a scope.
async fn authenticate(mut request: Request, next: Next) -> Response {
    if let Some(client) = request.headers().get("x-client").and_then(|v| v.to_str().ok()) {
        let scope = IdempotencyScope(client.to_owned());
        request.extensions_mut().insert(scope);
    }
    next.run(request).await
}

/// Charges once, then answers eight chunks 100 ms apart (800 ms in all), counting them.
async fn charge_streamed(State(charges): State<Arc<Charges>>) -> Response {
    charges.made.fetch_add(1, Ordering::SeqCst);
    let chunks = futures_util::stream::unfold(0, move |i| {
        let charges = Arc::clone(&charges);
        async move {
            if i == 8 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            charges.chunks_sent.fetch_add(1, Ordering::SeqCst);
            Some((Ok::<_, Infallible>(format!("chunk {i}\n")), i + 1))
        }
    });
    (StatusCode::CREATED, Body::from_stream(chunks)).into_response()
}

/// Panics before it answers (`early`) or after the first chunk of its body.
async fn charge_and_panic(State(charges): State<Arc<Charges>>, body: String) -> Response {
    charges.made.fetch_add(1, Ordering::SeqCst);
    assert!(!body.contains("early"), "the handler panics before it answers");
    let chunks = futures_util::stream::unfold(0, |i| async move {
        assert!(i == 0, "the handler's body panics after its first chunk");
        Some((Ok::<_, Infallible>("the first chunk"), i + 1))
    });
    (StatusCode::CREATED, Body::from_stream(chunks)).into_response()
}

/// The application on `layer`, on a listener of its own; its base URL.
async fn serve_with<L: Ledger + 'static>(layer: Idempotency<L>, charges: Arc<Charges>) -> String {
    let app = Router::new()
        .route("/charges", post(charge).get(|| async { "list" }))
        .route("/streamed", post(charge_streamed))
        .route("/panics", post(charge_and_panic))
        .layer(layer)
        .layer(middleware::from_fn(authenticate))
        .with_state(charges);
    listen(app).await
}

async fn listen(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn serve<L: Ledger + 'static>(ledger: L, charges: Arc<Charges>) -> String {
    serve_with(Idempotency::new(ledger).required().hold(Duration::from_secs(5)), charges).await
}

async fn post_charge(url: &str, key: Option<&str>, body: &str, client: &str) -> (StatusCode, HeaderMap, String) {
    post_to(&format!("{url}/charges"), key, body, client).await
}

async fn post_to(url: &str, key: Option<&str>, body: &str, client: &str) -> (StatusCode, HeaderMap, String) {
    let mut request = reqwest::Client::new().post(url).header("x-client", client).body(body.to_owned());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, response.text().await.unwrap())
}

fn made(charges: &Charges) -> u32 {
    charges.made.load(Ordering::SeqCst)
}

/// Waits (10 s at most) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    common::until(what, 10, done).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_gets_the_first_response_and_the_handler_runs_once() {
    let (ledger, charges) = (common::database("http").await, Arc::new(Charges::default()));
    let url = serve(ledger.clone(), Arc::clone(&charges)).await;

    let (status, headers, body) = post_charge(&url, Some("k-1"), r#"{"amount":5}"#, "acme").await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, r#"{"charge":1}"#));
    assert!(headers.get("idempotent-replayed").is_none());
    let (status, headers, body) = post_charge(&url, Some("k-1"), r#"{"amount":5}"#, "acme").await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, r#"{"charge":1}"#), "the stored response");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        (&headers[header::LOCATION], &headers[header::CONTENT_TYPE]),
        (&"/charges/1".parse().unwrap(), &"application/json".parse().unwrap())
    );
    assert_eq!(made(&charges), 1, "charged once");

    // The same key with another body, or another path: 422, nothing run.
    let (status, _, _) = post_charge(&url, Some("k-1"), r#"{"amount":6}"#, "acme").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    // Another client's equal key is its own.
    let (status, _, body) = post_charge(&url, Some("k-1"), r#"{"amount":5}"#, "globex").await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, r#"{"charge":2}"#));
    // No key on a route that requires one, or a malformed one: 400.
    assert_eq!(post_charge(&url, None, "{}", "acme").await.0, StatusCode::BAD_REQUEST);
    assert_eq!(post_charge(&url, Some("two words"), "{}", "acme").await.0, StatusCode::BAD_REQUEST);
    // GET passes through, key or not.
    let get = reqwest::Client::new().get(format!("{url}/charges")).header("Idempotency-Key", "k-1").send().await;
    assert_eq!(get.unwrap().text().await.unwrap(), "list");
    assert_eq!(made(&charges), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_request_is_replayed_as_failed_and_large_bodies_are_not_kept() {
    let (ledger, charges) = (common::database("http").await, Arc::new(Charges::default()));
    let url = serve(ledger, Arc::clone(&charges)).await;
    for _ in 0..2 {
        let (status, _, body) = post_charge(&url, Some("declined"), r#"{"amount":-1}"#, "acme").await;
        assert_eq!((status, body.as_str()), (StatusCode::PAYMENT_REQUIRED, r#"{"error":"declined"}"#));
    }
    assert_eq!(made(&charges), 1, "the failure is the answer: not run again");

    let (status, _, body) = post_charge(&url, Some("big"), "big", "acme").await;
    assert_eq!((status, body.len()), (StatusCode::CREATED, 100 * 1024), "the first gets it whole");
    let (status, headers, body) = post_charge(&url, Some("big"), "big", "acme").await;
    assert_eq!((status, body.len()), (StatusCode::CREATED, 0), "over 64 KiB: not kept");
    assert_eq!(headers["idempotent-body-omitted"], "true");
    assert_eq!(made(&charges), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_repeats_on_two_app_instances_sharing_postgres_run_once() {
    let first = common::database("http").await;
    let schema = first.schema().to_owned();
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let second = PgBackend::connect(PgConfig::new(url).with_schema(schema).with_max_connections(4)).await.unwrap();
    let charges = Arc::new(Charges::default());
    let (a, b) = (serve(first, Arc::clone(&charges)).await, serve(second, Arc::clone(&charges)).await);

    let body = r#"{"amount":5,"slow":true}"#;
    let (one, two) =
        tokio::join!(post_charge(&a, Some("k-slow"), body, "acme"), post_charge(&b, Some("k-slow"), body, "acme"));
    let mut statuses = [one.0, two.0];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::CREATED, StatusCode::CONFLICT], "one runs, the other is told to wait");
    let busy = if one.0 == StatusCode::CONFLICT { &one } else { &two };
    assert!(busy.1.contains_key(header::RETRY_AFTER));
    // Once the first answered, a repeat on either instance gets its response.
    let (status, headers, _) = post_charge(&b, Some("k-slow"), body, "acme").await;
    assert_eq!((status, &headers["idempotent-replayed"]), (StatusCode::CREATED, &"true".parse().unwrap()));
    assert_eq!(made(&charges), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_pruned_after_its_age_is_a_new_request() {
    let (ledger, charges) = (common::database("http").await, Arc::new(Charges::default()));
    let url = serve(ledger.clone(), Arc::clone(&charges)).await;
    post_charge(&url, Some("k-old"), r#"{"amount":5}"#, "acme").await;
    post_charge(&url, Some("k-old"), r#"{"amount":5}"#, "acme").await;
    assert_eq!(made(&charges), 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    ledger.prune_done(Duration::from_secs(1)).await.unwrap(); // what a daily prune_done(24 h) does
    let (status, headers, body) = post_charge(&url, Some("k-old"), r#"{"amount":5}"#, "acme").await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, r#"{"charge":2}"#), "run again");
    assert!(headers.get("idempotent-replayed").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_and_in_memory_too() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(dir.path().join("app.db")))
        .await
        .unwrap();
    let charges = Arc::new(Charges::default());
    let on_sqlite = serve(sqlite.clone(), Arc::clone(&charges)).await;
    let memory = MemoryBackend::new().with_ledger_retention(Duration::from_secs(1));
    let in_memory = serve(memory, Arc::clone(&charges)).await;
    for url in [&on_sqlite, &in_memory] {
        for _ in 0..2 {
            let (status, _, _) = post_charge(url, Some("k-1"), r#"{"amount":5}"#, "acme").await;
            assert_eq!(status, StatusCode::CREATED);
        }
    }
    assert_eq!(made(&charges), 2, "once on each ledger");
    // SQLite's prune lets the key go too, and the memory ledger's retention (24 h unless set).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    sqlite.prune_done(Duration::from_secs(1)).await.unwrap();
    for url in [&on_sqlite, &in_memory] {
        let (status, headers, _) = post_charge(url, Some("k-1"), r#"{"amount":5}"#, "acme").await;
        assert!(status == StatusCode::CREATED && !headers.contains_key("idempotent-replayed"), "run again");
    }
    assert_eq!(made(&charges), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_times_out_and_retries_is_charged_once() {
    let (ledger, charges) = (common::database("http").await, Arc::new(Charges::default()));
    let url = serve(ledger, Arc::clone(&charges)).await;
    let body = r#"{"amount":5,"slow":true}"#;

    // The client gives up after 200 ms and closes its connection; the charge is made by then, its
    // answer comes 600 ms later.
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(200)).build().unwrap();
    let first = impatient
        .post(format!("{url}/charges"))
        .header("x-client", "acme")
        .header("Idempotency-Key", "k-timeout")
        .body(body)
        .send()
        .await;
    assert!(first.unwrap_err().is_timeout());
    assert_eq!(made(&charges), 1);

    // It retries with its key until it is no longer told to wait.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (status, headers, answer) = loop {
        let answer = post_charge(&url, Some("k-timeout"), body, "acme").await;
        if answer.0 != StatusCode::CONFLICT {
            break answer;
        }
        assert!(answer.1.contains_key(header::RETRY_AFTER));
        assert!(Instant::now() < deadline, "still 409 after 15 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(made(&charges), 1, "charged once");
    assert_eq!((status, answer.as_str()), (StatusCode::CREATED, r#"{"charge":1}"#), "the first request's answer");
    assert_eq!(headers["idempotent-replayed"], "true");
}

/// Echoes the caller's bearer token: an answer meant for its client alone.
async fn charge_echoing_the_token(State(charges): State<Arc<Charges>>, headers: HeaderMap) -> String {
    charges.made.fetch_add(1, Ordering::SeqCst);
    let token = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default();
    format!("charged for {token}")
}

async fn post_with_token(url: &str, token: &str) -> (StatusCode, String) {
    let response = reqwest::Client::new()
        .post(format!("{url}/charges"))
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header("Idempotency-Key", "k-1")
        .body("{}")
        .send()
        .await
        .unwrap();
    (response.status(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_without_a_scope_refuses_keyed_requests_rather_than_share_answers_between_clients() {
    let charges = Arc::new(Charges::default());
    // The application forgot to name the client: no authentication puts an IdempotencyScope.
    let app = Router::new()
        .route("/charges", post(charge_echoing_the_token))
        .layer(Idempotency::new(MemoryBackend::new()).required())
        .with_state(Arc::clone(&charges));
    let url = listen(app).await;
    let acme = post_with_token(&url, "token-of-acme").await;
    let globex = post_with_token(&url, "token-of-globex").await;
    assert!(!globex.1.contains("token-of-acme"), "another client's answer leaked: {}", globex.1);
    assert_eq!(
        (acme.0, globex.0),
        (StatusCode::INTERNAL_SERVER_ERROR, StatusCode::INTERNAL_SERVER_ERROR),
        "a misconfigured server"
    );
    assert!(acme.1.contains("IdempotencyScope"), "the error names the fix: {}", acme.1);
    assert_eq!(made(&charges), 0, "nothing ran");
    // A request without a key is no concern of the layer's.
    let unkeyed = reqwest::Client::new().post(format!("{url}/charges")).send().await.unwrap();
    assert_eq!(unkeyed.status(), StatusCode::BAD_REQUEST, "the key is required");

    // An API with one client says so: its requests share one scope.
    let app = Router::new()
        .route("/charges", post(charge_echoing_the_token))
        .layer(Idempotency::new(MemoryBackend::new()).required().unscoped())
        .with_state(Arc::clone(&charges));
    let url = listen(app).await;
    assert_eq!(
        post_with_token(&url, "token-of-acme").await,
        (StatusCode::OK, "charged for Bearer token-of-acme".into())
    );
    assert_eq!(made(&charges), 1);
}

#[test]
fn keep_header_refuses_credentials_and_framing() {
    for name in [
        header::SET_COOKIE,
        header::COOKIE,
        header::AUTHORIZATION,
        header::PROXY_AUTHORIZATION,
        header::HeaderName::from_static("set-cookie2"),
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
    ] {
        let keep = std::panic::catch_unwind(|| Idempotency::new(MemoryBackend::new()).keep_header(name.clone()));
        assert!(keep.is_err(), "keep_header({name}) was accepted");
    }
    // A header that says nothing about the client is kept.
    let _ = Idempotency::new(MemoryBackend::new()).keep_header(header::ETAG);
}

/// A real ledger whose first `failures` finishes fail for a temporary reason.
#[derive(Clone)]
struct FinishFails {
    ledger: MemoryBackend,
    failures: u32,
    finishes: Arc<AtomicU32>,
}

impl Ledger for FinishFails {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> redrive_core::Result<Begin> {
        self.ledger.begin(key, payload, provider_key, hold).await
    }

    async fn extend_hold(&self, hold: &Hold, by: Duration) -> redrive_core::Result<()> {
        self.ledger.extend_hold(hold, by).await
    }

    async fn release_hold(&self, hold: &Hold) -> redrive_core::Result<()> {
        self.ledger.release_hold(hold).await
    }

    async fn finish(&self, hold: &Hold, result: &Value) -> redrive_core::Result<()> {
        if self.finishes.fetch_add(1, Ordering::SeqCst) < self.failures {
            return Err(redrive_core::Error::temporary("the database is busy"));
        }
        self.ledger.finish(hold, result).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_finish_is_retried_while_the_key_stays_held() {
    let charges = Arc::new(Charges::default());
    let finishes = Arc::new(AtomicU32::new(0));
    let ledger = FinishFails { ledger: MemoryBackend::new(), failures: 4, finishes: Arc::clone(&finishes) };
    let layer = Idempotency::new(ledger).required().hold(Duration::from_millis(300));
    let url = serve_with(layer, Arc::clone(&charges)).await;

    let first = tokio::spawn({
        let url = url.clone();
        async move { post_charge(&url, Some("k-store"), r#"{"amount":5}"#, "acme").await }
    });
    // Four finishes failed: their backoff has outlasted the 300 ms hold.
    until("the fourth finish", || finishes.load(Ordering::SeqCst) >= 4).await;
    let (status, _, _) = post_charge(&url, Some("k-store"), r#"{"amount":5}"#, "acme").await;
    assert_eq!(status, StatusCode::CONFLICT, "the key is still held while its answer is being stored");

    let (status, _, body) = first.await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, r#"{"charge":1}"#));
    let (status, headers, body) = post_charge(&url, Some("k-store"), r#"{"amount":5}"#, "acme").await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, r#"{"charge":1}"#), "the stored answer");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!((made(&charges), finishes.load(Ordering::SeqCst)), (1, 5), "charged once, stored at the fifth try");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_stays_held_while_a_slow_body_streams() {
    let (ledger, charges) = (common::database("http").await, Arc::new(Charges::default()));
    let layer = Idempotency::new(ledger).required().hold(Duration::from_millis(300));
    let url = format!("{}/streamed", serve_with(layer, Arc::clone(&charges)).await);

    let first = tokio::spawn({
        let url = url.clone();
        async move { post_to(&url, Some("k-stream"), "{}", "acme").await }
    });
    // Four chunks sent: the body has streamed for 400 ms, past the 300 ms hold.
    until("the fourth chunk", || charges.chunks_sent.load(Ordering::SeqCst) >= 4).await;
    let (status, _, _) = post_to(&url, Some("k-stream"), "{}", "acme").await;
    assert_eq!(status, StatusCode::CONFLICT, "the key is still held while the body streams");

    let whole: String = (0..8).map(|i| format!("chunk {i}\n")).collect();
    let (status, _, body) = first.await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, whole.as_str()));
    let (status, headers, body) = post_to(&url, Some("k-stream"), "{}", "acme").await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, whole.as_str()), "the stored answer");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(made(&charges), 1, "charged once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_is_an_error_not_an_answer_cut_short() {
    let charges = Arc::new(Charges::default());
    let url = format!("{}/panics", serve(MemoryBackend::new(), Arc::clone(&charges)).await);
    let (status, _, _) = post_to(&url, Some("k-early"), "early", "acme").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);

    // A body that panics after its first chunk: within what is stored, it is read whole before
    // anything is sent, so the client gets a 500 (a larger one would fail midway), never a 200
    // that ends after its first chunk.
    let request = reqwest::Client::new().post(&url).header("x-client", "acme").header("Idempotency-Key", "k-late");
    let late = request.body("late").send().await.map(|r| r.status());
    assert!(
        matches!(late, Ok(StatusCode::INTERNAL_SERVER_ERROR) | Err(_)),
        "the response fails rather than end after its first chunk: {late:?}"
    );
    assert_eq!(made(&charges), 2);
}
