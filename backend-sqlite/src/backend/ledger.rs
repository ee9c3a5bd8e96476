//! The effect ledger on SQLite: each key's fingerprint, provider key, hold and result, for keys
//! that are not this queue's own jobs (those are their job rows).

use std::time::Duration;

use redrive_core::kit::{Begin, Hold, Ledger};
use redrive_core::{Error, ErrorKind, Flow, IdempotencyKey, ProviderKey, Result};
use serde_json::Value;
use sqlx::Row;
use uuid::Uuid;

use super::{SqliteBackend, json_from, ms, now_ms, provider_key_from};
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
        row.map(|_| ()).ok_or_else(|| {
            Error::new(ErrorKind::LeaseLost, format!("key {} is no longer held by this attempt", hold.key))
        })
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

    /// Paused kinds and limits in this file's `redrive_flow_*` tables, shared by every process
    /// that opens it.
    fn flow(&self) -> Option<&impl Flow> {
        Some(self)
    }
}
