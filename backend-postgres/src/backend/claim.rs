//! Claims and their settlements on PostgreSQL: `FOR UPDATE SKIP LOCKED` under a lease token
//! that fences every later write, `LISTEN/NOTIFY` wake-ups, and the sweep of lapsed leases.

use std::cmp::Reverse;
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::kit::{Begin, Claim, Claimed, Hold, Kinds, Lease, Renew};
use redrive_core::{Error, ErrorKind, FailureRecord, JobId, JobRecord, ProviderKey, Result, Severity};
use serde_json::Value;
use sqlx::postgres::{PgListener, PgRow};
use sqlx::{PgPool, Postgres, Row};
use tokio::sync::Notify;
use tracing::warn;
use uuid::Uuid;

use super::dead_letters::record_from;
use super::scan_floor::Position;
use super::{PgBackend, key_from};
use crate::error::db;
use crate::sql::q;

/// Claim statements kept, one per batch size (see `claim.sql`).
const MAX_CLAIM_STATEMENTS: usize = 16;

impl PgBackend {
    async fn wake_signal(&self) -> Option<Arc<Notify>> {
        if !self.inner.config.listen {
            return None;
        }
        let notify = self
            .inner
            .wake
            .get_or_init(|| async {
                let notify = Arc::new(Notify::new());
                tokio::spawn(listen(self.inner.pool.clone(), self.inner.channel.clone(), Arc::downgrade(&notify)));
                notify
            })
            .await;
        Some(Arc::clone(notify))
    }

    async fn sweep_if_due(&self) -> Result<()> {
        let Ok(mut last) = self.inner.last_sweep.try_lock() else { return Ok(()) };
        if last.elapsed() < self.inner.config.sweep_every {
            return Ok(());
        }
        *last = tokio::time::Instant::now();
        let swept = q(&self.inner.sql.sweep).fetch_all(&self.inner.pool).await.map_err(|e| db(e, "sweep"))?;
        if !swept.is_empty() {
            warn!(jobs = swept.len(), "returned jobs with expired leases to the queue");
        }
        Ok(())
    }

    async fn claim_once(&self, kinds: &Option<Vec<String>>, max: usize, lease: Duration) -> Result<Vec<Claimed>> {
        let (floor, generation) = self.inner.floor.lock().unwrap_or_else(|p| p.into_inner()).read();
        let mut rows = self.claim_after(kinds, max, lease, floor).await?;
        let scanned_front = floor.is_none() || rows.len() < max;
        if rows.len() < max && floor.is_some() {
            // The floor's priority ran dry above it: the rest from the front, every priority (the
            // scan the next claim would make anyway), before saying the queue is empty.
            rows.extend(self.claim_after(kinds, max - rows.len(), lease, None).await?);
            // Claim order again: the front may hold a higher priority than the floor's.
            let position = |r: &PgRow| (Reverse(r.get::<i16, _>("priority")), r.get::<DateTime<Utc>, _>("ready_at"));
            rows.sort_by_key(|r| (position(r), r.get::<i64, _>("id")));
        }
        // The batch's last job in claim order.
        let end =
            rows.last().filter(|_| rows.len() == max).map(|r| (r.get("priority"), r.get("ready_at"), r.get("id")));
        self.inner.floor.lock().unwrap_or_else(|p| p.into_inner()).settle(generation, scanned_front, end);
        rows.iter().map(claimed_from).collect()
    }

    async fn claim_after(
        &self,
        kinds: &Option<Vec<String>>,
        max: usize,
        lease: Duration,
        floor: Option<Position>,
    ) -> Result<Vec<PgRow>> {
        let sql = {
            let mut by_limit = self.inner.claim_by_limit.lock().unwrap_or_else(|p| p.into_inner());
            match by_limit.get(&max) {
                Some(sql) => Arc::clone(sql),
                None => {
                    let sql: Arc<str> = self.inner.sql.claim.replace("{limit}", &max.to_string()).into();
                    // The worker asks for powers of two; a caller that asks for every size
                    // does not grow this without bound.
                    if by_limit.len() < MAX_CLAIM_STATEMENTS {
                        by_limit.insert(max, Arc::clone(&sql));
                    }
                    sql
                }
            }
        };
        let _statement = self.inner.in_flight.acquire().await.map_err(|_| Error::temporary("the backend is closed"))?;
        q(&sql)
            .bind(lease.as_secs_f64())
            .bind(floor.map(|(_, at, _)| at))
            .bind(floor.map(|(_, _, id)| id))
            .bind(kinds)
            .bind(floor.map(|(priority, _, _)| priority))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| db(e, "claim"))
    }

    async fn fenced(
        &self,
        sql: &Arc<str>,
        lease: &Lease,
        bind: impl FnOnce(FencedQuery) -> FencedQuery,
        what: &str,
    ) -> Result<()> {
        let (id, token) = parse_lease(lease)?;
        let query = bind(q(sql).bind(id).bind(token));
        let row = query.fetch_optional(&self.inner.pool).await.map_err(|e| db(e, what))?;
        row.map(|_| ()).ok_or_else(|| lease_lost(lease))
    }
}

type FencedQuery = sqlx::query::Query<'static, Postgres, sqlx::postgres::PgArguments>;

/// Forwards NOTIFYs on `channel` to the claimers; ends when the backend is gone.
async fn listen(pool: PgPool, channel: String, wake: Weak<Notify>) {
    let mut listener = loop {
        match PgListener::connect_with(&pool).await {
            Ok(mut l) => match l.listen(&channel).await {
                Ok(()) => break l,
                Err(e) => warn!(error = %e, "LISTEN failed; polling until it works"),
            },
            Err(e) => warn!(error = %e, "no LISTEN connection; polling until there is one"),
        }
        if wake.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    loop {
        let next = tokio::time::timeout(Duration::from_secs(30), listener.recv()).await;
        let Some(wake) = wake.upgrade() else { return };
        match next {
            Ok(Ok(_)) => wake.notify_waiters(),
            Ok(Err(e)) => {
                // PgListener reconnects on the next recv; a notification lost meanwhile is
                // covered by polling. Wake everyone in case one was.
                warn!(error = %e, "LISTEN connection lost; reconnecting");
                wake.notify_waiters();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(_) => {}
        }
    }
}

fn lease_lost(lease: &Lease) -> Error {
    Error::new(ErrorKind::LeaseLost, format!("job {} is no longer held by this lease", lease.job_id))
}

fn parse_lease(lease: &Lease) -> Result<(i64, Uuid)> {
    let id = lease.job_id.0.parse().map_err(|_| Error::new(ErrorKind::NotFound, format!("no job {}", lease.job_id)))?;
    let token = Uuid::parse_str(&lease.token).map_err(|_| lease_lost(lease))?;
    Ok((id, token))
}

/// A claimed row. The row is its key's ledger entry, and the claim took the key: the claim
/// carries the key's state (resumed when an earlier claim started it), and the hold is the lease.
fn claimed_from(row: &PgRow) -> Result<Claimed> {
    let id: i64 = row.get("id");
    let token: Uuid = row.get("lease_token");
    let key = key_from(row.get("idempotency_key"))?;
    let provider_key = ProviderKey::from_uuid(row.get("provider_key"));
    let lease = Lease { job_id: JobId(id.to_string()), token: token.to_string() };
    let hold = Hold { key: key.clone(), token: token.to_string(), provider_key, lease: Some(lease.clone()) };
    let begun = if row.get::<i32, _>("claims") > 1 { Begin::Resumed(hold) } else { Begin::Fresh(hold) };
    Ok(Claimed {
        job: JobRecord {
            id: JobId(id.to_string()),
            kind: row.get("kind"),
            key,
            provider_key,
            payload: row.get("payload"),
            attempt: row.get::<i32, _>("attempts") as u32,
            cap: row.get::<i32, _>("cap") as u32,
            severity: Severity::from_name(row.get("severity")).unwrap_or_default(),
            priority: row.get("priority"),
            enqueued_at: row.get("created_at"),
            deadline: row.get("deadline"),
            // Held back until then by `run_at`.
            not_before: None,
            stranded: row.get::<i32, _>("stranded").max(0) as u32,
            undecodable: None,
            // Its completion confirms its replayed record in SQL.
            replay_of: None,
            traceparent: row.get("traceparent"),
        },
        lease,
        begun: Some(begun),
    })
}

impl Claim for PgBackend {
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let kinds = match kinds {
            Kinds::Any => None,
            Kinds::Only(kinds) => Some(kinds.clone()),
        };
        let deadline = tokio::time::Instant::now() + wait;
        let wake = self.wake_signal().await;
        loop {
            let notified = wake.as_ref().map(|n| n.notified());
            let mut notified = std::pin::pin!(notified);
            if let Some(n) = notified.as_mut().as_pin_mut() {
                // Registered before looking, so a NOTIFY in between is not missed.
                n.enable();
            }
            self.sweep_if_due().await?;
            let claimed = self.claim_once(&kinds, max, lease).await?;
            let now = tokio::time::Instant::now();
            if !claimed.is_empty() || now >= deadline {
                return Ok(claimed);
            }
            let nap = tokio::time::sleep_until(deadline.min(now + self.inner.config.poll));
            match notified.as_pin_mut() {
                Some(n) => {
                    tokio::select! {
                        () = n => {}
                        () = nap => {}
                    }
                }
                None => nap.await,
            }
        }
    }

    async fn complete(&self, lease: &Lease, result: Option<&Value>) -> Result<()> {
        let (id, token) = parse_lease(lease)?;
        if self.inner.completer.complete(id, token, result.cloned()).await? { Ok(()) } else { Err(lease_lost(lease)) }
    }

    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        self.fenced(&self.inner.sql.retry, lease, |q| q.bind(delay.as_secs_f64()).bind(error.to_owned()), "retry")
            .await?;
        if delay < self.inner.config.poll {
            self.wake();
        }
        Ok(())
    }

    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.fenced(&self.inner.sql.release, lease, |q| q.bind(delay.as_secs_f64()), "defer").await?;
        if delay < self.inner.config.poll {
            self.wake();
        }
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.fenced(&self.inner.sql.release, lease, |q| q.bind(0.0f64), "release").await?;
        self.wake();
        Ok(())
    }

    async fn dead_letter(&self, claimed: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        let (id, token) = parse_lease(&claimed.lease)?;
        let row = q(&self.inner.sql.dead_letter)
            .bind(id)
            .bind(token)
            .bind(error)
            .bind(claimed.job.trace_id())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| db(e, "dead-letter"))?;
        record_from(&row.ok_or_else(|| lease_lost(&claimed.lease))?).map(Some)
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

impl Renew for PgBackend {
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.extend(lease, by, true).await
    }

    async fn renew_settling(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.extend(lease, by, false).await
    }
}

impl PgBackend {
    /// A renewal; refused for a job a person cancelled if `heed_cancel`.
    async fn extend(&self, lease: &Lease, by: Duration, heed_cancel: bool) -> Result<Lease> {
        let extend = |q: FencedQuery| q.bind(by.as_secs_f64()).bind(heed_cancel);
        match self.fenced(&self.inner.sql.extend, lease, extend, "extend lease").await {
            Ok(()) => Ok(lease.clone()),
            // Not renewed: lost, or held by a job a person cancelled (its worker stops it).
            Err(e) if e.kind() == ErrorKind::LeaseLost => {
                match self.fenced(&self.inner.sql.cancel_asked, lease, |q| q, "extend lease").await {
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
