//! Where the database is and how the backend behaves.

use std::path::PathBuf;
use std::time::Duration;

use redrive_core::{Error, ErrorKind, Result};
pub use sqlx::sqlite::SqliteSynchronous;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

use crate::SqliteBackend;
use crate::error::db;
use crate::sql;

/// The SQLite backend's configuration: a file (created if missing), or an in-memory database for
/// tests.
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    pub(crate) path: Option<PathBuf>,
    pub(crate) readers: u32,
    pub(crate) busy_timeout: Duration,
    pub(crate) synchronous: SqliteSynchronous,
    pub(crate) max_payload: usize,
    pub(crate) poll: Duration,
}

impl SqliteConfig {
    /// The database in the file at `path`, created if missing: WAL mode, one writer, four
    /// readers, a 5 s busy timeout, `synchronous = FULL` (a job acknowledged survives a power
    /// loss).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: Some(path.into()),
            readers: 4,
            busy_timeout: Duration::from_secs(5),
            synchronous: SqliteSynchronous::Full,
            max_payload: 1024 * 1024,
            poll: Duration::from_millis(200),
        }
    }

    /// A private in-memory database on one connection: nothing is kept when it is dropped.
    pub fn memory() -> Self {
        Self { path: None, readers: 0, ..Self::new("") }
    }

    /// Reader connections beside the writer (lists, counts, records); at least one for a file.
    pub fn with_readers(mut self, readers: u32) -> Self {
        self.readers = readers.max(1);
        self
    }

    /// How long a statement waits for another process's write lock before it fails as busy: a
    /// temporary error, and a worker tries a settlement that meets it again while it keeps the
    /// job's lease.
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// `NORMAL` survives a crash of the process (kill -9) but may lose the last commits to a power
    /// loss; `FULL` (the default) syncs every commit.
    pub fn with_synchronous(mut self, synchronous: SqliteSynchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// The largest payload accepted, in bytes (1 MiB by default).
    pub fn with_max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }

    /// How often a waiting claim looks for jobs another process enqueued (this process's
    /// enqueues wake it at once).
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }
}

impl SqliteBackend {
    /// Opens (or creates) the database and brings its tables up to date. A file that is not a
    /// SQLite database, or that another process holds locked past the busy timeout, is a clear
    /// error here rather than at the first job.
    pub async fn open(config: SqliteConfig) -> Result<Self> {
        let base = match &config.path {
            Some(path) => {
                SqliteConnectOptions::new().filename(path).create_if_missing(true).journal_mode(SqliteJournalMode::Wal)
            }
            None => SqliteConnectOptions::new().in_memory(true),
        };
        let base = base.busy_timeout(config.busy_timeout).synchronous(config.synchronous).foreign_keys(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            // Writes queue for the one connection; a long queue is not an error.
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(base.clone())
            .await
            .map_err(|e| db(e, "open the database"))?;
        let reader = match config.path {
            Some(_) => SqlitePoolOptions::new()
                .max_connections(config.readers.max(1))
                .connect_with(base.read_only(true))
                .await
                .map_err(|e| db(e, "open the database for reading"))?,
            None => writer.clone(),
        };
        let backend = Self::from_pools(writer, reader, config);
        backend.migrate().await?;
        Ok(backend)
    }

    async fn migrate(&self) -> Result<()> {
        sql::migrator().run(self.pool()).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => db(e, "migrate"),
            e => Error::new(ErrorKind::Backend, "sqlite: migration failed").with_source(e),
        })
    }
}
