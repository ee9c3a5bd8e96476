//! Completions grouped into shared transactions: with `synchronous = FULL` every commit is a
//! sync to disk, and a handler's completion is the one write its job needs, so the completions
//! that queue while one commit syncs go together in the next. Each caller still hears back only
//! once its completion is committed.

use redrive_core::Result;
use sqlx::{Row, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::now_ms;
use crate::error::db;
use crate::sql::{self, q};

/// Completions one transaction takes at most.
const MOST: usize = 256;

/// One job to mark done: its id, its lease token, and who waits for the answer.
pub(super) struct Completion {
    pub(super) id: i64,
    pub(super) token: String,
    pub(super) done: oneshot::Sender<Result<Done>>,
}

/// What a completion found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Done {
    /// The lease no longer held the job: nothing was written.
    LeaseLost,
    /// Done; `ordered`: the job had an order key, whose next job may be claimed now.
    Done { ordered: bool },
}

/// Starts the task that writes completions; it ends when the backend (every sender) is gone.
pub(super) fn start(writer: SqlitePool) -> mpsc::Sender<Completion> {
    let (tx, mut rx) = mpsc::channel::<Completion>(4 * MOST);
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while batch.len() < MOST {
                match rx.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            match write(&writer, &batch).await {
                Ok(found) => {
                    for (completion, found) in batch.into_iter().zip(found) {
                        let _ = completion.done.send(Ok(found));
                    }
                }
                Err(e) => {
                    // Each completion gets the failure whole: kind, retry flag, message, source.
                    for completion in batch {
                        let _ = completion.done.send(Err(e.clone()));
                    }
                }
            }
        }
    });
    tx
}

async fn write(writer: &SqlitePool, batch: &[Completion]) -> Result<Vec<Done>> {
    let now = now_ms();
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await.map_err(|e| db(e, "begin completions"))?;
    let mut found = Vec::with_capacity(batch.len());
    for c in batch {
        let row = q(sql::complete)
            .bind(c.id)
            .bind(&c.token)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "complete"))?;
        // A replayed job's completion confirms its record, in the same transaction.
        if let Some(record) = row.as_ref().and_then(|row| row.try_get::<Option<i64>, _>("replay_of").ok().flatten()) {
            q(sql::confirm)
                .bind(record)
                .bind(now)
                .bind(c.id)
                .execute(&mut *tx)
                .await
                .map_err(|e| db(e, "confirm a replay"))?;
        }
        // A flag that does not read back wakes the claims for nothing, which costs a look.
        found.push(row.map_or(Done::LeaseLost, |row| Done::Done { ordered: row.try_get("ordered").unwrap_or(true) }));
    }
    tx.commit().await.map_err(|e| db(e, "commit completions"))?;
    Ok(found)
}
