//! The seed's six steps as an operator takes them, with the `redrive` command against a real
//! worker: a job fails to its cap (a record, one alert); the person reads the record; fixes the
//! cause; replays; the record stays `replaying` until the effect happens, once, and then reads
//! `confirmed`, with when. A replay whose job fails again leaves the old record linked to the new
//! one, never confirmed; a record whose cause is the data is replayed with `--amend`. On
//! PostgreSQL and on SQLite, both real.

mod common;

use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{database, database_url, redrive_command};
use redrive_core::alert::BoxFuture;
use redrive_core::kit::{Claim, Ledger};
use redrive_core::{
    Alert, AlertSink, Backoff, DeadLetter, Enqueue, Job, JobContext, JobError, KeyBuilder, NewJob, RunningWorker,
    Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ship {
    parcel: u32,
    address: String,
}

impl Job for Ship {
    const KIND: &'static str = "ship";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("parcel", self.parcel)
    }
}

/// The carrier: down until `fixed`, and refusing an address that says "malformed" for good.
#[derive(Default)]
struct Carrier {
    fixed: AtomicBool,
    shipped: Mutex<Vec<Ship>>,
    alerts: Mutex<Vec<Alert>>,
}

struct Alerts(Arc<Carrier>);

impl AlertSink for Alerts {
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, redrive_core::Result<()>> {
        self.0.alerts.lock().unwrap().push(alert.clone());
        Box::pin(async { Ok(()) })
    }
}

fn worker<Q: Claim + DeadLetter + 'static, L: Ledger + 'static>(
    queue: Q,
    ledger: L,
    carrier: &Arc<Carrier>,
) -> RunningWorker {
    let config = WorkerConfig {
        concurrency: 2,
        poll: Duration::from_millis(100),
        backoff: Backoff::NONE,
        shutdown_grace: Duration::from_secs(2),
        ..WorkerConfig::default()
    };
    let shipper = Arc::clone(carrier);
    Worker::builder(queue, ledger)
        .config(config)
        .alert(Alerts(Arc::clone(carrier)))
        .handle::<Ship>(move |job: Ship, _ctx: JobContext| {
            let carrier = Arc::clone(&shipper);
            async move {
                if job.address.contains("malformed") {
                    return Err(JobError::permanent("the address does not parse"));
                }
                if !carrier.fixed.load(Ordering::SeqCst) {
                    return Err(JobError::retry("carrier 503"));
                }
                carrier.shipped.lock().unwrap().push(job);
                Ok(())
            }
        })
        .build()
        .start()
}

fn run(backend: &str, schema: &str, args: &[&str]) -> Output {
    redrive_command(backend, schema).args(args).output().expect("the redrive binary runs")
}

fn json_of(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The record `id` as `redrive failed show --json` prints it.
fn shown(backend: &str, schema: &str, id: &str) -> Value {
    json_of(&run(backend, schema, &["--json", "failed", "show", id]))
}

/// Waits until `redrive failed show` says record `id` is `state`.
async fn wait_state(backend: &str, schema: &str, id: &str, state: &str) -> Value {
    for _ in 0..200 {
        let record = shown(backend, schema, id);
        if record["state"]["state"] == state {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("record {id} never became {state}: {}", shown(backend, schema, id));
}

/// Waits until the open records of parcel `parcel` are `n`, then returns them.
async fn open_records(backend: &str, schema: &str, n: usize) -> Vec<Value> {
    for _ in 0..200 {
        let out = run(backend, schema, &["--json", "failed", "list"]);
        if out.status.code() == Some(0) {
            let list = json_of(&out);
            if list.as_array().map(Vec::len) == Some(n) {
                return list.as_array().cloned().unwrap_or_default();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never {n} open records");
}

/// The six steps, then a replay that fails again, then an amended replay, on one backend.
async fn six_steps<Q: Enqueue + Claim + DeadLetter + Clone + 'static, L: Ledger + Clone + 'static>(
    queue: Q,
    ledger: L,
    backend: &str,
    schema: &str,
) {
    let carrier = Arc::new(Carrier::default());
    // 1. The job fails to its cap: one record, one alert.
    let job = Ship { parcel: 7, address: "1 Main St".into() };
    queue.enqueue(NewJob::from_job(&job).unwrap().with_cap(3)).await.unwrap();
    let w = worker(queue.clone(), ledger.clone(), &carrier);
    let open = open_records(backend, schema, 1).await;
    w.shutdown().await;
    let id = open[0]["id"].as_str().unwrap().to_owned();
    let alerts: Vec<String> = carrier.alerts.lock().unwrap().iter().map(|a| a.record.id.0.clone()).collect();
    assert_eq!(alerts, std::slice::from_ref(&id), "one alert, naming the record");

    // 2. The person reads it: payload, error, attempts.
    let text = String::from_utf8_lossy(&run(backend, schema, &["failed", "show", &id]).stdout).into_owned();
    assert!(
        text.contains("carrier 503") && text.contains("attempts      3 of 3") && text.contains("1 Main St"),
        "{text}"
    );

    // 3, 4. A replay while the cause remains: the replayed job fails again. The old record names
    // the new one and is never confirmed; the new one names the old.
    assert_eq!(
        json_of(&run(backend, schema, &["--json", "replay", &id, "--by", "ada", "--reason", "retry"]))["replayed"],
        true
    );
    let replaying = shown(backend, schema, &id);
    assert_eq!(replaying["state"]["state"], "replaying", "sent, not done: {replaying}");
    let w = worker(queue.clone(), ledger.clone(), &carrier);
    let old = wait_state(backend, schema, &id, "failed_again").await;
    let next = old["state"]["next"].as_str().unwrap().to_owned();
    let text = String::from_utf8_lossy(&run(backend, schema, &["failed", "show", &id]).stdout).into_owned();
    assert!(text.contains("failed again") && text.contains(&format!("as record {next}")), "{text}");
    assert_eq!(shown(backend, schema, &next)["replay_of"], id.as_str(), "the new record names the old");
    w.shutdown().await;

    // 5, 6. The cause fixed; the new record replayed: replaying until the effect, then confirmed,
    // with when. The effect happened once.
    carrier.fixed.store(true, Ordering::SeqCst);
    json_of(&run(backend, schema, &["--json", "replay", &next, "--by", "ada", "--reason", "carrier back"]));
    assert_eq!(shown(backend, schema, &next)["state"]["state"], "replaying");
    assert!(carrier.shipped.lock().unwrap().is_empty(), "nothing ran yet");
    let w = worker(queue.clone(), ledger.clone(), &carrier);
    let confirmed = wait_state(backend, schema, &next, "confirmed").await;
    assert_eq!(carrier.shipped.lock().unwrap().len(), 1, "the effect once");
    let (at, when) = (confirmed["state"]["at"].as_str().unwrap(), confirmed["state"]["confirmed_at"].as_str().unwrap());
    let (at, when) =
        (chrono::DateTime::parse_from_rfc3339(at).unwrap(), chrono::DateTime::parse_from_rfc3339(when).unwrap());
    assert!(when >= at, "confirmed after the replay: {confirmed}");
    assert_eq!(
        (confirmed["state"]["actor"].as_str(), confirmed["state"]["reason"].as_str()),
        (Some("ada"), Some("carrier back"))
    );
    assert_eq!(shown(backend, schema, &id)["state"]["state"], "failed_again", "the first record stays as it was");
    let text = String::from_utf8_lossy(&run(backend, schema, &["failed", "show", &next]).stdout).into_owned();
    assert!(text.contains("confirmed") && text.contains("its effect done once"), "{text}");

    // The data is the cause: an amended replay under the same keys, audited.
    let bad = Ship { parcel: 8, address: "malformed".into() };
    queue.enqueue(NewJob::from_job(&bad).unwrap()).await.unwrap();
    let open = open_records(backend, schema, 1).await;
    let bad_id = open[0]["id"].as_str().unwrap().to_owned();
    let patch = r#"{"address": "8 Elm St"}"#;
    let no_reason = run(backend, schema, &["replay", &bad_id, "--amend", patch, "--by", "ada"]);
    assert_eq!(no_reason.status.code(), Some(1), "an amended replay needs a reason");
    assert!(String::from_utf8_lossy(&no_reason.stderr).contains("reason is required"));
    let dry = json_of(&run(backend, schema, &["--json", "replay", &bad_id, "--amend", patch, "--dry-run"]));
    assert_eq!(dry["amended"], json!({"parcel": 8, "address": "8 Elm St"}));
    assert_eq!(shown(backend, schema, &bad_id)["state"]["state"], "open", "a dry run sends nothing");
    let replayed =
        run(backend, schema, &["--json", "replay", &bad_id, "--amend", patch, "--by", "ada", "--reason", "typo"]);
    assert_eq!(json_of(&replayed)["replayed"], true);
    let amended = wait_state(backend, schema, &bad_id, "confirmed").await;
    w.shutdown().await;
    assert_eq!(amended["payload"], json!({"parcel": 8, "address": "malformed"}), "the original kept");
    assert_eq!(amended["amended"], json!({"parcel": 8, "address": "8 Elm St"}), "the amended kept");
    assert_eq!(amended["state"]["amended"], true);
    let shipped: Vec<String> = carrier.shipped.lock().unwrap().iter().map(|s| s.address.clone()).collect();
    assert_eq!(shipped, ["1 Main St", "8 Elm St"], "each effect once, the amended one with its correction");
    // Only the audited replay amends: a plain enqueue of another payload under the key conflicts.
    let other = Ship { parcel: 8, address: "somewhere else".into() };
    let conflict = queue.enqueue(NewJob::from_job(&other).unwrap()).await.unwrap_err();
    assert_eq!(conflict.kind(), redrive_core::ErrorKind::KeyConflict);
    // A confirmed record cannot be amended again.
    let closed = json_of(&run(
        backend,
        schema,
        &["--json", "replay", &bad_id, "--amend", r#"{"address": "x"}"#, "--by", "ada", "--reason", "again"],
    ));
    assert_eq!(closed["replayed"], false, "{closed}");

    // A replayed job cancelled before it runs: its record will never be settled by it, so the
    // cancel closes it as discarded, with the cancel's why and who.
    let doomed = Ship { parcel: 9, address: "malformed".into() };
    queue.enqueue(NewJob::from_job(&doomed).unwrap()).await.unwrap();
    let w = worker(queue.clone(), ledger.clone(), &carrier);
    let open = open_records(backend, schema, 1).await;
    w.shutdown().await;
    let doomed_id = open[0]["id"].as_str().unwrap().to_owned();
    let job_id = open[0]["job_id"].as_str().unwrap().to_owned();
    json_of(&run(backend, schema, &["--json", "replay", &doomed_id, "--by", "ada"]));
    let cancel = run(backend, schema, &["jobs", "cancel", &job_id, "--reason", "order withdrawn", "--by", "bo"]);
    assert_eq!(cancel.status.code(), Some(0), "{}", String::from_utf8_lossy(&cancel.stderr));
    let record = shown(backend, schema, &doomed_id);
    assert_eq!(record["state"]["state"], "discarded", "{record}");
    assert_eq!(record["state"]["reason"], "its replayed job was cancelled: order withdrawn");
    assert_eq!(record["state"]["actor"], "bo");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_record_is_confirmed_by_its_effect_and_linked_when_it_fails_again() {
    let db = database().await;
    let schema = db.schema().to_owned();
    six_steps(db.clone(), db, &database_url(), &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_a_record_is_confirmed_by_its_effect_and_linked_when_it_fails_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let file = redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(&path)).await.unwrap();
    six_steps(file.clone(), file, &format!("sqlite://{}", path.display()), "-").await;
}
