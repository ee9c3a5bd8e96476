//! `Idempotency-Key` for your own HTTP endpoints: the rule redrive applies to jobs, at the HTTP
//! layer. A tower layer (mount it in axum with `.layer(…)`) on the effect ledger of any backend
//! that has one (Postgres, SQLite, memory).
//!
//! ```no_run
//! # async fn run(ledger: redrive_core::MemoryBackend) {
//! use axum::{Router, routing::post};
//! use redrive_http::Idempotency;
//!
//! let app: Router = Router::new()
//!     .route("/charges", post(|| async { "charged" }))
//!     .layer(Idempotency::new(ledger).required());
//! # }
//! ```
//!
//! # The rules it follows
//!
//! The IETF draft (`draft-ietf-httpapi-idempotency-key-header`) expired without becoming a
//! standard, so these are redrive's, after Stripe's:
//!
//! - The key is the `Idempotency-Key` header: 1 to 255 visible ASCII characters, chosen by the
//!   client (a UUID is usual). Keys are scoped by client where the application names one: put an
//!   [`IdempotencyScope`] in the request's extensions (from your authentication) before this layer.
//! - `GET`, `HEAD`, `OPTIONS` and `DELETE` pass through: they are idempotent already.
//! - The first request with a key runs. Its response (status, the headers named by
//!   [`Idempotency::keep_header`], `content-type` and `location` by default, and the body) is
//!   stored, **whether it succeeded or failed**. A repeat gets the stored response with
//!   `Idempotent-Replayed: true`, and the handler does not run.
//! - A repeat while the first is still running gets `409 Conflict` with `Retry-After`.
//! - The same key with another method, path or body gets `422 Unprocessable Entity`.
//! - A missing key on a layer that [requires](Idempotency::required) one gets `400`; a malformed
//!   one always does. A request body over the limit gets `413`.
//! - A response body over [`Idempotency::max_stored`] (64 KiB by default) is not stored: repeats
//!   get its status with an empty body and `Idempotent-Body-Omitted: true`.
//! - A first request whose process dies before it answers holds the key for
//!   [`Idempotency::hold`] (30 s, renewed while it runs); after that a repeat runs it again.
//! - Keys are kept until the backend prunes them: run `prune_done(24 h)` (Postgres, SQLite) daily
//!   to let keys go after a day, as Stripe does. A key used again after it was pruned is a new
//!   request.

mod layer;

pub use layer::{Idempotency, IdempotencyScope, IdempotencyService};
