//! The pages' templates and the plain strings they show. Every value is escaped by askama;
//! nothing here builds HTML by hand.

use askama::Template;
use chrono::{DateTime, Utc};
use redrive_core::{Counts, FailureRecord, RecordState};

/// `3h 12m`, to the second below a minute and to the minute above.
pub(crate) fn age(since: DateTime<Utc>) -> String {
    let seconds = (Utc::now() - since).num_seconds().max(0) as u64;
    duration(std::time::Duration::from_secs(if seconds >= 60 { seconds / 60 * 60 } else { seconds }))
}

pub(crate) fn duration(d: std::time::Duration) -> String {
    humantime::format_duration(std::time::Duration::from_secs(d.as_secs())).to_string()
}

pub(crate) fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// The first line of `text`, at most `max` characters.
pub(crate) fn short(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max - 1).collect::<String>())
    } else {
        line.into()
    }
}

pub(crate) fn state_name(state: &RecordState) -> String {
    let amended = |amended: &bool| if *amended { " with an amended payload" } else { "" };
    match state {
        RecordState::Open => "open".into(),
        RecordState::Replaying { at, reason, actor, amended: a } => format!(
            "replaying since {}{}{}: waiting for its job's effect",
            time(*at),
            amended(a),
            by_for(actor, reason)
        ),
        RecordState::Confirmed { at, reason, actor, amended: a, confirmed_at } => format!(
            "confirmed {}: its effect done once, replayed {}{}{}",
            time(*confirmed_at),
            time(*at),
            amended(a),
            by_for(actor, reason)
        ),
        RecordState::FailedAgain { at, reason, actor, amended: a, failed_at, next } => format!(
            "failed again {} as record {next}, replayed {}{}{}",
            time(*failed_at),
            time(*at),
            amended(a),
            by_for(actor, reason)
        ),
        RecordState::Discarded { at, reason, actor } => format!("discarded {}{}", time(*at), by_for(actor, reason)),
    }
}

/// How a record was closed, by whom and why: `replayed by ada: fixed in 1.4.2, confirmed`.
pub(crate) fn closed_how(state: &RecordState) -> String {
    match state {
        RecordState::Open => "open".into(),
        RecordState::Replaying { reason, actor, .. } => format!("replayed{}, not confirmed yet", by_for(actor, reason)),
        RecordState::Confirmed { reason, actor, .. } => format!("replayed{}, confirmed", by_for(actor, reason)),
        RecordState::FailedAgain { reason, actor, next, .. } => {
            format!("replayed{}, failed again as record {next}", by_for(actor, reason))
        }
        RecordState::Discarded { reason, actor, .. } => format!("discarded{}", by_for(actor, reason)),
    }
}

/// ` by ada: why`, leaving out what the record does not say (replays before they were audited).
fn by_for(actor: &str, reason: &str) -> String {
    let by = if actor.is_empty() { String::new() } else { format!(" by {actor}") };
    if reason.is_empty() { by } else { format!("{by}: {reason}") }
}

/// What every page's frame shows.
pub(crate) struct Frame {
    pub(crate) title: String,
}

/// One line of the queue's depth.
pub(crate) struct Depth {
    pub(crate) name: &'static str,
    pub(crate) value: String,
}

pub(crate) fn depth(counts: &Counts, open: u64, oldest_open: Option<DateTime<Utc>>) -> Vec<Depth> {
    let unknown = || "unknown".to_owned();
    let ready = counts.scheduled.map(|s| counts.queued.saturating_sub(s));
    vec![
        Depth { name: "queued", value: counts.queued.to_string() },
        Depth { name: "ready", value: ready.map_or_else(unknown, |n| n.to_string()) },
        Depth { name: "scheduled", value: counts.scheduled.map_or_else(unknown, |n| n.to_string()) },
        Depth { name: "running", value: counts.running.to_string() },
        Depth {
            name: "oldest ready job waiting",
            value: match counts.oldest_ready {
                Some(d) => duration(d),
                None if ready == Some(0) => "nothing ready".into(),
                None => unknown(),
            },
        },
        Depth { name: "open records", value: open.to_string() },
        Depth { name: "oldest open record", value: oldest_open.map_or_else(|| "none".into(), age) },
    ]
}

/// Open records of one kind and severity.
pub(crate) struct Group {
    pub(crate) kind: String,
    pub(crate) severity: &'static str,
    pub(crate) count: usize,
    pub(crate) oldest: String,
    pub(crate) newest: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
pub(crate) struct Overview {
    pub(crate) frame: Frame,
    pub(crate) depth: Vec<Depth>,
    pub(crate) groups: Vec<Group>,
    /// More open records than the page reads; the groups count the first ones.
    pub(crate) truncated: Option<usize>,
    /// The paused kinds, where the dashboard has a flow store.
    pub(crate) paused: Option<Vec<PausedKind>>,
}

/// One line of a list of records.
pub(crate) struct Row {
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) severity: &'static str,
    pub(crate) attempts: String,
    pub(crate) error: String,
    pub(crate) age: String,
    pub(crate) state: String,
}

impl Row {
    pub(crate) fn of(r: &FailureRecord) -> Self {
        Self {
            id: r.id.0.clone(),
            kind: r.kind.clone(),
            severity: r.severity.as_str(),
            attempts: format!("{} of {}", r.attempts, r.cap),
            error: short(&r.last_error, 90),
            age: age(r.last_failed_at),
            state: state_name(&r.state),
        }
    }
}

#[derive(Template)]
#[template(path = "records.html")]
pub(crate) struct RecordList {
    pub(crate) frame: Frame,
    pub(crate) filter: String,
    pub(crate) rows: Vec<Row>,
    /// The query string of the next page.
    pub(crate) next: Option<String>,
    /// The query string of a bulk replay or discard of this filter, when it lists open records.
    pub(crate) bulk: Option<String>,
    /// The search form's values.
    pub(crate) kind: String,
    pub(crate) error: String,
    pub(crate) state: String,
    pub(crate) older_than: String,
}

pub(crate) struct ErrorLine {
    pub(crate) attempt: u32,
    pub(crate) at: String,
    pub(crate) error: String,
}

/// One record, every field as shown.
pub(crate) struct RecordView {
    pub(crate) id: String,
    pub(crate) job_id: String,
    pub(crate) kind: String,
    pub(crate) key: String,
    pub(crate) provider_key: String,
    pub(crate) severity: &'static str,
    pub(crate) attempts: String,
    pub(crate) first_failed: String,
    pub(crate) last_failed: String,
    pub(crate) state: String,
    pub(crate) open: bool,
    pub(crate) payload: String,
    pub(crate) last_error: String,
    pub(crate) errors: Vec<ErrorLine>,
    /// The record this one's job was replayed from (it failed again into this one).
    pub(crate) replay_of: Option<String>,
    /// The record this one's replayed job failed again into.
    pub(crate) next: Option<String>,
    /// The payload an amended replay sent, pretty.
    pub(crate) amended: Option<String>,
    /// The failing attempt's trace id, to look up in the tracing backend.
    pub(crate) trace_id: Option<String>,
}

impl RecordView {
    pub(crate) fn of(r: &FailureRecord) -> Self {
        Self {
            id: r.id.0.clone(),
            job_id: r.job_id.to_string(),
            kind: r.kind.clone(),
            key: r.key.to_string(),
            provider_key: r.provider_key.to_string(),
            severity: r.severity.as_str(),
            attempts: format!("{} of {}", r.attempts, r.cap),
            first_failed: format!("{} ({} ago)", time(r.first_failed_at), age(r.first_failed_at)),
            last_failed: format!("{} ({} ago)", time(r.last_failed_at), age(r.last_failed_at)),
            state: state_name(&r.state),
            open: r.state.is_open(),
            payload: serde_json::to_string_pretty(&r.payload).unwrap_or_default(),
            last_error: r.last_error.clone(),
            errors: r
                .errors
                .iter()
                .map(|e| ErrorLine { attempt: e.attempt, at: time(e.at), error: e.error.clone() })
                .collect(),
            replay_of: r.replay_of.as_ref().map(|id| id.0.clone()),
            next: match &r.state {
                RecordState::FailedAgain { next, .. } => Some(next.0.clone()),
                _ => None,
            },
            amended: r.amended.as_ref().map(|p| serde_json::to_string_pretty(p).unwrap_or_default()),
            trace_id: r.trace_id.clone(),
        }
    }
}

#[derive(Template)]
#[template(path = "record.html")]
pub(crate) struct RecordPage {
    pub(crate) frame: Frame,
    pub(crate) r: RecordView,
    pub(crate) notice: Option<String>,
}

#[derive(Template)]
#[template(path = "confirm_replay.html")]
pub(crate) struct ConfirmReplay {
    pub(crate) frame: Frame,
    pub(crate) r: RecordView,
    pub(crate) csrf: String,
}

#[derive(Template)]
#[template(path = "confirm_discard.html")]
pub(crate) struct ConfirmDiscard {
    pub(crate) frame: Frame,
    pub(crate) r: RecordView,
    pub(crate) csrf: String,
}

#[derive(Template)]
#[template(path = "bulk.html")]
pub(crate) struct BulkConfirm {
    pub(crate) frame: Frame,
    pub(crate) filter: String,
    pub(crate) count: usize,
    pub(crate) confirmed: String,
    pub(crate) kind: String,
    pub(crate) severity: String,
    pub(crate) older_than: String,
    pub(crate) error: String,
    pub(crate) before: String,
    pub(crate) csrf: String,
}

#[derive(Template)]
#[template(path = "bulk_discard.html")]
pub(crate) struct BulkDiscardConfirm {
    pub(crate) frame: Frame,
    pub(crate) filter: String,
    pub(crate) count: usize,
    pub(crate) confirmed: String,
    pub(crate) kind: String,
    pub(crate) severity: String,
    pub(crate) older_than: String,
    pub(crate) error: String,
    pub(crate) before: String,
    pub(crate) csrf: String,
}

#[derive(Template)]
#[template(path = "progress.html")]
pub(crate) struct Progress {
    pub(crate) frame: Frame,
    pub(crate) filter: String,
    pub(crate) by: String,
    /// `replay` or `discard`.
    pub(crate) what: &'static str,
    pub(crate) total: u64,
    /// Replayed or discarded.
    pub(crate) done: u64,
    pub(crate) closed: u64,
    pub(crate) failure: Option<String>,
    pub(crate) running: bool,
}

pub(crate) struct Closed {
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) key: String,
    pub(crate) at: String,
    pub(crate) what: String,
}

#[derive(Template)]
#[template(path = "audit.html")]
pub(crate) struct Audit {
    pub(crate) frame: Frame,
    pub(crate) closed: Vec<Closed>,
    pub(crate) truncated: Option<usize>,
}

#[derive(Template)]
#[template(path = "login.html")]
pub(crate) struct Login {
    pub(crate) frame: Frame,
    pub(crate) csrf: String,
    pub(crate) next: String,
    pub(crate) refused: bool,
}

#[derive(Template)]
#[template(path = "sign_out.html")]
pub(crate) struct SignOut {
    pub(crate) frame: Frame,
    pub(crate) csrf: String,
}

#[derive(Template)]
#[template(path = "problem.html")]
pub(crate) struct Problem {
    pub(crate) frame: Frame,
    pub(crate) message: String,
}

/// A paused kind: who, why, since when, and a breaker's next probe.
pub(crate) struct PausedKind {
    pub(crate) kind: String,
    pub(crate) by: String,
    pub(crate) reason: String,
    pub(crate) since: String,
    pub(crate) probe: Option<String>,
}

/// A kind the flow store knows, with its limits.
pub(crate) struct KindRow {
    pub(crate) kind: String,
    pub(crate) paused: bool,
    pub(crate) limits: String,
}

/// One line of flow control's history.
pub(crate) struct FlowLine {
    pub(crate) at: String,
    pub(crate) kind: String,
    pub(crate) action: &'static str,
    pub(crate) by: String,
    pub(crate) detail: String,
}

#[derive(Template)]
#[template(path = "kinds.html")]
pub(crate) struct Kinds {
    pub(crate) frame: Frame,
    pub(crate) paused: Vec<PausedKind>,
    pub(crate) rows: Vec<KindRow>,
    pub(crate) history: Vec<FlowLine>,
    pub(crate) notice: Option<String>,
    pub(crate) csrf: String,
}

#[derive(Template)]
#[template(path = "confirm_pause.html")]
pub(crate) struct ConfirmPause {
    pub(crate) frame: Frame,
    /// Blank: the form asks for it.
    pub(crate) kind: String,
    /// Set if the kind is paused already.
    pub(crate) paused: Option<PausedKind>,
    pub(crate) csrf: String,
}

#[derive(Template)]
#[template(path = "limits.html")]
pub(crate) struct LimitsForm {
    pub(crate) frame: Frame,
    /// Blank: the form asks for it.
    pub(crate) kind: String,
    /// The limits now, as the store has them.
    pub(crate) now: String,
    pub(crate) concurrency: String,
    pub(crate) rate: String,
    pub(crate) key_concurrency: String,
    pub(crate) key_rate: String,
    pub(crate) csrf: String,
}
