//! `Claim` and `Renew` on pgmq: reads into the held table, and the verdicts on what is held,
//! each fenced on the read that holds the message (its `last_read_at`): pgmq's own `delete`,
//! `archive` and `set_vt` take no token, so a worker whose lease lapsed could settle a message
//! another worker now holds.

use redrive_core::FailureRecord;
use redrive_core::kit::{Begin, Claim, Claimed, Hold, Kinds, Lease, Ledger, Renew, payload_fingerprint};
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
            // Another read holds the message: nothing of this claim is left to keep.
            self.forget(lease);
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
        self.inner.held.insert(&id, &token, Holding { headers, attempt, hold: None });
        Claimed { job, lease: Lease { job_id: JobId(id), token }, begun: None }
    }

    /// Takes the claimed jobs' keys in the ledger, in the read's transaction, so that the queue is
    /// the ledger of its own jobs as the Postgres backend is: a key taken is handed to the worker
    /// as a hold that is the lease (renewed with it, marked done by the completion, let go by any
    /// other settlement). A key not taken (held, done, cancelled, another payload), an
    /// undecodable job and a replay (whose completion confirms its record) are left to the
    /// worker's ledger.
    async fn hold_keys(&self, tx: &mut PgConnection, claimed: &mut [Claimed], lease: Duration) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        let asking: Vec<usize> = (0..claimed.len())
            .filter(|&n| {
                let job = &claimed[n].job;
                job.undecodable.is_none() && job.replay_of.is_none() && seen.insert(job.key.as_str().to_owned())
            })
            .collect();
        if asking.is_empty() {
            return Ok(());
        }
        let holders: Vec<uuid::Uuid> = asking.iter().map(|_| uuid::Uuid::new_v4()).collect();
        let keys: Vec<_> = asking
            .iter()
            .zip(&holders)
            .map(|(&n, &holder)| {
                let job = &claimed[n].job;
                (&job.key, payload_fingerprint(&job.payload), holder, job.provider_key)
            })
            .collect();
        let hold = Duration::from_secs(whole_seconds(lease) as u64);
        let taken = self.inner.records.begin_keys_in(tx, &keys, hold).await?;
        for (&n, holder) in asking.iter().zip(holders) {
            let claim = &mut claimed[n];
            let Some(&(fresh, stored)) = taken.get(claim.job.key.as_str()) else { continue };
            let hold = Hold {
                key: claim.job.key.clone(),
                token: holder.to_string(),
                provider_key: stored.unwrap_or(claim.job.provider_key),
                lease: None,
            };
            // The ledger's hold is kept here; the worker gets it as the lease (its hold mode).
            let handed = Hold { lease: Some(claim.lease.clone()), ..hold.clone() };
            claim.begun = Some(if fresh { Begin::Fresh(handed) } else { Begin::Resumed(handed) });
            self.inner.held.with(&claim.lease.job_id.0, &claim.lease.token, |h| h.hold = Some(hold));
        }
        Ok(())
    }

    /// Marks the held entry of `lease` as in use, so that a long handler's entry (and the hold
    /// it names) is not dropped with the stale ones.
    fn touch(&self, lease: &Lease) {
        self.inner.held.renew(&lease.job_id.0, &lease.token, lease.token.clone(), |_| ());
    }

    /// The ledger's hold of the key this process's claim took for `lease`.
    fn hold_of(&self, lease: &Lease) -> Option<Hold> {
        self.inner.held.with(&lease.job_id.0, &lease.token, |h| h.hold.clone()).flatten()
    }

    /// Ends the claim's hold of its key after a settlement other than completion, so that the next
    /// attempt takes the key at once; a failure is logged, since the hold lapses on its own.
    async fn let_go(&self, lease: &Lease) {
        let Some(hold) = self.hold_of(lease) else { return };
        if let Err(e) = self.inner.records.release_hold(&hold).await {
            tracing::debug!(error = %e, "could not let go of the key's hold; it lapses on its own");
        }
    }

    /// `set_vt`'s update, fenced, and the claim's hold extended with it: `Cancelled` if a person
    /// cancelled the key (unless `settling`: the settlement decides now), `LeaseLost` if another
    /// attempt took it over.
    async fn extend(&self, lease: &Lease, by: Duration, settling: bool) -> Result<Lease> {
        self.fenced(&self.inner.sql.renew, lease, Some(seconds(by)), None, "extend visibility").await?;
        self.touch(lease);
        if let Some(hold) = self.hold_of(lease) {
            match self.inner.records.extend_hold(&hold, by).await {
                Err(e) if settling && e.kind() == ErrorKind::Cancelled => {}
                other => other?,
            }
        }
        Ok(lease.clone())
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
        let mut tx = self.inner.pool.begin().await.map_err(|e| db(e, "begin the read"))?;
        let rows = q(&self.inner.sql.read)
            .bind(f64::from(whole_seconds(lease)))
            .bind(max.clamp(1, 1000) as i32)
            .bind(kinds)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| db(e, "read messages"))?;
        if rows.is_empty() {
            drop(tx);
            tokio::time::sleep(wait).await;
            return Ok(Vec::new());
        }
        let mut claimed: Vec<Claimed> = rows.iter().map(|row| self.claimed_from(row)).collect();
        let taken = async {
            self.hold_keys(&mut tx, &mut claimed, lease).await?;
            tx.commit().await.map_err(|e| db(e, "commit the read"))
        };
        if let Err(e) = taken.await {
            for claim in &claimed {
                self.forget(&claim.lease);
            }
            return Err(e);
        }
        Ok(claimed)
    }

    /// pgmq's delete, fenced, grouped with the completions of other handlers in flight; with a
    /// result, the key the claim took is marked done in the same statement.
    async fn complete(&self, lease: &Lease, result: Option<&Value>) -> Result<()> {
        let what = "delete the finished message";
        let (id, read_at) = (message_id(lease)?, read_time(lease, what)?);
        // The hold the claim took is marked done with the handler's result in the same statement.
        let effect =
            self.hold_of(lease).zip(result).map(|(hold, result)| (hold.key.as_str().to_owned(), result.clone()));
        let completer = self
            .inner
            .completer
            .get_or_init(|| Completer::start(self.inner.pool.clone(), Arc::clone(&self.inner.sql.complete)));
        let deleted = completer.complete(id, read_at, effect).await?;
        if result.is_none() {
            // Completed unrun (past its deadline, say): its key was not used, so it is let go.
            self.let_go(lease).await;
        }
        self.forget(lease);
        if !deleted {
            return Err(lease_lost(what));
        }
        Ok(())
    }

    /// The message waits out `delay` hidden, its headers carrying this attempt's error, so that
    /// the record keeps every failed attempt.
    async fn retry(&self, lease: &Lease, delay: Duration, error: &str) -> Result<()> {
        let (read, attempt) = self.held(lease).unwrap_or((None, 0));
        let errors = broker::add_error(carried(read.as_deref()).errors, attempt, error);
        let headers = with_errors(read.as_deref(), &errors);
        self.fenced(&self.inner.sql.retry, lease, Some(seconds(delay)), Some(&headers), "retry").await?;
        self.let_go(lease).await;
        self.forget(lease);
        Ok(())
    }

    /// Hidden for `delay`, its read given back: no number of deferrals uses up attempts.
    async fn defer(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.fenced(&self.inner.sql.give_back, lease, Some(seconds(delay)), None, "defer").await?;
        self.let_go(lease).await;
        self.forget(lease);
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.fenced(&self.inner.sql.give_back, lease, Some(0.0), None, "release").await?;
        self.let_go(lease).await;
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
        self.let_go(lease).await;
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
    /// pgmq's `set_vt`, fenced: the lease's token stays (a renewal is not a read). With the hold
    /// the claim took: extended too, and `Cancelled` once a person cancelled its key.
    async fn renew(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.extend(lease, by, false).await
    }

    async fn renew_settling(&self, lease: &Lease, by: Duration) -> Result<Lease> {
        self.extend(lease, by, true).await
    }
}
