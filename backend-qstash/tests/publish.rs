//! Publishing as QStash sees it: through a named queue, QStash's own retries when no verdict
//! comes (a record QStash moved, read as one), and its rate limit as a typed error.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use redrive_core::{DeadLetter, EnqueueExt, ErrorKind, FailureQuery, Job, KeyBuilder, Retry};
use redrive_qstash::{QStashBackend, QStashConfig};
use redrive_qstash_emulator::RateLimit;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Notify {
    user: u32,
}

impl Job for Notify {
    const KIND: &'static str = "notify";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("user", self.user)
    }
}

#[tokio::test]
async fn jobs_published_through_a_named_queue_run_once_each() {
    let rig = common::rig_with(common::emulator(), |c| c.with_queue("notifications")).await;
    let (worker, runs) = common::counting_worker::<Notify>(&rig);
    for user in 0..5 {
        rig.backend.enqueue_job(&Notify { user }).await.unwrap();
    }
    let done = rig
        .emulator
        .wait_until(Duration::from_secs(15), |e| e.deliveries().iter().filter(|d| d.delivered()).count() == 5)
        .await;
    worker.shutdown().await;
    assert!(done, "five deliveries through the queue");
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn a_job_that_never_gets_a_verdict_ends_as_a_record_qstash_moved_after_its_cap() {
    // An endpoint that always answers 500 (a crashing deployment): QStash's own retries, set to
    // the cap, move the message to its DLQ, where it reads as a full record.
    let emulator = common::emulator().start_local().await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let destination = format!("http://{}/qstash", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/qstash", post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let ledger = common::ledger().await;
    let config = QStashConfig::new(common::TOKEN, &destination).with_api_url(emulator.url()).allow_plain_http();
    let backend = QStashBackend::connect(config, Arc::new(ledger)).await.unwrap();
    let job = redrive_core::NewJob::from_job(&Notify { user: 9 }).unwrap().with_cap(3);
    redrive_core::Enqueue::enqueue(&backend, job.clone()).await.unwrap();
    assert!(emulator.wait_for_dlq(1, Duration::from_secs(30)).await, "QStash gives up after its retries");
    assert_eq!(emulator.deliveries().len(), 3, "Upstash-Retries = cap - 1: three deliveries in all");
    let records = backend.list(&FailureQuery::open()).await.unwrap();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!((r.attempts, r.cap, &r.key, &r.payload), (3, 3, &job.key, &job.payload));
    assert!(
        r.last_error.contains("QStash gave up after 3 attempts") && r.last_error.contains("500"),
        "{}",
        r.last_error
    );
}

#[tokio::test]
async fn qstash_rate_limiting_is_a_temporary_error_that_says_when() {
    let emulator = common::emulator().rate_limit(Some(RateLimit::per_second(2))).start_local().await.unwrap();
    let ledger = common::ledger().await;
    let config =
        QStashConfig::new(common::TOKEN, "http://127.0.0.1:9/qstash").with_api_url(emulator.url()).allow_plain_http();
    let backend = QStashBackend::connect(config, Arc::new(ledger)).await.unwrap();
    let mut limited = None;
    for user in 0..10 {
        if let Err(e) = backend.enqueue_job(&Notify { user }).await {
            limited = Some(e);
            break;
        }
    }
    let e = limited.expect("the rate limit answers 429 within ten publishes");
    assert_eq!((e.kind(), e.retry()), (ErrorKind::Backend, Retry::Temporary), "{e}");
    assert!(e.message().contains("rate limited (429)"), "{e}");
}
