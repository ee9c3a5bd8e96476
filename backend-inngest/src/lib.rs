//! Inngest backend for [redrive](https://docs.rs/redrive).
//!
//! Inngest runs functions for events and calls the application's serve endpoint for each step,
//! retrying calls that get no answer, and announces a run that fails with
//! `inngest/function.failed`. This backend makes the application's part (the key, the cap, the
//! record and its alert, the replay) the same handler code as on every other backend. It speaks
//! Inngest's HTTP protocol itself: the `inngest` crate is an alpha on axum 0.6 and reqwest 0.11
//! (`docs/notes/inngest-design.md`).
//!
//! | ability | how |
//! |---|---|
//! | enqueue | one event per job, `redrive/<app>`, the [envelope](redrive_core::kit::Envelope) as its `data`, its `id` a hash of the app, the key and the payload's fingerprint; 100 events a request for many |
//! | dedupe | Inngest runs a function once for an event id for 24 hours, and its event API answers a copy as it answers the first: [`Dedupe::Unreported`](redrive_core::kit::Dedupe::Unreported) (24 h). A copy with another payload has another id, runs, and becomes a key-conflict record |
//! | claim | push: [`InngestBackend::endpoint`] checks `X-Inngest-Signature` (the signing key or its fallback, 5 minutes' leeway) on the raw body and parks the call, at most [`InngestConfig::with_max_parked`] at once, until a worker's verdict answers it |
//! | attempt | the run's memoized steps: each retry or deferral answers first with a mark (a `StepRun` holding the attempts spent and the error) and then its sleep; the attempt is the last mark's spent attempts, plus Inngest's calls again since (`ctx.attempt`: calls that got no answer), plus one |
//! | complete | 200 |
//! | retry | the mark with the error, then a sleep of the delay |
//! | defer | the mark without an error (no attempt spent), then the sleep |
//! | long runs | a call of a run near Inngest's 1,000 steps is not parked: the job's event is sent again, carrying its id, the attempts spent, the error history and the wait, and the run completes ([`InngestConfig::with_max_steps`]) |
//! | release | back to this process's waiting calls (no request) |
//! | renew | the parked call waits longer, up to [`InngestConfig::with_call_timeout`] |
//! | dead letter | the record written to the store (its id the run's), then 400 with `X-Inngest-No-Retry: true`: the run fails |
//! | failure records | the store ([`RecordStore`](redrive_core::kit::RecordStore), your database), scoped to the app; a run Inngest fails on its own (its calls again spent on crashes) reaches the app's failure handler (`<app>-jobs-failure`, on `inngest/function.failed`), which keeps its record with the original event's job, Inngest's error and the run's id |
//! | replay | take the record, send its job as a new event under an id of the job's and the record's (the job's own is inside Inngest's 24 hours and would be dropped), close the record |
//! | effect ledger | not here: pass your database's (e.g. `redrive-postgres`) to the worker |
//!
//! What Inngest cannot do here: order per key, priorities, listing or cancelling live jobs; a
//! delay past 7 days. **A crash** charges one attempt to each call whose request was open:
//! Inngest calls it again.
//!
//! ```no_run
//! # async fn run(store: std::sync::Arc<dyn redrive_core::kit::RecordStore>) -> redrive_core::Result<()> {
//! use redrive_inngest::{InngestBackend, InngestConfig};
//!
//! let config = InngestConfig::new(
//!     std::env::var("INNGEST_EVENT_KEY").unwrap(),
//!     std::env::var("INNGEST_SIGNING_KEY").unwrap(),
//!     "https://app.example.com/api/inngest",
//! );
//! let backend = InngestBackend::connect(config, store).await?;
//! let app: axum::Router = axum::Router::new().route("/api/inngest", backend.endpoint());
//! backend.sync().await?;
//! # Ok(()) }
//! ```

mod api;
mod backend;
mod config;
mod doctor;
mod endpoint;
mod error;
mod signature;
mod steps;

pub use backend::InngestBackend;
pub use config::InngestConfig;
