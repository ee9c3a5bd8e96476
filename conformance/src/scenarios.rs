//! The behaviours of ordinary operation: duplicates, races, retries to a record, replays, key
//! conflicts, payloads that do not decode or do not fit, many workers, discards and purges. Each
//! takes a fresh subject and returns its key sort or a violation.

use std::time::Duration;

use redrive_core::kit::{Begin, Dedupe, Kinds, Ledger};
use redrive_core::{ErrorKind, FailureQuery, NewJob, ProviderKey, RecordState, ReplayExt, ReplayOutcome};
use serde_json::json;

use crate::harness::{Fault, Probe, Run, ensure};
use crate::{Outcome, Queue, Subject};

/// Behaviour 1: The same job enqueued twice with one key gives one effect.
pub async fn replay<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("replay", subject);
    let job = Probe::new(1);
    let first = run.must("first enqueue", run.s.queue.enqueue(job.new_job()).await)?;
    let second = run.must("second enqueue", run.s.queue.enqueue(job.new_job()).await)?;
    ensure!(run, first.is_created(), "the first enqueue should create the job, got {first:?}");
    if run.reports_duplicates() {
        ensure!(
            run,
            !second.is_created() && second.id() == first.id(),
            "the second enqueue should be a duplicate of {first:?}, got {second:?}"
        );
    }
    let worker = run.worker(2);
    run.wait_for_effects(1).await?;
    if !run.dedupe() {
        // The second delivery waits out the first one's hold, then finds the effect done.
        run.wait_for("the second delivery's skip", || {
            let skipped = worker.stats().skipped;
            async move { skipped >= 1 }
        })
        .await?;
    }
    run.settle().await;
    let stats = worker.shutdown().await;
    if !run.dedupe() {
        ensure!(run, stats.skipped == 1, "the second delivery should be skipped by the ledger; stats {stats:?}");
    }
    run.report(&[1], &[]).await
}

/// Behaviour 2: Two workers given the same job at once: one effect and one recorded skip (a duplicate at
/// enqueue, or a ledger skip at the second worker). The ledger itself gives exactly one of two
/// racing attempts the key.
pub async fn race<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("race", subject);
    let key = Probe::key(900);
    let payload = json!({"id": 900});
    let (a, b) = tokio::join!(
        run.s.ledger.begin(&key, &payload, ProviderKey::mint(), run.s.timing.lease),
        run.s.ledger.begin(&key, &payload, ProviderKey::mint(), run.s.timing.lease)
    );
    let (a, b) = (run.must("ledger begin", a)?, run.must("ledger begin", b)?);
    let holders = [&a, &b].iter().filter(|r| matches!(r, Begin::Fresh(_) | Begin::Resumed(_))).count();
    ensure!(run, holders == 1, "exactly one racing attempt should hold the key, got {a:?} and {b:?}");

    let job = Probe::new(2);
    let (w1, w2) = (run.worker(1), run.worker(1));
    let (e1, e2) = tokio::join!(run.s.queue.enqueue(job.new_job()), run.s.queue.enqueue(job.new_job()));
    let (e1, e2) = (run.must("enqueue", e1)?, run.must("enqueue", e2)?);
    run.wait_for_effects(1).await?;
    let duplicates = [&e1, &e2].iter().filter(|e| !e.is_created()).count() as u64;
    let unreported = matches!(run.caps.dedupe, Dedupe::Unreported(_));
    if !unreported {
        // Without enqueue dedupe, the second delivery's skip may take a deferral round to show.
        run.wait_for("a recorded skip", || {
            let skipped = w1.stats().skipped + w2.stats().skipped;
            async move { duplicates + skipped >= 1 }
        })
        .await?;
    }
    run.settle().await;
    let (s1, s2) = (w1.shutdown().await, w2.shutdown().await);
    let skips = duplicates + s1.skipped + s2.skipped;
    // A service that drops the copy unreported delivers one: nothing to skip, and no answer says
    // so (the one effect is checked below).
    let expected = if unreported { 0 } else { 1 };
    ensure!(
        run,
        skips == expected,
        "expected {expected} recorded skip, got {duplicates} duplicate enqueues and {} ledger skips",
        s1.skipped + s2.skipped
    );
    run.report(&[2], &[]).await
}

/// Runs probe `id` with an always-failing handler to its failure record, checking the attempts,
/// the record and the one alert.
pub(crate) async fn exhaust_one<Q: Queue, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    id: u32,
) -> Result<NewJob, crate::Violation> {
    run.script.fault(id, Fault::Always);
    let job = Probe::new(id).new_job();
    let alerts_before = run.script.alert_count();
    run.must("enqueue", run.s.queue.enqueue(job.clone()).await)?;
    let worker = run.worker(2);
    let queue = run.s.queue.clone();
    let key = job.key.clone();
    run.wait_for("a failure record", || {
        let (queue, key) = (queue.clone(), key.clone());
        async move { queue.list(&FailureQuery::open()).await.is_ok_and(|r| r.iter().any(|r| r.key == key)) }
    })
    .await?;
    run.settle().await;
    worker.shutdown().await;

    let starts = run.script.starts_of(&job.key);
    let expected: Vec<u32> = (1..=job.cap).collect();
    ensure!(run, starts == expected, "the handler should run attempts {expected:?}, ran {starts:?}");
    let records: Vec<_> = run.open_records().await?.into_iter().filter(|r| r.key == job.key).collect();
    ensure!(run, records.len() == 1, "expected one failure record, found {}", records.len());
    let r = &records[0];
    ensure!(run, r.payload == job.payload, "the record should hold the full payload");
    ensure!(run, r.attempts == job.cap, "the record should count {} attempts, says {}", job.cap, r.attempts);
    ensure!(
        run,
        r.last_error.contains("forced failure"),
        "the record should keep the last error, has {:?}",
        r.last_error
    );
    ensure!(
        run,
        r.kind == job.kind && r.provider_key == job.provider_key,
        "the record should keep kind and provider key"
    );
    ensure!(run, r.first_failed_at <= r.last_failed_at, "first failure after last failure");
    let attempts: Vec<u32> = r.errors.iter().map(|e| e.attempt).collect();
    ensure!(run, attempts == expected, "the record's history should hold attempts {expected:?}, holds {attempts:?}");
    ensure!(
        run,
        r.errors.first().is_some_and(|e| e.at == r.first_failed_at),
        "the first failure's time should be the first error's"
    );
    let alerts =
        run.script.alerts.lock().unwrap().iter().skip(alerts_before).filter(|a| a.record.key == job.key).count();
    ensure!(run, alerts == 1, "expected exactly one alert for the record, got {alerts}");
    Ok(job)
}

/// Behaviour 3: A handler that always fails: exactly `cap` attempts, one failure record with payload,
/// error and attempt count, exactly one alert.
pub async fn exhaust<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("exhaust", subject);
    exhaust_one(&run, 3).await?;
    run.report(&[], &[3]).await
}

/// Behaviour 4: Remove the fault, replay the record with its original key: the record is
/// replaying until the effect happens, once, and then confirmed, with who replayed it and why;
/// replaying it again does nothing more. Replay by filter too. A replay by nobody is refused.
pub async fn recover<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("recover", subject);
    let job = exhaust_one(&run, 4).await?;
    let other = exhaust_one(&run, 5).await?;
    run.script.heal();
    let record =
        run.open_records().await?.into_iter().find(|r| r.key == job.key).ok_or_else(|| run.fail("record gone"))?;
    // A person looking for the record of one job finds it by key or by job id, not the other's.
    for (how, query) in
        [("key", FailureQuery::by_key(job.key.clone())), ("job id", FailureQuery::by_job(record.job_id.clone()))]
    {
        let found = run.must("list", run.s.queue.list(&query).await)?;
        let ids: Vec<_> = found.iter().map(|r| &r.id).collect();
        ensure!(run, ids == [&record.id], "listing by {how} should find the one record {}, found {ids:?}", record.id);
    }
    let nobody = run.s.queue.replay(&record.id, "fixed", " ").await;
    ensure!(
        run,
        nobody.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
        "a replay by nobody should be refused as InvalidInput, got {nobody:?}"
    );
    let outcome = run.must("replay", run.s.queue.replay(&record.id, "fixed in 1.4.2", "ops@example.com").await)?;
    ensure!(run, matches!(outcome, ReplayOutcome::Replayed(_)), "the first replay should replay, got {outcome:?}");
    let by_filter = FailureQuery { kind: Some(other.kind.clone()), ..FailureQuery::open() };
    let replayed =
        run.must("replay by filter", run.s.queue.replay_matching(&by_filter, 50, "carrier back", "oncall").await)?;
    ensure!(
        run,
        replayed.len() == 1,
        "replay by filter should put back the one other open record, put back {}",
        replayed.len()
    );

    // Sent, not yet done: the record says so until the effect is seen (the seed's step 6).
    let sent = run.must("get", run.s.queue.get(&record.id).await)?;
    ensure!(
        run,
        matches!(sent.state, RecordState::Replaying { .. }),
        "a replayed record should be replaying until its job's effect is done, is {:?}",
        sent.state
    );
    let worker = run.worker(2);
    run.wait_for_effects(2).await?;
    let again = run.must("second replay", run.s.queue.replay(&record.id, "", "someone else").await)?;
    ensure!(
        run,
        matches!(again, ReplayOutcome::AlreadyClosed(RecordState::Replaying { .. } | RecordState::Confirmed { .. })),
        "a second replay should find the record closed, got {again:?}"
    );
    wait_confirmed(&run, &record.id).await?;
    run.settle().await;
    worker.shutdown().await;

    let effects = run.script.effects_of(&job.key);
    ensure!(run, effects.len() == 1, "the replay should cause one effect, caused {}", effects.len());
    ensure!(run, effects[0].provider_key == job.provider_key, "the replay should carry the original provider key");
    ensure!(
        run,
        effects[0].earlier_attempt_pending,
        "the handler should learn that earlier attempts were left pending"
    );
    // Each record keeps who replayed it and why, as a discard does; a second replay changes neither.
    let other_record = run.must("list", run.s.queue.list(&FailureQuery::by_key(other.key.clone())).await)?;
    let closed = run.must("get", run.s.queue.get(&record.id).await)?;
    for (record, reason, actor) in
        [(Some(&closed), "fixed in 1.4.2", "ops@example.com"), (other_record.first(), "carrier back", "oncall")]
    {
        let state = record.map(|r| &r.state);
        ensure!(
            run,
            matches!(state, Some(RecordState::Confirmed { reason: r, actor: a, at, confirmed_at, .. })
                if r == reason && a == actor && confirmed_at >= at),
            "the record should be confirmed, replayed by {actor} ({reason}) and its effect seen after, is {state:?}"
        );
    }
    ensure!(run, run.must("count", run.s.queue.count_open().await)? == 0, "no record should stay open");
    run.report(&[4, 5], &[]).await
}

/// Waits until record `id` is confirmed: its replayed job's effect is done and the backend has
/// said so (the worker confirms just before it completes).
pub(crate) async fn wait_confirmed<Q: Queue, L: Ledger + Clone + 'static>(
    run: &Run<Q, L>,
    id: &redrive_core::FailureId,
) -> Result<(), crate::Violation> {
    let queue = run.s.queue.clone();
    let found = run
        .wait_for("the replayed record's confirmation", || {
            let (queue, id) = (queue.clone(), id.clone());
            async move { queue.get(&id).await.is_ok_and(|r| matches!(r.state, RecordState::Confirmed { .. })) }
        })
        .await;
    found.map_err(|v| {
        run.fail(format!("{}: the replayed job's effect is done, and record {id} was never confirmed", v.message))
    })
}

/// Behaviour 5: The same key with another payload is a typed error and changes nothing. A backend without
/// enqueue-time dedupe delivers both; the ledger then refuses the second payload, which ends as
/// a failure record, and the effect happens once.
pub async fn key_conflict<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("key_conflict", subject);
    let original = Probe::new(6);
    let changed = Probe { body: "another payload".into(), ..original.clone() };
    run.must("enqueue", run.s.queue.enqueue(original.new_job()).await)?;
    let second = run.s.queue.enqueue(changed.new_job()).await;
    // Only a backend that keeps every job sees the conflict at enqueue; one that dedupes within a
    // window, or not at all, delivers both and the ledger turns the second into a record.
    let conflict_at_enqueue = run.caps.dedupe == Dedupe::Kept;
    if conflict_at_enqueue {
        ensure!(
            run,
            second.as_ref().is_err_and(|e| e.kind() == ErrorKind::KeyConflict),
            "a reused key with another payload should be a KeyConflict, got {second:?}"
        );
    } else {
        run.must("enqueue of the second payload", second)?;
    }
    let worker = run.worker(2);
    run.wait_for_effects(1).await?;
    if !conflict_at_enqueue {
        run.wait_for_records(1).await?;
    }
    run.settle().await;
    worker.shutdown().await;
    let effects = run.script.effects_of(&Probe::key(6));
    ensure!(run, effects.len() == 1, "one effect expected, got {}", effects.len());
    let records = run.open_records().await?;
    if conflict_at_enqueue {
        ensure!(run, effects[0].body == original.body, "the original payload should win");
        ensure!(run, records.is_empty(), "nothing should be dead-lettered");
        return run.report(&[6], &[]).await;
    }
    ensure!(
        run,
        records.len() == 1 && records[0].last_error.contains("different payload"),
        "the second payload should end as a key-conflict record, got {records:?}"
    );
    ensure!(
        run,
        records[0].payload != serde_json::to_value(&effects[0].body).unwrap(),
        "the record holds the payload that lost"
    );
    Ok(crate::Report { done_once: vec![Probe::key(6)], ..Default::default() })
}

/// Behaviour 6: A payload that does not decode goes straight to a failure record: one attempt, no
/// handler run, one alert.
pub async fn undecodable<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("undecodable", subject);
    let job = run.must("new job", NewJob::new(crate::PROBE_KIND, Probe::key(7), json!({"id": "seven"})))?;
    run.must("enqueue", run.s.queue.enqueue(job.clone()).await)?;
    let worker = run.worker(1);
    run.wait_for_records(1).await?;
    run.settle().await;
    worker.shutdown().await;
    let records = run.open_records().await?;
    ensure!(run, records.len() == 1, "one record expected, got {}", records.len());
    let r = &records[0];
    ensure!(run, r.attempts == 1, "a decode failure should not be retried; attempts {}", r.attempts);
    ensure!(
        run,
        r.last_error.contains("decode"),
        "the error should say the payload does not decode: {:?}",
        r.last_error
    );
    ensure!(run, r.payload == job.payload, "the record should keep the undecodable payload");
    ensure!(run, run.script.starts_of(&job.key).is_empty(), "the handler should never run");
    ensure!(run, run.script.alert_count() == 1, "one alert expected, got {}", run.script.alert_count());
    run.report(&[], &[7]).await
}

/// Behaviour 7: A payload over the backend's limit is a typed error at enqueue; nothing is sent, alone or
/// in a batch.
pub async fn oversized<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("oversized", subject);
    let limit = run.caps.max_payload;
    let exact = Probe { id: 8, body: String::new() };
    let overhead = exact.new_job().payload_len();
    let big = Probe { id: 8, body: "x".repeat(limit + 1 - overhead) };
    ensure!(run, big.new_job().payload_len() == limit + 1, "test setup: payload should be one byte over");
    let err = run.s.queue.enqueue(big.new_job()).await;
    ensure!(
        run,
        err.as_ref().is_err_and(|e| e.kind() == ErrorKind::PayloadTooLarge),
        "expected PayloadTooLarge, got {err:?}"
    );
    let batch = run.s.queue.enqueue_batch(vec![Probe::new(9).new_job(), big.new_job()]).await;
    ensure!(
        run,
        batch.as_ref().is_err_and(|e| e.kind() == ErrorKind::PayloadTooLarge),
        "a batch with one oversized payload should be refused, got {batch:?}"
    );
    // Half the limit leaves room for a message backend's envelope and attributes.
    let fits = Probe { id: 10, body: "x".repeat(limit / 2) };
    run.must("enqueue under the limit", run.s.queue.enqueue(fits.new_job()).await)?;
    let claimed = run.must("claim", run.s.queue.claim(&Kinds::Any, 10, run.s.timing.lease, run.short_lease()).await)?;
    let ids: Vec<_> = claimed.iter().map(|c| c.job.key.clone()).collect();
    ensure!(run, ids == [Probe::key(10)], "only the job under the limit should be on the queue, found {ids:?}");
    for c in &claimed {
        run.must("complete", run.s.queue.complete(&c.lease, None).await)?;
    }
    Ok(crate::Report::default())
}

/// Behaviour 10: Many workers, many jobs, every key enqueued twice, some failing for good and some failing
/// once: every key ends done once or as one failure record.
pub async fn many_workers<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("many_workers", subject);
    let ids: Vec<u32> = (100..160).collect();
    let (mut succeed, mut fail) = (Vec::new(), Vec::new());
    for &id in &ids {
        match id % 6 {
            0 => {
                run.script.fault(id, Fault::Permanent);
                fail.push(id);
            }
            1 => {
                run.script.fault(id, Fault::First(1));
                succeed.push(id);
            }
            _ => succeed.push(id),
        }
    }
    let jobs: Vec<NewJob> = ids.iter().map(|&id| Probe::new(id).new_job()).collect();
    let workers: Vec<_> = (0..3).map(|_| run.worker(4)).collect();
    let (a, b) = tokio::join!(run.s.queue.enqueue_batch(jobs.clone()), run.s.queue.enqueue_batch(jobs));
    run.must("batch enqueue", a)?;
    run.must("batch enqueue", b)?;
    run.wait_for_effects(succeed.len()).await?;
    run.wait_for_records(fail.len()).await?;
    run.settle().await;
    for w in workers {
        w.shutdown().await;
    }
    run.report(&succeed, &fail).await
}

/// Behaviour 11: Discard with reason and actor (a blank one refused); records found by their error
/// text and discarded by it (`ReplayExt::discard_matching`); purge by age; the open count stays
/// right throughout.
pub async fn discard_and_purge<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("discard_and_purge", subject);
    let q = &run.s.queue;
    for id in [20, 21, 22] {
        run.script.fault(id, Fault::Permanent);
        run.must("enqueue", q.enqueue(Probe::new(id).new_job()).await)?;
    }
    let worker = run.worker(3);
    run.wait_for_records(3).await?;
    worker.shutdown().await;
    ensure!(run, run.must("count", q.count_open().await)? == 3, "three open records expected");

    let first_page = run.must("list", q.list(&FailureQuery { limit: 2, ..FailureQuery::open() }).await)?;
    let after = first_page.last().map(|r| r.id.clone());
    let second_page = run.must("list", q.list(&FailureQuery { limit: 2, after, ..FailureQuery::open() }).await)?;
    ensure!(
        run,
        first_page.len() == 2 && second_page.len() == 1,
        "paging by 2 should give 2 then 1, gave {} then {}",
        first_page.len(),
        second_page.len()
    );
    let mut keys: Vec<_> = first_page.iter().chain(&second_page).map(|r| r.key.clone()).collect();
    keys.sort();
    keys.dedup();
    ensure!(run, keys.len() == 3, "pages should not overlap");

    let target = first_page[0].id.clone();
    for (reason, actor) in [("", "ops@example.com"), (" \t\n", "ops@example.com"), ("refunded by hand", " ")] {
        let refused = q.discard(&target, reason, actor).await;
        ensure!(
            run,
            refused.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
            "a discard with reason {reason:?} by {actor:?} should be refused as InvalidInput, got {refused:?}"
        );
    }
    ensure!(run, run.must("count", q.count_open().await)? == 3, "a refused discard should leave the record open");
    run.must("discard", q.discard(&target, "refunded by hand", "ops@example.com").await)?;
    let discarded = run.must("get", q.get(&target).await)?;
    let RecordState::Discarded { reason, actor, .. } = &discarded.state else {
        return Err(run.fail(format!("the record should be discarded, is {:?}", discarded.state)));
    };
    ensure!(
        run,
        reason == "refunded by hand" && actor == "ops@example.com",
        "the discard should keep reason and actor"
    );
    ensure!(run, run.must("count", q.count_open().await)? == 2, "two open records after a discard");
    let closed = run.must("list", q.list(&FailureQuery { open: Some(false), ..FailureQuery::default() }).await)?;
    ensure!(run, closed.len() == 1 && closed[0].id == target, "the closed list should hold the discarded record");
    let replay = run.must("replay", q.replay(&target, "", "ops").await)?;
    ensure!(
        run,
        matches!(replay, ReplayOutcome::AlreadyClosed(_)),
        "a discarded record should not replay, got {replay:?}"
    );

    // Found by their error text (without case; `_` is itself, not any character), and the rest
    // discarded by it, each with the reason and actor.
    let by_error = |text: &str| FailureQuery { error_contains: Some(text.to_owned()), ..FailureQuery::default() };
    for (text, expected) in [("PERMANENT failure OF PROBE 2", 3), ("probe 2_", 0), ("of probe 21", 1)] {
        let found = run.must("list by error text", q.list(&by_error(text)).await)?;
        ensure!(
            run,
            found.len() == expected,
            "listing by the error text {text:?} should find {expected} records (\"forced permanent failure of probe \
             20\" to 22), found {}",
            found.len()
        );
    }
    let open: Vec<_> = run.open_records().await?.into_iter().map(|r| r.id).collect();
    let blank = q.discard_matching(&by_error("of probe 2"), " ", "ops@example.com").await;
    ensure!(
        run,
        blank.as_ref().is_err_and(|e| e.kind() == ErrorKind::InvalidInput),
        "a discard by filter without a reason should be refused as InvalidInput, got {blank:?}"
    );
    let batch = FailureQuery { limit: 1, ..by_error("OF PROBE 2") };
    let discarded =
        run.must("discard by filter", q.discard_matching(&batch, "superseded by 1.4.3", "ops@example.com").await)?;
    ensure!(
        run,
        discarded == open,
        "a discard by filter should close the open records it matches, all pages, in order: {open:?}; closed \
         {discarded:?}"
    );
    for id in &discarded {
        let state = run.must("get", q.get(id).await)?.state;
        ensure!(
            run,
            matches!(&state, RecordState::Discarded { reason, actor, .. }
                if reason == "superseded by 1.4.3" && actor == "ops@example.com"),
            "record {id} should be discarded with the reason and actor, is {state:?}"
        );
    }
    ensure!(run, run.must("count", q.count_open().await)? == 0, "no open records after the discard by filter");

    let kept = run.must("purge", q.purge(Duration::from_secs(3600)).await)?;
    ensure!(run, kept == 0, "a purge by an hour should delete nothing yet, deleted {kept}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let purged = run.must("purge", q.purge(Duration::ZERO).await)?;
    ensure!(run, purged == 3, "a purge of everything older than now should delete all 3, deleted {purged}");
    ensure!(run, run.must("count", q.count_open().await)? == 0, "no open records after the purge");
    let gone = q.get(&target).await;
    ensure!(
        run,
        gone.as_ref().is_err_and(|e| e.kind() == ErrorKind::NotFound),
        "a purged record should be NotFound, got {gone:?}"
    );
    Ok(crate::Report::default())
}
