//! Azure Queue Storage requests per job at steady state, counted at the HTTP layer (a pipeline
//! policy counts every try, retries included), against Azurite.
//!
//! Run (Azurite and PostgreSQL from `scripts/services`):
//! `eval "$(scripts/services env)" && cargo bench -p redrive-azure --bench requests`
//!
//! The floor is 2 + 1/32: one Put Message and one Delete Message per job (Azure has no batch
//! send or delete), one Get Messages per 32. Then requests per failure record: draining the
//! poison queue, listing 10,500 records, replaying 1,000.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redrive_azure::azure_storage_queue::models::{QueueClientReceiveMessagesOptions, QueueMessage};
use redrive_azure::{AzureBackend, AzureConfig, QueueOptions};
use redrive_core::kit::RecordStore;
use redrive_core::{
    DeadLetter, Enqueue, FailureQuery, FailureRecord, Job, JobContext, JobError, KeyBuilder, NewJob, Replay, Worker,
    WorkerConfig,
};
use redrive_postgres::{PgBackend, PgConfig};
use serde::{Deserialize, Serialize};

const JOBS: u64 = 2000;
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

fn account() -> BoxResult<AzureConfig> {
    Ok(match std::env::var("AZURE_STORAGE_CONNECTION_STRING") {
        Ok(text) => AzureConfig::from_connection_string(&text)?,
        Err(_) => AzureConfig::development(),
    })
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    // Unique across runs: Azurite keeps queues for as long as it runs, and process ids repeat.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos();
    let name = format!("rdbench-{}-{nanos:x}", std::process::id());
    let account = account()?;
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("rdbench_azure_{}", std::process::id());
    let ledger = PgBackend::connect(PgConfig::new(url).with_schema(&schema)).await?;
    ledger.migrate().await?;
    let options = QueueOptions::default();
    // Producer and consumer each have their own client, so each counter sees only its calls.
    let producer = AzureBackend::setup(&account, &name, options.clone(), ledger.clone()).await?;
    let consumer = AzureBackend::connect(&account, &name, options.clone(), ledger.clone()).await?;
    let done = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&done);
    // Gets of 32, what one Get Messages call can carry, and as many handlers, so that a get
    // finds room for a whole one; two gets in flight keep the worker fed.
    let worker_config = WorkerConfig { batch: 32, claimers: 2, concurrency: 32, ..WorkerConfig::default() };
    let (sends_before, work_before) = (producer.request_count(), consumer.request_count());
    // A backlog, as a worker meets it after a burst: Azure has no long polling, so a worker
    // faster than its producer (Azurite takes puts more slowly than gets and deletes) would
    // count the empty and part-filled gets of an idle queue, a cost of its own (below).
    let jobs: Vec<NewJob> = (0..JOBS).map(|n| NewJob::from_job(&Noop { n })).collect::<Result<_, _>>()?;
    producer.enqueue_batch(jobs).await?;
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
    while done.load(Ordering::Relaxed) < JOBS {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    // Counted the moment the last job ran: its delete may still be in flight.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (sends, work) = (producer.request_count() - sends_before, consumer.request_count() - work_before);
    let kinds = consumer.requests();
    let kinds = [&kinds.gets, &kinds.updates, &kinds.deletes].map(|c| c.load(Ordering::Relaxed));
    worker.shutdown().await;
    let steady = steady.await?;
    let baseline = raw_drain(&account, &producer).await?;
    // An idle worker: Azure has no long polling, so each claimer gets once per poll interval.
    let idle = {
        let before = consumer.request_count();
        let worker = Worker::builder(consumer.clone(), ledger.clone())
            .config(WorkerConfig { claimers: 2, ..WorkerConfig::default() })
            .handle::<Noop>(|_job: Noop, _ctx: JobContext| async { Ok::<_, JobError>(()) })
            .build()
            .start();
        tokio::time::sleep(Duration::from_secs(10)).await;
        worker.shutdown().await;
        (consumer.request_count() - before) as f64 / 10.0
    };
    let records = records(&account, &name, &ledger).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA \"{schema}\" CASCADE"))).execute(ledger.pool()).await?;

    let per = |n: u64| n as f64 / JOBS as f64;
    println!("# redrive-azure: API requests per job ({JOBS} jobs, gets of 32, 32 handlers, 2 claimers, Azurite)");
    println!();
    println!("| phase | requests | per job |");
    println!("|---|---:|---:|");
    println!("| producer: Put Message | {sends} | {:.3} |", per(sends));
    println!("| worker: get + delete (+ the partial gets at start and end) | {work} | {:.3} |", per(work));
    println!("| of which gets {}, updates (renewals, hand-backs) {}, deletes {} | | |", kinds[0], kinds[1], kinds[2]);
    println!("| total | {} | {:.3} |", sends + work, per(sends + work));
    println!(
        "| steady state (jobs {} to {}): worker {steady:.3} + producer {:.3} | | {:.3} |",
        STEADY.start,
        STEADY.end,
        per(sends),
        steady + per(sends)
    );
    println!();
    println!("floor: {:.3} per job; worker drained {JOBS} jobs in {:.2} s", 2.0 + 1.0 / 32.0, elapsed.as_secs_f64());
    println!(
        "baseline: the SDK alone (get 32, delete each, 32 at once) drained {JOBS} in {:.2} s: the worker takes {:.2}× \
         as long, its handler and effect ledger (PostgreSQL) included",
        baseline.as_secs_f64(),
        elapsed.as_secs_f64() / baseline.as_secs_f64()
    );
    println!("idle: {idle:.1} requests per second (2 claimers, poll 1 s, no long polling)");
    println!();
    println!("# redrive-azure: API requests per failure record");
    println!();
    println!("| operation | records | requests | per record |");
    println!("|---|---:|---:|---:|");
    for (what, n, requests) in records {
        println!("| {what} | {n} | {requests} | {:.4} |", requests as f64 / n as f64);
    }
    Ok(())
}

/// The same backlog drained by the SDK alone, with no worker, handler or ledger: the pace
/// Azurite allows on this machine, measured in the same run.
async fn raw_drain(account: &AzureConfig, producer: &AzureBackend) -> BoxResult<Duration> {
    let jobs: Vec<NewJob> = (0..JOBS).map(|n| NewJob::from_job(&Noop { n })).collect::<Result<_, _>>()?;
    producer.enqueue_batch(jobs).await?;
    let client = account.queue_client(producer.queue_name())?;
    let started = Instant::now();
    let mut drained = 0;
    while drained < JOBS {
        let options = QueueClientReceiveMessagesOptions {
            number_of_messages: Some(32),
            visibility_timeout: Some(30),
            ..Default::default()
        };
        let got = client.receive_messages(Some(options)).await?.into_model()?.items.unwrap_or_default();
        let deletes = got.iter().map(|m| {
            let (id, receipt) =
                (m.message_id.as_deref().unwrap_or_default(), m.pop_receipt.as_deref().unwrap_or_default());
            client.delete_message(id, receipt, None)
        });
        for deleted in futures_util::future::join_all(deletes).await {
            deleted?;
        }
        drained += got.len() as u64;
    }
    Ok(started.elapsed())
}

/// Requests per record: draining what another consumer moved to the poison queue, listing
/// every record (pages of 500) and replaying a thousand, each by a backend of its own so that
/// its counter sees only it.
async fn records(account: &AzureConfig, name: &str, ledger: &PgBackend) -> BoxResult<Vec<(&'static str, u64, u64)>> {
    const WRITTEN: u64 = 10_000;
    const MOVED: u64 = 500;
    const REPLAYED: u64 = 1_000;
    let connect = || AzureBackend::connect(account, name, QueueOptions::default(), ledger.clone());
    let writer = connect().await?;
    // Records as workers write them: straight into the store (no Azure request).
    let scope = writer.record_scope().to_owned();
    for chunk in (0..WRITTEN as u32).collect::<Vec<_>>().chunks(1_000) {
        let records: Vec<FailureRecord> =
            chunk.iter().map(|&n| redrive_conformance::sample_record(n, serde_json::json!({ "n": n }))).collect();
        ledger.keep_records(&scope, &records).await?;
    }
    // What another consumer (the Azure Functions trigger) moves: envelopes in the poison queue.
    let poison = account.queue_client(&writer.poison_queue_name())?;
    for n in 0..MOVED {
        let job = NewJob::from_job(&Noop { n: WRITTEN + n })?;
        let text = redrive_core::kit::Envelope::new(&job).encode();
        poison.send_message(QueueMessage { message_text: Some(text) }.try_into()?, None).await?;
    }
    let drainer = connect().await?;
    let before = drainer.request_count();
    let open = drainer.count_open().await?;
    assert_eq!(open, WRITTEN + MOVED, "every record is open");
    let drained = drainer.request_count() - before;

    let reader = connect().await?;
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

    let replayer = connect().await?;
    let before = replayer.request_count();
    let first = replayer.list(&FailureQuery { limit: REPLAYED as usize, ..FailureQuery::open() }).await?;
    for record in &first {
        replayer.replay(&record.id, "", "ops").await?;
    }
    let replaying = replayer.request_count() - before;
    Ok(vec![
        ("drain the poison queue into the store (moved by another consumer)", MOVED, drained),
        ("list every record, pages of 500", WRITTEN + MOVED, listing),
        ("replay 1,000 records (one list, then one replay each)", first.len() as u64, replaying),
    ])
}
