//! Where the database is and how the backend behaves.

use std::path::PathBuf;
use std::time::Duration;

pub use sqlx::sqlite::SqliteSynchronous;

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
