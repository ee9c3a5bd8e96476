//! Failure records on SQLite: read from the readers, closed and purged in short write
//! transactions, and a replay that resets the job and closes its record in one.

use std::time::Duration;

use redrive_core::kit::{AttemptError, require_audit};
use redrive_core::{
    Blocked, DeadLetter, Error, ErrorKind, FailureId, FailureQuery, FailureRecord, JobId, NewJob, ProviderKey,
    RecordState, Replay, ReplayOutcome, Result, Severity,
};
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use super::{
    CHUNK, SqliteBackend, history, key_or_stand_in, let_others_write, ms, now_ms, parse_id, payload_as_stored,
    provider_key_from, time,
};
use crate::error::db;
use crate::sql::{self, q};

/// A record as stored. Its job may not have read back (see [`claimed_from`]): what does not read
/// is shown as it is (a payload that is not JSON as a string, for a person to read and fix), so
/// that one bad record never fails a listing.
fn record_from(row: &SqliteRow) -> Result<FailureRecord> {
    let errors: Vec<AttemptError> = history(&row.get::<String, _>("errors"));
    let at = || time(row.get::<Option<i64>, _>("closed_at").unwrap_or_default());
    let state = match row.get::<String, _>("state").as_str() {
        "open" => RecordState::Open,
        "discarded" => RecordState::Discarded {
            at: at(),
            reason: row.get::<Option<String>, _>("discard_reason").unwrap_or_default(),
            actor: row.get::<Option<String>, _>("discard_actor").unwrap_or_default(),
        },
        replayed => {
            let replaying = RecordState::Replaying {
                at: at(),
                reason: row.get::<Option<String>, _>("replay_reason").unwrap_or_default(),
                actor: row.get::<Option<String>, _>("replay_actor").unwrap_or_default(),
                amended: row.get::<Option<String>, _>("amended").is_some(),
            };
            let settled = match replayed {
                "confirmed" => replaying.confirmed(time(row.get::<Option<i64>, _>("confirmed_at").unwrap_or_default())),
                "failed_again" => replaying.failed_again(
                    time(row.get::<Option<i64>, _>("failed_again_at").unwrap_or_default()),
                    FailureId(row.get::<Option<i64>, _>("next_record").unwrap_or_default().to_string()),
                ),
                _ => None,
            };
            settled.unwrap_or(replaying)
        }
    };
    Ok(FailureRecord {
        id: FailureId(row.get::<i64, _>("id").to_string()),
        job_id: JobId(row.get::<i64, _>("job_id").to_string()),
        kind: row.get("kind"),
        key: key_or_stand_in(row.get("idempotency_key"), row.get("job_id")),
        provider_key: provider_key_from(&row.get::<String, _>("provider_key"))
            .unwrap_or_else(|_| ProviderKey::from_uuid(Uuid::nil())),
        payload: payload_as_stored(row.get("payload")),
        last_error: row.get("last_error"),
        errors,
        attempts: row.get::<i64, _>("attempts").max(0) as u32,
        cap: row.get::<i64, _>("cap").max(0) as u32,
        severity: Severity::from_name(&row.get::<String, _>("severity")).unwrap_or_default(),
        first_failed_at: time(row.get("first_failed_at")),
        last_failed_at: time(row.get("last_failed_at")),
        state,
        replay_of: row.get::<Option<i64>, _>("replay_of").map(|id| FailureId(id.to_string())),
        amended: row.get::<Option<String>, _>("amended").map(payload_as_stored),
        trace_id: row.get("trace_id"),
    })
}

impl DeadLetter for SqliteBackend {
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        let after = query.after.as_ref().map(|id| parse_id(&id.0)).transpose()?.unwrap_or(0);
        let job_id = query.job_id.as_ref().map(|id| parse_id(&id.0)).transpose()?;
        let rows = q(sql::list_failures)
            .bind(after)
            .bind(query.kind.clone())
            .bind(query.key.as_ref().map(|k| k.as_str().to_owned()))
            .bind(job_id)
            .bind(query.open)
            .bind(query.failed_before.map(|t| t.timestamp_millis()))
            .bind(i64::try_from(query.page_size()).unwrap_or(i64::MAX))
            .bind(query.error_pattern())
            .fetch_all(&self.inner.reader)
            .await
            .map_err(|e| db(e, "list failure records"))?;
        rows.iter().map(record_from).collect()
    }

    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        let n = parse_id(&id.0)?;
        let row = q(sql::get_failure)
            .bind(n)
            .fetch_optional(&self.inner.reader)
            .await
            .map_err(|e| db(e, "read a failure record"))?
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))?;
        record_from(&row)
    }

    async fn count_open(&self) -> Result<u64> {
        let row = q(sql::count_open).fetch_one(&self.inner.reader).await.map_err(|e| db(e, "count records"))?;
        Ok(row.get::<i64, _>(0).max(0) as u64)
    }

    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        require_audit("a discard's reason", reason)?;
        require_audit("a discard's actor", actor)?;
        let n = parse_id(&id.0)?;
        let mut tx = self.write().await?;
        let closed = q(sql::discard)
            .bind(n)
            .bind(now_ms())
            .bind(reason.to_owned())
            .bind(actor.to_owned())
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "discard"))?;
        if closed.is_none() {
            drop(tx);
            self.get(id).await?; // NotFound if there is no such record; closed already is fine
            return Ok(());
        }
        // Dropped work no longer holds the later jobs of its order key back.
        let freed = q(sql::discard_order).bind(n).fetch_optional(&mut *tx).await.map_err(|e| db(e, "discard"))?;
        tx.commit().await.map_err(|e| db(e, "commit discard"))?;
        if freed.is_some() {
            self.wake();
        }
        Ok(())
    }

    async fn purge(&self, age: Duration) -> Result<u64> {
        // In batches, each its own transaction: one transaction over every record would hold the
        // write lock for as long as it takes, and every other writer (this process's completions
        // queue behind it; another process's fail as busy) would wait that long.
        let before = now_ms() - ms(age);
        let mut purged = 0;
        loop {
            let started = std::time::Instant::now();
            let mut tx = self.write().await?;
            let rows =
                q(sql::purge).bind(before).bind(CHUNK).fetch_all(&mut *tx).await.map_err(|e| db(e, "purge records"))?;
            for row in &rows {
                let (record, job): (i64, i64) = (row.get("id"), row.get("job_id"));
                let step = |e| db(e, "purge a record's job and keys");
                q(sql::purge_alerts).bind(record.to_string()).execute(&mut *tx).await.map_err(step)?;
                q(sql::purge_job_key).bind(job).execute(&mut *tx).await.map_err(step)?;
                q(sql::purge_job).bind(job).execute(&mut *tx).await.map_err(step)?;
            }
            tx.commit().await.map_err(|e| db(e, "commit purge"))?;
            purged += rows.len() as u64;
            if (rows.len() as i64) < CHUNK {
                if purged > 0 {
                    // A purged open record's job is gone with it, and no longer holds the later
                    // jobs of its order key back.
                    self.wake();
                }
                return Ok(purged);
            }
            let_others_write(started.elapsed()).await;
        }
    }

    async fn blocked(&self) -> Result<Vec<Blocked>> {
        let rows =
            q(sql::blocked).fetch_all(&self.inner.reader).await.map_err(|e| db(e, "list the blocked order keys"))?;
        // A row with an order key that does not read back (written by hand) is left out rather
        // than fail the listing; its record is listed by `list` all the same.
        let blocked = |row: &SqliteRow| -> std::result::Result<Blocked, sqlx::Error> {
            let job: i64 = row.try_get("job_id")?;
            Ok(Blocked {
                order_key: row.try_get("order_key")?,
                record: FailureId(row.try_get::<i64, _>("record")?.to_string()),
                kind: row.try_get("kind")?,
                key: key_or_stand_in(row.try_get("idempotency_key")?, job),
                waiting: row.try_get::<i64, _>("waiting")?.max(0) as u64,
            })
        };
        Ok(rows.iter().filter_map(|row| blocked(row).ok()).collect())
    }
}

impl Replay for SqliteBackend {
    async fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        require_audit("a replay's actor", actor)?;
        self.replay_with(id, None, reason, actor).await
    }

    /// The job row is its key's ledger entry: a failed job's effect has not happened, and the
    /// key's fingerprint changes with the payload in the replay's transaction.
    async fn replay_amended(
        &self,
        id: &FailureId,
        payload: &Value,
        reason: &str,
        actor: &str,
    ) -> Result<ReplayOutcome> {
        require_audit("an amended replay's reason", reason)?;
        require_audit("an amended replay's actor", actor)?;
        self.replay_with(id, Some(payload), reason, actor).await
    }
}

impl SqliteBackend {
    async fn replay_with(
        &self,
        id: &FailureId,
        amended: Option<&Value>,
        reason: &str,
        actor: &str,
    ) -> Result<ReplayOutcome> {
        let n = parse_id(&id.0)?;
        let mut tx = self.write().await?;
        let row = q(sql::get_failure)
            .bind(n)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "read a failure record"))?
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))?;
        let record = record_from(&row)?;
        if !record.state.is_open() {
            return Ok(ReplayOutcome::AlreadyClosed(record.state));
        }
        let amended = match amended {
            Some(payload) => {
                let job = NewJob::new(record.kind.clone(), record.key.clone(), payload.clone())?;
                job.check_size(self.inner.config.max_payload)?;
                let done: bool = q(sql::key_done)
                    .bind(record.key.as_str())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| db(e, "read the key's ledger"))?
                    .get("done");
                if done {
                    return Err(Error::new(
                        ErrorKind::InvalidInput,
                        format!("record {id}: the effect of key {} has happened; nothing was amended", record.key),
                    ));
                }
                Some((payload.to_string(), job.fingerprint()))
            }
            None => None,
        };
        let now = now_ms();
        // The existing job, reset: a fresh enqueue with the same key would only find a duplicate.
        let job = parse_id(&record.job_id.0)?;
        q(sql::requeue)
            .bind(job)
            .bind(now)
            .bind(n)
            .bind(amended.as_ref().map(|(payload, _)| payload.clone()))
            .bind(amended.as_ref().map(|(_, fingerprint)| fingerprint.clone()))
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "replay"))?
            .ok_or_else(|| match amended {
                Some(_) => Error::new(
                    ErrorKind::InvalidInput,
                    format!("record {id}: its job is not failed (its effect may have happened); nothing was amended"),
                ),
                None => Error::new(ErrorKind::NotFound, "the record's job is gone"),
            })?;
        q(sql::close_replayed)
            .bind(n)
            .bind(now)
            .bind(reason.to_owned())
            .bind(actor.to_owned())
            .bind(amended.map(|(payload, _)| payload))
            .execute(&mut *tx)
            .await
            .map_err(|e| db(e, "replay"))?;
        tx.commit().await.map_err(|e| db(e, "commit replay"))?;
        self.wake();
        Ok(ReplayOutcome::Replayed(record.job_id))
    }
}

impl redrive_core::Forget for SqliteBackend {
    async fn forget_key(&self, key: &redrive_core::IdempotencyKey) -> Result<redrive_core::Forgotten> {
        let key_text = key.as_str();
        let step = |e| db(e, "forget a key");
        let mut tx = self.write().await?;
        if q(sql::forget_running).bind(key_text).fetch_optional(&mut *tx).await.map_err(step)?.is_some() {
            return Err(Error::temporary(format!("a job of key {key} is running; forget it once it settles")));
        }
        let mut records: Vec<String> = Vec::new();
        for statement in [sql::forget_records, sql::forget_broker_records] {
            let rows = q(statement).bind(key_text).fetch_all(&mut *tx).await.map_err(step)?;
            records.extend(rows.iter().map(|row| row.get::<String, _>("id")));
        }
        let mut ledger = 0;
        for record in &records {
            ledger += q(sql::purge_alerts).bind(record).execute(&mut *tx).await.map_err(step)?.rows_affected();
        }
        for statement in [sql::forget_ledger_key, sql::forget_effect] {
            ledger += q(statement).bind(key_text).execute(&mut *tx).await.map_err(step)?.rows_affected();
        }
        let jobs = q(sql::forget_job).bind(key_text).execute(&mut *tx).await.map_err(step)?.rows_affected();
        tx.commit().await.map_err(|e| db(e, "commit forgetting a key"))?;
        // A forgotten failed job may have held its order key's next job back.
        self.wake();
        tracing::info!(key = %key, jobs, records = records.len(), "key forgotten");
        Ok(redrive_core::Forgotten { jobs, records: records.len() as u64, ledger })
    }
}
