//! Priorities on the real PostgreSQL: single and batch enqueues keep them, a claim takes the
//! highest first and hands its batch back in that order, and a claim that works through a
//! backlog from its scan floor reaches the lower priorities when the floor's runs dry.

mod common;

use std::time::Duration;

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{Enqueue, ErrorKind};
use sqlx::Row;

const LEASE: Duration = Duration::from_secs(30);

/// The order numbers of claimed `charge` jobs, with their priority.
fn orders(claimed: &[redrive_core::kit::Claimed]) -> Vec<(u64, i16)> {
    claimed.iter().map(|c| (c.job.payload["order"].as_u64().unwrap(), c.job.priority)).collect()
}

#[tokio::test]
async fn claims_take_the_highest_priority_first_in_batches_in_claim_order() {
    let backend = common::backend("prio").await;
    backend.enqueue(common::charge(1).with_priority(-5).unwrap()).await.unwrap();
    backend.enqueue(common::charge(2).with_priority(20).unwrap()).await.unwrap();
    let batch = [(3, 0), (4, 20), (5, -5), (6, 0), (7, 100)];
    let batch = batch.iter().map(|(n, p)| common::charge(*n).with_priority(*p).unwrap()).collect();
    backend.enqueue_batch(batch).await.unwrap();
    let first = backend.claim(&Kinds::Any, 4, LEASE, Duration::ZERO).await.unwrap();
    let rest = backend.claim(&Kinds::Any, 10, LEASE, Duration::ZERO).await.unwrap();
    assert_eq!(orders(&first), [(7, 100), (2, 20), (4, 20), (3, 0)], "the first batch, in claim order");
    assert_eq!(orders(&rest), [(6, 0), (1, -5), (5, -5)], "the rest, in claim order");

    let sql = format!("SELECT array_agg(priority ORDER BY priority) FROM \"{}\".job_priorities", backend.schema());
    let known: Vec<i16> = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(backend.pool()).await.unwrap().get(0);
    assert_eq!(known, [-5, 0, 20, 100], "every priority enqueued, each once, and 0");

    let out_of_range = redrive_core::NewJob { priority: 101, ..common::charge(8) };
    let refused = backend.enqueue(out_of_range.clone()).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{refused}");
    let refused = backend.enqueue_batch(vec![common::charge(9), out_of_range]).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{refused}");
}

#[tokio::test]
async fn claims_from_a_scan_floor_reach_the_lower_priorities_when_its_own_runs_dry() {
    let backend = common::backend("priofloor").await;
    let mut batch: Vec<_> = (1..=8).map(|n| common::charge(n).with_priority(10).unwrap()).collect();
    batch.extend((11..=14).map(|n| common::charge(n).with_priority(-10).unwrap()));
    backend.enqueue_batch(batch).await.unwrap();
    let mut seen = Vec::new();
    // Full batches of four set the floor at priority 10; the third claim finds nothing above it
    // there, and looks from the front, at every priority.
    for _ in 0..3 {
        seen.extend(orders(&backend.claim(&Kinds::Any, 4, LEASE, Duration::ZERO).await.unwrap()));
    }
    let expected: Vec<(u64, i16)> = (1..=8).map(|n| (n, 10)).chain((11..=14).map(|n| (n, -10))).collect();
    assert_eq!(seen, expected);
    assert!(backend.claim(&Kinds::Any, 4, LEASE, Duration::ZERO).await.unwrap().is_empty());
}

#[tokio::test]
async fn the_counts_read_every_priority() {
    use redrive_core::QueueStats;
    let backend = common::backend("priocounts").await;
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let jobs = [(1, 50, Some(later)), (2, -50, Some(later)), (3, 0, Some(later)), (4, -50, None), (5, 7, None)];
    let jobs = jobs.iter().map(|(n, p, at)| {
        let job = common::charge(*n).with_priority(*p).unwrap();
        if let Some(at) = at { job.run_at(*at) } else { job }
    });
    backend.enqueue_batch(jobs.collect()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let counts = backend.counts().await.unwrap();
    assert_eq!((counts.queued, counts.scheduled, counts.running), (5, Some(3), 0));
    let oldest = counts.oldest_ready.expect("two jobs are ready");
    assert!(oldest >= Duration::from_millis(50) && oldest < Duration::from_secs(60), "{oldest:?}");
    // The ready job of the lowest priority is the oldest ready one, whichever priority it has.
    let claimed = backend.claim(&Kinds::Any, 1, LEASE, Duration::ZERO).await.unwrap();
    assert_eq!(orders(&claimed), [(5, 7)]);
    assert!(backend.counts().await.unwrap().oldest_ready.is_some(), "the job at -50 still waits");
}
