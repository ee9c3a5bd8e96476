//! A receiver process killed with SIGKILL while its worker runs jobs, on the QStash emulator
//! with the effect ledger and records in PostgreSQL: QStash delivers again, to a second process
//! listening at the same destination, which finishes every job, each once
//! ([`redrive_conformance::kill_worker_mid_job`]).

mod common;

use redrive_conformance::EnqueueJobs;
use std::sync::Arc;

use redrive_postgres::{PgBackend, PgConfig};
use redrive_qstash::{QStashBackend, QStashConfig};

/// The same test binary plays the receiver that is killed: run with the child variables set, it
/// listens at the destination and hangs in its handlers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_killed_mid_job_leaves_every_job_to_the_next_once() {
    if redrive_conformance::is_killed_child() {
        let (Ok(api), Ok(port), Ok(schema)) = (
            std::env::var("REDRIVE_KILL_API"),
            std::env::var("REDRIVE_KILL_PORT"),
            std::env::var("REDRIVE_KILL_SCHEMA"),
        ) else {
            panic!("the parent names the emulator, the port and the schema");
        };
        let store = PgConfig::new(common::database_url()).with_schema(schema).with_max_connections(3);
        let store = PgBackend::connect(store).await.unwrap();
        let port = port.parse().unwrap();
        let backend = backend(&api, port, &store).await;
        serve(&backend, port).await;
        redrive_conformance::hang_until_killed(backend, store).await;
    }
    let emulator = common::emulator().start_local().await.expect("the emulator starts on loopback");
    // A port for the destination, free again for the child, then for the second process.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let ledger = common::ledger().await;
    // Publishes once the child listens; the child receives until it is killed, then this process does.
    let queue = backend(&emulator.url(), port, &ledger).await;
    let env = [
        ("REDRIVE_KILL_API", emulator.url()),
        ("REDRIVE_KILL_PORT", port.to_string()),
        ("REDRIVE_KILL_SCHEMA", ledger.schema().to_owned()),
    ];
    let test = "a_worker_process_killed_mid_job_leaves_every_job_to_the_next_once";
    redrive_conformance::kill_worker_mid_job(
        test,
        &env,
        EnqueueJobs::OnceChildRuns,
        &queue,
        &ledger,
        serve(&queue, port),
    )
    .await;
}

/// A backend publishing through the emulator at `api` to this machine's `port`.
async fn backend(api: &str, port: u16, ledger: &PgBackend) -> QStashBackend {
    let destination = format!("http://127.0.0.1:{port}/qstash");
    let config = QStashConfig::new(common::TOKEN, destination).with_api_url(api).allow_plain_http();
    QStashBackend::connect(config, Arc::new(ledger.clone())).await.expect("connect")
}

/// Serves `backend`'s receiver at its destination.
async fn serve(backend: &QStashBackend, port: u16) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("the destination's port is free");
    let app = axum::Router::new().route("/qstash", backend.receiver());
    tokio::spawn(async move { axum::serve(listener, app).await });
}
