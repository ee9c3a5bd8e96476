//! The routes and what each does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use askama::Template;
use axum::Router;
use axum::extract::{Extension, Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum_extra::extract::cookie::CookieJar;
use chrono::{DateTime, Utc};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use redrive_core::{ErrorKind, FailureId, FailureQuery, FailureRecord, RecordState, ReplayOutcome, Severity};
use serde::Deserialize;

use crate::auth::{Client, SignIn, csrf_refusal};
use crate::filter::Filter;
use crate::views::{self, Frame};
use crate::{App, Csrf, Records};

/// Open records an overview or a bulk replay reads at most.
pub(crate) const READ_AT_MOST: usize = 10_000;
/// Records per list page.
const PAGE: usize = 50;

pub(crate) type Shared<B> = State<Arc<App<B>>>;

pub(crate) fn routes<B: Records>() -> Router<Arc<App<B>>> {
    Router::new()
        .route("/", get(overview::<B>))
        .route("/records", get(records::<B>))
        .route("/records/{id}", get(record::<B>))
        .route("/records/{id}/replay", get(confirm_replay::<B>).post(replay::<B>))
        .route("/records/{id}/discard", get(confirm_discard::<B>).post(discard::<B>))
        .route("/replay", get(confirm_bulk::<B>).post(bulk::<B>))
        .route("/replays/{number}", get(progress::<B>))
        .route("/discard", get(confirm_bulk_discard::<B>).post(bulk_discard::<B>))
        .route("/discards/{number}", get(progress::<B>))
        .route("/audit", get(audit::<B>))
        .route("/login", get(login_page::<B>).post(login::<B>))
}

/// What a path segment or a query value keeps as is: RFC 3986's unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// `text` percent-encoded for a path segment or a query value.
pub(crate) fn encode(text: &str) -> String {
    utf8_percent_encode(text, UNRESERVED).to_string()
}

pub(crate) fn frame(title: impl Into<String>) -> Frame {
    Frame { title: title.into() }
}

pub(crate) fn render(status: StatusCode, page: impl Template) -> Response {
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "a dashboard page did not render");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page did not render\n").into_response()
        }
    }
}

pub(crate) fn problem(status: StatusCode, message: impl Into<String>) -> Response {
    render(status, views::Problem { frame: frame("Problem"), message: message.into() })
}

pub(crate) fn failed(e: redrive_core::Error) -> Response {
    let status = match e.kind() {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::InvalidName | ErrorKind::InvalidKey => StatusCode::BAD_REQUEST,
        ErrorKind::InvalidInput => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::BAD_GATEWAY,
    };
    problem(status, e.to_string())
}

/// Every record matching `filter` (its severity applied here: the stores do not index it), up
/// to `at_most`; and whether there were more.
pub(crate) async fn matching<B: Records>(
    app: &App<B>,
    filter: &Filter,
    at_most: usize,
) -> Result<(Vec<FailureRecord>, bool), Response> {
    let severity = filter.severity().map_err(|m| problem(StatusCode::BAD_REQUEST, m))?;
    let mut query = filter.query(500).map_err(|m| problem(StatusCode::BAD_REQUEST, m))?;
    let mut found = Vec::new();
    loop {
        let page = app.backend.list(&query).await.map_err(failed)?;
        let full = page.len() == query.limit;
        query.after = page.last().map(|r| r.id.clone());
        found.extend(page.into_iter().filter(|r| severity.is_none_or(|s| r.severity == s)));
        if found.len() > at_most {
            found.truncate(at_most);
            return Ok((found, true));
        }
        if !full {
            return Ok((found, false));
        }
    }
}

/// The last time an open record failed, of the oldest open one.
async fn oldest_open<B: Records>(app: &App<B>) -> redrive_core::Result<Option<DateTime<Utc>>> {
    let first = app.backend.list(&FailureQuery { limit: 1, ..FailureQuery::open() }).await?;
    Ok(first.first().map(|r| r.last_failed_at))
}

async fn overview<B: Records>(State(app): Shared<B>) -> Response {
    let (counts, open, oldest) =
        match tokio::try_join!(app.backend.counts(), app.backend.count_open(), oldest_open(&app)) {
            Ok(figures) => figures,
            Err(e) => return failed(e),
        };
    let (records, truncated) = match matching(&app, &Filter::default(), READ_AT_MOST).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let paused = match &app.flow {
        Some(store) => match store.all_kinds().await {
            Ok(kinds) => Some(
                kinds.iter().filter_map(|k| k.paused.as_ref().map(|p| crate::kinds::paused_view(&k.kind, p))).collect(),
            ),
            Err(e) => return failed(e),
        },
        None => None,
    };
    // Worst severity first, then by kind: (count, oldest, newest) of each.
    type Figures = (usize, DateTime<Utc>, DateTime<Utc>);
    let mut groups: BTreeMap<(std::cmp::Reverse<Severity>, String), Figures> = BTreeMap::new();
    for r in &records {
        let at = r.last_failed_at;
        let group = groups.entry((std::cmp::Reverse(r.severity), r.kind.clone())).or_insert((0, at, at));
        group.0 += 1;
        group.1 = group.1.min(at);
        group.2 = group.2.max(at);
    }
    let groups = groups
        .into_iter()
        .map(|((severity, kind), (count, oldest, newest))| views::Group {
            kind,
            severity: severity.0.as_str(),
            count,
            oldest: views::age(oldest),
            newest: views::age(newest),
        })
        .collect();
    render(
        StatusCode::OK,
        views::Overview {
            frame: frame("Failure records"),
            depth: views::depth(&counts, open, oldest),
            groups,
            truncated: truncated.then_some(READ_AT_MOST),
            paused,
        },
    )
}

async fn records<B: Records>(State(app): Shared<B>, Query(filter): Query<Filter>) -> Response {
    let severity = match filter.severity() {
        Ok(s) => s,
        Err(m) => return problem(StatusCode::BAD_REQUEST, m),
    };
    let query = match filter.query(PAGE) {
        Ok(q) => q,
        Err(m) => return problem(StatusCode::BAD_REQUEST, m),
    };
    let page = match app.backend.list(&query).await {
        Ok(page) => page,
        Err(e) => return failed(e),
    };
    let next = (page.len() == PAGE).then(|| filter.query_string(page.last().map(|r| r.id.0.as_str())));
    let rows = page.iter().filter(|r| severity.is_none_or(|s| r.severity == s)).map(views::Row::of).collect();
    let open = matches!(filter.state.as_str(), "" | "open");
    let bulk = open.then(|| Filter { after: String::new(), ..filter.clone() }.query_string(None));
    render(
        StatusCode::OK,
        views::RecordList {
            frame: frame("Records"),
            filter: filter.describe(),
            rows,
            next,
            bulk,
            kind: filter.kind,
            error: filter.error,
            state: filter.state,
            older_than: filter.older_than,
        },
    )
}

#[derive(Debug, Default, Deserialize)]
struct Notice {
    #[serde(default)]
    done: String,
}

async fn record<B: Records>(State(app): Shared<B>, Path(id): Path<String>, Query(notice): Query<Notice>) -> Response {
    let record = match app.backend.get(&FailureId(id)).await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let notice = match notice.done.as_str() {
        "replayed" => Some(
            "Replayed: the job is back on the queue with its original keys. The record is confirmed once its effect is done."
                .to_owned(),
        ),
        "closed" => Some("Already closed: nothing was sent again.".to_owned()),
        "discarded" => Some("Discarded.".to_owned()),
        _ => None,
    };
    let title = format!("Record {}", record.id);
    render(StatusCode::OK, views::RecordPage { frame: frame(title), r: views::RecordView::of(&record), notice })
}

async fn confirm_replay<B: Records>(
    State(app): Shared<B>,
    Path(id): Path<String>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    match app.backend.get(&FailureId(id)).await {
        Ok(r) => render(
            StatusCode::OK,
            views::ConfirmReplay { frame: frame("Replay"), r: views::RecordView::of(&r), csrf: csrf.0 },
        ),
        Err(e) => failed(e),
    }
}

async fn confirm_discard<B: Records>(
    State(app): Shared<B>,
    Path(id): Path<String>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    match app.backend.get(&FailureId(id)).await {
        Ok(r) => render(
            StatusCode::OK,
            views::ConfirmDiscard { frame: frame("Discard"), r: views::RecordView::of(&r), csrf: csrf.0 },
        ),
        Err(e) => failed(e),
    }
}

/// A form post's common fields.
#[derive(Debug, Deserialize)]
pub(crate) struct Act {
    #[serde(default)]
    pub(crate) csrf: String,
    #[serde(default)]
    pub(crate) by: String,
    #[serde(default)]
    pub(crate) reason: String,
}

/// Refuses a post without CSRF token or name: the response to send instead.
pub(crate) fn refuse(headers: &HeaderMap, jar: &CookieJar, form: &Act) -> Option<Response> {
    if let Some(why) = csrf_refusal(headers, jar, &form.csrf) {
        tracing::warn!(why, "dashboard refused a form post");
        return Some(problem(StatusCode::FORBIDDEN, format!("Refused {why}.")));
    }
    if form.by.trim().is_empty() {
        return Some(problem(StatusCode::UNPROCESSABLE_ENTITY, "Give your name: it goes in the audit trail."));
    }
    None
}

async fn replay<B: Records>(
    State(app): Shared<B>,
    Path(id): Path<String>,
    headers: HeaderMap,
    jar: CookieJar,
    Form(form): Form<Act>,
) -> Response {
    if let Some(refused) = refuse(&headers, &jar, &form) {
        return refused;
    }
    let id = FailureId(id);
    let by = form.by.trim();
    let done = match app.backend.replay(&id, form.reason.trim(), by).await {
        Ok(ReplayOutcome::Replayed(job)) => {
            tracing::info!(record = %id, job = %job, by, "replayed from the dashboard");
            "replayed"
        }
        Ok(ReplayOutcome::AlreadyClosed(_)) => "closed",
        Err(e) => return failed(e),
    };
    Redirect::to(&format!("/records/{}?done={done}", encode(&id.0))).into_response()
}

async fn discard<B: Records>(
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
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "Give a reason: it stays with the record.");
    }
    let id = FailureId(id);
    let by = form.by.trim();
    if let Err(e) = app.backend.discard(&id, reason, by).await {
        return failed(e);
    }
    tracing::info!(record = %id, by, "discarded from the dashboard");
    Redirect::to(&format!("/records/{}?done=discarded", encode(&id.0))).into_response()
}

/// The filter a bulk confirmation fixes: open records, the age become an instant, so that the post
/// matches what is confirmed here, not what has aged into the filter since (or failed since: those
/// fail after the instant).
fn fixed(filter: Filter) -> Result<Filter, String> {
    let query = filter.query(1)?;
    Ok(Filter {
        state: "open".into(),
        after: String::new(),
        before: query.failed_before.unwrap_or_else(Utc::now).timestamp_millis().to_string(),
        ..filter
    })
}

async fn confirm_bulk<B: Records>(
    State(app): Shared<B>,
    Query(filter): Query<Filter>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    let filter = match fixed(filter) {
        Ok(filter) => filter,
        Err(m) => return problem(StatusCode::BAD_REQUEST, m),
    };
    let (found, _) = match matching(&app, &filter, READ_AT_MOST).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    render(
        StatusCode::OK,
        views::BulkConfirm {
            frame: frame("Bulk replay"),
            filter: filter.describe(),
            count: found.len(),
            confirmed: fingerprint(&found),
            kind: filter.kind,
            severity: filter.severity,
            older_than: filter.older_than,
            error: filter.error,
            before: filter.before,
            csrf: csrf.0,
        },
    )
}

async fn confirm_bulk_discard<B: Records>(
    State(app): Shared<B>,
    Query(filter): Query<Filter>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    let filter = match fixed(filter) {
        Ok(filter) => filter,
        Err(m) => return problem(StatusCode::BAD_REQUEST, m),
    };
    let (found, _) = match matching(&app, &filter, READ_AT_MOST).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    render(
        StatusCode::OK,
        views::BulkDiscardConfirm {
            frame: frame("Bulk discard"),
            filter: filter.describe(),
            count: found.len(),
            confirmed: fingerprint(&found),
            kind: filter.kind,
            severity: filter.severity,
            older_than: filter.older_than,
            error: filter.error,
            before: filter.before,
            csrf: csrf.0,
        },
    )
}

#[derive(Debug, Deserialize)]
struct BulkDiscardForm {
    #[serde(flatten)]
    act: Act,
    #[serde(flatten)]
    filter: Filter,
    /// The confirmed records' [`fingerprint`].
    #[serde(default)]
    confirmed: String,
}

async fn bulk_discard<B: Records>(
    State(app): Shared<B>,
    headers: HeaderMap,
    jar: CookieJar,
    Form(form): Form<BulkDiscardForm>,
) -> Response {
    if let Some(refused) = refuse(&headers, &jar, &form.act) {
        return refused;
    }
    let reason = form.act.reason.trim().to_owned();
    if reason.is_empty() {
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "Give a reason: it stays with each record.");
    }
    let (filter, found) = match confirmed_set(&app, form.filter, &form.confirmed, Verb::Discard).await {
        Ok(set) => set,
        Err(response) => return response,
    };
    let by = form.act.by.trim().to_owned();
    let described = filter.describe();
    tracing::info!(records = found.len(), by, "bulk discard started from the dashboard");
    let ids = found.into_iter().map(|r| r.id).collect();
    let number = app.bulk.start(app.clone(), ids, None, described, by, reason);
    Redirect::to(&format!("/discards/{number}")).into_response()
}

/// A bulk run's action, as its messages name it.
#[derive(Clone, Copy)]
enum Verb {
    Replay,
    Discard,
}

impl Verb {
    /// The verb, its past participle, and the confirmation page's path.
    fn words(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Replay => ("replay", "replayed", "/replay"),
            Self::Discard => ("discard", "discarded", "/discard"),
        }
    }
}

/// The open records a bulk replay or discard takes: every one matching `filter` (all pages first,
/// since each closes as it is done, which would shift the pages), and only if they are the set the
/// operator confirmed (`confirmed`, its [`fingerprint`]): a record failed, replayed or discarded
/// since changes the set, and the operator confirms again.
async fn confirmed_set<B: Records>(
    app: &App<B>,
    filter: Filter,
    confirmed: &str,
    verb: Verb,
) -> Result<(Filter, Vec<FailureRecord>), Response> {
    let (act, done, page) = verb.words();
    if filter.before.is_empty() || confirmed.is_empty() {
        return Err(problem(StatusCode::UNPROCESSABLE_ENTITY, format!("Confirm the bulk {act} on its page first.")));
    }
    let filter = Filter { state: "open".into(), after: String::new(), ..filter };
    let (found, _) = matching(app, &filter, READ_AT_MOST).await?;
    if found.is_empty() {
        return Err(problem(StatusCode::NOT_FOUND, format!("No {} to {act}.", filter.describe())));
    }
    if fingerprint(&found) != confirmed {
        let again = format!("{page}?{}", filter.query_string(None));
        return Err(problem(
            StatusCode::CONFLICT,
            format!(
                "The matching records changed since you confirmed ({} match now): nothing was {done}. \
                 Confirm again at {again}.",
                found.len()
            ),
        ));
    }
    Ok((filter, found))
}

/// What a bulk replay's confirmation and its post compare: the matching records' ids, hashed.
fn fingerprint(records: &[FailureRecord]) -> String {
    let ids: Vec<&str> = records.iter().map(|r| r.id.0.as_str()).collect();
    redrive_core::kit::payload_fingerprint(&serde_json::json!(ids))
}

#[derive(Debug, Deserialize)]
struct BulkForm {
    #[serde(flatten)]
    act: Act,
    #[serde(flatten)]
    filter: Filter,
    #[serde(default)]
    rate: String,
    /// The confirmed records' [`fingerprint`].
    #[serde(default)]
    confirmed: String,
}

async fn bulk<B: Records>(
    State(app): Shared<B>,
    headers: HeaderMap,
    jar: CookieJar,
    Form(form): Form<BulkForm>,
) -> Response {
    if let Some(refused) = refuse(&headers, &jar, &form.act) {
        return refused;
    }
    let rate = match form.rate.trim().parse::<u32>() {
        Ok(rate) if (1..=1000).contains(&rate) => rate,
        _ => return problem(StatusCode::UNPROCESSABLE_ENTITY, "The rate is replays a second, 1 to 1000."),
    };
    let (filter, found) = match confirmed_set(&app, form.filter, &form.confirmed, Verb::Replay).await {
        Ok(set) => set,
        Err(response) => return response,
    };
    let (by, reason) = (form.act.by.trim().to_owned(), form.act.reason.trim().to_owned());
    let described = filter.describe();
    tracing::info!(records = found.len(), rate, by, "bulk replay started from the dashboard");
    let ids = found.into_iter().map(|r| r.id).collect();
    let number = app.bulk.start(app.clone(), ids, Some(rate), described, by, reason);
    Redirect::to(&format!("/replays/{number}")).into_response()
}

async fn progress<B: Records>(State(app): Shared<B>, Path(number): Path<usize>) -> Response {
    let Some(run) = app.bulk.get(number) else {
        return problem(StatusCode::NOT_FOUND, "No such bulk run (they are kept while the dashboard runs).");
    };
    let failure = run.failure.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let what = if run.discard { "discard" } else { "replay" };
    render(
        StatusCode::OK,
        views::Progress {
            frame: frame(format!("Bulk {what} {number}")),
            what,
            filter: run.filter.clone(),
            by: run.by.clone(),
            total: run.total,
            done: run.done.load(Ordering::Relaxed),
            closed: run.closed.load(Ordering::Relaxed),
            failure,
            running: !run.finished.load(Ordering::Acquire),
        },
    )
}

/// The audit trail: every closed record, with who closed it and why, as the records keep it (so
/// it is the same from every dashboard and after a restart, and includes the command's work).
async fn audit<B: Records>(State(app): Shared<B>) -> Response {
    let closed_filter = Filter { state: "closed".into(), ..Filter::default() };
    let (mut closed, truncated) = match matching(&app, &closed_filter, READ_AT_MOST).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let closed_at = |r: &FailureRecord| match &r.state {
        RecordState::Replaying { at, .. }
        | RecordState::Confirmed { at, .. }
        | RecordState::FailedAgain { at, .. }
        | RecordState::Discarded { at, .. } => *at,
        RecordState::Open => r.last_failed_at,
    };
    closed.sort_by_key(|r| std::cmp::Reverse(closed_at(r)));
    let closed = closed
        .iter()
        .map(|r| views::Closed {
            id: r.id.0.clone(),
            kind: r.kind.clone(),
            key: r.key.to_string(),
            at: views::time(closed_at(r)),
            what: views::closed_how(&r.state),
        })
        .collect();
    render(
        StatusCode::OK,
        views::Audit { frame: frame("Audit trail"), closed, truncated: truncated.then_some(READ_AT_MOST) },
    )
}

#[derive(Debug, Default, Deserialize)]
struct Next {
    #[serde(default)]
    next: String,
}

/// Where to go after signing in: a path on this dashboard, nothing else. Printable ASCII only:
/// browsers drop tabs and newlines from a URL (`/\t/evil` is `//evil`, another site) and read
/// a backslash as a slash; the guard sends every path here `encode`d, in that form.
fn local_path(next: &str) -> String {
    let printable = next.bytes().all(|b| b.is_ascii_graphic() && b != b'\\');
    if printable && next.starts_with('/') && !next.starts_with("//") { next.to_owned() } else { "/".to_owned() }
}

async fn login_page<B: Records>(
    State(app): Shared<B>,
    Query(next): Query<Next>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    if !app.auth.required() {
        return Redirect::to("/").into_response();
    }
    let page = views::Login { frame: frame("Sign in"), csrf: csrf.0, next: local_path(&next.next), refused: false };
    render(StatusCode::OK, page)
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: String,
}

async fn login<B: Records>(
    State(app): Shared<B>,
    headers: HeaderMap,
    jar: CookieJar,
    Extension(csrf): Extension<Csrf>,
    Extension(client): Extension<Client>,
    Form(form): Form<LoginForm>,
) -> Response {
    if let Some(why) = csrf_refusal(&headers, &jar, &form.csrf) {
        return problem(StatusCode::FORBIDDEN, format!("Refused {why}."));
    }
    match app.auth.sign_in(&form.token, client, app.auth.https(&headers)) {
        SignIn::Session(cookie) => (jar.add(cookie), Redirect::to(&local_path(&form.next))).into_response(),
        SignIn::Throttled(wait) => crate::auth::throttled(wait),
        SignIn::Wrong => {
            let page =
                views::Login { frame: frame("Sign in"), csrf: csrf.0, next: local_path(&form.next), refused: true };
            render(StatusCode::UNAUTHORIZED, page)
        }
    }
}

/// Prometheus text: the queue's depth, the open records and the oldest one's age, read now,
/// with whatever else the process records (a worker's counters).
pub(crate) async fn metrics<B: Records>(State(app): Shared<B>) -> Response {
    let Some(handle) = &app.metrics else {
        return (StatusCode::NOT_FOUND, "metrics are off: give the dashboard a Prometheus handle\n").into_response();
    };
    let (counts, open, oldest) =
        match tokio::try_join!(app.backend.counts(), app.backend.count_open(), oldest_open(&app)) {
            Ok(figures) => figures,
            Err(e) => return (StatusCode::BAD_GATEWAY, format!("{e}\n")).into_response(),
        };
    metrics::gauge!("redrive_queue_jobs", "state" => "queued").set(counts.queued as f64);
    metrics::gauge!("redrive_queue_jobs", "state" => "running").set(counts.running as f64);
    if let Some(scheduled) = counts.scheduled {
        metrics::gauge!("redrive_queue_jobs", "state" => "scheduled").set(scheduled as f64);
    }
    // Zero only where nothing is ready; a broker that cannot tell (SQS, Azure) reports no figure.
    let nothing_ready = counts.scheduled.is_some_and(|s| counts.queued <= s);
    if let Some(wait) = counts.oldest_ready.or(nothing_ready.then_some(Duration::ZERO)) {
        metrics::gauge!("redrive_oldest_ready_job_seconds").set(wait.as_secs_f64());
    }
    metrics::gauge!("redrive_open_records").set(open as f64);
    let oldest = oldest.map_or(0.0, |at| (Utc::now() - at).num_milliseconds().max(0) as f64 / 1000.0);
    metrics::gauge!("redrive_oldest_open_record_seconds").set(oldest);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render()).into_response()
}
