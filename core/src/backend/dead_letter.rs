//! [`DeadLetter`] and [`Replay`]: failure records, read, closed and put back.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, ErrorKind, Result};
use crate::job::{JobId, Severity};
use crate::key::{IdempotencyKey, ProviderKey};
use crate::redact::debug_redacted;

/// A backend's id for a failure record.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FailureId(pub String);

impl std::fmt::Display for FailureId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One failed attempt in a record's error history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptError {
    /// The attempt's number.
    pub attempt: u32,
    /// When it failed.
    pub at: DateTime<Utc>,
    /// The error it ended with.
    pub error: String,
}

/// Where a failure record stands.
///
/// `Open` waits for a person. A replay moves it to `Replaying`; the replayed job then settles it:
/// `Confirmed` once the key's effect is done (the job ran, or found its effect already done),
/// or `FailedAgain` when the job ends as a new record, which names this one
/// ([`FailureRecord::replay_of`]). A discard closes it without a replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RecordState {
    /// Waiting for a person.
    Open,
    /// Put back on the queue with its original keys; its effect is not seen yet.
    #[serde(alias = "replayed")]
    Replaying {
        /// When.
        at: DateTime<Utc>,
        /// Why (may be empty: a replay loses nothing). Empty on records replayed before replays
        /// were audited, and while a broker's replay is being sent.
        #[serde(default)]
        reason: String,
        /// Who.
        #[serde(default)]
        actor: String,
        /// Whether the replay sent an amended payload ([`FailureRecord::amended`]) in place of
        /// the record's, which the record keeps.
        #[serde(default, skip_serializing_if = "is_false")]
        amended: bool,
    },
    /// Replayed, and the replayed job's effect is done, once: the seed's "confirm the effect
    /// happened once, then close the record".
    Confirmed {
        /// When it was replayed.
        at: DateTime<Utc>,
        /// Why it was replayed.
        #[serde(default)]
        reason: String,
        /// Who replayed it.
        #[serde(default)]
        actor: String,
        /// Whether the replay sent an amended payload.
        #[serde(default, skip_serializing_if = "is_false")]
        amended: bool,
        /// When the replayed job's effect was seen done.
        confirmed_at: DateTime<Utc>,
    },
    /// Replayed, and the replayed job failed again: `next` is its record, open, which names this
    /// one as what it replays.
    FailedAgain {
        /// When it was replayed.
        at: DateTime<Utc>,
        /// Why it was replayed.
        #[serde(default)]
        reason: String,
        /// Who replayed it.
        #[serde(default)]
        actor: String,
        /// Whether the replay sent an amended payload.
        #[serde(default, skip_serializing_if = "is_false")]
        amended: bool,
        /// When the replayed job failed.
        failed_at: DateTime<Utc>,
        /// The record the replayed job left.
        next: FailureId,
    },
    /// Closed without a replay.
    Discarded {
        /// When.
        at: DateTime<Utc>,
        /// Why.
        reason: String,
        /// Who.
        actor: String,
    },
}

impl RecordState {
    /// Whether the record still waits for a person.
    pub fn is_open(&self) -> bool {
        matches!(self, Self::Open)
    }

    /// A replay by `actor` for `reason`, sent now, its effect not seen yet.
    pub fn replaying(reason: &str, actor: &str, amended: bool) -> Self {
        Self::Replaying { at: Utc::now(), reason: reason.to_owned(), actor: actor.to_owned(), amended }
    }

    /// This replaying state, its effect seen done at `confirmed_at`; `None` unless replaying.
    pub fn confirmed(&self, confirmed_at: DateTime<Utc>) -> Option<Self> {
        match self.clone() {
            Self::Replaying { at, reason, actor, amended } => {
                Some(Self::Confirmed { at, reason, actor, amended, confirmed_at })
            }
            _ => None,
        }
    }

    /// This replaying state, its job failed again at `failed_at` into the record `next`;
    /// `None` unless replaying.
    pub fn failed_again(&self, failed_at: DateTime<Utc>, next: FailureId) -> Option<Self> {
        match self.clone() {
            Self::Replaying { at, reason, actor, amended } => {
                Some(Self::FailedAgain { at, reason, actor, amended, failed_at, next })
            }
            _ => None,
        }
    }

    /// The state's name as stored and shown: `open`, `replaying`, `confirmed`, `failed_again`,
    /// `discarded`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Replaying { .. } => "replaying",
            Self::Confirmed { .. } => "confirmed",
            Self::FailedAgain { .. } => "failed_again",
            Self::Discarded { .. } => "discarded",
        }
    }
}

/// A dead-letter entry: everything a person needs to understand and replay the job.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The record's id.
    pub id: FailureId,
    /// The failed job's id.
    pub job_id: JobId,
    /// The job kind.
    pub kind: String,
    /// The business-fact key, reused by a replay.
    pub key: IdempotencyKey,
    /// The provider key, reused by a replay.
    pub provider_key: ProviderKey,
    /// The full payload.
    pub payload: Value,
    /// The last attempt's error.
    pub last_error: String,
    /// Every failed attempt the backend kept, oldest first (may hold only the last).
    pub errors: Vec<AttemptError>,
    /// Attempts used.
    pub attempts: u32,
    /// The cap the job had.
    pub cap: u32,
    /// The job's alert severity.
    pub severity: Severity,
    /// The first failed attempt's time.
    pub first_failed_at: DateTime<Utc>,
    /// When the record was written.
    pub last_failed_at: DateTime<Utc>,
    /// Open, replaying, confirmed, failed again or discarded.
    pub state: RecordState,
    /// The record this job's failure follows: the job was replayed from it and failed again
    /// (that record is then [`RecordState::FailedAgain`], naming this one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<FailureId>,
    /// The payload a person's amended replay sent in place of [`payload`](Self::payload), which
    /// stays as the job failed with it: both are kept for the audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amended: Option<Value>,
    /// The trace id (32 hex digits) of the failing attempt, where there is one, so that an alert
    /// leads to the failing trace: with the `otel` feature, the trace of the attempt's own span
    /// (on a retry, a trace of its own that links to the producer's); otherwise, or where the
    /// span has no OpenTelemetry context, the trace of the job's `traceparent`. Taken from the
    /// job handed to [`Claim::dead_letter`](crate::kit::Claim::dead_letter) (see
    /// [`JobRecord::trace_id`](crate::JobRecord::trace_id)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !b
}

/// Which records [`DeadLetter::list`] returns, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailureQuery {
    /// Only this kind.
    pub kind: Option<String>,
    /// Only the records of this idempotency key (a job dead-lettered, replayed and
    /// dead-lettered again has several).
    pub key: Option<IdempotencyKey>,
    /// Only the records of this job (the id [`Enqueue`](super::Enqueue) answered, or [`JobContext::job_id`](crate::JobContext::job_id)).
    pub job_id: Option<JobId>,
    /// Only open records (`Some(true)`), only closed ones (`Some(false)`), or all.
    pub open: Option<bool>,
    /// Only records that failed before this time.
    pub failed_before: Option<DateTime<Utc>>,
    /// Only records whose last error holds this text, letters compared without case (on SQLite,
    /// ASCII letters only); `%`, `_` and `\` are matched as themselves. The last error is what a
    /// record shows first, and the error a retry sequence ended on; earlier attempts' errors are
    /// not searched. An empty text matches every record.
    pub error_contains: Option<String>,
    /// Records after this id (the last id of the previous page).
    pub after: Option<FailureId>,
    /// At most this many; `0` means 100.
    pub limit: usize,
}

impl FailureQuery {
    /// Open records of any kind, first page.
    pub fn open() -> Self {
        Self { open: Some(true), ..Self::default() }
    }

    /// Every record (open or closed) of `key`.
    pub fn by_key(key: IdempotencyKey) -> Self {
        Self { key: Some(key), ..Self::default() }
    }

    /// Every record (open or closed) of the job `id`.
    pub fn by_job(id: JobId) -> Self {
        Self { job_id: Some(id), ..Self::default() }
    }

    /// The page size, with the default applied.
    pub fn page_size(&self) -> usize {
        if self.limit == 0 { 100 } else { self.limit }
    }

    /// Whether `record` passes the filters (not the paging).
    pub fn matches(&self, record: &FailureRecord) -> bool {
        self.kind.as_ref().is_none_or(|k| *k == record.kind)
            && self.key.as_ref().is_none_or(|k| *k == record.key)
            && self.job_id.as_ref().is_none_or(|id| *id == record.job_id)
            && self.open.is_none_or(|open| open == record.state.is_open())
            && self.failed_before.is_none_or(|t| record.last_failed_at < t)
            && self
                .error_contains
                .as_ref()
                .is_none_or(|text| record.last_error.to_lowercase().contains(&text.to_lowercase()))
    }

    /// [`error_contains`](Self::error_contains) as a `LIKE` pattern with `\` as its escape
    /// character: the text between two `%`, its `%`, `_` and `\` escaped. `None` without it.
    pub fn error_pattern(&self) -> Option<String> {
        let text = self.error_contains.as_ref()?;
        let mut pattern = String::with_capacity(text.len() + 2);
        pattern.push('%');
        for c in text.chars() {
            if matches!(c, '%' | '_' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('%');
        Some(pattern)
    }
}

/// Reads and manages failure records without consuming them.
pub trait DeadLetter: Send + Sync {
    /// Records matching `query`, oldest first.
    fn list(&self, query: &FailureQuery) -> impl Future<Output = Result<Vec<FailureRecord>>> + Send;

    /// One record; [`NotFound`](crate::ErrorKind::NotFound) if it does not exist.
    fn get(&self, id: &FailureId) -> impl Future<Output = Result<FailureRecord>> + Send;

    /// How many records are open: the figure a health check or metric reads.
    fn count_open(&self) -> impl Future<Output = Result<u64>> + Send;

    /// Closes an open record without replaying it, keeping why and who. A blank `reason` or
    /// `actor` is refused ([`InvalidInput`](crate::ErrorKind::InvalidInput), see
    /// [`require_audit`]): the work is dropped, and the record is what says why and by whom.
    fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> impl Future<Output = Result<()>> + Send;

    /// Deletes records (any state) whose last failure is older than `age`, payloads included.
    /// Returns how many. A purged open record no longer blocks its order key.
    fn purge(&self, age: Duration) -> impl Future<Output = Result<u64>> + Send;

    /// The order keys held up by an open failure record (see [`Job::order_key`](crate::Job)),
    /// oldest record first: each stays blocked until its record is replayed or discarded. Empty
    /// where the backend keeps no order ([`Capabilities::order_per_key`](crate::kit::Capabilities)).
    fn blocked(&self) -> impl Future<Output = Result<Vec<Blocked>>> + Send {
        async { Ok(Vec::new()) }
    }
}

/// An order key held up by an open failure record: [`DeadLetter::blocked`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    /// The order key.
    pub order_key: String,
    /// The open record that holds it up; replay or discard it to go on.
    pub record: FailureId,
    /// The failed job's kind.
    pub kind: String,
    /// The failed job's key.
    pub key: IdempotencyKey,
    /// Jobs of the order key waiting behind it.
    pub waiting: u64,
}

/// What [`Replay::replay`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// The job is back on the queue with its original keys; the record is closed as replayed.
    Replayed(JobId),
    /// The record was already closed; nothing was enqueued.
    AlreadyClosed(RecordState),
}

/// Puts failed jobs back.
pub trait Replay: Send + Sync {
    /// Replays one open record with its original keys and closes it as replayed, keeping why and
    /// who, as a discard does. A blank `actor` is refused
    /// ([`InvalidInput`](crate::ErrorKind::InvalidInput)); `reason` may be empty (a replay drops
    /// nothing; its usual reason is the fix just deployed).
    fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> impl Future<Output = Result<ReplayOutcome>> + Send;

    /// Replays one open record with `payload` in place of its own, under the same idempotency
    /// and provider keys: the seed's "fix the cause" when the cause is the data (a malformed
    /// address). Allowed only while the key's effect has not happened (the job failed before
    /// it, as the record says and the ledger agrees); else
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) and nothing changes. The record keeps the original payload and the amended one
    /// ([`FailureRecord::amended`]), with why and who: a blank `reason` or `actor` is refused.
    /// An ordinary enqueue of another payload under the key stays a
    /// [`KeyConflict`](crate::ErrorKind::KeyConflict): only this audited call re-fingerprints it.
    ///
    /// Where the backend cannot re-fingerprint the key's ledger entry (a broker, whose ledger is
    /// apart from its records), [`InvalidInput`](crate::ErrorKind::InvalidInput) saying so
    /// ([`refuse_amend`]), and [`Capabilities::amend_replay`](crate::kit::Capabilities) unset.
    fn replay_amended(
        &self,
        id: &FailureId,
        payload: &Value,
        reason: &str,
        actor: &str,
    ) -> impl Future<Output = Result<ReplayOutcome>> + Send;
}

/// The refusal of [`Replay::replay_amended`] by a backend that cannot amend.
pub fn refuse_amend(id: &FailureId) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!(
            "record {id}: this backend cannot replay with an amended payload (its effect ledger is kept apart from \
             its records); replay it as it is, or discard it and enqueue the corrected job under a new key"
        ),
    )
}

/// Refuses `text` if it is blank: what a record keeps of who closed it (and why, for a discard).
/// `what` names it in the error (`"a discard's reason"`). Every backend checks before it changes
/// anything.
pub fn require_audit(what: &str, text: &str) -> Result<()> {
    if text.trim().is_empty() {
        return Err(Error::new(ErrorKind::InvalidInput, format!("{what} is required: it stays with the record")));
    }
    Ok(())
}

/// Conveniences over [`Replay`] and [`DeadLetter`].
pub trait ReplayExt: Replay + DeadLetter {
    /// Replays every open record matching `query` (all pages), at most `per_second` a second,
    /// each closed with `reason` and `actor` (see [`Replay::replay`]). Returns the jobs put back.
    fn replay_matching(
        &self,
        query: &FailureQuery,
        per_second: u32,
        reason: &str,
        actor: &str,
    ) -> impl Future<Output = Result<Vec<JobId>>> + Send {
        let mut query = FailureQuery { open: Some(true), after: None, ..query.clone() };
        let gap = Duration::from_secs(1) / per_second.max(1);
        async move {
            require_audit("a replay's actor", actor)?;
            let mut replayed = Vec::new();
            let mut pace = tokio::time::interval(gap);
            loop {
                let page = self.list(&query).await?;
                for record in &page {
                    pace.tick().await;
                    if let ReplayOutcome::Replayed(job) = self.replay(&record.id, reason, actor).await? {
                        replayed.push(job);
                    }
                }
                match page.last() {
                    Some(last) if page.len() == query.page_size() => query.after = Some(last.id.clone()),
                    _ => return Ok(replayed),
                }
            }
        }
    }

    /// Discards every open record matching `query` (all pages), each closed with `reason` and
    /// `actor` as [`DeadLetter::discard`] closes one. A blank reason or actor is refused before
    /// any is closed ([`InvalidInput`](crate::ErrorKind::InvalidInput)). Returns the records
    /// discarded, in the order they were.
    fn discard_matching(
        &self,
        query: &FailureQuery,
        reason: &str,
        actor: &str,
    ) -> impl Future<Output = Result<Vec<FailureId>>> + Send {
        let mut query = FailureQuery { open: Some(true), after: None, ..query.clone() };
        async move {
            require_audit("a discard's reason", reason)?;
            require_audit("a discard's actor", actor)?;
            let mut discarded = Vec::new();
            loop {
                let page = self.list(&query).await?;
                for record in &page {
                    self.discard(&record.id, reason, actor).await?;
                    discarded.push(record.id.clone());
                }
                match page.last() {
                    Some(last) if page.len() == query.page_size() => query.after = Some(last.id.clone()),
                    _ => return Ok(discarded),
                }
            }
        }
    }
}

impl<T: Replay + DeadLetter + ?Sized> ReplayExt for T {}

debug_redacted!(FailureRecord {
    show: [
        id,
        job_id,
        kind,
        key,
        provider_key,
        last_error,
        errors,
        attempts,
        cap,
        severity,
        first_failed_at,
        last_failed_at,
        state,
        replay_of,
        trace_id
    ],
    hide: [payload, amended],
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replayed_state_kept_before_replays_were_audited_still_reads() {
        // As broker stores kept it (JSON), and as a take reads until its replay closes it.
        let old: RecordState = serde_json::from_str(r#"{"state":"replayed","at":"2026-01-02T03:04:05Z"}"#).unwrap();
        assert!(matches!(old, RecordState::Replaying { reason, actor, .. } if reason.is_empty() && actor.is_empty()));
    }

    #[test]
    fn the_error_text_is_a_pattern_of_itself_and_matches_without_case() {
        let query = |text: &str| FailureQuery { error_contains: Some(text.to_owned()), ..FailureQuery::default() };
        assert_eq!(query(r"100%_a\b").error_pattern().unwrap(), r"%100\%\_a\\b%");
        assert_eq!(FailureQuery::default().error_pattern(), None);
        let key = crate::IdempotencyKey::builder("k").fact("a", 1).build().unwrap();
        let job = crate::NewJob::new("k", key, serde_json::json!({})).unwrap();
        let job = crate::kit::Envelope::new(&job).into_job(JobId("1".into()), 1, None);
        let record =
            FailureRecord::open(FailureId("1".into()), job, "SMTP 550: Mailbox FULL (100%)".into(), vec![], Utc::now());
        for hit in ["mailbox full", "SMTP", "(100%)", ""] {
            assert!(query(hit).matches(&record), "{hit:?}");
        }
        for miss in ["100%%", "mailbox_full", "quota"] {
            assert!(!query(miss).matches(&record), "{miss:?}");
        }
    }

    #[test]
    fn blank_audit_text_is_refused_as_invalid_input() {
        for blank in ["", " ", "\t\n"] {
            let refused = require_audit("a discard's reason", blank).unwrap_err();
            assert_eq!(refused.kind(), ErrorKind::InvalidInput);
            assert!(refused.to_string().contains("a discard's reason is required"), "{refused}");
        }
        assert!(require_audit("a discard's reason", "refunded").is_ok());
    }
}
