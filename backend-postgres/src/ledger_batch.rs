//! Grouped ledger writes: concurrent `begin`s share one `INSERT … FROM unnest(…)` and concurrent
//! `finish`es one `UPDATE … FROM unnest(…)`, so a broker's workers (SQS, Azure, QStash, pgmq),
//! whose ledger this is, pay one commit per group rather than two per job.
//! Grouped by the kit's [`Grouper`], as completions are (no timer, no added latency).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use redrive_core::kit::group::{GroupLimits, Grouper};
use redrive_core::{Error, Result};
use serde_json::Value;
use sqlx::{PgExecutor, PgPool, Row};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::error::db;
use crate::sql::{Queries, q};

/// One `begin`: the key, its fingerprint, the attempt's token, the hold in seconds, the provider
/// key.
pub(crate) struct BeginCall {
    pub(crate) key: String,
    pub(crate) fingerprint: String,
    pub(crate) token: Uuid,
    pub(crate) secs: f64,
    pub(crate) provider_key: Uuid,
}

/// What the statement answered for a key it took: fresh (or taken over), and the stored provider
/// key. `None`: not taken (read the key's state).
pub(crate) type Taken = Option<(bool, Option<Uuid>)>;

struct BeginRequest(BeginCall, oneshot::Sender<Result<Taken>>);

struct FinishRequest {
    key: String,
    result: Value,
    reply: oneshot::Sender<Result<()>>,
}

pub(crate) struct LedgerBatch {
    begins: Grouper<BeginRequest>,
    finishes: Grouper<FinishRequest>,
}

/// A group: at most 500 calls; at most 2 statements of a kind in flight; 16 calls justify a
/// statement beside one already in flight.
const LIMITS: GroupLimits = GroupLimits { max: 500, in_flight: 2, worth: 16 };

impl LedgerBatch {
    /// Starts the two groupers. Needs a Tokio runtime.
    pub(crate) fn start(pool: PgPool, sql: Arc<Queries>) -> Self {
        let (begin_pool, begin_sql) = (pool.clone(), Arc::clone(&sql));
        let begins = Grouper::start(LIMITS, move |group| {
            let (pool, sql) = (begin_pool.clone(), Arc::clone(&begin_sql));
            async move { begin_group(&pool, &sql, group).await }
        });
        let finishes = Grouper::start(LIMITS, move |group| {
            let (pool, sql) = (pool.clone(), Arc::clone(&sql));
            async move { finish_group(&pool, &sql, group).await }
        });
        Self { begins, finishes }
    }

    pub(crate) async fn begin(&self, call: BeginCall) -> Result<Taken> {
        let (reply, answer) = oneshot::channel();
        self.begins.send(BeginRequest(call, reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    pub(crate) async fn finish(&self, key: String, result: Value) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.finishes.send(FinishRequest { key, result, reply }).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn stopped() -> Error {
    Error::temporary("postgres: the ledger's grouping stopped")
}

/// `ledger_begin.sql` on `calls` (distinct keys), sorted by key so that two statements lock their
/// rows in one order. Per key taken: fresh or not, and the stored provider key.
pub(crate) async fn begin_keys<'c>(
    executor: impl PgExecutor<'c>,
    sql: &Queries,
    calls: &[&BeginCall],
) -> Result<HashMap<String, (bool, Option<Uuid>)>> {
    let mut calls = calls.to_vec();
    calls.sort_by(|a, b| a.key.cmp(&b.key));
    let keys: Vec<&str> = calls.iter().map(|c| c.key.as_str()).collect();
    let prints: Vec<&str> = calls.iter().map(|c| c.fingerprint.as_str()).collect();
    let tokens: Vec<Uuid> = calls.iter().map(|c| c.token).collect();
    let secs: Vec<f64> = calls.iter().map(|c| c.secs).collect();
    let providers: Vec<Uuid> = calls.iter().map(|c| c.provider_key).collect();
    let rows = q(&sql.ledger_begin)
        .bind(&keys)
        .bind(&prints)
        .bind(&tokens)
        .bind(&secs)
        .bind(&providers)
        .fetch_all(executor)
        .await
        .map_err(|e| db(e, "ledger begin"))?;
    Ok(rows.iter().map(|r| (r.get::<String, _>("idempotency_key"), (r.get("fresh"), r.get("provider_key")))).collect())
}

async fn begin_group(pool: &PgPool, sql: &Queries, mut group: Vec<BeginRequest>) {
    // A key twice in one `INSERT … ON CONFLICT DO UPDATE` is an error: a second call of a key goes
    // in a statement after the first's.
    while !group.is_empty() {
        let mut seen = HashSet::new();
        let (now, later): (Vec<_>, Vec<_>) = group.into_iter().partition(|r| seen.insert(r.0.key.clone()));
        group = later;
        let calls: Vec<&BeginCall> = now.iter().map(|r| &r.0).collect();
        match begin_keys(pool, sql, &calls).await {
            Ok(mut taken) => {
                for BeginRequest(call, reply) in now {
                    let _ = reply.send(Ok(taken.remove(&call.key)));
                }
            }
            Err(e) => {
                for BeginRequest(_, reply) in now {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

async fn finish_group(pool: &PgPool, sql: &Queries, mut group: Vec<FinishRequest>) {
    // Sorted, so that two statements lock their rows in one order.
    group.sort_by(|a, b| a.key.cmp(&b.key));
    let keys: Vec<&str> = group.iter().map(|r| r.key.as_str()).collect();
    let results: Vec<&Value> = group.iter().map(|r| &r.result).collect();
    let done = q(&sql.ledger_finish).bind(&keys).bind(&results).execute(pool).await;
    let answer = done.map(drop).map_err(|e| db(e, "ledger finish"));
    for r in group {
        let _ = r.reply.send(answer.clone());
    }
}
