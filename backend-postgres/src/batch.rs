//! Group completion: concurrent `complete` calls share one fenced `UPDATE … FROM unnest(…)`,
//! grouped by the kit's [`Grouper`] (no timer, no added latency).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use redrive_core::kit::group::{GroupLimits, Grouper};
use redrive_core::{Error, Result};
use serde_json::Value;
use sqlx::{PgPool, Row};
use tokio::sync::{Semaphore, oneshot};
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
    grouper: Grouper<Request>,
}

/// A group: at most 1000 calls; at most 3 statements in flight; 32 calls justify a statement
/// beside one already in flight.
const LIMITS: GroupLimits = GroupLimits { max: 1000, in_flight: 3, worth: 32 };

impl Completer {
    /// Starts the completer; each of its statements takes one of `in_flight`'s permits.
    pub(crate) fn start(pool: PgPool, sql: Arc<Queries>, in_flight: Arc<Semaphore>) -> Self {
        let grouper = Grouper::start(LIMITS, move |batch| {
            let (pool, sql, in_flight) = (pool.clone(), Arc::clone(&sql), Arc::clone(&in_flight));
            async move {
                let statement = in_flight.acquire_owned().await;
                flush(&pool, &sql, batch).await;
                drop(statement);
            }
        });
        Self { grouper }
    }

    /// Marks job `id` done under lease `token`. `Ok(false)`: the lease is no longer current.
    pub(crate) async fn complete(&self, id: i64, token: Uuid, result: Option<Value>) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        self.grouper
            .send(Request { id, token, result, reply })
            .map_err(|_| Error::temporary("the completer stopped"))?;
        answer.await.map_err(|_| Error::temporary("the completer stopped"))?
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
            // By id and token: a stale lease's completion in the same batch as the current one
            // is told it changed nothing.
            let done: HashSet<(i64, Uuid)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            for r in batch {
                let _ = r.reply.send(Ok(done.contains(&(r.id, r.token))));
            }
        }
        Err(e) => fail(batch, e),
    }
}

/// Answers every call of a batch whose statement failed with the statement's error: its kind,
/// retry flag (a deadlock or a serialization failure is temporary, and the worker tries the
/// completion again; a broken statement is not) and source, shared rather than re-made.
fn fail(batch: Vec<Request>, e: sqlx::Error) {
    let e = db(e, "complete");
    for r in batch {
        let _ = r.reply.send(Err(e.clone()));
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use redrive_core::{ErrorKind, Retry};

    use super::*;

    /// A call waiting on the batch, and where its answer arrives.
    fn call(id: i64) -> (Request, oneshot::Receiver<Result<bool>>) {
        let (reply, answer) = oneshot::channel();
        (Request { id, token: Uuid::new_v4(), result: None, reply }, answer)
    }

    #[test]
    fn each_call_of_a_failed_batch_gets_the_statements_kind_retry_and_source() {
        let cases = [
            (sqlx::Error::Protocol("connection reset mid-statement".into()), ErrorKind::Backend, Retry::Temporary),
            (sqlx::Error::Decode("a column that does not decode".into()), ErrorKind::Decode, Retry::Permanent),
        ];
        for (error, kind, retry) in cases {
            let source = error.to_string();
            let ((first, a), (second, b)) = (call(1), call(2));
            fail(vec![first, second], error);
            for mut answer in [a, b] {
                let e = answer.try_recv().expect("answered").expect_err("the batch failed");
                assert_eq!((e.kind(), e.retry()), (kind, retry), "{e}");
                assert_eq!(e.message(), "postgres: complete");
                assert_eq!(e.source().map(|s| s.to_string()), Some(source.clone()));
            }
        }
    }
}
