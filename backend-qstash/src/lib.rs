//! Upstash QStash backend for [redrive](https://docs.rs/redrive).
//!
//! QStash is hosted and pushes: it POSTs each message to your endpoint, retries on any answer
//! that is not 2xx, and moves what exhausts its retries into its dead-letter queue. This backend
//! makes the application's part (the key, the cap, the record and its alert, the replay) the
//! same handler code as on Postgres, SQS and Azure.
//!
//! | ability | how |
//! |---|---|
//! | enqueue | `POST /v2/publish/{destination}` (or `/v2/enqueue/{queue}/…`), `/v2/batch` for many (≤ 100 a call); the [envelope](redrive_core::kit::Envelope) as the body; `Upstash-Retries` = cap − 1; `Upstash-Not-Before` for a scheduled job |
//! | dedupe | `Upstash-Deduplication-Id` = SHA-256 of the destination, the key and the payload's fingerprint: a copy within QStash's window (10 minutes, below) is dropped, the same key with another payload is delivered and becomes a key-conflict record |
//! | claim | push: [`QStashBackend::receiver`] verifies `Upstash-Signature` (before reading the body; each token once) and parks the delivery, at most [`QStashConfig::with_max_parked`] at once (past it 503 with `Retry-After`), until a worker's verdict answers it; attempt = `Upstash-Retried` + 1 + the attempts earlier copies spent (carried under this backend's seal) |
//! | complete | 2xx |
//! | retry, defer | publish the next copy (its delay, the attempts spent, the error history, the job's id), then 2xx; if that publish fails, a non-2xx answer with `Retry-After` lets QStash retry |
//! | release | back to this process's waiting deliveries (no request) |
//! | renew | the parked delivery waits longer, up to the delivery timeout |
//! | dead letter | 489 with `Upstash-NonRetryable-Error: true`: QStash moves the message to its DLQ, which is the record |
//! | failure records | this destination's DLQ entries (the list's `url` filter, each entry's `url` checked: the DLQ is the account's, shared by every app on the token) listed into a [`RecordStore`](redrive_core::kit::RecordStore) (your database), where reads are complete and paged, and discards keep reason and actor; the DLQ entry stays while the record is open |
//! | replay | take the record in the store, `POST /v2/dlq/retry/{dlqId}` on an entry checked to be this destination's, close the record; where QStash answers the retry as deduplicated (sent nothing) or the entry is gone, a publish from the record under a deduplication id of its own |
//! | flow control | with [`QStashConfig::with_flow`], a kind's `concurrency` and `rate` (read from the workers' flow store, at most every 5 s) go on each of its messages (enqueue, batch, the copies a retry or deferral publishes, a replay) as QStash's own flow control: `Upstash-Flow-Control-Key` = a hash of the destination and the kind (QStash's keys are the account's), `Upstash-Flow-Control-Value` = `parallelism=…, rate=…, period=…s`; QStash then holds back what the worker would defer and publish again. A rate QStash cannot count exactly is sent with its count per a period no shorter (a fractional period rounded up, one over 7 days scaled down) or, under a second, left to the worker. QStash counts in fixed windows (up to twice the count can start across a window's edge), and while messages sent before a limit was lowered wait, the highest of their limits passes: per-key limits and exactness stay with the worker, which keeps every limit regardless |
//! | unhandled kinds | a kind no claim of this process asked for is handed back unclaimed [`with_unclaimed_rounds`](QStashConfig::with_unclaimed_rounds) times, then dead-lettered as a record |
//! | effect ledger | not here: pass your database's (e.g. `redrive-postgres`) to the worker |
//!
//! **QStash's deduplication window is 10 minutes**, declared as `Dedupe::Window(10 min)`. The
//! sources disagree: the API reference says 10 minutes twice (the publish endpoint's
//! `Upstash-Deduplication-Id`, "If a message with the same deduplication ID was published in the
//! last 10 minutes, the new message will be ignored", in `upstash/docs` `qstash/openapi.yaml`;
//! and <https://upstash.com/docs/qstash/features/deduplication>, "The deduplication window is 10
//! minutes"), while `@upstash/qstash`'s JSDoc of `deduplicationId` (`src/client/client.ts`,
//! v2.12) says "We store deduplication ids for 90 days", copied by the community `qstash-rs`;
//! PyPI `qstash` states no length. The reference is the service's contract; and nothing here
//! depends on the window's end: no id is published again to send anything again, and the
//! `deduplicated` answer of a DLQ retry is read.
//!
//! **A crash** (the process killed) charges one attempt to every delivery whose request was open,
//! started by a worker or not: QStash retries each, and its retry count is all a delivery carries
//! of it. Everywhere else the receiver gives the attempt back: a delivery unclaimed within the park
//! limit goes back as a copy, one whose connection closed is forgotten before a worker starts it,
//! one refused past the park bound is not counted by this process. On a graceful stop, stop the
//! workers first and let the server drain its connections for the park limit: the deliveries still
//! waiting go back as copies, unspent.
//!
//! Mount the receiver at the public URL you configured:
//!
//! ```no_run
//! # async fn run(store: redrive_core::MemoryBackend) -> redrive_core::Result<()> {
//! # let store: std::sync::Arc<dyn redrive_core::kit::RecordStore> = todo!();
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
mod doctor;
mod error;
mod flow;
mod receiver;
mod signature;

pub use backend::QStashBackend;
pub use config::{Clock, QStashConfig, SigningKeys};
