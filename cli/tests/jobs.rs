//! `redrive jobs` end to end, as an operator runs it: the live jobs listed, read and cancelled on
//! PostgreSQL and SQLite, and refused with the counts instead on SQS (moto), all started by
//! `scripts/services`. A missing service fails the test; it never skips.

mod common;

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{database, database_url, redrive_command, sqs_endpoint};

use redrive_core::kit::{Claim, Kinds, Renew};
use redrive_core::{Enqueue, Enqueued, ErrorKind, IdempotencyKey, JobError, NewJob, Worker};
use redrive_sqs::{QueueSetup, SqsBackend, SqsConfig};
use serde_json::Value;

fn redrive(backend: &str, schema: &str, args: &[&str]) -> Output {
    redrive_command(backend, schema).args(args).output().expect("the redrive binary runs")
}

fn json(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The job kind "ship", as a worker handles it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Ship {
    n: u32,
    note: String,
}

impl redrive_core::Job for Ship {
    const KIND: &'static str = "ship";
    fn key(&self, key: redrive_core::KeyBuilder) -> redrive_core::KeyBuilder {
        key.fact("n", self.n)
    }
}

fn job(kind: &str, n: u32) -> NewJob {
    let key = IdempotencyKey::builder(kind).fact("n", n).build().unwrap();
    NewJob::new(kind, key, serde_json::json!({ "n": n, "note": format!("parcel {n}") })).unwrap()
}

/// The jobs of one `jobs list` (JSON), as (id, key, state).
fn listed(backend: &str, schema: &str, filter: &[&str]) -> Vec<(String, String, String)> {
    let args: Vec<&str> = ["--json", "jobs", "list"].into_iter().chain(filter.iter().copied()).collect();
    let out = redrive(backend, schema, &args);
    if out.status.code() == Some(2) {
        return Vec::new();
    }
    let jobs = json(&out);
    jobs.as_array()
        .unwrap()
        .iter()
        .map(|j| {
            let s = |f: &str| j[f].as_str().unwrap_or_default().to_owned();
            (s("id"), s("key"), s("state"))
        })
        .collect()
}

/// What an operator does on a queue that stores its jobs: list and filter them, read one,
/// cancel by id, by key and by filter (audited, refused without a reason, refused while
/// running), and see a cancelled key stay taken.
async fn operator_cancels(queue: &(impl Enqueue + Claim), backend: &str, schema: &str) {
    queue.enqueue_batch(vec![job("ship", 1), job("ship", 2), job("charge", 3), job("charge", 4)]).await.unwrap();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    queue.enqueue(job("ship", 5).run_at(later)).await.unwrap();
    let claimed = queue.claim(&Kinds::Only(vec!["ship".into()]), 1, Duration::from_secs(60), Duration::ZERO).await;
    let running = claimed.unwrap().remove(0);
    assert_eq!(running.job.key.as_str(), "ship:n=1");

    let all = listed(backend, schema, &[]);
    assert_eq!(all.len(), 5, "{all:?}");
    let state_of = |key: &str| all.iter().find(|j| j.1 == key).map(|j| j.2.clone()).unwrap();
    assert_eq!(
        [state_of("ship:n=1"), state_of("ship:n=2"), state_of("ship:n=5")],
        ["running", "queued", "scheduled"].map(String::from)
    );
    assert_eq!(listed(backend, schema, &["--state", "scheduled"]).len(), 1);
    assert_eq!(listed(backend, schema, &["--kind", "charge"]).len(), 2);
    assert_eq!(listed(backend, schema, &["--key", "ship:n=2"]).len(), 1);
    assert!(listed(backend, schema, &["--older-than", "1h"]).is_empty(), "every job is younger");
    assert_eq!(listed(backend, schema, &["--younger-than", "1h", "--limit", "2"]).len(), 2, "one page");
    let first_page = listed(backend, schema, &["--limit", "2"]);
    let second = listed(backend, schema, &["--limit", "2", "--after", &first_page[1].0]);
    assert!(second.iter().all(|j| !first_page.contains(j)) && second.len() == 2, "{first_page:?} {second:?}");
    let bad_state = redrive(backend, schema, &["jobs", "list", "--state", "paused"]);
    assert_eq!(bad_state.status.code(), Some(1), "{:?}", text(&bad_state));

    let id = |key: &str| all.iter().find(|j| j.1 == key).map(|j| j.0.clone()).unwrap();
    let (shown, _) = text(&redrive(backend, schema, &["jobs", "show", &id("ship:n=1")]));
    assert!(shown.contains("parcel 1") && shown.contains("lease until"), "{shown}");

    // Refused: no reason; a job that does not exist.
    let blank = redrive(backend, schema, &["jobs", "cancel", &id("ship:n=2"), "--reason", " ", "--by", "ada"]);
    assert_eq!(blank.status.code(), Some(1), "{:?}", text(&blank));
    assert!(text(&blank).1.contains("reason"), "{:?}", text(&blank));

    // A running job is asked to stop: it reads so, its holder's renewal is refused as
    // `Cancelled`, and the settlement its worker then makes ends it cancelled with the audit.
    let busy = redrive(backend, schema, &["jobs", "cancel", &id("ship:n=1"), "--reason", "late", "--by", "ada"]);
    assert_eq!(busy.status.code(), Some(0), "{:?}", text(&busy));
    assert!(text(&busy).0.contains("its worker is asked to stop it"), "{:?}", text(&busy));
    let (shown, _) = text(&redrive(backend, schema, &["jobs", "show", &id("ship:n=1")]));
    assert!(shown.contains("state         running") && shown.contains("cancel asked  "), "{shown}");
    assert!(shown.contains("by ada: late"), "{shown}");
    let renewal = queue.renewal().expect("the backend renews leases");
    let refused = renewal.renew(&running.lease, Duration::from_secs(60)).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Cancelled, "{refused}");
    queue.retry(&running.lease, Duration::ZERO, "cancelled while running").await.unwrap();
    let stopped = json(&redrive(backend, schema, &["--json", "jobs", "show", &id("ship:n=1")]));
    assert_eq!(
        (&stopped["state"], &stopped["cancelled"]["actor"], &stopped["cancelled"]["reason"]),
        (&"cancelled".into(), &"ada".into(), &"late".into()),
        "{stopped}"
    );
    let missing = redrive(backend, schema, &["jobs", "cancel", "987654321", "--reason", "gone", "--by", "ada"]);
    assert_eq!(missing.status.code(), Some(2), "{:?}", text(&missing));
    assert_eq!(state_of("ship:n=2"), "queued");

    // By id, then by key.
    let by_id = ["--json", "jobs", "cancel", &id("ship:n=2"), "--reason", "order withdrawn", "--by", "ada"];
    assert_eq!(json(&redrive(backend, schema, &by_id))["cancelled"], true);
    let again = json(&redrive(backend, schema, &by_id));
    assert_eq!((&again["cancelled"], &again["already_cancelled"]["actor"]), (&false.into(), &"ada".into()));
    let by_key = ["--json", "jobs", "cancel", "--key", "ship:n=5", "--reason", "superseded", "--by", "ben"];
    assert_eq!(json(&redrive(backend, schema, &by_key))["cancelled"], true);
    let shown = json(&redrive(backend, schema, &["--json", "jobs", "show", &id("ship:n=2")]));
    assert_eq!(shown["state"], "cancelled", "{shown}");
    assert_eq!(
        (&shown["cancelled"]["reason"], &shown["cancelled"]["actor"]),
        (&"order withdrawn".into(), &"ada".into())
    );
    let (shown, _) = text(&redrive(backend, schema, &["jobs", "show", &id("ship:n=5")]));
    assert!(shown.contains("by ben: superseded"), "{shown}");
    assert_eq!(listed(backend, schema, &["--state", "cancelled"]).len(), 3, "two unrun, one stopped");

    // The key stays taken: enqueued again, a duplicate of the cancelled job.
    let again = queue.enqueue(job("ship", 2)).await.unwrap();
    assert!(matches!(&again, Enqueued::Duplicate { id: dup, .. } if dup.0 == id("ship:n=2")), "{again:?}");

    // By filter: listed without --yes, cancelled with it; a second run finds nothing.
    let nothing = redrive(backend, schema, &["jobs", "cancel", "--reason", "r", "--by", "ada"]);
    assert_eq!(nothing.status.code(), Some(1), "no id and no filter is refused: {:?}", text(&nothing));
    let preview =
        redrive(backend, schema, &["jobs", "cancel", "--kind", "charge", "--reason", "retired", "--by", "ada"]);
    let (out, err) = text(&preview);
    assert_eq!(preview.status.code(), Some(0), "{err}");
    assert!(out.contains("charge:n=3") && err.contains("--yes"), "{out} {err}");
    assert_eq!(listed(backend, schema, &["--kind", "charge", "--state", "queued"]).len(), 2, "nothing cancelled yet");
    let bulk = ["--json", "jobs", "cancel", "--kind", "charge", "--reason", "retired", "--by", "ada", "--yes"];
    assert_eq!(json(&redrive(backend, schema, &bulk))["jobs_cancelled"], 2);
    assert_eq!(redrive(backend, schema, &bulk).status.code(), Some(2), "nothing left to cancel");
    // Nothing cancelled ever runs.
    let left = queue.claim(&Kinds::Any, 10, Duration::from_secs(60), Duration::from_millis(200)).await.unwrap();
    assert!(left.is_empty(), "cancelled jobs are never claimed: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_an_operator_lists_shows_and_cancels_jobs() {
    let db = database().await;
    let schema = db.schema().to_owned();
    operator_cancels(&db, &database_url(), &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_an_operator_lists_shows_and_cancels_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let file = redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(&path)).await.unwrap();
    operator_cancels(&file, &format!("sqlite://{}", path.display()), "-").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqs_jobs_are_not_listed_and_the_counts_are_shown_instead() {
    let db = database().await;
    let schema = db.schema().to_owned();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let name = format!("rdt-jobs-{}-{nanos:x}", std::process::id());
    let config = SqsConfig::new(&name)
        .with_endpoint(sqs_endpoint())
        .with_region("us-east-1")
        .with_static_credentials("test", "test")
        .with_max_wait(Duration::ZERO);
    let queue = SqsBackend::setup(config, QueueSetup::default(), db.clone())
        .await
        .unwrap_or_else(|e| panic!("moto's SQS is required (run scripts/test): {e}"));
    queue.enqueue(job("ship", 1)).await.unwrap();
    let backend = format!("sqs://{name}");
    let out = redrive(&backend, &schema, &["jobs", "list"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout} {stderr}");
    assert!(stderr.contains("Unsupported") && stderr.contains("cannot list"), "{stderr}");
    assert!(stdout.contains("queued") && stdout.contains("open records"), "the counts instead: {stdout}");
    // By id: refused, saying to cancel the key. By key: a mark in the workers' ledger (the records
    // database), so a worker completes the message unrun, its handler never called.
    let by_id = redrive(&backend, &schema, &["jobs", "cancel", "1", "--reason", "r", "--by", "ada"]);
    assert_eq!(by_id.status.code(), Some(1));
    assert!(text(&by_id).1.contains("Unsupported") && text(&by_id).1.contains("--key"), "{:?}", text(&by_id));
    let cancel = redrive(&backend, &schema, &["jobs", "cancel", "--key", "ship:n=1", "--reason", "r", "--by", "ada"]);
    assert_eq!(cancel.status.code(), Some(0), "{:?}", text(&cancel));
    assert!(text(&cancel).0.contains("cancelled in the workers' ledger"), "{:?}", text(&cancel));
    let again = json(&redrive(
        &backend,
        &schema,
        &["--json", "jobs", "cancel", "--key", "ship:n=1", "--reason", "x", "--by", "ben"],
    ));
    assert_eq!((&again["cancelled"], &again["already_cancelled"]["actor"]), (&false.into(), &"ada".into()), "{again}");
    let ran = Arc::new(AtomicU32::new(0));
    let worker = {
        let ran = Arc::clone(&ran);
        Worker::builder(queue.clone(), db.clone())
            .handle::<Ship>(move |_: Ship, _| {
                ran.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, JobError>(()) }
            })
            .build()
            .start()
    };
    for _ in 0..200 {
        if worker.stats().withdrawn == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = worker.shutdown().await;
    assert_eq!((stats.withdrawn, ran.load(Ordering::SeqCst)), (1, 0), "completed unrun: {stats:?}");

    // The dashboard's Jobs page says so too, and shows the counts instead.
    let (_served, url) = common::serve(&backend, &schema, None);
    let page = reqwest::get(format!("{url}/jobs")).await.unwrap();
    assert_eq!(page.status(), reqwest::StatusCode::OK);
    let page = page.text().await.unwrap();
    assert!(page.contains("id=\"unlisted\"") && page.contains("cannot list its jobs"), "{page}");
    assert!(page.contains("<th>queued</th>") && page.contains("<th>open records</th>"), "{page}");
    let job = reqwest::get(format!("{url}/jobs/1")).await.unwrap();
    assert_eq!(job.status(), reqwest::StatusCode::NOT_IMPLEMENTED);
}
