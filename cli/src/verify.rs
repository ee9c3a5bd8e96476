//! `redrive verify`: the seed's four tests (replay, race, exhaust, recover) run against the
//! backend the command names, with a job kind of its own, leaving dated evidence
//! (`evidence.rs`).
//!
//! Safe beside the application's workers on the same queue: its jobs are of the kind
//! [`KIND`], which no application handles, so an application worker that receives one puts it
//! back at no attempt's cost (`Deferral::NotHandledHere`), and its own workers handle that kind
//! alone, putting back, the same way, any application job they receive. Its keys carry the run's
//! id, so they cannot collide with the application's or an earlier run's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive::alert::BoxFuture;
use redrive::kit::{Begin, Claim, Dedupe, Ledger};
use redrive::{
    Alert, AlertSink, Backoff, DeadLetter, Enqueue, Enqueued, Error, ErrorKind, FailureQuery, FailureRecord, Forget,
    IdempotencyKey, Job, JobContext, JobError, JobQuery, Jobs, KeyBuilder, MemoryBackend, NewJob, RecordState, Replay,
    Result, RunningWorker, Worker,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::evidence::Test;

/// What the tests need of the queue: enqueue, claim, records, replay and (where it has them)
/// its jobs listed.
pub(crate) trait Queue: Claim + DeadLetter + Replay + Enqueue + Jobs + Clone + 'static {}
impl<T: Claim + DeadLetter + Replay + Enqueue + Jobs + Clone + 'static> Queue for T {}

/// What they need of the effect ledger.
pub(crate) trait Store: Ledger + Clone + 'static {}
impl<T: Ledger + Clone + 'static> Store for T {}

/// The job kind of verification jobs.
pub(crate) const KIND: &str = "redrive_verify";

/// Who the replay of the recover test is recorded as.
const ACTOR: &str = "redrive verify";

/// One verification job: its key is the run and the test, nothing else.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Probe {
    run: String,
    test: String,
}

impl Job for Probe {
    const KIND: &'static str = KIND;

    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("run", &self.run).fact("test", &self.test)
    }
}

/// What the verification's handler did, seen from outside: each effect, and whether the exhaust
/// test's job fails.
#[derive(Default)]
struct Lab {
    effects: Mutex<Vec<Effect>>,
    failing: AtomicBool,
    alerts: Mutex<Vec<Alert>>,
}

#[derive(Debug, Clone, Serialize)]
struct Effect {
    key: String,
    worker: String,
    attempt: u32,
    at: DateTime<Utc>,
}

impl Lab {
    fn effects_of(&self, key: &IdempotencyKey) -> Vec<Effect> {
        self.effects.lock().unwrap().iter().filter(|e| e.key == key.as_str()).cloned().collect()
    }

    fn alert_of(&self, key: &IdempotencyKey) -> Option<Alert> {
        self.alerts.lock().unwrap().iter().find(|a| &a.record.key == key).cloned()
    }
}

struct Collect(Arc<Lab>);

impl AlertSink for Collect {
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, Result<()>> {
        self.0.alerts.lock().unwrap().push(alert.clone());
        Box::pin(async { Ok(()) })
    }
}

/// The backend under test: its queue, its effect ledger, and whether the queue is its own
/// ledger (PostgreSQL, SQLite: a job's row holds its key's state).
pub(crate) struct Subject<Q, L> {
    pub(crate) queue: Q,
    pub(crate) ledger: L,
    pub(crate) own_ledger: bool,
    /// What the service keeps of a key outside the ledger's store, forgotten first (QStash's DLQ
    /// entries: a later drain would make their records again); how many entries it deleted.
    pub(crate) forget_first: Option<ForgetFirst>,
}

/// Deletes what a service keeps of a key beside its records store; the number of entries.
pub(crate) type ForgetFirst = Box<dyn Fn(IdempotencyKey) -> BoxFuture<'static, Result<u64>> + Send + Sync>;

impl<B: Clone> Subject<B, B> {
    /// A backend whose queue is its own ledger (PostgreSQL, SQLite).
    pub(crate) fn own(backend: B) -> Self {
        Self { queue: backend.clone(), ledger: backend, own_ledger: true, forget_first: None }
    }
}

impl<Q, L> Subject<Q, L> {
    /// A broker, with the database of its records and ledger.
    #[cfg(any(feature = "sqs", feature = "azure", feature = "qstash", feature = "pgmq", feature = "inngest"))]
    pub(crate) fn broker(queue: Q, records: L) -> Self {
        Self { queue, ledger: records, own_ledger: false, forget_first: None }
    }
}

/// The run's settings.
pub(crate) struct Plan {
    pub(crate) run: String,
    pub(crate) timeout: Duration,
}

/// Runs the four tests in order, then forgets every key they made; each test's evidence, passed
/// or not, and what was forgotten. A test that cannot be set up (a refused enqueue, an
/// unreachable service) ends the run with the error, after the clean-up.
pub(crate) async fn four_tests<Q: Queue, L: Store + Forget>(
    subject: &Subject<Q, L>,
    plan: &Plan,
) -> Result<(Vec<Test>, Vec<Value>)> {
    let lab = Arc::new(Lab::default());
    let mut tests = Vec::new();
    let ran = async {
        tests.push(replay(subject, plan, &lab).await?);
        tests.push(race(subject, plan, &lab).await?);
        let (exhaust, record) = exhaust(subject, plan, &lab).await?;
        tests.push(exhaust);
        tests.push(recover(subject, plan, &lab, record.as_ref()).await?);
        Ok::<_, Error>(())
    }
    .await;
    let cleaned = clean_up(&subject.ledger, subject.forget_first.as_ref(), plan).await;
    ran?;
    Ok((tests, cleaned?))
}

/// Forgets the keys of every test (jobs, records with their alert marks, ledger entries), in the
/// store that keeps them: the backend's own, or a broker's records database.
async fn clean_up<F: Forget>(store: &F, first: Option<&ForgetFirst>, plan: &Plan) -> Result<Vec<Value>> {
    let mut forgotten = Vec::new();
    for test in TESTS {
        let key = NewJob::from_job(&Probe { run: plan.run.clone(), test: test.to_owned() })?.key;
        let entries = match first {
            Some(forget) => Some(forget(key.clone()).await?),
            None => None,
        };
        // A job still running (a test that timed out) settles within its lease: look again.
        let mut tries = 0;
        let gone = loop {
            match store.forget_key(&key).await {
                Err(e) if e.is_temporary() && tries < 20 => tries += 1,
                other => break other?,
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let mut entry = json!({ "key": key.as_str(), "forgotten": gone });
        if let Some(entries) = entries {
            entry["service_entries"] = entries.into();
        }
        forgotten.push(entry);
    }
    Ok(forgotten)
}

/// The tests that make a key of their own (recover replays the exhaust test's).
const TESTS: [&str; 3] = ["replay", "race", "exhaust"];

fn probe(plan: &Plan, test: &str) -> Result<(Probe, NewJob)> {
    let probe = Probe { run: plan.run.clone(), test: test.to_owned() };
    let job = NewJob::from_job(&probe)?;
    Ok((probe, job))
}

/// A verification worker on `queue` with `ledger`: quick backoff and a short lease, so that the
/// run takes seconds; its handler records each effect in `lab`.
fn worker<Q, L>(queue: Q, ledger: L, lab: &Arc<Lab>, name: &str) -> RunningWorker
where
    Q: Claim + DeadLetter + 'static,
    L: Ledger + 'static,
{
    let (handler_lab, name) = (Arc::clone(lab), name.to_owned());
    Worker::builder(queue, ledger)
        .handle::<Probe>(move |job: Probe, ctx: JobContext| {
            let (lab, name) = (Arc::clone(&handler_lab), name.clone());
            async move {
                if job.test == "exhaust" && lab.failing.load(Ordering::SeqCst) {
                    return Err(JobError::retry("failing on purpose (redrive verify's exhaust test)"));
                }
                // Long enough that a racing delivery meets the key held.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let at = Utc::now();
                let key = ctx.key.to_string();
                lab.effects.lock().unwrap().push(Effect { key, worker: name.clone(), attempt: ctx.attempt, at });
                Ok::<_, JobError>(json!({ "verified_by": name, "at": at }))
            }
        })
        .lease(Duration::from_secs(10))
        .poll(Duration::from_millis(250))
        .backoff(Backoff { base: Duration::from_millis(50), max: Duration::from_millis(500), ..Backoff::default() })
        .alert(Collect(Arc::clone(lab)))
        .build()
        .start()
}

/// Waits until `done` holds, for at most `timeout`.
async fn until(timeout: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if done().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long a test keeps watching after its expected state, to catch a late duplicate.
const SETTLE: Duration = Duration::from_secs(1);

/// Test 1, replay: the same job enqueued twice has one key and causes one effect.
async fn replay<Q: Queue, L: Store>(subject: &Subject<Q, L>, plan: &Plan, lab: &Arc<Lab>) -> Result<Test> {
    let mut test = Test::start("replay", "the same job enqueued twice has one key and causes one effect");
    let (_, job) = probe(plan, "replay")?;
    let key = job.key.clone();
    let mut sent = 0;
    for n in 1..=2 {
        let answer = subject.queue.enqueue(probe(plan, "replay")?.1).await?;
        sent += usize::from(matches!(answer, Enqueued::Created(_)));
        test.item(format!("enqueue #{n}"), json!({ "key": key.as_str(), "answer": enqueued(&answer) }));
    }
    // A service that drops a copy without saying so (Inngest's event id) answers both as taken,
    // and delivers one.
    if let Dedupe::Unreported(window) = subject.queue.capabilities().dedupe {
        sent = sent.min(1);
        let window = humantime::format_duration(window).to_string();
        test.item("dedupe", json!({ "by": "the service, unreported", "window": window, "deliveries": sent }));
    }
    let worker = worker(subject.queue.clone(), subject.ledger.clone(), lab, "worker-1");
    // Each message the queue took is delivered: one runs, any other finds the effect done.
    let handled = until(plan.timeout, async || {
        let stats = worker.stats();
        !lab.effects_of(&key).is_empty() && (stats.succeeded + stats.skipped) as usize >= sent
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    let stats = worker.shutdown().await;
    let effects = lab.effects_of(&key);
    test.item("effects", json!({ "count": effects.len(), "entries": effects }));
    test.item("worker", json!({ "succeeded": stats.succeeded, "skipped": stats.skipped }));
    if !handled {
        return Ok(test.fail(format!("the job was not handled within {:?}", plan.timeout)));
    }
    if effects.len() != 1 {
        return Ok(test.fail(format!("{} effects for one key, expected 1", effects.len())));
    }
    rows_and_ledger(subject, &mut test, &job).await?;
    Ok(test.finish())
}

/// The key's job rows where the backend lists its jobs, and its ledger entry: exactly one each.
async fn rows_and_ledger<Q, L>(subject: &Subject<Q, L>, test: &mut Test, job: &NewJob) -> Result<()>
where
    Q: Jobs,
    L: Ledger,
{
    let key = &job.key;
    match subject.queue.list_jobs(&JobQuery { key: Some(key.clone()), ..JobQuery::default() }).await {
        Ok(rows) => {
            let shown: Vec<Value> = rows
                .iter()
                .map(|j| json!({ "job": j.id.0, "state": j.state.to_string(), "attempts": j.attempts }))
                .collect();
            test.item("job rows", json!({ "count": rows.len(), "rows": shown }));
            if rows.len() != 1 {
                test.failure = Some(format!("{} job rows for one key, expected 1", rows.len()));
            }
        }
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            test.item("job rows", json!({ "listed": false, "why": "a broker's messages cannot be listed" }));
        }
        Err(e) => return Err(e),
    }
    if subject.own_ledger {
        // The job's row is the key's ledger entry: shown above.
        test.item("ledger entry", json!({ "in": "the job's row (the queue is its own ledger)" }));
        return Ok(());
    }
    ledger_entry(&subject.ledger, test, job).await
}

/// The key's ledger entry, done with its result. Asked only of a key whose effect is done (a
/// `begin` of a fresh key would take it), with the job's payload (another would conflict).
async fn ledger_entry<L: Ledger>(ledger: &L, test: &mut Test, job: &NewJob) -> Result<()> {
    let key = job.key.as_str();
    match ledger.begin(&job.key, &job.payload, job.provider_key, Duration::from_secs(1)).await? {
        Begin::Done(result) => {
            test.item("ledger entry", json!({ "key": key, "state": "done", "result": result }));
        }
        other => {
            test.item("ledger entry", json!({ "key": key, "state": format!("{other:?}") }));
            test.failure = Some("the key's ledger entry is not done".into());
        }
    }
    Ok(())
}

/// Test 2, race: two workers handed the same job at once: one effect, one recorded skip. Each worker
/// takes its copy from an inbox of its own (two deliveries of one message), and both ask the
/// backend's effect ledger, whose unique key lets one run.
async fn race<Q: Queue, L: Store>(subject: &Subject<Q, L>, plan: &Plan, lab: &Arc<Lab>) -> Result<Test> {
    let mut test = Test::start("race", "two workers handed the same job at once: one effect, one recorded skip");
    let (_, job) = probe(plan, "race")?;
    let key = job.key.clone();
    let (inbox_a, inbox_b) = (MemoryBackend::new(), MemoryBackend::new());
    inbox_a.enqueue(job.clone()).await?;
    inbox_b.enqueue(job.clone()).await?;
    test.item("deliveries", json!({ "key": key.as_str(), "workers": 2 }));
    let a = worker(inbox_a, subject.ledger.clone(), lab, "worker-a");
    let b = worker(inbox_b, subject.ledger.clone(), lab, "worker-b");
    let settled = until(plan.timeout, async || {
        let (a, b) = (a.stats(), b.stats());
        a.succeeded + b.succeeded + a.skipped + b.skipped >= 2
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    let (a, b) = (a.shutdown().await, b.shutdown().await);
    let effects = lab.effects_of(&key);
    test.item("effects", json!({ "count": effects.len(), "entries": effects }));
    let skips: Vec<Value> = [("worker-a", &a), ("worker-b", &b)]
        .iter()
        .filter(|(_, s)| s.skipped > 0)
        .map(|(name, s)| json!({ "worker": name, "skipped": s.skipped, "deferred_while_held": s.deferred }))
        .collect();
    test.item("recorded skip", json!({ "count": a.skipped + b.skipped, "by": skips }));
    if !settled {
        return Ok(test.fail(format!("both deliveries were not settled within {:?}", plan.timeout)));
    }
    if effects.len() != 1 || a.skipped + b.skipped != 1 {
        return Ok(test.fail(format!(
            "{} effects and {} skips, expected one of each",
            effects.len(),
            a.skipped + b.skipped
        )));
    }
    ledger_entry(&subject.ledger, &mut test, &job).await?;
    Ok(test.finish())
}

/// Test 3, exhaust: a job that keeps failing uses every attempt, leaves a full failure record, and
/// raises one alert. Returns the record for the recover test.
async fn exhaust<Q: Queue, L: Store>(
    subject: &Subject<Q, L>,
    plan: &Plan,
    lab: &Arc<Lab>,
) -> Result<(Test, Option<FailureRecord>)> {
    let mut test =
        Test::start("exhaust", "a job that keeps failing uses every attempt, leaves a full record and one alert");
    let (probe, job) = probe(plan, "exhaust")?;
    let (key, cap) = (job.key.clone(), job.cap);
    lab.failing.store(true, Ordering::SeqCst);
    subject.queue.enqueue(job).await?;
    test.item("enqueue", json!({ "key": key.as_str(), "cap": cap, "payload": probe }));
    let worker = worker(subject.queue.clone(), subject.ledger.clone(), lab, "worker-1");
    let alerted = until(plan.timeout, async || lab.alert_of(&key).is_some()).await;
    tokio::time::sleep(SETTLE).await;
    let stats = worker.shutdown().await;
    test.item("worker", json!({ "retried": stats.retried, "dead_lettered": stats.dead_lettered }));
    let record = record_of(&subject.queue, &key, plan.timeout).await?;
    let Some(record) = record else {
        return Ok((test.fail("no failure record of the key".to_owned()), None));
    };
    test.item(
        "failure record",
        json!({
            "id": record.id.0, "kind": record.kind, "key": record.key.as_str(), "payload": record.payload,
            "last_error": record.last_error, "attempts": record.attempts, "cap": record.cap,
            "errors": record.errors.len(), "first_failed_at": record.first_failed_at,
            "last_failed_at": record.last_failed_at,
        }),
    );
    let alerts: Vec<Value> = lab
        .alerts
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.record.key == key)
        .map(|a| json!({ "record": a.record.id.0, "raised_at": a.raised_at, "reminder": a.reminder }))
        .collect();
    test.item("alert", json!({ "count": alerts.len(), "alerts": alerts }));
    let failure = if !alerted || alerts.len() != 1 {
        Some(format!("{} alerts for the record, expected 1", alerts.len()))
    } else if record.attempts != cap {
        Some(format!("the record shows {} attempts of {cap}", record.attempts))
    } else if record.payload != serde_json::to_value(&probe).unwrap_or_default() {
        Some("the record does not hold the job's payload".into())
    } else {
        None
    };
    let test = match failure {
        Some(why) => test.fail(why),
        None => test.finish(),
    };
    Ok((test, Some(record)))
}

/// The open record of `key`, waited for (a service may write it after the last attempt).
async fn record_of<Q: DeadLetter>(queue: &Q, key: &IdempotencyKey, timeout: Duration) -> Result<Option<FailureRecord>> {
    let query = FailureQuery { kind: Some(KIND.to_owned()), ..FailureQuery::open() };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(record) = queue.list(&query).await?.into_iter().find(|r| &r.key == key) {
            return Ok(Some(record));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Test 4, recover: a replay from the record causes the effect once and closes the record.
async fn recover<Q: Queue, L: Store>(
    subject: &Subject<Q, L>,
    plan: &Plan,
    lab: &Arc<Lab>,
    record: Option<&FailureRecord>,
) -> Result<Test> {
    let mut test = Test::start("recover", "a replay from the record causes the effect once and closes the record");
    let Some(record) = record else {
        return Ok(test.fail("no record to replay: the exhaust test failed".to_owned()));
    };
    lab.failing.store(false, Ordering::SeqCst);
    let outcome = subject.queue.replay(&record.id, "verification: the cause is fixed", ACTOR).await?;
    let answer = match &outcome {
        redrive::ReplayOutcome::Replayed(job) => json!({ "replayed_as_job": job.0 }),
        redrive::ReplayOutcome::AlreadyClosed(state) => json!({ "already_closed": state }),
    };
    test.item("replay", json!({ "record": record.id.0, "by": ACTOR, "answer": answer }));
    let worker = worker(subject.queue.clone(), subject.ledger.clone(), lab, "worker-1");
    let key = record.key.clone();
    let closed = until(plan.timeout, async || {
        !lab.effects_of(&key).is_empty()
            && subject
                .queue
                .get(&record.id)
                .await
                .is_ok_and(|r| !matches!(r.state, RecordState::Open | RecordState::Replaying { .. }))
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    worker.shutdown().await;
    let effects = lab.effects_of(&key);
    let state = subject.queue.get(&record.id).await?.state;
    test.item("effects", json!({ "count": effects.len(), "entries": effects }));
    test.item("record", json!({ "id": record.id.0, "state": state.name(), "closed": state }));
    if !closed {
        return Ok(test.fail(format!("the record reads {} after {:?}", state.name(), plan.timeout)));
    }
    if effects.len() != 1 || !matches!(state, RecordState::Confirmed { .. }) {
        return Ok(test.fail(format!(
            "{} effects, the record {}: expected one, confirmed",
            effects.len(),
            state.name()
        )));
    }
    Ok(test.finish())
}

fn enqueued(answer: &Enqueued) -> Value {
    match answer {
        Enqueued::Created(id) => json!({ "created": id.0 }),
        Enqueued::Duplicate { id, .. } => json!({ "duplicate_of": id.0 }),
        other => json!(format!("{other:?}")),
    }
}

/// `redrive verify`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct VerifyArgs {
    /// Where the evidence goes: a JSON and a Markdown file per run, named by its time.
    #[arg(long, value_name = "DIR", default_value = "redrive-evidence")]
    evidence: std::path::PathBuf,
    /// An application job kind's key format, `KIND=FORMAT` (repeat it): kept in the evidence's
    /// fingerprint, so that `--check-fresh` fails once it changes. FORMAT is what your code says
    /// it is: the key's fact names (`send_receipt=order`) or a version of your own.
    #[arg(long = "key-format", value_name = "KIND=FORMAT")]
    key_formats: Vec<String>,
    /// Runs nothing: fails unless the newest evidence in DIR passed, is younger than
    /// `--max-age`, and holds for this backend, its configuration and the key formats given.
    #[arg(long, value_name = "DIR")]
    check_fresh: Option<std::path::PathBuf>,
    /// The oldest evidence `--check-fresh` accepts.
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    max_age: Duration,
    /// QStash and Inngest only: the address verify's own endpoint listens on, where the URL's host
    /// and path lead (the service pushes verify's jobs there; the application's endpoint never
    /// sees them).
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// How long each test may take to reach its expected state.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

impl VerifyArgs {
    /// `--listen`, which verify on a push service needs: it serves its own endpoint there.
    #[cfg(any(feature = "qstash", feature = "inngest"))]
    fn listen_for(&self, service: &str) -> Result<std::net::SocketAddr> {
        self.listen.ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!(
                    "redrive verify on {service} serves its own endpoint: give --listen ADDR, the address the \
                     URL's host and path lead to (an endpoint no application serves)"
                ),
            )
        })
    }
}

/// Runs the four tests on `target` (or checks the evidence, with `--check-fresh`).
pub(crate) async fn run(
    url: &str,
    target: &redrive::any::AnyBackend,
    out: &crate::output::Output,
    args: &VerifyArgs,
) -> Result<crate::Done> {
    use redrive::any::AnyBackend;
    use redrive::kit::Backend;

    #[cfg_attr(not(feature = "inngest"), allow(unused_mut))]
    let mut configuration: std::collections::BTreeMap<String, String> = [
        ("scheme".to_owned(), target.scheme().to_owned()),
        ("capabilities".to_owned(), format!("{:?}", target.capabilities())),
    ]
    .into();
    // The app is in the URL's query, which the evidence leaves out.
    #[cfg(feature = "inngest")]
    if let AnyBackend::Inngest(q, _) = target {
        configuration.insert("app".to_owned(), q.config().app_id().to_owned());
    }
    let identity = crate::evidence::Identity {
        backend: crate::evidence::redact(url),
        configuration,
        key_encoding: crate::evidence::KEY_ENCODING,
        key_formats: crate::evidence::key_formats(&args.key_formats)?,
    };
    if let Some(dir) = &args.check_fresh {
        let newest = crate::evidence::newest(dir)?;
        let stale = crate::evidence::stale(newest.as_ref(), &identity, args.max_age);
        out.freshness(newest.as_ref(), &stale);
        if stale.is_empty() {
            return Ok(crate::Done::Done);
        }
        return Err(Error::new(ErrorKind::Config, format!("the evidence does not hold: {}", stale.join("; "))));
    }
    let started_at = Utc::now();
    let plan =
        Plan { run: format!("{}-{}", started_at.format("%Y%m%dT%H%M%S"), std::process::id()), timeout: args.timeout };
    let (tests, cleaned_up) = match target {
        #[cfg(feature = "postgres")]
        AnyBackend::Postgres(b) => four_tests(&Subject::own(b.clone()), &plan).await?,
        #[cfg(feature = "sqlite")]
        AnyBackend::Sqlite(b) => four_tests(&Subject::own(b.clone()), &plan).await?,
        #[cfg(feature = "sqs")]
        AnyBackend::Sqs(q, records) => four_tests(&Subject::broker(q.clone(), records.clone()), &plan).await?,
        #[cfg(feature = "azure")]
        AnyBackend::Azure(q, records) => four_tests(&Subject::broker(q.clone(), records.clone()), &plan).await?,
        #[cfg(feature = "qstash")]
        AnyBackend::QStash(q, records) => {
            // QStash pushes each message to its destination: verify serves a receiver of its own
            // there, at a URL no application receiver answers (checked), so the application's
            // workers never see its jobs, nor its DLQ entries theirs (records are per destination).
            let listen = args.listen_for("QStash")?;
            let _receiver = crate::verify_push::serve(url, "QStash", q.receiver(), listen).await?;
            let mut subject = Subject::broker(q.clone(), records.clone());
            let dlq = q.clone();
            subject.forget_first = Some(Box::new(move |key| {
                let dlq = dlq.clone();
                Box::pin(async move { dlq.forget_dlq_entries(&key).await })
            }));
            four_tests(&subject, &plan).await?
        }
        #[cfg(feature = "pgmq")]
        AnyBackend::Pgmq(q, records) => {
            // A dead letter's message stays in the queue's archive: forgotten first.
            let mut subject = Subject::broker(q.clone(), records.clone());
            let archive = q.clone();
            subject.forget_first = Some(Box::new(move |key| {
                let archive = archive.clone();
                Box::pin(async move { archive.forget_archived(&key).await })
            }));
            four_tests(&subject, &plan).await?
        }
        #[cfg(feature = "inngest")]
        AnyBackend::Inngest(q, records) => {
            // Inngest calls an app's one endpoint, and a sync replaces the app's functions: verify
            // runs as an app of its own, `<app>-verify`, served at the URL (which no application
            // endpoint may answer, checked), so the application's registration, calls and records
            // are untouched, and its events trigger no application function.
            let listen = args.listen_for("Inngest")?;
            let config = q.config().clone();
            let app = format!("{}-verify", config.app_id());
            let verifier =
                redrive::inngest::InngestBackend::connect(config.with_app_id(app), Arc::new(records.clone())).await?;
            let _endpoint = crate::verify_push::serve(url, "Inngest", verifier.endpoint(), listen).await?;
            verifier.sync().await?;
            four_tests(&Subject::broker(verifier, records.clone()), &plan).await?
        }
        // A backend added to the facade after this command.
        other => {
            let scheme = other.scheme();
            return Err(Error::new(ErrorKind::Unsupported, format!("redrive verify does not run on {scheme} yet")));
        }
    };
    let evidence = crate::evidence::Evidence {
        run: plan.run.clone(),
        started_at,
        finished_at: Utc::now(),
        redrive_version: env!("CARGO_PKG_VERSION").to_owned(),
        fingerprint: identity.fingerprint(),
        identity,
        passed: tests.iter().all(|t| t.passed),
        tests,
        cleaned_up,
    };
    let written = evidence.write(&args.evidence)?;
    out.verified(&evidence, &written);
    if evidence.passed {
        Ok(crate::Done::Done)
    } else {
        let failed: Vec<&str> = evidence.tests.iter().filter(|t| !t.passed).map(|t| t.name.as_str()).collect();
        Err(Error::new(ErrorKind::Backend, format!("verification failed: {}", failed.join(", "))))
    }
}
