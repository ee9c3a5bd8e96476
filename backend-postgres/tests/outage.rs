//! A user's outage test (issue 25): 1,000 charge jobs on PostgreSQL, two workers with the default
//! configuration (default backoff, cap 5) and a circuit breaker, and a payment provider that
//! answers 503 for the first 60 seconds. Before flow control this ended as 1,000 failure records
//! and 1,000 alerts within 32 s, 5,000 handler calls and no effect after the provider came back.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::alert::BoxFuture;
use redrive_core::{
    Alert, AlertSink, Breaker, DeadLetter, EnqueueExt, Flow, JobContext, JobError, PauseAlert, RunningWorker, Worker,
};
use redrive_postgres::PgBackend;

use crate::common::Charge;

const JOBS: u32 = 1_000;
const OUTAGE: Duration = Duration::from_secs(60);

/// What the user watches: the provider's effects, its calls, the alerts.
#[derive(Default)]
struct Watch {
    provider_down: AtomicBool,
    /// The breaker's pause, as the store shows it (sampled every 50 ms).
    paused: AtomicBool,
    effects: Mutex<HashMap<u32, u32>>,
    calls: AtomicUsize,
    calls_while_paused: AtomicUsize,
    record_alerts: AtomicUsize,
    pause_alerts: Mutex<Vec<PauseAlert>>,
}

struct Pager(Arc<Watch>);

impl AlertSink for Pager {
    fn send<'a>(&'a self, _alert: &'a Alert) -> BoxFuture<'a, redrive_core::Result<()>> {
        self.0.record_alerts.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }

    fn paused<'a>(&'a self, alert: &'a PauseAlert) -> BoxFuture<'a, redrive_core::Result<()>> {
        self.0.pause_alerts.lock().unwrap().push(alert.clone());
        Box::pin(async { Ok(()) })
    }
}

fn worker(backend: &PgBackend, watch: &Arc<Watch>, breaker: Breaker) -> RunningWorker {
    let seen = Arc::clone(watch);
    Worker::builder(backend.clone(), backend.clone())
        .handle::<Charge>(move |job: Charge, _ctx: JobContext| {
            let seen = Arc::clone(&seen);
            async move {
                seen.calls.fetch_add(1, Ordering::SeqCst);
                // During the outage: after it, the sampler's last look may lag the resume.
                if seen.paused.load(Ordering::SeqCst) && seen.provider_down.load(Ordering::SeqCst) {
                    seen.calls_while_paused.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                if seen.provider_down.load(Ordering::SeqCst) {
                    return Err(JobError::retry("payment provider answered 503 Service Unavailable"));
                }
                *seen.effects.lock().unwrap().entry(job.order).or_default() += 1;
                Ok::<_, JobError>(())
            }
        })
        .breaker::<Charge>(breaker)
        .alert(Pager(Arc::clone(watch)))
        .build()
        .start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_60_second_provider_outage_under_a_breaker_leaves_no_record_and_every_effect_once() {
    let backend = common::backend("outage").await;
    let watch = Arc::new(Watch::default());
    watch.provider_down.store(true, Ordering::SeqCst);
    for order in 0..JOBS {
        backend.enqueue_job(&Charge { order }).await.expect("enqueue");
    }
    // The defaults but a 10 s cool-down, so that the provider's return is probed within 10 s.
    let breaker = Breaker { cool_down: Duration::from_secs(10), ..Breaker::default() };
    let workers = [worker(&backend, &watch, breaker), worker(&backend, &watch, breaker)];
    let sampler = {
        let (backend, watch) = (backend.clone(), Arc::clone(&watch));
        tokio::spawn(async move {
            loop {
                let kinds = backend.kinds().await.expect("the kinds' flow");
                let paused = kinds.iter().any(|k| k.kind == "charge" && k.paused.is_some());
                watch.paused.store(paused, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    tokio::time::sleep(OUTAGE).await;
    let calls_in_outage = watch.calls.load(Ordering::SeqCst);
    watch.provider_down.store(false, Ordering::SeqCst);
    common::wait_for("every charge's effect after the outage", 60, async || {
        watch.effects.lock().unwrap().len() == JOBS as usize
    })
    .await;
    // Late duplicates would show here.
    tokio::time::sleep(Duration::from_secs(2)).await;
    sampler.abort();
    for worker in workers {
        worker.shutdown().await;
    }

    assert_eq!(backend.count_open().await.expect("count"), 0, "an outage under a breaker leaves no failure record");
    assert_eq!(watch.record_alerts.load(Ordering::SeqCst), 0, "no record, so no record's alert");
    let pause_alerts = watch.pause_alerts.lock().unwrap().clone();
    assert_eq!(pause_alerts.len(), 1, "one alert says the kind paused, across both workers: {pause_alerts:?}");
    let effects = watch.effects.lock().unwrap().clone();
    let twice: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(effects.len() == JOBS as usize && twice.is_empty(), "every charge once; not once: {twice:?}");
    // While paused only probes run: one per cool-down (6 in 60 s), and at the trip whatever the
    // two workers had already started or admitted before they read the pause (16 handlers), and
    // what starts in the sampler's 50 ms.
    let while_paused = watch.calls_while_paused.load(Ordering::SeqCst);
    assert!(while_paused <= 6 + 16, "{while_paused} handler calls while the kind was paused");
    assert!(calls_in_outage < 200, "{calls_in_outage} calls reached the provider during the outage");
    let history = backend.events(Some("charge"), 10).await.expect("the trail");
    eprintln!(
        "outage: {calls_in_outage} calls during the 60 s outage, {while_paused} while paused, {} calls in all; trail {:?}",
        watch.calls.load(Ordering::SeqCst),
        history.iter().map(|e| (e.action, e.by.as_str(), e.detail.as_str())).collect::<Vec<_>>()
    );
}
