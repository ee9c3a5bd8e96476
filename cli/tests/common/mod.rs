//! What the command's tests share: a PostgreSQL schema of their own, moto's SQS endpoint, and
//! `redrive serve` as a child process.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use redrive_postgres::{PgBackend, PgConfig};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub fn unique() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{}_{}_{nanos:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A migrated schema of its own (named so that the Postgres tests' clean-up drops it later).
pub async fn database() -> PgBackend {
    let schema = format!("rdt_{}_cli", unique());
    let backend = PgBackend::connect(PgConfig::new(database_url()).with_schema(schema).with_max_connections(3))
        .await
        .expect("PostgreSQL is required (run scripts/test)");
    backend.migrate().await.expect("migrate");
    backend
}

/// The Azure account of the tests: `AZURE_STORAGE_CONNECTION_STRING` (Azurite's, set by
/// `scripts/services env`), else Azurite's development account.
pub fn azure_account() -> redrive_azure::AzureConfig {
    match std::env::var("AZURE_STORAGE_CONNECTION_STRING") {
        Ok(text) => redrive_azure::AzureConfig::from_connection_string(&text).expect("a valid connection string"),
        Err(_) => redrive_azure::AzureConfig::development(),
    }
}

pub fn sqs_endpoint() -> String {
    std::env::var("REDRIVE_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

/// A `redrive` command with the environment an operator would have: the database, and AWS's
/// (moto's) for SQS.
pub fn redrive_command(backend: &str, schema: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redrive"));
    command
        .args(["--backend", backend, "--schema", schema])
        .env("DATABASE_URL", database_url())
        .env("REDRIVE_SQS_ENDPOINT", sqs_endpoint())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test");
    command
}

/// `redrive serve` on a free loopback port, killed when dropped.
pub struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `redrive serve` on `backend` (with `token`, if any); it and its base URL.
pub fn serve(backend: &str, schema: &str, token: Option<&str>) -> (Served, String) {
    serve_with(backend, schema, token, &[])
}

/// [`serve`] with more of `redrive serve`'s options.
pub fn serve_with(backend: &str, schema: &str, token: Option<&str>, options: &[&str]) -> (Served, String) {
    serve_in(backend, schema, token, options, &[])
}

/// [`serve_with`], with settings the backend takes from the environment (Inngest's keys).
pub fn serve_in(
    backend: &str,
    schema: &str,
    token: Option<&str>,
    options: &[&str],
    env: &[(&str, String)],
) -> (Served, String) {
    let mut command = redrive_command(backend, schema);
    command.envs(env.iter().map(|(k, v)| (k, v)));
    command.args(["serve", "--bind", "127.0.0.1:0"]).args(options).stderr(Stdio::piped());
    if let Some(token) = token {
        command.env("REDRIVE_DASHBOARD_TOKEN", token);
    }
    let mut child = command.spawn().expect("the redrive binary runs");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    let url = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            let url = line.split_once("the dashboard is on ").map(|(_, url)| url.trim().to_owned());
            said.push(line);
            url
        })
        .unwrap_or_else(|| panic!("redrive serve did not start: {said:?}"));
    // Keep reading, so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (Served(child), url)
}

/// An Inngest app on the emulator (retries' backoff scaled a hundredfold down), its endpoint
/// served by this process at `/api/inngest`, its records in `db`; not synced yet.
pub struct InngestApp {
    pub emulator: redrive_inngest_emulator::Emulator,
    pub backend: redrive_inngest::InngestBackend,
    /// The serve URL, `http://127.0.0.1:<port>/api/inngest`.
    pub endpoint: String,
}

impl InngestApp {
    pub async fn start(db: &PgBackend, app: &str) -> Self {
        let emulator = redrive_inngest_emulator::Emulator::builder().time_scale(0.01).start_local().await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}/api/inngest", listener.local_addr().unwrap());
        let config = redrive_inngest::InngestConfig::new(emulator.event_key(), emulator.signing_key(), &endpoint)
            .with_base_url(emulator.url())
            .with_app_id(app)
            .allow_plain_http();
        let backend = redrive_inngest::InngestBackend::connect(config, std::sync::Arc::new(db.clone())).await.unwrap();
        let router = axum::Router::new().route("/api/inngest", backend.endpoint());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self { emulator, backend, endpoint }
    }

    /// The URL `redrive` takes for the app.
    pub fn url(&self) -> String {
        let app = self.backend.config().app_id();
        format!("{}?app={app}", self.endpoint.replacen("http://", "inngest+http://", 1))
    }

    /// The settings `redrive` takes from the environment for it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("INNGEST_EVENT_KEY", self.emulator.event_key().to_owned()),
            ("INNGEST_SIGNING_KEY", self.emulator.signing_key().to_owned()),
            ("INNGEST_BASE_URL", self.emulator.url()),
        ]
    }
}
