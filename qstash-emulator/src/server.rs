//! The HTTP API: QStash's `/v2/...` routes.

// The helpers' `Err` is the ready error answer, returned by the handler as is: boxing it would
// only add noise on this cold path.
#![allow(clippy::result_large_err)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::engine::{Accepted, DlqEntry, Shared, Spec};
use crate::util;

type S = State<Arc<Shared>>;

/// A JSON error answer in QStash's shape: `{"error": "..."}`.
pub(crate) fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": msg.into()}))).into_response()
}

fn ok_json(status: StatusCode, v: Value) -> Response {
    (status, axum::Json(v)).into_response()
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v2/publish/{*destination}", post(publish))
        .route("/v2/enqueue/{queue}/{*destination}", post(enqueue))
        .route("/v2/batch", post(batch))
        .route("/v2/dlq", get(dlq_list).delete(dlq_bulk_delete))
        .route("/v2/dlq/retry", post(dlq_bulk_retry))
        .route("/v2/dlq/retry/{dlq_id}", post(dlq_retry_one))
        .route("/v2/dlq/{dlq_id}", get(dlq_get).delete(dlq_delete_one))
        .route("/v2/keys", get(keys_get))
        .route("/v2/keys/rotate", post(keys_rotate))
        .route("/v2/logs", get(logs))
        .route("/v2/events", get(logs))
        .route("/v2/messages", axum::routing::delete(messages_cancel_many))
        .route("/v2/messages/{id}", get(message_get).delete(message_cancel))
        .route("/v2/queues", get(queues_list).post(queue_upsert))
        .route("/v2/queues/", get(queues_list).post(queue_upsert))
        .route("/v2/queues/{name}", get(queue_get).delete(queue_delete))
        .route("/v2/queues/{name}/pause", post(queue_pause))
        .route("/v2/queues/{name}/resume", post(queue_resume))
        .route("/v2/flowControl/{key}", get(flow_control_get))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not found") })
        .layer(middleware::from_fn_with_state(shared.clone(), auth))
        .with_state(shared)
}

/// `Authorization: Bearer <token>` or the `qstash_token` query parameter.
async fn auth(State(shared): S, req: Request, next: Next) -> Response {
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let query_token = query_pairs(req.uri()).into_iter().find(|(k, _)| k == "qstash_token").map(|(_, v)| v);
    let ok = bearer == Some(shared.token.as_str()) || query_token.as_deref() == Some(shared.token.as_str());
    if !ok {
        return error(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    next.run(req).await
}

fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    uri.query().map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default()
}

fn header_pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    headers.iter().filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_owned(), v.to_owned()))).collect()
}

fn spec_from(headers: &HeaderMap) -> Result<Spec, Response> {
    let pairs = header_pairs(headers);
    Spec::from_headers(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| error(StatusCode::BAD_REQUEST, e))
}

/// The destination from the raw path tail (possibly percent-encoded) and the query string
/// (without `qstash_token`).
fn destination(raw_tail: &str, uri: &Uri) -> Result<String, Response> {
    let lower = raw_tail.to_ascii_lowercase();
    let mut dest = if lower.starts_with("http%3a") || lower.starts_with("https%3a") {
        percent_encoding::percent_decode_str(raw_tail).decode_utf8_lossy().into_owned()
    } else {
        raw_tail.to_owned()
    };
    if let Some(q) = uri.query() {
        let kept: Vec<&str> = q.split('&').filter(|p| !p.starts_with("qstash_token=") && !p.is_empty()).collect();
        if !kept.is_empty() {
            dest.push(if dest.contains('?') { '&' } else { '?' });
            dest.push_str(&kept.join("&"));
        }
    }
    validate_url(&dest)?;
    Ok(dest)
}

fn validate_url(dest: &str) -> Result<(), Response> {
    if !dest.contains("://") {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("invalid destination {dest:?}: URL groups are not supported by the emulator; publish to a URL"),
        ));
    }
    match reqwest::Url::parse(dest) {
        Ok(u) if u.scheme() == "http" && u.host().is_some() => Ok(()),
        Ok(u) if u.scheme() == "https" => Err(error(
            StatusCode::BAD_REQUEST,
            "invalid destination: the emulator delivers over plain http only (use an http:// URL)",
        )),
        _ => Err(error(StatusCode::BAD_REQUEST, format!("invalid destination url: {dest:?}"))),
    }
}

fn tail_after(path: &str, prefix_segments: usize) -> &str {
    // "/v2/publish/<tail>" → skip the leading '/' and N segments.
    let mut rest = path.trim_start_matches('/');
    for _ in 0..prefix_segments {
        rest = rest.split_once('/').map(|(_, r)| r).unwrap_or("");
    }
    rest
}

fn limits(shared: &Shared, messages: u64) -> Result<(), Response> {
    if let Err((limit, reset)) = shared.check_rate() {
        let mut resp = error(StatusCode::TOO_MANY_REQUESTS, "Exceeded burst rate limit");
        let h = resp.headers_mut();
        h.insert("Burst-RateLimit-Limit", HeaderValue::from(limit.limit));
        h.insert("Burst-RateLimit-Remaining", HeaderValue::from(0));
        h.insert("Burst-RateLimit-Reset", HeaderValue::from(reset));
        return Err(resp);
    }
    if !shared.quota_allows(messages) {
        return Err(error(StatusCode::PRECONDITION_FAILED, "quota exceeded: the emulator's message quota is used up"));
    }
    Ok(())
}

async fn publish(
    State(shared): S,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    accept_one(&shared, peer, &uri, 2, None, &headers, body)
}

async fn enqueue(
    State(shared): S,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((queue, _)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    accept_one(&shared, peer, &uri, 3, Some(queue), &headers, body)
}

/// One message published to the destination after the path's first `segments` segments
/// (`/v2/publish/…` or `/v2/enqueue/{queue}/…`), into `queue` if named.
fn accept_one(
    shared: &Arc<Shared>,
    peer: SocketAddr,
    uri: &Uri,
    segments: usize,
    queue: Option<String>,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    shared.count_publish_request();
    let dest = match destination(tail_after(uri.path(), segments), uri) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let spec = match spec_from(headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Err(r) = limits(shared, 1) {
        return r;
    }
    let acc = shared.accept(dest, queue, spec, body, Some(peer.ip().to_string()));
    ok_json(StatusCode::CREATED, acc.to_json())
}

#[derive(serde::Deserialize)]
struct BatchItem {
    destination: String,
    #[serde(default)]
    headers: Option<std::collections::HashMap<String, String>>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    queue: Option<String>,
}

async fn batch(State(shared): S, ConnectInfo(peer): ConnectInfo<SocketAddr>, body: Bytes) -> Response {
    shared.count_publish_request();
    let items: Vec<BatchItem> = match serde_json::from_slice(&body) {
        Ok(i) => i,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid batch body: {e}")),
    };
    let mut prepared = Vec::with_capacity(items.len());
    for item in items {
        let dest = item.destination.trim().to_owned();
        if let Err(r) = validate_url(&dest) {
            return r;
        }
        let headers = item.headers.unwrap_or_default();
        let spec = match Spec::from_headers(headers.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
            Ok(s) => s,
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        };
        prepared.push((dest, item.queue, spec, Bytes::from(item.body.unwrap_or_default())));
    }
    if let Err(r) = limits(&shared, prepared.len() as u64) {
        return r;
    }
    let out: Vec<Value> = prepared
        .into_iter()
        .map(|(dest, queue, spec, body)| shared.accept(dest, queue, spec, body, Some(peer.ip().to_string())).to_json())
        .collect();
    ok_json(StatusCode::OK, Value::Array(out))
}

// ---------------------------------------------------------------------------------- DLQ

/// Filters of the DLQ list and bulk actions.
#[derive(Default)]
struct DlqQuery {
    dlq_ids: Vec<String>,
    message_id: Option<String>,
    /// Destination URLs, any of which matches (the parameter repeated, as the clients send an
    /// array).
    urls: Vec<String>,
    topic: Option<String>,
    queue: Option<String>,
    schedule: Option<String>,
    from: Option<u64>,
    to: Option<u64>,
    status: Option<u16>,
    caller_ip: Option<String>,
    label: Option<String>,
    count: usize,
    cursor: Option<u64>,
    latest_first: bool,
}

impl DlqQuery {
    fn parse(uri: &Uri, body: &[u8]) -> Result<DlqQuery, Response> {
        let mut q = DlqQuery { count: 100, ..DlqQuery::default() };
        let bad = |k: &str, v: &str| error(StatusCode::BAD_REQUEST, format!("invalid {k}: {v:?}"));
        for (k, v) in query_pairs(uri) {
            match k.as_str() {
                "dlqIds" | "dlqIds[]" => q.dlq_ids.push(v),
                "messageId" => q.message_id = Some(v),
                "url" => q.urls.push(v),
                "topicName" => q.topic = Some(v),
                "queueName" => q.queue = Some(v),
                "scheduleId" => q.schedule = Some(v),
                "fromDate" => q.from = Some(v.parse().map_err(|_| bad(&k, &v))?),
                "toDate" => q.to = Some(v.parse().map_err(|_| bad(&k, &v))?),
                "responseStatus" => q.status = Some(v.parse().map_err(|_| bad(&k, &v))?),
                "callerIp" => q.caller_ip = Some(v),
                "label" => q.label = Some(v),
                "count" => q.count = v.parse::<usize>().map_err(|_| bad(&k, &v))?.clamp(1, 100),
                "cursor" if !v.is_empty() => q.cursor = Some(v.parse().map_err(|_| bad(&k, &v))?),
                "order" => match v.as_str() {
                    "earliestFirst" => q.latest_first = false,
                    "latestFirst" => q.latest_first = true,
                    _ => return Err(bad(&k, &v)),
                },
                _ => {}
            }
        }
        if !body.iter().all(u8::is_ascii_whitespace) {
            let v: Value = serde_json::from_slice(body)
                .map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))?;
            if let Some(ids) = v.get("dlqIds").and_then(Value::as_array) {
                q.dlq_ids.extend(ids.iter().filter_map(Value::as_str).map(str::to_owned));
            }
        }
        Ok(q)
    }

    fn matches(&self, e: &DlqEntry) -> bool {
        let m = &e.message;
        if !self.dlq_ids.is_empty() {
            return self.dlq_ids.contains(&e.dlq_id);
        }
        self.message_id.as_ref().is_none_or(|v| *v == m.id)
            && (self.urls.is_empty() || self.urls.contains(&m.url))
            && self.topic.is_none()
            && self.schedule.is_none()
            && self.queue.as_ref().is_none_or(|v| Some(v) == m.queue.as_ref())
            && self.from.is_none_or(|v| m.created_at >= v)
            && self.to.is_none_or(|v| m.created_at <= v)
            && self.status.is_none_or(|v| v == e.response_status)
            && self.caller_ip.as_ref().is_none_or(|v| Some(v) == m.caller_ip.as_ref())
            && self.label.as_ref().is_none_or(|v| Some(v) == m.label.as_ref())
    }

    /// The matching entries of one page, and the next page's cursor.
    fn page(&self, shared: &Shared) -> (Vec<DlqEntry>, Option<String>) {
        let inner = shared.lock();
        let mut out = Vec::new();
        let mut next = None;
        let iter: Box<dyn Iterator<Item = (&u64, &DlqEntry)>> = if self.latest_first {
            Box::new(inner.dlq.range(..=self.cursor.unwrap_or(u64::MAX)).rev())
        } else {
            Box::new(inner.dlq.range(self.cursor.unwrap_or(0)..))
        };
        for (seq, e) in iter {
            if !self.matches(e) {
                continue;
            }
            if out.len() == self.count {
                next = Some(seq.to_string());
                break;
            }
            out.push(e.clone());
        }
        (out, next)
    }
}

async fn dlq_list(State(shared): S, uri: Uri) -> Response {
    let q = match DlqQuery::parse(&uri, &[]) {
        Ok(q) => q,
        Err(r) => return r,
    };
    let (entries, cursor) = q.page(&shared);
    let mut v = json!({"messages": entries.iter().map(DlqEntry::to_json).collect::<Vec<_>>()});
    if let Some(c) = cursor {
        v["cursor"] = json!(c);
    }
    ok_json(StatusCode::OK, v)
}

async fn dlq_get(State(shared): S, Path(dlq_id): Path<String>) -> Response {
    let inner = shared.lock();
    match inner.dlq_index.get(&dlq_id).and_then(|s| inner.dlq.get(s)) {
        Some(e) => ok_json(StatusCode::OK, e.to_json()),
        None => error(StatusCode::NOT_FOUND, format!("dlq message {dlq_id} not found")),
    }
}

async fn dlq_delete_one(State(shared): S, Path(dlq_id): Path<String>) -> Response {
    match shared.dlq_remove(&dlq_id) {
        Some(_) => StatusCode::OK.into_response(),
        None => error(StatusCode::NOT_FOUND, format!("dlq message {dlq_id} not found")),
    }
}

async fn dlq_bulk_delete(State(shared): S, uri: Uri, body: Bytes) -> Response {
    let q = match DlqQuery::parse(&uri, &body) {
        Ok(q) => q,
        Err(r) => return r,
    };
    let (entries, cursor) = q.page(&shared);
    let deleted = entries.iter().filter(|e| shared.dlq_remove(&e.dlq_id).is_some()).count();
    let mut v = json!({"deleted": deleted});
    if let Some(c) = cursor {
        v["cursor"] = json!(c);
    }
    ok_json(StatusCode::OK, v)
}

async fn dlq_retry_one(State(shared): S, Path(dlq_id): Path<String>, headers: HeaderMap) -> Response {
    let over = match spec_from(&headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    match shared.dlq_retry(&dlq_id, &over) {
        Some(acc) => ok_json(StatusCode::OK, acc.to_json()),
        None => error(StatusCode::NOT_FOUND, format!("dlq message {dlq_id} not found")),
    }
}

async fn dlq_bulk_retry(State(shared): S, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let over = match spec_from(&headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    // Overrides come from Upstash-* headers only; the body (if any) carries dlqIds.
    let over = Spec { content_type: None, ..over };
    let q = match DlqQuery::parse(&uri, &body) {
        Ok(q) => q,
        Err(r) => return r,
    };
    let (entries, cursor) = q.page(&shared);
    let responses: Vec<Value> =
        entries.iter().filter_map(|e| shared.dlq_retry(&e.dlq_id, &over)).map(|a: Accepted| a.to_json()).collect();
    let mut v = json!({"responses": responses});
    if let Some(c) = cursor {
        v["cursor"] = json!(c);
    }
    ok_json(StatusCode::OK, v)
}

// --------------------------------------------------------------------------------- keys

async fn keys_get(State(shared): S) -> Response {
    let k = shared.lock().keys.clone();
    ok_json(StatusCode::OK, json!({"current": k.current, "next": k.next}))
}

async fn keys_rotate(State(shared): S) -> Response {
    let k = crate::rotate(&shared);
    ok_json(StatusCode::OK, json!({"current": k.current, "next": k.next}))
}

// --------------------------------------------------------------------------------- logs

async fn logs(State(shared): S, uri: Uri) -> Response {
    let mut ids = Vec::new();
    let (mut state, mut url, mut queue, mut from, mut to, mut cursor) = (None, None, None, None, None, None);
    let mut count = 1000usize;
    for (k, v) in query_pairs(&uri) {
        match k.as_str() {
            "messageId" | "messageIds" | "messageIds[]" => ids.push(v),
            "state" => state = Some(v),
            "url" => url = Some(v),
            "queueName" => queue = Some(v),
            "fromDate" => from = v.parse::<u64>().ok(),
            "toDate" => to = v.parse::<u64>().ok(),
            "count" => count = v.parse::<usize>().unwrap_or(1000).clamp(1, 1000),
            "cursor" if !v.is_empty() => cursor = v.parse::<u64>().ok(),
            _ => {}
        }
    }
    let inner = shared.lock();
    let mut out = Vec::new();
    let mut next = None;
    for e in inner.events.iter().rev() {
        if cursor.is_some_and(|c| e.seq > c) {
            continue;
        }
        let keep = (ids.is_empty() || ids.contains(&e.message_id))
            && state.as_deref().is_none_or(|s| s == e.state)
            && url.as_ref().is_none_or(|u| *u == e.url)
            && queue.as_ref().is_none_or(|q| Some(q) == e.queue.as_ref())
            && from.is_none_or(|f| e.time >= f)
            && to.is_none_or(|t| e.time <= t);
        if !keep {
            continue;
        }
        if out.len() == count {
            next = Some(e.seq.to_string());
            break;
        }
        out.push(e.json.clone());
    }
    let mut v = json!({"events": out});
    if let Some(c) = next {
        v["cursor"] = json!(c);
    }
    ok_json(StatusCode::OK, v)
}

// ----------------------------------------------------------------------------- messages

async fn message_get(State(shared): S, Path(id): Path<String>) -> Response {
    match shared.lock().messages.get(&id) {
        Some(m) => ok_json(StatusCode::OK, m.to_json()),
        None => error(StatusCode::NOT_FOUND, format!("message {id} not found")),
    }
}

async fn message_cancel(State(shared): S, Path(id): Path<String>) -> Response {
    if shared.cancel(&id) {
        StatusCode::ACCEPTED.into_response()
    } else {
        error(StatusCode::NOT_FOUND, format!("message {id} not found"))
    }
}

async fn messages_cancel_many(State(shared): S, uri: Uri, body: Bytes) -> Response {
    let mut ids: Vec<String> = query_pairs(&uri)
        .into_iter()
        .filter(|(k, _)| k == "messageIds" || k == "messageIds[]")
        .map(|(_, v)| v)
        .collect();
    if !body.iter().all(u8::is_ascii_whitespace) {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) => {
                if let Some(a) = v.get("messageIds").and_then(Value::as_array) {
                    ids.extend(a.iter().filter_map(Value::as_str).map(str::to_owned));
                }
            }
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")),
        }
    }
    if ids.is_empty() {
        ids = shared.lock().messages.keys().cloned().collect();
    }
    let cancelled = ids.iter().filter(|id| shared.cancel(id)).count();
    ok_json(StatusCode::OK, json!({"cancelled": cancelled}))
}

// ------------------------------------------------------------------------------- queues

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Upsert {
    queue_name: String,
    #[serde(default)]
    parallelism: Option<u32>,
    #[serde(default)]
    paused: Option<bool>,
}

async fn queue_upsert(State(shared): S, body: Bytes) -> Response {
    let u: Upsert = match serde_json::from_slice(&body) {
        Ok(u) => u,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid queue body: {e}")),
    };
    if u.queue_name.is_empty() {
        return error(StatusCode::BAD_REQUEST, "queueName is required");
    }
    shared.upsert_queue(&u.queue_name, u.parallelism.unwrap_or(1), u.paused.unwrap_or(false));
    StatusCode::OK.into_response()
}

async fn queues_list(State(shared): S) -> Response {
    let inner = shared.lock();
    let mut names: Vec<&String> = inner.queues.keys().collect();
    names.sort();
    ok_json(StatusCode::OK, Value::Array(names.into_iter().map(|n| inner.queues[n].to_json(n)).collect()))
}

async fn queue_get(State(shared): S, Path(name): Path<String>) -> Response {
    match shared.lock().queues.get(&name) {
        Some(q) => ok_json(StatusCode::OK, q.to_json(&name)),
        None => error(StatusCode::NOT_FOUND, format!("queue {name} not found")),
    }
}

async fn queue_delete(State(shared): S, Path(name): Path<String>) -> Response {
    let removed = shared.lock().queues.remove(&name);
    match removed {
        Some(q) => {
            q.notify.notify_one();
            for id in q.pending {
                shared.cancel(&id);
            }
            StatusCode::OK.into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("queue {name} not found")),
    }
}

fn set_paused(shared: &Shared, name: &str, paused: bool) -> Response {
    let mut inner = shared.lock();
    match inner.queues.get_mut(name) {
        Some(q) => {
            q.paused = paused;
            q.updated_at = util::now_ms();
            q.notify.notify_one();
            StatusCode::OK.into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("queue {name} not found")),
    }
}

async fn queue_pause(State(shared): S, Path(name): Path<String>) -> Response {
    set_paused(&shared, &name, true)
}

async fn queue_resume(State(shared): S, Path(name): Path<String>) -> Response {
    set_paused(&shared, &name, false)
}

// ------------------------------------------------------------------------- flow control

async fn flow_control_get(State(shared): S, Path(key): Path<String>) -> Response {
    match shared.lock().flows.get(&key) {
        Some(state) => ok_json(StatusCode::OK, state.to_json(&key)),
        None => error(StatusCode::NOT_FOUND, format!("flow control key {key} not found")),
    }
}
