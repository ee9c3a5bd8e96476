//! Group completion: concurrent `complete` calls share one fenced `DELETE … USING unnest(…)` (as
//! `pgmq.delete` takes an array of ids), which also marks the claims' ledger holds done; grouped
//! by the kit's [`Grouper`] (no timer, no added latency).

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use redrive_core::kit::group::{GroupLimits, Grouper};
use redrive_core::{Error, Result};
use serde_json::Value;
use sqlx::{PgPool, Row};
use tokio::sync::oneshot;

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
    grouper: Grouper<Request>,
}

/// A group: at most 1000 calls; at most 2 statements in flight; 32 calls justify a statement
/// beside one already in flight.
const LIMITS: GroupLimits = GroupLimits { max: 1000, in_flight: 2, worth: 32 };

impl Completer {
    /// Starts the completer on `statement` (complete.sql, for one queue). Needs a Tokio runtime.
    pub(crate) fn start(pool: PgPool, statement: Arc<str>) -> Self {
        let grouper = Grouper::start(LIMITS, move |batch| {
            let (pool, statement) = (pool.clone(), Arc::clone(&statement));
            async move { flush(&pool, &statement, batch).await }
        });
        Self { grouper }
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
        let stopped = || Error::temporary("pgmq: the completer stopped");
        self.grouper.send(Request { id, read_at, effect, reply }).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn flush(pool: &PgPool, statement: &Arc<str>, batch: Vec<Request>) {
    let ids: Vec<i64> = batch.iter().map(|r| r.id).collect();
    let reads: Vec<DateTime<Utc>> = batch.iter().map(|r| r.read_at).collect();
    // Keys in one order, so that two statements lock their rows alike.
    let mut effects: Vec<(&str, &Value)> =
        batch.iter().filter_map(|r| r.effect.as_ref().map(|(k, v)| (k.as_str(), v))).collect();
    effects.sort_by(|a, b| a.0.cmp(b.0));
    let (keys, results): (Vec<&str>, Vec<&Value>) = effects.into_iter().unzip();
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
