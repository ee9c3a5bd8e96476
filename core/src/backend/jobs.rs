//! [`Jobs`]: the live jobs (not failed yet), listed, read and cancelled.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{AttemptError, require_audit};
use crate::error::{Error, ErrorKind, Result};
use crate::job::JobId;
use crate::key::IdempotencyKey;
use crate::redact::debug_redacted;

/// Where a job stands, as [`Jobs::list_jobs`] filters and shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Ready to be claimed now.
    Queued,
    /// Queued for a later time (a delayed job, a retry's back-off).
    Scheduled,
    /// Claimed by a worker, under a lease.
    Running,
    /// Finished: its effect is done (kept until the done jobs are pruned).
    Done,
    /// Its failure record was written (see [`DeadLetter`](super::DeadLetter)).
    Failed,
    /// Cancelled before it ran: it never will, and its key stays taken.
    Cancelled,
}

impl JobState {
    /// Every state, in the order a job goes through them.
    pub const ALL: [Self; 6] =
        [Self::Queued, Self::Scheduled, Self::Running, Self::Done, Self::Failed, Self::Cancelled];

    /// The state's name, as the command line and the pages write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Scheduled => "scheduled",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether a job in this state can be cancelled: it has not finished.
    pub fn is_cancellable(self) -> bool {
        matches!(self, Self::Queued | Self::Scheduled | Self::Running)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("no job state {s:?}: queued, scheduled, running, done, failed or cancelled"),
            )
        })
    }
}

/// A running job's hold. Which worker holds it is not recorded: a claim would have to carry the
/// worker's name into the hottest statement of every backend, and a broker cannot keep it at all;
/// the lease's expiry says how long the holder has before another worker may take the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    /// When its current claim took it, where the backend keeps it (Postgres, SQLite, memory).
    pub since: Option<DateTime<Utc>>,
    /// When its lease lapses unless renewed: its worker renews it while the handler runs.
    pub lease_until: DateTime<Utc>,
}

/// Why and by whom a job was cancelled: kept on the job, as a discard is kept on its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancellation {
    /// When.
    pub at: DateTime<Utc>,
    /// Why.
    pub reason: String,
    /// Who.
    pub actor: String,
}

/// A job as [`Jobs`] shows it: what a person on call reads before acting on it.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveJob {
    /// The job's id.
    pub id: JobId,
    /// The job kind.
    pub kind: String,
    /// The business-fact key.
    pub key: IdempotencyKey,
    /// Where it stands.
    pub state: JobState,
    /// The full payload.
    pub payload: Value,
    /// Attempts used so far.
    pub attempts: u32,
    /// The cap.
    pub cap: u32,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it last changed state, where the backend keeps it.
    pub updated_at: Option<DateTime<Utc>>,
    /// When a queued or scheduled job may run.
    pub run_at: Option<DateTime<Utc>>,
    /// A running job's hold.
    pub running: Option<Running>,
    /// The failed attempts of this run so far, oldest first.
    pub errors: Vec<AttemptError>,
    /// A cancelled job's audit; on a running job, the cancel asked of it (its worker stops the
    /// handler at its next lease renewal, unless the handler completes first).
    pub cancelled: Option<Cancellation>,
}

/// Which jobs [`Jobs::list_jobs`] returns, by id (oldest first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobQuery {
    /// Only this kind.
    pub kind: Option<String>,
    /// Only the job of this key (a key has one job while it is kept).
    pub key: Option<IdempotencyKey>,
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// Only jobs enqueued more than this long ago.
    pub older_than: Option<Duration>,
    /// Only jobs enqueued less than this long ago.
    pub younger_than: Option<Duration>,
    /// Jobs after this id (the last id of the previous page).
    pub after: Option<JobId>,
    /// At most this many; `0` means 100.
    pub limit: usize,
}

impl JobQuery {
    /// The page size, with the default applied.
    pub fn page_size(&self) -> usize {
        if self.limit == 0 { 100 } else { self.limit }
    }

    /// The enqueue times the age filters allow at `now`: (after, before), exclusive.
    pub fn created_window(&self, now: DateTime<Utc>) -> (Option<DateTime<Utc>>, Option<DateTime<Utc>>) {
        let ago = |d: Duration| chrono::Duration::from_std(d).ok().and_then(|d| now.checked_sub_signed(d));
        (self.younger_than.and_then(ago), self.older_than.and_then(ago))
    }

    /// Whether `job` passes the filters (not the paging), at `now`.
    pub fn matches(&self, job: &LiveJob, now: DateTime<Utc>) -> bool {
        let (after, before) = self.created_window(now);
        self.kind.as_ref().is_none_or(|k| *k == job.kind)
            && self.key.as_ref().is_none_or(|k| *k == job.key)
            && self.state.is_none_or(|s| s == job.state)
            && after.is_none_or(|t| job.created_at > t)
            && before.is_none_or(|t| job.created_at < t)
    }
}

/// What [`Jobs::cancel_job`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The job was queued or scheduled; it is cancelled now and will never run.
    Cancelled,
    /// The job is running: its worker is asked to stop it. At its next lease renewal (within a
    /// heartbeat) the worker drops the handler and the job ends cancelled, unless the handler
    /// completes first: a completed effect is never undone, and the job then reads done.
    Requested,
    /// It was cancelled before (or a cancel of it, running, was asked before); nothing changed.
    AlreadyCancelled(Cancellation),
}

/// The live jobs of a backend that stores its jobs (memory, PostgreSQL, SQLite): listed, read,
/// and cancelled before they run. A broker (SQS, Azure, QStash) cannot list the messages it holds
/// and does not implement it; see [`QueueStats`](super::QueueStats) for its counts.
pub trait Jobs: Send + Sync {
    /// Jobs matching `query`, by id (oldest first).
    fn list_jobs(&self, query: &JobQuery) -> impl Future<Output = Result<Vec<LiveJob>>> + Send;

    /// One job; [`NotFound`](crate::ErrorKind::NotFound) if it does not exist (or was pruned).
    fn get_job(&self, id: &JobId) -> impl Future<Output = Result<LiveJob>> + Send;

    /// Cancels a queued or scheduled job, keeping why, who and when on the job: it never runs,
    /// and its key stays taken (an enqueue of it answers a duplicate of the cancelled job) until
    /// the job is pruned with the done jobs. A running job is asked to stop
    /// ([`CancelOutcome::Requested`]): its lease renewal answers
    /// [`Cancelled`](crate::ErrorKind::Cancelled), its worker drops the handler, and whatever
    /// settles it next (a retry, a release, its lease's lapse) ends it cancelled; only a
    /// completion or a failure record wins over it. A blank `reason` or `actor` is refused
    /// ([`InvalidInput`](crate::ErrorKind::InvalidInput)), a done or failed job too; none is
    /// [`NotFound`](crate::ErrorKind::NotFound).
    fn cancel_job(&self, id: &JobId, reason: &str, actor: &str) -> impl Future<Output = Result<CancelOutcome>> + Send;

    /// Cancels the job of `key` (see [`Jobs::cancel_job`]); [`NotFound`](crate::ErrorKind::NotFound)
    /// if the key has none. Returns the job's id with the outcome. A backend that cannot list its
    /// jobs but keeps a ledger beside them (a broker's records database, as
    /// `redrive::any::AnyBackend` opens it) marks the key there instead
    /// ([`Ledger::cancel_effect`](crate::kit::Ledger::cancel_effect)), and answers without a job id.
    fn cancel_key(
        &self,
        key: &IdempotencyKey,
        reason: &str,
        actor: &str,
    ) -> impl Future<Output = Result<(Option<JobId>, CancelOutcome)>> + Send {
        let query = JobQuery { key: Some(key.clone()), limit: 1, ..JobQuery::default() };
        async move {
            require_cancel_audit(reason, actor)?;
            let job = self.list_jobs(&query).await?.into_iter().next();
            let job = job.ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no job with key {key}")))?;
            let outcome = self.cancel_job(&job.id, reason, actor).await?;
            Ok((Some(job.id), outcome))
        }
    }
}

/// Refuses a cancel of a job that cannot be cancelled in `state` (a finished one): what every
/// backend's [`Jobs::cancel_job`] checks before it changes anything.
pub fn check_cancel(id: &JobId, state: JobState) -> Result<()> {
    match state {
        JobState::Queued | JobState::Scheduled | JobState::Running | JobState::Cancelled => Ok(()),
        JobState::Done | JobState::Failed => {
            Err(Error::new(ErrorKind::InvalidInput, format!("job {id} is {state}: there is nothing left to cancel")))
        }
    }
}

/// Refuses a cancel without a reason or an actor.
pub fn require_cancel_audit(reason: &str, actor: &str) -> Result<()> {
    require_audit("a cancel's reason", reason)?;
    require_audit("a cancel's actor", actor)
}

/// Conveniences over [`Jobs`]: cancel by filter.
pub trait JobsExt: Jobs {
    /// Cancels every queued, scheduled or running job matching `query` (all pages, from its
    /// `after`), each with `reason` and `actor` (a running one is asked to stop, see
    /// [`Jobs::cancel_job`]). Finished jobs are passed over; a `query` asking for them is refused
    /// ([`InvalidInput`](crate::ErrorKind::InvalidInput)). Returns the jobs cancelled or asked to
    /// stop.
    fn cancel_matching(
        &self,
        query: &JobQuery,
        reason: &str,
        actor: &str,
    ) -> impl Future<Output = Result<Vec<JobId>>> + Send {
        let mut query = query.clone();
        async move {
            require_cancel_audit(reason, actor)?;
            if let Some(state) = query.state.filter(|s| !s.is_cancellable()) {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("only queued, scheduled or running jobs can be cancelled, not {state} ones"),
                ));
            }
            let mut cancelled = Vec::new();
            loop {
                let page = self.list_jobs(&query).await?;
                for job in page.iter().filter(|j| j.state.is_cancellable()) {
                    match self.cancel_job(&job.id, reason, actor).await {
                        Ok(CancelOutcome::Cancelled | CancelOutcome::Requested) => cancelled.push(job.id.clone()),
                        Ok(CancelOutcome::AlreadyCancelled(_)) => {}
                        // Finished or gone since the page was read (the audit was checked above):
                        // passed over.
                        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidInput) => {}
                        Err(e) => return Err(e),
                    }
                }
                match page.last() {
                    Some(last) if page.len() == query.page_size() => query.after = Some(last.id.clone()),
                    _ => return Ok(cancelled),
                }
            }
        }
    }
}

impl<T: Jobs + ?Sized> JobsExt for T {}

debug_redacted!(LiveJob {
    show: [id, kind, key, state, attempts, cap, created_at, updated_at, run_at, running, errors, cancelled],
    hide: [payload],
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_read_back_from_their_names_and_others_are_refused() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>().unwrap(), state);
        }
        assert_eq!("paused".parse::<JobState>().unwrap_err().kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn only_unfinished_jobs_can_be_cancelled() {
        let id = JobId("7".into());
        for state in [JobState::Queued, JobState::Scheduled, JobState::Running, JobState::Cancelled] {
            assert!(check_cancel(&id, state).is_ok(), "{state}");
        }
        for state in [JobState::Done, JobState::Failed] {
            let refused = check_cancel(&id, state).unwrap_err();
            assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{state}");
            assert!(refused.to_string().contains("nothing left to cancel"), "{refused}");
        }
    }
}
