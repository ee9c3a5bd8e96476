//! [`Flow`] on SQLite: the `redrive_flow_*` tables. A write that reads first (a pause and its
//! event, a take of tokens) is one `BEGIN IMMEDIATE` transaction on the writer, so another
//! process's cannot come between its read and its write; a take, renewal or release of a slot is
//! one statement, which holds the write lock from its read to its write.

use std::time::Duration;

use chrono::Utc;
use redrive_core::kit::{
    Slot, Tokens, check_kind, check_pause, gcra, rate_columns, require_history, stored_count, stored_rate,
};
use redrive_core::{BREAKER, Flow, FlowAction, FlowEvent, KindFlow, Limits, Paused, Rate, Result};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::{SqliteBackend, ms, now_ms, time};
use crate::error::db;
use crate::sql::{self, q};

fn kind_flow(row: &SqliteRow) -> Result<KindFlow> {
    let paused = match (row.get::<Option<i64>, _>("paused_at"), row.get::<Option<String>, _>("paused_by")) {
        (Some(at), Some(by)) => Some(Paused {
            reason: row.get::<Option<String>, _>("paused_reason").unwrap_or_default(),
            by,
            at: time(at),
            probe_at: row.get::<Option<i64>, _>("probe_at").map(time),
        }),
        _ => None,
    };
    let concurrency = |column: &str| row.get::<Option<i64>, _>(column).map(|n| stored_count(n, "limit")).transpose();
    let limits = Limits {
        concurrency: concurrency("concurrency")?,
        rate: stored_rate(row.get("rate_count"), row.get("rate_per_us"))?,
        key_concurrency: concurrency("key_concurrency")?,
        key_rate: stored_rate(row.get("key_rate_count"), row.get("key_rate_per_us"))?,
    };
    Ok(KindFlow { kind: row.get("kind"), paused, limits })
}

/// Writes a flow event inside `tx`.
async fn log(tx: &mut sqlx::SqliteConnection, kind: &str, action: FlowAction, by: &str, detail: &str) -> Result<()> {
    q(sql::flow_event)
        .bind(now_ms())
        .bind(kind)
        .bind(action.as_str())
        .bind(by)
        .bind(detail)
        .execute(tx)
        .await
        .map_err(|e| db(e, "write a flow event"))?;
    Ok(())
}

impl Flow for SqliteBackend {
    async fn kinds(&self) -> Result<Vec<KindFlow>> {
        let rows = q(sql::flow_kinds).fetch_all(&self.inner.reader).await.map_err(|e| db(e, "read flow kinds"))?;
        rows.iter().map(kind_flow).collect()
    }

    async fn pause(&self, kind: &str, reason: &str, by: &str, probe_after: Option<Duration>) -> Result<bool> {
        check_pause(kind, reason, by)?;
        let now = now_ms();
        let mut tx = self.write().await?;
        let paused = q(sql::flow_pause)
            .bind(kind)
            .bind(reason)
            .bind(by)
            .bind(now)
            .bind(probe_after.map(|after| now + ms(after)))
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "pause a kind"))?;
        if paused.is_none() {
            return Ok(false);
        }
        log(&mut tx, kind, FlowAction::Paused, by, reason).await?;
        tx.commit().await.map_err(|e| db(e, "commit a pause"))?;
        Ok(true)
    }

    async fn resume(&self, kind: &str, by: &str) -> Result<bool> {
        check_kind(kind)?;
        require_history("who resumed", by)?;
        let mut tx = self.write().await?;
        let was = q(sql::flow_paused).bind(kind).fetch_optional(&mut *tx).await.map_err(|e| db(e, "resume a kind"))?;
        let Some(was) = was else { return Ok(false) };
        q(sql::flow_unpause).bind(kind).bind(false).execute(&mut *tx).await.map_err(|e| db(e, "resume a kind"))?;
        let detail = format!(
            "paused by {} since {}",
            was.get::<String, _>("paused_by"),
            time(was.get("paused_at")).format("%Y-%m-%d %H:%M:%S UTC")
        );
        log(&mut tx, kind, FlowAction::Resumed, by, &detail).await?;
        tx.commit().await.map_err(|e| db(e, "commit a resume"))?;
        Ok(true)
    }

    async fn set_limits(&self, kind: &str, limits: &Limits, by: &str) -> Result<()> {
        check_kind(kind)?;
        require_history("who set the limits", by)?;
        limits.validate()?;
        let (rate_count, rate_per) = rate_columns(limits.rate);
        let (key_rate_count, key_rate_per) = rate_columns(limits.key_rate);
        let mut tx = self.write().await?;
        q(sql::flow_set_limits)
            .bind(kind)
            .bind(limits.concurrency.map(i64::from))
            .bind(rate_count)
            .bind(rate_per)
            .bind(limits.key_concurrency.map(i64::from))
            .bind(key_rate_count)
            .bind(key_rate_per)
            .execute(&mut *tx)
            .await
            .map_err(|e| db(e, "set a kind's limits"))?;
        log(&mut tx, kind, FlowAction::Limits, by, &limits.to_string()).await?;
        tx.commit().await.map_err(|e| db(e, "commit limits"))
    }

    async fn events(&self, kind: Option<&str>, limit: usize) -> Result<Vec<FlowEvent>> {
        let rows = q(sql::flow_events)
            .bind(kind)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.inner.reader)
            .await
            .map_err(|e| db(e, "read flow events"))?;
        rows.iter()
            .map(|row| {
                Ok(FlowEvent {
                    at: time(row.get("at")),
                    kind: row.get("kind"),
                    action: FlowAction::parse(row.get("action"))?,
                    by: row.get("by"),
                    detail: row.get("detail"),
                })
            })
            .collect()
    }

    async fn take_probe(&self, kind: &str, cool_down: Duration) -> Result<bool> {
        let now = now_ms();
        let taken = q(sql::flow_take_probe)
            .bind(kind)
            .bind(now)
            .bind(now + ms(cool_down))
            .fetch_optional(&self.inner.writer)
            .await
            .map_err(|e| db(e, "take a breaker's probe"))?;
        Ok(taken.is_some())
    }

    async fn close_breaker(&self, kind: &str) -> Result<bool> {
        let mut tx = self.write().await?;
        let closed = q(sql::flow_unpause)
            .bind(kind)
            .bind(true)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "close a breaker"))?;
        if closed.is_none() {
            return Ok(false);
        }
        log(&mut tx, kind, FlowAction::Resumed, BREAKER, "a probe succeeded").await?;
        tx.commit().await.map_err(|e| db(e, "commit a breaker's close"))?;
        Ok(true)
    }

    async fn take_tokens(&self, key: &str, rate: Rate, want: u32) -> Result<Tokens> {
        let mut tx = self.write().await?;
        let now = Utc::now().timestamp_micros();
        let tat: Option<i64> = q(sql::flow_bucket)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "read a rate bucket"))?
            .map(|row| row.get("tat"));
        let (tokens, tat) = gcra(tat, now, rate, want);
        // A take granted nothing writes nothing: the transaction rolls back on drop.
        if tokens.granted > 0 {
            q(sql::flow_bucket_set).bind(key).bind(tat).execute(&mut *tx).await.map_err(|e| db(e, "take tokens"))?;
            tx.commit().await.map_err(|e| db(e, "commit a take of tokens"))?;
        }
        Ok(tokens)
    }

    async fn take_slot(&self, key: &str, limit: u32, lease: Duration) -> Result<Option<Slot>> {
        let (now, token) = (now_ms(), uuid::Uuid::new_v4().to_string());
        let taken = q(sql::flow_take_slot)
            .bind(key)
            .bind(i64::from(limit))
            .bind(&token)
            .bind(now + ms(lease))
            .bind(now)
            .fetch_optional(&self.inner.writer)
            .await
            .map_err(|e| db(e, "take a slot"))?;
        let Some(row) = taken else { return Ok(None) };
        let slot = stored_count(row.get("slot"), "slot")?;
        Ok(Some(Slot { key: key.to_owned(), slot, token }))
    }

    async fn renew_slot(&self, slot: &Slot, lease: Duration) -> Result<bool> {
        let renewed = q(sql::flow_renew_slot)
            .bind(&slot.key)
            .bind(i64::from(slot.slot))
            .bind(&slot.token)
            .bind(now_ms() + ms(lease))
            .fetch_optional(&self.inner.writer)
            .await
            .map_err(|e| db(e, "renew a slot"))?;
        Ok(renewed.is_some())
    }

    async fn release_slot(&self, slot: &Slot) -> Result<()> {
        q(sql::flow_release_slot)
            .bind(&slot.key)
            .bind(i64::from(slot.slot))
            .bind(&slot.token)
            .execute(&self.inner.writer)
            .await
            .map_err(|e| db(e, "release a slot"))?;
        Ok(())
    }
}
