//! The promises a backend's [`Capabilities`](redrive_core::kit::Capabilities) make that the other
//! behaviours do not check: each scenario here reads one flag and holds the backend to what it
//! declares. A backend that declares less is held to less, never skipped.

use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_core::kit::{Claimed, Dedupe, Kinds, Ledger};
use redrive_core::{ErrorKind, IdempotencyKey};
use tokio::time::Instant;

use crate::harness::{OTHER_KIND, OtherProbe, PROBE_KIND, Probe, Run, ensure};
use crate::{Outcome, Queue, Report, Subject, Violation};

/// Behaviour 31: A batch refused for one of its jobs (a key reused with another payload): a
/// backend that keeps every key refuses it as a `KeyConflict`, and one that declares
/// `atomic_batch` stores none of the batch.
pub async fn atomic_batch<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("atomic_batch", subject);
    let q = &run.s.queue;
    let original = Probe::new(80);
    run.must("enqueue", q.enqueue(original.new_job()).await)?;
    let changed = Probe { body: "another payload".into(), ..original };
    let batch = vec![Probe::new(81).new_job(), changed.new_job(), Probe::new(82).new_job()];
    match q.enqueue_batch(batch).await {
        Ok(answers) => {
            // Only a backend that keeps every key sees the conflict at enqueue (see `key_conflict`);
            // the others deliver it, and the ledger turns it into a record.
            ensure!(
                run,
                run.caps.dedupe != Dedupe::Kept,
                "a batch reusing a kept key with another payload should be refused as KeyConflict, got {answers:?}"
            );
            ensure!(run, answers.len() == 3, "one answer per job expected, got {answers:?}");
        }
        Err(e) => {
            ensure!(
                run,
                e.kind() == ErrorKind::KeyConflict,
                "a batch refused for a reused key should say KeyConflict: {e}"
            );
            if run.caps.atomic_batch {
                let keys = claim_all(&run).await?;
                ensure!(
                    run,
                    keys == [Probe::key(80)],
                    "the batch was refused, yet the queue holds {keys:?}: a backend that declares atomic_batch \
                     stores all of a batch or none"
                );
            }
        }
    }
    Ok(Report::default())
}

/// Claims and completes every ready job until a claim comes back empty; returns their keys.
async fn claim_all<Q: Queue, L: Ledger + Clone + 'static>(run: &Run<Q, L>) -> Result<Vec<IdempotencyKey>, Violation> {
    let mut keys = Vec::new();
    loop {
        let max = run.caps.max_claim.min(10);
        let claimed =
            run.must("claim", run.s.queue.claim(&Kinds::Any, max, run.s.timing.lease, run.short_lease()).await)?;
        if claimed.is_empty() {
            return Ok(keys);
        }
        for c in claimed {
            run.must("complete", run.s.queue.complete(&c.lease, None).await)?;
            keys.push(c.job.key);
        }
    }
}

/// Behaviour 32: A claim for one kind, with a job of another kind ready: a backend that declares
/// `claim_by_kind` returns only the kind asked for. One that does not may return the other; handed
/// back by `defer`, it then comes to a claim of its own kind on its first attempt.
pub async fn claim_by_kind<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("claim_by_kind", subject);
    run.must("enqueue", run.s.queue.enqueue(OtherProbe::new_job(83)).await)?;
    run.must("enqueue", run.s.queue.enqueue(Probe::new(84).new_job()).await)?;
    take_by_kind(&run, PROBE_KIND, &Probe::key(84)).await?;
    take_by_kind(&run, OTHER_KIND, &OtherProbe::key(83)).await?;
    Ok(Report::default())
}

/// Claims `kind` until the job of `key` comes, on its first attempt, and completes it; hands back
/// any job of another kind, where the backend may return one.
async fn take_by_kind<Q: Queue, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    kind: &str,
    key: &IdempotencyKey,
) -> Result<(), Violation> {
    let kinds = Kinds::Only(vec![kind.to_owned()]);
    let deadline = Instant::now() + run.s.timing.timeout;
    loop {
        ensure!(run, Instant::now() < deadline, "timed out claiming the job of {key} by its kind");
        let claimed = run.must("claim", run.s.queue.claim(&kinds, 10, run.s.timing.lease, run.short_lease()).await)?;
        let mut taken = false;
        for c in claimed {
            if c.job.kind != kind {
                ensure!(
                    run,
                    !run.caps.claim_by_kind,
                    "a claim for kind {kind} returned a job of kind {}: a backend that declares claim_by_kind \
                     takes only the kinds asked for",
                    c.job.kind
                );
                run.must("defer", run.s.queue.defer(&c.lease, Duration::ZERO).await)?;
                continue;
            }
            ensure!(run, c.job.key == *key, "a claim for kind {kind} returned an unexpected job {}", c.job.key);
            ensure!(
                run,
                c.job.attempt == 1,
                "the job of {key} came on attempt {}: handing it back from another kind's claim costs nothing",
                c.job.attempt
            );
            run.must("complete", run.s.queue.complete(&c.lease, None).await)?;
            taken = true;
        }
        if taken {
            return Ok(());
        }
    }
}

/// Behaviour 33: A claim that lapses before its handler started (its worker died with the job
/// claimed ahead): a backend that declares `crash_refunds` gives the attempt back, and counts the
/// claim as stranded. One that does not charges it. Either way no lapse goes uncounted.
pub async fn crash_refunds<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("crash_refunds", subject);
    run.must("enqueue", run.s.queue.enqueue(Probe::new(85).new_job()).await)?;
    let lease = run.short_lease();
    let first = claim_one(&run, lease).await?;
    let counted = (first.job.attempt, first.job.stranded);
    ensure!(run, counted == (1, 0), "the first claim should be attempt 1, none stranded; got {counted:?}");
    drop(first); // its worker dies before the handler starts: no renewal, nothing settles it
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    let again = claim_one(&run, run.s.timing.lease * 10).await?;
    let (attempt, stranded) = (again.job.attempt, again.job.stranded);
    if run.caps.crash_refunds {
        ensure!(
            run,
            (attempt, stranded) == (1, 1),
            "the claim lapsed before its handler started: a backend that declares crash_refunds gives the \
             attempt back and counts the claim stranded; got attempt {attempt}, stranded {stranded}"
        );
    } else {
        ensure!(
            run,
            attempt + stranded == 2,
            "each of two claims is charged or counted stranded; got attempt {attempt}, stranded {stranded}"
        );
    }
    run.must("complete", run.s.queue.complete(&again.lease, None).await)?;
    Ok(Report::default())
}

/// The next job claimed for `lease`, waiting up to the subject's timeout.
async fn claim_one<Q: Queue, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    lease: Duration,
) -> Result<Claimed, Violation> {
    let mut claimed = run.must("claim", run.s.queue.claim(&Kinds::Any, 1, lease, run.s.timing.timeout).await)?;
    claimed.pop().ok_or_else(|| run.fail("nothing was claimed"))
}

/// Behaviour 34: Jobs scheduled for later. Within the backend's `max_delay` the backend holds a
/// job back itself: no claim returns it before its time. Past it (or where it has none) a claim
/// may return a job early, but carrying its time (`JobRecord::not_before`), so that the worker
/// puts it back until then.
pub async fn max_delay<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("max_delay", subject);
    let q = &run.s.queue;
    let due = run.s.timing.lease * 2;
    let holds_back = run.caps.max_delay.is_some_and(|cap| cap >= due);
    let soon = Probe::new(86).new_job().run_in(due);
    let soon_at = soon.not_before.ok_or_else(|| run.fail("test setup: run_in should set the job's time"))?;
    run.must("enqueue", q.enqueue(soon).await)?;
    // An hour past the cap, where there is a past to it (an unbounded cap has none).
    let past =
        run.caps.max_delay.map_or(Some(Duration::from_secs(3600)), |cap| cap.checked_add(Duration::from_secs(3600)));
    let late_at = past.and_then(|d| chrono::Duration::from_std(d).ok()).and_then(|d| Utc::now().checked_add_signed(d));
    if let Some(at) = late_at {
        run.must("enqueue", q.enqueue(Probe::new(87).new_job().run_at(at)).await)?;
    }
    let deadline = Instant::now() + run.s.timing.timeout;
    loop {
        ensure!(run, Instant::now() < deadline, "timed out waiting for the job scheduled in {due:?}");
        let claimed = run.must("claim", q.claim(&Kinds::Any, 10, run.s.timing.lease, run.short_lease()).await)?;
        for c in claimed {
            let early = Utc::now() + chrono::Duration::milliseconds(5) < soon_at;
            if c.job.key == Probe::key(87) {
                ensure!(
                    run,
                    late_at.is_some_and(|at| carries(c.job.not_before, at)),
                    "a job scheduled past the backend's max delay was claimed before its time without it \
                     (not_before {:?}): the worker cannot put it back",
                    c.job.not_before
                );
                run.must("defer", q.defer(&c.lease, run.s.timing.timeout).await)?;
            } else if c.job.key != Probe::key(86) {
                return Err(run.fail(format!("an unexpected job {} was claimed", c.job.key)));
            } else if early {
                ensure!(
                    run,
                    !holds_back,
                    "the job was claimed before its time, though its delay ({due:?}) is within the backend's \
                     max delay ({:?}): the backend holds such a job back itself",
                    run.caps.max_delay
                );
                ensure!(
                    run,
                    carries(c.job.not_before, soon_at),
                    "the job was claimed before its time without it (not_before {:?}): the worker cannot put it back",
                    c.job.not_before
                );
                let wait = (soon_at - Utc::now()).to_std().unwrap_or_default();
                run.must("defer", q.defer(&c.lease, wait).await)?;
            } else {
                let attempt = c.job.attempt;
                ensure!(run, attempt == 1, "waiting for its time should cost no attempt: claimed on attempt {attempt}");
                run.must("complete", q.complete(&c.lease, None).await)?;
                return Ok(Report::default());
            }
        }
    }
}

/// Whether a claimed job's `not_before` is the time it was scheduled for (kept to the second).
fn carries(not_before: Option<DateTime<Utc>>, at: DateTime<Utc>) -> bool {
    not_before.is_some_and(|t| (t - at).num_milliseconds().abs() < 1000)
}
