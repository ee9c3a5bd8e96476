//! Completions grouped into shared transactions: with `synchronous = FULL` every commit is a
//! sync to disk, and a handler's completion is the one write its job needs, so the completions
//! that queue while the writer is busy go together in the next transaction, in one statement.
//! No delay waits for more: a lone completion is written at once. Each caller still hears back
//! only once its completion is committed.

use std::collections::HashMap;

use redrive_core::{Error, ErrorKind, Result};
use sqlx::{Row, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::{WriteTiming, now_ms};
use crate::error::db;
use crate::sql::{self, q};

/// Completions one transaction takes at most: enough that the completions a worker holds
/// (at most four claims' worth per claimer) drain in a transaction or two when its handlers
/// stop, so the last jobs are not left waiting behind several commits.
const MOST: usize = 1024;

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
    let held: Vec<(i64, &str)> = batch.iter().map(|c| (c.id, c.token.as_str())).collect();
    let held = serde_json::to_string(&held).map_err(|e| Error::new(ErrorKind::Backend, e.to_string()))?;
    let mut timing = WriteTiming::start();
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await.map_err(|e| db(e, "begin completions"))?;
    timing.begun();
    let rows = q(sql::complete).bind(held).bind(now).fetch_all(&mut *tx).await.map_err(|e| db(e, "complete"))?;
    let mut done = HashMap::with_capacity(rows.len());
    for row in &rows {
        let id: i64 = row.get("id");
        // A replayed job's completion confirms its record, in the same transaction.
        if let Some(record) = row.try_get::<Option<i64>, _>("replay_of").ok().flatten() {
            q(sql::confirm)
                .bind(record)
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(|e| db(e, "confirm a replay"))?;
        }
        // A flag that does not read back wakes the claims for nothing, which costs a look.
        done.insert(id, Done::Done { ordered: row.try_get("ordered").unwrap_or(true) });
    }
    timing.committing();
    tx.commit().await.map_err(|e| db(e, "commit completions"))?;
    timing.done("complete", batch.len());
    // A job not returned had lost its lease; one listed twice is done by the first.
    Ok(batch.iter().map(|c| done.remove(&c.id).unwrap_or(Done::LeaseLost)).collect())
}
