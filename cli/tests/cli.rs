//! The `redrive` command end to end, as an operator runs it: against PostgreSQL and against SQS
//! (moto) with its records in PostgreSQL, both started by `scripts/services`. A missing service
//! fails the test; it never skips.

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::{database, database_url, redrive_command, sqs_endpoint};

use redrive_core::kit::{Claim, Kinds, RecordStore};
use redrive_core::{Enqueue, FailureRecord, IdempotencyKey, NewJob, Severity};
use redrive_postgres::PgBackend;
use redrive_sqs::{QueueSetup, SqsBackend, SqsConfig};
use serde_json::Value;

/// Runs `redrive ARGS` against `backend` (and its records in `schema`).
fn redrive(backend: &str, schema: &str, args: &[&str]) -> Output {
    redrive_command(backend, schema).args(args).output().expect("the redrive binary runs")
}

fn json(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn job(kind: &str, n: u32) -> NewJob {
    let key = IdempotencyKey::builder(kind).fact("n", n).build().unwrap();
    NewJob::new(kind, key, serde_json::json!({ "n": n, "note": format!("parcel {n}") })).unwrap()
}

/// Jobs that fail for good on `backend`: enqueued, claimed, recorded with `error`.
async fn fail(backend: &PgBackend, jobs: Vec<NewJob>, error: &str) {
    let n = jobs.len();
    backend.enqueue_batch(jobs).await.unwrap();
    let claimed = backend.claim(&Kinds::Any, n, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap();
    assert_eq!(claimed.len(), n);
    for c in &claimed {
        backend.dead_letter(c, error).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_an_operator_lists_reads_discards_replays_and_purges() {
    let db = database().await;
    let (url, schema) = (database_url(), db.schema().to_owned());
    let mut jobs: Vec<NewJob> = (1..=3).map(|n| job("ship", n)).collect();
    // The first with its producer's trace context: its record shows the trace id.
    jobs[0] = jobs[0].clone().with_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    let mut critical = job("charge", 9);
    critical.severity = Severity::Critical;
    jobs.push(critical);
    fail(&db, jobs, "carrier said no\nat line 2").await;

    // list, as JSON and as a table; filters by kind and severity.
    let all = json(&redrive(&url, &schema, &["--json", "failed", "list"]));
    assert_eq!(all.as_array().map(Vec::len), Some(4), "{all}");
    let ship = json(&redrive(&url, &schema, &["--json", "failed", "list", "--kind", "ship"]));
    assert_eq!(ship.as_array().map(Vec::len), Some(3));
    let critical = json(&redrive(&url, &schema, &["--json", "failed", "list", "--severity", "critical"]));
    assert_eq!(critical[0]["key"], "charge:n=9");
    let table = redrive(&url, &schema, &["failed", "list", "--limit", "2"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("ID ") && text.contains("carrier said no") && !text.contains("at line 2"), "{text}");
    assert!(text.contains("2 records; the next page: --after "), "{text}");

    // show: payload, errors, attempts; an unknown id exits 2.
    let id = all[0]["id"].as_str().unwrap().to_owned();
    let shown = redrive(&url, &schema, &["failed", "show", &id]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("\"note\": \"parcel 1\"") && text.contains("attempts      1 of 5"), "{text}");
    assert!(text.contains("trace         4bf92f3577b34da6a3ce929d0e0e4736 (the failing attempt's"), "{text}");
    assert_eq!(all[0]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "{all}");
    assert_eq!(redrive(&url, &schema, &["failed", "show", "no-such-record"]).status.code(), Some(2));

    // discard with reason and name; replay one; counts follow.
    let discarded = json(&redrive(&url, &schema, &["--json", "discard", &id, "--reason", "refunded", "--by", "ada"]));
    assert_eq!((&discarded["state"]["reason"], &discarded["state"]["actor"]), (&"refunded".into(), &"ada".into()));
    let second = all[1]["id"].as_str().unwrap();
    let replayed = json(&redrive(&url, &schema, &["--json", "replay", second, "--by", "ada"]));
    assert_eq!(replayed["replayed"], true, "{replayed}");
    let again = json(&redrive(&url, &schema, &["--json", "replay", second, "--by", "ada"]));
    assert_eq!(again["replayed"], false, "a second replay sends nothing");
    assert_eq!(json(&redrive(&url, &schema, &["--json", "failed", "count"]))["open_records"], 2);
    let stats = json(&redrive(&url, &schema, &["--json", "queue", "stats"]));
    assert_eq!((&stats["queued"], &stats["ready"], &stats["scheduled"]), (&1.into(), &1.into(), &0.into()), "{stats}");
    assert!(stats["oldest_ready_seconds"].as_f64().is_some_and(|s| s >= 0.0), "{stats}");
    assert_eq!(stats["open_records"], 2);
    let back = db.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap();
    assert_eq!(back.len(), 1, "the replayed job is queued once");

    // Nothing matching: exit 2. A bad backend URL: exit 1 and no URL in the message.
    assert_eq!(redrive(&url, &schema, &["failed", "list", "--kind", "nothing"]).status.code(), Some(2));
    let bad = redrive("mysql://root:hunter2@db/app", &schema, &["failed", "count"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(!String::from_utf8_lossy(&bad.stderr).contains("hunter2"));

    // purge everything: records gone, count 0.
    let purged = json(&redrive(&url, &schema, &["--json", "purge", "--older-than", "0s"]));
    assert_eq!(purged["records_purged"], 4, "{purged}");
    assert_eq!(redrive(&url, &schema, &["failed", "list", "--state", "all"]).status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_replay_keeps_its_rate_and_a_dry_run_sends_nothing() {
    let db = database().await;
    let (url, schema) = (database_url(), db.schema().to_owned());
    fail(&db, (1..=6).map(|n| job("ship", n)).collect(), "timeout").await;
    fail(&db, vec![job("charge", 1)], "declined").await;

    let dry = json(&redrive(&url, &schema, &["--json", "replay", "--kind", "ship", "--dry-run"]));
    assert_eq!(dry.as_array().map(Vec::len), Some(6));
    assert_eq!(json(&redrive(&url, &schema, &["--json", "failed", "count"]))["open_records"], 7, "nothing sent");

    // Six at 5 a second: five gaps of 200 ms at least.
    let started = Instant::now();
    let bulk = json(&redrive(&url, &schema, &["--json", "replay", "--kind", "ship", "--rate", "5", "--by", "ada"]));
    let took = started.elapsed();
    assert_eq!((&bulk["replayed"], &bulk["already_closed"]), (&6.into(), &0.into()), "{bulk}");
    assert!(took >= Duration::from_millis(1000), "the rate cap holds: {took:?}");
    assert_eq!(json(&redrive(&url, &schema, &["--json", "failed", "count"]))["open_records"], 1, "only the charge");
    // Run again (as after an interruption): nothing left to replay.
    assert_eq!(redrive(&url, &schema, &["replay", "--kind", "ship", "--by", "ada"]).status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqs_records_are_read_from_the_database_and_a_replay_sends_the_job_back() {
    let db = database().await;
    let schema = db.schema().to_owned();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let name = format!("rdt-cli-{}-{nanos:x}", std::process::id());
    let config = SqsConfig::new(&name)
        .with_endpoint(sqs_endpoint())
        .with_region("us-east-1")
        .with_static_credentials("test", "test")
        .with_max_wait(Duration::ZERO);
    let queue = SqsBackend::setup(config, QueueSetup::default(), db.clone())
        .await
        .unwrap_or_else(|e| panic!("moto's SQS is required (run scripts/test): {e}"));
    let records: Vec<FailureRecord> =
        (1..=2).map(|n| redrive_conformance::sample_record(n, serde_json::json!({ "n": n }))).collect();
    db.keep_records(queue.record_scope(), &records).await.unwrap();

    let backend = format!("sqs://{name}");
    let listed = json(&redrive(&backend, &schema, &["--json", "failed", "list"]));
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    let replay = redrive(&backend, &schema, &["--json", "replay", "m-1", "--by", "ada"]);
    assert_eq!(json(&replay)["replayed"], true);
    let mut back = Vec::new();
    for _ in 0..50 {
        back = queue.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::from_millis(100)).await.unwrap();
        if !back.is_empty() {
            break;
        }
    }
    assert_eq!(back.len(), 1, "the job is back on the queue once");
    assert_eq!(back[0].job.key, records[0].key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_the_file_is_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let file = redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(&path)).await.unwrap();
    file.enqueue_batch((1..=2).map(|n| job("ship", n)).collect()).await.unwrap();
    for c in file.claim(&Kinds::Any, 2, Duration::from_secs(30), Duration::ZERO).await.unwrap() {
        file.dead_letter(&c, "carrier said no").await.unwrap();
    }
    let backend = format!("sqlite://{}", path.display());
    let listed = json(&redrive(&backend, "-", &["--json", "failed", "list"]));
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    let id = listed[0]["id"].as_str().unwrap();
    assert_eq!(json(&redrive(&backend, "-", &["--json", "replay", id, "--by", "ada"]))["replayed"], true);
    let stats = json(&redrive(&backend, "-", &["--json", "queue", "stats"]));
    assert_eq!((&stats["queued"], &stats["open_records"]), (&1.into(), &1.into()), "{stats}");
    let missing = format!("sqlite://{}", dir.path().join("typo.db").display());
    assert_eq!(redrive(&missing, "-", &["failed", "count"]).status.code(), Some(2), "no file is created");
    assert!(!dir.path().join("typo.db").exists());
}

/// A SQLite file with `n` open records of kind `ship`, and its `--backend` URL.
async fn sqlite_records(dir: &tempfile::TempDir, n: u32) -> (redrive_sqlite::SqliteBackend, String) {
    let path = dir.path().join("app.db");
    let file = redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(&path)).await.unwrap();
    file.enqueue_batch((1..=n).map(|n| job("ship", n)).collect()).await.unwrap();
    for c in file.claim(&Kinds::Any, n as usize, Duration::from_secs(30), Duration::ZERO).await.unwrap() {
        file.dead_letter(&c, "carrier said no").await.unwrap();
    }
    (file, format!("sqlite://{}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_every_record_needs_all_and_a_discard_needs_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (_file, backend) = sqlite_records(&dir, 3).await;
    let open = || json(&redrive(&backend, "-", &["--json", "failed", "count"]))["open_records"].clone();

    // No id and no filter: refused, nothing sent.
    let everything = redrive(&backend, "-", &["replay", "--by", "ada"]);
    let said = String::from_utf8_lossy(&everything.stderr);
    assert_eq!(everything.status.code(), Some(1), "{said}");
    assert!(said.contains("--all"), "the error says how to replay everything: {said}");
    assert_eq!(open(), 3, "nothing was replayed");

    // A blank reason: refused, the record stays open.
    let id = json(&redrive(&backend, "-", &["--json", "failed", "list"]))[0]["id"].as_str().unwrap().to_owned();
    for reason in ["", "  \t"] {
        let blank = redrive(&backend, "-", &["discard", &id, "--reason", reason, "--by", "ada"]);
        let said = String::from_utf8_lossy(&blank.stderr);
        assert_eq!(blank.status.code(), Some(1), "a reason of {reason:?} is refused: {said}");
        assert!(said.contains("reason"), "{said}");
    }
    assert_eq!(open(), 3, "nothing was discarded");

    // `--all` says it: every open record, each with who and why.
    let bulk = json(&redrive(&backend, "-", &["--json", "replay", "--all", "--by", "ada", "--reason", "carrier back"]));
    assert_eq!(bulk["replayed"], 3, "{bulk}");
    let closed = json(&redrive(&backend, "-", &["--json", "failed", "list", "--state", "closed"]));
    for record in closed.as_array().unwrap() {
        assert_eq!(record["state"]["state"], "replaying", "{record}");
        assert_eq!((&record["state"]["actor"], &record["state"]["reason"]), (&"ada".into(), &"carrier back".into()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_keeps_who_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let (_file, backend) = sqlite_records(&dir, 1).await;
    let id = json(&redrive(&backend, "-", &["--json", "failed", "list"]))[0]["id"].as_str().unwrap().to_owned();
    let replayed = redrive(&backend, "-", &["--json", "replay", &id, "--by", "grace", "--reason", "fixed in 1.4.2"]);
    assert_eq!(json(&replayed)["replayed"], true);
    let shown = json(&redrive(&backend, "-", &["--json", "failed", "show", &id]));
    assert_eq!(shown["state"]["actor"], "grace", "{shown}");
    assert_eq!(shown["state"]["reason"], "fixed in 1.4.2", "{shown}");
    let text = String::from_utf8_lossy(&redrive(&backend, "-", &["failed", "show", &id]).stdout).into_owned();
    assert!(text.contains("by grace: fixed in 1.4.2"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_blocked_lists_the_order_keys_a_record_holds_until_it_is_discarded() {
    let db = database().await;
    let (url, schema) = (database_url(), db.schema().to_owned());
    assert_eq!(redrive(&url, &schema, &["failed", "blocked"]).status.code(), Some(2), "nothing blocked yet");
    let ordered = |n| job("sync_account", n).with_order_key("account:7").unwrap();
    fail(&db, vec![ordered(1)], "the CRM said no").await;
    db.enqueue_batch(vec![ordered(2), ordered(3)]).await.unwrap();

    let blocked = json(&redrive(&url, &schema, &["--json", "failed", "blocked"]));
    assert_eq!(blocked.as_array().map(Vec::len), Some(1), "{blocked}");
    assert_eq!(blocked[0]["order_key"], "account:7");
    assert_eq!(blocked[0]["key"], "sync_account:n=1");
    assert_eq!(blocked[0]["waiting"], 2, "{blocked}");
    let record = blocked[0]["record"].as_str().unwrap().to_owned();
    let text = String::from_utf8_lossy(&redrive(&url, &schema, &["failed", "blocked"]).stdout).into_owned();
    assert!(text.contains("account:7") && text.contains("sync_account:n=1"), "{text}");
    let held = db.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::from_millis(100)).await.unwrap();
    assert!(held.is_empty(), "the later jobs of the key wait for the record: claimed {held:?}");

    let discarded = redrive(&url, &schema, &["discard", &record, "--reason", "superseded by n=2", "--by", "ada"]);
    assert_eq!(discarded.status.code(), Some(0), "{}", String::from_utf8_lossy(&discarded.stderr));
    assert_eq!(redrive(&url, &schema, &["failed", "blocked"]).status.code(), Some(2), "the discard freed the key");
    let next = db.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::from_millis(100)).await.unwrap();
    let keys: Vec<String> = next.iter().map(|c| c.job.key.to_string()).collect();
    assert_eq!(keys, ["sync_account:n=2"], "one at a time, in enqueue order");
}

/// Records found by their error text and discarded by filter, on PostgreSQL and on SQLite: the
/// text's `%` and `_` are themselves, a bulk discard lists with `--dry-run`, refuses without
/// `--yes` or a reason, closes only what matched (each with who and why), and exits 2 when nothing
/// does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_found_by_their_error_and_discarded_by_filter() {
    let pg = database().await;
    fail(&pg, (1..=3).map(|n| job("mail", n)).collect(), "SMTP 550: mailbox full (quota 100%)").await;
    fail(&pg, (4..=5).map(|n| job("mail", n)).collect(), "SMTP 421: try again later").await;
    let url = database_url();
    let schema = pg.schema().to_owned();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let file = redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(&path)).await.unwrap();
    file.enqueue_batch((1..=5).map(|n| job("mail", n)).collect()).await.unwrap();
    for c in file.claim(&Kinds::Any, 5, Duration::from_secs(30), Duration::ZERO).await.unwrap() {
        let n = c.job.payload["n"].as_u64().unwrap();
        let error = if n <= 3 { "SMTP 550: mailbox full (quota 100%)" } else { "SMTP 421: try again later" };
        file.dead_letter(&c, error).await.unwrap();
    }
    let sqlite = format!("sqlite://{}", path.display());

    for (backend, schema) in [(url.as_str(), schema.as_str()), (sqlite.as_str(), "-")] {
        let run = |args: &[&str]| redrive(backend, schema, args);
        let listed = |text: &str| json(&run(&["--json", "failed", "list", "--error", text])).as_array().unwrap().len();
        assert_eq!(listed("MAILBOX FULL"), 3, "{backend}: letters without case");
        assert_eq!(listed("quota 100%)"), 3, "{backend}: % is itself");
        assert_eq!(
            run(&["failed", "list", "--error", "mailbox_full"]).status.code(),
            Some(2),
            "{backend}: _ is itself"
        );
        assert_eq!(run(&["failed", "list", "--error", "550%full"]).status.code(), Some(2), "{backend}: % is itself");

        let bulk = ["discard", "--error", "mailbox full", "--reason", "the addresses are gone", "--by", "ada"];
        let dry = json(&run(&[&["--json"][..], &bulk, &["--dry-run"]].concat()));
        assert_eq!(dry.as_array().map(Vec::len), Some(3), "{backend}: the dry run lists what matched: {dry}");
        let unsaid = run(&bulk);
        let said = String::from_utf8_lossy(&unsaid.stderr);
        assert_eq!(unsaid.status.code(), Some(1), "{backend}: without --yes: {said}");
        assert!(said.contains("--yes") && said.contains("3 open records"), "{backend}: {said}");
        let no_reason = run(&["discard", "--error", "mailbox full", "--reason", " ", "--by", "ada", "--yes"]);
        assert_eq!(no_reason.status.code(), Some(1), "{backend}: a blank reason is refused");
        let nothing = run(&["discard", "--by", "ada", "--reason", "oops", "--yes"]);
        assert_eq!(nothing.status.code(), Some(1), "{backend}: no filter and no --all is refused");
        let open = || json(&run(&["--json", "failed", "count"]))["open_records"].clone();
        assert_eq!(open(), 5, "{backend}: nothing closed yet");

        let done = json(&run(&[&["--json"][..], &bulk, &["--yes"]].concat()));
        assert_eq!(done["discarded"], 3, "{backend}: {done}");
        assert_eq!(open(), 2, "{backend}: the others stay open");
        let closed = json(&run(&["--json", "failed", "list", "--state", "closed", "--error", "MAILBOX"]));
        for record in closed.as_array().unwrap() {
            assert_eq!(record["state"]["state"], "discarded", "{record}");
            let who = (&record["state"]["actor"], &record["state"]["reason"]);
            assert_eq!(who, (&"ada".into(), &"the addresses are gone".into()), "{backend}");
        }
        assert_eq!(run(&[&bulk[..], &["--yes"]].concat()).status.code(), Some(2), "{backend}: nothing left to discard");
    }
}
