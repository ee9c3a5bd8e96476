//! The backend a URL names, behind one type: every command works the same on each.

use std::time::Duration;

use redrive_azure::{AzureBackend, AzureConfig, QueueOptions};
use redrive_core::{
    Counts, DeadLetter, Error, ErrorKind, FailureId, FailureQuery, FailureRecord, QueueStats, Replay, ReplayOutcome,
    Result, Severity,
};
use redrive_postgres::{PgBackend, PgConfig};
use redrive_qstash::{QStashBackend, QStashConfig};
use redrive_sqlite::{SqliteBackend, SqliteConfig};
use redrive_sqs::{SqsBackend, SqsConfig};

use crate::Cli;

pub(crate) enum Target {
    Postgres(PgBackend),
    Sqs(SqsBackend),
    Azure(AzureBackend),
    QStash(QStashBackend),
    Sqlite(SqliteBackend),
}

/// Runs the same call on whichever backend it is.
macro_rules! on {
    ($target:expr, $b:ident => $call:expr) => {
        match $target {
            Target::Postgres($b) => $call,
            Target::Sqs($b) => $call,
            Target::Azure($b) => $call,
            Target::QStash($b) => $call,
            Target::Sqlite($b) => $call,
        }
    };
}

fn config_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Config, message)
}

impl Target {
    /// Connects to the backend `--backend` (or `REDRIVE_URL`) names. Errors never quote a URL:
    /// it may hold a password.
    pub(crate) async fn connect(cli: &Cli) -> Result<Self> {
        let url = cli.backend.as_deref().ok_or_else(|| {
            config_error(
                "no backend: pass --backend (postgres://…, sqlite://PATH, sqs://QUEUE, azure://QUEUE, \
                 qstash://HOST/PATH) or set REDRIVE_URL",
            )
        })?;
        let database =
            |url: &str| PgBackend::connect(PgConfig::new(url).with_schema(&cli.schema).with_max_connections(2));
        let records = || async {
            let url = cli.records.as_deref().ok_or_else(|| {
                config_error(
                    "the queue's failure records are in a database: pass --records postgres://… or set DATABASE_URL",
                )
            })?;
            database(url).await
        };
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres(database(url).await?))
        } else if let Some(path) = url.strip_prefix("sqlite://") {
            if !std::path::Path::new(path).exists() {
                // Opening would create it: an operator's typo should not make an empty queue.
                return Err(Error::new(ErrorKind::NotFound, "no SQLite database at that path"));
            }
            Ok(Self::Sqlite(SqliteBackend::open(SqliteConfig::new(path)).await?))
        } else if let Some(queue) = url.strip_prefix("sqs://") {
            Ok(Self::Sqs(SqsBackend::connect(SqsConfig::new(queue), records().await?).await?))
        } else if let Some(queue) = url.strip_prefix("azure://") {
            let account = match std::env::var("AZURE_STORAGE_CONNECTION_STRING") {
                Ok(text) => AzureConfig::from_connection_string(&text)?,
                Err(_) => return Err(config_error("azure:// needs AZURE_STORAGE_CONNECTION_STRING")),
            };
            Ok(Self::Azure(AzureBackend::connect(&account, queue, QueueOptions::default(), records().await?).await?))
        } else if let Some((scheme, endpoint)) = url.split_once("://")
            && (scheme == "qstash" || scheme == "qstash+http")
        {
            // The destination the workers' receiver is at: its records are scoped by it.
            let plain = scheme == "qstash+http";
            let destination = format!("{}://{endpoint}", if plain { "http" } else { "https" });
            let token = std::env::var("QSTASH_TOKEN").map_err(|_| config_error("qstash:// needs QSTASH_TOKEN"))?;
            let mut config = QStashConfig::new(token, destination);
            if let Ok(api) = std::env::var("QSTASH_URL") {
                config = config.with_api_url(api);
            }
            if plain {
                config = config.allow_plain_http();
            }
            Ok(Self::QStash(QStashBackend::connect(config, std::sync::Arc::new(records().await?)).await?))
        } else {
            Err(Error::new(
                ErrorKind::InvalidName,
                "the backend URL must start with postgres://, sqlite://, sqs://, azure:// or qstash://",
            ))
        }
    }

    /// One page of records matching `query`, of `severity` if given (filtered here: the stores
    /// do not index it).
    pub(crate) async fn list_of(&self, query: &FailureQuery, severity: Option<Severity>) -> Result<Vec<FailureRecord>> {
        let page = self.list(query).await?;
        Ok(page.into_iter().filter(|r| severity.is_none_or(|s| r.severity == s)).collect())
    }
}

// The traits, so that the dashboard takes a `Target` like any backend.
impl DeadLetter for Target {
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
}

impl Replay for Target {
    async fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        on!(self, b => b.replay(id, reason, actor).await)
    }
}

impl QueueStats for Target {
    async fn counts(&self) -> Result<Counts> {
        on!(self, b => b.counts().await)
    }
}
