//! `Claim` and `Renew` on pgmq: reads into the held table, and the verdicts on what is held,
//! each fenced on the read that holds the message (its `last_read_at`): pgmq's own `delete`,
//! `archive` and `set_vt` take no token, so a worker whose lease lapsed could settle a message
//! another worker now holds.

use redrive_core::FailureRecord;
use redrive_core::kit::{Claim, Claimed, Kinds, Lease, Renew};
use redrive_core::{FailureId, Result};

use super::*;
use crate::error::lease_lost;

impl PgmqBackend {
    /// Runs a fenced statement on the message behind `lease`: `LeaseLost` if it changed nothing.
    async fn fenced(
        &self,
        text: &Arc<str>,
        lease: &Lease,
        secs: Option<f64>,
        headers: Option<&Value>,
        what: &str,
    ) -> Result<()> {
        let (id, read_at) = (message_id(lease)?, read_time(lease, what)?);
        let mut query = q(text).bind(id).bind(read_at);
        if let Some(secs) = secs {
            query = query.bind(secs);
        }
        if let Some(headers) = headers {
            query = query.bind(headers);
        }
        let done = query.execute(&self.inner.pool).await.map_err(|e| db(e, what))?;
        if done.rows_affected() == 0 {
            return Err(lease_lost(what));
        }
        Ok(())
    }

    fn forget(&self, lease: &Lease) {
        self.inner.held.remove(&lease.job_id.0, &lease.token);
    }

    /// The headers the message was read with and its attempt, if this process holds it under
    /// `lease`.
    fn held(&self, lease: &Lease) -> Option<(Option<String>, u32)> {
        self.inner.held.with(&lease.job_id.0, &lease.token, |h| (h.headers.clone(), h.attempt))
    }

    fn claimed_from(&self, row: &sqlx::postgres::PgRow) -> Claimed {
        let id = row.get::<i64, _>("msg_id").to_string();
        let token = row.get::<DateTime<Utc>, _>("last_read_at").timestamp_micros().to_string();
        let read_ct: i32 = row.get("read_ct");
        let enqueued_at: DateTime<Utc> = row.get("enqueued_at");
        let body: String = row.get("message");
        let headers: Option<String> = row.get("headers");
        let (env, undecodable) = broker::carried_job("pgmq", &id, &body, broker::Known::default(), enqueued_at);
        let attempt = read_ct.max(1) as u32;
        let job = env.into_job(JobId(id.clone()), attempt, undecodable);
        self.inner.held.insert(&id, &token, Holding { headers, attempt });
        Claimed { job, lease: Lease { job_id: JobId(id), token }, begun: None }
    }
}

/// The read a lease's token names: its `last_read_at`, in microseconds. A token that is not one
/// was never this message's read.
fn read_time(lease: &Lease, what: &str) -> Result<DateTime<Utc>> {
    lease.token.parse().ok().and_then(DateTime::from_timestamp_micros).ok_or_else(|| lease_lost(what))
}

/// The pgmq message id a lease names.
fn message_id(lease: &Lease) -> Result<i64> {
    lease.job_id.0.parse().map_err(|_| {
        Error::new(ErrorKind::InvalidInput, format!("pgmq: {:?} is not a pgmq message id", lease.job_id.0))
    })
}

impl Claim for PgmqBackend {
    /// `pgmq.read`'s statement with a filter on the envelope's kind: workers that run different
    /// kinds share a queue without taking each other's messages (else one could hand a message
    /// back just as the other looks, again and again). An empty read waits out `wait`.
    async fn claim(&self, kinds: &Kinds, max: usize, lease: Duration, wait: Duration) -> Result<Vec<Claimed>> {
        let kinds = match kinds {
            Kinds::Any => None,
            Kinds::Only(kinds) => Some(kinds.clone()),
        };
        let rows = q(&self.inner.sql.read)
            .bind(f64::from(whole_seconds(lease)))
            .bind(max.clamp(1, 1000) as i32)
            .bind(kinds)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| db(e, "read messages"))?;
        if rows.is_empty() {
            tokio::time::sleep(wait).await;
        }
        Ok(rows.iter().map(|row| self.claimed_from(row)).collect())
    }

    /// pgmq's delete, fenced, grouped with the completions of other handlers in flight.
    async fn complete(&self, lease: &Lease, _result: Option<&Value>) -> Result<()> {
        let what = "delete the finished message";
        let (id, read_at) = (message_id(lease)?, read_time(lease, what)?);
        if !self
            .inner
            .completer
            .get_or_init(|| Completer::start(self.inner.pool.clone(), Arc::clone(&self.inner.sql.complete)))
            .complete(id, read_at)
            .await?
        {
            return Err(lease_lost(what));
        }
        self.forget(lease);
        Ok(())
    }

    /// The message waits out `delay` hidden, its headers carrying this attempt's error, so that
    /// the record keeps every failed attempt.
    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let (read, attempt) = self.held(lease).unwrap_or((None, 0));
        let errors = broker::add_error(carried(read.as_deref()).errors, attempt, error);
        let headers = with_errors(read.as_deref(), &errors);
        self.fenced(&self.inner.sql.retry, lease, Some(seconds(delay)), Some(&headers), "retry").await?;
        self.forget(lease);
        Ok(())
    }

    /// Hidden for `delay`, its read given back: no number of deferrals uses up attempts.
    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.fenced(&self.inner.sql.give_back, lease, Some(seconds(delay)), None, "defer").await?;
        self.forget(lease);
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.fenced(&self.inner.sql.give_back, lease, Some(0.0), None, "release").await?;
        self.forget(lease);
        Ok(())
    }

    /// In one transaction: the message locked if it is still this read's, its record kept (under
    /// the message's id), and the message moved to the queue's archive (`pgmq.archive`). Either
    /// all of it commits or none, so there is no "store down" fallback to drain later.
    async fn dead_letter(&self, claimed: &Claimed, error: &str) -> Result<Option<FailureRecord>> {
        let (lease, job) = (&claimed.lease, &claimed.job);
        let (id, read_at) = (message_id(lease)?, read_time(lease, "dead-letter")?);
        let mut tx = self.inner.pool.begin().await.map_err(|e| db(e, "begin the dead letter"))?;
        let held = q(&self.inner.sql.hold)
            .bind(id)
            .bind(read_at)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "hold the message while its record is kept"))?;
        if held.is_none() {
            return Err(lease_lost("dead-letter"));
        }
        let history = carried(self.held(lease).and_then(|(headers, _)| headers).as_deref()).errors;
        let record = FailureRecord::from_job(FailureId(lease.job_id.0.clone()), job, error, history, Utc::now());
        let scope = self.inner.core.scope();
        self.inner.records.keep_records_in(&mut tx, scope, std::slice::from_ref(&record)).await?;
        q(&self.inner.sql.archive)
            .bind(&self.inner.config.queue)
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(|e| db(e, "archive the dead-lettered message"))?;
        tx.commit().await.map_err(|e| db(e, "commit the dead letter"))?;
        self.forget(lease);
        Ok(Some(record))
    }

    async fn confirm_replay(&self, record: &FailureId) -> Result<()> {
        broker::confirm_replay(self, record).await
    }

    async fn withdraw_replay(&self, record: &FailureId, cancel: &redrive_core::Cancellation) -> Result<()> {
        broker::withdraw_replay(self, record, cancel).await
    }

    fn renewal(&self) -> Option<&impl Renew> {
        Some(self)
    }
}

impl Renew for PgmqBackend {
    /// pgmq's `set_vt`, fenced: the lease's token stays (a renewal is not a read).
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.fenced(&self.inner.sql.renew, lease, Some(seconds(by)), None, "extend visibility").await?;
        Ok(lease.clone())
    }
}
