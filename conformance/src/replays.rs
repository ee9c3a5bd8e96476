//! Replays settled by their job (issue 26): the seed's step 6, "confirm the effect happened once,
//! then close the record", and its step 4 when the cause is the data. A replayed record is
//! `replaying` until its job settles: confirmed by the effect, or failed again into a new record
//! that names it; an amended replay runs a corrected payload under the same keys, once.

use redrive_core::kit::{Dedupe, Ledger};
use redrive_core::{ErrorKind, FailureQuery, FailureRecord, RecordState, ReplayOutcome};

use crate::harness::{Fault, Probe, Run, ensure};
use crate::scenarios::{exhaust_one, wait_confirmed};
use crate::{Outcome, Queue, Subject};

/// Behaviour 44: A record replayed while its fault remains: the replayed job fails again into a
/// new record that names the old one (`replay_of`), and the old one is `FailedAgain`, naming the
/// new one, with who replayed it and why; never confirmed. The fault removed, the new record's
/// replay runs once and is confirmed; the old one stays as it was.
pub async fn replay_failed_again<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("replay_failed_again", subject);
    let job = exhaust_one(&run, 900).await?;
    let first = open_record_of(&run, 900).await?;
    run.must("replay", run.s.queue.replay(&first.id, "carrier said fixed", "ana").await)?;
    let worker = run.worker(2);
    let queue = run.s.queue.clone();
    let failed_again = run
        .wait_for("the replayed job's new record", || {
            let (queue, key) = (queue.clone(), job.key.clone());
            async move {
                queue
                    .list(&FailureQuery::by_key(key))
                    .await
                    .is_ok_and(|r| r.iter().filter(|r| r.state.is_open()).count() == 1 && r.len() == 2)
            }
        })
        .await;
    worker.shutdown().await;
    failed_again?;
    let second = open_record_of(&run, 900).await?;
    let old = run.must("get", run.s.queue.get(&first.id).await)?;
    ensure!(
        run,
        second.replay_of.as_ref() == Some(&first.id),
        "the new record should name the record its job replayed ({}), names {:?}",
        first.id,
        second.replay_of
    );
    ensure!(
        run,
        matches!(&old.state, RecordState::FailedAgain { next, reason, actor, .. }
            if *next == second.id && reason == "carrier said fixed" && actor == "ana"),
        "the replayed record should say its job failed again into record {}, with who replayed it and why; is {:?}",
        second.id,
        old.state
    );
    ensure!(run, second.attempts == job.cap, "the new record should count the replay's {} attempts", job.cap);

    run.script.heal();
    run.must("replay", run.s.queue.replay(&second.id, "carrier fixed, really", "ana").await)?;
    let worker = run.worker(2);
    run.wait_for_effects(1).await?;
    wait_confirmed(&run, &second.id).await?;
    run.settle().await;
    worker.shutdown().await;
    let old_after = run.must("get", run.s.queue.get(&first.id).await)?;
    ensure!(run, old_after.state == old.state, "the first record should stay failed again, is {:?}", old_after.state);
    let effects = run.script.effects_of(&job.key);
    ensure!(run, effects.len() == 1, "the effect should happen once, happened {}", effects.len());
    run.report(&[900], &[]).await
}

/// Behaviour 45: A job that fails for its data (a malformed address), replayed with a corrected
/// payload under the same keys: refused without a reason or actor; then the handler gets the
/// corrected payload, once, with the original provider key; the record keeps the original
/// payload and the amended one, and is confirmed. A plain enqueue of another payload under the
/// key stays a `KeyConflict`. A backend without `Capabilities::amend_replay` refuses it with
/// `InvalidInput` and changes nothing.
pub async fn amended_replay<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("amended_replay", subject);
    run.script.fault(901, Fault::Malformed);
    let malformed = Probe { id: 901, body: "malformed address".into() };
    let job = malformed.new_job();
    run.must("enqueue", run.s.queue.enqueue(job.clone()).await)?;
    let worker = run.worker(2);
    let recorded = run.wait_for_records(1).await;
    worker.shutdown().await;
    recorded?;
    let record = open_record_of(&run, 901).await?;
    let corrected = Probe { id: 901, body: "corrected address".into() };
    let payload = serde_json::to_value(&corrected).expect("a probe serializes");
    if !run.caps.amend_replay {
        let refused = run.s.queue.replay_amended(&record.id, &payload, "typo in the address", "ana").await;
        ensure!(
            run,
            refused.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
            "the backend cannot amend (Capabilities::amend_replay), so an amended replay should be refused with \
             InvalidInput; answered {refused:?}"
        );
        let still = run.must("get", run.s.queue.get(&record.id).await)?;
        ensure!(run, still.state.is_open(), "a refused amended replay should leave the record open");
        return run.report(&[], &[901]).await;
    }
    for (reason, actor) in [("", "ana"), ("typo in the address", " ")] {
        let blank = run.s.queue.replay_amended(&record.id, &payload, reason, actor).await;
        ensure!(
            run,
            blank.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
            "an amended replay changes the data: a blank reason or actor should be refused, answered {blank:?}"
        );
    }
    let outcome = run
        .must("amended replay", run.s.queue.replay_amended(&record.id, &payload, "typo in the address", "ana").await)?;
    ensure!(run, matches!(outcome, ReplayOutcome::Replayed(_)), "the amended replay should replay, got {outcome:?}");
    let worker = run.worker(2);
    run.wait_for_effects(1).await?;
    wait_confirmed(&run, &record.id).await?;
    run.settle().await;
    worker.shutdown().await;

    let effects = run.script.effects_of(&job.key);
    ensure!(run, effects.len() == 1, "the amended job's effect should happen once, happened {}", effects.len());
    ensure!(
        run,
        effects[0].body == corrected.body && effects[0].provider_key == job.provider_key,
        "the handler should get the corrected payload under the original provider key; got {:?}",
        effects[0].body
    );
    let closed = run.must("get", run.s.queue.get(&record.id).await)?;
    ensure!(
        run,
        closed.payload == job.payload && closed.amended.as_ref() == Some(&payload),
        "the record should keep the original payload and the amended one"
    );
    ensure!(
        run,
        matches!(&closed.state, RecordState::Confirmed { amended: true, reason, actor, .. }
            if reason == "typo in the address" && actor == "ana"),
        "the record should be confirmed as an amended replay, with why and who; is {:?}",
        closed.state
    );
    if run.caps.dedupe == Dedupe::Kept {
        let other = Probe { id: 901, body: "a third address".into() }.new_job();
        let conflict = run.s.queue.enqueue(other).await;
        ensure!(
            run,
            conflict.as_ref().is_err_and(|e| e.kind() == ErrorKind::KeyConflict),
            "only the audited replay amends: a plain enqueue of another payload under the key should stay a \
             KeyConflict, answered {conflict:?}"
        );
    }
    run.report(&[901], &[]).await
}

/// The one open record of probe `id`.
pub(crate) async fn open_record_of<Q: Queue, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    id: u32,
) -> Result<FailureRecord, crate::Violation> {
    let records = run.open_records().await?;
    let mine: Vec<_> = records.into_iter().filter(|r| r.key == Probe::key(id)).collect();
    match <[FailureRecord; 1]>::try_from(mine) {
        Ok([record]) => Ok(record),
        Err(mine) => Err(run.fail(format!("probe {id} should have one open record, has {}", mine.len()))),
    }
}
