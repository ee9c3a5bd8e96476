//! Jobs with a time: a deadline past which a job is dropped, a time before which it does not run.

use std::time::Duration;

use redrive_core::kit::Ledger;

use crate::harness::{Probe, Run, ensure};
use crate::{Outcome, Queue, Subject};

/// Behaviour 26: A job claimed past its deadline is dropped and counted: not run, not
/// dead-lettered, not alerted. A job within its deadline runs.
pub async fn expired<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("expired", subject);
    let late = Probe::new(69).new_job().expires_at(chrono::Utc::now() - chrono::Duration::seconds(1));
    let timely = Probe::new(70).new_job().expires_in(Duration::from_secs(600));
    run.must("enqueue", run.s.queue.enqueue(late).await)?;
    run.must("enqueue", run.s.queue.enqueue(timely).await)?;
    let worker = run.worker(2);
    run.wait_for_effects(1).await?;
    run.wait_for("the late job to be dropped", || {
        let dropped = worker.stats().expired;
        async move { dropped >= 1 }
    })
    .await?;
    run.settle().await;
    let stats = worker.shutdown().await;
    ensure!(run, stats.expired == 1, "one job should be dropped as expired, {} were", stats.expired);
    ensure!(run, stats.dead_lettered == 0, "an expired job is not a failure: {} records", stats.dead_lettered);
    ensure!(run, run.script.effects_of(&Probe::key(69)).is_empty(), "the late job should not run");
    ensure!(run, run.script.alert_count() == 0, "an expired job raises no alert");
    run.report(&[70], &[]).await
}

/// Behaviour 27: A job enqueued to run later (`enqueue_in`) runs no earlier than asked, once,
/// on its first attempt: waiting for its time costs no attempt, natively or put back by the
/// worker.
pub async fn scheduled<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("scheduled", subject);
    let delay = run.s.timing.lease * 2;
    let asked = tokio::time::Instant::now();
    let job = Probe::new(71).new_job();
    run.must("enqueue", redrive_core::EnqueueExt::enqueue_in(&run.s.queue, job, delay).await)?;
    let worker = run.worker(1);
    run.wait_for_effects(1).await?;
    let took = asked.elapsed();
    run.settle().await;
    worker.shutdown().await;
    // Times are kept to the millisecond.
    ensure!(
        run,
        took + Duration::from_millis(5) >= delay,
        "the job ran {took:?} after it was enqueued, asked {delay:?}"
    );
    let effects = run.script.effects_of(&Probe::key(71));
    ensure!(run, effects.len() == 1, "one effect expected, got {}", effects.len());
    ensure!(run, effects[0].attempt == 1, "waiting should cost no attempt: it ran on attempt {}", effects[0].attempt);
    run.report(&[71], &[]).await
}
