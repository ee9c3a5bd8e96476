//! The in-memory live jobs: listed, read and cancelled.

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tracing::info;

use super::{MemoryBackend, Status, StoredJob, parse_id};
use crate::backend::{
    CancelOutcome, Cancellation, JobQuery, JobState, Jobs, LiveJob, Running, check_cancel, require_cancel_audit,
};
use crate::error::{Error, ErrorKind, Result};
use crate::job::JobId;

/// The wall-clock time of `at`, read against `now` on both clocks.
fn wall(at: Instant, now: Instant, wall_now: DateTime<Utc>) -> DateTime<Utc> {
    let ahead = |d| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
    if at >= now { wall_now + ahead(at - now) } else { wall_now - ahead(now - at) }
}

impl StoredJob {
    /// The job as [`Jobs`] shows it, at `now`.
    fn live(&self, id: u64, now: Instant, wall_now: DateTime<Utc>) -> LiveJob {
        let (state, run_at, running) = match &self.status {
            Status::Queued { ready_at } if *ready_at > now => {
                (JobState::Scheduled, Some(wall(*ready_at, now, wall_now)), None)
            }
            Status::Queued { ready_at } => (JobState::Queued, Some(wall(*ready_at, now, wall_now)), None),
            Status::Running { expires, .. } => {
                let lease_until = wall(*expires, now, wall_now);
                (JobState::Running, None, Some(Running { since: Some(self.updated_at), lease_until }))
            }
            Status::Done if self.cancelled.is_some() => (JobState::Cancelled, None, None),
            Status::Done => (JobState::Done, None, None),
            Status::Failed => (JobState::Failed, None, None),
        };
        LiveJob {
            id: JobId(id.to_string()),
            kind: self.job.kind.clone(),
            key: self.job.key.clone(),
            state,
            payload: self.job.payload.clone(),
            attempts: self.attempts,
            cap: self.job.cap,
            created_at: self.enqueued_at,
            updated_at: Some(self.updated_at),
            run_at,
            running,
            errors: self.errors.clone(),
            cancelled: self.cancelled.clone(),
        }
    }
}

fn no_job(id: &JobId) -> Error {
    Error::new(ErrorKind::NotFound, format!("no job {id}"))
}

impl Jobs for MemoryBackend {
    async fn list_jobs(&self, query: &JobQuery) -> Result<Vec<LiveJob>> {
        let after = query.after.as_ref().map(|id| parse_id(&id.0)).transpose()?.unwrap_or(0);
        let (now, wall_now) = (Instant::now(), Utc::now());
        let state = self.lock();
        let page = state.jobs.range(after + 1..).map(|(id, job)| job.live(*id, now, wall_now));
        Ok(page.filter(|job| query.matches(job, wall_now)).take(query.page_size()).collect())
    }

    async fn get_job(&self, id: &JobId) -> Result<LiveJob> {
        let n = parse_id(&id.0).map_err(|_| no_job(id))?;
        let state = self.lock();
        state.jobs.get(&n).map(|job| job.live(n, Instant::now(), Utc::now())).ok_or_else(|| no_job(id))
    }

    async fn cancel_job(&self, id: &JobId, reason: &str, actor: &str) -> Result<CancelOutcome> {
        require_cancel_audit(reason, actor)?;
        let n = parse_id(&id.0).map_err(|_| no_job(id))?;
        let mut state = self.lock();
        let job = state.jobs.get_mut(&n).ok_or_else(|| no_job(id))?;
        let live = job.live(n, Instant::now(), Utc::now());
        check_cancel(id, live.state)?;
        if let Some(cancelled) = live.cancelled {
            return Ok(CancelOutcome::AlreadyCancelled(cancelled));
        }
        let at = Utc::now();
        job.cancelled = Some(Cancellation { at, reason: reason.to_owned(), actor: actor.to_owned() });
        if live.state == JobState::Running {
            // Its worker learns of it at its next renewal, and stops the handler.
            info!(job_id = %id, kind = %job.job.kind, key = %job.job.key, actor, "running job asked to stop");
            return Ok(CancelOutcome::Requested);
        }
        info!(job_id = %id, kind = %job.job.kind, key = %job.job.key, actor, "job cancelled");
        if state.end_cancelled(n) {
            // Its order key's later jobs no longer wait for it.
            drop(state);
            self.work.notify_waiters();
        }
        Ok(CancelOutcome::Cancelled)
    }
}
