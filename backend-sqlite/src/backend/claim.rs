//! Claims and their settlements on SQLite: a batch taken in one write transaction under a lease
//! token that fences every later write, completions grouped by the completer, and rows that do
//! not read back claimed all the same, for the worker to make records of.

use std::time::Duration;

use chrono::Utc;
use redrive_core::kit::{AttemptError, Begin, Claim, Claimed, Hold, Kinds, Lease, Renew};
use redrive_core::{
    Error, ErrorKind, FailureId, FailureRecord, JobId, JobRecord, ProviderKey, RecordState, Result, Severity,
};
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use super::{
    SqliteBackend, WriteTiming, completer, history, json_from, key_from, key_or_stand_in, lease_lost, ms, now_ms,
    parse_id, payload_as_stored, provider_key_from, time,
};
use crate::error::{db, stored};
use crate::sql::{self, q};

impl SqliteBackend {
    async fn claim_once(&self, kinds: &Kinds, max: usize, lease: Duration) -> Result<Vec<Claimed>> {
        let kinds = match kinds {
            Kinds::Any => None,
            Kinds::Only(list) => Some(serde_json::to_string(list).unwrap_or_default()),
        };
        let token = Uuid::new_v4().to_string();
        let now = now_ms();
        let mut timing = WriteTiming::start();
        let mut tx = self.write().await?;
        timing.begun();
        let swept = q(sql::sweep).bind(now).fetch_all(&mut *tx).await.map_err(|e| db(e, "sweep lapsed leases"))?;
        for row in &swept {
            self.ended_cancelled(&mut tx, row).await?;
        }
        let rows = q(sql::claim)
            .bind(now)
            .bind(ms(lease))
            .bind(&token)
            .bind(kinds)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| db(e, "claim"))?;
        timing.committing();
        tx.commit().await.map_err(|e| db(e, "commit claim"))?;
        timing.done("claim", rows.len());
        let mut claimed: Vec<Claimed> = rows.iter().map(|row| claimed_from(row, &token)).collect();
        // Claim order: the highest priority first, then by id (an undecodable row's priority
        // reads as 0).
        claimed.sort_by_key(|c| (std::cmp::Reverse(c.job.priority), c.job.id.0.parse::<i64>().unwrap_or_default()));
        Ok(claimed)
    }

    async fn give_back(&self, lease: &Lease, delay: Duration) -> Result<()> {
        let id = parse_id(&lease.job_id.0)?;
        let now = now_ms();
        let query = q(sql::give_back).bind(id).bind(&lease.token).bind(now + ms(delay)).bind(now);
        self.settle_cancellable(query, lease, "give back").await
    }

    /// Runs a fenced settlement that puts the job back, or ends it cancelled if a person
    /// cancelled it while it ran; in one transaction with the close of the record it replays.
    async fn settle_cancellable(
        &self,
        query: sqlx::query::Query<'static, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
        lease: &Lease,
        what: &str,
    ) -> Result<()> {
        let mut tx = self.write().await?;
        let row = query.fetch_optional(&mut *tx).await.map_err(|e| db(e, what))?;
        let row = row.ok_or_else(|| lease_lost(lease))?;
        self.ended_cancelled(&mut tx, &row).await?;
        tx.commit().await.map_err(|e| db(e, what))?;
        self.wake();
        Ok(())
    }

    /// After a settlement's row: if it ended the job cancelled, closes the record it replays.
    async fn ended_cancelled(&self, tx: &mut sqlx::SqliteConnection, row: &SqliteRow) -> Result<()> {
        let Some(at) = row.get::<Option<i64>, _>("cancelled_at") else { return Ok(()) };
        let reason = row.get::<Option<String>, _>("cancel_reason").unwrap_or_default();
        let actor = row.get::<Option<String>, _>("cancelled_by").unwrap_or_default();
        tracing::info!(job_id = row.get::<i64, _>("id"), "a job cancelled while it ran ended cancelled");
        super::jobs::close_replay(tx, row.get("id"), at, &reason, &actor).await
    }
}

/// A claimed row. The row is its key's ledger entry, and the claim took the key: the hold is the
/// lease, resumed when an earlier claim may have started the effect. A row that does not read
/// back (written by hand, or by something else) is claimed all the same, marked undecodable with
/// stand-ins for what did not read: the worker makes it a failure record, and the rest of the
/// batch runs. Failing the whole claim instead would strand the batch's other jobs behind it, at
/// every claim, for ever.
fn claimed_from(row: &SqliteRow, token: &str) -> Claimed {
    // The rowid: always an integer.
    let id = JobId(row.get::<i64, _>("id").to_string());
    let lease = Lease { job_id: id.clone(), token: token.to_owned() };
    match read_claimed(row, &id, &lease) {
        Ok(claimed) => claimed,
        Err(e) => {
            tracing::warn!(job = %id, error = %e, "a claimed job does not read back: it becomes a failure record");
            Claimed { job: unreadable_job(row, id, e.message().to_owned()), lease, begun: None }
        }
    }
}

fn read_claimed(row: &SqliteRow, id: &JobId, lease: &Lease) -> Result<Claimed> {
    let token = &lease.token;
    let key = key_from(column(row, "idempotency_key", "key")?)?;
    let provider_key = provider_key_from(&column::<String>(row, "provider_key", "provider key")?)?;
    let hold = Hold { key: key.clone(), token: token.clone(), provider_key, lease: Some(lease.clone()) };
    let claims: i64 = column(row, "claims", "claim count")?;
    let begun = if claims > 1 { Begin::Resumed(hold) } else { Begin::Fresh(hold) };
    Ok(Claimed {
        job: JobRecord {
            id: id.clone(),
            kind: column(row, "kind", "kind")?,
            key,
            provider_key,
            payload: json_from(&column::<String>(row, "payload", "payload")?, "payload")?,
            attempt: column::<i64>(row, "attempts", "attempt count")?.max(0) as u32,
            cap: column::<i64>(row, "cap", "cap")?.max(0) as u32,
            severity: Severity::from_name(&column::<String>(row, "severity", "severity")?).unwrap_or_default(),
            priority: column(row, "priority", "priority")?,
            enqueued_at: time(column(row, "created_at", "enqueue time")?),
            deadline: column::<Option<i64>>(row, "deadline", "deadline")?.map(time),
            // Held back until then by `ready_at`.
            not_before: None,
            stranded: column::<i64>(row, "stranded", "stranded count")?.max(0) as u32,
            undecodable: None,
            // Its completion confirms its replayed record in the same transaction.
            replay_of: None,
            // A context that does not read costs the job its trace, not its run.
            traceparent: column(row, "traceparent", "traceparent").unwrap_or_default(),
        },
        lease: lease.clone(),
        begun: Some(begun),
    })
}

/// A column's value, or a `Decode` error naming it (never its value).
fn column<'r, T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>>(
    row: &'r SqliteRow,
    name: &str,
    what: &str,
) -> Result<T> {
    row.try_get(name).map_err(|_| stored(what))
}

/// A job that does not read back, with stand-ins for what did not: only its record is made of it.
fn unreadable_job(row: &SqliteRow, id: JobId, why: String) -> JobRecord {
    let key = key_or_stand_in(column(row, "idempotency_key", "key").unwrap_or_default(), id.0.parse().unwrap_or(0));
    JobRecord {
        id,
        kind: column(row, "kind", "kind").unwrap_or_default(),
        key,
        provider_key: column::<String>(row, "provider_key", "provider key")
            .and_then(|s| provider_key_from(&s))
            .unwrap_or_else(|_| ProviderKey::from_uuid(Uuid::nil())),
        payload: Value::Null,
        attempt: column::<i64>(row, "attempts", "attempt count").map_or(1, |n| n.max(1) as u32),
        cap: column::<i64>(row, "cap", "cap").map_or(1, |n| n.max(1) as u32),
        severity: Severity::default(),
        priority: column(row, "priority", "priority").unwrap_or_default(),
        enqueued_at: Utc::now(),
        deadline: None,
        not_before: None,
        stranded: 0,
        undecodable: Some(why),
        replay_of: None,
        traceparent: column(row, "traceparent", "traceparent").unwrap_or_default(),
    }
}

impl Claim for SqliteBackend {
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before looking, so an enqueue in between is not missed.
            let notified = self.inner.work.notified();
            let claimed = self.claim_once(kinds, max, lease).await?;
            let now = tokio::time::Instant::now();
            if !claimed.is_empty() || now >= deadline {
                return Ok(claimed);
            }
            let until = deadline.min(now + self.inner.config.poll);
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn complete(&self, lease: &Lease, _result: Option<&Value>) -> Result<()> {
        let id = parse_id(&lease.job_id.0)?;
        let (done, answer) = tokio::sync::oneshot::channel();
        let completion = completer::Completion { id, token: lease.token.clone(), done };
        let gone = || Error::temporary("sqlite: the backend is closing");
        self.inner.completions.send(completion).await.map_err(|_| gone())?;
        match answer.await.map_err(|_| gone())?? {
            completer::Done::LeaseLost => Err(lease_lost(lease)),
            completer::Done::Done { ordered } => {
                if ordered {
                    // The next job of its order key may be claimed now: this process's waiting
                    // claims look at once (another process's find it by polling).
                    self.wake();
                }
                Ok(())
            }
        }
    }

    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let id = parse_id(&lease.job_id.0)?;
        let query = q(sql::retry)
            .bind(id)
            .bind(&lease.token)
            .bind(now_ms() + ms(delay))
            .bind(time(now_ms()).to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .bind(error.to_owned())
            .bind(now_ms());
        self.settle_cancellable(query, lease, "retry").await
    }

    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.give_back(lease, delay).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.give_back(lease, Duration::ZERO).await
    }

    async fn dead_letter(&self, claimed: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        let lease = &claimed.lease;
        let id = parse_id(&lease.job_id.0)?;
        // To the millisecond, as stored: the record read back equals the one returned.
        let now = time(now_ms());
        let mut tx = self.write().await?;
        let row = q(sql::fail)
            .bind(id)
            .bind(&lease.token)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "dead-letter"))?
            .ok_or_else(|| lease_lost(lease))?;
        // Read leniently: the job may be one that did not read back (see `claimed_from`), and
        // its record must be written all the same.
        let attempts = column::<i64>(&row, "attempts", "attempt count").unwrap_or(1).max(0) as u32;
        let mut errors = history(&column::<String>(&row, "errors", "error history").unwrap_or_default());
        errors.push(AttemptError { attempt: attempts, at: now, error: error.to_owned() });
        let first_failed_at = errors.first().map_or(now, |e| e.at);
        let history = serde_json::to_string(&errors).map_err(|_| stored("error history"))?;
        let text = |name: &str| column::<String>(&row, name, name).unwrap_or_default();
        let cap = column::<i64>(&row, "cap", "cap").unwrap_or(i64::from(attempts));
        let replay_of = row.try_get::<Option<i64>, _>("replay_of").ok().flatten();
        let inserted = q(sql::record)
            .bind(id)
            .bind(text("kind"))
            .bind(text("idempotency_key"))
            .bind(text("provider_key"))
            .bind(text("payload"))
            .bind(error.to_owned())
            .bind(history)
            .bind(i64::from(attempts))
            .bind(cap)
            .bind(text("severity"))
            .bind(first_failed_at.timestamp_millis())
            .bind(now.timestamp_millis())
            // Named below, once the replayed record is linked to this one.
            .bind(None::<i64>)
            .bind(claimed.job.trace_id())
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| db(e, "write the failure record"))?;
        let record_id: i64 = inserted.get("id");
        let mut linked = None;
        if let Some(replayed) = replay_of {
            // The replayed record names the new one, as the new one names it: only if it is
            // still this job's replaying record.
            let named = q(sql::failed_again)
                .bind(replayed)
                .bind(now.timestamp_millis())
                .bind(record_id)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(|e| db(e, "link the replayed record"))?
                .rows_affected();
            if named == 1 {
                q(sql::record_replay_of)
                    .bind(record_id)
                    .bind(replayed)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db(e, "link the replayed record"))?;
                linked = Some(FailureId(replayed.to_string()));
            }
        }
        tx.commit().await.map_err(|e| db(e, "commit dead-letter"))?;
        Ok(Some(FailureRecord {
            id: FailureId(record_id.to_string()),
            job_id: lease.job_id.clone(),
            kind: text("kind"),
            key: key_or_stand_in(text("idempotency_key"), id),
            provider_key: provider_key_from(&text("provider_key"))
                .unwrap_or_else(|_| ProviderKey::from_uuid(Uuid::nil())),
            payload: payload_as_stored(text("payload")),
            last_error: error.to_owned(),
            errors,
            attempts,
            cap: cap.max(0) as u32,
            severity: Severity::from_name(&text("severity")).unwrap_or_default(),
            first_failed_at,
            last_failed_at: now,
            state: RecordState::Open,
            replay_of: linked,
            amended: None,
            trace_id: claimed.job.trace_id().map(str::to_owned),
        }))
    }

    /// Never asked: its jobs carry no `replay_of`, their completion confirms the record in the
    /// same transaction.
    async fn confirm_replay(&self, _record: &redrive_core::FailureId) -> Result<()> {
        Ok(())
    }

    async fn withdraw_replay(
        &self,
        _record: &redrive_core::FailureId,
        _cancel: &redrive_core::Cancellation,
    ) -> Result<()> {
        Ok(())
    }

    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl Renew for SqliteBackend {
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.extend(lease, by, true).await
    }

    async fn renew_settling(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.extend(lease, by, false).await
    }
}

impl SqliteBackend {
    /// A renewal; refused for a job a person cancelled if `heed_cancel`.
    async fn extend(&self, lease: &Lease, by: Duration, heed_cancel: bool) -> Result<Lease> {
        let id = parse_id(&lease.job_id.0)?;
        let extend = q(sql::extend).bind(id).bind(&lease.token).bind(now_ms() + ms(by)).bind(heed_cancel);
        match self.fenced(extend, lease, "extend lease").await {
            Ok(()) => Ok(lease.clone()),
            // Not renewed: lost, or held by a job a person cancelled (its worker stops it).
            Err(e) if e.kind() == ErrorKind::LeaseLost => {
                match self.fenced(q(sql::cancel_asked).bind(id).bind(&lease.token), lease, "extend lease").await {
                    Ok(()) => Err(Error::new(
                        ErrorKind::Cancelled,
                        format!("job {} was cancelled while it ran", lease.job_id),
                    )),
                    Err(_) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }
}
