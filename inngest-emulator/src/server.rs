//! The HTTP API: the event API, function sync, and the runs API (read, cancel, rerun).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::engine::Shared;
use crate::{Function, RunStatus, Trigger, sign};

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/e/{key}", post(events))
        .route("/fn/register", post(register))
        .route("/v1/runs/{id}", get(run).delete(cancel))
        .route("/v1/events/{id}/runs", get(event_runs))
        .route("/v2/runs/{id}/rerun", post(rerun))
        .route("/v1/apps/{app}/functions", get(functions))
        .route("/health", get(|| async { "ok" }))
        .with_state(shared)
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message, "status": status.as_u16() }))).into_response()
}

/// The signing-key bearer on every API route but the event API's.
fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    sign::bearer_matches(&shared.config.keys(), bearer)
}

fn unauthorized() -> Response {
    error(StatusCode::UNAUTHORIZED, "authentication failed")
}

/// `POST /e/{key}`: one event or an array; `{ids, status: 200}` in order.
async fn events(State(shared): State<Arc<Shared>>, Path(key): Path<String>, body: Bytes) -> Response {
    shared.event_requests.fetch_add(1, Ordering::Relaxed);
    if key != shared.config.event_key {
        return error(StatusCode::UNAUTHORIZED, "Event key not found");
    }
    let events = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Array(events)) => events,
        Ok(event @ Value::Object(_)) => vec![event],
        _ => return error(StatusCode::BAD_REQUEST, "the body is not an event or an array of events"),
    };
    if let Some(at) = events.iter().position(|e| e.get("name").and_then(Value::as_str).is_none_or(str::is_empty)) {
        return error(StatusCode::BAD_REQUEST, &format!("event {at} has no name"));
    }
    if events.iter().any(|e| e.get("name").and_then(Value::as_str).is_some_and(|n| n.starts_with("inngest/"))) {
        return error(StatusCode::BAD_REQUEST, "event names starting with inngest/ are reserved");
    }
    let ids = shared.ingest(events);
    axum::Json(json!({ "ids": ids, "status": 200 })).into_response()
}

/// `POST /fn/register`: an app's functions, replacing what it registered before.
async fn register(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    // The JS SDK says appName, the Python SDK appname.
    let Some(app) = body.get("appName").or_else(|| body.get("appname")).and_then(Value::as_str).map(str::to_owned)
    else {
        return error(StatusCode::BAD_REQUEST, "no appName");
    };
    let mut functions = Vec::new();
    for f in body.get("functions").and_then(Value::as_array).into_iter().flatten() {
        match Function::from_config(&app, f) {
            Ok(function) => functions.push(function),
            Err(why) => return error(StatusCode::BAD_REQUEST, &why),
        }
    }
    let modified = {
        let mut state = shared.lock();
        let before: Vec<String> = state.functions.iter().filter(|f| f.app == app).map(|f| f.id.clone()).collect();
        state.functions.retain(|f| f.app != app);
        let now: Vec<String> = functions.iter().map(|f| f.id.clone()).collect();
        state.functions.extend(functions);
        before != now
    };
    info!(app = %app, "app synced");
    axum::Json(json!({ "ok": true, "modified": modified })).into_response()
}

async fn run(State(shared): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    match shared.lock().runs.iter().find(|r| r.id == id) {
        Some(run) => axum::Json(json!({ "data": run.to_json() })).into_response(),
        None => error(StatusCode::NOT_FOUND, "run not found"),
    }
}

/// `GET /v1/events/{id}/runs`: by the id the event API answered with, or the event's own id.
async fn event_runs(State(shared): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    let state = shared.lock();
    let runs: Vec<Value> = state
        .runs
        .iter()
        .filter(|r| r.event_id == id || r.event.get("id").and_then(Value::as_str) == Some(id.as_str()))
        .map(crate::Run::to_json)
        .collect();
    axum::Json(json!({ "data": runs })).into_response()
}

async fn cancel(State(shared): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    let mut state = shared.lock();
    let Some(run) = state.runs.iter_mut().find(|r| r.id == id) else {
        return error(StatusCode::NOT_FOUND, "run not found");
    };
    if run.status == RunStatus::Running {
        run.status = RunStatus::Cancelled;
        run.ended_at = Some(chrono::Utc::now());
    }
    drop(state);
    shared.changed.notify_waiters();
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /v2/runs/{id}/rerun`: a new run of the same function on the same event, past the
/// event id's dedupe.
async fn rerun(State(shared): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    let found = {
        let state = shared.lock();
        state.runs.iter().find(|r| r.id == id).and_then(|run| {
            let function = state.functions.iter().find(|f| f.id == run.function_id)?.clone();
            Some((function, run.event_id.clone(), run.event.clone()))
        })
    };
    let Some((function, event_id, event)) = found else {
        return error(StatusCode::NOT_FOUND, "run not found, or its function is no longer registered");
    };
    let run_id = shared.start_run(function, event_id, event, Some(id));
    axum::Json(json!({ "data": { "run_id": run_id } })).into_response()
}

async fn functions(State(shared): State<Arc<Shared>>, headers: HeaderMap, Path(app): Path<String>) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    let list: Vec<Value> = shared
        .lock()
        .functions
        .iter()
        .filter(|f| f.app == app)
        .map(|f| {
            let triggers: Vec<Value> = f
                .triggers
                .iter()
                .map(|Trigger { event, expression }| json!({ "event": event, "expression": expression }))
                .collect();
            json!({ "id": f.id, "name": f.name, "triggers": triggers, "retries": f.retries })
        })
        .collect();
    if list.is_empty() {
        warn!(app = %app, "no functions registered for this app");
    }
    axum::Json(json!({ "data": list })).into_response()
}
