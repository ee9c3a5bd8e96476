//! Enqueue on the real PostgreSQL: what a batch creates, skips and refuses, and how long a key
//! dedupes (until its done job is pruned).

mod common;

use std::time::Duration;

use redrive_core::kit::Claim;
use redrive_core::{Counts, Enqueue, Enqueued, ErrorKind, Job, KeyBuilder, NewJob, QueueStats, QueueStatsExt};
use serde::{Deserialize, Serialize};
use sqlx::Row;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    order: u32,
    note: String,
}

impl Job for Receipt {
    const KIND: &'static str = "receipt";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

fn receipt(order: u32, note: &str) -> NewJob {
    NewJob::from_job(&Receipt { order, note: note.into() }).unwrap()
}

async fn rows(backend: &redrive_postgres::PgBackend, table: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM \"{}\".{table}", backend.schema());
    sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(backend.pool()).await.unwrap().get(0)
}

#[tokio::test]
async fn a_batch_creates_each_key_once_in_order_and_skips_existing_keys() {
    let backend = common::backend("batch").await;
    let first = receipt(1, "a");
    let existing = backend.enqueue(first.clone()).await.unwrap();
    // A duplicate answers with the provider key stored with the job, not the one it offered.
    let again = backend.enqueue(receipt(1, "a")).await.unwrap();
    let stored = Some(first.provider_key);
    assert_eq!(again, Enqueued::Duplicate { id: existing.id().clone(), provider_key: stored });

    let batch = vec![receipt(3, "c"), receipt(1, "a"), receipt(2, "b"), receipt(3, "c")];
    let first_of_3 = Some(batch[0].provider_key);
    let results = backend.enqueue_batch(batch).await.unwrap();
    assert!(matches!(results[0], Enqueued::Created(_)), "{results:?}");
    let dup = Enqueued::Duplicate { id: existing.id().clone(), provider_key: stored };
    assert_eq!(results[1], dup, "an existing key is a duplicate");
    assert!(matches!(results[2], Enqueued::Created(_)), "{results:?}");
    let dup = Enqueued::Duplicate { id: results[0].id().clone(), provider_key: first_of_3 };
    assert_eq!(results[3], dup, "the first copy in a batch creates the job");

    let jobs = rows(&backend, "jobs").await;
    assert_eq!(jobs, 3, "one job row per key");

    // Jobs run in the order they were enqueued.
    let claimed =
        backend.claim(&redrive_core::kit::Kinds::Any, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    let orders: Vec<u64> = claimed.iter().map(|c| c.job.payload["order"].as_u64().unwrap()).collect();
    assert_eq!(orders, [1, 3, 2]);
}

#[tokio::test]
async fn a_batch_that_reuses_a_key_with_another_payload_writes_nothing() {
    let backend = common::backend("batch_conflict").await;
    backend.enqueue(receipt(1, "a")).await.unwrap();

    let err = backend.enqueue_batch(vec![receipt(2, "b"), receipt(1, "changed")]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::KeyConflict, "{err}");
    let err = backend.enqueue_batch(vec![receipt(3, "c"), receipt(3, "changed")]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::KeyConflict, "{err}");

    let keys = rows(&backend, "job_keys").await;
    assert_eq!(keys, 1, "neither batch left a key or a job behind");
    let single = backend.enqueue(receipt(1, "changed")).await.unwrap_err();
    assert_eq!(single.kind(), ErrorKind::KeyConflict, "{single}");
}

#[tokio::test]
async fn pruning_done_jobs_frees_their_keys_and_leaves_the_rest() {
    let backend = common::backend("prune").await;
    for order in 1..=3 {
        backend.enqueue(receipt(order, "r")).await.unwrap();
    }
    let claimed =
        backend.claim(&redrive_core::kit::Kinds::Any, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(claimed.len(), 3);
    for job in claimed.iter().filter(|c| c.job.payload["order"] != 3) {
        backend.complete(&job.lease, None).await.unwrap();
    }

    assert_eq!(backend.prune_done(Duration::from_secs(3600)).await.unwrap(), 0, "nothing is an hour old");
    assert_eq!(backend.prune_done(Duration::ZERO).await.unwrap(), 2, "the two done jobs");

    // A pruned key makes a new job; the running job's key still dedupes.
    assert!(matches!(backend.enqueue(receipt(1, "r")).await.unwrap(), Enqueued::Created(_)));
    assert!(matches!(backend.enqueue(receipt(3, "r")).await.unwrap(), Enqueued::Duplicate { .. }));
    let jobs = rows(&backend, "jobs").await;
    assert_eq!(jobs, 2, "the running job and the new one");
}

fn queued_running(counts: Counts) -> (u64, u64) {
    (counts.queued, counts.running)
}

#[tokio::test]
async fn counts_follow_jobs_from_queued_to_running_to_done() {
    let backend = common::backend("counts").await;
    for order in 1..=3 {
        backend.enqueue(receipt(order, "r")).await.unwrap();
    }
    assert_eq!(queued_running(backend.counts().await.unwrap()), (3, 0));
    let claimed =
        backend.claim(&redrive_core::kit::Kinds::Any, 2, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(queued_running(backend.counts().await.unwrap()), (1, 2));
    backend.retry(&claimed[0].lease, Duration::from_secs(60), "later").await.unwrap();
    backend.complete(&claimed[1].lease, None).await.unwrap();
    let left = backend.wait_until_drained(Duration::from_millis(200)).await.unwrap();
    assert_eq!(queued_running(left), (2, 0), "a job waiting out its retry delay is queued");
    assert_eq!(left.scheduled, Some(1), "and scheduled");
    assert!(left.oldest_ready.is_some(), "the other one is ready and waiting");
    let last =
        backend.claim(&redrive_core::kit::Kinds::Any, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(last.len(), 1);
    backend.complete(&last[0].lease, None).await.unwrap();
    assert_eq!(queued_running(backend.counts().await.unwrap()), (1, 0));
}

#[tokio::test]
async fn prune_done_keeps_alert_keys_and_purge_takes_them_with_their_records() {
    use redrive_core::kit::Ledger;
    use redrive_core::{IdempotencyKey, ProviderKey};
    let backend = common::backend("alertkeys").await;
    let done = |key: &IdempotencyKey| {
        let (backend, key) = (backend.clone(), key.clone());
        async move {
            let redrive_core::kit::Begin::Fresh(hold) = backend
                .begin(&key, &serde_json::json!({}), ProviderKey::mint(), Duration::from_secs(30))
                .await
                .unwrap()
            else {
                panic!("a new key is fresh")
            };
            backend.finish(&hold, &serde_json::Value::Null).await.unwrap();
        }
    };
    // An alert key as the worker writes it for record 1, and another queue's job key.
    let alert = IdempotencyKey::builder("redrive_alert").fact("record", 1).fact("sink", 0).build().unwrap();
    let reminder = IdempotencyKey::builder("redrive_alert")
        .fact("record", 1)
        .fact("sink", 3)
        .fact("reminder", 16)
        .build()
        .unwrap();
    let other = IdempotencyKey::builder("sqs_job").fact("n", 1).build().unwrap();
    done(&alert).await;
    done(&reminder).await;
    done(&other).await;
    let keys = || {
        let backend = backend.clone();
        async move {
            let sql = format!("SELECT idempotency_key FROM \"{}\".processed_keys ORDER BY 1", backend.schema());
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(backend.pool()).await.unwrap();
            rows.iter().map(|r| r.get::<String, _>(0)).collect::<Vec<_>>()
        }
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    backend.prune_done(Duration::ZERO).await.unwrap();
    assert_eq!(
        keys().await,
        [reminder.to_string(), alert.to_string()],
        "other keys are pruned; the alert keys stay with their record"
    );

    // A record with id 1, then its purge: its alert key goes with it.
    let job = NewJob::from_job(&Receipt { order: 1, note: "x".into() }).unwrap();
    backend.enqueue(job).await.unwrap();
    let claimed =
        backend.claim(&redrive_core::kit::Kinds::Any, 1, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    let record = backend.dead_letter(&claimed[0], "declined").await.unwrap().unwrap();
    assert_eq!(record.id.0, "1");
    tokio::time::sleep(Duration::from_millis(20)).await;
    use redrive_core::DeadLetter;
    assert_eq!(backend.purge(Duration::ZERO).await.unwrap(), 1);
    assert!(keys().await.is_empty(), "the purged record's alert and reminder keys are gone");
}

/// Producers enqueueing at once share transactions (grouped enqueues), but each gets its own
/// answer: every new key created once, a producer reusing a key with another payload refused
/// alone, and its neighbours in the same group unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_each_get_their_own_answer() {
    let backend = common::backend("grouped").await;
    let mut producers = tokio::task::JoinSet::new();
    for order in 0..200u32 {
        let first = backend.clone();
        producers.spawn(async move { (order, "a", first.enqueue(receipt(order, "a")).await) });
        // Every tenth order also sent with another payload, and every fifth again as it was.
        if order % 10 == 0 {
            let other = backend.clone();
            producers.spawn(async move { (order, "b", other.enqueue(receipt(order, "b")).await) });
        }
        if order % 5 == 0 {
            let again = backend.clone();
            producers.spawn(async move { (order, "a", again.enqueue(receipt(order, "a")).await) });
        }
    }
    let mut by_order: std::collections::HashMap<u32, Vec<(&str, redrive_core::Result<Enqueued>)>> = Default::default();
    while let Some(done) = producers.join_next().await {
        let (order, note, answer) = done.unwrap();
        by_order.entry(order).or_default().push((note, answer));
    }
    for (order, answers) in &by_order {
        let created: Vec<&str> =
            answers.iter().filter(|(_, a)| matches!(a, Ok(Enqueued::Created(_)))).map(|(n, _)| *n).collect();
        assert_eq!(created.len(), 1, "order {order}: one job created, {answers:?}");
        for (note, answer) in answers {
            match answer {
                Ok(Enqueued::Created(_)) => {}
                Ok(Enqueued::Duplicate { .. }) => {
                    assert_eq!(*note, created[0], "order {order}: a duplicate has the payload")
                }
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::KeyConflict, "order {order}: {e}");
                    assert_ne!(*note, created[0], "order {order}: only the other payload conflicts");
                }
                other => panic!("order {order}: {other:?}"),
            }
        }
    }
    assert_eq!(rows(&backend, "jobs").await, 200, "one job per order");
}
