//! The worker's metrics (the `metrics` facade), scraped as Prometheus text, agree with its own
//! counts. A file of its own: the recorder is global to the test process.

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use redrive_core::{
    DeadLetter, EnqueueExt, FailureQuery, Job, JobContext, JobError, KeyBuilder, MemoryBackend, Worker, WorkerConfig,
};
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

/// The value of the sample `name{labels}` in Prometheus text, 0 when absent.
fn sample(text: &str, name_and_labels: &str) -> f64 {
    text.lines().find_map(|line| line.strip_prefix(name_and_labels)?.trim().parse().ok()).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_metrics_match_the_workers_counts_and_carry_no_key() {
    let handle = PrometheusBuilder::new().install_recorder().expect("the only recorder");
    let backend = MemoryBackend::new();
    for parcel in 1..=4 {
        backend.enqueue_job(&Ship { parcel }).await.unwrap();
    }
    let config = WorkerConfig {
        poll: Duration::from_millis(50),
        backoff: redrive_core::Backoff { base: Duration::from_millis(10), ..redrive_core::Backoff::default() },
        ..WorkerConfig::default()
    };
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .handle::<Ship>(|job: Ship, _ctx: JobContext| async move {
            if job.parcel == 4 { Err(JobError::retry("carrier timeout")) } else { Ok(()) }
        })
        .alert_fn(|_alert| async { Ok(()) })
        .build()
        .start();
    for _ in 0..200 {
        if worker.stats().succeeded == 3 && worker.stats().alerted == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let stats = worker.shutdown().await;
    assert_eq!((stats.succeeded, stats.retried, stats.dead_lettered, stats.alerted), (3, 1, 1, 1), "{stats:?}");
    assert_eq!(backend.list(&FailureQuery::open()).await.unwrap().len(), 1);

    let text = handle.render();
    let jobs = |outcome: &str| sample(&text, &format!("redrive_jobs_total{{kind=\"ship\",outcome=\"{outcome}\"}}"));
    assert_eq!(jobs("claimed"), stats.claimed as f64, "{text}");
    assert_eq!(jobs("succeeded"), 3.0, "{text}");
    assert_eq!(jobs("retried"), 1.0);
    assert_eq!(jobs("dead_lettered"), 1.0);
    assert_eq!(sample(&text, "redrive_handlers_started_total{kind=\"ship\"}"), 5.0, "3 successes and 2 attempts");
    assert_eq!(sample(&text, "redrive_handler_seconds_count{kind=\"ship\"}"), 5.0, "{text}");
    assert_eq!(sample(&text, "redrive_alerts_total{result=\"sent\"}"), 1.0);
    assert!(!text.contains("parcel"), "no key or payload value in a label: {text}");
}
