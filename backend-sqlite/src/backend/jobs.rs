//! The live jobs on SQLite: read from the readers, cancelled in a short write.

use chrono::Utc;
use redrive_core::kit::{check_cancel, require_cancel_audit};
use redrive_core::{
    CancelOutcome, Cancellation, Error, ErrorKind, JobId, JobQuery, JobState, Jobs, LiveJob, Result, Running,
};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use tracing::info;

use super::{SqliteBackend, history, key_or_stand_in, now_ms, payload_as_stored, time};
use crate::error::db;
use crate::sql::{self, q};

fn no_job(id: &JobId) -> Error {
    Error::new(ErrorKind::NotFound, format!("no job {id}"))
}

/// A job as stored; what does not read back is shown as it is, as a failure record's is.
fn job_from(row: &SqliteRow) -> Result<LiveJob> {
    let id: i64 = row.get("id");
    let state: JobState = row.get::<String, _>("state").parse()?;
    let running = row
        .get::<Option<i64>, _>("lease_expires")
        .filter(|_| state == JobState::Running)
        // The claim's time is not kept on SQLite.
        .map(|expires| Running { since: None, lease_until: time(expires) });
    // Cancelled, or (running) a cancel asked of it.
    let asked = row.get::<Option<i64>, _>("cancel_requested_at").filter(|_| state == JobState::Running);
    let cancelled = row.get::<Option<i64>, _>("cancelled_at").or(asked).map(|at| Cancellation {
        at: time(at),
        reason: row.get::<Option<String>, _>("cancel_reason").unwrap_or_default(),
        actor: row.get::<Option<String>, _>("cancelled_by").unwrap_or_default(),
    });
    Ok(LiveJob {
        id: JobId(id.to_string()),
        kind: row.get("kind"),
        key: key_or_stand_in(row.get("idempotency_key"), id),
        state,
        payload: payload_as_stored(row.get("payload")),
        attempts: row.get::<i64, _>("attempts").max(0) as u32,
        cap: row.get::<i64, _>("cap").max(0) as u32,
        created_at: time(row.get("created_at")),
        updated_at: row.get::<Option<i64>, _>("done_at").map(time),
        run_at: row.get::<Option<i64>, _>("ready_at").map(time),
        running,
        errors: history(&row.get::<String, _>("errors")),
        cancelled,
    })
}

impl SqliteBackend {
    async fn job_row(&self, id: Option<i64>, key: Option<&str>) -> Result<Option<LiveJob>> {
        let row = q(sql::get_job)
            .bind(id)
            .bind(key.map(str::to_owned))
            .bind(now_ms())
            .fetch_optional(&self.inner.reader)
            .await
            .map_err(|e| db(e, "get job"))?;
        row.as_ref().map(job_from).transpose()
    }
}

impl Jobs for SqliteBackend {
    async fn list_jobs(&self, query: &JobQuery) -> Result<Vec<LiveJob>> {
        let after = match &query.after {
            Some(id) => id.0.parse::<i64>().map_err(|_| no_job(id))?,
            None => 0,
        };
        if let Some(key) = &query.key {
            // One job per key: found by its unique index, then filtered as a page would be.
            let job = self.job_row(None, Some(key.as_str())).await?;
            let wanted =
                |job: &LiveJob| job.id.0.parse::<i64>().is_ok_and(|id| id > after) && query.matches(job, Utc::now());
            return Ok(job.filter(wanted).into_iter().collect());
        }
        let (younger, older) = query.created_window(Utc::now());
        let rows = q(sql::list_jobs)
            .bind(after)
            .bind(query.kind.clone())
            .bind(query.state.map(JobState::as_str))
            .bind(younger.map(|t| t.timestamp_millis()))
            .bind(older.map(|t| t.timestamp_millis()))
            .bind(i64::try_from(query.page_size()).unwrap_or(i64::MAX))
            .bind(now_ms())
            .fetch_all(&self.inner.reader)
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
        let now = now_ms();
        let mut tx = self.write().await?;
        let row = q(sql::cancel_job)
            .bind(n)
            .bind(now)
            .bind(reason.to_owned())
            .bind(actor.to_owned())
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "cancel job"))?;
        let asked = match &row {
            Some(_) => {
                close_replay(&mut tx, n, now, reason, actor).await?;
                None
            }
            // Not queued: running, it is asked to stop.
            None => q(sql::cancel_ask)
                .bind(n)
                .bind(now)
                .bind(reason.to_owned())
                .bind(actor.to_owned())
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| db(e, "cancel job"))?,
        };
        tx.commit().await.map_err(|e| db(e, "cancel job"))?;
        if let Some(row) = asked {
            let (kind, key): (String, String) = (row.get("kind"), row.get("idempotency_key"));
            info!(job_id = %id, kind, key, actor, "running job asked to stop");
            return Ok(CancelOutcome::Requested);
        }
        if let Some(row) = row {
            let (kind, key): (String, String) = (row.get("kind"), row.get("idempotency_key"));
            info!(job_id = %id, kind, key, actor, "job cancelled");
            if row.get::<Option<String>, _>("order_key").is_some() {
                // A later job of its order key may run now.
                self.wake();
            }
            return Ok(CancelOutcome::Cancelled);
        }
        // Neither queued nor running without a cancel: say what it is instead.
        let job = self.get_job(id).await?;
        check_cancel(id, job.state)?;
        match job.cancelled {
            Some(cancelled) => Ok(CancelOutcome::AlreadyCancelled(cancelled)),
            None => Err(Error::temporary(format!("job {id} changed while it was being cancelled; try again"))),
        }
    }
}

/// Closes the record that job `id`, cancelled at `at` (ms) for `reason` by `actor`, replays, if
/// any: its job will never settle it.
pub(super) async fn close_replay(
    tx: &mut sqlx::SqliteConnection,
    id: i64,
    at: i64,
    reason: &str,
    actor: &str,
) -> Result<()> {
    q(sql::cancel_replay)
        .bind(id)
        .bind(at)
        .bind(reason.to_owned())
        .bind(actor.to_owned())
        .execute(&mut *tx)
        .await
        .map_err(|e| db(e, "close the record of a cancelled job"))?;
    Ok(())
}
