//! The layer and its service.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use backon::{ExponentialBuilder, Retryable};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http_body::Frame;
use redrive_core::kit::{Begin, Hold, Ledger};
use redrive_core::{ErrorKind, IdempotencyKey, ProviderKey};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, warn};

/// The request header that carries the key.
const KEY_HEADER: &str = "idempotency-key";
/// Set on a response served from the store.
const REPLAYED: &str = "idempotent-replayed";
/// Set on a replay whose first body was too large to keep.
const OMITTED: &str = "idempotent-body-omitted";
/// The scope of requests without one, on an [unscoped](Idempotency::unscoped) layer.
const SHARED_SCOPE: &str = "anonymous";

/// Response headers [`Idempotency::keep_header`] refuses: credentials, which belong to the first
/// client alone (a repeat may come from anyone who learned the key), and the message's framing,
/// which the replay sets for its own body.
const NEVER_KEPT: [&str; 13] = [
    "set-cookie",
    "set-cookie2",
    "cookie",
    "authorization",
    "proxy-authorization",
    "connection",
    "content-length",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// How a failed `finish` (the answer stored) is tried again: from 100 ms, doubling to 5 s, for a
/// minute, the key's hold renewed meanwhile.
const FINISH_RETRY: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_max_delay(Duration::from_secs(5))
    .with_jitter()
    .without_max_times()
    .with_total_delay(Some(Duration::from_secs(60)));

/// The client a key belongs to, named by the application (its authentication) as a request
/// extension before the layer runs: two clients' equal keys are then two keys. A keyed request
/// without one is refused unless the layer is [unscoped](Idempotency::unscoped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyScope(pub String);

/// The layer: `Idempotency::new(ledger)`, then its options, then `.layer(…)` it.
pub struct Idempotency<L> {
    ledger: Arc<L>,
    required: bool,
    unscoped: bool,
    hold: Duration,
    max_body: usize,
    max_stored: usize,
    kept_headers: Vec<HeaderName>,
    /// A missing scope is logged once per layer, not once per request.
    scope_missing: Arc<Once>,
}

impl<L> Clone for Idempotency<L> {
    fn clone(&self) -> Self {
        Self {
            ledger: Arc::clone(&self.ledger),
            required: self.required,
            unscoped: self.unscoped,
            hold: self.hold,
            max_body: self.max_body,
            max_stored: self.max_stored,
            kept_headers: self.kept_headers.clone(),
            scope_missing: Arc::clone(&self.scope_missing),
        }
    }
}

impl<L: Ledger + 'static> Idempotency<L> {
    /// Keys on `ledger`; a request without a key passes through. A keyed request needs an
    /// [`IdempotencyScope`] unless the layer is [unscoped](Self::unscoped).
    pub fn new(ledger: L) -> Self {
        Self {
            ledger: Arc::new(ledger),
            required: false,
            unscoped: false,
            hold: Duration::from_secs(30),
            max_body: 1024 * 1024,
            max_stored: 64 * 1024,
            kept_headers: vec![header::CONTENT_TYPE, header::LOCATION],
            scope_missing: Arc::new(Once::new()),
        }
    }

    /// Requests without an [`IdempotencyScope`] share one scope: for an API with one client (an
    /// internal service, a single tenant). Without this, such a request is refused with `500`
    /// (the server is misconfigured, not the client), because in one shared scope a client
    /// sending another's key and body would get that client's stored answer.
    pub fn unscoped(mut self) -> Self {
        self.unscoped = true;
        self
    }

    /// A `POST`, `PUT` or `PATCH` without a key is refused with `400`.
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// How long a first request holds its key without answering before a repeat may run it
    /// again (30 s). It is renewed every third of it while the handler runs, its body streams
    /// and its answer is stored, so only a dead process lets it lapse.
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

    /// Also keeps this response header for repeats (`content-type` and `location` are kept). A
    /// value the handler marks [sensitive](HeaderValue::set_sensitive) is not kept.
    ///
    /// # Panics
    ///
    /// On a header that carries credentials (`set-cookie`, `set-cookie2`, `cookie`,
    /// `authorization`, `proxy-authorization`) or the message's framing (`content-length`,
    /// `transfer-encoding`, `connection` and the other hop-by-hop headers): a repeat may come
    /// from anyone who learned the key, and the replay frames its own body. The name is a
    /// constant of the program, so this is a mistake in it, caught where the layer is built
    /// (like axum's `Router::route` on a conflicting path).
    pub fn keep_header(mut self, name: HeaderName) -> Self {
        assert!(
            !NEVER_KEPT.contains(&name.as_str()),
            "Idempotency::keep_header({name}): this header is never kept for repeats (it carries the first \
             client's credentials or the message's framing)"
        );
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
    S::Future: Send + 'static,
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

/// The scope of `request`'s key: its [`IdempotencyScope`], the shared one on an unscoped layer,
/// or `None`.
fn scope_of<L>(config: &Idempotency<L>, request: &Request<Body>) -> Option<String> {
    match request.extensions().get::<IdempotencyScope>() {
        Some(IdempotencyScope(scope)) if !scope.is_empty() => Some(scope.clone()),
        _ if config.unscoped => Some(SHARED_SCOPE.to_owned()),
        _ => None,
    }
}

async fn handle<S, L>(config: Arc<Idempotency<L>>, inner: S, request: Request<Body>) -> Response<Body>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    L: Ledger + 'static,
{
    let mut inner = inner;
    if matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS | Method::DELETE) {
        return run(&mut inner, request).await;
    }
    let value = match request.headers().get(KEY_HEADER) {
        None if config.required => {
            return plain(StatusCode::BAD_REQUEST, "this endpoint needs an Idempotency-Key header");
        }
        None => return run(&mut inner, request).await,
        Some(value) => value,
    };
    let Some(scope) = scope_of(&config, &request) else {
        config.scope_missing.call_once(|| {
            error!(
                "a request with an Idempotency-Key reached the Idempotency layer without an IdempotencyScope; such \
                 requests are refused with 500. Put the client's IdempotencyScope in the request's extensions \
                 before the layer (from the authentication), or make the layer unscoped() if the API has one client"
            );
        });
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the server does not scope Idempotency-Keys by client (no IdempotencyScope)",
        );
    };
    let Some(key) = key_of(value, &scope) else {
        return plain(StatusCode::BAD_REQUEST, "the Idempotency-Key must be 1 to 255 visible ASCII characters");
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
        // A person cancelled the key: the effect shall not happen, now or on a repeat.
        Ok(Begin::Cancelled(_)) => return plain(StatusCode::CONFLICT, "this Idempotency-Key was cancelled"),
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
    // The request's future is dropped when its client leaves (a timeout): the first run is a task
    // of its own, so the handler's effect is never cut from its stored answer.
    let request = Request::from_parts(parts, Body::from(bytes));
    let (answer, answered) = oneshot::channel();
    tokio::spawn(first_run(Arc::clone(&config), inner, request, key.clone(), hold, answer));
    answered.await.unwrap_or_else(|_| {
        warn!(key = %key, "the handler panicked; its key is held until the hold lapses");
        plain(StatusCode::INTERNAL_SERVER_ERROR, "the request failed")
    })
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

/// The first request with a key, run to its end whatever its client does: the handler, its
/// body, its stored answer, with the key's hold renewed throughout. A body that fits
/// [`Idempotency::max_stored`] (almost all) is read whole, stored, then sent in one piece: sent in
/// frames with its end held back until the store, its last write would wait out the client's
/// delayed ACK (40 ms) behind Nagle's algorithm. A larger one streams to the client as it comes;
/// its end is still held back until the answer is stored, so a client that has read it whole
/// finds it stored.
async fn first_run<S, L>(
    config: Arc<Idempotency<L>>,
    mut inner: S,
    request: Request<Body>,
    key: IdempotencyKey,
    hold: Hold,
    answer: oneshot::Sender<Response<Body>>,
) where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    L: Ledger,
{
    let work = async {
        let (parts, mut body) = run(&mut inner, request).await.into_parts();
        let (status, headers) = (parts.status.as_u16(), kept(&parts.headers, &config.kept_headers));
        // Read while the body fits what is stored and carries data only.
        let mut kept_body = Vec::new();
        let mut first_streamed = None;
        while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            match frame {
                Ok(frame) if frame.data_ref().is_some_and(|d| kept_body.len() + d.len() <= config.max_stored) => {
                    kept_body.extend_from_slice(frame.data_ref().expect("a data frame"));
                }
                Ok(frame) => {
                    first_streamed = Some(frame);
                    break;
                }
                Err(e) => {
                    // The handler's body failed: nothing to keep, and the client is told.
                    warn!(key = %key, error = %e, "the response body failed; the key is released");
                    let _ = config.ledger.release_hold(&hold).await;
                    let _ = answer.send(plain(StatusCode::INTERNAL_SERVER_ERROR, "the response failed"));
                    return;
                }
            }
        }
        let Some(first_streamed) = first_streamed else {
            let stored = Stored { status, headers, body: Some(STANDARD.encode(&kept_body)) };
            store(&config, &key, &hold, &stored).await;
            let _ = answer.send(Response::from_parts(parts, Body::from(kept_body)));
            return;
        };
        // No size hint: hyper would end a sized response at its last byte, before it is stored.
        let (frames, forwarded) = mpsc::channel(16);
        let response = Response::from_parts(parts, Body::new(Forwarded(forwarded)));
        let mut client = answer.send(response).is_ok().then_some(frames);
        // Still storable where what stopped the reading is a trailers frame, not more data.
        let mut stored_body = first_streamed.data_ref().is_none().then(|| kept_body.clone());
        let read_so_far = (!kept_body.is_empty()).then(|| Frame::data(Bytes::from(kept_body)));
        let mut next = read_so_far.into_iter().chain([first_streamed]).map(Ok).collect::<Vec<_>>().into_iter();
        loop {
            let frame = match next.next() {
                Some(frame) => frame,
                None => match poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                    Some(frame) => frame,
                    None => break,
                },
            };
            let frame = match frame {
                Ok(frame) => frame,
                Err(e) => {
                    // The handler's body failed midway: nothing to keep, and the client sees it.
                    warn!(key = %key, error = %e, "the response body failed; the key is released");
                    let _ = config.ledger.release_hold(&hold).await;
                    if let Some(client) = client {
                        let _ = client.send(Some(Err(e))).await;
                    }
                    return;
                }
            };
            if let Some(data) = frame.data_ref() {
                stored_body = stored_body.filter(|kept| kept.len() + data.len() <= config.max_stored);
                if let Some(kept) = &mut stored_body {
                    kept.extend_from_slice(data);
                }
            }
            if let Some(to) = &client
                && to.send(Some(Ok(frame))).await.is_err()
            {
                client = None; // it left: the body is still read to its end and stored
            }
        }
        let body = stored_body.map(|kept| STANDARD.encode(kept));
        store(&config, &key, &hold, &Stored { status, headers, body }).await;
        if let Some(to) = client {
            let _ = to.send(None).await;
        }
    };
    tokio::select! {
        () = work => {}
        never = keep_holding(&config, &hold, &key) => match never {},
    }
}

/// Renews the key's hold every third of it, for as long as it is awaited.
async fn keep_holding<L: Ledger>(config: &Idempotency<L>, hold: &Hold, key: &IdempotencyKey) -> Infallible {
    let every = (config.hold / 3).max(Duration::from_millis(1));
    // The first renewal a third of the hold from now (a tick due now would wait for the timer's
    // next millisecond).
    let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        renew.tick().await;
        match config.ledger.extend_hold(hold, config.hold).await {
            Err(e) if e.kind() == ErrorKind::LeaseLost => {
                warn!(key = %key, "the key's hold lapsed while its first request ran: a repeat may run it too");
            }
            Err(e) => debug!(key = %key, error = %e, "could not renew the key's hold"),
            Ok(()) => {}
        }
    }
}

/// Keeps the answer for repeats, trying a temporary failure again while the hold is renewed.
async fn store<L: Ledger>(config: &Idempotency<L>, key: &IdempotencyKey, hold: &Hold, stored: &Stored) {
    let value = serde_json::to_value(stored).unwrap_or_default();
    let finished = (|| config.ledger.finish(hold, &value))
        .retry(FINISH_RETRY)
        .when(redrive_core::Error::is_temporary)
        .notify(|e, after| debug!(key = %key, error = %e, ?after, "the answer could not be stored yet"))
        .await;
    if let Err(e) = finished {
        error!(key = %key, error = %e, "the answer could not be stored; a repeat runs again once the hold lapses");
    }
}

/// The first response's body on its way to the client, fed by [`first_run`]: its frames, then
/// `None` once the answer is stored. A run that stops without it (its handler panicked) is an
/// error, not the end of a body cut short.
struct Forwarded(mpsc::Receiver<Option<Result<Frame<Bytes>, axum::Error>>>);

impl HttpBody for Forwarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.0.poll_recv(cx).map(|frame| frame.unwrap_or_else(|| Some(Err(axum::Error::new("the handler panicked")))))
    }
}

fn kept(headers: &HeaderMap, names: &[HeaderName]) -> Vec<(String, String)> {
    names
        .iter()
        .flat_map(|name| headers.get_all(name).iter().map(move |v| (name, v)))
        .filter(|(_, v)| !v.is_sensitive())
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
