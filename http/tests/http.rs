//! The layer in an axum app on a real listener, with reqwest, on PostgreSQL's effect ledger.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use redrive_http::{Idempotency, IdempotencyScope};
use redrive_postgres::{PgBackend, PgConfig};

static NEXT: AtomicU32 = AtomicU32::new(0);

async fn database() -> PgBackend {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let schema = format!("rdt_{}_{}_{nanos:x}_http", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let backend = PgBackend::connect(PgConfig::new(url).with_schema(schema).with_max_connections(4))
        .await
        .expect("PostgreSQL is required (run scripts/test)");
    backend.migrate().await.expect("migrate");
    backend
}

/// Charges made, as the provider would count them.
#[derive(Default)]
struct Charges(AtomicU32);

/// Charges `amount`; a negative amount is declined (402); `slow` takes 600 ms; `big` answers
/// 100 KiB.
async fn charge(State(charges): State<Arc<Charges>>, body: String) -> Response {
    let n = charges.0.fetch_add(1, Ordering::SeqCst) + 1;
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

async fn serve<L: redrive_core::Ledger + 'static>(ledger: L, charges: Arc<Charges>) -> String {
    let app = Router::new()
        .route("/charges", post(charge).get(|| async { "list" }))
        .layer(Idempotency::new(ledger).required().hold(Duration::from_secs(5)))
        .layer(middleware::from_fn(authenticate))
        .with_state(charges);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn post_charge(url: &str, key: Option<&str>, body: &str, client: &str) -> (StatusCode, HeaderMap, String) {
    let mut request =
        reqwest::Client::new().post(format!("{url}/charges")).header("x-client", client).body(body.to_owned());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, response.text().await.unwrap())
}

fn made(charges: &Charges) -> u32 {
    charges.0.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_gets_the_first_response_and_the_handler_runs_once() {
    let (ledger, charges) = (database().await, Arc::new(Charges::default()));
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
    let (ledger, charges) = (database().await, Arc::new(Charges::default()));
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
    let first = database().await;
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
    let (ledger, charges) = (database().await, Arc::new(Charges::default()));
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
    let in_memory = serve(redrive_core::MemoryBackend::new(), Arc::clone(&charges)).await;
    for url in [&on_sqlite, &in_memory] {
        for _ in 0..2 {
            let (status, _, _) = post_charge(url, Some("k-1"), r#"{"amount":5}"#, "acme").await;
            assert_eq!(status, StatusCode::CREATED);
        }
    }
    assert_eq!(made(&charges), 2, "once on each ledger");
    // SQLite's prune lets the key go too.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    sqlite.prune_done(Duration::from_secs(1)).await.unwrap();
    post_charge(&on_sqlite, Some("k-1"), r#"{"amount":5}"#, "acme").await;
    assert_eq!(made(&charges), 3);
}
