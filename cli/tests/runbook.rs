//! docs/RUNBOOK.md, followed step by step against PostgreSQL: an alert arrives, the record is
//! read with `redrive failed show`, one record is discarded and one replayed, and the replayed
//! job's effect happens once.

use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::alert::AlertSinkExt;
use redrive_core::{Alert, EnqueueExt, Job, JobContext, JobError, KeyBuilder, RunningWorker, Severity, Worker};
use redrive_postgres::{PgBackend, PgConfig};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct GrantCredits {
    account: String,
    credits: u32,
}

impl Job for GrantCredits {
    const KIND: &'static str = "grant_credits";
    const SEVERITY: Severity = Severity::Critical;
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("account", &self.account)
    }
}

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn redrive(schema: &str, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_redrive"))
        .args(["--backend", &database_url(), "--schema", schema])
        .args(args)
        .output()
        .expect("the redrive binary runs")
}

fn stdout(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A worker whose billing API is down while `down` is set; grants land in `granted`.
fn worker(
    db: &PgBackend,
    down: &Arc<Mutex<bool>>,
    granted: &Arc<Mutex<Vec<String>>>,
    paged: &Arc<Mutex<Vec<Alert>>>,
) -> RunningWorker {
    let (down, granted, paged) = (Arc::clone(down), Arc::clone(granted), Arc::clone(paged));
    Worker::builder(db.clone(), db.clone())
        .config(redrive_core::WorkerConfig {
            poll: Duration::from_millis(100),
            backoff: redrive_core::Backoff { base: Duration::from_millis(10), ..redrive_core::Backoff::default() },
            ..redrive_core::WorkerConfig::default()
        })
        .handle::<GrantCredits>(move |job: GrantCredits, _ctx: JobContext| {
            let (down, granted) = (Arc::clone(&down), Arc::clone(&granted));
            async move {
                if *down.lock().unwrap() {
                    return Err(JobError::retry("billing API timed out after 10 s"));
                }
                granted.lock().unwrap().push(job.account);
                Ok(())
            }
        })
        .alert(
            redrive_core::alert::from_fn(move |alert: Alert| {
                let paged = Arc::clone(&paged);
                async move {
                    paged.lock().unwrap().push(alert);
                    Ok(())
                }
            })
            .at_least(Severity::Critical),
        )
        .build()
        .start()
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..300 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runbook_recovers_a_failed_credit_grant_once() {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let schema = format!("rdt_{}_{nanos:x}_runbook", std::process::id());
    let db = PgBackend::connect(PgConfig::new(database_url()).with_schema(&schema).with_max_connections(4))
        .await
        .expect("PostgreSQL is required (run scripts/test)");
    db.migrate().await.unwrap();
    let (down, granted, paged) = (Arc::new(Mutex::new(true)), Arc::default(), Arc::default());

    // The billing API is down: two grants use every attempt.
    for account in ["acct_7", "acct_9"] {
        db.enqueue_job(&GrantCredits { account: account.into(), credits: 500 }).await.unwrap();
    }
    let w = worker(&db, &down, &granted, &paged);
    // 1. The alert pages: one per record, critical.
    wait_for("two pages", || paged.lock().unwrap().len() == 2).await;
    w.shutdown().await;
    let alerts = paged.lock().unwrap().clone();
    assert!(alerts.iter().all(|a| a.record.severity == Severity::Critical));
    let id_of = |account: &str| {
        let alert = alerts.iter().find(|a| a.record.key.as_str().contains(account)).unwrap();
        alert.record.id.0.clone()
    };
    let (replay_id, discard_id) = (id_of("acct_9"), id_of("acct_7"));

    // 2. How bad: both open, both critical.
    assert!(stdout(&redrive(&schema, &["failed", "list", "--severity", "critical"])).contains("2 records"));
    // 3. Read before changing anything: the payload and every attempt's error.
    let shown = stdout(&redrive(&schema, &["failed", "show", &replay_id]));
    assert!(shown.contains("\"account\": \"acct_9\"") && shown.contains("billing API timed out"), "{shown}");
    assert!(shown.contains("attempts      5 of 5") && shown.contains("severity      critical"), "{shown}");

    // 4. Fix the cause (the API is back), or discard with a reason and a name.
    *down.lock().unwrap() = false;
    let discarded =
        stdout(&redrive(&schema, &["discard", &discard_id, "--reason", "granted by hand, ticket 4411", "--by", "ada"]));
    assert!(discarded.contains("discarded") && discarded.contains("by ada: granted by hand"), "{discarded}");

    // 5. Replay with the same key; a second replay does nothing.
    assert!(
        stdout(&redrive(&schema, &["replay", &replay_id, "--by", "ada", "--reason", "the grants API is back"]))
            .contains("replayed as job")
    );
    assert!(
        stdout(&redrive(&schema, &["replay", &replay_id, "--by", "ada", "--reason", "the grants API is back"]))
            .contains("closed already")
    );
    let w = worker(&db, &down, &granted, &paged);
    wait_for("the replayed grant", || !granted.lock().unwrap().is_empty()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.shutdown().await;

    // 6. One effect, and the record closed; the discarded one never ran.
    assert_eq!(*granted.lock().unwrap(), ["acct_9"]);
    assert!(stdout(&redrive(&schema, &["failed", "show", &replay_id])).contains("state         confirmed"));
    assert!(stdout(&redrive(&schema, &["failed", "count"])).contains("open records: 0"));
    assert_eq!(paged.lock().unwrap().len(), 2, "no new page");
}
