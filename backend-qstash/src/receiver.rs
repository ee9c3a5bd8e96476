//! The endpoint QStash delivers to: checks the body's size and its signature, parks the delivery
//! for the workers, and answers with their verdict.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State as Shared;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use redrive_core::JobId;
use redrive_core::broker::{Known, carried_job, job_record};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::backend::{Delivery, FAILED_AT_HEADER, QStashBackend, State, Verdict, lock};
use crate::config::QStashConfig;
use crate::dead::Carried;
use crate::signature::NOT_OUR_KEYS;

impl QStashBackend {
    /// The endpoint QStash delivers to, for `Router::route(path, backend.receiver())` at the
    /// path of the configured destination; as a `tower::Service` it serves other frameworks too.
    ///
    /// A delivery whose body is over the plan's message size gets 413, and one without a valid
    /// `Upstash-Signature` 401; neither reaches a handler. A verified delivery waits for a worker
    /// of this process and gets its verdict: 2xx done (or handed on as a copy), 500 with
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
    let Ok(body) = axum::body::to_bytes(body, inner.config.max_message).await else {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, "the body is over the message size limit");
    };
    let Some(signature) = header(&headers, "upstash-signature") else {
        return refuse(StatusCode::UNAUTHORIZED, "no Upstash-Signature");
    };
    let mut verified = inner.verifier.verify(&signature, &body);
    if verified == Err(NOT_OUR_KEYS) && backend.refresh_keys().await {
        verified = inner.verifier.verify(&signature, &body);
    }
    if let Err(why) = verified {
        warn!(why, "a delivery was refused: its signature does not hold");
        return refuse(StatusCode::UNAUTHORIZED, why);
    }
    let Some((delivery, mut verdict)) = delivery(&inner.config, &headers, body) else {
        return refuse(StatusCode::BAD_REQUEST, "no Upstash-Message-Id");
    };
    let delivery = Arc::new(delivery);
    debug!(job = %delivery.job.id, kind = %delivery.job.kind, key = %delivery.job.key, attempt = delivery.job.attempt,
        "QStash delivery parked");
    backend.park(delivery.clone());
    // Dropped with this future when the connection closes (QStash's timeout, a proxy's): the
    // delivery is forgotten, so no worker runs a job whose request is gone.
    let _gone = Forget(&backend, &delivery);
    loop {
        let wake = match &*lock(&delivery.state) {
            State::Waiting => delivery.unclaimed_by,
            State::Claimed { until, .. } => *until,
            State::Settled => delivery.answer_by + Duration::from_secs(5),
        };
        tokio::select! {
            answered = &mut verdict => {
                return match answered {
                    Ok(verdict) => respond(verdict),
                    Err(_) => refuse(StatusCode::INTERNAL_SERVER_ERROR, "no verdict"),
                };
            }
            () = delivery.changed.notified() => {}
            () = tokio::time::sleep_until(wake) => {
                if let Some(verdict) = backend.lapse(&delivery).await {
                    return respond(verdict);
                }
                if *lock(&delivery.state) == State::Settled {
                    // Settled, but its verdict never came (the settling call was dropped).
                    return refuse(StatusCode::INTERNAL_SERVER_ERROR, "no verdict");
                }
            }
        }
    }
}

/// Forgets its delivery when dropped before a verdict.
struct Forget<'a>(&'a QStashBackend, &'a Arc<Delivery>);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.forget(self.1);
    }
}

/// The delivery the request carries: its job (or a stand-in for a body that is not an
/// envelope), its attempt and what its copies carried; and where its verdict will come.
fn delivery(config: &QStashConfig, headers: &HeaderMap, body: Bytes) -> Option<(Delivery, oneshot::Receiver<Verdict>)> {
    let message_id = header(headers, "upstash-message-id")?;
    let retried: u32 = header(headers, "upstash-retried").and_then(|r| r.parse().ok()).unwrap_or(0);
    let carried = Carried::read(|name| header(headers, name));
    let job_id = JobId(carried.job_id.clone().unwrap_or_else(|| message_id.clone()));
    let text = String::from_utf8_lossy(&body).into_owned();
    let (env, undecodable) = carried_job("qstash", &message_id, &text, Known::default(), chrono::Utc::now());
    let attempt = carried.spent + retried + 1;
    let now = Instant::now();
    let timeout = config.delivery_timeout;
    let answer_by = now + timeout - (timeout / 10).min(Duration::from_secs(5));
    let (sender, verdict) = oneshot::channel();
    let delivery = Delivery {
        job: job_record(job_id, env, attempt, undecodable),
        message_id,
        retried,
        carried,
        body: text,
        answer_by,
        unclaimed_by: (now + config.park_limit).min(answer_by),
        state: Mutex::new(State::Waiting),
        changed: Notify::new(),
        verdict: Mutex::new(Some(sender)),
    };
    Some((delivery, verdict))
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
    response
}
