//! What the conformance suite does not reach: the broker record store, enqueue in the
//! application's transaction, wake-ups within a process and across processes, and order per key
//! kept by two processes on one file.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{DeadLetter, Enqueue, IdempotencyKey, NewJob, QueueStats};
use redrive_sqlite::{SqliteBackend, SqliteConfig};

fn job(n: u32) -> NewJob {
    let key = IdempotencyKey::builder("ship").fact("parcel", n).build().unwrap();
    NewJob::new("ship", key, serde_json::json!({ "parcel": n })).unwrap()
}

fn ordered(n: u32, order: &str) -> NewJob {
    job(n).with_order_key(order).unwrap()
}

fn parcel(claimed: &redrive_core::kit::Claimed) -> u32 {
    claimed.job.payload["parcel"].as_u64().unwrap() as u32
}

#[tokio::test]
async fn as_a_broker_record_store_it_passes_the_checks_every_store_passes() {
    let (store, _dir) = common::backend().await;
    redrive_conformance::check_record_store(&store).await;
}

#[tokio::test]
async fn an_enqueue_in_the_applications_transaction_exists_only_if_it_commits() {
    let (backend, _dir) = common::backend().await;
    let mut tx = backend.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert!(backend.enqueue_in(&mut tx, job(1)).await.unwrap().is_created());
    tx.rollback().await.unwrap();
    assert_eq!(backend.counts().await.unwrap().queued, 0, "rolled back with the transaction");

    let mut tx = backend.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    backend.enqueue_in(&mut tx, job(1)).await.unwrap();
    tx.commit().await.unwrap();
    backend.wake();
    assert_eq!(backend.counts().await.unwrap().queued, 1);
    assert!(!backend.enqueue(job(1)).await.unwrap().is_created(), "the key dedupes as any enqueue's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_wakes_at_once_for_this_process_and_by_polling_for_another() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let poll = Duration::from_millis(300);
    let here = SqliteBackend::open(SqliteConfig::new(&path).with_poll(Duration::from_secs(30))).await.unwrap();
    // Another process's view of the file: its own connections, its own wake-ups.
    let there = SqliteBackend::open(SqliteConfig::new(&path).with_poll(poll)).await.unwrap();

    let waiting = tokio::spawn({
        let here = here.clone();
        async move { here.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::from_secs(30)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    here.enqueue(job(1)).await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap().len(), 1);
    // Its poll is 30 s: found sooner, it was woken.
    assert!(started.elapsed() < Duration::from_secs(5), "woken by the enqueue: {:?}", started.elapsed());

    let waiting = tokio::spawn({
        let there = there.clone();
        async move { there.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::from_secs(30)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    here.enqueue(job(2)).await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap().len(), 1);
    // Its wait is 30 s: found sooner, its polling found it.
    assert!(started.elapsed() < Duration::from_secs(5), "found by polling: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_job_of_an_order_key_is_claimed_at_once_when_the_one_before_completes_or_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    // A poll of 30 s: a claim that finds the next job within seconds was woken.
    let backend = SqliteBackend::open(SqliteConfig::new(dir.path().join("jobs.db")).with_poll(Duration::from_secs(30)))
        .await
        .unwrap();
    let lease = Duration::from_secs(30);
    backend.enqueue_batch(vec![ordered(1, "account1"), ordered(2, "account1"), ordered(3, "account1")]).await.unwrap();
    let first = backend.claim(&Kinds::Any, 10, lease, Duration::ZERO).await.unwrap();
    assert_eq!(first.iter().map(parcel).collect::<Vec<_>>(), [1], "one job of the order key at a time, the first");

    let wait_for_next = || {
        let backend = backend.clone();
        tokio::spawn(async move { backend.claim(&Kinds::Any, 10, lease, Duration::from_secs(30)).await.unwrap() })
    };
    let waiting = wait_for_next();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "job 2 waits while job 1 runs");
    let started = Instant::now();
    backend.complete(&first[0].lease, None).await.unwrap();
    let second = waiting.await.unwrap();
    assert_eq!(second.iter().map(parcel).collect::<Vec<_>>(), [2]);
    assert!(started.elapsed() < Duration::from_secs(5), "woken by the completion: {:?}", started.elapsed());

    let record = backend.dead_letter(&second[0], "the provider refused it").await.unwrap().unwrap();
    let blocked = backend.blocked().await.unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!((blocked[0].order_key.as_str(), &blocked[0].record, blocked[0].waiting), ("account1", &record.id, 1));
    assert_eq!(blocked[0].key, record.key);

    let waiting = wait_for_next();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "job 3 waits while job 2's record is open");
    let started = Instant::now();
    backend.discard(&record.id, "superseded", "ana").await.unwrap();
    let third = waiting.await.unwrap();
    assert_eq!(third.iter().map(parcel).collect::<Vec<_>>(), [3]);
    assert!(started.elapsed() < Duration::from_secs(5), "woken by the discard: {:?}", started.elapsed());
    assert!(backend.blocked().await.unwrap().is_empty(), "a discarded record holds nothing back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_on_one_file_run_an_order_keys_jobs_one_at_a_time_in_enqueue_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    // Three order keys of ten jobs each, interleaved, and ten jobs without one.
    let order_of = |n: u32| (n < 30).then(|| format!("account{}", n % 3));
    let jobs: Vec<NewJob> = (0..40).map(|n| order_of(n).map_or_else(|| job(n), |order| ordered(n, &order))).collect();
    let open = || SqliteBackend::open(SqliteConfig::new(&path).with_poll(Duration::from_millis(20)));
    let backends = [open().await.unwrap(), open().await.unwrap()];
    backends[0].enqueue_batch(jobs).await.unwrap();

    // Per order key: how many of its jobs run now, the most that ever did, and the start order.
    let running: Arc<Mutex<HashMap<String, (usize, usize)>>> = Arc::default();
    let starts: Arc<Mutex<Vec<u32>>> = Arc::default();
    let mut processes = tokio::task::JoinSet::new();
    for backend in backends {
        let (running, starts) = (Arc::clone(&running), Arc::clone(&starts));
        processes.spawn(async move {
            let mut ran = 0;
            let mut busy = Instant::now();
            while busy.elapsed() < Duration::from_secs(2) {
                let claimed =
                    backend.claim(&Kinds::Any, 4, Duration::from_secs(30), Duration::from_millis(100)).await.unwrap();
                if claimed.is_empty() {
                    continue;
                }
                busy = Instant::now();
                ran += claimed.len();
                let mut handlers = tokio::task::JoinSet::new();
                for claimed in claimed {
                    let (backend, running, starts) = (backend.clone(), Arc::clone(&running), Arc::clone(&starts));
                    handlers.spawn(async move {
                        let n = parcel(&claimed);
                        if let Some(order) = order_of(n) {
                            let mut running = running.lock().unwrap();
                            let (now, most) = running.entry(order).or_default();
                            *now += 1;
                            *most = (*most).max(*now);
                        }
                        starts.lock().unwrap().push(n);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        if let Some(order) = order_of(n) {
                            running.lock().unwrap().get_mut(&order).unwrap().0 -= 1;
                        }
                        // Done only after it stopped "running": the next of its key may start then.
                        backend.complete(&claimed.lease, None).await.unwrap();
                    });
                }
                handlers.join_all().await;
            }
            ran
        });
    }
    // Each process stops after 2 s with nothing to claim.
    let ran = tokio::time::timeout(Duration::from_secs(60), processes.join_all()).await.expect("the jobs ran out");
    assert!(ran.iter().all(|n| *n > 0), "both processes ran jobs: {ran:?}");

    let starts = starts.lock().unwrap().clone();
    let mut all = starts.clone();
    all.sort_unstable();
    assert_eq!(all, (0..40).collect::<Vec<_>>(), "every job ran once");
    for key in 0..3 {
        let order = format!("account{key}");
        let seen: Vec<u32> =
            starts.iter().copied().filter(|n| order_of(*n).as_deref() == Some(order.as_str())).collect();
        let expected: Vec<u32> = (0..30).filter(|n| n % 3 == key).collect();
        assert_eq!(seen, expected, "{order}'s jobs start in enqueue order");
        let most = running.lock().unwrap()[&order].1;
        assert_eq!(most, 1, "{order}'s jobs run one at a time; {most} ran at once");
    }
}

#[tokio::test]
async fn a_purged_record_no_longer_holds_its_order_key_back() {
    let (backend, _dir) = common::backend().await;
    let lease = Duration::from_secs(30);
    backend.enqueue_batch(vec![ordered(1, "account1"), ordered(2, "account1"), job(3)]).await.unwrap();
    let claimed = backend.claim(&Kinds::Any, 10, lease, Duration::ZERO).await.unwrap();
    assert_eq!(claimed.iter().map(parcel).collect::<Vec<_>>(), [1, 3], "job 2 waits behind job 1");
    backend.complete(&claimed[1].lease, None).await.unwrap();
    backend.dead_letter(&claimed[0], "the provider refused it").await.unwrap();
    assert!(backend.claim(&Kinds::Any, 10, lease, Duration::ZERO).await.unwrap().is_empty(), "held by the record");
    assert_eq!(backend.blocked().await.unwrap().len(), 1);

    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(backend.purge(Duration::ZERO).await.unwrap(), 1);
    assert!(backend.blocked().await.unwrap().is_empty(), "the purged record holds nothing back");
    let next = backend.claim(&Kinds::Any, 10, lease, Duration::ZERO).await.unwrap();
    assert_eq!(next.iter().map(parcel).collect::<Vec<_>>(), [2]);
}

#[tokio::test]
async fn a_file_from_before_order_per_key_opens_and_its_queued_jobs_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let backend = SqliteBackend::open(SqliteConfig::new(&path)).await.unwrap();
    backend.enqueue_batch(vec![job(1), job(2)]).await.unwrap();
    // Back to the file as the release before it left it: migrations 9 and 6 undone, by hand.
    let undo = format!(
        "{UNDO_PRIORITIES}
                DROP INDEX redrive_jobs_order;
                DROP INDEX redrive_jobs_ready;
                CREATE INDEX redrive_jobs_ready ON redrive_jobs (ready_at, id) WHERE status = 'queued';
                ALTER TABLE redrive_jobs DROP COLUMN order_key;
                DELETE FROM _sqlx_migrations WHERE version = 6;"
    );
    redrive_sqlite::sqlx::raw_sql(redrive_sqlite::sqlx::AssertSqlSafe(undo)).execute(backend.pool()).await.unwrap();
    backend.pool().close().await;
    drop(backend);

    let backend = SqliteBackend::open(SqliteConfig::new(&path)).await.unwrap();
    backend.enqueue_batch(vec![ordered(3, "account1"), ordered(4, "account1")]).await.unwrap();
    let claimed = backend.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(claimed.iter().map(parcel).collect::<Vec<_>>(), [1, 2, 3], "the jobs from before run; 4 waits for 3");
}

/// Migration 9 undone, by hand: the file as the release before priorities left it.
const UNDO_PRIORITIES: &str = "DROP TRIGGER redrive_jobs_priority;
    DROP TABLE redrive_priorities;
    DROP INDEX redrive_jobs_ready;
    CREATE INDEX redrive_jobs_ready ON redrive_jobs (ready_at, id, order_key) WHERE status = 'queued';
    ALTER TABLE redrive_jobs DROP COLUMN priority;
    DELETE FROM _sqlx_migrations WHERE version = 9;";

#[tokio::test]
async fn claims_take_the_highest_priority_first_and_a_file_from_before_priorities_keeps_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let backend = SqliteBackend::open(SqliteConfig::new(&path)).await.unwrap();
    backend.enqueue_batch(vec![job(1), job(2)]).await.unwrap();
    redrive_sqlite::sqlx::raw_sql(UNDO_PRIORITIES).execute(backend.pool()).await.unwrap();
    backend.pool().close().await;
    drop(backend);

    let backend = SqliteBackend::open(SqliteConfig::new(&path)).await.unwrap();
    let prioritised = [(3, -5), (4, 20), (5, 0), (6, 20), (7, -5)];
    let batch = prioritised.iter().map(|(n, p)| job(*n).with_priority(*p).unwrap()).collect();
    backend.enqueue_batch(batch).await.unwrap();
    backend.enqueue(job(8).with_priority(100).unwrap()).await.unwrap();
    let lease = Duration::from_secs(30);
    let first = backend.claim(&Kinds::Any, 4, lease, Duration::ZERO).await.unwrap();
    let rest = backend.claim(&Kinds::Any, 10, lease, Duration::ZERO).await.unwrap();
    let order = |claimed: &[redrive_core::kit::Claimed]| -> Vec<(u32, i16)> {
        claimed.iter().map(|c| (parcel(c), c.job.priority)).collect()
    };
    assert_eq!(order(&first), [(8, 100), (4, 20), (6, 20), (1, 0)], "the first batch, in claim order");
    assert_eq!(order(&rest), [(2, 0), (5, 0), (3, -5), (7, -5)], "the jobs from before run at 0");
    let refused = backend.enqueue(NewJob { priority: -101, ..job(9) }).await.unwrap_err();
    assert_eq!(refused.kind(), redrive_core::ErrorKind::InvalidInput, "{refused}");

    // The counts read every priority: one scheduled at 5, one ready at -5.
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    backend.enqueue(job(10).with_priority(5).unwrap().run_at(later)).await.unwrap();
    backend.enqueue(job(11).with_priority(-5).unwrap()).await.unwrap();
    let counts = backend.counts().await.unwrap();
    assert_eq!((counts.queued, counts.scheduled, counts.running), (2, Some(1), 8));
    assert!(counts.oldest_ready.is_some(), "the job at -5 is ready");
}

/// Completions that arrive together are written together, and each caller still hears its own
/// answer: the jobs whose lease was taken again are refused as lost and stay with their new
/// holder, the rest are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completions_written_together_each_get_their_own_answer() {
    let (backend, _dir) = common::backend().await;
    backend.enqueue_batch((0..60).map(job).collect()).await.unwrap();
    // 30 claimed on a lease that lapses, then taken again by a second claim.
    let lapsed = backend.claim(&Kinds::Any, 30, Duration::from_millis(50), Duration::ZERO).await.unwrap();
    let rest = backend.claim(&Kinds::Any, 30, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let retaken = backend.claim(&Kinds::Any, 30, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!((lapsed.len(), retaken.len(), rest.len()), (30, 30, 30));
    let mut retaken_parcels: Vec<u32> = retaken.iter().map(parcel).collect();
    retaken_parcels.sort_unstable();
    assert_eq!(retaken_parcels, lapsed.iter().map(parcel).collect::<Vec<_>>(), "the lapsed jobs, taken again");

    // Every completion at once: the stale leases' and the fresh ones' interleaved.
    let calls: Vec<_> = lapsed
        .iter()
        .zip(&rest)
        .flat_map(|(stale, fresh)| [(stale.clone(), false), (fresh.clone(), true)])
        .map(|(claimed, fresh)| {
            let backend = backend.clone();
            tokio::spawn(async move { (fresh, backend.complete(&claimed.lease, None).await) })
        })
        .collect();
    for call in calls {
        let (fresh, result) = call.await.unwrap();
        match (fresh, result) {
            (true, Ok(())) => {}
            (false, Err(e)) if e.kind() == redrive_core::ErrorKind::LeaseLost => {}
            (fresh, result) => panic!("fresh lease: {fresh}, answer: {result:?}"),
        }
    }
    let counts = backend.counts().await.unwrap();
    assert_eq!((counts.queued, counts.running), (0, 30), "the retaken jobs are still running: {counts:?}");
    // Their new holder completes them.
    for claimed in &retaken {
        backend.complete(&claimed.lease, None).await.unwrap();
    }
    assert_eq!(backend.counts().await.unwrap().running, 0);
}
