//! Forgetting a key everywhere (`Forget::forget_key`): what `redrive verify` cleans up with, and
//! what erasing a customer's data needs.

use std::time::Duration;

use redrive_core::kit::{Begin, Dedupe, Ledger};
use redrive_core::{Enqueued, ProviderKey};

use crate::harness::{Fault, Probe, Run, ensure};
use crate::{Outcome, Queue, Subject};

/// Behaviour 50: A key whose job failed for good and was alerted is forgotten with its record;
/// afterwards its payload is nowhere in the backend, no record is open, forgetting it again finds
/// nothing, and enqueued again the job runs once (a broker's deduplication window aside, as for
/// a purge). A key whose effect is done is forgotten from the ledger too: its payload nowhere,
/// the effect free to begin again.
pub async fn forget_key<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("forget_key", subject);
    let Some(storage) = run.s.storage.clone() else {
        return Err(run.fail("the subject gives no look into its storage: set one with `Subject::storage`"));
    };
    let Some(forget) = run.s.forget.clone() else {
        return Err(run.fail("the subject says not how to forget a key: set it with `Subject::forget`"));
    };
    let canary = format!("forget-me-{}", ProviderKey::mint());
    let job = Probe { id: 150, body: canary.clone() }.new_job();
    let done_canary = format!("forget-me-done-{}", ProviderKey::mint());
    let done = Probe { id: 151, body: done_canary.clone() }.new_job();
    run.script.fault(150, Fault::Permanent);
    run.must("enqueue", run.s.queue.enqueue(job.clone()).await)?;
    run.must("enqueue", run.s.queue.enqueue(done.clone()).await)?;
    let worker = run.worker(1);
    run.wait_for_records(1).await?;
    run.wait_for_effects(1).await?;
    let script = std::sync::Arc::clone(&run.script);
    run.wait_for("the record's alert", || {
        let script = std::sync::Arc::clone(&script);
        async move { script.alert_count() >= 1 }
    })
    .await?;
    worker.shutdown().await;
    ensure!(run, storage(canary.clone()).await, "before forgetting, the record should hold the payload");

    let forgotten = run.must("forget the key", forget(job.key.clone()).await)?;
    ensure!(run, forgotten.records == 1, "the key's one record should be forgotten, got {forgotten:?}");
    ensure!(run, !storage(canary.clone()).await, "after forgetting the key its payload should be nowhere");
    ensure!(run, run.must("count", run.s.queue.count_open().await)? == 0, "no record should stay open");
    let again = run.must("forget the key again", forget(job.key.clone()).await)?;
    ensure!(run, again.is_empty(), "a key forgotten already has nothing left to forget, got {again:?}");

    let forgotten = run.must("forget the done key", forget(done.key.clone()).await)?;
    // Its job row or its ledger entry, whichever keeps a done effect in this backend.
    ensure!(run, !forgotten.is_empty(), "a done key should be forgotten, got {forgotten:?}");
    ensure!(run, !storage(done_canary).await, "after forgetting a done key its payload should be nowhere");
    let lease = run.s.timing.lease;
    match run.must("ledger begin", run.s.ledger.begin(&done.key, &done.payload, ProviderKey::mint(), lease).await)? {
        Begin::Fresh(hold) => run.must("release", run.s.ledger.release_hold(&hold).await)?,
        other => return Err(run.fail(format!("a forgotten key's effect should be free to begin, got {other:?}"))),
    }

    run.script.heal();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let enqueued = run.must("enqueue after forgetting", run.s.queue.enqueue(job.clone()).await)?;
    if let Dedupe::Unreported(window) = run.caps.dedupe {
        return run.dropped_unreported(&job.key, window, "a forgotten key").await;
    }
    if let (Dedupe::Window(window), false) = (run.caps.dedupe, enqueued.is_created()) {
        ensure!(
            run,
            matches!(enqueued, Enqueued::Duplicate { .. }),
            "within the broker's {window:?} window a forgotten key should answer Duplicate, got {enqueued:?}"
        );
        run.settle().await;
        ensure!(run, run.script.effects_of(&job.key).is_empty(), "a job the broker dropped should not run");
        return Ok(crate::Report::default());
    }
    ensure!(
        run,
        enqueued.is_created(),
        "a forgotten key is free: enqueued again it should be created, got {enqueued:?}"
    );
    let worker = run.worker(1);
    run.wait_for_effects(1).await?;
    run.settle().await;
    worker.shutdown().await;
    run.report(&[150, 151], &[]).await
}
