//! PostgreSQL backend for [redrive](https://docs.rs/redrive).
//!
//! One schema holds the queue (`jobs`, a unique index on the idempotency key), the failure
//! records (`failed_jobs`) and the effect ledger (`processed_keys`, `applied_effects`).
//!
//! ```no_run
//! # async fn run() -> redrive_core::Result<()> {
//! use redrive_postgres::{PgBackend, PgConfig};
//!
//! let backend = PgBackend::connect(PgConfig::from_env()?.with_schema("jobs")).await?;
//! backend.migrate().await?;
//! # Ok(()) }
//! ```
//!
//! | ability | how |
//! |---|---|
//! | enqueue dedupe | `INSERT … ON CONFLICT DO NOTHING` on the key; another payload is `KeyConflict` |
//! | enqueue in your transaction | [`PgBackend::enqueue_in`], then [`PgBackend::wake`] after commit |
//! | claim | `FOR UPDATE SKIP LOCKED`, attempts counted, a lease token fencing every settlement |
//! | wake-ups | `LISTEN/NOTIFY`, sent after commit, with polling as the fallback |
//! | stuck jobs | claims sweep expired leases back to the queue, in database time |
//! | effect ledger | the job row for its own key; `processed_keys` for other queues' keys |
//! | same-database effects | [`PgBackend::effect_once`] / [`PgBackend::effect_tx`]: key and effect in one transaction |
//! | failure records | `failed_jobs` with the error history, discard, purge, replay in one statement |

mod backend;
mod batch;
mod config;
mod error;
mod sql;

pub use backend::{EffectOnce, PgBackend};
pub use config::PgConfig;
