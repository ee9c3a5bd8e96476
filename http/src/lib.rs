//! redrive at the HTTP edge. Providers' webhooks: [`webhook::Inbox`] verifies a delivery,
//! keys it by the provider's event id and enqueues one job per event.
//!
//! `Idempotency-Key` for your own HTTP endpoints: the rule redrive applies to jobs, at the HTTP
//! layer. A tower layer (mount it in axum with `.layer(…)`) on the effect ledger of any backend
//! that has one (Postgres, SQLite, memory).
//!
//! ```no_run
//! # async fn run(ledger: redrive_core::MemoryBackend) {
//! use axum::extract::Request;
//! use axum::middleware::{self, Next};
//! use axum::response::Response;
//! use axum::{Router, routing::post};
//! use redrive_http::{Idempotency, IdempotencyScope};
//!
//! /// The application's authentication names the client its keys belong to.
//! async fn authenticate(mut request: Request, next: Next) -> Response {
//!     let client = "acme"; // from the verified token or session
//!     request.extensions_mut().insert(IdempotencyScope(client.to_owned()));
//!     next.run(request).await
//! }
//!
//! let app: Router = Router::new()
//!     .route("/charges", post(|| async { "charged" }))
//!     .layer(Idempotency::new(ledger).required())
//!     .layer(middleware::from_fn(authenticate)); // the outer layer: it runs first
//! # }
//! ```
//!
//! # The rules it follows
//!
//! The IETF draft (`draft-ietf-httpapi-idempotency-key-header`) expired without becoming a
//! standard, so these are redrive's, after Stripe's:
//!
//! - The key is the `Idempotency-Key` header: 1 to 255 visible ASCII characters, chosen by the
//!   client (a UUID is usual).
//! - Keys are scoped by client: the application's authentication puts an [`IdempotencyScope`]
//!   in the request's extensions before this layer, and two clients' equal keys are two keys. A
//!   keyed request without one is refused with `500` (logged once: the server is misconfigured,
//!   not the client), since in one shared scope a client sending another's key and body would
//!   get that client's stored answer, with whatever it holds (a name, an echoed token). An API
//!   with one client says so with [`Idempotency::unscoped`].
//! - `GET`, `HEAD`, `OPTIONS` and `DELETE` pass through: they are idempotent already.
//! - The first request with a key runs, **to its end whatever its client does**: the handler,
//!   its body and the storing of its answer run in a task of their own, so a client that times
//!   out, closes its connection and retries is charged once and gets the answer it missed. Its
//!   response (status, the headers named by [`Idempotency::keep_header`], `content-type` and
//!   `location` by default, and the body) is stored, **whether it succeeded or failed**. A
//!   repeat gets the stored response with `Idempotent-Replayed: true`, and the handler does not
//!   run.
//! - The first client gets the body as the handler writes it; the body ends once the answer is
//!   stored, so a client that has read it whole finds it stored.
//! - A repeat while the first is still running gets `409 Conflict` with `Retry-After`, at once:
//!   waiting for the answer would hold a connection and a task per retry of a client that has
//!   already timed out once (Stripe answers 409 too).
//! - The same key with another method, path or body gets `422 Unprocessable Entity`.
//! - A missing key on a layer that [requires](Idempotency::required) one gets `400`; a malformed
//!   one always does. A request body over the limit gets `413`.
//! - A response body over [`Idempotency::max_stored`] (64 KiB by default) is not stored: repeats
//!   get its status with an empty body and `Idempotent-Body-Omitted: true`.
//! - Credentials are never stored: `keep_header` refuses `set-cookie`, `authorization` and the
//!   like (and the framing headers), and skips a value the handler marks sensitive.
//! - The first request holds its key for [`Idempotency::hold`] (30 s), renewed while the handler
//!   runs, its body streams and its answer is stored; a store that fails for a temporary reason
//!   is tried again for a minute meanwhile. Only a dead process (or a store that keeps failing)
//!   lets the hold lapse; after that a repeat runs the handler again.
//! - Keys are kept until the backend lets them go: run `prune_done(24 h)` (Postgres, SQLite)
//!   daily to keep them a day, as Stripe does; the memory ledger lets done keys go after 24 h by
//!   itself ([`MemoryBackend::with_ledger_retention`]). A key used again after that is a new
//!   request.
//!
//! [`MemoryBackend::with_ledger_retention`]: redrive_core::MemoryBackend::with_ledger_retention

mod layer;
pub mod webhook;

pub use layer::{Idempotency, IdempotencyScope, IdempotencyService};
