//! The effect ledger on SQLite: each key's fingerprint, provider key, hold and result, for keys
//! that are not this queue's own jobs (those are their job rows).

use std::time::Duration;

use redrive_core::kit::{Begin, Hold, Ledger, require_cancel_audit};
use redrive_core::{CancelOutcome, Cancellation, Error, ErrorKind, Flow, IdempotencyKey, ProviderKey, Result};
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use tracing::info;
use uuid::Uuid;

use super::{SqliteBackend, json_from, ms, now_ms, provider_key_from, time};
use crate::error::db;
use crate::sql::{self, q};

impl Ledger for SqliteBackend {
    async fn begin(
        &self,
        key: &IdempotencyKey,
        payload: &Value,
        provider_key: ProviderKey,
        hold: Duration,
    ) -> Result<Begin> {
        let fingerprint = redrive_core::kit::payload_fingerprint(payload);
        let (now, token) = (now_ms(), Uuid::new_v4().to_string());
        let until = now + ms(hold);
        let mut tx = self.write().await?;
        let existing =
            q(sql::ledger_get).bind(key.as_str()).fetch_optional(&mut *tx).await.map_err(|e| db(e, "ledger begin"))?;
        let Some(row) = existing else {
            q(sql::ledger_insert)
                .bind(key.as_str())
                .bind(&fingerprint)
                .bind(provider_key.as_uuid().to_string())
                .bind(&token)
                .bind(until)
                .execute(&mut *tx)
                .await
                .map_err(|e| db(e, "ledger begin"))?;
            tx.commit().await.map_err(|e| db(e, "commit ledger begin"))?;
            return Ok(Begin::Fresh(Hold { key: key.clone(), token, provider_key, lease: None }));
        };
        if let Some(cancel) = cancellation(&row) {
            return Ok(Begin::Cancelled(cancel));
        }
        if row.get::<String, _>("fingerprint") != fingerprint {
            return Err(Error::new(ErrorKind::KeyConflict, format!("key {key} was used with a different payload")));
        }
        if row.get::<Option<i64>, _>("done_at").is_some() {
            let result = row.get::<Option<String>, _>("result").unwrap_or_else(|| "null".into());
            return Ok(Begin::Done(json_from(&result, "effect result")?));
        }
        let held_until = row.get::<Option<i64>, _>("held_until").unwrap_or(0);
        if held_until > now {
            return Ok(Begin::Busy(Duration::from_millis((held_until - now) as u64)));
        }
        let taken = q(sql::ledger_take)
            .bind(key.as_str())
            .bind(&token)
            .bind(until)
            .bind(now)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| db(e, "ledger begin"))?;
        tx.commit().await.map_err(|e| db(e, "commit ledger begin"))?;
        let provider_key = provider_key_from(&taken.get::<String, _>("provider_key"))?;
        Ok(Begin::Resumed(Hold { key: key.clone(), token, provider_key, lease: None }))
    }

    async fn extend_hold(&self, hold: &Hold, by: Duration) -> Result<()> {
        let row = q(sql::ledger_extend)
            .bind(hold.key.as_str())
            .bind(&hold.token)
            .bind(now_ms() + ms(by))
            .fetch_optional(&self.inner.writer)
            .await
            .map_err(|e| db(e, "extend a hold"))?;
        if row.is_some() {
            return Ok(());
        }
        // Not extended: taken over, or cancelled by a person (its worker stops the handler).
        let now = q(sql::ledger_get)
            .bind(hold.key.as_str())
            .fetch_optional(&self.inner.writer)
            .await
            .map_err(|e| db(e, "extend a hold"))?;
        if now.as_ref().and_then(cancellation).is_some() {
            return Err(Error::new(ErrorKind::Cancelled, format!("key {} was cancelled while it was held", hold.key)));
        }
        Err(Error::new(ErrorKind::LeaseLost, format!("key {} is no longer held by this attempt", hold.key)))
    }

    async fn release_hold(&self, hold: &Hold) -> Result<()> {
        q(sql::ledger_release)
            .bind(hold.key.as_str())
            .bind(&hold.token)
            .bind(now_ms())
            .execute(&self.inner.writer)
            .await
            .map_err(|e| db(e, "release a hold"))?;
        Ok(())
    }

    async fn finish(&self, hold: &Hold, result: &Value) -> Result<()> {
        q(sql::ledger_finish)
            .bind(hold.key.as_str())
            .bind(result.to_string())
            .bind(now_ms())
            .execute(&self.inner.writer)
            .await
            .map_err(|e| db(e, "finish"))?;
        Ok(())
    }

    /// A mark in `redrive_processed_keys`: the workers whose ledger this file is (a broker's)
    /// complete the key's next delivery unrun.
    async fn cancel_effect(&self, key: &IdempotencyKey, reason: &str, actor: &str) -> Result<CancelOutcome> {
        require_cancel_audit(reason, actor)?;
        let marked = q(sql::ledger_cancel)
            .bind(key.as_str())
            .bind(now_ms())
            .bind(reason.to_owned())
            .bind(actor.to_owned())
            .bind(ProviderKey::mint().as_uuid().to_string())
            .fetch_optional(&self.inner.writer)
            .await
            .map_err(|e| db(e, "ledger cancel"))?;
        if marked.is_some() {
            info!(key = %key, actor, "key cancelled in the effect ledger");
            return Ok(CancelOutcome::Cancelled);
        }
        let row = q(sql::ledger_get)
            .bind(key.as_str())
            .fetch_optional(&self.inner.writer)
            .await
            .map_err(|e| db(e, "ledger cancel"))?;
        match row.as_ref().map(cancellation) {
            Some(Some(before)) => Ok(CancelOutcome::AlreadyCancelled(before)),
            Some(None) => Err(Error::new(
                ErrorKind::InvalidInput,
                format!("the effect of key {key} is done: there is nothing left to cancel"),
            )),
            None => Err(Error::temporary(format!("key {key} changed while it was cancelled; try again"))),
        }
    }

    /// Paused kinds and limits in this file's `redrive_flow_*` tables, shared by every process
    /// that opens it.
    fn flow(&self) -> Option<&impl Flow> {
        Some(self)
    }
}

/// A cancelled key's cancel, from its `ledger_get` row (a key done since is done: completion wins).
fn cancellation(row: &SqliteRow) -> Option<Cancellation> {
    let at = row.get::<Option<i64>, _>("cancelled_at").filter(|_| row.get::<Option<i64>, _>("done_at").is_none())?;
    Some(Cancellation {
        at: time(at),
        reason: row.get::<Option<String>, _>("cancel_reason").unwrap_or_default(),
        actor: row.get::<Option<String>, _>("cancelled_by").unwrap_or_default(),
    })
}
