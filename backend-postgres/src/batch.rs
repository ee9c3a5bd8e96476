//! Group completion: concurrent `complete` calls share one fenced `UPDATE … FROM unnest(…)`.
//!
//! No timer and no added latency: the flusher takes whatever calls are waiting when it is free,
//! so batches grow with load and stay at one under light load.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use redrive_core::{Error, Result};
use serde_json::Value;
use sqlx::{PgPool, Row};
use tokio::sync::{Semaphore, mpsc, oneshot};
use uuid::Uuid;

use crate::error::{db, is_connection_loss};
use crate::sql::{Queries, q};

struct Request {
    id: i64,
    token: Uuid,
    result: Option<Value>,
    reply: oneshot::Sender<Result<bool>>,
}

pub(crate) struct Completer {
    tx: mpsc::UnboundedSender<Request>,
}

const MAX_BATCH: usize = 1000;
const FLUSHERS: usize = 3;

impl Completer {
    pub(crate) fn start(pool: PgPool, sql: Arc<Queries>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(flush_loop(pool, sql, rx));
        Self { tx }
    }

    /// Marks job `id` done under lease `token`. `Ok(false)`: the lease is no longer current.
    pub(crate) async fn complete(&self, id: i64, token: Uuid, result: Option<Value>) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Request { id, token, result, reply }).map_err(|_| Error::temporary("the completer stopped"))?;
        answer.await.map_err(|_| Error::temporary("the completer stopped"))?
    }
}

async fn flush_loop(pool: PgPool, sql: Arc<Queries>, mut rx: mpsc::UnboundedReceiver<Request>) {
    // A few statements in flight at once, each taking what waited when it started.
    let flushers = Arc::new(Semaphore::new(FLUSHERS));
    loop {
        let Ok(permit) = Arc::clone(&flushers).acquire_owned().await else { return };
        let mut batch = Vec::new();
        if rx.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return;
        }
        let (pool, sql) = (pool.clone(), Arc::clone(&sql));
        tokio::spawn(async move {
            flush(&pool, &sql, batch).await;
            drop(permit);
        });
    }
}

async fn flush(pool: &PgPool, sql: &Queries, batch: Vec<Request>) {
    let ids: Vec<i64> = batch.iter().map(|r| r.id).collect();
    let tokens: Vec<Uuid> = batch.iter().map(|r| r.token).collect();
    let results: Vec<Option<Value>> = batch.iter().map(|r| r.result.clone()).collect();
    // The statement is idempotent (done rows keep their token), so a connection lost
    // mid-flight is simply retried on another one.
    let run = || q(&sql.complete).bind(&ids).bind(&tokens).bind(&results).fetch_all(pool);
    let outcome = run
        .retry(ExponentialBuilder::default().with_min_delay(Duration::from_millis(20)).with_max_times(6).with_jitter())
        .when(is_connection_loss)
        .await;
    match outcome {
        Ok(rows) => {
            let done: HashSet<i64> = rows.iter().map(|r| r.get(0)).collect();
            for r in batch {
                let _ = r.reply.send(Ok(done.contains(&r.id)));
            }
        }
        Err(e) => {
            let message = db(e, "complete").to_string();
            for r in batch {
                let _ = r.reply.send(Err(Error::temporary(message.clone())));
            }
        }
    }
}
