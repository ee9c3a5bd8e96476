//! A web dashboard for redrive's failure records, on any backend: the open records by kind and
//! severity, one record's payload beside its error history, replay and discard with a
//! confirmation, bulk replay of a filter with its progress, the audit trail (who closed each
//! record and why, as the records keep it), the queue's depth, and a Prometheus `/metrics`.
//!
//! ```no_run
//! # async fn run(backend: redrive_core::MemoryBackend) -> Result<(), Box<dyn std::error::Error>> {
//! use redrive_dashboard::Dashboard;
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! Dashboard::new(backend).serve(listener, redrive_core::stop_signal()).await?;
//! # Ok(()) }
//! ```
//!
//! Bound to loopback it needs no token: whoever reaches it is on the machine. Bound beyond,
//! [`Dashboard::serve`] refuses to start without one ([`Dashboard::with_token`]); operators sign
//! in with it once, scrapers send it as a bearer token. Put TLS in front of it there. Every form
//! carries a CSRF token, every page is rendered on the server with its text escaped, and no page
//! runs a script.

mod auth;
mod bulk;
mod pages;
mod views;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum_extra::extract::cookie::CookieJar;
use metrics_exporter_prometheus::PrometheusHandle;
use redrive_core::{DeadLetter, Error, ErrorKind, QueueStats, Replay, Result};
use tokio::net::TcpListener;

use crate::auth::{Auth, CSRF_COOKIE};

/// What the dashboard needs of a backend: its failure records, replay, and its queue's counts.
/// Every redrive backend is one.
pub trait Records: DeadLetter + Replay + QueueStats + 'static {}

impl<T: DeadLetter + Replay + QueueStats + 'static> Records for T {}

/// The dashboard over one backend. Build it, then [`serve`](Self::serve) it or mount its
/// [`router`](Self::router) in your own axum app.
pub struct Dashboard<B> {
    backend: B,
    token: Option<String>,
    metrics: Option<PrometheusHandle>,
}

impl<B: Records> Dashboard<B> {
    /// A dashboard over `backend`, with no token and no metrics.
    pub fn new(backend: B) -> Self {
        Self { backend, token: None, metrics: None }
    }

    /// Requires `token` to sign in (and as a bearer token on `/metrics`). At least 16
    /// characters: it guards payloads and replays.
    pub fn with_token(mut self, token: impl Into<String>) -> Result<Self> {
        let token = token.into();
        if token.chars().count() < 16 {
            return Err(Error::new(ErrorKind::Config, "the dashboard's token must be at least 16 characters"));
        }
        self.token = Some(token);
        Ok(self)
    }

    /// Serves `/metrics` from this Prometheus recorder's handle, with the queue's depth, the
    /// open records and the oldest open record's age read at each scrape. A worker in the same
    /// process adds its own counters there.
    pub fn with_metrics(mut self, handle: PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// The dashboard's routes, to mount in an app of your own. Without a token, keep that app on
    /// loopback: [`serve`](Self::serve) checks it, a router cannot.
    pub fn router(self) -> Router {
        let app = Arc::new(App {
            backend: self.backend,
            auth: Auth::new(self.token),
            metrics: self.metrics,
            bulk: bulk::Runs::default(),
        });
        pages::routes::<B>()
            .route("/metrics", get(pages::metrics::<B>))
            .layer(middleware::from_fn_with_state(app.clone(), guard::<B>))
            .with_state(app)
    }

    /// Serves the dashboard on `listener` until `shutdown` completes. Refuses an address beyond
    /// loopback without a token.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let io = |what: &str, e: std::io::Error| {
            Error::new(ErrorKind::Config, format!("the dashboard {what}")).with_source(e)
        };
        let address = listener.local_addr().map_err(|e| io("has no address", e))?;
        if !address.ip().is_loopback() && self.token.is_none() {
            return Err(Error::new(
                ErrorKind::Config,
                format!("the dashboard on {address} is reachable beyond this machine: give it a token"),
            ));
        }
        tracing::info!(%address, token = self.token.is_some(), "dashboard listening");
        axum::serve(listener, self.router()).with_graceful_shutdown(shutdown).await.map_err(|e| io("stopped", e))
    }
}

/// The state every page shares.
pub(crate) struct App<B> {
    pub(crate) backend: B,
    pub(crate) auth: Auth,
    pub(crate) metrics: Option<PrometheusHandle>,
    pub(crate) bulk: bulk::Runs,
}

/// The CSRF token of this browser, for the forms a page renders.
#[derive(Clone)]
pub(crate) struct Csrf(pub(crate) String);

/// Admits operators, sends others to sign in, gives every browser its CSRF cookie, and sets
/// the headers every page carries.
async fn guard<B: Records>(
    State(app): State<Arc<App<B>>>,
    jar: CookieJar,
    mut request: Request,
    next: Next,
) -> Response {
    let (csrf, fresh) = match jar.get(CSRF_COOKIE) {
        Some(cookie) if cookie.value().len() == 64 => (cookie.value().to_owned(), false),
        _ => (auth::random_token(), true),
    };
    request.extensions_mut().insert(Csrf(csrf.clone()));
    let path = request.uri().path();
    let open_path = path == "/login";
    let mut response = if open_path || app.auth.admits(request.headers(), &jar) {
        next.run(request).await
    } else if request.method() == Method::GET && path != "/metrics" {
        let back = request.uri().path_and_query().map_or("/", |p| p.as_str());
        Redirect::to(&format!("/login?next={}", pages::encode(back))).into_response()
    } else {
        (StatusCode::UNAUTHORIZED, "sign in first, or send the token as a bearer token\n").into_response()
    };
    let headers = response.headers_mut();
    if fresh && let Ok(value) = HeaderValue::from_str(&auth::strict_cookie(CSRF_COOKIE, csrf).to_string()) {
        headers.append(header::SET_COOKIE, value);
    }
    // No scripts, no frames, no caching of payloads, no referrer leaking record ids to other
    // sites (`no-referrer` would make browsers send `Origin: null` on our own forms).
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
