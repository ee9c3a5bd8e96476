//! Failure records: reading, discarding, purging and replaying them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::kit::{AttemptError, payload_fingerprint, require_audit};
use redrive_core::{
    Blocked, DeadLetter, Error, ErrorKind, FailureId, FailureQuery, FailureRecord, JobId, NewJob, ProviderKey,
    RecordState, Replay, ReplayOutcome, Result,
};
use serde_json::Value;
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{PgBackend, key_from};
use crate::error::db;
use crate::sql::q;

fn parse_record_id(id: &FailureId) -> Result<i64> {
    id.0.parse().map_err(|_| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))
}

pub(super) fn record_from(row: &PgRow) -> Result<FailureRecord> {
    let at = || row.get::<Option<DateTime<Utc>>, _>("closed_at").unwrap_or_default();
    let state = match row.get::<&str, _>("state") {
        "open" => RecordState::Open,
        "discarded" => RecordState::Discarded {
            at: at(),
            reason: row.get::<Option<String>, _>("discard_reason").unwrap_or_default(),
            actor: row.get::<Option<String>, _>("discarded_by").unwrap_or_default(),
        },
        replayed => {
            let replaying = RecordState::Replaying {
                at: at(),
                reason: row.get::<Option<String>, _>("replay_reason").unwrap_or_default(),
                actor: row.get::<Option<String>, _>("replayed_by").unwrap_or_default(),
                amended: row.get::<Option<Value>, _>("amended").is_some(),
            };
            let settled = match replayed {
                "confirmed" => {
                    replaying.confirmed(row.get::<Option<DateTime<Utc>>, _>("confirmed_at").unwrap_or_default())
                }
                "failed_again" => replaying.failed_again(
                    row.get::<Option<DateTime<Utc>>, _>("failed_again_at").unwrap_or_default(),
                    FailureId(row.get::<Option<i64>, _>("next_record").unwrap_or_default().to_string()),
                ),
                _ => None,
            };
            settled.unwrap_or(replaying)
        }
    };
    let errors: Vec<AttemptError> = serde_json::from_value(row.get("errors"))
        .map_err(|e| Error::new(ErrorKind::Decode, "stored error history does not decode").with_source(e))?;
    Ok(FailureRecord {
        id: FailureId(row.get::<i64, _>("id").to_string()),
        job_id: JobId(row.get::<i64, _>("job_id").to_string()),
        kind: row.get("kind"),
        key: key_from(row.get("idempotency_key"))?,
        provider_key: ProviderKey::from_uuid(row.get("provider_key")),
        payload: row.get("payload"),
        last_error: row.get("last_error"),
        errors,
        attempts: row.get::<i32, _>("attempts") as u32,
        cap: row.get::<i32, _>("cap") as u32,
        severity: redrive_core::Severity::from_name(row.get("severity")).unwrap_or_default(),
        first_failed_at: row.get("first_failed_at"),
        last_failed_at: row.get("last_failed_at"),
        state,
        replay_of: row.get::<Option<i64>, _>("replay_of").map(|id| FailureId(id.to_string())),
        amended: row.get("amended"),
        trace_id: row.get("trace_id"),
    })
}

impl DeadLetter for PgBackend {
    async fn list(&self, query: &FailureQuery) -> Result<Vec<FailureRecord>> {
        let after = query.after.as_ref().map(parse_record_id).transpose()?.unwrap_or(0);
        let job_id = match &query.job_id {
            Some(id) => match id.0.parse::<i64>() {
                Ok(id) => Some(id),
                // Not one of this backend's job ids: no record can have it.
                Err(_) => return Ok(Vec::new()),
            },
            None => None,
        };
        let rows = q(&self.inner.sql.list_failures)
            .bind(query.kind.clone())
            .bind(query.open)
            .bind(query.failed_before)
            .bind(after)
            .bind(query.page_size() as i64)
            .bind(query.key.as_ref().map(|k| k.as_str().to_owned()))
            .bind(job_id)
            .bind(query.error_pattern())
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| db(e, "list failure records"))?;
        rows.iter().map(record_from).collect()
    }

    async fn get(&self, id: &FailureId) -> Result<FailureRecord> {
        let row = q(&self.inner.sql.get_failure)
            .bind(parse_record_id(id)?)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "get failure record"))?;
        record_from(&row.ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no failure record {id}")))?)
    }

    async fn count_open(&self) -> Result<u64> {
        let n: i64 = q(&self.inner.sql.count_open)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| db(e, "count failure records"))?
            .get(0);
        Ok(n as u64)
    }

    async fn discard(&self, id: &FailureId, reason: &str, actor: &str) -> Result<()> {
        require_audit("a discard's reason", reason)?;
        require_audit("a discard's actor", actor)?;
        let closed = q(&self.inner.sql.discard)
            .bind(parse_record_id(id)?)
            .bind(reason)
            .bind(actor)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "discard"))?;
        if closed.is_none() {
            self.get(id).await?; // NotFound, or already closed: nothing to do
        }
        Ok(())
    }

    async fn purge(&self, age: Duration) -> Result<u64> {
        let purged: i64 = q(&self.inner.sql.purge)
            .bind(age.as_secs_f64())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| db(e, "purge"))?
            .get("purged");
        Ok(purged.max(0) as u64)
    }

    async fn blocked(&self) -> Result<Vec<Blocked>> {
        let rows = q(&self.inner.sql.blocked)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| db(e, "list blocked order keys"))?;
        rows.iter()
            .map(|row| {
                Ok(Blocked {
                    order_key: row.get("order_key"),
                    record: FailureId(row.get::<i64, _>("id").to_string()),
                    kind: row.get("kind"),
                    key: key_from(row.get("idempotency_key"))?,
                    waiting: row.get::<i64, _>("waiting").max(0) as u64,
                })
            })
            .collect()
    }
}

impl Replay for PgBackend {
    async fn replay(&self, id: &FailureId, reason: &str, actor: &str) -> Result<ReplayOutcome> {
        require_audit("a replay's actor", actor)?;
        self.replay_with(id, None, reason, actor).await
    }

    /// The job row is its key's ledger entry: a failed job's effect has not happened, and the
    /// key's fingerprint changes with the payload in the replay's statement.
    async fn replay_amended(
        &self,
        id: &FailureId,
        payload: &Value,
        reason: &str,
        actor: &str,
    ) -> Result<ReplayOutcome> {
        require_audit("an amended replay's reason", reason)?;
        require_audit("an amended replay's actor", actor)?;
        let record = self.get(id).await?;
        super::check_payload(
            &NewJob::new(record.kind, record.key, payload.clone())?,
            &redrive_core::kit::Backend::capabilities(self),
        )?;
        self.replay_with(id, Some(payload), reason, actor).await
    }
}

impl PgBackend {
    async fn replay_with(
        &self,
        id: &FailureId,
        amended: Option<&Value>,
        reason: &str,
        actor: &str,
    ) -> Result<ReplayOutcome> {
        let row = q(&self.inner.sql.replay)
            .bind(parse_record_id(id)?)
            .bind(reason)
            .bind(actor)
            .bind(amended)
            .bind(amended.map(payload_fingerprint))
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "replay"))?;
        match row {
            Some(row) => {
                self.wake();
                Ok(ReplayOutcome::Replayed(JobId(row.get::<i64, _>("id").to_string())))
            }
            None => {
                let record = self.get(id).await?;
                match (record.state.is_open(), amended) {
                    (true, Some(_)) => Err(Error::new(
                        ErrorKind::InvalidInput,
                        format!(
                            "record {id}: the effect of key {} may have happened (its job is not failed, or the key is \
                             done in the ledger); nothing was amended",
                            record.key
                        ),
                    )),
                    (true, None) => Err(Error::new(ErrorKind::NotFound, format!("the job of record {id} is gone"))),
                    (false, _) => Ok(ReplayOutcome::AlreadyClosed(record.state)),
                }
            }
        }
    }
}

impl redrive_core::Forget for PgBackend {
    async fn forget_key(&self, key: &redrive_core::IdempotencyKey) -> Result<redrive_core::Forgotten> {
        let row = q(&self.inner.sql.forget_key)
            .bind(key.as_str())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| db(e, "forget a key"))?;
        if row.get::<bool, _>("running") {
            return Err(redrive_core::Error::temporary(format!(
                "a job of key {key} is running; forget it once it settles"
            )));
        }
        let count = |column: &str| row.get::<i64, _>(column).max(0) as u64;
        let forgotten =
            redrive_core::Forgotten { jobs: count("jobs"), records: count("records"), ledger: count("ledger") };
        tracing::info!(key = %key, jobs = forgotten.jobs, records = forgotten.records, "key forgotten");
        Ok(forgotten)
    }
}
