//! redrive on SQLite: a durable embedded backend. Jobs, their keys, failure records and the
//! effect ledger live in one file (WAL mode), so a single-binary app keeps them across restarts
//! with no server to run.
//!
//! ```no_run
//! # async fn run() -> redrive_core::Result<()> {
//! use redrive_sqlite::{SqliteBackend, SqliteConfig};
//!
//! let backend = SqliteBackend::open(SqliteConfig::new("jobs.db")).await?;
//! // Worker::builder(backend.clone(), backend.clone()) … as on any backend.
//! # Ok(()) }
//! ```
//!
//! The sqlx version [`SqliteBackend::pool`] belongs to is re-exported as [`sqlx`], for the
//! application's transactions ([`SqliteBackend::enqueue_in`], [`SqliteBackend::effect_once`]).

mod backend;
mod config;
mod doctor;
mod error;
mod sql;

pub use backend::{EffectOnce, SqliteBackend};
pub use config::{SqliteConfig, SqliteSynchronous};
pub use doctor::doctor;
pub use sqlx;
