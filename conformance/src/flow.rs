//! Flow control (issue 25): a handler's "not now", which puts a job back at no attempt's cost
//! while the job is young enough, and a hard timeout per kind, which cancels a handler and counts
//! its attempt.

use std::sync::Arc;
use std::time::Duration;

use redrive_core::kit::{Begin, Ledger};
use redrive_core::{FailureQuery, FailureRecord, NewJob, ProviderKey, WorkerConfig};

use crate::harness::{Fault, Handles, Probe, Run, ensure};
use crate::{Outcome, Queue, Subject, Violation};

/// Behaviour 35: A handler that says "not now" (`JobError::not_now`, a 429 with `Retry-After`)
/// three times, on a job with a cap of 2: each time the job is put back at no attempt's cost, no
/// error written; it runs again after the delay on attempt 1, and its effect happens once (or, if
/// it then fails for good, its record counts one attempt and one error). A job older than the
/// worker's `max_not_now` spends an attempt on each "not now" and ends as a full record at its
/// cap: the backend keeps when the job was first enqueued through its deferrals, so a job cannot
/// wait for ever unseen.
pub async fn not_now<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("not_now", subject);
    let lease = run.s.timing.lease;
    let delay = lease / 4;
    run.script.fault(95, Fault::NotNowFirst(3, delay));
    run.script.fault(96, Fault::NotNowThenFail(3, delay));
    for id in [95, 96] {
        run.must("enqueue", run.s.queue.enqueue(Probe::new(id).new_job().with_cap(2)).await)?;
    }
    let worker = run.worker(2);
    // Its effect, or (where a deferral spends an attempt) its record.
    let (script, queue) = (Arc::clone(&run.script), run.s.queue.clone());
    run.wait_for("probe 95's effect or record", || {
        let (script, queue) = (Arc::clone(&script), queue.clone());
        async move {
            !script.effects_of(&Probe::key(95)).is_empty()
                || queue.list(&FailureQuery::by_key(Probe::key(95))).await.is_ok_and(|r| !r.is_empty())
        }
    })
    .await?;
    record_of(&run, 96).await?;
    run.settle().await;
    worker.shutdown().await;
    for id in [95, 96] {
        let starts = run.script.starts_of(&Probe::key(id));
        ensure!(
            run,
            starts == [1, 1, 1, 1],
            "probe {id} said \"not now\" three times with a cap of 2: a \"not now\" costs no attempt, so every \
             run should be attempt 1; ran attempts {starts:?}"
        );
    }
    let effects = run.script.effects_of(&Probe::key(95));
    ensure!(
        run,
        effects.len() == 1 && effects[0].attempt == 1,
        "the job put back three times should have its effect once, on attempt 1; effects on attempts {:?}",
        effects.iter().map(|e| e.attempt).collect::<Vec<_>>()
    );
    let failed = record_of(&run, 96).await?;
    let history: Vec<u32> = failed.errors.iter().map(|e| e.attempt).collect();
    ensure!(
        run,
        failed.attempts == 1 && history == [1] && failed.last_error.contains("forced permanent failure"),
        "the record of a job put back three times, then failed for good, should count 1 attempt and hold the one \
         error; counts {} attempts, errors at attempts {history:?}, last error {:?}",
        failed.attempts,
        failed.last_error
    );
    ensure!(run, alerts_of(&run, 96) == 1, "expected one alert for the record, got {}", alerts_of(&run, 96));

    // Too old to wait at no cost: each "not now" an attempt, to the cap.
    run.script.fault(97, Fault::NotNowFirst(u32::MAX, delay));
    run.must("enqueue", run.s.queue.enqueue(Probe::new(97).new_job().with_cap(2)).await)?;
    let config = WorkerConfig { max_not_now: lease * 2, ..run.config(2, lease, Duration::from_secs(30)) };
    let worker = run.start_worker(config);
    let exhausted = record_of(&run, 97).await;
    run.settle().await;
    worker.shutdown().await;
    let exhausted = exhausted.map_err(|v| {
        run.fail(format!(
            "{}: a job saying \"not now\" past the worker's max_not_now ({:?}) should spend its attempts and end as \
             a record; a backend whose deferral forgets when the job was enqueued lets it wait for ever",
            v.message,
            lease * 2
        ))
    })?;
    let history: Vec<u32> = exhausted.errors.iter().map(|e| e.attempt).collect();
    ensure!(
        run,
        exhausted.attempts == 2 && history == [1, 2] && exhausted.last_error.contains("rate limited"),
        "a job too old to wait should end as a full record at its cap of 2, with its \"not now\" as the error; \
         counts {} attempts, errors at attempts {history:?}, last error {:?}",
        exhausted.attempts,
        exhausted.last_error
    );
    let starts = run.script.starts_of(&Probe::key(97));
    ensure!(run, starts.ends_with(&[1, 2]), "the old job's last runs should be attempts 1 and 2, ran {starts:?}");
    run.report(&[95], &[96, 97]).await
}

/// Behaviour 36: A kind with a timeout (`WorkerBuilder::timeout`, `Job::TIMEOUT`): a handler
/// still running at the limit is cancelled (no effect), the attempt counts as a retryable
/// failure, and at the cap the job is a full record whose errors say "timed out after …", with
/// one alert; the key's hold is released, so the key is free once the record is written. A
/// quick job of the same kind runs once, on attempt 1.
pub async fn timeout<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("timeout", subject);
    let lease = run.s.timing.lease;
    let limit = lease / 2;
    run.script.fault(98, Fault::Takes(lease * 30));
    let slow = Probe::new(98).new_job().with_cap(2);
    run.must("enqueue", run.s.queue.enqueue(slow.clone()).await)?;
    run.must("enqueue", run.s.queue.enqueue(Probe::new(99).new_job()).await)?;
    let config = run.config(2, lease, Duration::from_secs(30));
    let worker = run
        .builder_for(run.s.queue.clone(), run.s.ledger.clone(), config, Handles::Both)
        .timeout::<Probe>(limit)
        .build()
        .start();
    run.wait_for_effects(1).await?;
    let record = record_of(&run, 98).await;
    // At once: a hold left behind would lapse within a lease.
    let held = key_held(&run, &slow).await;
    run.settle().await;
    let stats = worker.shutdown().await;
    let record = record?;
    if let Some(held_for) = held? {
        return Err(run.fail(format!(
            "the key of the timed-out job was still held ({held_for:?}) once its record was written: a timeout \
             releases the key's hold"
        )));
    }
    let starts = run.script.starts_of(&slow.key);
    ensure!(run, starts == [1, 2], "the job that overran its timeout should run attempts [1, 2], ran {starts:?}");
    let history: Vec<u32> = record.errors.iter().map(|e| e.attempt).collect();
    ensure!(
        run,
        record.attempts == 2
            && history == [1, 2]
            && record.errors.iter().all(|e| e.error.starts_with("timed out after"))
            && record.payload == slow.payload,
        "the record should count 2 attempts, each \"timed out after …\", with the payload; counts {}, errors {:?}",
        record.attempts,
        record.errors.iter().map(|e| (e.attempt, e.error.as_str())).collect::<Vec<_>>()
    );
    ensure!(run, stats.timed_out == 2, "the worker should count 2 timeouts; stats {stats:?}");
    ensure!(run, alerts_of(&run, 98) == 1, "expected one alert for the record, got {}", alerts_of(&run, 98));
    let quick = run.script.effects_of(&Probe::key(99));
    ensure!(
        run,
        quick.len() == 1 && quick[0].attempt == 1,
        "a handler under its timeout should have its effect once, on attempt 1"
    );
    run.report(&[99], &[98]).await
}

/// For how long the job's key is still held, if it is; otherwise takes the key and lets it go.
async fn key_held<Q: Queue, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    job: &NewJob,
) -> Result<Option<Duration>, Violation> {
    let lease = run.s.timing.lease;
    match run.must("ledger begin", run.s.ledger.begin(&job.key, &job.payload, ProviderKey::mint(), lease).await)? {
        Begin::Fresh(hold) | Begin::Resumed(hold) => {
            run.must("release the hold", run.s.ledger.release_hold(&hold).await)?;
            Ok(None)
        }
        Begin::Busy(held_for) => Ok(Some(held_for)),
        Begin::Done(_) => Err(run.fail(format!("the key {} is done, though no attempt finished", job.key))),
        Begin::Cancelled(_) => Err(run.fail(format!("the key {} is cancelled, though nobody cancelled it", job.key))),
    }
}

/// The open failure record of probe `id`, once there is one.
async fn record_of<Q: Queue, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    id: u32,
) -> Result<FailureRecord, Violation> {
    let key = Probe::key(id);
    let queue = run.s.queue.clone();
    run.wait_for(&format!("the failure record of {key}"), || {
        let (queue, key) = (queue.clone(), key.clone());
        async move { queue.list(&FailureQuery::by_key(key)).await.is_ok_and(|r| !r.is_empty()) }
    })
    .await?;
    let records = run.must("list", run.s.queue.list(&FailureQuery::by_key(key.clone())).await)?;
    records.into_iter().next().ok_or_else(|| run.fail(format!("the record of {key} is gone")))
}

/// Alerts delivered for probe `id`'s records.
fn alerts_of<Q: Queue, L: Ledger + Clone + 'static>(run: &Run<Q, L>, id: u32) -> usize {
    run.script.alerts.lock().unwrap().iter().filter(|a| a.record.key == Probe::key(id)).count()
}
