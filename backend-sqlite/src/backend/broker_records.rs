//! [`RecordStore`]: the failure records of broker queues (SQS, Azure), in
//! `redrive_broker_records`, for a worker whose records live in this file.

use std::time::Duration;

use redrive_core::kit::{RecordStore, Taken};
use redrive_core::{BoxFuture, Error, ErrorKind, FailureId, FailureQuery, FailureRecord, RecordState, Result};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::{CHUNK, SqliteBackend, let_others_write, ms, now_ms};
use crate::error::db;
use crate::sql::{self, q};

/// The record a row holds, with the state its columns say.
fn broker_record(row: &SqliteRow) -> Result<FailureRecord> {
    let mut record: FailureRecord = serde_json::from_str(&row.get::<String, _>("record"))
        .map_err(|e| Error::new(ErrorKind::Decode, "a stored broker record does not decode").with_source(e))?;
    record.state = if row.get::<bool, _>("unclosed") {
        RecordState::Open
    } else {
        // Closed, or taken by a replay still within its window (for every other reader, replayed).
        let closed = row.get::<Option<String>, _>("closed").unwrap_or_default();
        serde_json::from_str(&closed)
            .map_err(|e| Error::new(ErrorKind::Decode, "a stored record state does not decode").with_source(e))?
    };
    Ok(record)
}

fn not_found(id: &FailureId) -> Error {
    Error::new(ErrorKind::NotFound, format!("no failure record {id}"))
}

/// Settles record `id` of `queue` in `tx` where it is replaying (or still taken by its replay):
/// `settle` makes the new state of its replaying one. Whether it changed.
async fn settle_replaying(
    tx: &mut sqlx::SqliteConnection,
    queue: &str,
    id: &FailureId,
    settle: impl FnOnce(&RecordState) -> Option<RecordState>,
) -> Result<bool> {
    let Some(row) = q(sql::broker_state)
        .bind(queue)
        .bind(&id.0)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| db(e, "read a record's state"))?
    else {
        return Ok(false);
    };
    if !matches!(row.get::<String, _>("state").as_str(), "replaying" | "taken") {
        return Ok(false);
    }
    let replaying: RecordState = serde_json::from_str(&row.get::<Option<String>, _>("closed").unwrap_or_default())
        .map_err(|e| Error::new(ErrorKind::Decode, "a stored record state does not decode").with_source(e))?;
    let Some(settled) = settle(&replaying) else { return Ok(false) };
    q(sql::broker_settle)
        .bind(queue)
        .bind(&id.0)
        .bind(settled.name())
        .bind(serde_json::to_string(&settled).unwrap_or_default())
        .execute(&mut *tx)
        .await
        .map_err(|e| db(e, "settle a replayed record"))?;
    Ok(true)
}

impl RecordStore for SqliteBackend {
    fn keep_records<'a>(&'a self, queue: &'a str, records: &'a [FailureRecord]) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            if records.is_empty() {
                return Ok(0);
            }
            let mut tx = self.write().await?;
            let mut kept = 0;
            for r in records {
                let body =
                    serde_json::to_string(r).map_err(|e| Error::new(ErrorKind::Decode, "a record").with_source(e))?;
                kept += q(sql::broker_keep)
                    .bind(queue)
                    .bind(&r.id.0)
                    .bind(&r.job_id.0)
                    .bind(&r.kind)
                    .bind(r.key.as_str())
                    .bind(r.last_failed_at.timestamp_millis())
                    .bind(body)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db(e, "keep failure records"))?
                    .rows_affected();
                // A replayed job that failed again: the replayed record names this one.
                if let Some(replayed) = &r.replay_of {
                    let next = r.id.clone();
                    settle_replaying(&mut tx, queue, replayed, |s| s.failed_again(r.last_failed_at, next)).await?;
                }
            }
            tx.commit().await.map_err(|e| db(e, "keep failure records"))?;
            Ok(kept)
        })
    }

    fn records<'a>(&'a self, queue: &'a str, query: &'a FailureQuery) -> BoxFuture<'a, Result<Vec<FailureRecord>>> {
        Box::pin(async move {
            let after = match &query.after {
                None => 0,
                Some(id) => q(sql::broker_cursor)
                    .bind(queue)
                    .bind(&id.0)
                    .fetch_optional(&self.inner.reader)
                    .await
                    .map_err(|e| db(e, "find the page's start"))?
                    .ok_or_else(|| {
                        Error::new(ErrorKind::NotFound, format!("the page starts after record {id}, which is gone"))
                    })?
                    .get::<i64, _>("seq"),
            };
            let rows = q(sql::broker_list)
                .bind(queue)
                .bind(query.kind.clone())
                .bind(query.open)
                .bind(query.failed_before.map(|t| t.timestamp_millis()))
                .bind(query.key.as_ref().map(|k| k.as_str().to_owned()))
                .bind(query.job_id.as_ref().map(|j| j.0.clone()))
                .bind(after)
                .bind(i64::try_from(query.page_size()).unwrap_or(i64::MAX))
                .bind(now_ms())
                .bind(query.error_pattern())
                .fetch_all(&self.inner.reader)
                .await
                .map_err(|e| db(e, "list failure records"))?;
            rows.iter().map(broker_record).collect()
        })
    }

    fn record<'a>(&'a self, queue: &'a str, id: &'a FailureId) -> BoxFuture<'a, Result<FailureRecord>> {
        Box::pin(async move {
            let row = q(sql::broker_get)
                .bind(queue)
                .bind(&id.0)
                .bind(now_ms())
                .fetch_optional(&self.inner.reader)
                .await
                .map_err(|e| db(e, "get failure record"))?;
            broker_record(&row.ok_or_else(|| not_found(id))?)
        })
    }

    fn open_records<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let n: i64 = q(sql::broker_count_open)
                .bind(queue)
                .bind(now_ms())
                .fetch_one(&self.inner.reader)
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
            let now = now_ms();
            // Who and why come with the close.
            let replayed = RecordState::Replaying {
                at: super::time(now),
                reason: String::new(),
                actor: String::new(),
                amended: false,
            };
            let row = q(sql::broker_take)
                .bind(queue)
                .bind(&id.0)
                .bind(now + ms(window))
                .bind(now)
                .bind(serde_json::to_string(&replayed).unwrap_or_default())
                .fetch_optional(&self.inner.writer)
                .await
                .map_err(|e| db(e, "take a record for replay"))?;
            match row {
                Some(row) => Ok(Taken::Record(Box::new(broker_record(&row)?))),
                None => Ok(Taken::Closed(self.record(queue, id).await?.state)),
            }
        })
    }

    fn close_record<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        state: &'a RecordState,
    ) -> BoxFuture<'a, Result<Option<RecordState>>> {
        Box::pin(async move {
            // A replay closes its take as replayed, or gives it back as open; a discard needs an
            // open record.
            let by_replay = !matches!(state, RecordState::Discarded { .. });
            let closed = q(sql::broker_close)
                .bind(queue)
                .bind(&id.0)
                .bind(state.name())
                .bind(serde_json::to_string(state).unwrap_or_default())
                .bind(by_replay)
                .bind(now_ms())
                .fetch_optional(&self.inner.writer)
                .await
                .map_err(|e| db(e, "close a failure record"))?;
            if closed.is_some() {
                return Ok(None);
            }
            let found = self.record(queue, id).await?.state;
            // The replayed job settled the record before the replay closed it (it ran at once):
            // the close adds who replayed it and why.
            if let (RecordState::Replaying { reason, actor, .. }, RecordState::Confirmed { actor: none, .. })
            | (RecordState::Replaying { reason, actor, .. }, RecordState::FailedAgain { actor: none, .. }) =
                (state, &found)
                && none.is_empty()
            {
                let mut audited = serde_json::to_value(&found).unwrap_or_default();
                audited["reason"] = reason.clone().into();
                audited["actor"] = actor.clone().into();
                q(sql::broker_settle)
                    .bind(queue)
                    .bind(&id.0)
                    .bind(found.name())
                    .bind(audited.to_string())
                    .execute(&self.inner.writer)
                    .await
                    .map_err(|e| db(e, "close a failure record"))?;
                return Ok(None);
            }
            Ok(Some(found))
        })
    }

    fn confirm_record<'a>(&'a self, queue: &'a str, id: &'a FailureId) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let mut tx = self.write().await?;
            let confirmed = settle_replaying(&mut tx, queue, id, |s| s.confirmed(chrono::Utc::now())).await?;
            tx.commit().await.map_err(|e| db(e, "confirm a replayed record"))?;
            Ok(confirmed)
        })
    }

    fn discard_replaying<'a>(
        &'a self,
        queue: &'a str,
        id: &'a FailureId,
        discarded: &'a RecordState,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let mut tx = self.write().await?;
            let closed = settle_replaying(&mut tx, queue, id, |_| Some(discarded.clone())).await?;
            tx.commit().await.map_err(|e| db(e, "discard a replaying record"))?;
            Ok(closed)
        })
    }

    fn purge_records<'a>(&'a self, queue: &'a str, age: Duration) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            // In batches: the write lock held briefly, let go between them (see `CHUNK`).
            let before = now_ms() - ms(age);
            let mut purged = 0;
            loop {
                let started = std::time::Instant::now();
                let deleted = q(sql::broker_purge)
                    .bind(queue)
                    .bind(before)
                    .bind(CHUNK)
                    .execute(&self.inner.writer)
                    .await
                    .map_err(|e| db(e, "purge failure records"))?
                    .rows_affected();
                purged += deleted;
                if deleted < CHUNK as u64 {
                    return Ok(purged);
                }
                let_others_write(started.elapsed()).await;
            }
        })
    }

    fn records_mention<'a>(&'a self, queue: &'a str, text: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let quoted = serde_json::to_string(text).unwrap_or_default();
            let inner = quoted.trim_matches('"').to_owned();
            q(sql::broker_mention)
                .bind(queue)
                .bind(text)
                .bind(inner)
                .fetch_one(&self.inner.reader)
                .await
                .map(|row| row.get::<bool, _>("found"))
                .map_err(|e| db(e, "search failure records"))
        })
    }
}
