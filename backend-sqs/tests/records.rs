//! Failure records at scale and across processes: many records read completely by several
//! readers at once, and replays that send a job once whoever asks and whatever fails.
//!
//! "Another process" is a second `SqsBackend` connected to the same queue and database with its
//! own SQS client and its own connection pool: all the two share is what two processes share.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use redrive_core::kit::{Claim, Kinds, RecordStore};
use redrive_core::{
    DeadLetter, Enqueue, FailureId, FailureQuery, FailureRecord, NewJob, RecordState, Replay, ReplayOutcome,
};
use redrive_postgres::{PgBackend, PgConfig};
use redrive_sqs::{QueueSetup, SqsBackend};

/// The queue `name` as another process sees it.
async fn another_process(name: &str, store: &PgBackend) -> SqsBackend {
    let pool = PgBackend::connect(PgConfig::new(common::database_url()).with_schema(store.schema()))
        .await
        .expect("PostgreSQL");
    SqsBackend::connect(common::config(name), pool).await.expect("moto's SQS")
}

fn job(n: u32) -> NewJob {
    let key = redrive_core::IdempotencyKey::builder("ship").fact("parcel", n).build().unwrap();
    NewJob::new("ship", key, serde_json::json!({ "parcel": n })).unwrap()
}

/// Every open record, page by page, as an operator's tool reads them.
async fn every_open_record(queue: &SqsBackend) -> Vec<FailureId> {
    let mut query = FailureQuery { limit: 500, ..FailureQuery::open() };
    let mut ids = Vec::new();
    loop {
        let page = queue.list(&query).await.expect("a page");
        ids.extend(page.iter().map(|r| r.id.clone()));
        match page.last() {
            Some(last) if page.len() == query.limit => query.after = Some(last.id.clone()),
            _ => return ids,
        }
    }
}

/// Messages on the source queue now (each received once, then deleted).
async fn messages_on(queue: &SqsBackend) -> usize {
    let mut n = 0;
    loop {
        let got = queue.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
        if got.is_empty() {
            return n;
        }
        for claimed in got {
            queue.complete(&claimed.lease, None).await.unwrap();
            n += 1;
        }
    }
}

/// `n` jobs dead-lettered by a worker's calls; their records' ids.
async fn records(queue: &SqsBackend, n: u32) -> Vec<FailureId> {
    queue.enqueue_batch((0..n).map(job).collect()).await.unwrap();
    let mut ids = Vec::new();
    while ids.len() < n as usize {
        for claimed in queue.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap() {
            let record = queue.dead_letter(&claimed, "carrier rejected the label").await.unwrap().expect("written");
            ids.push(record.id);
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_records_page_completely_for_two_readers_at_once_twice_in_a_row() {
    // 10,000 records written by workers, and more left in the DLQ by the redrive policy (workers
    // that crashed on their last attempt), drained by both readers at once. moto's queue calls
    // slow down with the queue's depth (10,000 messages take it most of an hour), so the DLQ
    // holds 500 here.
    const WRITTEN: u32 = 10_000;
    const MOVED: u32 = 500;
    let started = std::time::Instant::now();
    let name = common::name("many");
    let store = common::ledger().await;
    let first = common::queue_named(&name, QueueSetup::default(), store.clone()).await;
    let second = another_process(&name, &store).await;

    let client = common::raw_client().await;
    let arn = client
        .get_queue_attributes()
        .queue_url(first.queue_url())
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()
        .remove(&aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .unwrap();
    for chunk in (0..WRITTEN).collect::<Vec<_>>().chunks(1_000) {
        let records: Vec<FailureRecord> =
            chunk.iter().map(|&n| redrive_conformance::sample_record(n, serde_json::json!({ "parcel": n }))).collect();
        assert_eq!(store.keep_records(&arn, &records).await.unwrap(), chunk.len() as u64);
    }
    // Moved by the redrive policy: envelopes without the worker's attributes.
    let dlq = client.get_queue_url().queue_name(format!("{name}-dlq")).send().await.unwrap().queue_url.unwrap();
    for batch in 0..MOVED / 10 {
        let entries = (0..10).map(|i| {
            let body = redrive_core::kit::Envelope::new(&job(WRITTEN + batch * 10 + i)).encode();
            aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(body)
                .build()
                .unwrap()
        });
        let out =
            client.send_message_batch().queue_url(&dlq).set_entries(Some(entries.collect())).send().await.unwrap();
        assert!(out.failed.is_empty());
    }

    eprintln!("filled at {:?}", started.elapsed());
    let all = (WRITTEN + MOVED) as usize;
    for pass in 1..=2 {
        let (a, b) = tokio::join!(every_open_record(&first), every_open_record(&second));
        for (reader, ids) in [("first", &a), ("second", &b)] {
            let unique: BTreeSet<_> = ids.iter().collect();
            assert_eq!(ids.len(), all, "pass {pass}, {reader} process: every record");
            assert_eq!(unique.len(), ids.len(), "pass {pass}, {reader} process: no record twice");
        }
        assert_eq!(a.iter().collect::<BTreeSet<_>>(), b.iter().collect::<BTreeSet<_>>(), "pass {pass}");
        assert_eq!(first.count_open().await.unwrap(), all as u64, "pass {pass}");
        assert_eq!(second.count_open().await.unwrap(), all as u64, "pass {pass}");
        eprintln!("pass {pass} at {:?}", started.elapsed());
    }
    let moved = first.list(&FailureQuery { key: Some(job(WRITTEN).key), ..FailureQuery::default() }).await.unwrap();
    assert_eq!(moved.len(), 1);
    assert!(moved[0].last_error.contains("moved by the redrive policy"), "{}", moved[0].last_error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_replaying_one_record_at_the_same_moment_send_one_message() {
    let name = common::name("race");
    let store = common::ledger().await;
    let first = common::queue_named(&name, QueueSetup::default(), store.clone()).await;
    let second = another_process(&name, &store).await;
    for id in records(&first, 5).await {
        let (a, b) = tokio::join!(first.replay(&id, "", "ops"), second.replay(&id, "", "ops"));
        let outcomes = [a.unwrap(), b.unwrap()];
        let replayed = outcomes.iter().filter(|o| matches!(o, ReplayOutcome::Replayed(_))).count();
        assert_eq!(replayed, 1, "record {id}: {outcomes:?}");
        assert!(
            outcomes.iter().any(|o| matches!(o, ReplayOutcome::AlreadyClosed(RecordState::Replaying { .. }))),
            "record {id}: the other finds it replayed: {outcomes:?}"
        );
    }
    assert_eq!(messages_on(&first).await, 5, "one message per record");
    assert_eq!(second.count_open().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_stopped_after_its_send_sends_nothing_more_when_retried_from_any_process() {
    let name = common::name("stop");
    let store = common::ledger().await;
    let first = common::queue_named(&name, QueueSetup::default(), store.clone()).await;
    let second = another_process(&name, &store).await;
    let id = records(&first, 1).await.remove(0);

    first.fail_replays_after_send(true);
    let err = first.replay(&id, "", "ops").await.unwrap_err();
    assert!(err.message().contains("injected"), "{err}");
    first.fail_replays_after_send(false);
    for queue in [&first, &second, &first] {
        let outcome = queue.replay(&id, "", "ops").await.unwrap();
        assert!(matches!(outcome, ReplayOutcome::AlreadyClosed(RecordState::Replaying { .. })), "{outcome:?}");
    }
    assert!(matches!(second.get(&id).await.unwrap().state, RecordState::Replaying { .. }));
    assert_eq!(second.count_open().await.unwrap(), 0);
    assert_eq!(messages_on(&first).await, 1, "the one send before the stop");

    // A discard of a replayed record changes nothing.
    second.discard(&id, "duplicate", "ops").await.unwrap();
    assert!(matches!(first.get(&id).await.unwrap().state, RecordState::Replaying { .. }));
}
