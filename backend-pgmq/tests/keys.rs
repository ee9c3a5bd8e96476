//! Exact dedupe at enqueue: the key's row and the message in one transaction, the application's
//! own included; a racing second producer waits for the first and gets its job; a reused key
//! with another payload refuses the whole batch; a done key is free again after `prune_keys`.

mod common;

use std::time::Duration;

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{Enqueue, Enqueued, ErrorKind, Job, KeyBuilder, NewJob, QueueStats};
use redrive_pgmq::PgmqBackend;
use redrive_postgres::sqlx;

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    order: u32,
    email: String,
}

impl Job for Receipt {
    const KIND: &'static str = "receipt";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

fn receipt(order: u32, email: &str) -> NewJob {
    NewJob::from_job(&Receipt { order, email: email.into() }).unwrap()
}

async fn queued(queue: &PgmqBackend) -> u64 {
    let counts = queue.counts().await.unwrap();
    counts.queued + counts.running
}

#[tokio::test]
async fn an_enqueue_inside_the_application_s_transaction_lands_with_it_or_not_at_all() {
    let (queue, store) = common::queue("keys_tx").await;
    let orders = format!("\"{}\".orders", store.schema());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE TABLE {orders} (id int PRIMARY KEY)")))
        .execute(store.pool())
        .await
        .unwrap();
    let insert = format!("INSERT INTO {orders} VALUES (1)");

    // Rolled back: neither the order, nor the key, nor the message.
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(insert.clone())).execute(&mut *tx).await.unwrap();
    let answer = queue.enqueue_in(&mut tx, receipt(1, "a@example.com")).await.unwrap();
    assert!(answer.is_created(), "{answer:?}");
    tx.rollback().await.unwrap();
    assert_eq!(queued(&queue).await, 0, "a rolled-back enqueue sends nothing");

    // Committed: the order and its one message; the key then answers a duplicate of it.
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(insert)).execute(&mut *tx).await.unwrap();
    let Enqueued::Created(id) = queue.enqueue_in(&mut tx, receipt(1, "a@example.com")).await.unwrap() else {
        panic!("the key was freed by the rollback: created expected");
    };
    tx.commit().await.unwrap();
    assert_eq!(queued(&queue).await, 1);
    match queue.enqueue(receipt(1, "a@example.com")).await.unwrap() {
        Enqueued::Duplicate { id: existing, provider_key } => {
            assert_eq!(existing, id);
            assert!(provider_key.is_some(), "the provider key the job was sent with");
        }
        other => panic!("a second enqueue should be a duplicate, got {other:?}"),
    }
    assert_eq!(queued(&queue).await, 1, "one message for one key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_racing_an_uncommitted_enqueue_of_its_key_gets_that_job_and_sends_nothing() {
    let (queue, store) = common::queue("keys_race").await;
    let mut tx = store.pool().begin().await.unwrap();
    let Enqueued::Created(id) = queue.enqueue_in(&mut tx, receipt(2, "b@example.com")).await.unwrap() else {
        panic!("created expected");
    };
    let racer = queue.clone();
    let second = tokio::spawn(async move { racer.enqueue(receipt(2, "b@example.com")).await });
    // The racer waits on the key's row until the first transaction ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "the second enqueue waits for the first transaction");
    tx.commit().await.unwrap();
    match second.await.unwrap().unwrap() {
        Enqueued::Duplicate { id: existing, .. } => assert_eq!(existing, id),
        other => panic!("the racer should get the first job, got {other:?}"),
    }
    assert_eq!(queued(&queue).await, 1, "one message for one key");
}

#[tokio::test]
async fn a_batch_reusing_a_key_with_another_payload_is_refused_whole() {
    let (queue, _store) = common::queue("keys_conflict").await;
    queue.enqueue(receipt(3, "c@example.com")).await.unwrap();
    let batch = vec![receipt(4, "d@example.com"), receipt(3, "someone-else@example.com")];
    let refused = queue.enqueue_batch(batch).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::KeyConflict, "{refused}");
    assert_eq!(queued(&queue).await, 1, "nothing of the refused batch was sent");
    // Two jobs of one key in a batch: one message, the second a duplicate of the first; with
    // different payloads, refused.
    let answers = queue.enqueue_batch(vec![receipt(5, "e@example.com"), receipt(5, "e@example.com")]).await.unwrap();
    assert!(answers[0].is_created() && matches!(answers[1], Enqueued::Duplicate { .. }), "{answers:?}");
    let refused = queue.enqueue_batch(vec![receipt(6, "f@example.com"), receipt(6, "g@example.com")]).await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::KeyConflict);
    assert_eq!(queued(&queue).await, 2);
}

#[tokio::test]
async fn a_done_key_is_kept_until_prune_keys_lets_it_go() {
    let (queue, _store) = common::queue("keys_prune").await;
    queue.enqueue(receipt(7, "h@example.com")).await.unwrap();
    let claimed = queue.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::ZERO).await.unwrap().remove(0);
    queue.complete(&claimed.lease, None).await.unwrap();
    assert!(matches!(queue.enqueue(receipt(7, "h@example.com")).await.unwrap(), Enqueued::Duplicate { .. }));
    assert_eq!(queued(&queue).await, 0, "a done key sends nothing until it is pruned");
    assert_eq!(queue.prune_keys(Duration::from_secs(3600)).await.unwrap(), 0, "younger than the retention");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(queue.prune_keys(Duration::from_millis(10)).await.unwrap(), 1);
    assert!(queue.enqueue(receipt(7, "h@example.com")).await.unwrap().is_created(), "the key is free again");
}
