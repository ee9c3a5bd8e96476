//! The four checks of reliable jobs on Inngest, here the emulator started in this process on
//! loopback: Inngest runs the app's function for each job's event by calling the serve endpoint
//! below, which verifies the call's signature and hands the job to the worker. The effect ledger
//! and the failure records are in PostgreSQL.
//!
//! Run: `eval "$(scripts/services env)" && cargo run -p redrive-examples --example inngest --features inngest`
//! (for Inngest itself, give `InngestConfig::new` your event key, your signing key and your
//! public https URL, and drop `with_base_url` and `allow_plain_http`).

#[path = "broker/mod.rs"]
mod broker;

use std::sync::Arc;

use redrive::inngest::{InngestBackend, InngestConfig};
use redrive::postgres::{PgBackend, PgConfig};
use redrive_inngest_emulator::Emulator;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Inngest's default backoff, a hundred times faster, so a crash's call again is quick here.
    let emulator = Emulator::builder().time_scale(0.01).start_local().await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let serve_url = format!("http://{}/api/inngest", listener.local_addr()?);

    // The effect ledger and the failure records live in the application's database.
    let ledger = PgBackend::connect(PgConfig::from_env()?.with_schema("redrive_example_inngest")).await?;
    redrive::postgres::sqlx::query("DROP SCHEMA IF EXISTS redrive_example_inngest CASCADE")
        .execute(ledger.pool())
        .await?;
    ledger.migrate().await?;
    let config = InngestConfig::new(emulator.event_key(), emulator.signing_key(), &serve_url)
        .with_base_url(emulator.url())
        .allow_plain_http();
    let queue = InngestBackend::connect(config, Arc::new(ledger.clone())).await?;

    // The endpoint Inngest calls, in the application's own router; then the app's functions
    // registered with Inngest.
    let app = axum::Router::new().route("/api/inngest", queue.endpoint());
    tokio::spawn(async move { axum::serve(listener, app).await });
    queue.sync().await?;
    println!("Inngest emulator at {}, calls to {serve_url}, ledger and failure records in PostgreSQL", emulator.url());
    broker::four_checks(&queue, &ledger).await
}
