//! The lease behaviours: a worker that dies holding a job, a stale lease, shutdown, jobs claimed
//! ahead and stranded, a handler slower than its lease.

use std::sync::Arc;
use std::time::Duration;

use redrive_core::kit::{Begin, Claim, Kinds, Lease, Ledger, Renew};
use redrive_core::{ErrorKind, WorkerConfig};

use crate::frozen::{Freeze, Frozen};
use crate::harness::{Fault, Probe, Run, ensure};
use crate::{Outcome, Queue, Subject};

/// Renews `lease` where the queue can; a queue without renewal cannot be asked to.
async fn renew<Q: Claim>(queue: &Q, lease: &Lease, by: Duration) -> redrive_core::Result<()> {
    match queue.renewal() {
        Some(renewal) => renewal.renew(lease, by).await.map(|_| ()),
        None => Err(redrive_core::Error::new(ErrorKind::LeaseLost, "no renewal")),
    }
}

/// Behaviour 8: A worker that dies holding a lease (and the key): the job runs again after the lease
/// expires, once, told that an earlier attempt was left pending.
pub async fn dead_worker<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("dead_worker", subject);
    let job = Probe::new(11).new_job();
    run.must("enqueue", run.s.queue.enqueue(job.clone()).await)?;
    let lease = run.short_lease();
    let mut held = run.must("claim", run.s.queue.claim(&Kinds::Any, 1, lease, run.s.timing.timeout).await)?;
    ensure!(run, held.len() == 1, "the job should be claimable");
    // Its handler starts: the lease is renewed, which marks the attempt started (and charged).
    run.must("renew", renew(&run.s.queue, &held[0].lease, lease).await)?;
    // The key's hold: as the claim carried it (a queue that is its jobs' ledger), else the ledger's.
    let begin = match held[0].begun.clone() {
        Some(begun) => begun,
        None => run.must("ledger begin", run.s.ledger.begin(&job.key, &job.payload, job.provider_key, lease).await)?,
    };
    ensure!(run, matches!(begin, Begin::Fresh(_)), "the dying worker should hold the key fresh, got {begin:?}");
    drop(held.pop()); // the worker dies: nothing settles the job

    let worker = run.worker(1);
    run.wait_for_effects(1).await?;
    run.settle().await;
    worker.shutdown().await;
    let effects = run.script.effects_of(&job.key);
    ensure!(run, effects.len() == 1 && effects[0].attempt == 2, "one effect on attempt 2 expected, got {effects:?}");
    ensure!(run, effects[0].earlier_attempt_pending, "the second attempt should know the first was left pending");
    run.report(&[11], &[]).await
}

/// Behaviour 9: A stale lease (expired and re-claimed) cannot complete, retry, extend or dead-letter the
/// job; the current lease can.
pub async fn stale_lease<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("stale_lease", subject);
    let q = &run.s.queue;
    let lease = run.short_lease();
    run.must("enqueue", q.enqueue(Probe::new(12).new_job()).await)?;
    let stale = run
        .must("claim", q.claim(&Kinds::Any, 1, lease, run.s.timing.timeout).await)?
        .pop()
        .ok_or_else(|| run.fail("nothing claimed"))?;
    // Its handler starts (so the lapse charges the attempt), then stalls past the lease.
    run.must("renew", renew(q, &stale.lease, lease).await)?;
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    let current = run
        .must("re-claim", q.claim(&Kinds::Any, 1, run.s.timing.lease * 10, run.s.timing.timeout).await)?
        .pop()
        .ok_or_else(|| run.fail("the expired lease was not re-claimable"))?;
    ensure!(run, current.job.attempt == 2, "the re-claim should be attempt 2, is {}", current.job.attempt);
    let refused = [
        ("complete", q.complete(&stale.lease, None).await),
        ("retry", q.retry(&stale.lease, Duration::ZERO, "stale").await),
        ("renew", renew(q, &stale.lease, lease).await),
        ("dead_letter", q.dead_letter(&stale, "stale").await.map(|_| ())),
    ];
    for (call, result) in refused {
        ensure!(
            run,
            result.as_ref().is_err_and(|e| e.kind() == ErrorKind::LeaseLost),
            "{call} with a stale lease should be LeaseLost, got {result:?}"
        );
    }
    ensure!(run, run.must("count", q.count_open().await)? == 0, "a stale dead-letter must not write a record");
    run.must("complete with the current lease", q.complete(&current.lease, None).await)?;
    let left = run.must("claim", q.claim(&Kinds::Any, 1, lease, lease).await)?;
    ensure!(run, left.is_empty(), "a completed job should not come back");
    Ok(crate::Report::default())
}

/// Behaviour 12: Graceful shutdown loses and duplicates nothing: within the grace, running handlers
/// finish; past it, their jobs are released at once (well before the lease would expire) and
/// the next worker runs them.
pub async fn graceful_shutdown<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("graceful_shutdown", subject);
    run.script.delay(Duration::from_millis(400));
    let ids: Vec<u32> = (30..36).collect();
    let jobs = ids.iter().map(|&id| Probe::new(id).new_job()).collect();
    run.must("batch enqueue", run.s.queue.enqueue_batch(jobs).await)?;
    let started = |n: usize| {
        let script = Arc::clone(&run.script);
        move || {
            let script = Arc::clone(&script);
            async move { script.starts.lock().unwrap().len() >= n }
        }
    };

    // Within the grace: the two running handlers finish.
    let patient = run.worker_with(2, run.s.timing.lease, Duration::from_secs(30));
    run.wait_for("two handlers to start", started(2)).await?;
    let stats = patient.shutdown().await;
    ensure!(
        run,
        stats.released == 0 && run.script.effect_count() >= 2,
        "running handlers should finish within the grace; {stats:?}"
    );

    // Past the grace: the running jobs are released, not left to a long lease.
    let long_lease = Duration::from_secs(120);
    let before = run.script.starts.lock().unwrap().len();
    let hasty = run.worker_with(2, long_lease, Duration::ZERO);
    run.wait_for("two more handlers to start", started(before + 2)).await?;
    let stats = hasty.shutdown().await;
    ensure!(run, stats.released >= 1, "handlers past the grace should be released; {stats:?}");

    run.script.delay(Duration::ZERO);
    let finisher = run.worker_with(4, long_lease, Duration::from_secs(30));
    run.wait_for_effects(ids.len()).await?;
    run.settle().await;
    finisher.shutdown().await;
    run.report(&ids, &[]).await
}

/// Behaviour 13: A worker that dies with jobs claimed ahead of its handlers strands them for the
/// claim lease, not the lease: another worker runs them within a few claim leases, once each. The
/// job whose handler was running keeps its full lease (its handler may still be at work), then
/// runs once, told that an earlier attempt was left pending.
pub async fn stranded_claims<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("stranded_claims", subject);
    let ids: Vec<u32> = (40..80).collect();
    let hung = 45;
    run.script.fault(hung, Fault::HangFirst);
    let jobs = ids.iter().map(|&id| Probe::new(id).new_job()).collect();
    run.must("batch enqueue", run.s.queue.enqueue_batch(jobs).await)?;

    // One handler, a claim lease of one unit and a full lease of eight: the jobs before the hung
    // one teach the worker that jobs are quick, so it claims whole batches ahead of the handler.
    let unit = run.s.timing.lease;
    let config = WorkerConfig { claim_lease: unit, batch: 8, ..run.config(1, unit * 8, Duration::ZERO) };
    let freeze = Arc::new(Freeze::default());
    let dying = run.start_worker_on(
        Frozen::new(run.s.queue.clone(), &freeze),
        Frozen::new(run.s.ledger.clone(), &freeze),
        config,
    );
    let script = Arc::clone(&run.script);
    let key = Probe::key(hung);
    run.wait_for("the hanging handler to start", || {
        let (script, key) = (Arc::clone(&script), key.clone());
        async move { !script.starts_of(&key).is_empty() }
    })
    .await?;
    tokio::time::sleep(unit / 4).await; // the claimers fill the buffer
    freeze.all();
    let killed_at = tokio::time::Instant::now();
    let (claimed, started) = (dying.stats().claimed, run.script.starts.lock().unwrap().len() as u64);
    ensure!(run, claimed > started, "the worker should hold jobs claimed ahead (claimed {claimed}, started {started})");

    let survivor = run.worker(4);
    run.wait_for_effects(ids.len() - 1).await?;
    let took = killed_at.elapsed();
    ensure!(
        run,
        took < unit * 5,
        "the {} jobs claimed ahead and never started took {took:?} to run after their worker died; \
         they should wait out the claim lease ({unit:?}), not the lease ({:?})",
        claimed - started,
        unit * 8
    );
    run.wait_for_effects(ids.len()).await?;
    let hung_again = killed_at.elapsed();
    run.settle().await;
    survivor.shutdown().await;
    ensure!(
        run,
        hung_again >= unit * 6,
        "the job whose handler had started ran again {hung_again:?} after its worker died; it should \
         keep its full lease ({:?}), its handler may still be at work",
        unit * 8
    );
    let effects = run.script.effects_of(&key);
    ensure!(
        run,
        effects.len() == 1 && effects[0].attempt >= 2 && effects[0].earlier_attempt_pending,
        "the hung job should run once more after its lease, told its first attempt was left pending: {effects:?}"
    );
    drop(dying); // its tasks stay parked on the frozen backend
    run.report(&ids, &[]).await
}

/// Behaviour 14: A handler that runs two and a half times its lease, with the worker's heartbeat
/// on and with it off: the handler starts once and the effect happens once. With the heartbeat
/// off the lease may lapse and the job be delivered again; the key's hold, kept while the handler
/// runs, turns that delivery away.
pub async fn slow_handler<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("slow_handler", subject);
    // Twice the subject's lease, so that a renewal late by a moment under load is not a lapse.
    let unit = run.s.timing.lease * 2;
    run.script.delay(unit * 5 / 2);
    let ids = [50, 51];
    for (id, heartbeat) in ids.into_iter().zip([true, false]) {
        run.must("enqueue", run.s.queue.enqueue(Probe::new(id).new_job()).await)?;
        let config = WorkerConfig { heartbeat: heartbeat.then_some(unit / 3), ..run.config(1, unit, Duration::ZERO) };
        // The slow handler's worker stops claiming once it runs, so that any delivery of the job
        // meanwhile goes to the second worker rather than into the first one's buffer.
        let freeze = Arc::new(Freeze::default());
        let slow = run.start_worker_on(
            Frozen::new(run.s.queue.clone(), &freeze),
            Frozen::new(run.s.ledger.clone(), &freeze),
            config.clone(),
        );
        let (script, key) = (Arc::clone(&run.script), Probe::key(id));
        run.wait_for("the slow handler to start", || {
            let (script, key) = (Arc::clone(&script), key.clone());
            async move { !script.starts_of(&key).is_empty() }
        })
        .await?;
        freeze.claims();
        let other = run.start_worker(config);
        let done = run.script.effect_count() + 1;
        run.wait_for_effects(done).await?;
        run.settle().await;
        other.shutdown().await;
        drop(slow); // its claimers stay parked on the frozen claims
        let starts = run.script.starts_of(&key);
        let heartbeat = if heartbeat { "on" } else { "off" };
        ensure!(
            run,
            starts.len() == 1,
            "with the heartbeat {heartbeat}, the slow handler started {} times",
            starts.len()
        );
    }
    run.report(&ids, &[]).await
}
