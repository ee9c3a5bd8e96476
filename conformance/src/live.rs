//! Live jobs and cancel (issue 26): a queued or scheduled job cancelled by id or by key never
//! runs, stays cancelled with its audit, and its key stays taken.

use std::time::Duration;

use redrive_core::kit::Ledger;
use redrive_core::{CancelOutcome, Enqueued, ErrorKind, JobQuery, JobState, Jobs, JobsExt};

use crate::harness::{Probe, Run, ensure};
use crate::{Outcome, Queue, Subject};

/// Behaviour 46: Three jobs: one ready, one scheduled an hour ahead, one left to run. The list
/// shows each in its state, filtered by state and key. A cancel without a reason or an actor is
/// refused and changes nothing; the ready one is cancelled by id, the scheduled one by key, and a
/// second cancel is answered with the first one's audit. A worker then runs the third and never
/// starts the cancelled two; enqueued again, a cancelled key answers a duplicate of its cancelled
/// job and does not run; both stay cancelled, with who and why. A finished job is not cancelled.
/// A backend that cannot list its jobs (`Capabilities::live_jobs` unset) must refuse every call
/// as `Unsupported`.
pub async fn cancel<Q: Queue + Jobs, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("cancel", subject);
    let q = &run.s.queue;
    if !run.caps.live_jobs {
        let listed = q.list_jobs(&JobQuery::default()).await.map(|_| ());
        let cancelled = q.cancel_key(&Probe::key(430), "superseded", "ana").await.map(|_| ());
        for (what, answer) in [("a listing", listed), ("a cancel", cancelled)] {
            ensure!(
                run,
                answer.as_ref().is_err_and(|e| e.kind() == ErrorKind::Unsupported),
                "the backend does not list its jobs (Capabilities::live_jobs), so {what} should be refused as \
                 Unsupported; answered {answer:?}"
            );
        }
        return run.report(&[], &[]).await;
    }
    let (ready, later, runs) = (430, 431, 432);
    let id_of = |answer: Enqueued| match answer {
        Enqueued::Created(id) => Some(id),
        _ => None,
    };
    let ready_id = run.must("enqueue", q.enqueue(Probe::new(ready).new_job()).await)?;
    let at = chrono::Utc::now() + chrono::Duration::hours(1);
    run.must("enqueue", q.enqueue(Probe::new(later).new_job().run_at(at)).await)?;
    let ready_id = id_of(ready_id).ok_or_else(|| run.fail("a new key should be created"))?;

    let queued = run.must(
        "list queued jobs",
        q.list_jobs(&JobQuery { state: Some(JobState::Queued), ..JobQuery::default() }).await,
    )?;
    ensure!(run, queued.iter().any(|j| j.id == ready_id), "the ready job should be listed as queued: {queued:?}");
    ensure!(run, queued.iter().all(|j| j.key != Probe::key(later)), "a job an hour ahead is scheduled, not queued");
    let by_key = JobQuery { key: Some(Probe::key(later)), ..JobQuery::default() };
    let scheduled = run.must("list by key", q.list_jobs(&by_key).await)?;
    ensure!(
        run,
        scheduled.len() == 1 && scheduled[0].state == JobState::Scheduled && scheduled[0].run_at.is_some(),
        "the key's one job should be listed, scheduled with its time: {scheduled:?}"
    );
    let shown = run.must("get the job", q.get_job(&ready_id).await)?;
    ensure!(
        run,
        shown.key == Probe::key(ready) && shown.payload == Probe::new(ready).new_job().payload && shown.attempts == 0,
        "the job should show its key, payload and no attempt: {shown:?}"
    );

    for (reason, actor) in [("", "ana"), ("superseded", " ")] {
        let refused = q.cancel_job(&ready_id, reason, actor).await;
        ensure!(
            run,
            refused.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
            "a cancel without a reason or an actor should be refused as InvalidInput: {refused:?}"
        );
    }
    let still = run.must("get the job", q.get_job(&ready_id).await)?;
    ensure!(run, still.state == JobState::Queued, "a refused cancel should change nothing: {:?}", still.state);

    let first = run.must("cancel by id", q.cancel_job(&ready_id, "the order was withdrawn", "ana").await)?;
    ensure!(run, first == CancelOutcome::Cancelled, "the ready job should be cancelled: {first:?}");
    let (_, by_key_outcome) = run.must("cancel by key", q.cancel_key(&Probe::key(later), "superseded", "ben").await)?;
    ensure!(
        run,
        by_key_outcome == CancelOutcome::Cancelled,
        "the scheduled job should be cancelled: {by_key_outcome:?}"
    );
    let again = run.must("cancel again", q.cancel_job(&ready_id, "twice", "cy").await)?;
    ensure!(
        run,
        matches!(&again, CancelOutcome::AlreadyCancelled(c) if c.actor == "ana" && c.reason == "the order was withdrawn"),
        "a second cancel should change nothing and answer the first one's audit: {again:?}"
    );
    let missing = q.cancel_job(&redrive_core::JobId("999999999".into()), "gone", "ana").await;
    ensure!(
        run,
        missing.as_ref().is_err_and(|e| e.kind() == ErrorKind::NotFound),
        "cancelling a job that does not exist should be NotFound: {missing:?}"
    );

    run.must("enqueue", q.enqueue(Probe::new(runs).new_job()).await)?;
    let worker = run.worker(2);
    run.wait_for_effects(1).await?;
    let again = run.must("enqueue a cancelled key again", q.enqueue(Probe::new(ready).new_job()).await)?;
    ensure!(
        run,
        matches!(&again, Enqueued::Duplicate { id, .. } if *id == ready_id),
        "a cancelled key stays taken: enqueued again it should answer a duplicate of the cancelled job, got {again:?}"
    );
    run.settle().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    worker.shutdown().await;
    for id in [ready, later] {
        ensure!(run, run.script.starts_of(&Probe::key(id)).is_empty(), "cancelled job {id} should never start");
    }
    for (id, reason, actor) in [(ready, "the order was withdrawn", "ana"), (later, "superseded", "ben")] {
        let job =
            run.must("list by key", q.list_jobs(&JobQuery { key: Some(Probe::key(id)), ..JobQuery::default() }).await)?;
        let kept = job.first().and_then(|j| j.cancelled.as_ref().filter(|_| j.state == JobState::Cancelled));
        ensure!(
            run,
            kept.is_some_and(|c| c.reason == reason && c.actor == actor),
            "job {id} should stay cancelled with its audit ({reason}, {actor}): {job:?}"
        );
    }
    let done = run
        .must("list done jobs", q.list_jobs(&JobQuery { state: Some(JobState::Done), ..JobQuery::default() }).await)?;
    let done = done.into_iter().find(|j| j.key == Probe::key(runs));
    let Some(done) = done else { return Err(run.fail("the job that ran should be listed as done")) };
    let late = q.cancel_job(&done.id, "too late", "ana").await;
    ensure!(
        run,
        late.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
        "a done job has nothing left to cancel: InvalidInput expected, got {late:?}"
    );
    run.report(&[runs], &[]).await
}
