//! One backend named by a URL at run time, as sqlx's `any`: `postgres://…`, `sqlite://PATH`,
//! `sqs://QUEUE`, `azure://QUEUE`, `qstash://HOST/PATH`, `inngest://HOST/PATH`.
//!
//! ```no_run
//! # async fn run() -> redrive::Result<()> {
//! use redrive::DeadLetter;
//!
//! let backend = redrive::any::connect("postgres://localhost/app").await?;
//! println!("{} open records", backend.count_open().await?);
//! # Ok(()) }
//! ```
//!
//! The `redrive` command and its dashboard reach every backend through this module, and an
//! application that takes its queue from configuration can too. Each scheme is there when its
//! feature is on; a broker (SQS, Azure, QStash, Inngest) keeps its failure records in a PostgreSQL
//! database ([`AnyOptions::with_records`]), so its scheme needs the `postgres` feature as well.
//! Credentials come from the environment, as each backend's SDK reads them:
//!
//! | scheme | backend | also reads |
//! |---|---|---|
//! | `postgres://`, `postgresql://` | PostgreSQL; records in the same schema | |
//! | `sqlite://PATH` | the SQLite file at `PATH` (refused if it does not exist, unless [`AnyOptions::create_if_missing`]) | |
//! | `sqs://QUEUE` | Amazon SQS | AWS's usual variables; `REDRIVE_SQS_ENDPOINT` (moto) |
//! | `azure://QUEUE` | Azure Queue Storage | `AZURE_STORAGE_CONNECTION_STRING` |
//! | `qstash://HOST/PATH` | Upstash QStash, the workers' receiver at `https://HOST/PATH` (`qstash+http://` for plain http, the emulator) | `QSTASH_TOKEN`, `QSTASH_URL` |
//! | `inngest://HOST/PATH?app=APP` | Inngest, the workers' serve endpoint at `https://HOST/PATH` (`inngest+http://` for plain http, the emulator); app `redrive` unless named | `INNGEST_EVENT_KEY`, `INNGEST_SIGNING_KEY`, `INNGEST_SIGNING_KEY_FALLBACK`, `INNGEST_BASE_URL` |
//!
//! # Flow control
//!
//! Every [`AnyBackend`] is a [`Flow`] store too (paused kinds, kinds' limits, their audit
//! trail), so that one value serves the `redrive kind` commands and the dashboard's Kinds page:
//! PostgreSQL and SQLite keep it in their own database; a broker keeps it in the PostgreSQL
//! database of its failure records ([`AnyOptions::with_records`]). The workers see what is
//! stored there through their ledger ([`Ledger::flow`](redrive_core::kit::Ledger::flow)), and a
//! broker's workers normally use that same database as their ledger: a pause made here holds for
//! them when it is, and not when their ledger is elsewhere.
//!
//! ```no_run
//! # async fn run() -> redrive::Result<()> {
//! use redrive::Flow;
//!
//! let backend = redrive::any::connect("postgres://localhost/app").await?;
//! backend.pause("charge_order", "the provider answers 503", "ada", None).await?;
//! # Ok(()) }
//! ```
//!
//! `AnyBackend` is the store itself, rather than lending one through an accessor: no type is
//! added to the public surface, and the one value a command or a dashboard holds does both jobs.
//! The price is in the variants: a broker's carries its records database beside the queue.
//!
//! A new backend registers here, in one place: a variant of [`AnyBackend`] and its arms in
//! `on!` and `flow!`, its scheme in [`SCHEMES`] and in [`AnyOptions::connect`], all behind its
//! feature. Errors never quote a URL: it may hold a password.

// A broker's variant needs `postgres` (its records database): with brokers alone the enum has
// no variant, every call's arguments go unused, and `connect` says which features are missing.
#![cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(unused_variables))]

use std::time::Duration;

use redrive_core::kit::{Backend, Capabilities, Slot, Tokens};
use redrive_core::{
    Blocked, CancelOutcome, Counts, DeadLetter, Enqueue, Enqueued, Error, ErrorKind, FailureId, FailureQuery,
    FailureRecord, Flow, FlowEvent, Forget, IdempotencyKey, JobId, JobQuery, Jobs, KindFlow, Limits, LiveJob, NewJob,
    QueueStats, Rate, Replay, ReplayOutcome, Result,
};

/// The backend a URL named. Every variant is the backend's own type, so an application that
/// needs more than these traits can match on it; a broker's variant carries the PostgreSQL
/// database of its failure records as well, which is its [`Flow`] store.
#[derive(Clone)]
#[non_exhaustive]
pub enum AnyBackend {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(redrive_postgres::PgBackend),
    /// One SQLite file.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(redrive_sqlite::SqliteBackend),
    /// Amazon SQS, and the database of its failure records and flow control.
    #[cfg(all(feature = "sqs", feature = "postgres"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "sqs", feature = "postgres"))))]
    Sqs(redrive_sqs::SqsBackend, redrive_postgres::PgBackend),
    /// Azure Queue Storage, and the database of its failure records and flow control.
    #[cfg(all(feature = "azure", feature = "postgres"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "azure", feature = "postgres"))))]
    Azure(redrive_azure::AzureBackend, redrive_postgres::PgBackend),
    /// Upstash QStash, and the database of its failure records and flow control.
    #[cfg(all(feature = "qstash", feature = "postgres"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "qstash", feature = "postgres"))))]
    QStash(redrive_qstash::QStashBackend, redrive_postgres::PgBackend),
    /// A pgmq queue, and the database of its failure records and flow control (the same one).
    #[cfg(feature = "pgmq")]
    #[cfg_attr(docsrs, doc(cfg(feature = "pgmq")))]
    Pgmq(redrive_pgmq::PgmqBackend, redrive_postgres::PgBackend),
    /// Inngest, and the database of its failure records and flow control.
    #[cfg(all(feature = "inngest", feature = "postgres"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "inngest", feature = "postgres"))))]
    Inngest(redrive_inngest::InngestBackend, redrive_postgres::PgBackend),
}

/// Runs the same call on whichever backend it is.
macro_rules! on {
    ($backend:expr, $b:ident => $call:expr) => {
        match *$backend {
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(ref $b) => $call,
            #[cfg(feature = "sqlite")]
            AnyBackend::Sqlite(ref $b) => $call,
            #[cfg(all(feature = "sqs", feature = "postgres"))]
            AnyBackend::Sqs(ref $b, _) => $call,
            #[cfg(all(feature = "azure", feature = "postgres"))]
            AnyBackend::Azure(ref $b, _) => $call,
            #[cfg(all(feature = "qstash", feature = "postgres"))]
            AnyBackend::QStash(ref $b, _) => $call,
            #[cfg(feature = "pgmq")]
            AnyBackend::Pgmq(ref $b, _) => $call,
            #[cfg(all(feature = "inngest", feature = "postgres"))]
            AnyBackend::Inngest(ref $b, _) => $call,
        }
    };
}

/// Runs the same call on whichever backend's [`Flow`] store it is: a broker's is its records'
/// database.
macro_rules! flow {
    ($backend:expr, $f:ident => $call:expr) => {
        match *$backend {
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(ref $f) => $call,
            #[cfg(feature = "sqlite")]
            AnyBackend::Sqlite(ref $f) => $call,
            #[cfg(all(feature = "sqs", feature = "postgres"))]
            AnyBackend::Sqs(_, ref $f) => $call,
            #[cfg(all(feature = "azure", feature = "postgres"))]
            AnyBackend::Azure(_, ref $f) => $call,
            #[cfg(all(feature = "qstash", feature = "postgres"))]
            AnyBackend::QStash(_, ref $f) => $call,
            #[cfg(feature = "pgmq")]
            AnyBackend::Pgmq(_, ref $f) => $call,
            #[cfg(all(feature = "inngest", feature = "postgres"))]
            AnyBackend::Inngest(_, ref $f) => $call,
        }
    };
}

impl AnyBackend {
    /// The scheme this backend is known by (`"postgres"`, `"sqs"`, …), for logs and pages.
    pub fn scheme(&self) -> &'static str {
        match *self {
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "postgres",
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => "sqlite",
            #[cfg(all(feature = "sqs", feature = "postgres"))]
            Self::Sqs(..) => "sqs",
            #[cfg(all(feature = "azure", feature = "postgres"))]
            Self::Azure(..) => "azure",
            #[cfg(all(feature = "qstash", feature = "postgres"))]
            Self::QStash(..) => "qstash",
            #[cfg(feature = "pgmq")]
            Self::Pgmq(..) => "pgmq",
            #[cfg(all(feature = "inngest", feature = "postgres"))]
            Self::Inngest(..) => "inngest",
        }
    }
}

impl std::fmt::Debug for AnyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The scheme only: not every backend's own type is `Debug`.
        f.debug_tuple("AnyBackend").field(&self.scheme()).finish()
    }
}

/// Each scheme this module knows, the features it needs, and whether this build has them: what
/// an unknown or unbuilt scheme's error says.
pub const SCHEMES: &[Scheme] = &[
    Scheme { names: &["postgres", "postgresql"], features: "postgres", built: cfg!(feature = "postgres") },
    Scheme { names: &["sqlite"], features: "sqlite", built: cfg!(feature = "sqlite") },
    Scheme { names: &["sqs"], features: "sqs, postgres", built: cfg!(all(feature = "sqs", feature = "postgres")) },
    Scheme {
        names: &["azure"],
        features: "azure, postgres",
        built: cfg!(all(feature = "azure", feature = "postgres")),
    },
    Scheme {
        names: &["qstash", "qstash+http"],
        features: "qstash, postgres",
        built: cfg!(all(feature = "qstash", feature = "postgres")),
    },
    Scheme { names: &["pgmq"], features: "pgmq", built: cfg!(feature = "pgmq") },
    Scheme {
        names: &["inngest", "inngest+http"],
        features: "inngest, postgres",
        built: cfg!(all(feature = "inngest", feature = "postgres")),
    },
];

/// A URL scheme of [`SCHEMES`].
#[derive(Debug, Clone, Copy)]
pub struct Scheme {
    /// The scheme's names, before `://`.
    pub names: &'static [&'static str],
    /// The cargo features of `redrive` it needs.
    pub features: &'static str,
    /// Whether this build has them.
    pub built: bool,
}

/// Connects to the backend `url` names, with the defaults of [`AnyOptions`]. A broker's URL
/// needs [`AnyOptions::with_records`].
pub async fn connect(url: &str) -> Result<AnyBackend> {
    AnyOptions::new(url).connect().await
}

/// A backend URL and what connecting to it may need besides.
#[derive(Clone)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub struct AnyOptions {
    url: String,
    records: Option<String>,
    schema: Option<String>,
    max_connections: Option<u32>,
    create_if_missing: bool,
    qstash_max_retries: Option<u32>,
}

impl std::fmt::Debug for AnyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs may hold passwords: only the scheme is shown.
        let scheme = self.url.split_once("://").map_or("?", |(scheme, _)| scheme);
        f.debug_struct("AnyOptions")
            .field("scheme", &scheme)
            .field("records", &self.records.as_ref().map(|_| "…"))
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("create_if_missing", &self.create_if_missing)
            .field("qstash_max_retries", &self.qstash_max_retries)
            .finish()
    }
}

impl AnyOptions {
    /// The backend at `url` (see the [module's table](crate::any)).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            records: None,
            schema: None,
            max_connections: None,
            create_if_missing: false,
            qstash_max_retries: None,
        }
    }

    /// The most retries the QStash plan allows a message (`QStashConfig::with_max_retries`); other
    /// backends ignore it.
    pub fn with_qstash_max_retries(mut self, retries: u32) -> Self {
        self.qstash_max_retries = Some(retries);
        self
    }

    /// The PostgreSQL database (`postgres://…`) where a broker (SQS, Azure, QStash) keeps its
    /// failure records and its flow control (normally the workers' ledger too); a store backend
    /// keeps its own and ignores it.
    pub fn with_records(mut self, url: impl Into<String>) -> Self {
        self.records = Some(url.into());
        self
    }

    /// The PostgreSQL schema of redrive's tables, the queue's or the records' (default `redrive`).
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// The most PostgreSQL connections to open (default: [`PgConfig`]'s). A command or a
    /// dashboard needs few.
    ///
    /// [`PgConfig`]: https://docs.rs/redrive-postgres/latest/redrive_postgres/struct.PgConfig.html
    pub fn with_max_connections(mut self, connections: u32) -> Self {
        self.max_connections = Some(connections);
        self
    }

    /// Creates a `sqlite://` file that does not exist. By default it is refused: opening would
    /// create it, and an operator's typo should not make an empty queue.
    pub fn create_if_missing(mut self) -> Self {
        self.create_if_missing = true;
        self
    }

    /// Connects to the backend.
    pub async fn connect(&self) -> Result<AnyBackend> {
        let Some((scheme, rest)) = self.url.split_once("://") else { return Err(unknown_scheme(None)) };
        match scheme {
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => Ok(AnyBackend::Postgres(self.postgres(&self.url).await?)),
            #[cfg(feature = "sqlite")]
            "sqlite" => {
                if !self.create_if_missing && !std::path::Path::new(rest).exists() {
                    return Err(Error::new(ErrorKind::NotFound, "no SQLite database at that path"));
                }
                let config = redrive_sqlite::SqliteConfig::new(rest);
                Ok(AnyBackend::Sqlite(redrive_sqlite::SqliteBackend::open(config).await?))
            }
            #[cfg(all(feature = "sqs", feature = "postgres"))]
            "sqs" => {
                let config = redrive_sqs::SqsConfig::new(rest);
                let records = self.records(scheme).await?;
                Ok(AnyBackend::Sqs(redrive_sqs::SqsBackend::connect(config, records.clone()).await?, records))
            }
            #[cfg(all(feature = "azure", feature = "postgres"))]
            "azure" => {
                let account = azure_account()?;
                let options = redrive_azure::QueueOptions::default();
                let records = self.records(scheme).await?;
                let queue = redrive_azure::AzureBackend::connect(&account, rest, options, records.clone()).await?;
                Ok(AnyBackend::Azure(queue, records))
            }
            #[cfg(feature = "pgmq")]
            "pgmq" => {
                let records = self.records(scheme).await?;
                let config = redrive_pgmq::PgmqConfig::new(rest);
                Ok(AnyBackend::Pgmq(redrive_pgmq::PgmqBackend::connect(config, records.clone()).await?, records))
            }
            #[cfg(all(feature = "qstash", feature = "postgres"))]
            "qstash" | "qstash+http" => {
                let config = self.qstash_config(scheme, rest)?;
                let records = self.records(scheme).await?;
                // The kinds' limits, kept in the same database, go to QStash as its flow control.
                let config = config.with_flow(records.clone());
                let queue =
                    redrive_qstash::QStashBackend::connect(config, std::sync::Arc::new(records.clone())).await?;
                Ok(AnyBackend::QStash(queue, records))
            }
            #[cfg(all(feature = "inngest", feature = "postgres"))]
            "inngest" | "inngest+http" => {
                let config = inngest_config_at(scheme, rest)?;
                let records = self.records(scheme).await?;
                let queue =
                    redrive_inngest::InngestBackend::connect(config, std::sync::Arc::new(records.clone())).await?;
                Ok(AnyBackend::Inngest(queue, records))
            }
            other => {
                let _ = rest;
                Err(unknown_scheme(Some(other)))
            }
        }
    }

    /// Checks the backend's configuration rules (`redrive doctor`), each with a verdict, what
    /// was found and the fix. It does not connect as [`Self::connect`] does, which refuses what
    /// the rules report (an SQS queue without its dead-letter queue, an Azure queue without its
    /// poison queue) or changes it (opening a SQLite file migrates it): it only reads.
    pub async fn doctor(&self, expect: &crate::doctor::Expect) -> Result<Vec<crate::doctor::Check>> {
        let Some((scheme, rest)) = self.url.split_once("://") else { return Err(unknown_scheme(None)) };
        let _ = (rest, expect);
        match scheme {
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => self.postgres(&self.url).await?.doctor(expect).await,
            #[cfg(feature = "sqlite")]
            "sqlite" => redrive_sqlite::doctor(std::path::Path::new(rest), expect).await,
            #[cfg(feature = "sqs")]
            "sqs" => self.beside_records(redrive_sqs::SqsConfig::new(rest).doctor(expect).await?, expect).await,
            #[cfg(feature = "azure")]
            "azure" => self.beside_records(azure_account()?.doctor(rest, expect).await?, expect).await,
            #[cfg(feature = "pgmq")]
            "pgmq" => {
                let records = self.records(scheme).await?;
                let mut checks = redrive_pgmq::PgmqConfig::new(rest).doctor(&records).await?;
                checks.extend(records.doctor_broker_records(expect).await?);
                Ok(checks)
            }
            #[cfg(feature = "qstash")]
            "qstash" | "qstash+http" => {
                self.beside_records(self.qstash_config(scheme, rest)?.doctor(expect).await?, expect).await
            }
            #[cfg(feature = "inngest")]
            "inngest" | "inngest+http" => {
                self.beside_records(inngest_config_at(scheme, rest)?.doctor(expect).await?, expect).await
            }
            other => Err(unknown_scheme(Some(other))),
        }
    }

    /// A broker's checks, and its records database's beside them: where its records, their
    /// alerts and its ledger are kept.
    #[cfg(any(feature = "sqs", feature = "azure", feature = "qstash", feature = "inngest"))]
    async fn beside_records(
        &self,
        mut checks: Vec<crate::doctor::Check>,
        expect: &crate::doctor::Expect,
    ) -> Result<Vec<crate::doctor::Check>> {
        #[cfg(feature = "postgres")]
        if let Some(url) = &self.records {
            checks.extend(self.postgres(url).await?.doctor_broker_records(expect).await?);
            return Ok(checks);
        }
        let _ = expect;
        checks.push(crate::doctor::Check::warn(
            "records.database",
            "no records database given: the failure records, their alerts and the ledger were not checked",
            "give the PostgreSQL database the workers keep them in (the command's --records or DATABASE_URL)",
        ));
        Ok(checks)
    }

    #[cfg(feature = "qstash")]
    fn qstash_config(&self, scheme: &str, rest: &str) -> Result<redrive_qstash::QStashConfig> {
        qstash_config_at(scheme, rest, self.qstash_max_retries)
    }

    #[cfg(feature = "postgres")]
    async fn postgres(&self, url: &str) -> Result<redrive_postgres::PgBackend> {
        let mut config = redrive_postgres::PgConfig::new(url);
        if let Some(schema) = &self.schema {
            config = config.with_schema(schema);
        }
        if let Some(connections) = self.max_connections {
            config = config.with_max_connections(connections);
        }
        redrive_postgres::PgBackend::connect(config).await
    }

    /// The database a broker keeps its failure records in.
    #[cfg(all(
        feature = "postgres",
        any(feature = "sqs", feature = "azure", feature = "qstash", feature = "pgmq", feature = "inngest")
    ))]
    async fn records(&self, scheme: &str) -> Result<redrive_postgres::PgBackend> {
        let url = self.records.as_deref().ok_or_else(|| {
            config_error(format!(
                "{scheme}:// keeps its failure records in a PostgreSQL database: give its URL \
                 (the command's --records or DATABASE_URL)"
            ))
        })?;
        self.postgres(url).await
    }
}

fn config_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Config, message)
}

/// The Azure account `AZURE_STORAGE_CONNECTION_STRING` names.
#[cfg(feature = "azure")]
fn azure_account() -> Result<redrive_azure::AzureConfig> {
    match std::env::var("AZURE_STORAGE_CONNECTION_STRING") {
        Ok(text) => redrive_azure::AzureConfig::from_connection_string(&text),
        Err(_) => Err(config_error("azure:// needs AZURE_STORAGE_CONNECTION_STRING")),
    }
}

/// The QStash settings of `qstash://HOST/PATH` (`qstash+http://` for the emulator): the
/// destination the workers' receiver is at (its records are scoped by it), `QSTASH_TOKEN`, and
/// `QSTASH_URL` when set.
#[cfg(feature = "qstash")]
fn qstash_config_at(scheme: &str, rest: &str, max_retries: Option<u32>) -> Result<redrive_qstash::QStashConfig> {
    let plain = scheme == "qstash+http";
    let destination = format!("{}://{rest}", if plain { "http" } else { "https" });
    let token = std::env::var("QSTASH_TOKEN").map_err(|_| config_error("qstash:// needs QSTASH_TOKEN"))?;
    let mut config = redrive_qstash::QStashConfig::new(token, destination);
    if let Ok(api) = std::env::var("QSTASH_URL") {
        config = config.with_api_url(api);
    }
    if plain {
        config = config.allow_plain_http();
    }
    if let Some(retries) = max_retries {
        config = config.with_max_retries(retries);
    }
    Ok(config)
}

/// The Inngest settings of `inngest://HOST/PATH?app=APP` (`inngest+http://` for the emulator): the
/// serve endpoint the workers mount, the app (its records are scoped by it), `INNGEST_EVENT_KEY`, `INNGEST_SIGNING_KEY` (and its fallback), and
/// `INNGEST_BASE_URL` when set.
#[cfg(feature = "inngest")]
fn inngest_config_at(scheme: &str, rest: &str) -> Result<redrive_inngest::InngestConfig> {
    let plain = scheme == "inngest+http";
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let serve_url = format!("{}://{path}", if plain { "http" } else { "https" });
    let var = |name: &str| std::env::var(name).map_err(|_| config_error(format!("inngest:// needs {name}")));
    let mut config =
        redrive_inngest::InngestConfig::new(var("INNGEST_EVENT_KEY")?, var("INNGEST_SIGNING_KEY")?, serve_url);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        config = match pair.split_once('=') {
            Some(("app", app)) => config.with_app_id(app),
            _ => return Err(config_error("inngest:// takes one parameter, app")),
        };
    }
    if let Ok(fallback) = std::env::var("INNGEST_SIGNING_KEY_FALLBACK") {
        config = config.with_signing_key_fallback(fallback);
    }
    if let Ok(base) = std::env::var("INNGEST_BASE_URL") {
        config = config.with_base_url(base);
    }
    if plain {
        config = config.allow_plain_http();
    }
    Ok(config)
}

/// The error for a scheme this build cannot connect to: which features it needs, or which
/// schemes there are.
fn unknown_scheme(scheme: Option<&str>) -> Error {
    if let Some(known) = SCHEMES.iter().find(|s| scheme.is_some_and(|name| s.names.contains(&name))) {
        return config_error(format!("{}:// needs redrive built with the features {}", known.names[0], known.features));
    }
    let built: Vec<String> =
        SCHEMES.iter().filter(|s| s.built).flat_map(|s| s.names.iter().map(|n| format!("{n}://"))).collect();
    Error::new(ErrorKind::InvalidName, format!("the backend URL must start with one of: {}", built.join(", ")))
}

impl Backend for AnyBackend {
    fn capabilities(&self) -> Capabilities {
        on!(self, b => b.capabilities())
    }

    fn messaging_system(&self) -> Option<&'static str> {
        on!(self, b => b.messaging_system())
    }

    fn messaging_destination(&self) -> Option<String> {
        on!(self, b => b.messaging_destination())
    }
}

impl Enqueue for AnyBackend {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        on!(self, b => b.enqueue(job).await)
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        on!(self, b => b.enqueue_batch(jobs).await)
    }
}

impl DeadLetter for AnyBackend {
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        on!(self, b => b.list(query).await)
    }

    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        on!(self, b => b.get(id).await)
    }

    async fn count_open(&self) -> Result<u64> {
        on!(self, b => b.count_open().await)
    }

    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        on!(self, b => b.discard(id, reason, actor).await)
    }

    async fn purge(&self, age: Duration) -> Result<u64> {
        on!(self, b => b.purge(age).await)
    }

    async fn blocked(&self) -> Result<Vec<Blocked>> {
        on!(self, b => b.blocked().await)
    }
}

impl Replay for AnyBackend {
    async fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        on!(self, b => b.replay(id, reason, actor).await)
    }

    async fn replay_amended(
        &self,
        id: &FailureId,
        payload: &serde_json::Value,
        reason: &str,
        actor: &str,
    ) -> Result<ReplayOutcome> {
        on!(self, b => b.replay_amended(id, payload, reason, actor).await)
    }
}

impl QueueStats for AnyBackend {
    async fn counts(&self) -> Result<Counts> {
        on!(self, b => b.counts().await)
    }
}

/// The live jobs of PostgreSQL and SQLite; a broker (SQS, Azure, QStash) refuses every call as
/// [`Unsupported`](ErrorKind::Unsupported), and shows its [`counts`](QueueStats::counts) instead.
impl Jobs for AnyBackend {
    async fn list_jobs(&self, query: &JobQuery) -> Result<Vec<LiveJob>> {
        on!(self, b => b.list_jobs(query).await)
    }

    async fn get_job(&self, id: &JobId) -> Result<LiveJob> {
        on!(self, b => b.get_job(id).await)
    }

    async fn cancel_job(&self, id: &JobId, reason: &str, actor: &str) -> Result<CancelOutcome> {
        on!(self, b => b.cancel_job(id, reason, actor).await)
    }

    /// A store's job of the key; a broker's key is marked in its records database, which its
    /// workers normally use as their ledger (see the [module's docs](crate::any#flow-control)):
    /// the key's next delivery completes unrun, and one running now is stopped.
    async fn cancel_key(
        &self,
        key: &IdempotencyKey,
        reason: &str,
        actor: &str,
    ) -> Result<(Option<JobId>, CancelOutcome)> {
        match *self {
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(ref b) => b.cancel_key(key, reason, actor).await,
            #[cfg(feature = "sqlite")]
            AnyBackend::Sqlite(ref b) => b.cancel_key(key, reason, actor).await,
            #[cfg(all(
                feature = "postgres",
                any(feature = "sqs", feature = "azure", feature = "qstash", feature = "pgmq", feature = "inngest")
            ))]
            _ => {
                let ledger = self.broker_ledger().expect("every other variant is a broker's");
                Ok((None, redrive_core::kit::Ledger::cancel_effect(ledger, key, reason, actor).await?))
            }
        }
    }
}

/// A store forgets its own keys; a broker's keys are forgotten in its records database (its
/// records, and its workers' ledger where they use it): its messages are not reached.
impl Forget for AnyBackend {
    async fn forget_key(&self, key: &IdempotencyKey) -> Result<redrive_core::Forgotten> {
        match *self {
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(ref b) => b.forget_key(key).await,
            #[cfg(feature = "sqlite")]
            AnyBackend::Sqlite(ref b) => b.forget_key(key).await,
            #[cfg(all(
                feature = "postgres",
                any(feature = "sqs", feature = "azure", feature = "qstash", feature = "pgmq", feature = "inngest")
            ))]
            _ => self.broker_ledger().expect("every other variant is a broker's").forget_key(key).await,
        }
    }
}

impl AnyBackend {
    /// A broker's records database, its workers' ledger.
    #[cfg(all(
        feature = "postgres",
        any(feature = "sqs", feature = "azure", feature = "qstash", feature = "pgmq", feature = "inngest")
    ))]
    fn broker_ledger(&self) -> Option<&redrive_postgres::PgBackend> {
        match *self {
            #[cfg(all(feature = "sqs", feature = "postgres"))]
            AnyBackend::Sqs(_, ref records) => Some(records),
            #[cfg(all(feature = "azure", feature = "postgres"))]
            AnyBackend::Azure(_, ref records) => Some(records),
            #[cfg(all(feature = "qstash", feature = "postgres"))]
            AnyBackend::QStash(_, ref records) => Some(records),
            #[cfg(feature = "pgmq")]
            AnyBackend::Pgmq(_, ref records) => Some(records),
            #[cfg(all(feature = "inngest", feature = "postgres"))]
            AnyBackend::Inngest(_, ref records) => Some(records),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

/// The flow store of the URL's database: the queue's own (PostgreSQL, SQLite), or a broker's
/// records' (see the [module's docs](crate::any#flow-control)).
impl Flow for AnyBackend {
    async fn kinds(&self) -> Result<Vec<KindFlow>> {
        flow!(self, f => f.kinds().await)
    }

    async fn pause(&self, kind: &str, reason: &str, by: &str, probe_after: Option<Duration>) -> Result<bool> {
        flow!(self, f => f.pause(kind, reason, by, probe_after).await)
    }

    async fn resume(&self, kind: &str, by: &str) -> Result<bool> {
        flow!(self, f => f.resume(kind, by).await)
    }

    async fn set_limits(&self, kind: &str, limits: &Limits, by: &str) -> Result<()> {
        flow!(self, f => f.set_limits(kind, limits, by).await)
    }

    async fn events(&self, kind: Option<&str>, limit: usize) -> Result<Vec<FlowEvent>> {
        flow!(self, f => f.events(kind, limit).await)
    }

    async fn take_probe(&self, kind: &str, cool_down: Duration) -> Result<bool> {
        flow!(self, f => f.take_probe(kind, cool_down).await)
    }

    async fn close_breaker(&self, kind: &str) -> Result<bool> {
        flow!(self, f => f.close_breaker(kind).await)
    }

    async fn take_tokens(&self, key: &str, rate: Rate, want: u32) -> Result<Tokens> {
        flow!(self, f => f.take_tokens(key, rate, want).await)
    }

    async fn take_slot(&self, key: &str, limit: u32, lease: Duration) -> Result<Option<Slot>> {
        flow!(self, f => f.take_slot(key, limit, lease).await)
    }

    async fn renew_slot(&self, slot: &Slot, lease: Duration) -> Result<bool> {
        flow!(self, f => f.renew_slot(slot, lease).await)
    }

    async fn release_slot(&self, slot: &Slot) -> Result<()> {
        flow!(self, f => f.release_slot(slot).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unknown_scheme_names_the_ones_there_are_and_never_the_url() {
        let e = connect("mysql://ada:secret@db/app").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidName);
        assert!(!e.to_string().contains("secret"), "{e}");
        assert!(e.to_string().contains("postgres://") == cfg!(feature = "postgres"), "{e}");
        let e = connect("no scheme at all").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidName);
    }

    #[tokio::test]
    async fn a_broker_without_a_records_database_is_a_config_error() {
        for url in ["sqs://orders", "azure://orders", "qstash://example.com/qstash"] {
            let e = connect(url).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{url}: {e}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_missing_sqlite_file_is_not_created_unless_asked() {
        let dir = std::env::temp_dir().join(format!("redrive-any-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("jobs.db");
        let url = format!("sqlite://{}", path.display());
        assert_eq!(connect(&url).await.unwrap_err().kind(), ErrorKind::NotFound);
        assert!(!path.exists());
        let backend = AnyOptions::new(&url).create_if_missing().connect().await.unwrap();
        assert_eq!(backend.scheme(), "sqlite");
        assert_eq!(backend.count_open().await.unwrap(), 0);
        drop(backend);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
