//! The live jobs: listed, read and cancelled.

use chrono::{DateTime, Utc};
use redrive_core::kit::{AttemptError, check_cancel, require_cancel_audit};
use redrive_core::{
    CancelOutcome, Cancellation, Error, ErrorKind, JobId, JobQuery, JobState, Jobs, LiveJob, Result, Running,
};
use sqlx::Row;
use sqlx::postgres::PgRow;
use tracing::info;

use super::{PgBackend, key_from};
use crate::error::db;
use crate::sql::q;

fn no_job(id: &JobId) -> Error {
    Error::new(ErrorKind::NotFound, format!("no job {id}"))
}

fn job_from(row: &PgRow) -> Result<LiveJob> {
    let state: JobState = row.get::<&str, _>("state").parse()?;
    let errors: Vec<AttemptError> = serde_json::from_value(row.get("errors"))
        .map_err(|e| Error::new(ErrorKind::Decode, "stored error history does not decode").with_source(e))?;
    let updated_at: DateTime<Utc> = row.get("updated_at");
    let running = row
        .get::<Option<DateTime<Utc>>, _>("locked_until")
        .map(|lease_until| Running { since: Some(updated_at), lease_until });
    // Cancelled, or (running) a cancel asked of it.
    let asked = row.get::<Option<DateTime<Utc>>, _>("cancel_requested_at").filter(|_| state == JobState::Running);
    let cancelled = row.get::<Option<DateTime<Utc>>, _>("cancelled_at").or(asked).map(|at| Cancellation {
        at,
        reason: row.get::<Option<String>, _>("cancel_reason").unwrap_or_default(),
        actor: row.get::<Option<String>, _>("cancelled_by").unwrap_or_default(),
    });
    Ok(LiveJob {
        id: JobId(row.get::<i64, _>("id").to_string()),
        kind: row.get("kind"),
        key: key_from(row.get("idempotency_key"))?,
        state,
        payload: row.get("payload"),
        attempts: row.get::<i32, _>("attempts").max(0) as u32,
        cap: row.get::<i32, _>("cap").max(0) as u32,
        created_at: row.get("created_at"),
        updated_at: Some(updated_at),
        run_at: row.get("run_at"),
        running,
        errors,
        cancelled,
    })
}

impl PgBackend {
    async fn job_row(&self, id: Option<i64>, key: Option<&str>) -> Result<Option<LiveJob>> {
        let row = q(&self.inner.sql.get_job)
            .bind(id)
            .bind(key)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "get job"))?;
        row.as_ref().map(job_from).transpose()
    }
}

impl Jobs for PgBackend {
    async fn list_jobs(&self, query: &JobQuery) -> Result<Vec<LiveJob>> {
        let after = match &query.after {
            Some(id) => id.0.parse::<i64>().map_err(|_| no_job(id))?,
            None => 0,
        };
        if let Some(key) = &query.key {
            // One job per key: found through the key's row, then filtered as a page would be.
            let job = self.job_row(None, Some(key.as_str())).await?;
            let wanted =
                |job: &LiveJob| job.id.0.parse::<i64>().is_ok_and(|id| id > after) && query.matches(job, Utc::now());
            return Ok(job.filter(wanted).into_iter().collect());
        }
        let (younger, older) = query.created_window(Utc::now());
        let rows = q(&self.inner.sql.list_jobs)
            .bind(after)
            .bind(query.kind.clone())
            .bind(query.state.map(JobState::as_str))
            .bind(younger)
            .bind(older)
            .bind(query.page_size() as i64)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| db(e, "list jobs"))?;
        rows.iter().map(job_from).collect()
    }

    async fn get_job(&self, id: &JobId) -> Result<LiveJob> {
        let n = id.0.parse::<i64>().map_err(|_| no_job(id))?;
        self.job_row(Some(n), None).await?.ok_or_else(|| no_job(id))
    }

    async fn cancel_job(&self, id: &JobId, reason: &str, actor: &str) -> Result<CancelOutcome> {
        require_cancel_audit(reason, actor)?;
        let n = id.0.parse::<i64>().map_err(|_| no_job(id))?;
        // A job claimed (or put back) between the statement and the look after it reads neither
        // queued nor running without a cancel, and is cancelled on a second try.
        for _ in 0..3 {
            let row = q(&self.inner.sql.cancel_job)
                .bind(n)
                .bind(reason)
                .bind(actor)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| db(e, "cancel job"))?;
            if let Some(row) = row {
                let (kind, key): (String, String) = (row.get("kind"), row.get("idempotency_key"));
                if row.get("requested") {
                    info!(job_id = %id, kind, key, actor, "running job asked to stop");
                    return Ok(CancelOutcome::Requested);
                }
                info!(job_id = %id, kind, key, actor, "job cancelled");
                return Ok(CancelOutcome::Cancelled);
            }
            // Neither queued nor running without a cancel: say what it is instead.
            let job = self.get_job(id).await?;
            check_cancel(id, job.state)?;
            if let Some(cancelled) = job.cancelled {
                return Ok(CancelOutcome::AlreadyCancelled(cancelled));
            }
        }
        Err(Error::temporary(format!("job {id} kept changing while it was being cancelled; try again")))
    }
}
