//! The serve endpoint Inngest calls: `POST` runs the queue's function (the call parked for the
//! workers, answered with their verdict) or its failure handler (a record kept); `PUT` is
//! Inngest's sync (the functions registered); `GET` answers a signed look. Every call's
//! signature is checked on the raw body before anything parses it; every answer is signed.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use chrono::Utc;
use redrive_core::JobId;
use redrive_core::kit::AttemptError;
use redrive_core::kit::broker::{Known, carried_job};
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::backend::{InngestBackend, Parcel, Verdict};
use crate::config::STEP_RESERVE;
use crate::signature;
use crate::steps::{CARRIED, Mark, Progress, carry, job_id, mark_op, split_carried, wait_op};

/// The SDK this endpoint answers as (Inngest takes a 2xx without it for something else's).
const SDK: &str = concat!("rust:redrive-inngest:v", env!("CARGO_PKG_VERSION"));
/// Bytes a call carries beside its event: the steps, the context.
const CALL_ROOM: usize = 256 * 1024;

impl InngestBackend {
    /// The endpoint Inngest calls, for `Router::route(path, backend.endpoint())` at the path of
    /// the configured serve URL.
    ///
    /// A call without a valid `X-Inngest-Signature` (the signing key or its fallback, within the
    /// leeway) gets 401 and runs nothing; a body over the event limit 413. A verified call of the
    /// queue's function waits for a worker of this process and gets its verdict: 200 done, 206
    /// with a step (a retry's or a deferral's mark, then its sleep), 400 with
    /// `X-Inngest-No-Retry: true` to fail the run (its record written first). A call of the
    /// failure handler keeps the failed run's record.
    pub fn endpoint(&self) -> MethodRouter {
        get(look).put(sync).post(call).with_state(self.clone())
    }
}

impl InngestBackend {
    /// Continues the call's run as a new run of the same job: its event sent again, carrying
    /// the run so far and `mark`, under an id of the run's (a second try sends the same id, and
    /// Inngest starts one run for it). The old run then completes. The send waits at most half
    /// the call's time, so that Inngest hears the answer.
    async fn continue_run(&self, place: &Place<'_>, mark: &Mark) -> redrive_core::Result<()> {
        let mut data = place.event["data"].clone();
        let Some(fields) = data.as_object_mut() else {
            return Err(redrive_core::Error::new(redrive_core::ErrorKind::Decode, "the event's data is not an object"));
        };
        fields.insert(CARRIED.to_owned(), carry(place.job_id, &place.errors, mark));
        let id = redrive_core::kit::payload_fingerprint(&json!(["continued", self.inner.core.scope(), place.run_id]));
        let event = json!({ "name": self.inner.config.event_name(), "id": id, "data": data,
                            "ts": Utc::now().timestamp_millis() });
        let within = self.inner.config.call_timeout / 2;
        tokio::time::timeout(within, self.inner.api.send(&[event]))
            .await
            .map_err(|_| redrive_core::Error::temporary("Inngest send events: timed out"))??;
        info!(run = place.run_id, steps = place.steps, continued_as = %id, attempts_spent = mark.spent,
            "an Inngest run near its step limit continues as a new run");
        Ok(())
    }
}

fn refuse(status: StatusCode, why: &str) -> Response {
    let mut response = (status, json!({ "message": why }).to_string()).into_response();
    response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    response
}

/// An answer as the SDKs send it: their headers, the body signed with the signing key.
fn answer(backend: &InngestBackend, status: StatusCode, body: &Value, no_retry: Option<bool>) -> Response {
    let bytes = body.to_string();
    let signature = signature::sign(&backend.inner.config.signing_key, bytes.as_bytes(), Utc::now().timestamp());
    let mut response = (status, bytes).into_response();
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("x-inngest-sdk", HeaderValue::from_static(SDK));
    headers.insert("x-inngest-req-version", HeaderValue::from_static("1"));
    headers.insert("x-inngest-framework", HeaderValue::from_static("axum"));
    if let Some(no_retry) = no_retry {
        headers.insert("x-inngest-no-retry", HeaderValue::from_static(if no_retry { "true" } else { "false" }));
    }
    if let Ok(value) = HeaderValue::from_str(&signature) {
        headers.insert("x-inngest-signature", value);
    }
    response
}

/// Where a call's run stands: what continuing it as a new run carries.
struct Place<'a> {
    /// The steps the run has memoized.
    steps: usize,
    /// Its errors so far.
    errors: Vec<AttemptError>,
    /// The call's event.
    event: &'a Value,
    run_id: &'a str,
    /// The job's id: its first event's, kept across continued runs.
    job_id: &'a str,
}

/// The answer to a call of a run with `steps` memoized.
fn respond(backend: &InngestBackend, steps: usize, verdict: Verdict) -> Response {
    match verdict {
        Verdict::Done => answer(backend, StatusCode::OK, &Value::Null, None),
        Verdict::Mark(mark) => answer(backend, StatusCode::PARTIAL_CONTENT, &json!([mark_op(steps, &mark)]), None),
        Verdict::Wait(wait) => answer(backend, StatusCode::PARTIAL_CONTENT, &json!([wait_op(steps, wait)]), None),
        Verdict::Fail(error) => {
            answer(backend, StatusCode::BAD_REQUEST, &json!({ "name": "Error", "message": error }), Some(true))
        }
        Verdict::Again(error) => answer(
            backend,
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({ "name": "Error", "message": error }),
            Some(false),
        ),
    }
}

/// The body, read up to the limit, and its signature checked; or the refusal.
async fn verified(backend: &InngestBackend, headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    let config = &backend.inner.config;
    let Ok(body) = axum::body::to_bytes(body, config.max_event + CALL_ROOM).await else {
        return Err(refuse(StatusCode::PAYLOAD_TOO_LARGE, "the call is over the event size limit"));
    };
    let keys: Vec<&str> =
        std::iter::once(config.signing_key.as_str()).chain(config.signing_key_fallback.as_deref()).collect();
    let header = headers.get("x-inngest-signature").and_then(|v| v.to_str().ok());
    let leeway = config.leeway.as_secs() as i64;
    if let Err(why) = signature::verify(&keys, header, &body, Utc::now().timestamp(), leeway) {
        warn!(why, "an Inngest call was refused: its signature does not hold");
        return Err(refuse(StatusCode::UNAUTHORIZED, why));
    }
    Ok(body)
}

/// `GET`: what the endpoint serves, to a signed look only.
async fn look(State(backend): State<InngestBackend>, headers: HeaderMap) -> Response {
    if let Err(refused) = verified(&backend, &headers, Body::empty()).await {
        return refused;
    }
    answer(&backend, StatusCode::OK, &json!({ "function_count": 2, "has_signing_key": true, "mode": "cloud" }), None)
}

/// `PUT`: Inngest's sync. A signature, where one comes, must hold; the functions registered are
/// this configuration's whoever asks.
async fn sync(State(backend): State<InngestBackend>, headers: HeaderMap, body: Body) -> Response {
    if headers.contains_key("x-inngest-signature")
        && let Err(refused) = verified(&backend, &headers, body).await
    {
        return refused;
    }
    match backend.sync().await {
        Ok(()) => {
            let mut response = answer(&backend, StatusCode::OK, &json!({ "message": "Successfully registered" }), None);
            response.headers_mut().insert("x-inngest-sync-kind", HeaderValue::from_static("out_of_band"));
            response
        }
        Err(e) => {
            warn!(error = %e, "the functions could not be registered with Inngest");
            refuse(StatusCode::INTERNAL_SERVER_ERROR, "the functions could not be registered")
        }
    }
}

async fn call(
    State(backend): State<InngestBackend>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = match verified(&backend, &headers, body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return answer(&backend, StatusCode::BAD_REQUEST, &json!({ "message": "the call is not JSON" }), Some(true));
    };
    let config = &backend.inner.config;
    let function = query.get("fnId").map(String::as_str).unwrap_or_default();
    if function == config.failure_id() {
        return match backend.keep_failed_run(&request["event"]).await {
            Ok(()) => answer(&backend, StatusCode::OK, &Value::Null, None),
            // Inngest calls the handler again: the record is not lost.
            Err(e) => {
                warn!(error = %e, "a failed run's record could not be kept; Inngest calls again");
                answer(&backend, StatusCode::INTERNAL_SERVER_ERROR, &json!({ "message": e.message() }), Some(false))
            }
        };
    }
    if function != config.function_id() {
        return answer(&backend, StatusCode::NOT_FOUND, &json!({ "message": "no such function here" }), Some(true));
    }
    run(&backend, &request).await
}

/// A call of the queue's function: its pending sleep, the run continued near its step limit, or
/// its job parked for a worker.
async fn run(backend: &InngestBackend, request: &Value) -> Response {
    let config = &backend.inner.config;
    let event = &request["event"];
    let (text, carried) = split_carried(&event["data"]);
    let empty = Map::new();
    let progress = Progress::read(request["steps"].as_object().unwrap_or(&empty), carried.as_ref());
    let steps = progress.steps;
    if let Some(wait) = progress.pending {
        // A mark's sleep: no worker is asked.
        return respond(backend, steps, Verdict::Wait(wait));
    }
    let run_id = request["ctx"]["run_id"].as_str().unwrap_or_default().to_owned();
    // A continued run's job keeps the id of its first event.
    let event_id = job_id(event, carried.as_ref()).unwrap_or(&run_id).to_owned();
    let (env, undecodable) = carried_job("inngest", &event_id, &text, Known::default(), Utc::now());
    let ctx_attempt = request["ctx"]["attempt"].as_u64().unwrap_or(0) as u32;
    // Inngest's calls again count up to one past the attempts the job has left: a call past
    // its cap (the last attempt's worker died) is made a record by the worker, never run.
    let left = env.cap.saturating_sub(progress.spent);
    let attempt = progress.attempt(ctx_attempt.min(left));
    if steps + 2 + STEP_RESERVE > config.max_steps {
        // A mark and its sleep would bring the run within the reserve of Inngest's limit: the job
        // goes on in a new run before it is parked here again, so that it is never in two.
        let mark = Mark { spent: attempt - 1, error: None, wait: Duration::ZERO, unclaimed: progress.unclaimed };
        let place = Place { steps, errors: progress.errors, event, run_id: &run_id, job_id: &event_id };
        return match backend.continue_run(&place, &mark).await {
            Ok(()) => answer(backend, StatusCode::OK, &json!({ "continued": true }), None),
            // Nothing parked: the next call tries again (the same id), within the reserve.
            Err(e) => {
                warn!(error = %e, run = %run_id, "a run near its step limit could not continue yet");
                respond(backend, steps, Verdict::Mark(Mark { wait: Duration::from_secs(1), ..mark }))
            }
        };
    }
    // A job scheduled for later sleeps until then first, at no attempt's cost.
    if let Some(at) = env.not_before.filter(|at| *at > Utc::now()) {
        let wait = (at - Utc::now()).to_std().unwrap_or_default().max(Duration::from_millis(1));
        let mark = Mark { spent: attempt - 1, error: None, wait, unclaimed: 0 };
        return respond(backend, steps, Verdict::Mark(mark));
    }
    let job = env.into_job(JobId(event_id), attempt, undecodable);
    let Some(_slot) = backend.inner.parked.slot() else {
        warn!(bound = config.max_parked, "an Inngest call was handed back: the endpoint holds its bound of calls");
        let mark =
            Mark { spent: attempt - 1, error: None, wait: Duration::from_secs(1), unclaimed: progress.unclaimed };
        return respond(backend, steps, Verdict::Mark(mark));
    };
    debug!(job = %job.id, kind = %job.kind, key = %job.key, attempt, "Inngest call parked");
    let now = Instant::now();
    let timeout = config.call_timeout;
    let answer_by = now + timeout - (timeout / 10).min(Duration::from_secs(5));
    let (call, verdict) =
        backend.inner.parked.park(job, Parcel { run_id, progress }, answer_by, now + config.park_limit);
    let verdict = backend.inner.parked.verdict(&call, verdict, "Inngest", |lapse| backend.lapsed(&call, lapse)).await;
    respond(backend, steps, verdict.unwrap_or_else(|| Verdict::Again("no verdict".into())))
}
