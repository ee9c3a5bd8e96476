//! Order per key through a failure (issue 25): jobs that share a `Job::order_key` run one at a
//! time in the order they were enqueued, and an open failure record holds the rest of its key
//! back until it is replayed or discarded, so a later event never overtakes an earlier one that
//! failed (the caution about dead-letter queues behind ordered delivery).

use std::sync::Arc;
use std::time::Duration;

use redrive_core::kit::Ledger;
use redrive_core::{ErrorKind, FailureId};

use crate::harness::{Fault, ORDER, Probe, Run, ensure, order_group};
use crate::{Outcome, Queue, Subject};

/// Behaviour 42: Three order keys and some jobs without one, interleaved on the queue, two
/// workers of four handlers. `account70`'s second job fails once and is retried before the third
/// starts; its third fails into a record (cap 1): its four later
/// jobs wait, listed by `DeadLetter::blocked`, while other keys run; replayed, it runs in its
/// place and the rest follow in order. `account71`'s second job fails and its record is
/// discarded: the two behind it run then, and it never does. No two jobs of one key ever run at
/// once. A backend that keeps no order (`Capabilities::order_per_key` unset) must refuse a job
/// with an order key, alone or in a batch, rather than run it out of order.
pub async fn ordered_through_failure<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("ordered_through_failure", subject);
    if !run.caps.order_per_key {
        return refused(&run).await;
    }
    let replayed: Vec<u32> = (700..707).collect();
    let discarded: Vec<u32> = (710..714).collect();
    let steady: Vec<u32> = (720..725).collect();
    let unordered: Vec<u32> = (800..806).collect();
    let (replay_me, discard_me) = (702, 711);
    let takes = Fault::Takes(run.s.timing.lease / 10);
    for id in replayed.iter().chain(&discarded).chain(&steady) {
        run.script.fault(*id, takes);
    }
    // Each fails its first start only: at a cap of 1 that is a record, and the replay succeeds.
    run.script.fault(replay_me, Fault::FailFirstStart);
    run.script.fault(discard_me, Fault::FailFirstStart);
    // And one that is retried (cap 3): the job after it waits through the retry too.
    let retried = 701;
    run.script.fault(retried, Fault::FailFirstStart);
    for i in 0..7 {
        for group in [&replayed, &discarded, &steady, &unordered] {
            if let Some(id) = group.get(i) {
                let cap = if [replay_me, discard_me].contains(id) { 1 } else { 3 };
                run.must("enqueue", run.s.queue.enqueue(Probe::new(*id).new_job().with_cap(cap)).await)?;
            }
        }
    }
    let workers = crate::control::two_workers(&run, 4, None);
    let first_part: Vec<u32> =
        [700, 701, 710].into_iter().chain(steady.iter().copied()).chain(unordered.iter().copied()).collect();
    let before = {
        let script = Arc::clone(&run.script);
        let first_part = first_part.clone();
        run.wait_for("the jobs before the failures, and the other keys'", move || {
            let script = Arc::clone(&script);
            let first_part = first_part.clone();
            async move { first_part.iter().all(|id| !script.effects_of(&Probe::key(*id)).is_empty()) }
        })
        .await
    };
    let recorded = run.wait_for_records(2).await;
    // Long enough for a worker that ignores the block to start the jobs behind it.
    tokio::time::sleep(run.s.timing.settle.max(Duration::from_millis(500))).await;
    let overtook: Vec<u32> = [703, 704, 705, 706, 712, 713]
        .into_iter()
        .filter(|id| !run.script.starts_of(&Probe::key(*id)).is_empty())
        .collect();
    let blocked = run.must("list the blocked order keys", run.s.queue.blocked().await);
    let records = run.open_records().await?;
    let record_of =
        |id: u32| -> Option<FailureId> { records.iter().find(|r| r.key == Probe::key(id)).map(|r| r.id.clone()) };
    let (replay_record, discard_record) = (record_of(replay_me), record_of(discard_me));
    if let Some(record) = &replay_record {
        run.must("replay", run.s.queue.replay(record, "the provider is fixed", "ana").await)?;
    }
    if let Some(record) = &discard_record {
        run.must("discard", run.s.queue.discard(record, "the event was superseded", "ana").await)?;
    }
    let done: Vec<u32> = replayed
        .iter()
        .chain(&discarded)
        .chain(&steady)
        .chain(&unordered)
        .copied()
        .filter(|id| *id != discard_me)
        .collect();
    let all_done = run.wait_for_effects(done.len()).await;
    run.settle().await;
    let after = run.must("list the blocked order keys", run.s.queue.blocked().await);
    for worker in workers {
        worker.shutdown().await;
    }
    before?;
    recorded.map_err(|v| {
        run.fail(format!("{}: probes {replay_me} and {discard_me} should fail into records", v.message))
    })?;
    ensure!(
        run,
        overtook.is_empty(),
        "probes {overtook:?} started while an earlier job of their order key had an open failure record: a later event \
         overtook an earlier one that failed"
    );
    let blocked = blocked?;
    let listed = |order: &str, id: u32, waiting: u64| {
        blocked.iter().any(|b| b.order_key == order && b.key == Probe::key(id) && b.waiting == waiting)
    };
    ensure!(
        run,
        blocked.len() == 2 && listed("account70", replay_me, 4) && listed("account71", discard_me, 2),
        "blocked() should list account70 (held by probe {replay_me}'s record, 4 waiting) and account71 (probe \
         {discard_me}'s, 2 waiting); listed {blocked:?}"
    );
    ensure!(
        run,
        replay_record.is_some() && discard_record.is_some(),
        "probes {replay_me} and {discard_me} should each have an open record; open: {:?}",
        records.iter().map(|r| r.key.to_string()).collect::<Vec<_>>()
    );
    all_done.map_err(|v| {
        run.fail(format!(
            "{} after the record was replayed and the other discarded: the order keys stayed blocked ({} effects)",
            v.message,
            run.script.effect_count()
        ))
    })?;
    let after = after?;
    ensure!(run, after.is_empty(), "with the records closed no order key should be blocked; listed {after:?}");
    // Starts, per order key, in the order they happened: enqueue order, the failed job again in
    // its place after its replay, the discarded one never again.
    let starts: Vec<u32> = {
        let by_key: std::collections::HashMap<_, _> = (700..800).map(|id| (Probe::key(id), id)).collect();
        run.script.starts.lock().unwrap().iter().filter_map(|(key, _)| by_key.get(key).copied()).collect()
    };
    let of = |group: u32| starts.iter().copied().filter(|id| order_group(*id) == Some(group)).collect::<Vec<_>>();
    for (group, expected) in
        [(70, vec![700, 701, 701, 702, 702, 703, 704, 705, 706]), (71, vec![710, 711, 712, 713]), (72, steady.clone())]
    {
        let seen = of(group);
        ensure!(
            run,
            seen == expected,
            "account{group}'s jobs should start in enqueue order, {expected:?}; started {seen:?}"
        );
        let most = run.script.most_running(ORDER + group);
        ensure!(run, most == 1, "account{group}'s jobs should run one at a time; {most} ran at once");
    }
    ensure!(
        run,
        run.script.effects_of(&Probe::key(discard_me)).is_empty(),
        "the discarded probe {discard_me} should never take effect"
    );
    run.report(&done, &[]).await
}

/// A backend without order refuses what it would run out of order.
async fn refused<Q: Queue, L: Ledger + Clone + 'static>(run: &Run<Q, L>) -> Outcome {
    let alone = run.s.queue.enqueue(Probe::new(700).new_job()).await;
    let in_batch = run.s.queue.enqueue_batch(vec![Probe::new(800).new_job(), Probe::new(701).new_job()]).await;
    for (what, answer) in [("alone", alone.map(|_| ())), ("in a batch", in_batch.map(|_| ()))] {
        ensure!(
            run,
            answer.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
            "the backend keeps no order per key (Capabilities::order_per_key), so a job with an order key enqueued \
             {what} should be refused with InvalidInput rather than run out of order; answered {answer:?}"
        );
    }
    run.report(&[], &[]).await
}
