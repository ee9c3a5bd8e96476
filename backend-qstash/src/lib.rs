//! Upstash QStash backend for [redrive](https://docs.rs/redrive).
//!
//! QStash is hosted and pushes: it POSTs each message to your endpoint, retries on any answer
//! that is not 2xx, and moves what exhausts its retries into its dead-letter queue. This backend
//! makes the application's part (the key, the cap, the record and its alert, the replay) the
//! same handler code as on Postgres, SQS and Azure.
//!
//! | ability | how |
//! |---|---|
//! | enqueue | `POST /v2/publish/{destination}` (or `/v2/enqueue/{queue}/…`), `/v2/batch` for many (≤ 100 a call); the [envelope](redrive_core::Envelope) as the body; `Upstash-Retries` = cap − 1; `Upstash-Not-Before` for a scheduled job |
//! | dedupe | `Upstash-Deduplication-Id` = SHA-256 of the key and the payload's fingerprint: a copy within QStash's window is dropped, the same key with another payload is delivered and becomes a key-conflict record |
//! | claim | push: [`QStashBackend::receiver`] verifies `Upstash-Signature` and parks the delivery until a worker's verdict answers it; attempt = `Upstash-Retried` + 1 + the attempts earlier copies spent |
//! | complete | 2xx |
//! | retry, defer | publish the next copy (its delay, the attempts spent, the error history, the job's id), then 2xx; if that publish fails, a non-2xx answer with `Retry-After` lets QStash retry |
//! | release | back to this process's waiting deliveries (no request) |
//! | renew | the parked delivery waits longer, up to the delivery timeout |
//! | dead letter | 489 with `Upstash-NonRetryable-Error: true`: QStash moves the message to its DLQ, which is the record |
//! | failure records | the DLQ listed (with its cursor) into a [`RecordStore`](redrive_core::RecordStore) (your database), where reads are complete and paged, and discards keep reason and actor; the DLQ entry stays while the record is open |
//! | replay | take the record in the store, `POST /v2/dlq/retry/{dlqId}`, close the record: never a republish with the same deduplication id, which QStash would swallow for its window |
//! | effect ledger | not here: pass your database's (e.g. `redrive-postgres`) to the worker |
//!
//! Mount the receiver at the public URL you configured:
//!
//! ```no_run
//! # async fn run(store: redrive_core::MemoryBackend) -> redrive_core::Result<()> {
//! # let store: std::sync::Arc<dyn redrive_core::RecordStore> = todo!();
//! use redrive_qstash::{QStashBackend, QStashConfig};
//!
//! let config = QStashConfig::new(std::env::var("QSTASH_TOKEN").unwrap(), "https://app.example.com/qstash");
//! let backend = QStashBackend::connect(config, store).await?;
//! let app: axum::Router = axum::Router::new().route("/qstash", backend.receiver());
//! # Ok(()) }
//! ```

mod api;
mod backend;
mod config;
mod dead;
mod receiver;
mod signature;

pub use backend::QStashBackend;
pub use config::{Clock, QStashConfig, SigningKeys};
