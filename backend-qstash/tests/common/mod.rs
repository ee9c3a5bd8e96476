//! The QStash emulator (in-process, on loopback), a receiver on a real listener, and PostgreSQL
//! for the effect ledger and the record store. A missing PostgreSQL fails the test; it never
//! skips.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use redrive_core::{Job, KeyBuilder};
use redrive_postgres::{PgBackend, PgConfig};
use redrive_qstash::{QStashBackend, QStashConfig};
use redrive_qstash_emulator::{Emulator, EmulatorBuilder, RunningEmulator};
use serde::{Deserialize, Serialize};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub const TOKEN: &str = "redrive-test-token";

fn unique() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{}_{}_{nanos:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A migrated schema of its own: the effect ledger and the record store.
pub async fn ledger() -> PgBackend {
    let schema = format!("rdt_{}_qstash", unique());
    let ledger = PgBackend::connect(PgConfig::new(database_url()).with_schema(schema).with_max_connections(3))
        .await
        .expect("PostgreSQL is required for the effect ledger (run scripts/test)");
    ledger.migrate().await.expect("migrate");
    ledger
}

/// The emulator QStash's default backoff scaled a hundredfold down: a crash's retry comes in
/// tens of milliseconds rather than seconds.
pub fn emulator() -> EmulatorBuilder {
    Emulator::builder().token(TOKEN).time_scale(0.01)
}

/// Everything one test needs: the emulator, a receiver served on its own listener at
/// `/qstash`, and the backend publishing to it.
pub struct Rig {
    pub emulator: Arc<RunningEmulator>,
    pub backend: QStashBackend,
    pub ledger: PgBackend,
    pub destination: String,
}

pub async fn rig_with(emulator: EmulatorBuilder, config: impl FnOnce(QStashConfig) -> QStashConfig) -> Rig {
    let emulator = Arc::new(emulator.start_local().await.expect("the emulator starts on loopback"));
    rig_on(emulator, config).await
}

/// A rig on an emulator already running: another destination on the same QStash account.
pub async fn rig_on(emulator: Arc<RunningEmulator>, config: impl FnOnce(QStashConfig) -> QStashConfig) -> Rig {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let destination = format!("http://{}/qstash", listener.local_addr().unwrap());
    let ledger = ledger().await;
    let settings = QStashConfig::new(TOKEN, destination.clone()).with_api_url(emulator.url()).allow_plain_http();
    let backend = QStashBackend::connect(config(settings), Arc::new(ledger.clone())).await.expect("connect");
    let app = axum::Router::new().route("/qstash", backend.receiver());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Rig { emulator, backend, ledger, destination }
}

pub async fn rig() -> Rig {
    rig_with(emulator(), |c| c).await
}

/// A worker on the rig whose handler for `J` succeeds and counts its runs.
pub fn counting_worker<J: redrive_core::Job>(rig: &Rig) -> (redrive_core::RunningWorker, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let seen = runs.clone();
    let worker = redrive_core::Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<J>(move |_job: J, _ctx: redrive_core::JobContext| {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                Ok::<(), redrive_core::JobError>(())
            }
        })
        .build()
        .start();
    (worker, runs)
}

/// The job the receiver tests enqueue: a grant to an account.
#[derive(Serialize, Deserialize)]
pub struct Grant {
    pub account: u32,
}

impl Job for Grant {
    const KIND: &'static str = "grant";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("account", self.account)
    }
}
