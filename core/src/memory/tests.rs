use serde_json::json;

use super::*;
use crate::backend::{Begin, DeadLetter, Ledger};
use crate::key::ProviderKey;

fn job(n: u32) -> NewJob {
    let key = IdempotencyKey::builder("t").fact("n", n).build().unwrap();
    NewJob::new("t", key, json!({"n": n})).unwrap()
}

const LEASE: Duration = Duration::from_millis(50);

#[tokio::test]
async fn enqueue_dedupes_by_key_and_refuses_a_changed_payload() {
    let b = MemoryBackend::new();
    let original = job(1);
    let first = b.enqueue(original.clone()).await.unwrap();
    assert!(first.is_created());
    let again = job(1);
    assert_ne!(again.provider_key, original.provider_key, "each NewJob mints its own");
    let stored = Some(original.provider_key);
    assert_eq!(b.enqueue(again).await.unwrap(), Enqueued::Duplicate { id: first.id().clone(), provider_key: stored });
    let mut changed = job(1);
    changed.payload = json!({"n": 2});
    assert_eq!(b.enqueue(changed).await.unwrap_err().kind(), ErrorKind::KeyConflict);
    assert_eq!(b.claim(&Kinds::Any, 10, LEASE, Duration::ZERO).await.unwrap().len(), 1);
}

#[tokio::test]
async fn an_expired_lease_is_fenced_after_a_new_claim() {
    let b = MemoryBackend::new();
    b.enqueue(job(1)).await.unwrap();
    let stale = b.claim(&Kinds::Any, 1, LEASE, Duration::ZERO).await.unwrap().remove(0);
    b.renew(&stale.lease, LEASE).await.unwrap(); // its handler started
    assert!(b.claim(&Kinds::Any, 1, LEASE, Duration::ZERO).await.unwrap().is_empty(), "held while the lease runs");
    let fresh = b.claim(&Kinds::Any, 1, LEASE, LEASE * 4).await.unwrap().remove(0);
    assert_eq!(fresh.job.attempt, 2, "attempts are counted at claim");
    for err in [
        b.complete(&stale.lease, None).await.unwrap_err(),
        b.retry(&stale.lease, Duration::ZERO, "x").await.unwrap_err(),
        b.renew(&stale.lease, LEASE).await.unwrap_err(),
        b.dead_letter(&stale, "x").await.unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::LeaseLost);
    }
    b.complete(&fresh.lease, None).await.unwrap();
    assert_eq!(b.count_open().await.unwrap(), 0);
}

#[tokio::test]
async fn a_claim_that_lapses_before_its_handler_started_costs_no_attempt() {
    let b = MemoryBackend::new();
    b.enqueue(job(1)).await.unwrap();
    let stranded = b.claim(&Kinds::Any, 1, LEASE, Duration::ZERO).await.unwrap().remove(0);
    assert_eq!((stranded.job.attempt, stranded.job.stranded), (1, 0));
    let again = b.claim(&Kinds::Any, 1, LEASE, LEASE * 4).await.unwrap().remove(0);
    assert_eq!((again.job.attempt, again.job.stranded), (1, 1), "refunded, and counted as stranded");
    b.defer(&again.lease, Duration::ZERO).await.unwrap();
    let deferred = b.claim(&Kinds::Any, 1, LEASE, LEASE).await.unwrap().remove(0);
    assert_eq!(deferred.job.attempt, 1, "a deferral costs no attempt");
}

#[tokio::test]
async fn claim_waits_for_an_enqueue() {
    let b = MemoryBackend::new();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.claim(&Kinds::Any, 1, LEASE, Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    b.enqueue(job(1)).await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap().len(), 1);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn ledger_gives_one_fresh_then_busy_resumed_and_done() {
    let b = MemoryBackend::new();
    let key = job(1).key;
    let (f, other) = (json!({"n": 1}), json!({"n": 2}));
    let pk = ProviderKey::mint();
    let Begin::Fresh(hold) = b.begin(&key, &f, pk, LEASE).await.unwrap() else { panic!("first is fresh") };
    assert!(matches!(b.begin(&key, &f, pk, LEASE).await.unwrap(), Begin::Busy(_)));
    assert_eq!(b.begin(&key, &other, pk, LEASE).await.unwrap_err().kind(), ErrorKind::KeyConflict);
    b.release_hold(&hold).await.unwrap();
    let Begin::Resumed(again) = b.begin(&key, &f, pk, LEASE).await.unwrap() else { panic!("released is resumed") };
    assert_eq!(b.extend_hold(&hold, LEASE).await.unwrap_err().kind(), ErrorKind::LeaseLost);
    b.finish(&again, &json!({"sent": true})).await.unwrap();
    assert_eq!(b.begin(&key, &f, pk, LEASE).await.unwrap(), Begin::Done(json!({"sent": true})));
}

#[tokio::test]
async fn the_ledger_lets_done_keys_go_after_its_retention() {
    let retention = Duration::from_millis(200);
    let b = MemoryBackend::new().with_ledger_retention(retention);
    let (f, pk) = (json!({"n": 1}), ProviderKey::mint());
    let key = |n: u32| job(n).key;
    let alert = IdempotencyKey::builder("redrive_alert").fact("record", 1).fact("sink", 0).build().unwrap();
    for key in [key(1), key(2), alert.clone()] {
        let Begin::Fresh(hold) = b.begin(&key, &f, pk, LEASE).await.unwrap() else { panic!("fresh") };
        b.finish(&hold, &json!({"answer": format!("answer-{key}")})).await.unwrap();
    }
    let finished = Instant::now();
    assert!(matches!(b.begin(&key(1), &f, pk, LEASE).await.unwrap(), Begin::Done(_)), "kept within it");
    tokio::time::sleep_until(finished + retention).await;
    b.begin(&key(3), &f, pk, LEASE).await.unwrap();
    let (first, second) = (format!("answer-{}", key(1)), format!("answer-{}", key(2)));
    assert!(!b.holds_text(&first) && !b.holds_text(&second), "let go, asked for again or not");
    assert!(matches!(b.begin(&key(1), &f, pk, LEASE).await.unwrap(), Begin::Fresh(_)), "a new effect after it");
    assert!(matches!(b.begin(&alert, &f, pk, LEASE).await.unwrap(), Begin::Done(_)), "an alert key stays");
    assert_eq!(MemoryBackend::new().ledger_retention, Duration::from_secs(24 * 3600), "Stripe's 24 hours");
}

#[tokio::test]
async fn oversized_batches_send_nothing() {
    let b = MemoryBackend::with_max_payload(4);
    let err = b.enqueue_batch(vec![job(1), job(2)]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PayloadTooLarge);
    assert!(b.claim(&Kinds::Any, 10, LEASE, Duration::ZERO).await.unwrap().is_empty());
}

#[tokio::test]
async fn claims_take_the_highest_priority_first_and_the_oldest_within_one() {
    let b = MemoryBackend::new();
    for (n, priority) in [(1, -5), (2, 10), (3, 0), (4, -5), (5, 10), (6, 0)] {
        b.enqueue(job(n).with_priority(priority).unwrap()).await.unwrap();
    }
    let first = b.claim(&Kinds::Any, 3, LEASE, Duration::ZERO).await.unwrap();
    let rest = b.claim(&Kinds::Any, 10, LEASE, Duration::ZERO).await.unwrap();
    let order: Vec<(i64, i16)> =
        first.iter().chain(&rest).map(|c| (c.job.payload["n"].as_i64().unwrap(), c.job.priority)).collect();
    assert_eq!(order, [(2, 10), (5, 10), (3, 0), (6, 0), (1, -5), (4, -5)]);
}

#[tokio::test]
async fn a_forgotten_key_is_nowhere_and_free_again() {
    use crate::backend::{Forget, Forgotten};
    let b = MemoryBackend::new();
    b.enqueue(job(1)).await.unwrap();
    b.enqueue(job(2)).await.unwrap();
    let claimed = b.claim(&Kinds::Any, 1, LEASE, Duration::ZERO).await.unwrap().remove(0);
    let key = claimed.job.key.clone();
    assert!(b.forget_key(&key).await.unwrap_err().is_temporary(), "not while it runs");
    let record = b.dead_letter(&claimed, "boom").await.unwrap().unwrap();
    let alert = IdempotencyKey::builder("redrive_alert").fact("record", &record.id.0).fact("sink", 0).build().unwrap();
    b.begin(&alert, &json!({}), ProviderKey::mint(), LEASE).await.unwrap();
    let forgotten = b.forget_key(&key).await.unwrap();
    assert_eq!(forgotten, Forgotten { jobs: 1, records: 1, ledger: 1 });
    assert!(b.list(&crate::FailureQuery::open()).await.unwrap().is_empty());
    assert!(b.enqueue(job(1)).await.unwrap().is_created(), "the key is free");
    assert!(b.forget_key(&IdempotencyKey::builder("t").fact("n", 9).build().unwrap()).await.unwrap().is_empty());
    let other = b.claim(&Kinds::Any, 2, LEASE, Duration::ZERO).await.unwrap();
    assert_eq!(other.len(), 2, "the other job is untouched, the forgotten key enqueued anew");
}
