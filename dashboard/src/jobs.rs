//! The Jobs page: the live jobs where the backend stores them (filtered, paged), one job with
//! its payload, attempts and errors, and the cancel of a queued or scheduled one with a
//! confirmation. A broker cannot list its messages: the page says so and shows its counts.

use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::Router;
use axum::extract::{Extension, Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum_extra::extract::cookie::CookieJar;
use chrono::Utc;
use redrive_core::{CancelOutcome, ErrorKind, IdempotencyKey, JobId, JobQuery, JobState, LiveJob};
use serde::Deserialize;

use crate::pages::{Act, Shared, encode, failed, frame, problem, refuse, render};
use crate::views::{ErrorLine, Frame, age, depth, short, time};
use crate::{App, Csrf, Records};

/// Jobs per list page.
const PAGE: usize = 50;

pub(crate) fn routes<B: Records>() -> Router<Arc<App<B>>> {
    Router::new()
        .route("/jobs", get(list::<B>))
        .route("/jobs/{id}", get(show::<B>))
        .route("/jobs/{id}/cancel", get(confirm_cancel::<B>).post(cancel::<B>))
}

/// The list's filters, as its form and links send them. Empty fields mean "any".
#[derive(Debug, Clone, Default, Deserialize)]
struct JobFilter {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    state: String,
    /// An age: `2h`, `7d`.
    #[serde(default)]
    older_than: String,
    #[serde(default)]
    younger_than: String,
    #[serde(default)]
    after: String,
}

impl JobFilter {
    fn query(&self) -> Result<JobQuery, String> {
        let age = |text: &str| -> Result<Option<Duration>, String> {
            match text.trim() {
                "" => Ok(None),
                t => humantime::parse_duration(t).map(Some).map_err(|e| format!("the age {t:?}: {e}")),
            }
        };
        let key = match self.key.trim() {
            "" => None,
            k => Some(IdempotencyKey::parse(k).map_err(|e| format!("the key {k:?}: {}", e.message()))?),
        };
        let state = match self.state.as_str() {
            "" => None,
            s => Some(s.parse::<JobState>().map_err(|e| e.message().to_owned())?),
        };
        Ok(JobQuery {
            kind: (!self.kind.trim().is_empty()).then(|| self.kind.trim().to_owned()),
            key,
            state,
            older_than: age(&self.older_than)?,
            younger_than: age(&self.younger_than)?,
            after: (!self.after.is_empty()).then(|| JobId(self.after.clone())),
            limit: PAGE,
        })
    }

    fn query_string(&self, after: &str) -> String {
        let pairs = [
            ("kind", self.kind.as_str()),
            ("key", &self.key),
            ("state", &self.state),
            ("older_than", &self.older_than),
            ("younger_than", &self.younger_than),
            ("after", after),
        ];
        pairs
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// One line of the list.
struct JobRow {
    id: String,
    kind: String,
    key: String,
    state: String,
    attempts: String,
    age: String,
    when: String,
}

impl JobRow {
    fn of(j: &LiveJob) -> Self {
        let when = match (&j.running, &j.cancelled, j.run_at) {
            (Some(r), ..) => format!("lease until {}", time(r.lease_until)),
            (_, Some(c), _) => format!("cancelled by {}: {}", c.actor, short(&c.reason, 60)),
            (.., Some(at)) if at > Utc::now() => format!("runs at {}", time(at)),
            _ => String::new(),
        };
        Self {
            id: j.id.0.clone(),
            kind: j.kind.clone(),
            key: j.key.to_string(),
            state: j.state.to_string(),
            attempts: format!("{} of {}", j.attempts, j.cap),
            age: age(j.created_at),
            when,
        }
    }
}

/// The states the filter offers, with the one chosen.
struct StateOption {
    name: &'static str,
    chosen: bool,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobList {
    frame: Frame,
    kind: String,
    key: String,
    older_than: String,
    younger_than: String,
    states: Vec<StateOption>,
    rows: Vec<JobRow>,
    next: Option<String>,
    /// A broker's refusal, and its counts instead.
    unlisted: Option<String>,
    depth: Vec<crate::views::Depth>,
}

/// A job as its page shows it.
struct JobView {
    id: String,
    kind: String,
    key: String,
    state: String,
    cancellable: bool,
    /// Running: a cancel asks its worker to stop it.
    is_running: bool,
    /// "Cancelled", or "Cancel asked" of a running job.
    cancel_label: &'static str,
    attempts: String,
    created: String,
    updated: String,
    run_at: String,
    running: String,
    cancelled: String,
    payload: String,
    errors: Vec<ErrorLine>,
}

impl JobView {
    fn of(j: &LiveJob) -> Self {
        let running = j.running.as_ref().map_or_else(String::new, |r| {
            let since = r.since.map_or_else(|| "since a time not kept".to_owned(), |t| format!("since {}", time(t)));
            format!("{since}; lease until {} (which worker holds it is not recorded)", time(r.lease_until))
        });
        Self {
            id: j.id.0.clone(),
            kind: j.kind.clone(),
            key: j.key.to_string(),
            state: j.state.to_string(),
            // A running job asked to stop already has nothing more to cancel.
            cancellable: j.state.is_cancellable() && j.cancelled.is_none(),
            is_running: j.state == redrive_core::JobState::Running,
            cancel_label: if j.state == redrive_core::JobState::Running { "Cancel asked" } else { "Cancelled" },
            attempts: format!("{} of {}", j.attempts, j.cap),
            created: time(j.created_at),
            updated: j.updated_at.map(time).unwrap_or_default(),
            run_at: j.run_at.map(time).unwrap_or_default(),
            running,
            cancelled: j
                .cancelled
                .as_ref()
                .map_or_else(String::new, |c| format!("{} by {}: {}", time(c.at), c.actor, c.reason)),
            payload: serde_json::to_string_pretty(&j.payload).unwrap_or_default(),
            errors: j
                .errors
                .iter()
                .map(|e| ErrorLine { attempt: e.attempt, at: time(e.at), error: e.error.clone() })
                .collect(),
        }
    }
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    frame: Frame,
    j: JobView,
    notice: Option<String>,
}

#[derive(Template)]
#[template(path = "confirm_cancel.html")]
struct ConfirmCancel {
    frame: Frame,
    j: JobView,
    csrf: String,
}

async fn list<B: Records>(State(app): Shared<B>, Query(filter): Query<JobFilter>) -> Response {
    let query = match filter.query() {
        Ok(q) => q,
        Err(m) => return problem(StatusCode::BAD_REQUEST, m),
    };
    let (rows, next, unlisted, figures) = match app.backend.list_jobs(&query).await {
        Ok(page) => {
            let next = (page.len() == PAGE).then(|| filter.query_string(page.last().map_or("", |j| j.id.0.as_str())));
            (page.iter().map(JobRow::of).collect(), next, None, Vec::new())
        }
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            let (counts, open) = match tokio::try_join!(app.backend.counts(), app.backend.count_open()) {
                Ok(figures) => figures,
                Err(e) => return failed(e),
            };
            (Vec::new(), None, Some(e.message().to_owned()), depth(&counts, open, None))
        }
        Err(e) => return failed(e),
    };
    let states = redrive_core::JobState::ALL
        .into_iter()
        .map(|s| StateOption { name: s.as_str(), chosen: s.as_str() == filter.state })
        .collect();
    render(
        StatusCode::OK,
        JobList {
            frame: frame("Jobs"),
            kind: filter.kind.clone(),
            key: filter.key.clone(),
            older_than: filter.older_than.clone(),
            younger_than: filter.younger_than.clone(),
            states,
            rows,
            next,
            unlisted,
            depth: figures,
        },
    )
}

#[derive(Debug, Default, Deserialize)]
struct Notice {
    #[serde(default)]
    done: String,
}

async fn show<B: Records>(State(app): Shared<B>, Path(id): Path<String>, Query(notice): Query<Notice>) -> Response {
    let job = match app.backend.get_job(&JobId(id)).await {
        Ok(j) => j,
        Err(e) => return failed(e),
    };
    let notice = match notice.done.as_str() {
        "cancelled" => Some("Cancelled: the job will not run, and its key stays taken.".to_owned()),
        "already" => Some("Already cancelled: nothing changed.".to_owned()),
        "requested" => Some(
            "Asked to stop: its worker stops the handler at its next lease renewal, and the job ends cancelled \
             (unless it completes first)."
                .to_owned(),
        ),
        _ => None,
    };
    render(StatusCode::OK, JobPage { frame: frame(format!("Job {}", job.id)), j: JobView::of(&job), notice })
}

async fn confirm_cancel<B: Records>(
    State(app): Shared<B>,
    Path(id): Path<String>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    match app.backend.get_job(&JobId(id)).await {
        Ok(j) => {
            render(StatusCode::OK, ConfirmCancel { frame: frame("Cancel a job"), j: JobView::of(&j), csrf: csrf.0 })
        }
        Err(e) => failed(e),
    }
}

async fn cancel<B: Records>(
    State(app): Shared<B>,
    Path(id): Path<String>,
    headers: HeaderMap,
    jar: CookieJar,
    Form(form): Form<Act>,
) -> Response {
    if let Some(refused) = refuse(&headers, &jar, &form) {
        return refused;
    }
    let reason = form.reason.trim();
    if reason.is_empty() {
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "Give a reason: it stays with the job.");
    }
    let id = JobId(id);
    let by = form.by.trim();
    let done = match app.backend.cancel_job(&id, reason, by).await {
        Ok(CancelOutcome::Cancelled) => {
            tracing::info!(job = %id, by, "job cancelled from the dashboard");
            "cancelled"
        }
        Ok(CancelOutcome::Requested) => {
            tracing::info!(job = %id, by, "running job asked to stop from the dashboard");
            "requested"
        }
        Ok(CancelOutcome::AlreadyCancelled(_)) => "already",
        Err(e) if e.kind() == ErrorKind::Unsupported => return problem(StatusCode::CONFLICT, e.to_string()),
        Err(e) => return failed(e),
    };
    Redirect::to(&format!("/jobs/{}?done={done}", encode(&id.0))).into_response()
}
