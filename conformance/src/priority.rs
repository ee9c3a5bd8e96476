//! Priorities (issue 26): a claim takes the ready jobs of the highest priority first, and the
//! oldest first within one.

use std::time::Duration;

use redrive_core::kit::Ledger;
use redrive_core::{ErrorKind, NewJob, WorkerConfig};

use crate::harness::{Probe, Run, ensure};
use crate::{Outcome, Queue, Subject};

/// The probes of [`priorities`], as enqueued (low, high, mid, three times), with their priority.
const ENQUEUED: [(u32, i16); 9] =
    [(910, -10), (911, 50), (912, 0), (913, -10), (914, 50), (915, 0), (916, -10), (917, 50), (918, 0)];

fn prioritised(id: u32, priority: i16) -> NewJob {
    Probe::new(id).new_job().with_priority(priority).expect("a priority in range")
}

/// Behaviour 43: Nine jobs enqueued low, high, mid, three times over, before one worker of one
/// handler starts (claiming ahead, in batches of up to eight): they start high, mid, low, and in
/// enqueue order within each priority. A backend whose claims ignore priorities
/// (`Capabilities::priorities` unset) must refuse a job of any priority but 0, alone or in a
/// batch, rather than run it out of turn.
pub async fn priorities<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("priorities", subject);
    if !run.caps.priorities {
        return refused(&run).await;
    }
    let jobs: Vec<NewJob> = ENQUEUED.iter().map(|(id, priority)| prioritised(*id, *priority)).collect();
    for job in jobs {
        run.must("enqueue", run.s.queue.enqueue(job).await)?;
    }
    // One claim in flight at a time, so that the order of starts is the order of claims; a batch
    // of up to eight, so that the order within a batch counts too.
    let config = WorkerConfig { claimers: 1, batch: 8, ..run.config(1, run.s.timing.lease, Duration::from_secs(30)) };
    let worker = run.start_worker(config);
    let all_done = run.wait_for_effects(ENQUEUED.len()).await;
    run.settle().await;
    worker.shutdown().await;
    all_done?;
    let starts: Vec<u32> = {
        let by_key: std::collections::HashMap<_, _> = ENQUEUED.iter().map(|(id, _)| (Probe::key(*id), *id)).collect();
        run.script.starts.lock().unwrap().iter().filter_map(|(key, _)| by_key.get(key).copied()).collect()
    };
    let expected = [911, 914, 917, 912, 915, 918, 910, 913, 916];
    ensure!(
        run,
        starts == expected,
        "jobs enqueued at -10, 50, 0 (three times) should start by priority, highest first, and in enqueue order \
         within one: {expected:?}; started {starts:?}"
    );
    let ids: Vec<u32> = ENQUEUED.iter().map(|(id, _)| *id).collect();
    run.report(&ids, &[]).await
}

/// A backend without priorities refuses what it would run out of turn.
async fn refused<Q: Queue, L: Ledger + Clone + 'static>(run: &Run<Q, L>) -> Outcome {
    let alone = run.s.queue.enqueue(prioritised(910, 50)).await;
    let in_batch = run.s.queue.enqueue_batch(vec![Probe::new(911).new_job(), prioritised(912, -10)]).await;
    for (what, answer) in [("alone", alone.map(|_| ())), ("in a batch", in_batch.map(|_| ()))] {
        ensure!(
            run,
            answer.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
            "the backend's claims ignore priorities (Capabilities::priorities), so a job of priority other than 0 \
             enqueued {what} should be refused with InvalidInput rather than run out of turn; answered {answer:?}"
        );
    }
    run.report(&[], &[]).await
}
