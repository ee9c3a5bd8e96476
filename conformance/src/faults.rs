//! The fault half: the same promise while renewals stall, the ledger is down, workers die, run
//! only some kinds, or alert sinks fail; and what purge and logs must never keep.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redrive_core::kit::{Dedupe, Ledger};
use redrive_core::{
    Enqueued, FailureQuery, IdempotencyKey, NewJob, ProviderKey, RecordState, ReplayOutcome, WorkerConfig,
};
use serde_json::json;

use crate::frozen::Freeze;
use crate::harness::{Fault, Handles, OtherProbe, Probe, Run, ensure};
use crate::logs::LogWatch;
use crate::{Outcome, Queue, Subject};

/// Waits until the handler of probe `id` has started.
async fn started<Q: Queue, L: Ledger + Clone + 'static>(run: &Run<Q, L>, id: u32) -> Result<(), crate::Violation> {
    let (script, key) = (Arc::clone(&run.script), Probe::key(id));
    run.wait_for("the handler to start", || {
        let (script, key) = (Arc::clone(&script), key.clone());
        async move { !script.starts_of(&key).is_empty() }
    })
    .await
}

/// Waits until the worker frozen by `freeze` has died (been frozen whole).
async fn died<Q: Queue, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    freeze: &Arc<Freeze>,
    what: &str,
) -> Result<(), crate::Violation> {
    let dead = Arc::clone(freeze);
    run.wait_for(what, || {
        let dead = Arc::clone(&dead);
        async move { dead.is_dead() }
    })
    .await
}

/// Behaviour 15: A handler whose renewals (lease and key hold) cannot get through for longer
/// than a lease is cancelled before its key's hold lapses; the next attempt runs it: one effect.
pub async fn stalled_heartbeat<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("stalled_heartbeat", subject);
    let unit = run.s.timing.lease * 2;
    run.script.delay(unit * 3 / 2);
    run.must("enqueue", run.s.queue.enqueue(Probe::new(60).new_job()).await)?;
    let config = run.config(1, unit, Duration::ZERO);
    let freeze = Arc::new(Freeze::default());
    let stalled = run.frozen_worker(&freeze, config.clone());
    started(&run, 60).await?;
    // From now on nothing this worker renews gets through, and it takes no more jobs.
    freeze.claims();
    freeze.renewals();
    let other = run.start_worker(config);
    run.wait_for_effects(1).await?;
    run.settle().await;
    other.shutdown().await;
    let cancelled = stalled.stats().cancelled;
    drop(stalled); // its tasks stay parked on the frozen renewals
    ensure!(
        run,
        cancelled == 1,
        "the stalled worker should cancel its handler before the hold lapsed (cancelled {cancelled})"
    );
    run.report(&[60], &[]).await
}

/// Behaviour 16: Two deliveries of one key; the first runs two leases, then fails once. The
/// second waits behind it without spending attempts (cap 2), so when its turn comes it still has
/// one: one effect, no record, with the backend's default setup.
pub async fn busy_never_dead_letters<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("busy_never_dead_letters", subject);
    let unit = run.s.timing.lease * 2;
    run.script.delay(unit * 2);
    run.script.fault(61, Fault::FailFirstStart);
    let job = Probe::new(61).new_job().with_cap(2);
    run.must("enqueue", run.s.queue.enqueue(job.clone()).await)?;
    run.must("enqueue again", run.s.queue.enqueue(job.clone()).await)?;
    let config = run.config(1, unit, Duration::from_secs(30));
    let (a, b) = (run.start_worker(config.clone()), run.start_worker(config));
    run.wait_for_effects(1).await?;
    run.settle().await;
    let (a, b) = (a.shutdown().await, b.shutdown().await);
    let open = run.open_records().await?;
    ensure!(run, open.is_empty(), "waiting behind another attempt must never end as a record: {open:?}");
    if !run.dedupe() {
        ensure!(run, a.deferred + b.deferred >= 1, "the second delivery should have waited; {a:?} {b:?}");
    }
    run.report(&[61], &[]).await
}

/// Behaviour 17: The effect ledger refuses connections for three leases, then comes back: every
/// job is done once, no record is written, and no attempt is spent on the outage.
pub async fn ledger_outage<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("ledger_outage", subject);
    let ids: Vec<u32> = (70..80).collect();
    let freeze = Arc::new(Freeze::default());
    freeze.ledger_down(true);
    let jobs = ids.iter().map(|&id| Probe::new(id).new_job().with_cap(2)).collect();
    run.must("batch enqueue", run.s.queue.enqueue_batch(jobs).await)?;
    let worker = run.frozen_worker(&freeze, run.config(4, run.s.timing.lease, Duration::from_secs(30)));
    tokio::time::sleep(run.s.timing.lease * 3).await;
    freeze.ledger_down(false);
    run.wait_for_effects(ids.len()).await?;
    run.settle().await;
    worker.shutdown().await;
    let open = run.must("count", run.s.queue.count_open().await)?;
    ensure!(run, open == 0, "an unreachable ledger is not the jobs' fault; {open} records written");
    let spent: Vec<_> = run.script.effects.lock().unwrap().iter().filter(|e| e.attempt > 1).cloned().collect();
    ensure!(run, spent.is_empty(), "the outage should spend no attempt: {spent:?}");
    run.report(&ids, &[]).await
}

/// Behaviour 18: Two messages of one key; the first attempt calls the provider and dies. Every
/// later call of the key, from either message, carries the same provider key.
pub async fn provider_key_once<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("provider_key_once", subject);
    run.script.fault(62, Fault::CallThenKillFirst);
    run.must("enqueue", run.s.queue.enqueue(Probe::new(62).new_job()).await)?;
    run.must("enqueue again", run.s.queue.enqueue(Probe::new(62).new_job()).await)?;
    let freeze = Arc::new(Freeze::default());
    run.script.kill_switch(&freeze);
    let dying = run.frozen_worker(&freeze, run.config(1, run.s.timing.lease, Duration::ZERO));
    died(&run, &freeze, "the first attempt to call and die").await?;
    let survivor = run.worker(2);
    run.wait_for_effects(1).await?;
    run.settle().await;
    survivor.shutdown().await;
    drop(dying);
    let key = Probe::key(62);
    let calls: Vec<ProviderKey> =
        run.script.calls.lock().unwrap().iter().filter(|(k, _)| *k == key).map(|(_, p)| *p).collect();
    ensure!(run, calls.len() >= 2, "the provider should be called by the dead attempt and the next: {calls:?}");
    ensure!(
        run,
        calls.iter().all(|p| *p == calls[0]),
        "every call of one key should carry one provider key: {calls:?}"
    );
    let effects = run.script.effects_of(&key);
    ensure!(
        run,
        effects.len() == 1 && effects[0].earlier_attempt_pending,
        "the attempt after the dead one should know it resumes: {effects:?}"
    );
    run.report(&[62], &[]).await
}

/// Behaviour 19: Two workers on one queue, one with a handler for each of two kinds: nothing is
/// dead-lettered, every job is done once by the worker that has its handler.
pub async fn mixed_kinds<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("mixed_kinds", subject);
    let ids: Vec<u32> = (90..96).collect();
    let mut jobs: Vec<NewJob> = ids.iter().map(|&id| Probe::new(id).new_job()).collect();
    jobs.extend(ids.iter().map(|&id| OtherProbe::new_job(id)));
    let config = run.config(2, run.s.timing.lease, Duration::from_secs(30));
    let (q, l) = (run.s.queue.clone(), run.s.ledger.clone());
    let probes = run.start_worker_for(q.clone(), l.clone(), config.clone(), Handles::Probes);
    let others = run.start_worker_for(q, l, config, Handles::Others);
    run.must("batch enqueue", run.s.queue.enqueue_batch(jobs).await)?;
    if let Err(timeout) = run.wait_for_effects(ids.len() * 2).await {
        let (a, b) = (probes.stats(), others.stats());
        return Err(run.fail(format!("{}; the workers did {a:?} and {b:?}", timeout.message)));
    }
    run.settle().await;
    let (a, b) = (probes.shutdown().await, others.shutdown().await);
    let open = run.must("count", run.s.queue.count_open().await)?;
    ensure!(run, open == 0, "a kind a worker has no handler for is not a failure; {open} records ({a:?} {b:?})");
    let mut keys: Vec<IdempotencyKey> = ids.iter().map(|&id| Probe::key(id)).collect();
    keys.extend(ids.iter().map(|&id| OtherProbe::key(id)));
    run.report_keys(&keys, &[]).await
}

/// Behaviour 20: A job that kills its worker every time it runs, claimed in a batch with others
/// (cap 2): the others finish, once each; the poison job ends as one failure record with one alert.
pub async fn crash_loop<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("crash_loop", subject);
    let poison = 208;
    let others: Vec<u32> = (200..217).filter(|&id| id != poison).collect();
    run.script.fault(poison, Fault::Kill);
    let jobs = (200..217)
        .map(|id| if id == poison { Probe::new(id).new_job().with_cap(2) } else { Probe::new(id).new_job() })
        .collect();
    run.must("batch enqueue", run.s.queue.enqueue_batch(jobs).await)?;
    let unit = run.s.timing.lease;
    let config = WorkerConfig { claim_lease: unit, batch: 8, ..run.config(1, unit, Duration::ZERO) };
    let mut dead = Vec::new();
    let mut finished = false;
    for _ in 0..8 {
        let freeze = Arc::new(Freeze::default());
        run.script.kill_switch(&freeze);
        let worker = run.frozen_worker(&freeze, config.clone());
        let (script, queue, watch) = (Arc::clone(&run.script), run.s.queue.clone(), Arc::clone(&freeze));
        let n = others.len();
        run.wait_for("the worker to die or the queue to drain", || {
            let (script, queue, watch) = (Arc::clone(&script), queue.clone(), Arc::clone(&watch));
            async move { watch.is_dead() || (script.effect_count() >= n && queue.count_open().await.is_ok_and(|c| c >= 1)) }
        })
        .await?;
        if freeze.is_dead() {
            dead.push(worker);
            continue;
        }
        run.settle().await;
        worker.shutdown().await;
        finished = true;
        break;
    }
    ensure!(run, finished, "the poison job should end as a record after its cap, not kill worker after worker");
    ensure!(
        run,
        dead.len() <= 4,
        "with a cap of 2 the poison job should kill at most 4 workers, killed {}",
        dead.len()
    );
    let alerts = run.script.alerts.lock().unwrap().iter().filter(|a| a.record.key == Probe::key(poison)).count();
    ensure!(run, alerts == 1, "one alert for the poison job's record expected, got {alerts}");
    drop(dead);
    run.report(&others, &[poison]).await
}

/// Behaviour 21: A sink that fails each alert twice before taking it, and a worker killed between
/// writing a record and alerting it: each record is alerted exactly once.
pub async fn alert_delivery<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("alert_delivery", subject);
    let alerts_of = |id: u32| {
        let key = Probe::key(id);
        run.script.alerts.lock().unwrap().iter().filter(|a| a.record.key == key).count()
    };
    // A flaky sink: retried with backoff until it takes the alert.
    run.script.flaky_alerts(2);
    run.script.fault(63, Fault::Permanent);
    run.must("enqueue", run.s.queue.enqueue(Probe::new(63).new_job()).await)?;
    let worker = run.worker(1);
    let script = Arc::clone(&run.script);
    run.wait_for("the flaky sink to take the alert", || {
        let script = Arc::clone(&script);
        async move { script.alert_count() >= 1 }
    })
    .await?;
    worker.shutdown().await;
    run.script.flaky_alerts(0);

    // A worker that dies once the record is written, before alerting it. Its sweep runs once, at
    // start, before the job is there: a sweep beside the dead-letter could see the record between
    // its write and the dead-letter's return (a broker writes the record, then deletes the
    // message) and alert it before the worker dies.
    run.script.fault(64, Fault::Permanent);
    let freeze = Arc::new(Freeze::default());
    freeze.die_after_record();
    let once =
        WorkerConfig { alert_sweep: Duration::from_secs(3600), ..run.config(1, run.s.timing.lease, Duration::ZERO) };
    let dying = run.frozen_worker(&freeze, once);
    tokio::time::sleep(run.s.timing.lease).await;
    run.must("enqueue", run.s.queue.enqueue(Probe::new(64).new_job()).await)?;
    died(&run, &freeze, "the worker to write the record and die").await?;
    ensure!(run, alerts_of(64) == 0, "the dying worker should not have alerted");
    let survivor = run.worker(1);
    let script = Arc::clone(&run.script);
    let key = Probe::key(64);
    run.wait_for("the next worker to alert the record", || {
        let (script, key) = (Arc::clone(&script), key.clone());
        async move { script.alerts.lock().unwrap().iter().any(|a| a.record.key == key) }
    })
    .await?;
    // Past a sweep or two: nothing is sent again.
    tokio::time::sleep(run.s.timing.lease * 2).await;
    run.settle().await;
    survivor.shutdown().await;
    drop(dying);
    ensure!(
        run,
        (alerts_of(63), alerts_of(64)) == (1, 1),
        "one alert per record expected, got {} and {}",
        alerts_of(63),
        alerts_of(64)
    );
    run.report(&[], &[63, 64]).await
}

/// Behaviour 22: A canary value in a payload that does not decode and in one that exhausts its
/// attempts appears in no log line (redrive's, down to trace), no record error and no alert.
pub async fn no_payload_in_logs<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("no_payload_in_logs", subject);
    let Some(watch) = LogWatch::get() else {
        return Err(run.fail("another tracing subscriber is installed for the process: logs cannot be captured"));
    };
    let canary = format!("4111-{}", ProviderKey::mint());
    let seen = watch.watch(&canary);
    let witness = watch.watch(Probe::key(66).as_str());
    let bad =
        run.must("new job", NewJob::new(crate::PROBE_KIND, Probe::key(65), json!({"id": canary, "body": "x"})))?;
    run.script.fault(66, Fault::Always);
    run.must("enqueue", run.s.queue.enqueue(bad).await)?;
    run.must("enqueue", run.s.queue.enqueue(Probe { id: 66, body: canary.clone() }.new_job()).await)?;
    let worker = run.worker(2);
    run.wait_for_records(2).await?;
    run.settle().await;
    worker.shutdown().await;
    ensure!(run, witness.load(Ordering::SeqCst), "the log capture should see the worker's lines about the job");
    ensure!(run, !seen.load(Ordering::SeqCst), "a payload value was written to the log");
    for r in run.open_records().await? {
        let errors = r.errors.iter().map(|e| e.error.as_str());
        ensure!(
            run,
            !std::iter::once(r.last_error.as_str()).chain(errors).any(|e| e.contains(&canary)),
            "record {} quotes the payload in its errors",
            r.id
        );
    }
    for alert in run.script.alerts.lock().unwrap().iter() {
        // What a webhook posts: the summary as Slack-compatible JSON.
        let body = json!({ "text": alert.summary() }).to_string();
        ensure!(run, !body.contains(&canary), "an alert quotes the payload: {body}");
    }
    run.report(&[], &[65, 66]).await
}

/// Behaviour 23: Purging a record removes its payload from everywhere the backend keeps data;
/// before, enqueuing the key answers `Failed` where the backend dedupes at enqueue; after, the key
/// is free: enqueued again, the job runs once.
pub async fn purge_forgets<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("purge_forgets", subject);
    let Some(storage) = run.s.storage.clone() else {
        return Err(run.fail("the subject gives no look into its storage: set one with `Subject::storage`"));
    };
    let canary = format!("purge-me-{}", ProviderKey::mint());
    let job = Probe { id: 67, body: canary.clone() }.new_job();
    run.script.fault(67, Fault::Permanent);
    run.must("enqueue", run.s.queue.enqueue(job.clone()).await)?;
    let worker = run.worker(1);
    run.wait_for_records(1).await?;
    worker.shutdown().await;
    ensure!(run, storage(canary.clone()).await, "before the purge the record should hold the payload");
    if run.caps.dedupe == Dedupe::Kept {
        let again = run.must("enqueue of a failed key", run.s.queue.enqueue(job.clone()).await)?;
        ensure!(
            run,
            matches!(again, Enqueued::Failed { .. }),
            "a key whose job failed should answer Failed, got {again:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let purged = run.must("purge", run.s.queue.purge(Duration::ZERO).await)?;
    ensure!(run, purged == 1, "one record to purge, purged {purged}");
    ensure!(run, !storage(canary.clone()).await, "after the purge the payload should be nowhere in the backend");
    run.script.heal();
    let again = run.must("enqueue after the purge", run.s.queue.enqueue(job.clone()).await)?;
    if let Dedupe::Unreported(window) = run.caps.dedupe {
        return run.dropped_unreported(&job.key, window, "a purged key").await;
    }
    if let (Dedupe::Window(window), false) = (run.caps.dedupe, again.is_created()) {
        // A broker's deduplication window (QStash) holds the key whatever the purge, until the
        // window ends: the enqueue says so, typed, and nothing runs or is recorded.
        ensure!(
            run,
            matches!(again, Enqueued::Duplicate { .. }),
            "within the broker's {window:?} window a purged key should answer Duplicate, got {again:?}"
        );
        run.settle().await;
        ensure!(run, run.script.effects_of(&job.key).is_empty(), "a job the broker dropped should not run");
        ensure!(run, run.must("count", run.s.queue.count_open().await)? == 0, "nothing should be recorded");
        return Ok(crate::Report::default());
    }
    ensure!(run, again.is_created(), "a purged key is free: enqueued again it should be created, got {again:?}");
    let worker = run.worker(1);
    run.wait_for_effects(1).await?;
    run.settle().await;
    worker.shutdown().await;
    run.report(&[67], &[]).await
}

/// Behaviour 24: Two operators at once. Two readers paging through the records together (pages
/// of one) each see every record once; two replays of one record at the same moment put its job
/// back once: one answers `Replayed`, the other finds the record replayed; each job then has one
/// effect.
pub async fn racing_replays<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("racing_replays", subject);
    let jobs = [crate::scenarios::exhaust_one(&run, 68).await?, crate::scenarios::exhaust_one(&run, 69).await?];
    run.script.heal();
    let read_all = || async {
        let mut query = FailureQuery { limit: 1, ..FailureQuery::open() };
        let mut ids = Vec::new();
        loop {
            let page = run.s.queue.list(&query).await?;
            ids.extend(page.iter().map(|r| r.id.clone()));
            match page.last() {
                Some(last) => query.after = Some(last.id.clone()),
                None => return redrive_core::Result::Ok(ids),
            }
        }
    };
    let (first, second) = tokio::join!(read_all(), read_all());
    let (first, second) = (run.must("list", first)?, run.must("list", second)?);
    let records = run.open_records().await?;
    let all: BTreeSet<_> = records.iter().map(|r| r.id.clone()).collect();
    for (reader, ids) in [("first", &first), ("second", &second)] {
        let seen: BTreeSet<_> = ids.iter().cloned().collect();
        ensure!(
            run,
            ids.len() == all.len() && seen == all,
            "the {reader} reader should page through the {} open records once each, saw {ids:?}",
            all.len()
        );
    }
    for record in &records {
        let (a, b) =
            tokio::join!(run.s.queue.replay(&record.id, "", "ops-a"), run.s.queue.replay(&record.id, "", "ops-b"));
        let outcomes = [run.must("replay", a)?, run.must("replay", b)?];
        let replayed = outcomes.iter().filter(|o| matches!(o, ReplayOutcome::Replayed(_))).count();
        ensure!(run, replayed == 1, "two replays at once should put the job back once, answered {outcomes:?}");
        ensure!(
            run,
            outcomes.iter().any(|o| matches!(
                o,
                ReplayOutcome::AlreadyClosed(RecordState::Replaying { .. } | RecordState::Confirmed { .. })
            )),
            "the other replay should find the record replayed, answered {outcomes:?}"
        );
    }
    let worker = run.worker(2);
    run.wait_for_effects(jobs.len()).await?;
    run.settle().await;
    worker.shutdown().await;
    for job in &jobs {
        let effects = run.script.effects_of(&job.key).len();
        ensure!(run, effects == 1, "a replayed job should have one effect, had {effects}");
    }
    ensure!(run, run.must("count", run.s.queue.count_open().await)? == 0, "no record should stay open");
    run.report(&[68, 69], &[]).await
}

/// Behaviour 25: A record left open is reminded once per period (`remind_after`), each reminder
/// sent once although two workers sweep, and the reminders stop once it is replayed.
pub async fn reminders<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("reminders", subject);
    let script = Arc::clone(&run.script);
    let sent = move || -> Vec<u32> {
        let key = Probe::key(68);
        script.alerts.lock().unwrap().iter().filter(|a| a.record.key == key).map(|a| a.reminder).collect()
    };
    run.script.fault(68, Fault::Permanent);
    run.must("enqueue", run.s.queue.enqueue(Probe::new(68).new_job()).await)?;
    let period = run.s.timing.lease * 2;
    let config = WorkerConfig { remind_after: Some(period), ..run.config(1, run.s.timing.lease, Duration::ZERO) };
    let (first, second) = (run.start_worker(config.clone()), run.start_worker(config));
    run.wait_for("the second reminder", || {
        let sent = sent.clone();
        async move { sent().contains(&2) }
    })
    .await?;

    // Replayed (and healed): the record closes, the job runs once, the reminders stop.
    run.script.heal();
    let record = run
        .open_records()
        .await?
        .into_iter()
        .find(|r| r.key == Probe::key(68))
        .ok_or_else(|| run.fail("the record should be open"))?;
    let outcome = run.must("replay", run.s.queue.replay(&record.id, "", "ops").await)?;
    ensure!(run, matches!(outcome, ReplayOutcome::Replayed(_)), "the replay should replay, got {outcome:?}");
    run.wait_for_effects(1).await?;
    tokio::time::sleep(run.s.timing.lease).await; // a sweep that listed the record before the replay
    let at_close = sent().len();
    tokio::time::sleep(period * 2).await;
    run.settle().await;
    first.shutdown().await;
    second.shutdown().await;

    let sent = sent();
    let in_order: Vec<u32> = (0..sent.len() as u32).collect();
    let mut sorted = sent.clone();
    sorted.sort_unstable();
    ensure!(run, sorted == in_order, "the alert and each reminder should be sent once, were {sent:?}");
    ensure!(run, sent.len() == at_close, "no reminder after the replay: {} then {sent:?}", at_close);
    run.report(&[68], &[]).await
}
