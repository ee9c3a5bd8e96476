//! SQS API requests per job at steady state, counted at the HTTP layer (an SDK interceptor
//! counts every transmitted request, retries included).
//!
//! Run (moto and PostgreSQL from `scripts/services`):
//! `eval "$(scripts/services env)" && cargo bench -p redrive-sqs --bench requests`
//!
//! The floor with batches of ten is 0.3: one send, one receive and one delete per ten jobs.
//! Then requests per failure record: draining the DLQ, listing 10,500 records, replaying 1,000.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redrive_core::kit::RecordStore;
use redrive_core::{
    DeadLetter, Enqueue, FailureQuery, FailureRecord, Job, JobContext, JobError, KeyBuilder, NewJob, Replay, Worker,
    WorkerConfig,
};
use redrive_postgres::{PgBackend, PgConfig};
use redrive_sqs::{QueueSetup, SqsBackend, SqsConfig};
use serde::{Deserialize, Serialize};

const JOBS: u64 = 2000;
/// Jobs sent before the worker starts, so it never begins on an empty queue.
const PREFILL: u64 = 200;
/// The backlog the producer keeps at most: moto's calls slow down with the queue's depth.
const BACKLOG: u64 = 200;
/// The jobs whose requests count as the steady state.
const STEADY: std::ops::Range<u64> = 500..1500;

#[derive(Serialize, Deserialize)]
struct Noop {
    n: u64,
}

impl Job for Noop {
    const KIND: &'static str = "noop";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("n", self.n)
    }
}

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> BoxResult<()> {
    let endpoint = std::env::var("REDRIVE_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into());
    // Unique across runs: moto keeps queues for as long as it runs, and process ids repeat.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos();
    let name = format!("rdbench-{}-{nanos:x}", std::process::id());
    // Short polling: moto holds a long poll for its whole wait even when messages are ready.
    let config = SqsConfig::new(&name)
        .with_endpoint(&endpoint)
        .with_region("us-east-1")
        .with_static_credentials("test", "test")
        .with_max_wait(Duration::ZERO);
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("rdbench_sqs_{}", std::process::id());
    let ledger = PgBackend::connect(PgConfig::new(url).with_schema(&schema)).await?;
    ledger.migrate().await?;
    let queue = SqsBackend::setup(config.clone(), QueueSetup::default(), ledger.clone()).await?;

    // A producer keeps a backlog of at most a few hundred messages while the worker drains it:
    // steady state, and moto slows down badly on deep queues. Each side has its own client, so
    // each request counter sees only its own calls.
    let producer = queue;
    let consumer = SqsBackend::connect(config.clone(), ledger.clone()).await?;
    let done = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&done);
    // Batches of ten, what one receive and one delete call can carry; two receives in flight
    // keep the worker fed without extra empty polls.
    let worker_config = WorkerConfig { batch: 10, claimers: 2, ..WorkerConfig::default() };
    let (sends_before, work_before) = (producer.request_count(), consumer.request_count());
    let prefill: Vec<NewJob> = (0..PREFILL).map(|n| NewJob::from_job(&Noop { n })).collect::<Result<_, _>>()?;
    producer.enqueue_batch(prefill).await?;
    let started = Instant::now();
    let worker = Worker::builder(consumer.clone(), ledger.clone())
        .config(worker_config)
        .handle::<Noop>(move |_job: Noop, _ctx: JobContext| {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start();
    // The steady state: the worker's requests between the 500th and the 1500th job, away from
    // the start (pace unknown) and the tail (the backlog runs out).
    let steady = {
        let (done, consumer) = (Arc::clone(&done), consumer.clone());
        tokio::spawn(async move {
            let mut marks = Vec::new();
            for mark in [STEADY.start, STEADY.end] {
                while done.load(Ordering::Relaxed) < mark {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                marks.push((done.load(Ordering::Relaxed), consumer.request_count()));
            }
            let ((jobs_from, from), (jobs_to, to)) = (marks[0], marks[1]);
            (to - from) as f64 / (jobs_to - jobs_from) as f64
        })
    };
    for chunk in (PREFILL..JOBS).collect::<Vec<_>>().chunks(100) {
        while chunk[0] > done.load(Ordering::Relaxed) + BACKLOG {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let jobs: Vec<NewJob> = chunk.iter().map(|&n| NewJob::from_job(&Noop { n })).collect::<Result<_, _>>()?;
        producer.enqueue_batch(jobs).await?;
    }
    while done.load(Ordering::Relaxed) < JOBS {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    // Counted the moment the last job ran: its delete may still be in flight.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (sends, work) = (producer.request_count() - sends_before, consumer.request_count() - work_before);
    worker.shutdown().await;
    let steady = steady.await?;
    let records = records(endpoint, &config, &ledger).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA \"{schema}\" CASCADE"))).execute(ledger.pool()).await?;

    let per = |n: u64| n as f64 / JOBS as f64;
    println!("# redrive-sqs: API requests per job ({JOBS} jobs, batches of 10, 2 claimers, moto)");
    println!();
    println!("| phase | requests | per job |");
    println!("|---|---:|---:|");
    println!("| producer: SendMessageBatch | {sends} | {:.3} |", per(sends));
    println!("| worker: receive + delete (+ the partial receives at start and end) | {work} | {:.3} |", per(work));
    println!("| total | {} | {:.3} |", sends + work, per(sends + work));
    println!(
        "| steady state (jobs {} to {}): worker {steady:.3} + producer {:.3} | | {:.3} |",
        STEADY.start,
        STEADY.end,
        per(sends),
        steady + per(sends)
    );
    println!();
    println!("floor: 0.300 per job; worker drained {JOBS} jobs in {:.2} s", elapsed.as_secs_f64());
    println!();
    println!("# redrive-sqs: API requests per failure record");
    println!();
    println!("| operation | records | requests | per record |");
    println!("|---|---:|---:|---:|");
    for (what, n, requests) in records {
        println!("| {what} | {n} | {requests} | {:.4} |", requests as f64 / n as f64);
    }
    Ok(())
}

/// Requests per record: draining what the redrive policy moved, listing every record (pages of
/// 500) and replaying a thousand, each by a backend of its own so that its counter sees only it.
async fn records(endpoint: String, config: &SqsConfig, ledger: &PgBackend) -> BoxResult<Vec<(&'static str, u64, u64)>> {
    const WRITTEN: u64 = 10_000;
    const MOVED: u64 = 500;
    const REPLAYED: u64 = 1_000;
    let writer = SqsBackend::connect(config.clone(), ledger.clone()).await?;
    // Records as workers write them: straight into the store (no SQS request).
    let scope = writer.record_scope().to_owned();
    for chunk in (0..WRITTEN as u32).collect::<Vec<_>>().chunks(1_000) {
        let records: Vec<FailureRecord> =
            chunk.iter().map(|&n| redrive_conformance::sample_record(n, serde_json::json!({ "n": n }))).collect();
        ledger.keep_records(&scope, &records).await?;
    }
    // What the redrive policy moves: messages in the DLQ, drained by the first read.
    let dlq = writer.dead_letter_queue_url().to_owned();
    let client = raw_client(&endpoint).await;
    for batch in 0..MOVED / 10 {
        let entries = (0..10).map(|i| {
            let job = NewJob::from_job(&Noop { n: WRITTEN + batch * 10 + i }).expect("a job");
            aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(redrive_core::kit::Envelope::new(&job).encode())
                .build()
                .expect("id and body")
        });
        client.send_message_batch().queue_url(&dlq).set_entries(Some(entries.collect())).send().await?;
    }
    let drainer = SqsBackend::connect(config.clone(), ledger.clone()).await?;
    let before = drainer.request_count();
    let open = drainer.count_open().await?;
    assert_eq!(open, WRITTEN + MOVED, "every record is open");
    let drained = drainer.request_count() - before;

    let reader = SqsBackend::connect(config.clone(), ledger.clone()).await?;
    let before = reader.request_count();
    let mut query = FailureQuery { limit: 500, ..FailureQuery::open() };
    let mut listed = 0;
    loop {
        let page = reader.list(&query).await?;
        listed += page.len() as u64;
        match page.last() {
            Some(last) if page.len() == query.limit => query.after = Some(last.id.clone()),
            _ => break,
        }
    }
    assert_eq!(listed, WRITTEN + MOVED, "the list is complete");
    let listing = reader.request_count() - before;

    let replayer = SqsBackend::connect(config.clone(), ledger.clone()).await?;
    let before = replayer.request_count();
    let by_kind = FailureQuery { limit: REPLAYED as usize, ..FailureQuery::open() };
    let first = replayer.list(&by_kind).await?;
    for record in &first {
        replayer.replay(&record.id, "", "ops").await?;
    }
    let replaying = replayer.request_count() - before;
    Ok(vec![
        ("drain the DLQ into the store (moved by the redrive policy)", MOVED, drained),
        ("list every record, pages of 500", WRITTEN + MOVED, listing),
        ("replay 1,000 records (one list, then one replay each)", first.len() as u64, replaying),
    ])
}

/// A plain SDK client on the bench's endpoint, for what a redrive policy would do.
async fn raw_client(endpoint: &str) -> aws_sdk_sqs::Client {
    let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new("test", "test", None, None, "bench"))
        .load()
        .await;
    aws_sdk_sqs::Client::new(&shared)
}
