//! The four checks of reliable jobs on Upstash QStash, here the emulator started in this process
//! on loopback: QStash pushes each job to the receiver below, which verifies its signature and
//! hands it to the worker. The effect ledger and the failure records are in PostgreSQL.
//!
//! Run: `eval "$(scripts/services env)" && cargo run -p redrive-examples --example qstash --features qstash`
//! (for the real QStash, give `QStashConfig::new` your token and your public https URL, and
//! drop `with_api_url` and `allow_plain_http`).

#[path = "broker/mod.rs"]
mod broker;

use std::sync::Arc;

use redrive::postgres::{PgBackend, PgConfig};
use redrive::qstash::{QStashBackend, QStashConfig};
use redrive_qstash_emulator::Emulator;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // QStash's default backoff, a hundred times faster, so a crash's retry is quick here.
    let emulator = Emulator::builder().token("example-token").time_scale(0.01).start_local().await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let destination = format!("http://{}/qstash", listener.local_addr()?);

    // The effect ledger and the failure records live in the application's database.
    let ledger = PgBackend::connect(PgConfig::from_env()?.with_schema("redrive_example_qstash")).await?;
    redrive::postgres::sqlx::query("DROP SCHEMA IF EXISTS redrive_example_qstash CASCADE")
        .execute(ledger.pool())
        .await?;
    ledger.migrate().await?;
    let config = QStashConfig::new(emulator.token(), &destination).with_api_url(emulator.url()).allow_plain_http();
    let queue = QStashBackend::connect(config, Arc::new(ledger.clone())).await?;

    // The endpoint QStash delivers to, in the application's own router.
    let app = axum::Router::new().route("/qstash", queue.receiver());
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!(
        "QStash emulator at {}, deliveries to {destination}, ledger and failure records in PostgreSQL",
        emulator.url()
    );
    broker::four_checks(&queue, &ledger).await
}
