//! Group completion: concurrent `complete` calls share one fenced `DELETE … USING unnest(…)`, as
//! `pgmq.delete` takes an array of ids, which also marks the claims' ledger holds done.
//!
//! No timer and no added latency: with no statement in flight, whatever calls are waiting go at
//! once, so batches stay at one under light load; with one in flight, another starts only for a
//! worthwhile batch, and smaller ones go with what arrives meanwhile.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use redrive_core::{Error, Result};
use serde_json::Value;
use sqlx::{PgPool, Row};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::error::db;
use crate::sql::q;

struct Request {
    id: i64,
    read_at: DateTime<Utc>,
    /// The key the claim took in the ledger, and the handler's result, to mark done.
    effect: Option<(String, Value)>,
    reply: oneshot::Sender<Result<bool>>,
}

pub(crate) struct Completer {
    tx: mpsc::UnboundedSender<Request>,
}

const MAX_BATCH: usize = 1000;
/// Statements in flight at most.
const FLUSHERS: usize = 2;
/// Calls that justify a statement beside one already in flight.
const WORTH_A_STATEMENT: usize = 32;

impl Completer {
    /// Starts the completer on `statement` (complete.sql, for one queue). Needs a Tokio runtime.
    pub(crate) fn start(pool: PgPool, statement: Arc<str>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(flush_loop(pool, statement, rx));
        Self { tx }
    }

    /// Deletes message `id` if it is still under the read of `read_at`, and marks `effect`'s key
    /// done with its result. `Ok(false)`: the message is not under that read.
    pub(crate) async fn complete(
        &self,
        id: i64,
        read_at: DateTime<Utc>,
        effect: Option<(String, Value)>,
    ) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request { id, read_at, effect, reply })
            .map_err(|_| Error::temporary("pgmq: the completer stopped"))?;
        answer.await.map_err(|_| Error::temporary("pgmq: the completer stopped"))?
    }
}

/// Frees a flusher's slot and says so however its task ends, so that a small batch waiting for
/// the slot is not left waiting.
struct Finished {
    signal: Arc<Notify>,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.signal.notify_one();
    }
}

async fn flush_loop(pool: PgPool, statement: Arc<str>, mut rx: mpsc::UnboundedReceiver<Request>) {
    let flushers = Arc::new(Semaphore::new(FLUSHERS));
    let finished = Arc::new(Notify::new());
    loop {
        let mut batch = Vec::new();
        if rx.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return;
        }
        while flushers.available_permits() < FLUSHERS && batch.len() < WORTH_A_STATEMENT {
            let room = MAX_BATCH - batch.len();
            tokio::select! {
                () = finished.notified() => break,
                n = rx.recv_many(&mut batch, room) => if n == 0 { break },
            }
        }
        let Ok(permit) = Arc::clone(&flushers).acquire_owned().await else { return };
        let (pool, statement) = (pool.clone(), Arc::clone(&statement));
        let done = Finished { signal: Arc::clone(&finished), _slot: permit };
        tokio::spawn(async move {
            flush(&pool, &statement, batch).await;
            drop(done);
        });
    }
}

async fn flush(pool: &PgPool, statement: &Arc<str>, batch: Vec<Request>) {
    let ids: Vec<i64> = batch.iter().map(|r| r.id).collect();
    let reads: Vec<DateTime<Utc>> = batch.iter().map(|r| r.read_at).collect();
    let (keys, results): (Vec<&str>, Vec<&Value>) =
        batch.iter().filter_map(|r| r.effect.as_ref().map(|(k, v)| (k.as_str(), v))).unzip();
    let results: Vec<Value> = results.into_iter().cloned().collect();
    match q(statement).bind(&ids).bind(&reads).bind(&keys).bind(&results).fetch_all(pool).await {
        Ok(rows) => {
            // By id and read: a stale read's completion in the same batch as the current one is
            // told it deleted nothing.
            let deleted: HashSet<(i64, DateTime<Utc>)> =
                rows.iter().map(|r| (r.get("msg_id"), r.get("last_read_at"))).collect();
            for r in batch {
                let _ = r.reply.send(Ok(deleted.contains(&(r.id, r.read_at))));
            }
        }
        Err(e) => {
            // Every call gets the statement's error (its kind and retry flag: a lost connection
            // is temporary, and the worker completes again; the delete is fenced, so safely).
            let e = db(e, "delete finished messages");
            for r in batch {
                let _ = r.reply.send(Err(e.clone()));
            }
        }
    }
}
