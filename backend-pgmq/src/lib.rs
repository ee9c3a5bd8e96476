//! pgmq (Supabase Queues) backend for [redrive](https://docs.rs/redrive).
//!
//! pgmq is a message queue in PostgreSQL: a table per queue, read with a visibility timeout,
//! each read counted. It has no dead-letter queue (its maintainers' advice is to check `read_ct`
//! and archive); this backend adds redrive's half: the cap, the failure record with its alert,
//! the replay, and settlements fenced so that a worker whose lease lapsed cannot settle a message
//! another worker now holds. The records and the effect ledger are the [`PgBackend`] of the same
//! database.
//!
//! | ability | how |
//! |---|---|
//! | enqueue | one transaction: the key's row in the records' `broker_keys`, and `pgmq.send` with the [envelope](redrive_core::kit::Envelope) as the message and the job's `not_before` as its visibility time; a batch whole or not at all; inside the application's own transaction with [`PgmqBackend::enqueue_in`] |
//! | dedupe | exact, by the key's row: a second enqueue answers `Duplicate` (or `Failed` while its record is kept), another payload `KeyConflict`; kept until [`PgmqBackend::prune_keys`] or a purge of the key's record |
//! | claim | `pgmq.read`'s statement, by the envelope's `kind` (the lease in whole seconds), and in the same transaction the claimed jobs' keys taken in the effect ledger (`processed_keys`), so that the queue is its jobs' ledger as the Postgres backend is; attempt = `read_ct`; the lease's token is the read's `last_read_at` |
//! | complete | pgmq's delete, fenced on the read (`LeaseLost` if another read took the message), and the key marked done with the handler's result, concurrent completions in one statement |
//! | retry | hidden for the delay (fenced), the error history in the message's `headers` (`redrive.errors`) |
//! | defer, release | hidden for the delay (fenced), the read given back (`read_ct` − 1) |
//! | renew | `set_vt`'s update, fenced on the read, and the key's hold extended (`Cancelled` once a person cancelled the key) |
//! | dead letter | one transaction: the message locked under this read, its record kept, the message moved to the archive (`pgmq.archive`) |
//! | failure records | [`PgBackend`]'s broker records, scope `pgmq:<schema>.<queue>`, through the broker kit |
//! | replay | take the record, `pgmq.send` the job with its keys (the key's row moved to it in the same transaction), close the record |
//! | queue stats | `pgmq.metrics` (exact) |
//!
//! ```no_run
//! # async fn run() -> redrive_core::Result<()> {
//! use redrive_pgmq::{PgmqBackend, PgmqConfig};
//! use redrive_postgres::{PgBackend, PgConfig};
//!
//! let records = PgBackend::connect(PgConfig::new("postgres://localhost/app")).await?;
//! records.migrate().await?;
//! let queue = PgmqBackend::setup(PgmqConfig::new("jobs"), records.clone()).await?;
//! // Worker::builder(queue, records) ...
//! # Ok(()) }
//! ```

mod backend;
mod completer;
mod config;
mod doctor;
mod error;
mod sql;

pub use backend::PgmqBackend;
pub use config::PgmqConfig;
pub use redrive_postgres::PgBackend;
