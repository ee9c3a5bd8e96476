//! `redrive verify` end to end, as a team runs it in staging: the four tests against the real
//! backend (PostgreSQL, SQLite, SQS on moto, Azure on Azurite, QStash's and Inngest's emulators,
//! pgmq) while an application worker consumes the same queue (on QStash and Inngest, the same
//! account), the evidence read back, and `--check-fresh` passing, then failing on a changed key
//! format. A missing service fails the test; it never skips.

mod common;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{database, database_url, redrive_command, sqs_endpoint};
use redrive_azure::{AzureBackend, QueueOptions};
use redrive_core::kit::{Claim, Ledger};
use redrive_core::{DeadLetter, Enqueue, EnqueueExt, JobError, RunningWorker, Worker};
use redrive_qstash::{QStashBackend, QStashConfig};
use redrive_qstash_emulator::{Emulator, RunningEmulator};
use redrive_sqs::{QueueSetup, SqsBackend, SqsConfig};
use serde_json::Value;

/// The application's own job kind.
#[derive(serde::Serialize, serde::Deserialize)]
struct Ship {
    n: u32,
}

impl redrive_core::Job for Ship {
    const KIND: &'static str = "ship";
    fn key(&self, key: redrive_core::KeyBuilder) -> redrive_core::KeyBuilder {
        key.fact("n", self.n)
    }
}

/// The application: a worker of "ship" jobs on the queue verify runs on, counting its effects.
fn application<Q, L>(queue: Q, ledger: L) -> (RunningWorker, Arc<AtomicU32>)
where
    Q: Claim + DeadLetter + 'static,
    L: Ledger + 'static,
{
    let shipped = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&shipped);
    let worker = Worker::builder(queue, ledger)
        .handle::<Ship>(move |_: Ship, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, JobError>(()) }
        })
        .poll(Duration::from_millis(250))
        .build()
        .start();
    (worker, shipped)
}

/// What `redrive` is pointed at: the backend's URL, the schema, the settings a backend takes from
/// the environment, and what `redrive verify` needs besides (QStash's `--listen`).
#[derive(Clone)]
struct Target {
    url: String,
    schema: String,
    env: Vec<(&'static str, String)>,
    verify: Vec<String>,
}

impl Target {
    fn new(url: &str, schema: &str) -> Self {
        Self { url: url.to_owned(), schema: schema.to_owned(), env: Vec::new(), verify: Vec::new() }
    }
}

fn redrive(target: &Target, args: &[&str]) -> Output {
    let mut command = redrive_command(&target.url, &target.schema);
    command.envs(target.env.iter().map(|(k, v)| (k, v)));
    if args.first() == Some(&"verify") && !args.contains(&"--check-fresh") {
        command.arg("verify").args(&target.verify).args(&args[1..]);
    } else {
        command.args(args);
    }
    command.output().expect("the redrive binary runs")
}

fn text(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The one JSON evidence file in `dir`, kept with its Markdown twin in
/// `$CARGO_TARGET_TMPDIR/verify-evidence/<scheme>` for `.ci/run` to list.
fn evidence(dir: &Path, scheme: &str) -> Value {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert_eq!(files.len(), 1, "one run, one JSON file: {files:?}");
    let markdown = files[0].with_extension("md");
    assert!(std::fs::read_to_string(&markdown).unwrap().starts_with("# redrive verify: passed"));
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verify-evidence").join(scheme);
    let _ = std::fs::remove_dir_all(&kept);
    std::fs::create_dir_all(&kept).unwrap();
    for file in [&files[0], &markdown] {
        std::fs::copy(file, kept.join(file.file_name().unwrap())).unwrap();
    }
    serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap()
}

/// The item `what` of test `name`'s evidence.
fn item<'a>(evidence: &'a Value, name: &str, what: &str) -> &'a Value {
    let test = evidence["tests"].as_array().unwrap().iter().find(|t| t["name"] == name).expect(name);
    assert_eq!(test["passed"], true, "{test:#}");
    let item = test["items"].as_array().unwrap().iter().find(|i| i["what"] == what);
    let item = item.unwrap_or_else(|| panic!("{name} keeps {what}: {test:#}"));
    assert!(item["at"].as_str().is_some_and(|at| at.starts_with("20")), "every item is dated: {item}");
    &item["detail"]
}

/// Runs `redrive verify` on `backend` while the application ships 20 jobs on the same queue,
/// then reads the evidence and checks it with `--check-fresh`. `jobs_listed`: the backend lists
/// its jobs (one job row per key is then part of the evidence).
async fn verify_beside_the_application<Q: Enqueue>(
    target: &Target,
    queue: &Q,
    app: (RunningWorker, Arc<AtomicU32>),
    jobs_listed: bool,
) {
    let (worker, shipped) = app;
    for n in 1..=20 {
        queue.enqueue_job(&Ship { n }).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let evidence_dir = dir.path().to_str().unwrap();
    let run = {
        let (target, evidence_dir) = (target.clone(), evidence_dir.to_owned());
        tokio::task::spawn_blocking(move || {
            // Past the default minute: the seven backends' verifications run at once here, beside
            // their applications, on two cores; a job never handled still fails them.
            redrive(&target, &["verify", "--evidence", &evidence_dir, "--key-format", "ship=n", "--timeout", "180s"])
        })
    };
    let out = run.await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for name in ["replay", "race", "exhaust", "recover"] {
        assert!(text(&out).lines().any(|l| l.starts_with(name) && l.contains("passed")), "{}", text(&out));
    }
    for _ in 0..200 {
        if shipped.load(Ordering::SeqCst) >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = worker.shutdown().await;
    assert_eq!(shipped.load(Ordering::SeqCst), 20, "the application's jobs ran once each: {stats:?}");
    assert_eq!((stats.dead_lettered, stats.retried), (0, 0), "verify's jobs cost the application nothing");

    let backend = target.url.as_str();
    let found = evidence(dir.path(), backend.split_once(':').map_or(backend, |(scheme, _)| scheme));
    assert_eq!(found["passed"], true);
    if let Some(password) = password(backend) {
        assert!(!found["identity"]["backend"].as_str().unwrap().contains(password), "{found:#}");
        assert!(!std::fs::read_to_string(evidence_markdown(dir.path())).unwrap().contains(password));
    }
    assert_eq!(found["identity"]["key_formats"]["ship"], "n");
    let key = item(&found, "replay", "enqueue #1")["key"].as_str().unwrap().to_owned();
    assert_eq!(item(&found, "replay", "enqueue #2")["key"], key.as_str(), "both enqueues share the key");
    assert_eq!(item(&found, "replay", "effects")["count"], 1);
    if jobs_listed {
        assert_eq!(item(&found, "replay", "job rows")["count"], 1);
    }
    assert!(item(&found, "replay", "ledger entry").is_object());
    assert_eq!(item(&found, "race", "effects")["count"], 1);
    assert_eq!(item(&found, "race", "recorded skip")["count"], 1);
    assert_eq!(item(&found, "race", "ledger entry")["state"], "done");
    let record = item(&found, "exhaust", "failure record");
    assert_eq!((&record["attempts"], &record["cap"]), (&5.into(), &5.into()), "{record}");
    assert!(record["payload"]["run"].is_string() && record["last_error"].as_str().unwrap().contains("on purpose"));
    assert_eq!(item(&found, "exhaust", "alert")["count"], 1);
    assert!(item(&found, "exhaust", "alert")["alerts"][0]["raised_at"].is_string());
    assert_eq!(item(&found, "recover", "record")["state"], "confirmed");
    assert_eq!(item(&found, "recover", "effects")["count"], 1);

    // It left nothing behind: no job, no record of its kind, its keys forgotten.
    let cleaned = found["cleaned_up"].as_array().unwrap();
    let forgotten = |test: &str| {
        let entry = cleaned.iter().find(|c| c["key"].as_str().unwrap().ends_with(&format!(":test={test}")));
        entry.unwrap_or_else(|| panic!("{test} cleaned up: {cleaned:?}"))["forgotten"].clone()
    };
    assert_eq!(forgotten("exhaust")["records"], 1, "{cleaned:?}");
    assert!(forgotten("exhaust")["ledger"].as_u64().unwrap() >= 1, "its alert mark at least: {cleaned:?}");
    assert_eq!(forgotten("race")["ledger"], 1, "{cleaned:?}");
    if jobs_listed {
        assert_eq!((&forgotten("replay")["jobs"], &forgotten("exhaust")["jobs"]), (&1.into(), &1.into()));
    }
    let records = redrive(target, &["failed", "list", "--state", "all", "--kind", "redrive_verify"]);
    assert_eq!(records.status.code(), Some(2), "no record of verify's kind is left: {}", text(&records));
    if jobs_listed {
        let jobs = redrive(target, &["jobs", "list", "--kind", "redrive_verify"]);
        assert_eq!(jobs.status.code(), Some(2), "no job of verify's kind is left: {}", text(&jobs));
    }

    // In CI: fresh while nothing changed; stale once a kind's key format did.
    let fresh = redrive(target, &["verify", "--check-fresh", evidence_dir, "--key-format", "ship=n"]);
    assert_eq!(fresh.status.code(), Some(0), "{}", text(&fresh));
    let changed = redrive(target, &["verify", "--check-fresh", evidence_dir, "--key-format", "ship=n,zone"]);
    assert_eq!(changed.status.code(), Some(1), "{}", text(&changed));
    assert!(text(&changed).contains("key format of kind ship: n then, n,zone now"), "{}", text(&changed));
    let old = redrive(target, &["verify", "--check-fresh", evidence_dir, "--key-format", "ship=n", "--max-age", "0s"]);
    assert_eq!(old.status.code(), Some(1), "{}", text(&old));
    let empty = tempfile::tempdir().unwrap();
    let none = redrive(target, &["verify", "--check-fresh", empty.path().to_str().unwrap()]);
    assert_eq!(none.status.code(), Some(1), "no evidence: {}", text(&none));
}

/// A URL's password, if it has one.
fn password(url: &str) -> Option<&str> {
    let (userinfo, _) = url.split_once("://")?.1.split_once('@')?;
    userinfo.split_once(':').map(|(_, password)| password)
}

/// The Markdown evidence file in `dir`.
fn evidence_markdown(dir: &Path) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "md"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_postgres_beside_the_application() {
    let db = database().await;
    let schema = db.schema().to_owned();
    let app = application(db.clone(), db.clone());
    // With a password (the server trusts this machine and ignores it): the evidence must not
    // keep it.
    let url = database_url();
    let url = match url.split_once("://").and_then(|(scheme, rest)| Some((scheme, rest.split_once('@')?))) {
        Some((scheme, (user, host))) if !user.contains(':') => format!("{scheme}://{user}:verify-secret@{host}"),
        _ => url,
    };
    assert!(password(&url).is_some(), "the test URL has a password");
    verify_beside_the_application(&Target::new(&url, &schema), &db, app, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_sqlite_beside_the_application() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let file = redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(&path)).await.unwrap();
    let app = application(file.clone(), file.clone());
    verify_beside_the_application(&Target::new(&format!("sqlite://{}", path.display()), "-"), &file, app, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_sqs_beside_the_application() {
    let db = database().await;
    let schema = db.schema().to_owned();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let name = format!("rdt-verify-{}-{nanos:x}", std::process::id());
    let config = SqsConfig::new(&name)
        .with_endpoint(sqs_endpoint())
        .with_region("us-east-1")
        .with_static_credentials("test", "test")
        .with_max_wait(Duration::from_millis(200));
    let queue = SqsBackend::setup(config, QueueSetup::default(), db.clone())
        .await
        .unwrap_or_else(|e| panic!("moto's SQS is required (run scripts/test): {e}"));
    let app = application(queue.clone(), db.clone());
    verify_beside_the_application(&Target::new(&format!("sqs://{name}"), &schema), &queue, app, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_azure_beside_the_application() {
    let db = database().await;
    let schema = db.schema().to_owned();
    let name = format!("rdt-verify-{}", common::unique().replace('_', "-"));
    let account = common::azure_account();
    let queue = AzureBackend::setup(&account, &name, QueueOptions::default(), db.clone())
        .await
        .unwrap_or_else(|e| panic!("Azurite is required (run scripts/test): {e}"));
    let app = application(queue.clone(), db.clone());
    verify_beside_the_application(&Target::new(&format!("azure://{name}"), &schema), &queue, app, false).await;
}

/// The application on QStash: its receiver at `/app` on a listener of this test, its worker, and
/// the emulator (the account verify shares with it).
async fn qstash_application(db: &redrive_postgres::PgBackend) -> (RunningEmulator, QStashBackend, String) {
    let emulator = Emulator::builder().token("verify-token").time_scale(0.01).start_local().await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let destination = format!("http://{}/app", listener.local_addr().unwrap());
    let config = QStashConfig::new("verify-token", &destination).with_api_url(emulator.url()).allow_plain_http();
    let backend = QStashBackend::connect(config, Arc::new(db.clone())).await.unwrap();
    let app = axum::Router::new().route("/app", backend.receiver());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (emulator, backend, destination)
}

/// A loopback address nothing listens on (yet).
fn free_address() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn qstash_target(emulator: &RunningEmulator, schema: &str, url: &str, listen: std::net::SocketAddr) -> Target {
    Target {
        url: url.to_owned(),
        schema: schema.to_owned(),
        env: vec![("QSTASH_TOKEN", "verify-token".to_owned()), ("QSTASH_URL", emulator.url())],
        verify: vec!["--listen".to_owned(), listen.to_string()],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_qstash_beside_the_application() {
    let db = database().await;
    let (emulator, backend, app_destination) = qstash_application(&db).await;
    let app = application(backend.clone(), db.clone());
    // Verify's own destination on the same account, leading to the receiver it serves.
    let listen = free_address();
    let target = qstash_target(&emulator, db.schema(), &format!("qstash+http://{listen}/verify"), listen);
    verify_beside_the_application(&target, &backend, app, false).await;
    // QStash's DLQ keeps nothing of verify's, and the application's destination got none of its jobs.
    assert!(emulator.dlq_ids().is_empty(), "{:?}", emulator.dlq_entries());
    let to_app = emulator.deliveries().into_iter().filter(|d| d.url == app_destination).count();
    assert_eq!(to_app, 20, "the application's receiver got its 20 jobs and nothing else");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_on_qstash_refuses_the_application_s_destination_and_one_that_does_not_lead_to_it() {
    let db = database().await;
    let (emulator, backend, app_destination) = qstash_application(&db).await;
    let (worker, _) = application(backend.clone(), db.clone());
    let taken =
        qstash_target(&emulator, db.schema(), &app_destination.replacen("http", "qstash+http", 1), free_address());
    let dir = tempfile::tempdir().unwrap();
    let evidence_dir = dir.path().to_str().unwrap().to_owned();
    let args = ["verify", "--evidence", evidence_dir.as_str()];
    let refused = tokio::task::spawn_blocking({
        let (taken, args) = (taken.clone(), args.map(str::to_owned));
        move || redrive(&taken, &args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(text(&refused).contains("a receiver already answers"), "{}", text(&refused));
    // Not leading to --listen: the URL's port is another than the one verify listens on.
    let elsewhere =
        qstash_target(&emulator, db.schema(), &format!("qstash+http://{}/verify", free_address()), free_address());
    let lost = tokio::task::spawn_blocking({
        let args = args.map(str::to_owned);
        move || redrive(&elsewhere, &args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    assert_eq!(lost.status.code(), Some(1), "{}", text(&lost));
    assert!(text(&lost).contains("does not lead to --listen"), "{}", text(&lost));
    // Nothing was sent: no message, no evidence.
    assert_eq!(emulator.messages_accepted(), 0);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let stats = worker.shutdown().await;
    assert_eq!(stats.claimed, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_pgmq_beside_the_application() {
    let db = database().await;
    let name = format!("rdt_verify_{}", common::unique().replace('-', "_"));
    let queue = redrive_pgmq::PgmqBackend::setup(redrive_pgmq::PgmqConfig::new(&name), db.clone())
        .await
        .unwrap_or_else(|e| panic!("pgmq is required in the test database (run scripts/services): {e}"));
    let app = application(queue.clone(), db.clone());
    verify_beside_the_application(&Target::new(&format!("pgmq://{name}"), db.schema()), &queue, app, false).await;
    // Nothing of verify's is left in the queue or its archive.
    let left: i64 = redrive_postgres::sqlx::query_scalar(redrive_postgres::sqlx::AssertSqlSafe(format!(
        "SELECT (SELECT count(*) FROM pgmq.q_{name}) + (SELECT count(*) FROM pgmq.a_{name})"
    )))
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(left, 0, "verify's messages are gone from the queue and its archive");
}

/// The application on Inngest: app `shop`, synced, on the emulator (the account verify shares
/// with it).
async fn inngest_application(db: &redrive_postgres::PgBackend) -> common::InngestApp {
    let shop = common::InngestApp::start(db, "shop").await;
    shop.backend.sync().await.unwrap();
    shop
}

/// `redrive` pointed at `url` on the application's account, verify listening on `listen`.
fn inngest_target(shop: &common::InngestApp, schema: &str, url: &str, listen: std::net::SocketAddr) -> Target {
    Target {
        url: url.to_owned(),
        schema: schema.to_owned(),
        env: shop.env(),
        verify: vec!["--listen".to_owned(), listen.to_string()],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_passes_on_inngest_beside_the_application() {
    let db = database().await;
    let shop = inngest_application(&db).await;
    let (emulator, backend, app_endpoint) = (&shop.emulator, &shop.backend, &shop.endpoint);
    let app = application(backend.clone(), db.clone());
    // Verify's own endpoint on the same account, named with the application's app.
    let listen = free_address();
    let url = format!("inngest+http://{listen}/verify?app=shop");
    verify_beside_the_application(&inngest_target(&shop, db.schema(), &url, listen), backend, app, false).await;
    // The app, in the URL's query that the evidence leaves out, is part of what it holds for.
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verify-evidence").join("inngest+http");
    let found = std::fs::read_dir(&kept)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"));
    let found: Value = serde_json::from_str(&std::fs::read_to_string(found.unwrap()).unwrap()).unwrap();
    assert_eq!(found["identity"]["configuration"]["app"], "shop", "{found:#}");
    assert_eq!(item(&found, "replay", "dedupe")["deliveries"], 1, "{found:#}");
    // Verify's records were kept as its own app's, and are gone too.
    let own = format!("inngest+http://{listen}/verify?app=shop-verify");
    let records = redrive(
        &inngest_target(&shop, db.schema(), &own, listen),
        &["failed", "list", "--state", "all", "--kind", "redrive_verify"],
    );
    assert_eq!(records.status.code(), Some(2), "no record of verify's is left: {}", text(&records));

    // The application's registration is as it synced it; verify ran as an app of its own.
    let functions = emulator.functions();
    let of = |app: &str| functions.iter().filter(|f| f.app == app).map(|f| (f.id.clone(), f.url.clone())).collect();
    let registered: Vec<(String, String)> = of("shop");
    assert_eq!(registered.len(), 2, "{functions:?}");
    assert!(registered.iter().all(|(_, url)| url.starts_with(app_endpoint.as_str())), "{registered:?}");
    let verifier: Vec<(String, String)> = of("shop-verify");
    assert_eq!(verifier.len(), 2, "{functions:?}");
    assert!(verifier.iter().all(|(_, url)| url.starts_with(&format!("http://{listen}/verify"))), "{verifier:?}");
    // The application's function ran its 20 jobs and nothing else: verify's events triggered
    // only verify's function.
    let runs = emulator.runs();
    assert_eq!(runs.iter().filter(|r| r.function_id == "shop-jobs").count(), 20, "{runs:?}");
    assert!(runs.iter().any(|r| r.function_id == "shop-verify-jobs"), "{runs:?}");
    assert!(runs.iter().all(|r| r.function_id != "shop-jobs-failure"), "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_on_inngest_refuses_the_application_s_endpoint_and_one_that_does_not_lead_to_it() {
    let db = database().await;
    let shop = inngest_application(&db).await;
    let (emulator, backend) = (&shop.emulator, &shop.backend);
    let (worker, _) = application(backend.clone(), db.clone());
    let dir = tempfile::tempdir().unwrap();
    let args = vec!["verify".to_owned(), "--evidence".to_owned(), dir.path().to_str().unwrap().to_owned()];
    let run = |target: Target| {
        let args = args.clone();
        tokio::task::spawn_blocking(move || redrive(&target, &args.iter().map(String::as_str).collect::<Vec<_>>()))
    };
    let taken = shop.url();
    let refused = run(inngest_target(&shop, db.schema(), &taken, free_address())).await.unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(text(&refused).contains("a receiver already answers"), "{}", text(&refused));
    let elsewhere = format!("inngest+http://{}/verify?app=shop", free_address());
    let lost = run(inngest_target(&shop, db.schema(), &elsewhere, free_address())).await.unwrap();
    assert_eq!(lost.status.code(), Some(1), "{}", text(&lost));
    assert!(text(&lost).contains("does not lead to --listen"), "{}", text(&lost));
    let bare = run(Target { verify: Vec::new(), ..inngest_target(&shop, db.schema(), &elsewhere, free_address()) });
    let bare = bare.await.unwrap();
    assert_eq!(bare.status.code(), Some(1), "{}", text(&bare));
    assert!(text(&bare).contains("give --listen"), "{}", text(&bare));
    // Nothing was sent or registered: no event, no app of verify's, no evidence.
    assert!(emulator.events().is_empty(), "{:?}", emulator.events());
    assert!(emulator.functions().iter().all(|f| f.app == "shop"));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let stats = worker.shutdown().await;
    assert_eq!(stats.claimed, 0, "{stats:?}");
}
