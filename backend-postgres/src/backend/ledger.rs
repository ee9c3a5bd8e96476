//! The effect ledger for keys that are not this backend's jobs (another queue's, alerts'): the
//! `processed_keys` table. A hold that is one of this backend's job leases is kept by the lease.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::kit::{Begin, Claim, Hold, Ledger, Renew, payload_fingerprint, require_cancel_audit};
use redrive_core::{CancelOutcome, Cancellation, Error, ErrorKind, Flow, IdempotencyKey, ProviderKey, Result};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use tracing::info;
use uuid::Uuid;

use super::PgBackend;
use crate::error::db;
use crate::ledger_batch::{BeginCall, begin_keys};
use crate::sql::q;

impl PgBackend {
    /// [`Ledger::begin`] of many keys in the caller's transaction, for a queue in this database
    /// that is its own jobs' ledger (pgmq's claim takes the keys of what it reads in the read's
    /// transaction). Each of `keys` (distinct) with its payload's fingerprint, the holder's token
    /// and the provider key, held for `hold`. Answers, for each key taken, whether it was fresh
    /// (else a lapsed hold taken over) and the stored provider key (`None` on rows from before
    /// provider keys were kept: the job's is used); a key not taken (held, done, cancelled,
    /// another payload) is absent: [`Ledger::begin`] says which.
    pub async fn begin_keys_in(
        &self,
        conn: &mut PgConnection,
        keys: &[(&IdempotencyKey, String, Uuid, ProviderKey)],
        hold: Duration,
    ) -> Result<HashMap<String, (bool, Option<ProviderKey>)>> {
        let calls: Vec<BeginCall> = keys
            .iter()
            .map(|(key, fingerprint, token, provider_key)| BeginCall {
                key: key.as_str().to_owned(),
                fingerprint: fingerprint.clone(),
                token: *token,
                secs: hold.as_secs_f64(),
                provider_key: provider_key.as_uuid(),
            })
            .collect();
        let calls: Vec<&BeginCall> = calls.iter().collect();
        let taken = begin_keys(conn, &self.inner.sql, &calls).await?;
        Ok(taken.into_iter().map(|(key, (fresh, stored))| (key, (fresh, stored.map(ProviderKey::from_uuid)))).collect())
    }
}

impl Ledger for PgBackend {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> Result<Begin> {
        let fingerprint = &payload_fingerprint(payload);
        let token = Uuid::new_v4();
        let call = BeginCall {
            key: key.as_str().to_owned(),
            fingerprint: fingerprint.clone(),
            token,
            secs: hold.as_secs_f64(),
            provider_key: provider_key.as_uuid(),
        };
        let taken = self.inner.ledger.begin(call).await?;
        if let Some((fresh, stored)) = taken {
            // Rows from before provider keys were kept in the ledger have none: this one's is used.
            let stored = stored.map_or(provider_key, ProviderKey::from_uuid);
            let hold = Hold { key: key.clone(), token: token.to_string(), provider_key: stored, lease: None };
            return Ok(if fresh { Begin::Fresh(hold) } else { Begin::Resumed(hold) });
        }
        let row = self
            .ledger_state(key)
            .await?
            .ok_or_else(|| Error::temporary(format!("key {key} changed while it was read")))?;
        if let Some(cancel) = cancellation(&row) {
            return Ok(Begin::Cancelled(cancel));
        }
        if row.get::<String, _>("fingerprint") != *fingerprint {
            return Err(Error::new(ErrorKind::KeyConflict, format!("key {key} was used with a different payload")));
        }
        Ok(match row.get::<&str, _>("state") {
            "done" => Begin::Done(row.get::<Option<Value>, _>("result").unwrap_or(Value::Null)),
            _ => Begin::Busy(Duration::from_secs_f64(row.get::<f64, _>("held_for_secs"))),
        })
    }

    async fn extend_hold(&self, hold: &Hold, by: Duration) -> Result<()> {
        if let Some(lease) = &hold.lease {
            // The hold is a job's lease: keeping it is renewing the lease.
            return self.renew(lease, by).await.map(|_| ());
        }
        let row = q(&self.inner.sql.ledger_extend)
            .bind(hold.key.as_str())
            .bind(Uuid::parse_str(&hold.token).unwrap_or_default())
            .bind(by.as_secs_f64())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "ledger extend"))?;
        if row.is_some() {
            return Ok(());
        }
        // Not extended: taken over, or cancelled by a person (its worker stops the handler).
        if self.ledger_state(&hold.key).await?.as_ref().and_then(cancellation).is_some() {
            return Err(Error::new(ErrorKind::Cancelled, format!("key {} was cancelled while it was held", hold.key)));
        }
        Err(Error::new(ErrorKind::LeaseLost, format!("key {} is no longer held here", hold.key)))
    }

    async fn release_hold(&self, hold: &Hold) -> Result<()> {
        if hold.lease.is_some() {
            return Ok(()); // settling the job settles its row
        }
        q(&self.inner.sql.ledger_release)
            .bind(hold.key.as_str())
            .bind(Uuid::parse_str(&hold.token).unwrap_or_default())
            .execute(&self.inner.pool)
            .await
            .map_err(|e| db(e, "ledger release"))?;
        Ok(())
    }

    async fn finish(&self, hold: &Hold, result: &Value) -> Result<()> {
        if let Some(lease) = &hold.lease {
            // Done with its result, and the job complete, in one fenced write.
            return self.complete(lease, Some(result)).await;
        }
        self.inner.ledger.finish(hold.key.as_str().to_owned(), result.clone()).await
    }

    /// A mark in `processed_keys`: the workers whose ledger this schema is (a broker's, normally
    /// the database of its records) complete the key's next delivery unrun.
    async fn cancel_effect(&self, key: &IdempotencyKey, reason: &str, actor: &str) -> Result<CancelOutcome> {
        require_cancel_audit(reason, actor)?;
        let marked = q(&self.inner.sql.ledger_cancel)
            .bind(key.as_str())
            .bind(reason)
            .bind(actor)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "ledger cancel"))?;
        if marked.is_some() {
            info!(key = %key, actor, "key cancelled in the effect ledger");
            return Ok(CancelOutcome::Cancelled);
        }
        match self.ledger_state(key).await? {
            Some(row) => match cancellation(&row) {
                Some(before) => Ok(CancelOutcome::AlreadyCancelled(before)),
                None => Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("the effect of key {key} is done: there is nothing left to cancel"),
                )),
            },
            None => Err(Error::temporary(format!("key {key} changed while it was cancelled; try again"))),
        }
    }

    /// Paused kinds and limits in this schema's `flow_*` tables, shared by every worker using it.
    fn flow(&self) -> Option<&impl Flow> {
        Some(self)
    }
}

impl PgBackend {
    async fn ledger_state(&self, key: &IdempotencyKey) -> Result<Option<PgRow>> {
        q(&self.inner.sql.ledger_state)
            .bind(key.as_str())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "ledger state"))
    }
}

/// A cancelled key's cancel, from its `ledger_state` row.
fn cancellation(row: &PgRow) -> Option<Cancellation> {
    (row.get::<&str, _>("state") == "cancelled").then(|| Cancellation {
        at: row.get::<Option<DateTime<Utc>>, _>("cancelled_at").unwrap_or_default(),
        reason: row.get::<Option<String>, _>("cancel_reason").unwrap_or_default(),
        actor: row.get::<Option<String>, _>("cancelled_by").unwrap_or_default(),
    })
}
