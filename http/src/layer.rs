//! The layer and its service.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use redrive_core::{Begin, ErrorKind, Hold, IdempotencyKey, Ledger, ProviderKey};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

/// The request header that carries the key.
const KEY_HEADER: &str = "idempotency-key";
/// Set on a response served from the store.
const REPLAYED: &str = "idempotent-replayed";
/// Set on a replay whose first body was too large to keep.
const OMITTED: &str = "idempotent-body-omitted";

/// The client a key belongs to, named by the application (its authentication) as a request
/// extension before the layer runs: two clients' equal keys are then two keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyScope(pub String);

/// The layer: `Idempotency::new(ledger)`, then its options, then `.layer(…)` it.
pub struct Idempotency<L> {
    ledger: Arc<L>,
    required: bool,
    hold: Duration,
    max_body: usize,
    max_stored: usize,
    kept_headers: Vec<HeaderName>,
}

impl<L> Clone for Idempotency<L> {
    fn clone(&self) -> Self {
        Self {
            ledger: Arc::clone(&self.ledger),
            required: self.required,
            hold: self.hold,
            max_body: self.max_body,
            max_stored: self.max_stored,
            kept_headers: self.kept_headers.clone(),
        }
    }
}

impl<L: Ledger + 'static> Idempotency<L> {
    /// Keys on `ledger`; a request without a key passes through.
    pub fn new(ledger: L) -> Self {
        Self {
            ledger: Arc::new(ledger),
            required: false,
            hold: Duration::from_secs(30),
            max_body: 1024 * 1024,
            max_stored: 64 * 1024,
            kept_headers: vec![header::CONTENT_TYPE, header::LOCATION],
        }
    }

    /// A `POST`, `PUT` or `PATCH` without a key is refused with `400`.
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// How long a first request holds its key without answering before a repeat may run it
    /// again (it is renewed while the request runs, so only a dead process lets it lapse).
    pub fn hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }

    /// The largest request body read (its fingerprint tells a changed body); over it, `413`.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The largest response body stored for repeats.
    pub fn max_stored(mut self, bytes: usize) -> Self {
        self.max_stored = bytes;
        self
    }

    /// Also keeps this response header for repeats (`content-type` and `location` are kept).
    pub fn keep_header(mut self, name: HeaderName) -> Self {
        self.kept_headers.push(name);
        self
    }
}

impl<S, L> tower_layer::Layer<S> for Idempotency<L> {
    type Service = IdempotencyService<S, L>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService { inner, config: Arc::new(self.clone()) }
    }
}

/// The service the layer wraps a route (or router) in.
pub struct IdempotencyService<S, L> {
    inner: S,
    config: Arc<Idempotency<L>>,
}

impl<S: Clone, L> Clone for IdempotencyService<S, L> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), config: Arc::clone(&self.config) }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, L> tower_service::Service<Request<Body>> for IdempotencyService<S, L>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    L: Ledger + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The clone that was polled ready serves this call; the fresh clone waits for the next.
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        let config = Arc::clone(&self.config);
        Box::pin(async move { Ok(handle(config, inner, request).await) })
    }
}

/// A response as stored in the ledger.
#[derive(Serialize, Deserialize)]
struct Stored {
    status: u16,
    headers: Vec<(String, String)>,
    /// Base64; `None` when the body was over the size limit.
    body: Option<String>,
}

fn plain(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(json!({ "error": message }).to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The key of `value` for `scope`: 1 to 255 visible ASCII characters, or `None`.
fn key_of(value: &HeaderValue, scope: &str) -> Option<IdempotencyKey> {
    let text = value.to_str().ok()?;
    let visible = !text.is_empty() && text.len() <= 255 && text.bytes().all(|b| b.is_ascii_graphic());
    if !visible {
        return None;
    }
    IdempotencyKey::builder("http").fact("client", scope).fact("key", text).build().ok()
}

async fn handle<S, L>(config: Arc<Idempotency<L>>, inner: S, request: Request<Body>) -> Response<Body>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send,
    S::Future: Send,
    L: Ledger,
{
    let mut inner = inner;
    if matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS | Method::DELETE) {
        return run(&mut inner, request).await;
    }
    let scope = request.extensions().get::<IdempotencyScope>().map_or("anonymous", |s| s.0.as_str()).to_owned();
    let key = match request.headers().get(KEY_HEADER) {
        None if config.required => {
            return plain(StatusCode::BAD_REQUEST, "this endpoint needs an Idempotency-Key header");
        }
        None => return run(&mut inner, request).await,
        Some(value) => match key_of(value, &scope) {
            Some(key) => key,
            None => {
                return plain(StatusCode::BAD_REQUEST, "the Idempotency-Key must be 1 to 255 visible ASCII characters");
            }
        },
    };
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, config.max_body).await else {
        return plain(StatusCode::PAYLOAD_TOO_LARGE, "the request body is over the limit");
    };
    // What makes a repeat the same request: method, path with query, and body.
    let fingerprint = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path_and_query().map_or("", |p| p.as_str()),
        "body_sha256": hex::encode(Sha256::digest(&bytes)),
    });
    let begun = config.ledger.begin(&key, &fingerprint, ProviderKey::mint(), config.hold).await;
    let hold = match begun {
        Ok(Begin::Fresh(hold) | Begin::Resumed(hold)) => hold,
        Ok(Begin::Done(stored)) => return replay(stored),
        Ok(Begin::Busy(left)) => {
            let mut response = plain(StatusCode::CONFLICT, "a request with this Idempotency-Key is still running");
            let seconds = left.as_secs_f64().ceil().max(1.0) as u64;
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            return response;
        }
        Err(e) if e.kind() == ErrorKind::KeyConflict => {
            return plain(
                StatusCode::UNPROCESSABLE_ENTITY,
                "this Idempotency-Key was used with another method, path or body",
            );
        }
        Err(e) => {
            warn!(key = %key, error = %e, "the effect ledger is unavailable");
            let mut response = plain(StatusCode::SERVICE_UNAVAILABLE, "the idempotency store is unavailable");
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
    };
    let request = Request::from_parts(parts, Body::from(bytes));
    let response = {
        let running = run(&mut inner, request);
        tokio::pin!(running);
        // The first renewal a third of the hold from now (a tick due now would wait for the
        // timer's next millisecond).
        let every = config.hold / 3;
        let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                response = &mut running => break response,
                _ = renew.tick() => {
                    if let Err(e) = config.ledger.extend_hold(&hold, config.hold).await {
                        debug!(key = %key, error = %e, "could not renew the key's hold");
                    }
                }
            }
        }
    };
    store(&config, &key, &hold, response).await
}

async fn run<S>(inner: &mut S, request: Request<Body>) -> Response<Body>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    match inner.call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// Keeps `response` for repeats, and sends it on.
async fn store<L: Ledger>(
    config: &Idempotency<L>,
    key: &IdempotencyKey,
    hold: &Hold,
    response: Response<Body>,
) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => {
            // The handler's body failed midway: nothing to keep, and the client sees the error.
            warn!(key = %key, error = %e, "the response body failed; the key is released");
            let _ = config.ledger.release_hold(hold).await;
            return plain(StatusCode::INTERNAL_SERVER_ERROR, "the response failed");
        }
    };
    let headers = kept(&parts.headers, &config.kept_headers);
    let body = (bytes.len() <= config.max_stored).then(|| STANDARD.encode(&bytes));
    let stored = Stored { status: parts.status.as_u16(), headers, body };
    let value = serde_json::to_value(&stored).unwrap_or_default();
    if let Err(e) = config.ledger.finish(hold, &value).await {
        warn!(key = %key, error = %e, "the response could not be stored; a repeat will run again once the hold lapses");
    }
    Response::from_parts(parts, Body::from(bytes))
}

fn kept(headers: &HeaderMap, names: &[HeaderName]) -> Vec<(String, String)> {
    names
        .iter()
        .flat_map(|name| headers.get_all(name).iter().map(move |v| (name, v)))
        .filter_map(|(name, v)| Some((name.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect()
}

/// The stored response, marked as a replay.
fn replay(stored: serde_json::Value) -> Response<Body> {
    let Ok(stored) = serde_json::from_value::<Stored>(stored) else {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "the stored response does not read back");
    };
    let body = stored.body.as_deref().map(|b| STANDARD.decode(b).unwrap_or_default());
    let omitted = body.is_none();
    let mut response = Response::new(Body::from(body.unwrap_or_default()));
    *response.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    for (name, value) in &stored.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(value)) {
            headers.append(name, value);
        }
    }
    headers.insert(REPLAYED, HeaderValue::from_static("true"));
    if omitted {
        headers.insert(OMITTED, HeaderValue::from_static("true"));
    }
    response
}
