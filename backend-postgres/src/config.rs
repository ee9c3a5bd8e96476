//! How to reach the database and how the backend behaves.

use std::time::Duration;

use redrive_core::{Error, ErrorKind, Result};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::PgBackend;
use crate::error::db;
use crate::sql::{check_schema, migrator};

/// The Postgres backend's configuration. `PgConfig::from_env()` reads `DATABASE_URL` and,
/// optionally, `REDRIVE_PG_SCHEMA`.
#[derive(Clone)]
pub struct PgConfig {
    pub(crate) url: String,
    pub(crate) schema: String,
    pub(crate) max_connections: u32,
    pub(crate) max_payload: usize,
    pub(crate) poll: Duration,
    pub(crate) sweep_every: Duration,
    pub(crate) listen: bool,
    pub(crate) application_name: String,
    pub(crate) in_flight: usize,
}

// The URL may hold a password: never printed.
impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConfig")
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("max_payload", &self.max_payload)
            .field("poll", &self.poll)
            .field("sweep_every", &self.sweep_every)
            .field("listen", &self.listen)
            .field("application_name", &self.application_name)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl PgConfig {
    /// Connects to `url` (`postgres://user@host:port/db`), schema `redrive`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: "redrive".into(),
            max_connections: 10,
            max_payload: 1024 * 1024,
            poll: Duration::from_secs(1),
            sweep_every: Duration::from_secs(1),
            listen: true,
            application_name: "redrive".into(),
            in_flight: 3,
        }
    }

    /// From `DATABASE_URL`, and `REDRIVE_PG_SCHEMA` if set.
    pub fn from_env() -> Result<Self> {
        let url =
            std::env::var("DATABASE_URL").map_err(|_| Error::new(ErrorKind::Config, "DATABASE_URL is not set"))?;
        let config = Self::new(url);
        Ok(match std::env::var("REDRIVE_PG_SCHEMA") {
            Ok(schema) => config.with_schema(schema),
            Err(_) => config,
        })
    }

    /// The schema holding redrive's tables (checked at connect: `[a-z_][a-z0-9_]*`, at most 48).
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The pool size (default 10).
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(2);
        self
    }

    /// The largest payload accepted, in bytes of compact JSON (default 1 MiB).
    pub fn with_max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }

    /// How often an idle claim looks for work without a notification (default 1 s).
    pub fn with_poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// How often claims also return expired leases to the queue (default 1 s).
    pub fn with_sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = every;
        self
    }

    /// The `application_name` the connections show in `pg_stat_activity` (default `redrive`).
    pub fn with_application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// How many claim and completion statements this backend runs at once (default 3, at least
    /// 1), whatever the pool's size. A few overlap a worker's round trips; more only crowd the
    /// database, and several worker processes on one queue multiply them: on two cores, four
    /// processes with up to seven statements each burned down at 0.76× the rate of one process,
    /// with three each at about 0.9× (`docs/BENCHMARKS.md`).
    pub fn with_in_flight(mut self, statements: usize) -> Self {
        self.in_flight = statements.max(1);
        self
    }

    /// Turns LISTEN/NOTIFY wake-ups off, leaving polling alone (default on).
    pub fn with_listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }
}

/// Connections a pool opens when it is created: one per default claimer, and one for completions.
const WARM_CONNECTIONS: u32 = 5;

impl PgBackend {
    /// Connects a pool with `config`. Run [`migrate`](Self::migrate) once before use.
    pub async fn connect(config: PgConfig) -> Result<Self> {
        check_schema(&config.schema)?;
        let options: PgConnectOptions = config
            .url
            .parse()
            .map_err(|_| Error::new(ErrorKind::Config, "the Postgres connection URL does not parse"))?;
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            // Opened up front: a worker's first claims and completions should not wait for them.
            .min_connections(config.max_connections.min(WARM_CONNECTIONS))
            .connect_with(options.application_name(&config.application_name))
            .await
            .map_err(|e| db(e, "connect to Postgres"))?;
        Self::from_pool(pool, config)
    }

    /// Creates the schema and its tables, or brings them up to date. Safe to run from many
    /// processes at once (it takes an advisory lock).
    pub async fn migrate(&self) -> Result<()> {
        migrator(self.schema())
            .run(self.pool())
            .await
            .map_err(|e| Error::new(ErrorKind::Backend, "migration failed").with_source(e))
    }
}
