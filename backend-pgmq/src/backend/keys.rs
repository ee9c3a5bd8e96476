//! Exact dedupe at enqueue: each job's key is a row of the records database's `broker_keys`,
//! written in the transaction that sends its message, so a key sends one message however many
//! times (and however concurrently) it is enqueued.

use std::collections::HashMap;

use redrive_core::{IdempotencyKey, ProviderKey};
use sqlx::Connection;
use uuid::Uuid;

use super::*;

/// What the key table says of one key of an enqueue.
struct Taken {
    created: bool,
    fingerprint: String,
    provider_key: Uuid,
    job_id: Option<String>,
    failed: bool,
}

impl PgmqBackend {
    /// Enqueues inside the caller's transaction (a savepoint of it): the key's row and the
    /// message exist if and only if it commits, so a job can be enqueued with the rows that call
    /// for it.
    pub async fn enqueue_in(&self, conn: &mut PgConnection, job: NewJob) -> Result<Enqueued> {
        Ok(self.enqueue_batch_in(conn, vec![job]).await?.remove(0))
    }

    /// [`enqueue_in`](Self::enqueue_in) for many jobs: all of them, or none.
    pub async fn enqueue_batch_in(&self, conn: &mut PgConnection, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut savepoint = conn.begin().await.map_err(|e| db(e, "begin enqueue"))?;
        let answers = self.enqueue_on(&mut savepoint, &jobs).await?;
        savepoint.commit().await.map_err(|e| db(e, "end enqueue"))?;
        Ok(answers)
    }

    /// Forgets the keys of this queue taken more than `older_than` ago whose message is done
    /// (gone from the queue, and no failure record's), in chunks; the number forgotten. Run it
    /// daily with your ledger's retention (24 h), as `prune_done` on Postgres: until then an
    /// enqueue of a done key answers `Duplicate`.
    pub async fn prune_keys(&self, older_than: Duration) -> Result<u64> {
        const CHUNK: i64 = 5000;
        let mut pruned = 0;
        loop {
            let done = q(&self.inner.sql.keys_prune)
                .bind(self.inner.core.scope())
                .bind(seconds(older_than))
                .bind(CHUNK)
                .execute(&self.inner.pool)
                .await
                .map_err(|e| db(e, "prune done keys"))?;
            pruned += done.rows_affected();
            if done.rows_affected() < CHUNK as u64 {
                return Ok(pruned);
            }
        }
    }

    /// Takes every job's key, then sends the jobs whose key was free, on `conn` (a transaction
    /// the caller ends). A key reused with another payload, in the batch or before it, refuses
    /// the whole batch.
    pub(super) async fn enqueue_on(&self, conn: &mut PgConnection, jobs: &[NewJob]) -> Result<Vec<Enqueued>> {
        for job in jobs {
            self.outgoing(job)?;
        }
        // Each key once, at its first job; a later job of the key must carry the same payload.
        let mut first: HashMap<&str, usize> = HashMap::new();
        let mut fingerprints = Vec::with_capacity(jobs.len());
        for (n, job) in jobs.iter().enumerate() {
            fingerprints.push(job.fingerprint());
            if let Some(&at) = first.get(job.key.as_str())
                && fingerprints[at] != fingerprints[n]
            {
                return Err(key_conflict(&job.key, "an earlier job of this batch"));
            }
            first.entry(job.key.as_str()).or_insert(n);
        }
        let distinct: Vec<usize> = (0..jobs.len()).filter(|n| first[jobs[*n].key.as_str()] == *n).collect();
        let taken = self.take_keys(conn, jobs, &fingerprints, &distinct).await?;

        let mut fresh = Vec::new();
        for &n in &distinct {
            let key = &jobs[n].key;
            let row = &taken[key.as_str()];
            if row.created {
                fresh.push(n);
            } else if row.fingerprint != fingerprints[n] {
                let id = row.job_id.as_deref().unwrap_or("(being sent)");
                return Err(key_conflict(key, &format!("job {id}")));
            }
        }
        let sent = if fresh.is_empty() {
            Vec::new()
        } else {
            let batch: Vec<&NewJob> = fresh.iter().map(|&n| &jobs[n]).collect();
            self.send(conn, &batch, "send").await?
        };
        let mut ids: HashMap<&str, JobId> = HashMap::new();
        for (&n, id) in fresh.iter().zip(&sent) {
            ids.insert(jobs[n].key.as_str(), id.clone());
        }
        if !sent.is_empty() {
            let keys: Vec<&str> = fresh.iter().map(|&n| jobs[n].key.as_str()).collect();
            let messages: Vec<&str> = sent.iter().map(|id| id.0.as_str()).collect();
            q(&self.inner.sql.keys_sent)
                .bind(self.inner.core.scope())
                .bind(&keys)
                .bind(&messages)
                .execute(&mut *conn)
                .await
                .map_err(|e| db(e, "note the keys' messages"))?;
        }

        let mut answers = Vec::with_capacity(jobs.len());
        for (n, job) in jobs.iter().enumerate() {
            let key = job.key.as_str();
            let at = first[key];
            answers.push(match (ids.get(key), &taken[key]) {
                (Some(id), _) if at == n => Enqueued::Created(id.clone()),
                // A second job of a key this batch sends: the first one's.
                (Some(id), _) => Enqueued::Duplicate { id: id.clone(), provider_key: Some(jobs[at].provider_key) },
                (None, row) => {
                    let id =
                        JobId(row.job_id.clone().ok_or_else(|| {
                            Error::temporary(format!("job {} is being enqueued concurrently", job.key))
                        })?);
                    if row.failed {
                        Enqueued::Failed { id }
                    } else {
                        Enqueued::Duplicate { id, provider_key: Some(ProviderKey::from_uuid(row.provider_key)) }
                    }
                }
            });
        }
        Ok(answers)
    }

    /// The key rows of the jobs at `distinct`, taken where free. A key another transaction was
    /// taking is asked for again (its row committed after the statement's snapshot).
    async fn take_keys(
        &self,
        conn: &mut PgConnection,
        jobs: &[NewJob],
        fingerprints: &[String],
        distinct: &[usize],
    ) -> Result<HashMap<String, Taken>> {
        let mut taken = HashMap::with_capacity(distinct.len());
        let mut asking: Vec<usize> = distinct.to_vec();
        // One order for every statement's row locks, so that two batches cannot deadlock.
        asking.sort_by(|&a, &b| jobs[a].key.as_str().cmp(jobs[b].key.as_str()));
        for _ in 0..2 {
            let keys: Vec<&str> = asking.iter().map(|&n| jobs[n].key.as_str()).collect();
            let prints: Vec<&str> = asking.iter().map(|&n| fingerprints[n].as_str()).collect();
            let providers: Vec<Uuid> = asking.iter().map(|&n| jobs[n].provider_key.as_uuid()).collect();
            let rows = q(&self.inner.sql.keys_take)
                .bind(self.inner.core.scope())
                .bind(&keys)
                .bind(&prints)
                .bind(&providers)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| db(e, "take the jobs' keys"))?;
            for row in rows {
                taken.insert(
                    row.get::<String, _>("idempotency_key"),
                    Taken {
                        created: row.get("created"),
                        fingerprint: row.get("fingerprint"),
                        provider_key: row.get("provider_key"),
                        job_id: row.get("job_id"),
                        failed: row.get("failed"),
                    },
                );
            }
            asking.retain(|&n| !taken.contains_key(jobs[n].key.as_str()));
            if asking.is_empty() {
                return Ok(taken);
            }
        }
        Err(Error::temporary(format!("job {} is being enqueued concurrently", jobs[asking[0]].key)))
    }

    /// Sends a replayed job under its key, on `conn` (a transaction the caller ends), with the
    /// key's row, which now answers for the replayed message.
    pub(super) async fn send_under_key(&self, conn: &mut PgConnection, job: &NewJob) -> Result<JobId> {
        let id = self.send(conn, &[job], "replay").await?.remove(0);
        q(&self.inner.sql.keys_replayed)
            .bind(self.inner.core.scope())
            .bind(job.key.as_str())
            .bind(job.fingerprint())
            .bind(job.provider_key.as_uuid())
            .bind(&id.0)
            .execute(&mut *conn)
            .await
            .map_err(|e| db(e, "note the replay's message"))?;
        Ok(id)
    }
}

fn key_conflict(key: &IdempotencyKey, holder: &str) -> Error {
    Error::new(ErrorKind::KeyConflict, format!("key {key} already belongs to {holder} with a different payload"))
}
