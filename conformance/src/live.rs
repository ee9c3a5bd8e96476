//! Live jobs and cancel (issue 26): a queued or scheduled job cancelled by id or by key never
//! runs, stays cancelled with its audit, and its key stays taken; a running one is stopped.

use std::time::Duration;

use redrive_core::kit::{Kinds, Ledger, Renew};
use redrive_core::{CancelOutcome, Enqueued, ErrorKind, JobQuery, JobState, Jobs, LiveJob, RecordState};

use crate::harness::{Fault, Probe, Run, ensure};
use crate::replays::open_record_of;
use crate::scenarios::exhaust_one;
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

/// Behaviour 47: A replayed job cancelled before it runs closes the record it replays as
/// discarded, with the cancel's who and why (nothing will ever settle it). A running job (its
/// handler ten minutes long) cancelled with a reason and a name is asked to stop: it reads running
/// with the cancel asked, a second cancel answers the first one's audit, and within a few lease
/// renewals its handler is stopped and the job ends cancelled with that audit: started once, no
/// effect, never run again, its key still taken. A cancel asked of a running job that then fails
/// for good is spent with it: the record's replay runs and completes. Where jobs are not listed,
/// behaviour 46 checks the refusal.
pub async fn cancel_running<Q: Queue + Jobs, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("cancel_running", subject);
    if !run.caps.live_jobs {
        return run.report(&[], &[]).await;
    }
    let q = &run.s.queue;
    let (replayed, running, spent) = (433, 434, 438);

    exhaust_one(&run, replayed).await?;
    let record = open_record_of(&run, replayed).await?;
    run.must("replay", q.replay(&record.id, "after the carrier's fix", "ana").await)?;
    let job = job_of(&run, replayed).await?;
    let outcome = run.must("cancel the replayed job", q.cancel_job(&job.id, "refunded by hand", "ben").await)?;
    ensure!(run, outcome == CancelOutcome::Cancelled, "the queued replayed job should be cancelled: {outcome:?}");
    let closed = run.must("get", q.get(&record.id).await)?;
    ensure!(
        run,
        matches!(&closed.state, RecordState::Discarded { reason, actor, .. }
            if reason.contains("its replayed job was cancelled") && reason.contains("refunded by hand") && actor == "ben"),
        "the record whose replayed job was cancelled should be closed as discarded with the cancel's why and who; \
         is {:?}",
        closed.state
    );

    let spent_record = cancel_then_fail(&run, spent).await?;
    run.must("replay", q.replay(&spent_record, "the cancel came too late", "ana").await)?;

    run.script.fault(running, Fault::Takes(Duration::from_secs(600)));
    run.must("enqueue", q.enqueue(Probe::new(running).new_job()).await)?;
    let worker = run.worker(1);
    let script = std::sync::Arc::clone(&run.script);
    run.wait_for("the long job to start", || {
        let script = std::sync::Arc::clone(&script);
        async move { !script.starts_of(&Probe::key(running)).is_empty() }
    })
    .await?;
    let job = job_of(&run, running).await?;
    let outcome = run.must("cancel the running job", q.cancel_job(&job.id, "customer withdrew", "cy").await)?;
    ensure!(run, outcome == CancelOutcome::Requested, "a running job should be asked to stop: {outcome:?}");
    let asked = run.must("get the job", q.get_job(&job.id).await)?;
    let again = run.must("cancel again", q.cancel_job(&job.id, "twice", "dan").await)?;
    let ended = {
        let (queue, id) = (q.clone(), job.id.clone());
        run.wait_for("the running job to end cancelled", || {
            let (queue, id) = (queue.clone(), id.clone());
            async move { queue.get_job(&id).await.is_ok_and(|j| j.state == JobState::Cancelled) }
        })
        .await
    };
    let still_running = run.script.running_now(running / 100);
    let script = std::sync::Arc::clone(&run.script);
    let replay_done = run
        .wait_for("the replay of the job whose cancel was spent to be done", || {
            let script = std::sync::Arc::clone(&script);
            async move { !script.effects_of(&Probe::key(spent)).is_empty() }
        })
        .await;
    run.settle().await;
    worker.shutdown().await;
    replay_done?;
    ensure!(
        run,
        still_running == 0,
        "the job reads cancelled, yet its handler was not stopped ({still_running} still running)"
    );
    ensure!(
        run,
        asked.state == JobState::Running && asked.cancelled.as_ref().is_some_and(|c| c.actor == "cy"),
        "until its worker stops it, the job should read running with the cancel asked: {asked:?}"
    );
    ensure!(
        run,
        matches!(&again, CancelOutcome::AlreadyCancelled(c) if c.actor == "cy" && c.reason == "customer withdrew"),
        "a second cancel should change nothing and answer the first one's audit: {again:?}"
    );
    ended?;
    let end = run.must("get the job", q.get_job(&job.id).await)?;
    ensure!(
        run,
        end.cancelled.as_ref().is_some_and(|c| c.actor == "cy" && c.reason == "customer withdrew"),
        "the stopped job should keep the cancel's who and why: {end:?}"
    );
    let starts = run.script.starts_of(&Probe::key(running)).len();
    ensure!(run, starts == 1, "the stopped job should have started once and never again, started {starts} times");
    ensure!(run, run.script.effects_of(&Probe::key(running)).is_empty(), "the stopped job should have no effect");
    let again = run.must("enqueue a stopped key again", q.enqueue(Probe::new(running).new_job()).await)?;
    ensure!(
        run,
        matches!(&again, Enqueued::Duplicate { id, .. } if *id == job.id),
        "a cancelled key stays taken: enqueued again it should answer a duplicate of the stopped job, got {again:?}"
    );
    let replayed_record = run.must("get", q.get(&spent_record).await)?;
    ensure!(
        run,
        matches!(replayed_record.state, RecordState::Confirmed { .. }),
        "the record whose job's cancel was spent should be replayed and confirmed by its effect: {:?}",
        replayed_record.state
    );
    run.report(&[spent], &[]).await
}

/// Probe `id` claimed by hand, asked to stop while it holds the lease (its handler's renewal is
/// refused from then on, its settlement's granted), then failed for good by its holder: its
/// failure record's id.
async fn cancel_then_fail<Q: Queue + Jobs, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    id: u32,
) -> Result<redrive_core::FailureId, crate::Violation> {
    let q = &run.s.queue;
    run.must("enqueue", q.enqueue(Probe::new(id).new_job()).await)?;
    let kinds = Kinds::Only(vec![crate::harness::PROBE_KIND.to_owned()]);
    let deadline = tokio::time::Instant::now() + run.s.timing.timeout;
    let claimed = loop {
        let claimed =
            run.must("claim", q.claim(&kinds, 1, run.s.timing.lease * 4, Duration::from_millis(200)).await)?;
        if let Some(c) = claimed.into_iter().find(|c| c.job.key == Probe::key(id)) {
            break c;
        }
        ensure!(run, tokio::time::Instant::now() < deadline, "timed out claiming probe {id}");
    };
    let outcome = run.must("cancel the claimed job", q.cancel_job(&claimed.job.id, "duplicate order", "ben").await)?;
    ensure!(run, outcome == CancelOutcome::Requested, "a claimed job should be asked to stop: {outcome:?}");
    if let Some(renewal) = q.renewal() {
        let lease = run.s.timing.lease * 4;
        let refused = renewal.renew(&claimed.lease, lease).await;
        ensure!(
            run,
            refused.as_ref().is_err_and(|e| e.kind() == ErrorKind::Cancelled),
            "a handler's renewal of a job asked to stop should be refused as Cancelled: {refused:?}"
        );
        // Its handler is done: what settles it decides, however long the settlement takes.
        let settling = renewal.renew_settling(&claimed.lease, lease).await;
        ensure!(
            run,
            settling.is_ok(),
            "the renewal of a job being settled should be granted though a cancel was asked: {settling:?}"
        );
    }
    let record = run.must("dead-letter", q.dead_letter(&claimed, "declined").await)?;
    let record = match record {
        Some(record) => record,
        None => open_record_of(run, id).await?,
    };
    let job = run.must("get the job", q.get_job(&claimed.job.id).await)?;
    ensure!(
        run,
        job.state == JobState::Failed,
        "a job failed for good with a cancel asked should read failed (its record is what a person acts on): {job:?}"
    );
    Ok(record.id)
}

/// The one job of probe `id`'s key.
async fn job_of<Q: Queue + Jobs, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    id: u32,
) -> Result<LiveJob, crate::Violation> {
    let query = JobQuery { key: Some(Probe::key(id)), ..JobQuery::default() };
    let jobs = run.must("list by key", run.s.queue.list_jobs(&query).await)?;
    jobs.into_iter().next().ok_or_else(|| run.fail(format!("probe {id}'s job should be listed")))
}

/// Behaviour 48: Where jobs are not listed (a broker's messages), a cancel is a mark on the key
/// in the effect ledger ([`Ledger::cancel_effect`]). A key cancelled before its message is
/// delivered: the message completes unrun, counted `withdrawn`, never started. A key cancelled
/// while its handler (ten minutes long) runs: the hold's next extension is refused, the handler is
/// stopped (`stopped`), and the message, put back, completes unrun at its next delivery. Neither
/// has an effect. A replay whose key is cancelled before it is delivered completes unrun too, and
/// its record is closed as discarded with the cancel's who and why (nothing else would settle
/// it). A second cancel answers the first one's audit; a key whose effect is done is refused as
/// `InvalidInput`; a blank reason as well. Where jobs are listed, behaviours 46 and 47
/// hold cancel instead.
pub async fn cancel_key_in_ledger<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("cancel_key_in_ledger", subject);
    if run.caps.live_jobs {
        return run.report(&[], &[]).await;
    }
    let ledger = &run.s.ledger;
    let (early, running, done, replayed) = (435, 436, 437, 439);

    exhaust_one(&run, replayed).await?;
    let record = open_record_of(&run, replayed).await?;
    run.must("replay", run.s.queue.replay(&record.id, "after the carrier's fix", "ana").await)?;
    let withdrawn = ledger.cancel_effect(&Probe::key(replayed), "refunded by hand", "dan").await;
    let withdrawn = run.must("cancel a replayed key", withdrawn)?;
    ensure!(run, withdrawn == CancelOutcome::Cancelled, "a replayed key should be cancelled: {withdrawn:?}");

    let blank = ledger.cancel_effect(&Probe::key(early), " ", "ana").await;
    ensure!(
        run,
        blank.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
        "a cancel without a reason should be refused as InvalidInput: {blank:?}"
    );
    let first = run.must("cancel a key", ledger.cancel_effect(&Probe::key(early), "order withdrawn", "ana").await)?;
    ensure!(run, first == CancelOutcome::Cancelled, "a key not begun yet should be cancelled: {first:?}");
    let again = run.must("cancel again", ledger.cancel_effect(&Probe::key(early), "twice", "ben").await)?;
    ensure!(
        run,
        matches!(&again, CancelOutcome::AlreadyCancelled(c) if c.actor == "ana" && c.reason == "order withdrawn"),
        "a second cancel should change nothing and answer the first one's audit: {again:?}"
    );
    run.must("enqueue", run.s.queue.enqueue(Probe::new(early).new_job()).await)?;

    run.script.fault(running, Fault::Takes(Duration::from_secs(600)));
    run.must("enqueue", run.s.queue.enqueue(Probe::new(running).new_job()).await)?;
    run.must("enqueue", run.s.queue.enqueue(Probe::new(done).new_job()).await)?;
    let worker = run.worker(2);
    let script = std::sync::Arc::clone(&run.script);
    run.wait_for("the long job to start and the other to be done", || {
        let script = std::sync::Arc::clone(&script);
        async move {
            !script.starts_of(&Probe::key(running)).is_empty() && !script.effects_of(&Probe::key(done)).is_empty()
        }
    })
    .await?;
    let outcome =
        run.must("cancel a running key", ledger.cancel_effect(&Probe::key(running), "customer left", "cy").await)?;
    ensure!(
        run,
        outcome == CancelOutcome::Cancelled,
        "a key held by a running handler should be cancelled: {outcome:?}"
    );
    let finished = run
        .wait_for("the three cancelled messages to complete unrun", || {
            let stats = worker.stats();
            async move { stats.withdrawn >= 3 }
        })
        .await;
    let still_running = run.script.running_now(running / 100);
    run.settle().await;
    let stats = worker.shutdown().await;
    finished?;
    ensure!(run, still_running == 0, "the cancelled key's handler should have been stopped ({still_running} running)");
    ensure!(run, stats.stopped == 1, "one handler should be counted stopped: {stats:?}");
    ensure!(
        run,
        run.script.starts_of(&Probe::key(early)).is_empty(),
        "a key cancelled before delivery should never start"
    );
    let starts = run.script.starts_of(&Probe::key(running)).len();
    ensure!(run, starts == 1, "the stopped key should have started once and never again, started {starts} times");
    for id in [early, running, replayed] {
        ensure!(run, run.script.effects_of(&Probe::key(id)).is_empty(), "cancelled key {id} should have no effect");
    }
    let replay_starts = run.script.starts_of(&Probe::key(replayed)).len();
    let cap = Probe::new(replayed).new_job().cap as usize;
    ensure!(run, replay_starts == cap, "the cancelled replay should never start: started {replay_starts} times in all");
    let closed = run.must("get", run.s.queue.get(&record.id).await)?;
    ensure!(
        run,
        matches!(&closed.state, RecordState::Discarded { reason, actor, .. }
            if reason.contains("refunded by hand") && actor == "dan"),
        "the record whose replay was withdrawn by its key's cancel should be closed as discarded with the cancel's \
         why and who; is {:?}",
        closed.state
    );
    let late = ledger.cancel_effect(&Probe::key(done), "too late", "ana").await;
    ensure!(
        run,
        late.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
        "a key whose effect is done has nothing left to cancel: InvalidInput expected, got {late:?}"
    );
    run.report(&[done], &[]).await
}
