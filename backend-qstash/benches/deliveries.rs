//! Against the QStash emulator, in one run:
//!
//! 1. **Publishes per job**: 2,000 jobs enqueued in batches (`enqueue_batch`, 100 a call) and
//!    burned down by a worker, every publish request counted by the emulator (retry and
//!    deferral copies included). The target is at most 1/100.
//! 2. **The receiver's added latency per delivery**: the same signed POST sent one at a time
//!    over loopback to an axum handler that answers 200 at once, then to the receiver (signature
//!    check, parking, a worker's claim, the PostgreSQL ledger's begin and finish, the verdict),
//!    then to the bare handler again; the ratio divides by the mean of the two bare runs. The
//!    ledger's tables are analyzed after a warm-up of 500 deliveries, as autovacuum would have. Then the
//!    same with the in-memory ledger, which leaves the receiver's and the worker's own share.
//!
//! Run (PostgreSQL from `scripts/services`): `cargo bench -p redrive-qstash --bench deliveries`

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use redrive_core::{Enqueue, Job, JobContext, JobError, KeyBuilder, NewJob, QueueStats, Worker};
use redrive_postgres::{PgBackend, PgConfig};
use redrive_qstash::{QStashBackend, QStashConfig};
use redrive_qstash_emulator::Emulator;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const JOBS: u64 = 2_000;
const DELIVERIES: u64 = 1_000;
/// Deliveries through the receiver before the measured ones, after which the ledger is analyzed.
const WARM_UP: u64 = 500;
const TOKEN: &str = "bench-token";
const KEY: &str = "sig_bench_current";

#[derive(Serialize, Deserialize)]
struct Noop {
    n: u64,
}

impl Job for Noop {
    const KIND: &'static str = "noop";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n)
    }
}

async fn ledger(label: &str) -> BoxResult<PgBackend> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("rdbench_qstash_{label}_{}", std::process::id());
    let ledger = PgBackend::connect(PgConfig::new(url).with_schema(&schema)).await?;
    redrive_postgres::sqlx::query(redrive_postgres::sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(ledger.pool())
    .await?;
    ledger.migrate().await?;
    Ok(ledger)
}

async fn backend(
    emulator: &redrive_qstash_emulator::RunningEmulator,
    ledger: &PgBackend,
) -> BoxResult<(QStashBackend, String)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let destination = format!("http://{}/qstash", listener.local_addr()?);
    let config = QStashConfig::new(TOKEN, &destination)
        .with_api_url(emulator.url())
        .with_signing_keys(KEY, "sig_bench_next")
        // Every job is delivered at once (no QStash queue): all parked, as before the bound.
        .with_max_parked(JOBS as usize)
        .allow_plain_http();
    let backend = QStashBackend::connect(config, Arc::new(ledger.clone())).await?;
    let app = axum::Router::new().route("/qstash", backend.receiver());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((backend, destination))
}

fn noop_worker(backend: &QStashBackend, ledger: &PgBackend) -> redrive_core::RunningWorker {
    Worker::builder(backend.clone(), ledger.clone())
        .handle::<Noop>(|_job: Noop, _ctx: JobContext| async { Ok::<(), JobError>(()) })
        .build()
        .start()
}

fn signature(url: &str, body: &[u8]) -> String {
    let now = chrono::Utc::now().timestamp();
    let claims = serde_json::json!({
        "iss": "Upstash", "sub": url, "iat": now, "nbf": now, "exp": now + 300, "jti": "jwt_bench",
        "body": base64::engine::general_purpose::URL_SAFE.encode(Sha256::digest(body)),
    });
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(KEY.as_bytes()).unwrap())
        .unwrap()
}

/// Mean microseconds per delivery of `deliveries` (body, signature) to `url`, one at a time.
async fn deliver(client: &reqwest::Client, url: &str, deliveries: &[(String, String)], first: usize) -> BoxResult<f64> {
    let started = Instant::now();
    for (i, (body, signature)) in deliveries.iter().enumerate() {
        let status = client
            .post(url)
            .header("Content-Type", "application/json")
            .header("Upstash-Message-Id", format!("msg_bench_{}", first + i))
            .header("Upstash-Retried", "0")
            .header("Upstash-Signature", signature)
            .body(body.clone())
            .send()
            .await?
            .status();
        assert!(status.is_success(), "delivery answered {status}");
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / deliveries.len() as f64)
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let emulator = Emulator::builder().token(TOKEN).signing_keys(KEY, "sig_bench_next").start_local().await?;

    // 1. Publishes per job.
    let ledger1 = ledger("publish").await?;
    let (queue, _) = backend(&emulator, &ledger1).await?;
    let jobs: Vec<NewJob> = (0..JOBS).map(|n| NewJob::from_job(&Noop { n })).collect::<Result<_, _>>()?;
    let started = Instant::now();
    for chunk in jobs.chunks(500) {
        queue.enqueue_batch(chunk.to_vec()).await?;
    }
    let worker = noop_worker(&queue, &ledger1);
    while worker.stats().succeeded < JOBS {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    let stats = worker.shutdown().await;
    let publishes = emulator.publish_requests();
    println!(
        "publishes per job: {publishes} publish requests for {JOBS} jobs = {:.4} (target <= 0.01)",
        publishes as f64 / JOBS as f64
    );
    println!(
        "  burned down in {:.2} s ({:.0} jobs/s through the emulator); succeeded {}, deferred {}, retried {}; this process's queue now {:?}",
        elapsed.as_secs_f64(),
        JOBS as f64 / elapsed.as_secs_f64(),
        stats.succeeded,
        stats.deferred,
        stats.retried,
        queue.counts().await?
    );

    // 2. The receiver's added latency.
    let ledger2 = ledger("latency").await?;
    let (receiver, url) = backend(&emulator, &ledger2).await?;
    let worker = noop_worker(&receiver, &ledger2);
    let bare_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let bare_url = format!("http://{}/qstash", bare_listener.local_addr()?);
    let bare = axum::Router::new().route("/qstash", post(|| async { "" }));
    tokio::spawn(async move { axum::serve(bare_listener, bare).await });
    let deliveries: Vec<(String, String)> = (0..DELIVERIES)
        .map(|n| {
            let body =
                redrive_core::kit::Envelope::new(&NewJob::from_job(&Noop { n: 1_000_000 + n }).unwrap()).encode();
            let signature = signature(&url, body.as_bytes());
            (body, signature)
        })
        .collect();
    let client = reqwest::Client::new();
    // Warm both paths (connections, prepared statements), then give the ledger's tables the
    // statistics a live database's autovacuum would have: warm-up keys of their own, analyzed.
    deliver(&client, &bare_url, &deliveries[..20], 0).await?;
    let warm_up: Vec<(String, String)> = (0..WARM_UP)
        .map(|n| {
            let body =
                redrive_core::kit::Envelope::new(&NewJob::from_job(&Noop { n: 2_000_000 + n }).unwrap()).encode();
            let signature = signature(&url, body.as_bytes());
            (body, signature)
        })
        .collect();
    deliver(&client, &url, &warm_up, 2 * DELIVERIES as usize).await?;
    for table in ["processed_keys", "applied_effects", "jobs", "job_keys"] {
        let sql = format!("VACUUM ANALYZE {}.{table}", ledger2.schema());
        redrive_postgres::sqlx::query(redrive_postgres::sqlx::AssertSqlSafe(sql)).execute(ledger2.pool()).await?;
    }
    let before = deliver(&client, &bare_url, &deliveries, 0).await?;
    let through = deliver(&client, &url, &deliveries, 0).await?;
    let after = deliver(&client, &bare_url, &deliveries, 0).await?;
    let stats = worker.shutdown().await;
    let bare_mean = (before + after) / 2.0;
    println!(
        "receiver latency per delivery, PostgreSQL ledger: {through:.0} µs against a bare 200 handler's {bare_mean:.0} µs ({before:.0} then {after:.0}) = {:.2}x; {} run, {} skipped",
        through / bare_mean,
        stats.succeeded,
        stats.skipped
    );

    // The same receiver and worker with the in-memory ledger: what the receiver itself adds.
    let memory = redrive_core::MemoryBackend::new();
    let worker = Worker::builder(receiver.clone(), memory)
        .handle::<Noop>(|_job: Noop, _ctx: JobContext| async { Ok::<(), JobError>(()) })
        .build()
        .start();
    let before = deliver(&client, &bare_url, &deliveries, 0).await?;
    let through = deliver(&client, &url, &deliveries, DELIVERIES as usize).await?;
    let after = deliver(&client, &bare_url, &deliveries, 0).await?;
    let stats = worker.shutdown().await;
    let bare_mean = (before + after) / 2.0;
    println!(
        "receiver latency per delivery, in-memory ledger: {through:.0} µs against {bare_mean:.0} µs ({before:.0} then {after:.0}) = {:.2}x; {} run",
        through / bare_mean,
        stats.succeeded
    );
    Ok(())
}
