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
//!
//! # The sqlx it is built on
//!
//! [`PgBackend::pool`], [`PgBackend::from_pool`], [`PgBackend::enqueue_in`] and
//! [`PgBackend::effect_tx`] take and give sqlx types, which only match the sqlx version this crate
//! was built with. It is re-exported as [`redrive_postgres::sqlx`](crate::sqlx) (and
//! `redrive::postgres::sqlx`): use it instead of a dependency of your own, or depend on the same
//! version (0.9).
//!
//! ```no_run
//! # async fn run() -> redrive_core::Result<()> {
//! use redrive_postgres::sqlx::{self, Row};
//! use redrive_postgres::{PgBackend, PgConfig};
//!
//! let backend = PgBackend::connect(PgConfig::from_env()?).await?;
//! let row = sqlx::query("SELECT 1").fetch_one(backend.pool()).await.expect("a row");
//! let one: i32 = row.get(0);
//! # let _ = one;
//! # Ok(()) }
//! ```

mod backend;
mod batch;
mod config;
mod error;
mod ledger_batch;
mod sql;

pub use backend::{EffectOnce, PgBackend};
pub use config::PgConfig;
/// The sqlx this crate is built with: its types are the ones [`PgBackend::pool`] and
/// [`PgBackend::enqueue_in`] use.
pub use sqlx;
