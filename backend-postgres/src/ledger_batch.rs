//! Grouped ledger writes: concurrent `begin`s share one `INSERT … FROM unnest(…)` and concurrent
//! `finish`es one `UPDATE … FROM unnest(…)`, so a broker's workers (SQS, Azure, QStash, pgmq),
//! whose ledger this is, pay one commit per group rather than two per job.
//! Grouped by the kit's [`Grouper`], as completions are (no timer, no added latency).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use redrive_core::kit::group::{GroupLimits, Grouper};
use redrive_core::{Error, Result};
use serde_json::Value;
use sqlx::{PgPool, Row};
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

enum Call {
    Begin(BeginCall, oneshot::Sender<Result<Taken>>),
    Finish(String, Value, oneshot::Sender<Result<()>>),
}

pub(crate) struct LedgerBatch {
    begins: Grouper<Call>,
    finishes: Grouper<Call>,
}

/// A group: at most 500 calls; at most 2 statements of a kind in flight; 16 calls justify a
/// statement beside one already in flight.
const LIMITS: GroupLimits = GroupLimits { max: 500, in_flight: 2, worth: 16 };

impl LedgerBatch {
    /// Starts the two groupers. Needs a Tokio runtime.
    pub(crate) fn start(pool: PgPool, sql: Arc<Queries>) -> Self {
        let grouper = || {
            let (pool, sql) = (pool.clone(), Arc::clone(&sql));
            Grouper::start(LIMITS, move |group| {
                let (pool, sql) = (pool.clone(), Arc::clone(&sql));
                async move { flush(&pool, &sql, group).await }
            })
        };
        Self { begins: grouper(), finishes: grouper() }
    }

    pub(crate) async fn begin(&self, call: BeginCall) -> Result<Taken> {
        let (reply, answer) = oneshot::channel();
        self.begins.send(Call::Begin(call, reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    pub(crate) async fn finish(&self, key: String, result: Value) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.finishes.send(Call::Finish(key, result, reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn stopped() -> Error {
    Error::temporary("postgres: the ledger's grouping stopped")
}

async fn flush(pool: &PgPool, sql: &Queries, mut group: Vec<Call>) {
    // A key twice in one `INSERT … ON CONFLICT DO UPDATE` is an error: a second call of a key goes
    // in a statement after the first's.
    while !group.is_empty() {
        let mut seen = HashSet::new();
        let (now, later): (Vec<Call>, Vec<Call>) = group.into_iter().partition(|c| seen.insert(key_of(c).to_owned()));
        group = later;
        let mut now = now;
        now.sort_by(|a, b| key_of(a).cmp(key_of(b)));
        match now.first() {
            Some(Call::Begin(..)) => begin_group(pool, sql, now).await,
            Some(Call::Finish(..)) => finish_group(pool, sql, now).await,
            None => return,
        }
    }
}

fn key_of(call: &Call) -> &str {
    match call {
        Call::Begin(c, _) => &c.key,
        Call::Finish(key, ..) => key,
    }
}

async fn begin_group(pool: &PgPool, sql: &Queries, group: Vec<Call>) {
    let calls: Vec<(BeginCall, oneshot::Sender<Result<Taken>>)> = group
        .into_iter()
        .filter_map(|c| match c {
            Call::Begin(call, reply) => Some((call, reply)),
            Call::Finish(..) => None,
        })
        .collect();
    let keys: Vec<&str> = calls.iter().map(|(c, _)| c.key.as_str()).collect();
    let prints: Vec<&str> = calls.iter().map(|(c, _)| c.fingerprint.as_str()).collect();
    let tokens: Vec<Uuid> = calls.iter().map(|(c, _)| c.token).collect();
    let secs: Vec<f64> = calls.iter().map(|(c, _)| c.secs).collect();
    let providers: Vec<Uuid> = calls.iter().map(|(c, _)| c.provider_key).collect();
    let rows =
        q(&sql.ledger_begin).bind(&keys).bind(&prints).bind(&tokens).bind(&secs).bind(&providers).fetch_all(pool).await;
    match rows {
        Ok(rows) => {
            let mut taken: HashMap<String, (bool, Option<Uuid>)> = rows
                .iter()
                .map(|r| (r.get::<String, _>("idempotency_key"), (r.get("fresh"), r.get("provider_key"))))
                .collect();
            for (call, reply) in calls {
                let _ = reply.send(Ok(taken.remove(&call.key)));
            }
        }
        Err(e) => {
            let e = db(e, "ledger begin");
            for (_, reply) in calls {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

async fn finish_group(pool: &PgPool, sql: &Queries, group: Vec<Call>) {
    let calls: Vec<(String, Value, oneshot::Sender<Result<()>>)> = group
        .into_iter()
        .filter_map(|c| match c {
            Call::Finish(key, result, reply) => Some((key, result, reply)),
            Call::Begin(..) => None,
        })
        .collect();
    let keys: Vec<&str> = calls.iter().map(|(k, ..)| k.as_str()).collect();
    let results: Vec<Value> = calls.iter().map(|(_, r, _)| r.clone()).collect();
    let done = q(&sql.ledger_finish).bind(&keys).bind(&results).execute(pool).await;
    let answer = done.map(drop).map_err(|e| db(e, "ledger finish"));
    for (.., reply) in calls {
        let _ = reply.send(answer.clone());
    }
}
