//! pgmq's own `delete`, `archive` and `set_vt` take no token. Here a worker's lease lapses, a
//! second process reads the message, and every settlement of the first is refused as
//! `LeaseLost`, changing nothing: the second's verdict is the one that stands.

mod common;

use std::time::Duration;

use redrive_core::kit::{Claim, Kinds, Renew};
use redrive_core::{DeadLetter, EnqueueExt, ErrorKind, Job, KeyBuilder, QueueStats};
use redrive_pgmq::{PgmqBackend, PgmqConfig};

#[derive(serde::Serialize, serde::Deserialize)]
struct Charge {
    order: u32,
}

impl Job for Charge {
    const KIND: &'static str = "charge";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_worker_s_settlements_are_refused_once_another_read_the_message() {
    let (stale, store) = common::queue("fence").await;
    // Another process on the same queue: a backend of its own, with its own held table.
    let fresh = PgmqBackend::connect(PgmqConfig::new(stale.queue_name()), store.clone()).await.unwrap();
    stale.enqueue_job(&Charge { order: 7 }).await.unwrap();

    let lease = Duration::from_secs(1);
    let first = stale.claim(&Kinds::Any, 1, lease, Duration::ZERO).await.unwrap().remove(0);
    assert_eq!(first.job.attempt, 1);
    // The lease lapses; the other process reads the message.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = fresh.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(second.len(), 1, "the message is visible again once the lease lapsed");
    let second = second.into_iter().next().unwrap();
    assert_eq!(second.job.attempt, 2);

    let lost = |r: redrive_core::Result<()>, what: &str| {
        assert_eq!(r.expect_err(what).kind(), ErrorKind::LeaseLost, "{what}");
    };
    lost(stale.complete(&first.lease, None).await, "complete");
    lost(stale.retry(&first.lease, Duration::ZERO, "boom").await, "retry");
    lost(stale.defer(&first.lease, Duration::ZERO).await, "defer");
    lost(stale.release(&first.lease).await, "release");
    lost(stale.renew(&first.lease, lease).await.map(drop), "renew");
    lost(stale.dead_letter(&first, "boom").await.map(drop), "dead letter");
    assert!(stale.list(&redrive_core::FailureQuery::open()).await.unwrap().is_empty(), "no record was kept");

    // The message is still the second reader's: hidden, then completed once.
    assert_eq!(fresh.counts().await.unwrap().running, 1);
    fresh.renew(&second.lease, Duration::from_secs(30)).await.unwrap();
    fresh.complete(&second.lease, None).await.unwrap();
    let counts = fresh.counts().await.unwrap();
    assert_eq!((counts.queued, counts.running), (0, 0), "{counts:?}");
}
