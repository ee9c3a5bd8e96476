//! What the conformance suite does not reach: the broker record store, enqueue in the
//! application's transaction, and wake-ups within a process and across processes.

mod common;

use std::time::{Duration, Instant};

use redrive_conformance::sample_record as record;
use redrive_core::{
    Claim, Enqueue, FailureQuery, IdempotencyKey, Kinds, NewJob, QueueStats, RecordState, RecordStore, Taken,
};
use redrive_sqlite::{SqliteBackend, SqliteConfig};

fn job(n: u32) -> NewJob {
    let key = IdempotencyKey::builder("ship").fact("parcel", n).build().unwrap();
    NewJob::new("ship", key, serde_json::json!({ "parcel": n })).unwrap()
}

#[tokio::test]
async fn as_a_broker_record_store_a_take_is_exclusive_given_back_or_closed_and_records_are_kept_once() {
    let (store, _dir) = common::backend().await;
    let queue = "arn:aws:sqs:us-east-1:000000000000:jobs";
    let records = [record(1, serde_json::json!({"parcel": 1})), record(2, serde_json::json!({"note": "say \"hi\"\n"}))];
    assert_eq!(store.keep_records(queue, &records).await.unwrap(), 2);
    assert_eq!(store.keep_records(queue, &records).await.unwrap(), 0, "kept once by id");
    assert_eq!(store.open_records("another-queue").await.unwrap(), 0, "scoped by queue");
    assert_eq!(store.record(queue, &records[1].id).await.unwrap(), records[1], "read back as written");

    let id = &records[0].id;
    let window = Duration::from_secs(300);
    assert!(matches!(store.take_for_replay(queue, id, window).await.unwrap(), Taken::Record(_)));
    let second = store.take_for_replay(queue, id, window).await.unwrap();
    assert!(matches!(second, Taken::Closed(RecordState::Replayed { .. })), "{second:?}");
    assert_eq!(store.open_records(queue).await.unwrap(), 1, "a taken record is not open");
    // A send that surely failed gives the take back: open again at once.
    assert_eq!(store.close_record(queue, id, &RecordState::Open).await.unwrap(), None);
    assert_eq!(store.record(queue, id).await.unwrap().state, RecordState::Open);
    assert!(matches!(store.take_for_replay(queue, id, window).await.unwrap(), Taken::Record(_)));
    let replayed = RecordState::Replayed { at: chrono::Utc::now() };
    assert_eq!(store.close_record(queue, id, &replayed).await.unwrap(), None);
    let discarded = RecordState::Discarded { at: chrono::Utc::now(), reason: "dup".into(), actor: "ops".into() };
    let before = store.close_record(queue, id, &discarded).await.unwrap();
    assert!(matches!(before, Some(RecordState::Replayed { .. })), "a replayed record stays replayed: {before:?}");

    // A take whose replayer died reads as open once its window lapses.
    let other = &records[1].id;
    assert!(matches!(store.take_for_replay(queue, other, Duration::ZERO).await.unwrap(), Taken::Record(_)));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.record(queue, other).await.unwrap().state, RecordState::Open);
    let open = store.records(queue, &FailureQuery::open()).await.unwrap();
    assert_eq!(open.iter().map(|r| &r.id).collect::<Vec<_>>(), [other], "the lapsed take lists as open");

    let page = store.records(queue, &FailureQuery { limit: 1, ..FailureQuery::default() }).await.unwrap();
    let next = FailureQuery { limit: 1, after: Some(page[0].id.clone()), ..FailureQuery::default() };
    assert_eq!(store.records(queue, &next).await.unwrap()[0].id, *other, "pages in the order kept");
    assert!(store.records_mention(queue, "say \"hi\"\n").await.unwrap(), "text with quotes and a newline is found");
    assert_eq!(store.purge_records(queue, Duration::ZERO).await.unwrap(), 2);
    assert!(!store.records_mention(queue, "say \"hi\"").await.unwrap());
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
