//! [`Flow`] on PostgreSQL: the `flow_*` tables, on the database's clock, so that workers on
//! machines whose clocks differ share one. Each call is one statement (a take of a slot makes a
//! second only where it raced another for a key's new slot row); a pause, a resume or a change
//! of limits writes its event in the same statement.

use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::kit::{
    Slot, Tokens, check_kind, check_pause, rate_columns, require_history, stored_count, stored_rate,
};
use redrive_core::{BREAKER, Error, Flow, FlowAction, FlowEvent, KindFlow, Limits, Paused, Rate, Result};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::PgBackend;
use crate::error::db;
use crate::sql::q;

/// Statements a take of a slot makes at most: one, and another each time a taker racing it made
/// the slot row it meant to make.
const TRIES: usize = 8;

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn kind_flow(row: &PgRow) -> Result<KindFlow> {
    let at: Option<DateTime<Utc>> = row.get("paused_at");
    let paused = match (at, row.get::<Option<String>, _>("paused_by")) {
        (Some(at), Some(by)) => Some(Paused {
            reason: row.get::<Option<String>, _>("paused_reason").unwrap_or_default(),
            by,
            at,
            probe_at: row.get("probe_at"),
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

/// A slot's index and holder as bound; `None` where the slot cannot be one of ours.
fn fence(slot: &Slot) -> Option<(i32, Uuid)> {
    Some((i32::try_from(slot.slot).ok()?, Uuid::parse_str(&slot.token).ok()?))
}

impl Flow for PgBackend {
    async fn kinds(&self) -> Result<Vec<KindFlow>> {
        let rows =
            q(&self.inner.sql.flow_kinds).fetch_all(&self.inner.pool).await.map_err(|e| db(e, "read flow kinds"))?;
        rows.iter().map(kind_flow).collect()
    }

    async fn pause(&self, kind: &str, reason: &str, by: &str, probe_after: Option<Duration>) -> Result<bool> {
        check_pause(kind, reason, by)?;
        let paused = q(&self.inner.sql.flow_pause)
            .bind(kind)
            .bind(reason)
            .bind(by)
            .bind(probe_after.map(|d| d.as_secs_f64()))
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "pause a kind"))?;
        Ok(paused.is_some())
    }

    async fn resume(&self, kind: &str, by: &str) -> Result<bool> {
        check_kind(kind)?;
        require_history("who resumed", by)?;
        let resumed = q(&self.inner.sql.flow_resume)
            .bind(kind)
            .bind(by)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "resume a kind"))?;
        Ok(resumed.is_some())
    }

    async fn set_limits(&self, kind: &str, limits: &Limits, by: &str) -> Result<()> {
        check_kind(kind)?;
        require_history("who set the limits", by)?;
        limits.validate()?;
        let (rate_count, rate_per) = rate_columns(limits.rate);
        let (key_rate_count, key_rate_per) = rate_columns(limits.key_rate);
        q(&self.inner.sql.flow_set_limits)
            .bind(kind)
            .bind(limits.concurrency.map(i64::from))
            .bind(rate_count)
            .bind(rate_per)
            .bind(limits.key_concurrency.map(i64::from))
            .bind(key_rate_count)
            .bind(key_rate_per)
            .bind(by)
            .bind(limits.to_string())
            .execute(&self.inner.pool)
            .await
            .map_err(|e| db(e, "set a kind's limits"))?;
        Ok(())
    }

    async fn events(&self, kind: Option<&str>, limit: usize) -> Result<Vec<FlowEvent>> {
        let rows = q(&self.inner.sql.flow_events)
            .bind(kind)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| db(e, "read flow events"))?;
        rows.iter()
            .map(|row| {
                Ok(FlowEvent {
                    at: row.get("at"),
                    kind: row.get("kind"),
                    action: FlowAction::parse(row.get("action"))?,
                    by: row.get("by"),
                    detail: row.get("detail"),
                })
            })
            .collect()
    }

    async fn take_probe(&self, kind: &str, cool_down: Duration) -> Result<bool> {
        let taken = q(&self.inner.sql.flow_take_probe)
            .bind(kind)
            .bind(cool_down.as_secs_f64())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "take a breaker's probe"))?;
        Ok(taken.is_some())
    }

    async fn close_breaker(&self, kind: &str) -> Result<bool> {
        let closed = q(&self.inner.sql.flow_close_breaker)
            .bind(kind)
            .bind(BREAKER)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "close a breaker"))?;
        Ok(closed.is_some())
    }

    async fn take_tokens(&self, key: &str, rate: Rate, want: u32) -> Result<Tokens> {
        let row = q(&self.inner.sql.flow_take_tokens)
            .bind(key)
            .bind(micros(rate.interval()).max(1))
            .bind(micros(rate.per))
            .bind(i64::from(want))
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| db(e, "take from a rate bucket"))?;
        let granted = u32::try_from(row.get::<i64, _>("granted").clamp(0, i64::from(want))).unwrap_or(0);
        let wait = if granted > 0 {
            Duration::ZERO
        } else {
            Duration::from_micros(u64::try_from(row.get::<i64, _>("wait_us")).unwrap_or(1))
        };
        Ok(Tokens { granted, wait })
    }

    async fn take_slot(&self, key: &str, limit: u32, lease: Duration) -> Result<Option<Slot>> {
        let token = Uuid::new_v4();
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        // Another try only where another taker made the row this one meant to make: the rows
        // are then there, and the next statement sees them.
        for _ in 0..TRIES {
            let row = q(&self.inner.sql.flow_take_slot)
                .bind(key)
                .bind(limit)
                .bind(token)
                .bind(lease.as_secs_f64())
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| db(e, "take a slot"))?;
            let slot = row.get::<Option<i32>, _>("took").or(row.get::<Option<i32>, _>("made"));
            if let Some(slot) = slot {
                let slot = stored_count(slot.into(), "slot")?;
                return Ok(Some(Slot { key: key.to_owned(), slot, token: token.to_string() }));
            }
            if !row.get::<Option<bool>, _>("short").unwrap_or(false) {
                return Ok(None);
            }
        }
        Err(Error::temporary(format!("the slots of {key} are being made by other takers")))
    }

    async fn renew_slot(&self, slot: &Slot, lease: Duration) -> Result<bool> {
        let Some((index, token)) = fence(slot) else { return Ok(false) };
        let renewed = q(&self.inner.sql.flow_renew_slot)
            .bind(&slot.key)
            .bind(index)
            .bind(token)
            .bind(lease.as_secs_f64())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "renew a slot"))?;
        Ok(renewed.is_some())
    }

    async fn release_slot(&self, slot: &Slot) -> Result<()> {
        let Some((index, token)) = fence(slot) else { return Ok(()) };
        q(&self.inner.sql.flow_release_slot)
            .bind(&slot.key)
            .bind(index)
            .bind(token)
            .execute(&self.inner.pool)
            .await
            .map_err(|e| db(e, "release a slot"))?;
        Ok(())
    }
}
