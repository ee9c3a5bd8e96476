//! What the suite does not reach: the endpoint's signature checks (a wrong key, a changed body, a
//! stale time, no header: refused, nothing run), a replay of a record whose event id is still
//! inside Inngest's 24 hours (it runs, once), and a run Inngest failed on its own reaching the
//! store through the failure handler.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redrive_core::kit::Envelope;
use redrive_core::{
    DeadLetter, Enqueue, FailureQuery, Job, JobContext, JobError, KeyBuilder, NewJob, QueueStats, RecordState, Replay,
    ReplayOutcome, Worker,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Serialize, Deserialize)]
struct Charge {
    order: u32,
}

impl Job for Charge {
    const KIND: &'static str = "charge";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

/// Inngest's signature, written out here so that the test does not trust the crate's own: keyed
/// with the key's text after `signkey-<env>-`, over the body and then the time.
fn sign(key: &str, body: &[u8], t: i64) -> String {
    use hmac::{KeyInit, Mac};
    let key = key.splitn(3, '-').nth(2).expect("signkey-<env>-<hex>");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(body);
    mac.update(t.to_string().as_bytes());
    format!("t={t}&s={}", hex::encode(mac.finalize().into_bytes()))
}

/// A call of the queue's function for `job`, as Inngest makes it.
fn call_body(job: &NewJob) -> String {
    let event = json!({ "name": "redrive/jobs", "id": "evt-forged", "data": serde_json::from_str::<Value>(&Envelope::new(job).encode()).unwrap(),
                        "ts": 1, "user": {} });
    json!({ "event": event, "events": [event], "steps": {}, "use_api": false, "version": 1,
            "ctx": { "run_id": "run-forged", "attempt": 0, "max_attempts": 5, "disable_immediate_execution": false,
                     "use_api": false, "stack": { "stack": [], "current": 0 } } })
    .to_string()
}

fn counting_worker(rig: &common::Rig, runs: &Arc<AtomicU32>) -> redrive_core::RunningWorker {
    let runs = Arc::clone(runs);
    Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<Charge>(move |_job: Charge, _ctx: JobContext| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start()
}

#[tokio::test]
async fn a_call_not_signed_with_the_key_is_refused_and_nothing_runs() {
    let rig = common::rig().await;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = counting_worker(&rig, &runs);
    let body = call_body(&NewJob::from_job(&Charge { order: 1 }).unwrap());
    let url = format!("{}?fnId={}&stepId=step", rig.serve_url, function_id(&rig));
    let now = chrono::Utc::now().timestamp();
    let key = rig.emulator.signing_key().to_owned();
    let cases: [(&str, Option<String>, String); 5] = [
        ("another key", Some(sign("signkey-test-00112233", body.as_bytes(), now)), body.clone()),
        ("a changed body", Some(sign(&key, body.as_bytes(), now)), body.replace("\"order\":1", "\"order\":2")),
        ("a stale time", Some(sign(&key, body.as_bytes(), now - 600)), body.clone()),
        ("no header", None, body.clone()),
        ("a malformed header", Some("t=1&s=zz".into()), body.clone()),
    ];
    let http = reqwest::Client::new();
    for (case, signature, sent) in cases {
        let mut request = http.post(&url).header("content-type", "application/json").body(sent);
        if let Some(signature) = signature {
            request = request.header("x-inngest-signature", signature);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "{case}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let counts = rig.backend.counts().await.unwrap();
    assert_eq!((counts.queued, counts.running, runs.load(Ordering::SeqCst)), (0, 0, 0), "nothing parked, nothing run");

    // The same call signed with the key runs, and its answer is signed as an SDK's.
    let signed = http
        .post(&url)
        .header("content-type", "application/json")
        .header("x-inngest-signature", sign(&key, body.as_bytes(), now))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), 200);
    assert!(signed.headers().contains_key("x-inngest-sdk"));
    let answer_signature = signed.headers()["x-inngest-signature"].to_str().unwrap().to_owned();
    let answer = signed.bytes().await.unwrap();
    let t: i64 = answer_signature.split('&').next().unwrap().trim_start_matches("t=").parse().unwrap();
    assert_eq!(answer_signature, sign(&key, &answer, t), "the answer is signed over the bytes sent");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    worker.shutdown().await;
}

fn function_id(rig: &common::Rig) -> String {
    rig.emulator.functions().into_iter().map(|f| f.id).find(|id| !id.ends_with("-failure")).expect("registered")
}

#[tokio::test]
async fn a_replay_inside_the_events_24_hours_runs_once() {
    let rig = common::rig().await;
    let fail = Arc::new(AtomicU32::new(1));
    let runs = Arc::new(AtomicU32::new(0));
    let (failing, counted) = (Arc::clone(&fail), Arc::clone(&runs));
    let worker = Worker::builder(rig.backend.clone(), rig.ledger.clone())
        .handle::<Charge>(move |_job: Charge, _ctx: JobContext| {
            let (failing, counted) = (Arc::clone(&failing), Arc::clone(&counted));
            async move {
                if failing.load(Ordering::SeqCst) == 1 {
                    return Err(JobError::permanent("the card was declined"));
                }
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
        .build()
        .start();
    let job = NewJob::from_job(&Charge { order: 7 }).unwrap();
    rig.backend.enqueue(job.clone()).await.unwrap();
    let record = wait_for(|| async { rig.backend.list(&FailureQuery::open()).await.unwrap().into_iter().next() }).await;
    assert_eq!(record.key, job.key);
    // The job's own event id is inside Inngest's window: enqueued again, it is dropped.
    rig.backend.enqueue(job.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let function = function_id(&rig);
    let job_runs = || rig.emulator.runs().into_iter().filter(|r| r.function_id == function).count();
    assert_eq!(job_runs(), 1, "the same event id started no second run");

    fail.store(0, Ordering::SeqCst);
    rig.backend.replay(&record.id, "the card was updated", "ops").await.unwrap();
    let closed = wait_for(|| async {
        let record = rig.backend.get(&record.id).await.unwrap();
        matches!(record.state, RecordState::Confirmed { .. }).then_some(record)
    })
    .await;
    assert!(matches!(closed.state, RecordState::Confirmed { .. }));
    // Again: the record is closed, and the replay's own id would be dropped anyway.
    let again = rig.backend.replay(&record.id, "again", "ops").await.unwrap();
    assert!(matches!(again, ReplayOutcome::AlreadyClosed(_)), "a closed record replays no more: {again:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the replay ran once");
    assert_eq!(job_runs(), 2, "one run for the job, one for its replay");
    worker.shutdown().await;
}

#[tokio::test]
async fn a_run_inngest_failed_on_its_own_becomes_a_record_through_the_failure_handler() {
    let rig = common::rig().await;
    let job = NewJob::from_job(&Charge { order: 9 }).unwrap();
    let function = function_id(&rig);
    let event = json!({ "name": "redrive/jobs", "id": "evt-9", "data": serde_json::from_str::<Value>(&Envelope::new(&job).encode()).unwrap() });
    let failed = |function: &str, run: &str| {
        json!({ "name": "inngest/function.failed", "id": format!("failed-{run}"),
                "data": { "function_id": function, "run_id": run, "event": event, "events": [event],
                          "error": { "name": "Error", "message": "the call timed out" } } })
    };
    // Another app's failed run is not this queue's.
    rig.emulator.send(vec![failed("another-app-jobs", "run-other"), failed(&function, "run-9")]);
    let record = wait_for(|| async { rig.backend.list(&FailureQuery::open()).await.unwrap().into_iter().next() }).await;
    assert_eq!(record.id.0, "run-9");
    assert_eq!((record.key.clone(), record.kind.as_str()), (job.key.clone(), "charge"));
    assert_eq!(record.payload, job.payload);
    assert!(record.last_error.contains("the call timed out"), "{}", record.last_error);
    // Sent again (Inngest delivers at least once), it is kept once.
    rig.emulator.send(vec![failed(&function, "run-9")]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rig.backend.list(&FailureQuery::open()).await.unwrap().len(), 1);
}

async fn wait_for<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = f().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Serialize, Deserialize)]
struct Refund {
    order: u32,
}

impl Job for Refund {
    const KIND: &'static str = "refund";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("order", self.order)
    }
}

/// A kind no worker of the process handles goes back unclaimed, at no attempt's cost, and past
/// its rounds becomes a record instead of circling for ever; the worker never runs it.
#[tokio::test]
async fn a_kind_nothing_here_handles_becomes_a_record_after_its_rounds() {
    let rig = common::rig_with(common::emulator(), |c| {
        c.with_unclaimed_rounds(2).with_park_limit(Duration::from_millis(200))
    })
    .await;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = counting_worker(&rig, &runs);
    let job = NewJob::from_job(&Refund { order: 4 }).unwrap();
    rig.backend.enqueue(job.clone()).await.unwrap();
    let record = wait_for(|| async { rig.backend.list(&FailureQuery::open()).await.unwrap().into_iter().next() }).await;
    assert_eq!((record.key.clone(), record.kind.as_str()), (job.key.clone(), "refund"));
    assert!(record.last_error.contains("no worker in this process handles kind refund"), "{}", record.last_error);
    assert_eq!(record.attempts, 1, "handed back unclaimed, no attempt was spent: {record:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    worker.shutdown().await;
}

/// The counterpart: a worker that starts while its kind is paused claims none of its calls, and
/// they go back round after round, but none counts towards "handled nowhere": no record, and
/// once resumed the job runs, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_paused_before_its_worker_starts_is_no_kind_nothing_handles() {
    use redrive_core::Flow;
    use redrive_core::kit::Ledger;
    let rig = common::rig_with(common::emulator(), |c| {
        c.with_unclaimed_rounds(2).with_park_limit(Duration::from_millis(200))
    })
    .await;
    let flow = rig.ledger.flow().expect("PostgreSQL keeps a flow store");
    assert!(flow.pause(Charge::KIND, "the card network is down", "ana", None).await.unwrap());
    let runs = Arc::new(AtomicU32::new(0));
    let worker = counting_worker(&rig, &runs);
    rig.backend.enqueue(NewJob::from_job(&Charge { order: 5 }).unwrap()).await.unwrap();
    // Past twice the rounds: a call of a kind nothing handled would be a record by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let records = rig.backend.list(&FailureQuery::open()).await.unwrap();
    assert!(records.is_empty(), "a pause makes no record: {records:#?}");
    let calls = rig.emulator.calls().len();
    assert!(calls >= 5, "the call went back round after round: {calls} calls");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran while paused");
    assert!(flow.resume(Charge::KIND, "bo").await.unwrap());
    wait_for(|| async { (runs.load(Ordering::SeqCst) == 1).then_some(()) }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(rig.backend.list(&FailureQuery::open()).await.unwrap().is_empty());
}
