//! The endpoint QStash delivers to: checks the signature (before reading the body, then against
//! it) and the body's size, parks the delivery for the workers within the park bound, and
//! answers with their verdict.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State as Shared;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use redrive_core::JobId;
use redrive_core::kit::JobRecord;
use redrive_core::kit::broker::{Known, carried_job};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::backend::{Delivery, FAILED_AT_HEADER, QStashBackend, TRACE_ID_HEADER, Verdict};
use crate::dead::Carried;
use crate::signature::{NOT_OUR_KEYS, Verifier};

impl QStashBackend {
    /// The endpoint QStash delivers to, for `Router::route(path, backend.receiver())` at the
    /// path of the configured destination; as a `tower::Service` it serves other frameworks too.
    ///
    /// A delivery without a valid `Upstash-Signature` gets 401 before its body is read, as does
    /// one whose token was accepted before (a captured delivery sent again); one whose body is
    /// over the plan's message size 413; past the park bound ([`QStashConfig::with_max_parked`](crate::QStashConfig::with_max_parked))
    /// 503 with `Retry-After`. None reaches a handler. A verified delivery waits for a worker of
    /// this process and gets its verdict: 2xx done (or handed on as a copy), 500 with
    /// `Retry-After` to retry, 489 with `Upstash-NonRetryable-Error: true` to dead-letter.
    pub fn receiver(&self) -> MethodRouter {
        post(receive).with_state(self.clone())
    }
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, why.to_owned()).into_response()
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

async fn receive(Shared(backend): Shared<QStashBackend>, headers: HeaderMap, body: Body) -> Response {
    let inner = &backend.inner;
    let Some(signature) = header(&headers, "upstash-signature") else {
        return refuse(StatusCode::UNAUTHORIZED, "no Upstash-Signature");
    };
    let mut token = inner.verifier.check_token(&signature);
    if matches!(token, Err(NOT_OUR_KEYS)) && backend.refresh_keys().await {
        token = inner.verifier.check_token(&signature);
    }
    let token = match token {
        Ok(token) => token,
        Err(why) => {
            warn!(why, "a delivery was refused: its signature does not hold");
            return refuse(StatusCode::UNAUTHORIZED, why);
        }
    };
    if inner.verifier.seen(&token, false) {
        return replayed();
    }
    let Some(_slot) = inner.parked.slot() else {
        // Its body is never read: an overload holds no memory for it.
        if let Some(message_id) = header(&headers, "upstash-message-id") {
            backend.note_refusal(&message_id);
        }
        warn!(
            bound = inner.config.max_parked,
            "a QStash delivery was refused: the receiver holds its bound of deliveries"
        );
        let after = inner.config.park_limit.max(Duration::from_secs(1));
        return respond(Verdict::again(503, after, "the receiver holds as many deliveries as it may"));
    };
    let Ok(body) = axum::body::to_bytes(body, inner.config.max_message).await else {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, "the body is over the message size limit");
    };
    if let Err(why) = Verifier::check_body(&token, &body) {
        warn!(why, "a delivery was refused: its signature does not hold");
        return refuse(StatusCode::UNAUTHORIZED, why);
    }
    if inner.verifier.seen(&token, true) {
        return replayed();
    }
    let Some((job, delivery, unclaimed_by)) = delivery(&backend, &headers, body) else {
        return refuse(StatusCode::BAD_REQUEST, "no Upstash-Message-Id");
    };
    debug!(job = %job.id, kind = %job.kind, key = %job.key, attempt = job.attempt, "QStash delivery parked");
    let now = Instant::now();
    let timeout = inner.config.delivery_timeout;
    let answer_by = now + timeout - (timeout / 10).min(Duration::from_secs(5));
    let (call, verdict) = inner.parked.park(job, delivery, answer_by, unclaimed_by);
    match inner.parked.verdict(&call, verdict, "QStash", |lapse| backend.lapsed(&call, lapse)).await {
        Some(verdict) => respond(verdict),
        // Settled, but its verdict never came (the settling call was dropped).
        None => refuse(StatusCode::INTERNAL_SERVER_ERROR, "no verdict"),
    }
}

fn replayed() -> Response {
    warn!("a delivery was refused: its signature was accepted before (a captured delivery sent again)");
    refuse(StatusCode::UNAUTHORIZED, "the signature was accepted before")
}

/// The delivery the request carries: its job (or a stand-in for a body that is not an
/// envelope), its attempt and what its copies carried; and where its verdict will come.
///
/// Only the body is signed. The carried headers count only under this backend's seal; the
/// attempt adds QStash's retries (`Upstash-Retried`, unsigned) bounded by the retries the job
/// has left, less those this process refused past its park bound (no worker started them).
fn delivery(backend: &QStashBackend, headers: &HeaderMap, body: Bytes) -> Option<(JobRecord, Delivery, Instant)> {
    let config = &backend.inner.config;
    let message_id = header(headers, "upstash-message-id")?;
    let retried: u32 = header(headers, "upstash-retried").and_then(|r| r.parse().ok()).unwrap_or(0);
    let (carried, unsealed) = Carried::sealed(|name| header(headers, name), &backend.inner.seal, &body);
    if unsealed {
        warn!(message = %message_id, "a delivery's carried headers are not sealed by this backend: taken as a first message");
    }
    let job_id = JobId(carried.job_id.clone().unwrap_or_else(|| message_id.clone()));
    let text = String::from_utf8_lossy(&body).into_owned();
    let (env, undecodable) = carried_job("qstash", &message_id, &text, Known::default(), chrono::Utc::now());
    let left = env.cap.saturating_sub(1).saturating_sub(carried.spent);
    let counted = retried.saturating_sub(backend.refusals(&message_id)).min(left);
    let attempt = carried.spent + counted + 1;
    let mut job = env.into_job(job_id, attempt, undecodable);
    // A DLQ retry resends the entry's body as it was: the record it replays comes beside it.
    job.replay_of = job.replay_of.or_else(|| carried.replay_of.clone().map(redrive_core::FailureId));
    let unclaimed_by = Instant::now() + config.park_limit;
    Some((job, Delivery { message_id, retried, carried, body: text }, unclaimed_by))
}

fn respond(verdict: Verdict) -> Response {
    let status = StatusCode::from_u16(verdict.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, verdict.body).into_response();
    let headers = response.headers_mut();
    if let Some(after) = verdict.retry_after {
        headers.insert("retry-after", after.as_secs().max(1).into());
    }
    if verdict.non_retryable {
        headers.insert("upstash-nonretryable-error", "true".parse().expect("a valid header"));
    }
    if let Some(at) = verdict.failed_at {
        headers.insert(FAILED_AT_HEADER, at.into());
    }
    // 32 hex digits, always a valid header value.
    if let Some(value) = verdict.trace_id.and_then(|id| id.parse().ok()) {
        headers.insert(TRACE_ID_HEADER, value);
    }
    response
}
