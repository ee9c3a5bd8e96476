//! Flow control across workers (issue 25): a paused kind, a circuit breaker through a
//! provider's outage, a rate limit, and concurrency limits per kind and per key. Pauses and
//! limits live in the ledger's flow store ([`Ledger::flow`]), so every worker on it keeps them;
//! a ledger without one fails these scenarios (its limits would hold per process at best).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redrive_core::kit::Ledger;
use redrive_core::{BREAKER, Backoff, Breaker, Flow, FlowAction, Limits, Rate, RunningWorker};

use crate::harness::{ALL, Fault, Handles, OtherProbe, Probe, Run, ensure};
use crate::{OTHER_KIND, Outcome, PROBE_KIND, Queue, Subject, Violation};

/// The ledger's flow store, or the violation of a ledger that keeps none.
fn store<Q: Queue, L: Ledger + Clone + 'static>(run: &Run<Q, L>) -> Result<&impl Flow, Violation> {
    run.s.ledger.flow().ok_or_else(|| {
        run.fail(
            "the ledger keeps no flow store (Ledger::flow answers None): pauses and limits would hold in one \
             process only, not across the queue's workers",
        )
    })
}

/// Two workers with the scenario settings, each with `concurrency` handlers.
pub(crate) fn two_workers<Q: Queue, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    concurrency: usize,
    breaker: Option<Breaker>,
) -> [RunningWorker; 2] {
    let lease = run.s.timing.lease;
    [0, 1].map(|_| {
        let mut config = run.config(concurrency, lease, Duration::from_secs(30));
        if breaker.is_some() {
            // Retries a moment apart, as the default backoff spaces them (seconds there): a
            // breaker counts failures in a row, and retries at once would spend a job's
            // attempts before its failures are counted.
            config.backoff = Backoff { base: lease / 10, factor: 2.0, max: lease, jitter: false };
        }
        let builder = run.builder_for(run.s.queue.clone(), run.s.ledger.clone(), config, Handles::Both);
        match breaker {
            Some(breaker) => builder.breaker::<Probe>(breaker).build().start(),
            None => builder.build().start(),
        }
    })
}

/// Behaviour 37: A kind paused in the flow store (`Flow::pause`, as `redrive kind pause` does),
/// with who and why: no worker starts its jobs, at no attempt's cost, while another kind's jobs
/// run; the pause is listed with its reason and name; resumed, every job runs once on attempt 1,
/// and the trail holds the pause and the resume with their names.
pub async fn paused_kind<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("paused_kind", subject);
    let flow = store(&run)?;
    let paused = run.must("pause", flow.pause(PROBE_KIND, "the mail provider is down", "ana", None).await)?;
    ensure!(run, paused, "pausing a kind that was not paused should answer true");
    let again = run.must("pause again", flow.pause(PROBE_KIND, "again", "bo", None).await)?;
    ensure!(run, !again, "pausing a paused kind should answer false and keep the first pause");
    let kinds = run.must("list the kinds", flow.kinds().await)?;
    let listed = kinds.iter().find(|k| k.kind == PROBE_KIND).and_then(|k| k.paused.clone());
    ensure!(
        run,
        listed.as_ref().is_some_and(|p| p.by == "ana" && p.reason == "the mail provider is down"),
        "the paused kind should be listed as paused by ana, with her reason; listed {listed:?}"
    );
    for id in 1..=4 {
        run.must("enqueue", run.s.queue.enqueue(Probe::new(id).new_job()).await)?;
    }
    let other = OtherProbe { id: 9, body: "other".into() };
    run.must("enqueue", run.s.queue.enqueue(redrive_core::NewJob::from_job(&other).expect("job")).await)?;
    let workers = two_workers(&run, 2, None);
    run.wait_for_effects(1).await?;
    // Several polls and rechecks: a worker that ignored the pause would have started them.
    tokio::time::sleep(run.s.timing.lease * 2).await;
    let started: Vec<_> = (1..=4).filter(|id| !run.script.starts_of(&Probe::key(*id)).is_empty()).collect();
    ensure!(run, started.is_empty(), "jobs of the paused kind started while it was paused: probes {started:?}");
    ensure!(
        run,
        run.script.effects_of(&other_key()).len() == 1,
        "a job of another kind ({OTHER_KIND}) should run while {PROBE_KIND} is paused"
    );
    ensure!(run, run.must("resume", flow.resume(PROBE_KIND, "bo").await)?, "resuming a paused kind should answer true");
    run.wait_for_effects(5).await?;
    run.settle().await;
    for worker in workers {
        worker.shutdown().await;
    }
    for id in 1..=4 {
        let starts = run.script.starts_of(&Probe::key(id));
        ensure!(run, starts == [1], "probe {id} waited out a pause: it should run once, on attempt 1; ran {starts:?}");
    }
    let events = run.must("the trail", flow.events(Some(PROBE_KIND), 10).await)?;
    let trail: Vec<_> = events.iter().map(|e| (e.action, e.by.as_str())).collect();
    ensure!(
        run,
        trail == [(FlowAction::Resumed, "bo"), (FlowAction::Paused, "ana")],
        "the trail should hold the resume by bo and the pause by ana, newest first; holds {trail:?}"
    );
    run.report_keys(&[Probe::key(1), Probe::key(2), Probe::key(3), Probe::key(4), other_key()], &[]).await
}

fn other_key() -> redrive_core::IdempotencyKey {
    redrive_core::NewJob::from_job(&OtherProbe { id: 9, body: "other".into() }).expect("job").key
}

/// Behaviour 38: A provider's outage under a circuit breaker (`WorkerBuilder::breaker`): twelve
/// jobs with a cap of 3 whose provider fails for a while, two workers. The breaker pauses the
/// kind for both, one alert says so, probes run every cool-down, and once the provider is back a
/// probe succeeds and the kind resumes: no failure record, one pause alert, every effect once,
/// and few starts during the outage (the tripping failures, those in flight, the probes).
pub async fn outage_storm<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("outage_storm", subject);
    let flow = store(&run)?;
    let lease = run.s.timing.lease;
    let breaker = Breaker { after: 3, cool_down: lease / 2 };
    let ids: Vec<u32> = (100..112).collect();
    run.script.outage.store(true, Ordering::SeqCst);
    for id in &ids {
        run.script.fault(*id, Fault::Outage);
        run.must("enqueue", run.s.queue.enqueue(Probe::new(*id).new_job().with_cap(3)).await)?;
    }
    let started = std::time::Instant::now();
    let workers = two_workers(&run, 2, Some(breaker));
    let waiting = run.wait_for("the breaker's pause", || async {
        flow.kinds().await.is_ok_and(|k| k.iter().any(|k| k.paused.as_ref().is_some_and(|p| p.by == BREAKER)))
    });
    let tripped = waiting.await;
    let outage = lease * 2;
    tokio::time::sleep(outage).await;
    let during = run.script.starts.lock().unwrap().len();
    let elapsed = started.elapsed();
    run.script.outage.store(false, Ordering::SeqCst);
    let healed = run.wait_for_effects(ids.len()).await;
    run.settle().await;
    for worker in workers {
        worker.shutdown().await;
    }
    tripped.map_err(|v| run.fail(format!("{}: three failures in a row should trip the breaker", v.message)))?;
    if let Err(v) = healed {
        let kinds = flow.kinds().await;
        let records: Vec<_> = run.open_records().await?.into_iter().map(|r| (r.attempts, r.errors)).collect();
        return Err(run.fail(format!(
            "{} after the outage ended; {} effects, {} starts, records {records:?}, the kinds' flow {kinds:?}",
            v.message,
            run.script.effect_count(),
            run.script.starts.lock().unwrap().len()
        )));
    }
    let records = run.open_records().await?;
    ensure!(
        run,
        records.is_empty(),
        "an outage under a breaker should leave no failure record; {} records, e.g. {:?}",
        records.len(),
        records.first().map(|r| (&r.key, r.attempts, &r.last_error))
    );
    let alerts = run.script.pause_alerts.lock().unwrap().len();
    ensure!(run, alerts == 1, "the breaker's pause should be announced once, across both workers; {alerts} alerts");
    // Each worker counts its own failures (up to `after` before one trips it); each may start
    // its two handlers' jobs three more times before it reads the pause (in flight, then within
    // the poll its view of the store is stale, and a poll later on a loaded machine: seen once
    // in a full workspace run on two cores, for QStash's pushed deliveries); each cool-down since
    // the pause lets one probe through, counted over all the time that passed (the pause came
    // some time after the start, and was seen some time after that). Without the breaker: 12
    // jobs × 3 attempts, 12 records.
    let probes = (elapsed.as_millis() / breaker.cool_down.as_millis()) as usize + 1;
    let bound = 2 * (breaker.after as usize + 2 * 3) + probes;
    ensure!(
        run,
        during <= bound,
        "while the kind was paused only probes should start: {during} starts during the outage, at most {bound} \
         expected ({} without the breaker)",
        ids.len() * 3
    );
    let paused = run.must("list the kinds", flow.kinds().await)?;
    ensure!(
        run,
        paused.iter().all(|k| k.paused.is_none()),
        "the kind should be resumed after a probe succeeded; still paused: {paused:?}"
    );
    run.report(&ids, &[]).await
}

/// Behaviour 39: A rate limit on a kind (`Limits::rate`), kept by two workers together: the
/// handlers' starts never outrun it (the burst, then one per interval), and every job runs once,
/// on attempt 1 (waiting for a start costs no attempt).
pub async fn rate_limited<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("rate_limited", subject);
    let flow = store(&run)?;
    let rate = Rate { count: 5, per: Duration::from_millis(500) };
    let limits = Limits { rate: Some(rate), ..Limits::default() };
    run.must("set the limits", flow.set_limits(PROBE_KIND, &limits, "ana").await)?;
    let ids: Vec<u32> = (200..230).collect();
    for id in &ids {
        run.must("enqueue", run.s.queue.enqueue(Probe::new(*id).new_job()).await)?;
    }
    let workers = two_workers(&run, 4, None);
    run.wait_for_effects(ids.len()).await?;
    run.settle().await;
    for worker in workers {
        worker.shutdown().await;
    }
    let mut times = run.script.start_times.lock().unwrap().clone();
    times.sort();
    // The k-th start (from 0) may come no sooner than (k - count + 1) intervals after the first:
    // the burst, then one per interval. A start trails its token by the key's hold and the
    // decoding, more on a loaded machine, and the first start trailing most makes the rest look
    // early: two starts and 30 ms of slack for that (and for tokens spent up to 20 ms after their
    // grant). A rate not kept at all starts all thirty within a few intervals.
    const SLACK: u32 = 2;
    let interval = rate.interval();
    let due = |k: usize| interval * (k as u32 + 1).saturating_sub(rate.count + SLACK);
    let early =
        times.iter().enumerate().find(|(k, t)| t.duration_since(times[0]) + Duration::from_millis(30) < due(*k));
    if let Some((k, t)) = early {
        return Err(run.fail(format!(
            "start {k} came {:?} after the first, sooner than {rate} allows ({:?}, two starts of slack): the rate was \
             not kept across the two workers",
            t.duration_since(times[0]),
            due(k)
        )));
    }
    for id in &ids {
        let starts = run.script.starts_of(&Probe::key(*id));
        ensure!(run, starts == [1], "probe {id} waited for its rate: it should run once, on attempt 1; ran {starts:?}");
    }
    run.report(&ids, &[]).await
}

/// Behaviour 40: A concurrency limit on a kind (`Limits::concurrency`, 2) across two workers of
/// four handlers each: never more than two of its handlers run at once, and every job runs once,
/// on attempt 1.
pub async fn kind_concurrency<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("kind_concurrency", subject);
    let flow = store(&run)?;
    let limits = Limits { concurrency: Some(2), ..Limits::default() };
    run.must("set the limits", flow.set_limits(PROBE_KIND, &limits, "ana").await)?;
    let ids: Vec<u32> = (300..312).collect();
    for id in &ids {
        run.script.fault(*id, Fault::Takes(run.s.timing.lease / 5));
        run.must("enqueue", run.s.queue.enqueue(Probe::new(*id).new_job()).await)?;
    }
    let workers = two_workers(&run, 4, None);
    run.wait_for_effects(ids.len()).await?;
    run.settle().await;
    for worker in workers {
        worker.shutdown().await;
    }
    let most = run.script.most_running(ALL);
    ensure!(run, most <= 2, "a kind limited to 2 at once had {most} handlers running at once across two workers");
    for id in &ids {
        let starts = run.script.starts_of(&Probe::key(*id));
        ensure!(run, starts == [1], "probe {id} waited for a slot: it should run once, on attempt 1; ran {starts:?}");
    }
    run.report(&ids, &[]).await
}

/// Behaviour 41: A concurrency limit per key (`Limits::key_concurrency`, 1, by
/// `Job::limit_key`): one tenant's slow jobs run one at a time across two workers, while another
/// tenant's jobs are not held behind them: they all finish before the slow tenant's last.
pub async fn key_concurrency<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("key_concurrency", subject);
    let flow = store(&run)?;
    let limits = Limits { key_concurrency: Some(1), ..Limits::default() };
    run.must("set the limits", flow.set_limits(PROBE_KIND, &limits, "ana").await)?;
    // Tenant 5: slow; tenant 6: quick. The slow tenant's five jobs, one at a time, take 2.5 leases:
    // room for a broker's polling (Azurite under a loaded machine) to reach the quick tenant's.
    let slow: Vec<u32> = (500..505).collect();
    let quick: Vec<u32> = (600..606).collect();
    for id in &slow {
        run.script.fault(*id, Fault::Takes(run.s.timing.lease / 2));
        run.must("enqueue", run.s.queue.enqueue(Probe::new(*id).new_job()).await)?;
    }
    for id in &quick {
        run.must("enqueue", run.s.queue.enqueue(Probe::new(*id).new_job()).await)?;
    }
    let workers = two_workers(&run, 4, None);
    let quick_done = {
        let script = Arc::clone(&run.script);
        run.wait_for("the quick tenant's effects", move || {
            let script = Arc::clone(&script);
            async move { (600..606).all(|id| !script.effects_of(&Probe::key(id)).is_empty()) }
        })
        .await
    };
    let slow_done_then = slow.iter().filter(|id| !run.script.effects_of(&Probe::key(**id)).is_empty()).count();
    run.wait_for_effects(slow.len() + quick.len()).await?;
    run.settle().await;
    for worker in workers {
        worker.shutdown().await;
    }
    quick_done?;
    let most = run.script.most_running(5);
    ensure!(run, most == 1, "tenant 5, limited to 1 at once, had {most} handlers running at once");
    ensure!(
        run,
        slow_done_then < slow.len(),
        "the quick tenant's jobs should finish while the slow tenant's are still queued one at a time; the slow \
         tenant was already done"
    );
    let all: Vec<u32> = slow.iter().chain(&quick).copied().collect();
    for id in &all {
        let starts = run.script.starts_of(&Probe::key(*id));
        ensure!(
            run,
            starts == [1],
            "probe {id} waited for its key's slot: it should run once, on attempt 1; ran {starts:?}"
        );
    }
    run.report(&all, &[]).await
}
