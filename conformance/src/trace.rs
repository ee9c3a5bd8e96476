//! Trace context (issue 26): the producer's W3C `traceparent` travels with its job, and a failure
//! record keeps the trace id so that an alert leads to the failing trace.

use std::time::Duration;

use redrive_core::kit::{Claimed, Kinds, Ledger};
use redrive_core::{ErrorKind, JobRecord, NewJob};

use crate::harness::{Fault, PROBE_KIND, Probe, Run, ensure};
use crate::{Outcome, Queue, Subject};

/// The producers' contexts: sampled, not sampled (flags are carried as they are).
const RUNS: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const FAILS: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const IN_BATCH: &str = "00-a3ce929d0e0e47364bf92f3577b34da6-00f067aa0ba902b8-00";
const TRACE_OF_FAILS: &str = "0af7651916cd43dd8448eb211c80319c";
/// The trace of a failing attempt's own span (with the `otel` feature, a retry's).
const FAILING_ATTEMPT: &str = "00-5b8aa5a2d2c872e8321cf37308d69df2-051581bf3cb55c13-01";
const TRACE_OF_FAILING_ATTEMPT: &str = "5b8aa5a2d2c872e8321cf37308d69df2";

/// The probes: run with a context, fail with one, run without one, fail without one, and a
/// batch of one with a context and one without.
const RUN: u32 = 970;
const FAIL: u32 = 971;
const PLAIN: u32 = 972;
const FAIL_PLAIN: u32 = 973;
const BATCHED: u32 = 974;
const BATCHED_PLAIN: u32 = 975;
/// Dead-lettered by hand with the failing attempt's context.
const HANDED: u32 = 979;

fn traced(id: u32, traceparent: &str) -> NewJob {
    Probe::new(id).new_job().with_traceparent(traceparent).expect("a valid traceparent")
}

/// Behaviour 49: Jobs enqueued with a producer's trace context (a W3C `traceparent`), alone and
/// in a batch, reach their handler with it (`JobContext::traceparent`), and jobs enqueued
/// without one with none. A job with a context that fails for good (on its first attempt) leaves
/// a record that keeps the context's trace id, read back and in its alert; a job without one, a
/// record with no other job's. A job dead-lettered with another context than it was enqueued
/// with (as the worker hands over a failing attempt's own, with the `otel` feature) leaves a
/// record with that context's trace id: `Claim::dead_letter` reads it from the job handed over,
/// not from what it stored. A context that is not a W3C trace context is refused at enqueue
/// (`InvalidInput`), alone and in a batch.
///
/// It holds with or without redrive's `otel` feature: with it, a failing first attempt's span is
/// its producer's child, so the trace it keeps is the same one.
pub async fn trace_context<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("trace_context", subject);
    refused(&run).await?;
    run.script.fault(FAIL, Fault::Permanent);
    run.script.fault(FAIL_PLAIN, Fault::Permanent);
    run.must("enqueue", run.s.queue.enqueue(traced(RUN, RUNS)).await)?;
    run.must("enqueue", run.s.queue.enqueue(traced(FAIL, FAILS)).await)?;
    run.must("enqueue", run.s.queue.enqueue(Probe::new(PLAIN).new_job()).await)?;
    run.must("enqueue", run.s.queue.enqueue(Probe::new(FAIL_PLAIN).new_job()).await)?;
    let batch = vec![traced(BATCHED, IN_BATCH), Probe::new(BATCHED_PLAIN).new_job()];
    run.must("enqueue a batch", run.s.queue.enqueue_batch(batch).await)?;
    let worker = run.worker(2);
    let done = async {
        run.wait_for_effects(4).await?;
        run.wait_for_records(2).await?;
        let script = std::sync::Arc::clone(&run.script);
        run.wait_for("the records' alerts", || {
            let script = std::sync::Arc::clone(&script);
            async move { script.alert_count() >= 2 }
        })
        .await
    }
    .await;
    run.settle().await;
    worker.shutdown().await;
    done?;

    for (id, expected) in
        [(RUN, Some(RUNS)), (FAIL, Some(FAILS)), (PLAIN, None), (FAIL_PLAIN, None), (BATCHED, Some(IN_BATCH))]
            .into_iter()
            .chain([(BATCHED_PLAIN, None)])
    {
        let seen = run.script.traceparents_of(&Probe::key(id));
        ensure!(
            run,
            !seen.is_empty() && seen.iter().all(|t| t.as_deref() == expected),
            "probe {id}'s handler should see the traceparent it was enqueued with ({expected:?}), saw {seen:?}"
        );
    }

    let records = run.open_records().await?;
    let record_of = |id: u32| records.iter().find(|r| r.key == Probe::key(id));
    let (Some(failed), Some(plain)) = (record_of(FAIL), record_of(FAIL_PLAIN)) else {
        return Err(run.fail(format!("the two failing probes should have a record each, found {records:?}")));
    };
    let read = run.must("get", run.s.queue.get(&failed.id).await)?;
    for (how, trace_id) in [("listed", &failed.trace_id), ("read back", &read.trace_id)] {
        ensure!(
            run,
            trace_id.as_deref() == Some(TRACE_OF_FAILS),
            "the record of a job enqueued with traceparent {FAILS} should keep its trace id {TRACE_OF_FAILS} \
             ({how}), keeps {trace_id:?}"
        );
    }
    let alerted = run.script.alerts.lock().unwrap().iter().find(|a| a.record.id == failed.id).cloned();
    let alerted = alerted.map(|a| (a.record.trace_id.clone(), a.summary()));
    ensure!(
        run,
        alerted
            .as_ref()
            .is_some_and(|(id, summary)| id.as_deref() == Some(TRACE_OF_FAILS) && summary.contains(TRACE_OF_FAILS)),
        "the alert of that record should carry its trace id {TRACE_OF_FAILS}, got {alerted:?}"
    );
    // Without a context of its own, a record never names another job's trace (with the `otel`
    // feature and an OpenTelemetry layer installed, it keeps its own failing span's).
    let others = [RUNS, FAILS, IN_BATCH].map(|t| &t[3..35]);
    ensure!(
        run,
        plain.trace_id.as_deref().is_none_or(|id| !others.contains(&id)),
        "the record of a job enqueued without a traceparent keeps another job's trace id: {:?}",
        plain.trace_id
    );
    handed_over(&run).await?;
    run.report(&[RUN, PLAIN, BATCHED, BATCHED_PLAIN], &[FAIL, FAIL_PLAIN, HANDED]).await
}

/// A job claimed and dead-lettered by hand with the failing attempt's context in place of its
/// producer's: its record keeps the failing attempt's trace.
async fn handed_over<Q: Queue, L: Ledger + Clone + 'static>(run: &Run<Q, L>) -> Result<(), crate::Violation> {
    run.must("enqueue", run.s.queue.enqueue(traced(HANDED, RUNS)).await)?;
    let kinds = Kinds::Only(vec![PROBE_KIND.to_owned()]);
    let deadline = tokio::time::Instant::now() + run.s.timing.timeout;
    let claimed = loop {
        let claimed = run.must("claim", run.s.queue.claim(&kinds, 1, run.s.timing.lease * 4, LOOK).await)?;
        if let Some(c) = claimed.into_iter().find(|c| c.job.key == Probe::key(HANDED)) {
            break c;
        }
        ensure!(run, tokio::time::Instant::now() < deadline, "timed out claiming probe {HANDED}");
    };
    ensure!(
        run,
        claimed.job.traceparent.as_deref() == Some(RUNS),
        "a claimed job should carry the traceparent it was enqueued with ({RUNS}), carries {:?}",
        claimed.job.traceparent
    );
    let failing =
        Claimed { job: JobRecord { traceparent: Some(FAILING_ATTEMPT.into()), ..claimed.job.clone() }, ..claimed };
    let written = run.must("dead-letter", run.s.queue.dead_letter(&failing, "declined").await)?;
    // Where the service writes the record later (QStash), it is listed once written.
    let record = match written {
        Some(record) => record,
        None => {
            run.wait_for_records(3).await?;
            let records = run.open_records().await?;
            let found = records.into_iter().find(|r| r.key == Probe::key(HANDED));
            found.ok_or_else(|| run.fail(format!("no record of probe {HANDED} after its dead letter")))?
        }
    };
    let read = run.must("get", run.s.queue.get(&record.id).await)?;
    for (how, trace_id) in [("as written", &record.trace_id), ("read back", &read.trace_id)] {
        ensure!(
            run,
            trace_id.as_deref() == Some(TRACE_OF_FAILING_ATTEMPT),
            "a job dead-lettered with traceparent {FAILING_ATTEMPT} (the failing attempt's, in place of its \
             producer's) should leave a record with its trace id {TRACE_OF_FAILING_ATTEMPT} ({how}), keeps \
             {trace_id:?}"
        );
    }
    Ok(())
}

/// How long one claim waits for the job.
const LOOK: Duration = Duration::from_millis(200);

/// A traceparent that is not a W3C trace context (set by hand: `with_traceparent` refuses it
/// first) is refused at enqueue, alone and in a batch.
async fn refused<Q: Queue, L: Ledger + Clone + 'static>(run: &Run<Q, L>) -> Result<(), crate::Violation> {
    let broken = |id: u32| NewJob { traceparent: Some("00-not-a-trace-context".into()), ..Probe::new(id).new_job() };
    let alone = run.s.queue.enqueue(broken(976)).await.map(|_| ());
    let in_batch = run.s.queue.enqueue_batch(vec![Probe::new(977).new_job(), broken(978)]).await.map(|_| ());
    for (what, answer) in [("alone", alone), ("in a batch", in_batch)] {
        ensure!(
            run,
            answer.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
            "a job whose traceparent is not a W3C trace context should be refused with InvalidInput when \
             enqueued {what}; answered {answer:?}"
        );
    }
    // Were either enqueued, it would run beside the scenario's jobs: the key sort names it.
    Ok(())
}
