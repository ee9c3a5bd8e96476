//! Completions grouped into shared transactions: with `synchronous = FULL` every commit is a
//! sync to disk, and a handler's completion is the one write its job needs, so the completions
//! that queue while one commit syncs go together in the next. Each caller still hears back only
//! once its completion is committed.

use redrive_core::Result;
use sqlx::SqlitePool;
use tokio::sync::{mpsc, oneshot};

use super::now_ms;
use crate::error::db;
use crate::sql::{self, q};

/// Completions one transaction takes at most.
const MOST: usize = 256;

/// One job to mark done: its id, its lease token, and who waits for the answer (whether the
/// lease still held it).
pub(super) struct Completion {
    pub(super) id: i64,
    pub(super) token: String,
    pub(super) done: oneshot::Sender<Result<bool>>,
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
                Ok(held) => {
                    for (completion, held) in batch.into_iter().zip(held) {
                        let _ = completion.done.send(Ok(held));
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

async fn write(writer: &SqlitePool, batch: &[Completion]) -> Result<Vec<bool>> {
    let now = now_ms();
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await.map_err(|e| db(e, "begin completions"))?;
    let mut held = Vec::with_capacity(batch.len());
    for c in batch {
        let row = q(sql::complete)
            .bind(c.id)
            .bind(&c.token)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| db(e, "complete"))?;
        held.push(row.is_some());
    }
    tx.commit().await.map_err(|e| db(e, "commit completions"))?;
    Ok(held)
}
