//! What the conformance suite does not reach: the broker record store, enqueue in the
//! application's transaction, and wake-ups within a process and across processes.

mod common;

use std::time::{Duration, Instant};

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{Enqueue, IdempotencyKey, NewJob, QueueStats};
use redrive_sqlite::{SqliteBackend, SqliteConfig};

fn job(n: u32) -> NewJob {
    let key = IdempotencyKey::builder("ship").fact("parcel", n).build().unwrap();
    NewJob::new("ship", key, serde_json::json!({ "parcel": n })).unwrap()
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
