//! `/metrics` after a worker's run on PostgreSQL, in the same process: the worker's counters as
//! it counted them, and the queue's figures as the database has them. A file of its own: the
//! recorder is global to the test process.

mod common;

use std::time::Duration;

use common::{database, serve};
use metrics_exporter_prometheus::PrometheusBuilder;
use redrive_core::{DeadLetter, EnqueueExt, Job, JobContext, JobError, KeyBuilder, Worker, WorkerConfig};
use redrive_dashboard::Dashboard;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Ship {
    parcel: u32,
}

impl Job for Ship {
    const KIND: &'static str = "ship";
    const CAP: Option<u32> = Some(2);
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("parcel", self.parcel)
    }
}

/// The value of the sample `name{labels}` in Prometheus text; `None` when absent.
fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(name_and_labels)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_metrics_match_the_workers_counts_and_the_queue() {
    let handle = PrometheusBuilder::new().install_recorder().expect("the only recorder");
    let db = database().await;
    for parcel in 1..=6 {
        db.enqueue_job(&Ship { parcel }).await.unwrap();
    }
    let config = WorkerConfig {
        poll: Duration::from_millis(50),
        backoff: redrive_core::Backoff { base: Duration::from_millis(10), ..redrive_core::Backoff::default() },
        ..WorkerConfig::default()
    };
    let worker = Worker::builder(db.clone(), db.clone())
        .config(config)
        .handle::<Ship>(|job: Ship, _ctx: JobContext| async move {
            if job.parcel > 4 { Err(JobError::retry("carrier timeout")) } else { Ok(()) }
        })
        .alert_fn(|_alert| async { Ok(()) })
        .build()
        .start();
    for _ in 0..400 {
        if worker.stats().succeeded == 4 && worker.stats().dead_lettered == 2 && worker.stats().alerted == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let stats = worker.shutdown().await;
    assert_eq!((stats.succeeded, stats.retried, stats.dead_lettered), (4, 2, 2), "{stats:?}");
    db.enqueue_job(&Ship { parcel: 7 }).await.unwrap(); // waiting: the queue's depth

    let url = serve(Dashboard::new(db.clone()).with_metrics(handle)).await;
    let scrape = reqwest::get(format!("{url}/metrics")).await.unwrap();
    assert_eq!(scrape.headers()["content-type"], "text/plain; version=0.0.4");
    let text = scrape.text().await.unwrap();
    let jobs = |outcome: &str| sample(&text, &format!("redrive_jobs_total{{kind=\"ship\",outcome=\"{outcome}\"}}"));
    assert_eq!(jobs("claimed"), Some(stats.claimed as f64), "{text}");
    assert_eq!(jobs("succeeded"), Some(stats.succeeded as f64));
    assert_eq!(jobs("retried"), Some(stats.retried as f64));
    assert_eq!(jobs("dead_lettered"), Some(stats.dead_lettered as f64));
    assert_eq!(sample(&text, "redrive_handlers_started_total{kind=\"ship\"}"), Some(8.0), "4 + 2 × 2 attempts");
    assert_eq!(sample(&text, "redrive_handler_seconds_count{kind=\"ship\"}"), Some(8.0));
    assert_eq!(sample(&text, "redrive_alerts_total{result=\"sent\"}"), Some(stats.alerted as f64));
    assert_eq!(sample(&text, "redrive_open_records"), Some(db.count_open().await.unwrap() as f64));
    assert_eq!(sample(&text, "redrive_queue_jobs{state=\"queued\"}"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "redrive_queue_jobs{state=\"scheduled\"}"), Some(0.0));
    assert_eq!(sample(&text, "redrive_queue_jobs{state=\"running\"}"), Some(0.0));
    assert!(sample(&text, "redrive_oldest_open_record_seconds").is_some_and(|s| s > 0.0), "{text}");
    assert!(sample(&text, "redrive_oldest_ready_job_seconds").is_some_and(|s| s >= 0.0), "{text}");
    assert!(!text.contains("parcel"), "no key or payload value in a label");
}
