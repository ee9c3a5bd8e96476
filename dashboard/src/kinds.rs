//! The Kinds page: flow control as the store keeps it (paused kinds, kinds' limits, their
//! history), and the forms that change it, audited with the operator's name as replays and
//! discards are.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Extension, Form, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum_extra::extract::cookie::CookieJar;
use chrono::Utc;
use redrive_core::{Flow, FlowEvent, KindFlow, Limits, Paused, Rate, Result};
use serde::Deserialize;

use crate::pages::{Act, Shared, encode, failed, frame, problem, refuse, render};
use crate::{App, Csrf, Records, views};

/// Flow events the page shows, newest first.
const HISTORY: usize = 50;

type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// What the pages call of a [`Flow`] store, boxed: the dashboard keeps whichever store it was
/// given without a second type parameter on every page.
pub(crate) trait FlowStore: Send + Sync {
    fn all_kinds(&self) -> Boxed<'_, Vec<KindFlow>>;
    fn pause_kind<'a>(&'a self, kind: &'a str, reason: &'a str, by: &'a str) -> Boxed<'a, bool>;
    fn resume_kind<'a>(&'a self, kind: &'a str, by: &'a str) -> Boxed<'a, bool>;
    fn limit_kind<'a>(&'a self, kind: &'a str, limits: &'a Limits, by: &'a str) -> Boxed<'a, ()>;
    fn history(&self, limit: usize) -> Boxed<'_, Vec<FlowEvent>>;
}

impl<F: Flow + 'static> FlowStore for F {
    fn all_kinds(&self) -> Boxed<'_, Vec<KindFlow>> {
        Box::pin(self.kinds())
    }

    fn pause_kind<'a>(&'a self, kind: &'a str, reason: &'a str, by: &'a str) -> Boxed<'a, bool> {
        // A person's pause: no probe, it lasts until someone resumes the kind.
        Box::pin(self.pause(kind, reason, by, None))
    }

    fn resume_kind<'a>(&'a self, kind: &'a str, by: &'a str) -> Boxed<'a, bool> {
        Box::pin(self.resume(kind, by))
    }

    fn limit_kind<'a>(&'a self, kind: &'a str, limits: &'a Limits, by: &'a str) -> Boxed<'a, ()> {
        Box::pin(self.set_limits(kind, limits, by))
    }

    fn history(&self, limit: usize) -> Boxed<'_, Vec<FlowEvent>> {
        Box::pin(self.events(None, limit))
    }
}

pub(crate) fn routes<B: Records>() -> Router<Arc<App<B>>> {
    Router::new()
        .route("/kinds", get(page::<B>))
        .route("/kinds/pause", get(confirm_pause::<B>).post(pause::<B>))
        .route("/kinds/resume", axum::routing::post(resume::<B>))
        .route("/kinds/limits", get(limits_page::<B>).post(set_limits::<B>))
}

/// The page of a dashboard given no flow store.
fn off() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "Flow control is off on this dashboard: give it the workers' flow store (Dashboard::with_flow; \
         redrive serve does).",
    )
}

/// A kind named in a query or a form.
#[derive(Debug, Default, Deserialize)]
struct KindQuery {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    done: String,
}

/// Who paused, why, since when, and a breaker's next probe, as the pages show them.
pub(crate) fn paused_view(kind: &str, p: &Paused) -> views::PausedKind {
    let probe = p.probe_at.map(|at| {
        let left = (at - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        if left.is_zero() {
            "due now".to_owned()
        } else {
            format!("in {} ({})", views::duration(left), views::time(at))
        }
    });
    views::PausedKind {
        kind: kind.to_owned(),
        by: p.by.clone(),
        reason: p.reason.clone(),
        since: format!("{} ({} ago)", views::time(p.at), views::age(p.at)),
        probe,
    }
}

async fn page<B: Records>(
    State(app): Shared<B>,
    Query(query): Query<KindQuery>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    let Some(store) = app.flow.as_deref() else { return off() };
    let (kinds, events) = match tokio::try_join!(store.all_kinds(), store.history(HISTORY)) {
        Ok(found) => found,
        Err(e) => return failed(e),
    };
    let paused = kinds.iter().filter_map(|k| k.paused.as_ref().map(|p| paused_view(&k.kind, p))).collect();
    // Every kind the store knows, and those its history names (resumed, limits cleared since).
    let mut rows: Vec<views::KindRow> = kinds
        .iter()
        .map(|k| views::KindRow { kind: k.kind.clone(), paused: k.paused.is_some(), limits: k.limits.to_string() })
        .collect();
    for e in &events {
        if !rows.iter().any(|r| r.kind == e.kind) {
            rows.push(views::KindRow { kind: e.kind.clone(), paused: false, limits: Limits::default().to_string() });
        }
    }
    rows.sort_by(|a, b| a.kind.cmp(&b.kind));
    let history = events
        .iter()
        .map(|e| views::FlowLine {
            at: views::time(e.at),
            kind: e.kind.clone(),
            action: e.action.as_str(),
            by: e.by.clone(),
            detail: e.detail.clone(),
        })
        .collect();
    let kind = query.kind.as_str();
    let notice = match query.done.as_str() {
        "paused" => Some(format!("Paused {kind}: workers leave its jobs on the queue until it is resumed.")),
        "already" => Some(format!("{kind} was paused already: the first pause stands.")),
        "resumed" => Some(format!("Resumed {kind}.")),
        "running" => Some(format!("{kind} was not paused: nothing changed.")),
        "limits" => Some(format!("The limits of {kind} are set.")),
        _ => None,
    };
    render(StatusCode::OK, views::Kinds { frame: frame("Kinds"), paused, rows, history, notice, csrf: csrf.0 })
}

/// The kind's settings as the store has them (a kind it does not know is running, unlimited).
async fn kind_flow(store: &dyn FlowStore, kind: &str) -> Result<KindFlow> {
    let kinds = store.all_kinds().await?;
    let found = kinds.into_iter().find(|k| k.kind == kind);
    Ok(found.unwrap_or_else(|| KindFlow { kind: kind.to_owned(), paused: None, limits: Limits::default() }))
}

async fn confirm_pause<B: Records>(
    State(app): Shared<B>,
    Query(query): Query<KindQuery>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    let Some(store) = app.flow.as_deref() else { return off() };
    let kind = query.kind.trim();
    let paused = if kind.is_empty() {
        None
    } else {
        match kind_flow(store, kind).await {
            Ok(flow) => flow.paused.map(|p| paused_view(kind, &p)),
            Err(e) => return failed(e),
        }
    };
    let title = if kind.is_empty() { "Pause a kind".to_owned() } else { format!("Pause {kind}") };
    render(StatusCode::OK, views::ConfirmPause { frame: frame(title), kind: kind.to_owned(), paused, csrf: csrf.0 })
}

#[derive(Debug, Deserialize)]
struct KindForm {
    #[serde(flatten)]
    act: Act,
    #[serde(default)]
    kind: String,
}

/// Refuses a form without CSRF token, name or kind: the response to send instead.
fn refused(headers: &HeaderMap, jar: &CookieJar, form: &KindForm) -> Option<Response> {
    if let Some(refused) = refuse(headers, jar, &form.act) {
        return Some(refused);
    }
    form.kind.trim().is_empty().then(|| problem(StatusCode::UNPROCESSABLE_ENTITY, "Name the job kind."))
}

fn done(what: &str, kind: &str) -> Response {
    Redirect::to(&format!("/kinds?done={what}&kind={}", encode(kind))).into_response()
}

async fn pause<B: Records>(
    State(app): Shared<B>,
    headers: HeaderMap,
    jar: CookieJar,
    Form(form): Form<KindForm>,
) -> Response {
    let Some(store) = app.flow.as_deref() else { return off() };
    if let Some(refused) = refused(&headers, &jar, &form) {
        return refused;
    }
    let kind = form.kind.trim();
    let reason = form.act.reason.trim();
    if reason.is_empty() {
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "Give a reason: it is shown with the pause.");
    }
    let by = form.act.by.trim();
    match store.pause_kind(kind, reason, by).await {
        Ok(true) => {
            tracing::info!(kind, by, "kind paused from the dashboard");
            done("paused", kind)
        }
        Ok(false) => done("already", kind),
        Err(e) => failed(e),
    }
}

async fn resume<B: Records>(
    State(app): Shared<B>,
    headers: HeaderMap,
    jar: CookieJar,
    Form(form): Form<KindForm>,
) -> Response {
    let Some(store) = app.flow.as_deref() else { return off() };
    if let Some(refused) = refused(&headers, &jar, &form) {
        return refused;
    }
    let kind = form.kind.trim();
    let by = form.act.by.trim();
    match store.resume_kind(kind, by).await {
        Ok(true) => {
            tracing::info!(kind, by, "kind resumed from the dashboard");
            done("resumed", kind)
        }
        Ok(false) => done("running", kind),
        Err(e) => failed(e),
    }
}

async fn limits_page<B: Records>(
    State(app): Shared<B>,
    Query(query): Query<KindQuery>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    let Some(store) = app.flow.as_deref() else { return off() };
    let kind = query.kind.trim();
    let limits = if kind.is_empty() {
        Limits::default()
    } else {
        match kind_flow(store, kind).await {
            Ok(flow) => flow.limits,
            Err(e) => return failed(e),
        }
    };
    let shown = |n: Option<u32>| n.map(|n| n.to_string()).unwrap_or_default();
    let rate = |r: Option<Rate>| r.map(|r| r.to_string()).unwrap_or_default();
    let title = if kind.is_empty() { "Limits of a kind".to_owned() } else { format!("Limits of {kind}") };
    render(
        StatusCode::OK,
        views::LimitsForm {
            frame: frame(title),
            kind: kind.to_owned(),
            now: limits.to_string(),
            concurrency: shown(limits.concurrency),
            rate: rate(limits.rate),
            key_concurrency: shown(limits.key_concurrency),
            key_rate: rate(limits.key_rate),
            csrf: csrf.0,
        },
    )
}

#[derive(Debug, Deserialize)]
struct LimitsPost {
    #[serde(flatten)]
    form: KindForm,
    #[serde(default)]
    concurrency: String,
    #[serde(default)]
    rate: String,
    #[serde(default)]
    key_concurrency: String,
    #[serde(default)]
    key_rate: String,
}

impl LimitsPost {
    /// The limits the form gives, a blank field no limit; or what is wrong with one, as the store
    /// would say it.
    fn limits(&self) -> std::result::Result<Limits, String> {
        let count = |name: &str, text: &str| match text.trim() {
            "" => Ok(None),
            n => n.parse::<u32>().map(Some).map_err(|_| format!("{name}: {n:?} is not a whole number")),
        };
        let rate = |name: &str, text: &str| match text.trim() {
            "" => Ok(None),
            r => Rate::parse(r).map(Some).map_err(|e| format!("{name}: {}", e.message())),
        };
        let limits = Limits {
            concurrency: count("At once", &self.concurrency)?,
            rate: rate("Rate", &self.rate)?,
            key_concurrency: count("At once per key", &self.key_concurrency)?,
            key_rate: rate("Rate per key", &self.key_rate)?,
        };
        limits.validate().map_err(|e| e.message().to_owned())?;
        Ok(limits)
    }
}

async fn set_limits<B: Records>(
    State(app): Shared<B>,
    headers: HeaderMap,
    jar: CookieJar,
    Form(post): Form<LimitsPost>,
) -> Response {
    let Some(store) = app.flow.as_deref() else { return off() };
    if let Some(refused) = refused(&headers, &jar, &post.form) {
        return refused;
    }
    let kind = post.form.kind.trim();
    let limits = match post.limits() {
        Ok(limits) => limits,
        Err(why) => return problem(StatusCode::UNPROCESSABLE_ENTITY, format!("{why}. Nothing was changed.")),
    };
    let by = post.form.act.by.trim();
    if let Err(e) = store.limit_kind(kind, &limits, by).await {
        return failed(e);
    }
    tracing::info!(kind, by, limits = %limits, "kind limits set from the dashboard");
    done("limits", kind)
}
