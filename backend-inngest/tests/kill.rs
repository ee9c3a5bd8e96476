//! An endpoint process killed with SIGKILL while its worker runs jobs, on the Inngest emulator
//! with the effect ledger and records in PostgreSQL: Inngest calls again, to a second process
//! serving the same URL, which finishes every job, each once
//! ([`redrive_conformance::kill_worker_mid_job`]).

mod common;

use std::sync::Arc;

use redrive_conformance::EnqueueJobs;
use redrive_inngest::{InngestBackend, InngestConfig};
use redrive_postgres::{PgBackend, PgConfig};

/// The same test binary plays the endpoint that is killed: run with the child variables set, it
/// serves the URL and hangs in its handlers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_process_killed_mid_job_leaves_every_job_to_the_next_once() {
    if redrive_conformance::is_killed_child() {
        let var =
            |name: &str| std::env::var(name).expect("the parent names the emulator, its keys, the port and the schema");
        let (base, keys, port, schema) =
            (var("REDRIVE_KILL_BASE"), var("REDRIVE_KILL_KEYS"), var("REDRIVE_KILL_PORT"), var("REDRIVE_KILL_SCHEMA"));
        let (event_key, signing_key) = keys.split_once(' ').expect("two keys");
        let store = PgConfig::new(common::database_url()).with_schema(schema).with_max_connections(3);
        let store = PgBackend::connect(store).await.unwrap();
        let port = port.parse().unwrap();
        let backend = backend(&base, event_key, signing_key, port, &store).await;
        serve(&backend, port).await;
        redrive_conformance::hang_until_killed(backend, store).await;
    }
    let emulator = common::emulator().start_local().await.expect("the emulator starts on loopback");
    // A port for the endpoint, free again for the child, then for the second process.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let ledger = common::ledger().await;
    let queue = backend(&emulator.url(), emulator.event_key(), emulator.signing_key(), port, &ledger).await;
    queue.sync().await.expect("the functions register");
    let env = [
        ("REDRIVE_KILL_BASE", emulator.url()),
        ("REDRIVE_KILL_KEYS", format!("{} {}", emulator.event_key(), emulator.signing_key())),
        ("REDRIVE_KILL_PORT", port.to_string()),
        ("REDRIVE_KILL_SCHEMA", ledger.schema().to_owned()),
    ];
    let test = "an_endpoint_process_killed_mid_job_leaves_every_job_to_the_next_once";
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

/// A backend sending through the emulator at `base`, its endpoint at this machine's `port`.
async fn backend(base: &str, event_key: &str, signing_key: &str, port: u16, ledger: &PgBackend) -> InngestBackend {
    let serve_url = format!("http://127.0.0.1:{port}/api/inngest");
    let config = InngestConfig::new(event_key, signing_key, serve_url).with_base_url(base).allow_plain_http();
    InngestBackend::connect(config, Arc::new(ledger.clone())).await.expect("connect")
}

/// Serves `backend`'s endpoint at its URL.
async fn serve(backend: &InngestBackend, port: u16) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("the endpoint's port is free");
    let app = axum::Router::new().route("/api/inngest", backend.endpoint());
    tokio::spawn(async move { axum::serve(listener, app).await });
}
