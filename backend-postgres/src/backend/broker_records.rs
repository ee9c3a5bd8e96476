//! [`RecordStore`]: the failure records of broker queues (SQS, Azure), in `broker_records`.

use std::time::Duration;

use redrive_core::kit::{RecordStore, Taken};
use redrive_core::{BoxFuture, Error, ErrorKind, FailureId, FailureQuery, FailureRecord, RecordState, Result};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::PgBackend;
use crate::error::db;
use crate::sql::q;

/// The record a row holds, with the state its columns say.
fn broker_record(row: &PgRow) -> Result<FailureRecord> {
    let mut record: FailureRecord = serde_json::from_value(row.get("record"))
        .map_err(|e| Error::new(ErrorKind::Decode, "a stored broker record does not decode").with_source(e))?;
    record.state = state_of(row)?;
    Ok(record)
}

fn state_of(row: &PgRow) -> Result<RecordState> {
    if row.get::<bool, _>("unclosed") {
        return Ok(RecordState::Open);
    }
    // Closed, or taken by a replay still within its window (for every other reader, replayed).
    let closed = row.get::<Option<serde_json::Value>, _>("closed").unwrap_or_default();
    serde_json::from_value(closed)
        .map_err(|e| Error::new(ErrorKind::Decode, "a stored record state does not decode").with_source(e))
}

fn not_found(id: &FailureId) -> Error {
    Error::new(ErrorKind::NotFound, format!("no failure record {id}"))
}

impl PgBackend {
    /// [`RecordStore::keep_records`] in the caller's transaction, for a queue in this database
    /// (pgmq) that moves a message and keeps its record in one commit. The transaction holds the
    /// queue's record lock until it ends: keep it short.
    pub async fn keep_records_in(
        &self,
        tx: &mut sqlx::PgConnection,
        queue: &str,
        records: &[FailureRecord],
    ) -> Result<u64> {
        if records.is_empty() {
            return Ok(0);
        }
        let column = |f: fn(&FailureRecord) -> String| records.iter().map(f).collect::<Vec<_>>();
        let bodies = column(|r| serde_json::to_string(r).expect("a record serializes"));
        // One writer per queue at a time, so that `seq` follows commit order: a reader paging
        // by `seq` never passes a record that commits later with a lower one.
        q(&self.inner.sql.broker_lock)
            .bind(queue)
            .execute(&mut *tx)
            .await
            .map_err(|e| db(e, "keep failure records"))?;
        let kept: i64 = q(&self.inner.sql.broker_keep)
            .bind(queue)
            .bind(column(|r| r.id.0.clone()))
            .bind(column(|r| r.job_id.0.clone()))
            .bind(column(|r| r.kind.clone()))
            .bind(column(|r| r.key.as_str().to_owned()))
            .bind(records.iter().map(|r| r.last_failed_at).collect::<Vec<_>>())
            .bind(bodies)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| db(e, "keep failure records"))?
            .get("kept");
        Ok(kept.max(0) as u64)
    }

    /// [`RecordStore::take_for_replay`] on `conn`: in the caller's transaction, for a queue in
    /// this database (pgmq) that takes a record, sends its job and closes it in one commit.
    pub async fn take_record_in(
        &self,
        conn: &mut sqlx::PgConnection,
        queue: &str,
        id: &FailureId,
        window: Duration,
    ) -> Result<Taken> {
        let row = q(&self.inner.sql.broker_take)
            .bind(queue)
            .bind(&id.0)
            .bind(window.as_secs_f64())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| db(e, "take a record for replay"))?;
        match row {
            Some(row) => Ok(Taken::Record(Box::new(broker_record(&row)?))),
            None => Ok(Taken::Closed(self.record_on(conn, queue, id).await?.state)),
        }
    }

    /// [`RecordStore::close_record`] on `conn`, in the caller's transaction.
    pub async fn close_record_in(
        &self,
        conn: &mut sqlx::PgConnection,
        queue: &str,
        id: &FailureId,
        state: &RecordState,
    ) -> Result<Option<RecordState>> {
        // A replay closes its take as replayed, or gives it back as open; a discard needs an
        // open record.
        let by_replay = !matches!(state, RecordState::Discarded { .. });
        let closed = q(&self.inner.sql.broker_close)
            .bind(queue)
            .bind(&id.0)
            .bind(serde_json::to_value(state).expect("a state serializes"))
            .bind(by_replay)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| db(e, "close a failure record"))?;
        match closed {
            Some(_) => Ok(None),
            None => Ok(Some(self.record_on(conn, queue, id).await?.state)),
        }
    }

    async fn record_on(&self, conn: &mut sqlx::PgConnection, queue: &str, id: &FailureId) -> Result<FailureRecord> {
        let row = q(&self.inner.sql.broker_get)
            .bind(queue)
            .bind(&id.0)
            .fetch_optional(conn)
            .await
            .map_err(|e| db(e, "get failure record"))?;
        broker_record(&row.ok_or_else(|| not_found(id))?)
    }
}

impl RecordStore for PgBackend {
    fn keep_records<'a>(&'a self, queue: &'a str, records: &'a [FailureRecord]) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            if records.is_empty() {
                return Ok(0);
            }
            let mut tx = self.inner.pool.begin().await.map_err(|e| db(e, "keep failure records"))?;
            let kept = self.keep_records_in(&mut tx, queue, records).await?;
            tx.commit().await.map_err(|e| db(e, "keep failure records"))?;
            Ok(kept)
        })
    }

    fn records<'a>(&'a self, queue: &'a str, query: &'a FailureQuery) -> BoxFuture<'a, Result<Vec<FailureRecord>>> {
        Box::pin(async move {
            let after = match &query.after {
                None => 0,
                Some(id) => q(&self.inner.sql.broker_cursor)
                    .bind(queue)
                    .bind(&id.0)
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(|e| db(e, "find the page's start"))?
                    .ok_or_else(|| {
                        Error::new(ErrorKind::NotFound, format!("the page starts after record {id}, which is gone"))
                    })?
                    .get::<i64, _>("seq"),
            };
            let rows = q(&self.inner.sql.broker_list)
                .bind(queue)
                .bind(query.kind.clone())
                .bind(query.open)
                .bind(query.failed_before)
                .bind(query.key.as_ref().map(|k| k.as_str().to_owned()))
                .bind(query.job_id.as_ref().map(|j| j.0.clone()))
                .bind(after)
                .bind(query.page_size() as i64)
                .bind(query.error_pattern())
                .fetch_all(&self.inner.pool)
                .await
                .map_err(|e| db(e, "list failure records"))?;
            rows.iter().map(broker_record).collect()
        })
    }

    fn record<'a>(&'a self, queue: &'a str, id: &'a FailureId) -> BoxFuture<'a, Result<FailureRecord>> {
        Box::pin(async move {
            let mut conn = self.inner.pool.acquire().await.map_err(|e| db(e, "get failure record"))?;
            self.record_on(&mut conn, queue, id).await
        })
    }

    fn open_records<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let n: i64 = q(&self.inner.sql.broker_count_open)
                .bind(queue)
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| db(e, "count failure records"))?
                .get(0);
            Ok(n.max(0) as u64)
        })
    }

    fn take_for_replay<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        window: Duration,
    ) -> BoxFuture<'a, Result<Taken>> {
        Box::pin(async move {
            let mut conn = self.inner.pool.acquire().await.map_err(|e| db(e, "take a record for replay"))?;
            self.take_record_in(&mut conn, queue, id, window).await
        })
    }

    fn close_record<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        state: &'a RecordState,
    ) -> BoxFuture<'a, Result<Option<RecordState>>> {
        Box::pin(async move {
            let mut conn = self.inner.pool.acquire().await.map_err(|e| db(e, "close a failure record"))?;
            self.close_record_in(&mut conn, queue, id, state).await
        })
    }

    fn confirm_record<'a>(&'a self, queue: &'a str, id: &'a FailureId) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let confirmed = q(&self.inner.sql.broker_confirm)
                .bind(queue)
                .bind(&id.0)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| db(e, "confirm a replayed record"))?;
            Ok(confirmed.is_some())
        })
    }

    fn discard_replaying<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        discarded: &'a RecordState,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let discarded = q(&self.inner.sql.broker_discard_replaying)
                .bind(queue)
                .bind(&id.0)
                .bind(serde_json::to_value(discarded).expect("a state serializes"))
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| db(e, "discard a replaying record"))?;
            Ok(discarded.is_some())
        })
    }

    fn purge_records<'a>(&'a self, queue: &'a str, age: Duration) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let purged: i64 = q(&self.inner.sql.broker_purge)
                .bind(queue)
                .bind(age.as_secs_f64())
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| db(e, "purge failure records"))?
                .get("purged");
            Ok(purged.max(0) as u64)
        })
    }

    fn records_mention<'a>(&'a self, queue: &'a str, text: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            q(&self.inner.sql.broker_mention)
                .bind(queue)
                .bind(text)
                .fetch_one(&self.inner.pool)
                .await
                .map(|row| row.get::<bool, _>("found"))
                .map_err(|e| db(e, "search failure records"))
        })
    }
}
