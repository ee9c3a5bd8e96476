//! A web dashboard for redrive's failure records, on any backend: the open records by kind and
//! severity, one record's payload beside its error history, replay and discard with a
//! confirmation, records searched by kind, state, age and error text, bulk replay and bulk
//! discard of a filter with their progress, the audit trail (who closed each
//! record and why, as the records keep it), the queue's depth, and a Prometheus `/metrics`.
//! A Jobs page lists the live jobs where the backend stores them (queued, scheduled, running,
//! done, failed, cancelled; filtered by kind, key, state and age), shows one with its payload and
//! errors so far, and cancels a queued or scheduled one with a confirmation.
//! A Charts page draws, as inline SVG, the records opened and closed per hour by kind over the
//! last day, and the queue's depth and oldest ready wait as the dashboard samples them
//! ([`Dashboard::with_sample_every`]; kept 24 hours in its memory).
//! Given a flow store ([`Dashboard::with_flow`]), a Kinds page too: paused kinds with who, why
//! and since, each kind's limits and their history; pause (with a confirmation), resume and set
//! limits.
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
//!
//! # Signing in
//!
//! - Behind TLS, say so, so that the cookies are `Secure` (a browser then never sends the
//!   session over plain http): [`Dashboard::with_public_url`] with the `https://` URL operators
//!   open, or [`Dashboard::trust_forwarded_proto`] when the proxy in front sets
//!   `X-Forwarded-Proto` on every request. The header alone is not trusted: a client can send it.
//! - Wrong tokens (at sign-in, or as a bearer token) are throttled: 5 a minute per client
//!   address and 20 a minute in all, then `429 Too Many Requests` with `Retry-After`, even for
//!   the right token, until the minute ends. Behind a proxy every client has the proxy's
//!   address, so the limit in all is the one that holds. At most 10,000 addresses are tracked.
//!   A [`router`](Dashboard::router) mounted in an app of your own sees addresses only when
//!   served with `into_make_service_with_connect_info::<SocketAddr>()`; else the limit in all.
//! - After signing in, the browser is sent only to a path on the dashboard: `next` is refused
//!   unless it is printable ASCII starting with one `/` (no `//`, no backslash, no tab or
//!   newline, which browsers drop, turning `/\t/evil.example` into `//evil.example`).
//! - Sessions last 12 hours, in the process's memory. `/logout` signs this browser out (the
//!   server forgets the session, the cookie is cleared) or every browser ("sign out
//!   everywhere"). Changing the token means restarting the dashboard, which ends every session.

mod auth;
mod bulk;
mod charts;
mod filter;
mod jobs;
mod kinds;
mod pages;
mod views;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum_extra::extract::cookie::CookieJar;
use metrics_exporter_prometheus::PrometheusHandle;
use redrive_core::{DeadLetter, Error, ErrorKind, Flow, Jobs, QueueStats, Replay, Result};
use tokio::net::TcpListener;

use crate::auth::{Auth, CSRF_COOKIE, Client, Https};
use crate::kinds::FlowStore;

/// What the dashboard needs of a backend: its failure records, replay, its queue's counts, and
/// its live jobs (a broker refuses those, and the Jobs page shows its counts instead). Every
/// redrive backend is one.
pub trait Records: DeadLetter + Replay + QueueStats + Jobs + 'static {}

impl<T: DeadLetter + Replay + QueueStats + Jobs + 'static> Records for T {}

/// The dashboard over one backend. Build it, then [`serve`](Self::serve) it or mount its
/// [`router`](Self::router) in your own axum app.
pub struct Dashboard<B> {
    backend: B,
    token: Option<String>,
    metrics: Option<PrometheusHandle>,
    https: Https,
    flow: Option<Arc<dyn FlowStore>>,
    sample_every: Duration,
}

impl<B: Records> Dashboard<B> {
    /// A dashboard over `backend`, with no token, no metrics and no Kinds page.
    pub fn new(backend: B) -> Self {
        Self {
            backend,
            token: None,
            metrics: None,
            https: Https::default(),
            flow: None,
            sample_every: Duration::from_secs(60),
        }
    }

    /// Adds the Kinds page over this flow store: the paused kinds (who, why, since, a breaker's
    /// next probe), each kind's limits and the history of both; pausing (with a confirmation),
    /// resuming and setting limits, each kept with the operator's name as replays and discards
    /// are. Give it the store the workers' ledger uses ([`Ledger::flow`]): the backend itself
    /// for PostgreSQL and SQLite, a broker's records database (`redrive serve` passes its
    /// `AnyBackend`, which is both).
    ///
    /// A store of its own rather than a bound on `B`: a broker's backend keeps no flow, and a
    /// dashboard without one stays as it was.
    ///
    /// [`Ledger::flow`]: redrive_core::kit::Ledger::flow
    pub fn with_flow(mut self, store: impl Flow + 'static) -> Self {
        self.flow = Some(Arc::new(store));
        self
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

    /// The URL operators open (`https://ops.example.com/`). An `https://` URL, TLS at a proxy in
    /// front, makes the dashboard's cookies `Secure`.
    pub fn with_public_url(mut self, url: &str) -> Result<Self> {
        let scheme = url.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("https") => self.https.always = true,
            Some("http") => self.https.always = false,
            _ => {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("the dashboard's public URL {url:?} is not an http:// or https:// URL"),
                ));
            }
        }
        Ok(self)
    }

    /// Trusts `X-Forwarded-Proto`: a request it says came over `https` gets `Secure` cookies.
    /// Only behind a proxy that sets the header on every request (a client can send it too).
    pub fn trust_forwarded_proto(mut self) -> Self {
        self.https.forwarded = true;
        self
    }

    /// Serves `/metrics` from this Prometheus recorder's handle, with the queue's depth, the
    /// open records and the oldest open record's age read at each scrape. A worker in the same
    /// process adds its own counters there.
    pub fn with_metrics(mut self, handle: PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// How often the Charts page's queue depth and oldest ready wait are sampled: every minute
    /// unless set (at least a second). The samples are kept 24 hours in this process's memory,
    /// from when [`router`](Self::router) is built (in a tokio runtime, which the sampling
    /// runs on) until the router is dropped.
    pub fn with_sample_every(mut self, every: Duration) -> Result<Self> {
        if every < Duration::from_secs(1) {
            return Err(Error::new(ErrorKind::Config, "the dashboard samples the queue at most once a second"));
        }
        self.sample_every = every;
        Ok(self)
    }

    /// The dashboard's routes, to mount in an app of your own. Without a token, keep that app on
    /// loopback: [`serve`](Self::serve) checks it, a router cannot.
    pub fn router(self) -> Router {
        let app = Arc::new(App {
            backend: self.backend,
            auth: Auth::new(self.token, self.https),
            metrics: self.metrics,
            bulk: bulk::Runs::default(),
            flow: self.flow,
            samples: charts::Samples::new(self.sample_every),
        });
        charts::start_sampling(&app);
        pages::routes::<B>()
            .merge(charts::routes::<B>())
            .merge(kinds::routes::<B>())
            .merge(jobs::routes::<B>())
            .route("/metrics", get(pages::metrics::<B>))
            .route("/logout", get(auth::sign_out_page::<B>).post(auth::sign_out::<B>))
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
        // With each client's address, for the sign-in throttle.
        let app = self.router().into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(|e| io("stopped", e))
    }
}

/// The state every page shares.
pub(crate) struct App<B> {
    pub(crate) backend: B,
    pub(crate) auth: Auth,
    pub(crate) metrics: Option<PrometheusHandle>,
    pub(crate) bulk: bulk::Runs,
    /// The flow store, if the Kinds page is on.
    pub(crate) flow: Option<Arc<dyn FlowStore>>,
    /// The queue's samples for the Charts page.
    pub(crate) samples: charts::Samples,
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
    let client = Client(request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    request.extensions_mut().insert(client);
    let https = app.auth.https(request.headers());
    let path = request.uri().path();
    let admitted = if path == "/login" { Ok(true) } else { app.auth.admits(request.headers(), &jar, client) };
    let mut response = match admitted {
        Ok(true) => next.run(request).await,
        Err(wait) => auth::throttled(wait),
        Ok(false) if request.method() == Method::GET && path != "/metrics" => {
            let back = request.uri().path_and_query().map_or("/", |p| p.as_str());
            Redirect::to(&format!("/login?next={}", pages::encode(back))).into_response()
        }
        Ok(false) => (StatusCode::UNAUTHORIZED, "sign in first, or send the token as a bearer token\n").into_response(),
    };
    let headers = response.headers_mut();
    let cookie = auth::strict_cookie(CSRF_COOKIE, csrf, https);
    if fresh && let Ok(value) = HeaderValue::from_str(&cookie.to_string()) {
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
