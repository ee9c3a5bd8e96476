//! Order per key on the real PostgreSQL, where a claim's check reads only the ids between a job's
//! `order_prev` (its key's highest id at enqueue) and itself: producers that enqueue one key at
//! once, batches that carry several jobs of a key, and a key whose history is long, run its jobs
//! one at a time in id order.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{Enqueue, Job, JobContext, JobError, KeyBuilder, NewJob, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Event {
    account: u32,
    n: u32,
}

impl Job for Event {
    const KIND: &'static str = "account_event";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("account", self.account).fact("n", self.n)
    }
    fn order_key(&self) -> Option<String> {
        Some(format!("account:{}", self.account))
    }
}

fn event(account: u32, n: u32) -> NewJob {
    NewJob::from_job(&Event { account, n }).unwrap()
}

async fn claim(backend: &redrive_postgres::PgBackend) -> Vec<String> {
    let claimed = backend.claim(&Kinds::Any, 100, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    for c in &claimed {
        backend.complete(&c.lease, None).await.unwrap();
    }
    claimed.iter().map(|c| c.job.key.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_a_key_enqueued_by_racing_producers_run_one_at_a_time_in_id_order() {
    let backend = common::backend("order_race").await;
    // Two producers enqueue 40 events of one account each, at once, one job per call, with
    // events of other accounts in between.
    let producers: Vec<_> = (0..2u32)
        .map(|p| {
            let backend = backend.clone();
            tokio::spawn(async move {
                for i in 0..40 {
                    backend.enqueue(event(1, p * 100 + i)).await.unwrap();
                    backend.enqueue(event(10 + p, i)).await.unwrap();
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM \"{}\".jobs WHERE order_key = 'account:1' ORDER BY id",
        backend.schema()
    )))
    .fetch_all(backend.pool())
    .await
    .unwrap();
    assert_eq!(ids.len(), 80);

    let starts = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(Mutex::new((0usize, 0usize)));
    let handler = {
        let (starts, running) = (Arc::clone(&starts), Arc::clone(&running));
        move |job: Event, ctx: JobContext| {
            let (starts, running) = (Arc::clone(&starts), Arc::clone(&running));
            async move {
                if job.account == 1 {
                    starts.lock().unwrap().push(ctx.job_id.0.parse::<i64>().unwrap());
                    let mut r = running.lock().unwrap();
                    r.0 += 1;
                    r.1 = r.1.max(r.0);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                if job.account == 1 {
                    running.lock().unwrap().0 -= 1;
                }
                Ok::<(), JobError>(())
            }
        }
    };
    let config = WorkerConfig { concurrency: 8, poll: Duration::from_millis(50), ..WorkerConfig::default() };
    let workers: Vec<_> = (0..2)
        .map(|_| {
            Worker::builder(backend.clone(), backend.clone())
                .config(config.clone())
                .handle::<Event>(handler.clone())
                .build()
                .start()
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while starts.lock().unwrap().len() < 80 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for worker in workers {
        worker.shutdown().await;
    }
    assert_eq!(*starts.lock().unwrap(), ids, "account 1's events start once each, in id order");
    assert_eq!(running.lock().unwrap().1, 1, "account 1's events run one at a time across two workers");
}

#[tokio::test]
async fn a_batch_of_several_jobs_of_a_key_waits_for_the_key_and_runs_in_order() {
    let backend = common::backend("order_batch").await;
    backend.enqueue(event(1, 0)).await.unwrap();
    let first = backend.claim(&Kinds::Any, 100, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(first.len(), 1);
    backend.enqueue_batch(vec![event(1, 1), event(2, 0), event(1, 2), event(1, 3)]).await.unwrap();
    assert_eq!(claim(&backend).await, ["account_event:account=2:n=0"], "account 1 waits for its running job");
    backend.complete(&first[0].lease, None).await.unwrap();
    for n in 1..=3 {
        assert_eq!(claim(&backend).await, [format!("account_event:account=1:n={n}")], "one at a time, in order");
    }
    assert!(claim(&backend).await.is_empty());
}

#[tokio::test]
async fn a_key_with_a_long_history_reads_a_few_index_entries_per_claim() {
    let backend = common::backend("order_history").await;
    // 300 events of one account, each claimed and completed before the next is enqueued: the key
    // builds a history of finished jobs (and, until VACUUM, their dead index entries).
    for n in 0..300 {
        backend.enqueue(event(1, n)).await.unwrap();
        assert_eq!(claim(&backend).await.len(), 1);
    }
    backend.enqueue(event(1, 300)).await.unwrap();
    // The claim's check, as claim.sql makes it (a subplan per candidate), for the newest job.
    let sql = format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) SELECT EXISTS (SELECT 1 FROM \"{s}\".jobs e WHERE e.order_key = j.order_key \
         AND e.id >= j.order_prev AND e.id < j.id AND e.status <> 'done') FROM \"{s}\".jobs j \
         WHERE j.id = (SELECT max(id) FROM \"{s}\".jobs)",
        s = backend.schema()
    );
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_one(backend.pool()).await.unwrap();
    let text = plan.to_string();
    let probe = find(&plan[0]["Plan"], "e").expect("the probe is in the plan");
    let read = probe["Actual Rows"].as_f64().unwrap_or(0.0) + probe["Rows Removed by Filter"].as_f64().unwrap_or(0.0);
    // Through `jobs_order` or the primary key, whichever the planner prefers: either way a range
    // bounded by `order_prev`.
    assert!(probe["Index Cond"].as_str().is_some_and(|c| c.contains("order_prev")), "a bounded range: {text}");
    assert!(read <= 1.0, "the probe reads the job before it, not the key's 300 finished jobs: {text}");
    assert_eq!(claim(&backend).await, ["account_event:account=1:n=300"]);
}

/// The plan node scanning the relation aliased `alias`.
fn find<'p>(plan: &'p serde_json::Value, alias: &str) -> Option<&'p serde_json::Value> {
    if plan["Alias"] == alias {
        return Some(plan);
    }
    plan["Plans"].as_array()?.iter().find_map(|child| find(child, alias))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_in_an_open_transaction_holds_its_keys_later_enqueues_until_it_commits() {
    let backend = common::backend("order_tx").await;
    // The application's transaction enqueues A and stays open.
    let mut tx = backend.pool().begin().await.unwrap();
    backend.enqueue_in(&mut tx, event(1, 0)).await.unwrap();
    // Another request enqueues B of the same key meanwhile: it waits for A's transaction, so B
    // cannot draw an id, commit and run before A exists.
    let other = backend.clone();
    let b = tokio::spawn(async move { other.enqueue(event(1, 1)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_finished(), "B waits for the open transaction that enqueued A");
    assert!(claim(&backend).await.is_empty(), "nothing of the key is visible yet");
    tx.commit().await.unwrap();
    b.await.unwrap().unwrap();
    assert_eq!(claim(&backend).await, ["account_event:account=1:n=0"], "A first");
    assert_eq!(claim(&backend).await, ["account_event:account=1:n=1"], "then B");
    // Other keys never wait for it.
    let mut tx = backend.pool().begin().await.unwrap();
    backend.enqueue_in(&mut tx, event(1, 2)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), backend.enqueue(event(2, 0)))
        .await
        .expect("another key's enqueue does not wait")
        .unwrap();
    tx.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_one_keys_events_runs_without_waiting_for_polls() {
    let backend = common::backend("order_wake").await;
    let done = Arc::new(Mutex::new(0u32));
    let handler = {
        let done = Arc::clone(&done);
        move |_job: Event, _ctx: JobContext| {
            let done = Arc::clone(&done);
            async move {
                *done.lock().unwrap() += 1;
                Ok::<(), JobError>(())
            }
        }
    };
    // A poll longer than the whole chain may take: each next event starts on a wake-up (the
    // worker's own, or the notification a completion of an ordered job sends at commit).
    let config = WorkerConfig { concurrency: 4, poll: Duration::from_secs(4), ..WorkerConfig::default() };
    let worker =
        Worker::builder(backend.clone(), backend.clone()).config(config).handle::<Event>(handler).build().start();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = tokio::time::Instant::now();
    backend.enqueue_batch((0..5).map(|n| event(1, n)).collect()).await.unwrap();
    while *done.lock().unwrap() < 5 && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    worker.shutdown().await;
    assert_eq!(*done.lock().unwrap(), 5, "every event of the key ran");
    assert!(took < Duration::from_secs(3), "five events in a chain took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_ordered_job_and_a_freeing_discard_tell_the_workers_at_commit() {
    use redrive_core::DeadLetter;
    let backend = common::backend("order_notify").await;
    let mut listener = sqlx::postgres::PgListener::connect(&common::database_url()).await.unwrap();
    listener.listen(&format!("redrive_{}", backend.schema())).await.unwrap();
    // What the listener hears within `within`, after what came before is drained.
    async fn heard(listener: &mut sqlx::postgres::PgListener, within: Duration) -> bool {
        tokio::time::timeout(within, listener.recv()).await.is_ok()
    }
    let quiet =
        async |listener: &mut sqlx::postgres::PgListener| while heard(listener, Duration::from_millis(300)).await {};
    let claimed = |backend: &redrive_postgres::PgBackend| {
        let backend = backend.clone();
        async move { backend.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap() }
    };

    let unordered = NewJob::new(
        "plain",
        redrive_core::IdempotencyKey::builder("plain").fact("n", 1).build().unwrap(),
        serde_json::json!({}),
    )
    .unwrap();
    backend.enqueue(unordered).await.unwrap();
    quiet(&mut listener).await;
    let job = claimed(&backend).await;
    backend.complete(&job[0].lease, None).await.unwrap();
    assert!(!heard(&mut listener, Duration::from_millis(500)).await, "a job without an order key wakes nobody");

    backend.enqueue(event(1, 0)).await.unwrap();
    quiet(&mut listener).await;
    let job = claimed(&backend).await;
    backend.complete(&job[0].lease, None).await.unwrap();
    assert!(heard(&mut listener, Duration::from_secs(2)).await, "the next job of the key may run: the workers hear it");

    backend.enqueue(event(1, 1)).await.unwrap();
    let job = claimed(&backend).await;
    backend.dead_letter(&job[0], "the CRM said no").await.unwrap();
    quiet(&mut listener).await;
    let record = backend.blocked().await.unwrap()[0].record.clone();
    backend.discard(&record, "superseded", "ada").await.unwrap();
    assert!(heard(&mut listener, Duration::from_secs(2)).await, "the discard freed the key: the workers hear it");
}
