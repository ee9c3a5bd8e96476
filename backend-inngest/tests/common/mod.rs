//! The Inngest emulator (in-process, on loopback), the serve endpoint on a real listener, and
//! PostgreSQL for the effect ledger and the record store. A missing PostgreSQL fails the test;
//! it never skips.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use redrive_inngest::{InngestBackend, InngestConfig};
use redrive_inngest_emulator::{Emulator, EmulatorBuilder};
use redrive_postgres::{PgBackend, PgConfig};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn unique() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{}_{}_{nanos:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A migrated schema of its own: the effect ledger and the record store.
pub async fn ledger() -> PgBackend {
    let schema = format!("rdt_{}_inngest", unique());
    let ledger = PgBackend::connect(PgConfig::new(database_url()).with_schema(schema).with_max_connections(3))
        .await
        .expect("PostgreSQL is required for the effect ledger (run scripts/test)");
    ledger.migrate().await.expect("migrate");
    ledger
}

/// The emulator with Inngest's retry backoff scaled a hundredfold down: a crash's call again
/// comes in a fraction of a second rather than 15 s.
pub fn emulator() -> EmulatorBuilder {
    Emulator::builder().time_scale(0.01)
}

/// Everything one test needs: the emulator, the endpoint served on its own listener at
/// `/api/inngest`, and the backend sending to the emulator, its functions registered.
pub struct Rig {
    pub emulator: Arc<Emulator>,
    pub backend: InngestBackend,
    pub ledger: PgBackend,
    pub serve_url: String,
}

pub async fn rig_with(emulator: EmulatorBuilder, config: impl FnOnce(InngestConfig) -> InngestConfig) -> Rig {
    let emulator = Arc::new(emulator.start_local().await.expect("the emulator starts on loopback"));
    rig_on(emulator, config).await
}

/// A rig on an emulator already running: another app or queue on the same Inngest account.
pub async fn rig_on(emulator: Arc<Emulator>, config: impl FnOnce(InngestConfig) -> InngestConfig) -> Rig {
    rig_with_store(emulator, ledger().await, config).await
}

/// Another app beside `rig`: the same emulator (account) and the same database.
pub async fn rig_beside(rig: &Rig) -> Rig {
    rig_with_store(Arc::clone(&rig.emulator), rig.ledger.clone(), |c| c).await
}

async fn rig_with_store(
    emulator: Arc<Emulator>,
    ledger: PgBackend,
    config: impl FnOnce(InngestConfig) -> InngestConfig,
) -> Rig {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let serve_url = format!("http://{}/api/inngest", listener.local_addr().unwrap());
    let settings = InngestConfig::new(emulator.event_key(), emulator.signing_key(), serve_url.clone())
        .with_base_url(emulator.url())
        .with_app_id(format!("app{}", unique().replace('_', "-")))
        .allow_plain_http();
    let backend = InngestBackend::connect(config(settings), Arc::new(ledger.clone())).await.expect("connect");
    let app = axum::Router::new().route("/api/inngest", backend.endpoint());
    tokio::spawn(async move { axum::serve(listener, app).await });
    backend.sync().await.expect("the functions register");
    Rig { emulator, backend, ledger, serve_url }
}

pub async fn rig() -> Rig {
    rig_with(emulator(), |c| c).await
}
