//! `redrive kind …` end to end, as an operator runs it, on PostgreSQL and on a SQLite file: each
//! change made by the command is read back through a second handle on the same database, the
//! store the workers read; bad input is refused with its reason and changes nothing. On SQS
//! (moto), the store is the records database.

mod common;

use std::process::Output;
use std::time::Duration;

use chrono::{DateTime, Utc};

use common::{database, database_url, redrive_command};
use redrive_core::{BREAKER, Flow, FlowAction, KindFlow, Limits, Paused, Rate};
use redrive_postgres::{PgBackend, PgConfig};
use serde_json::Value;

fn redrive(backend: &str, schema: &str, args: &[&str]) -> Output {
    redrive_command(backend, schema).args(args).output().expect("the redrive binary runs")
}

fn stdout(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(out: &Output) -> Value {
    let text = stdout(out);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Exit 1 with `message` on stderr.
fn refused(out: &Output, message: &str) {
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.starts_with("redrive: ") && said.contains(message), "expected {message:?}: {said}");
}

async fn kind(store: &impl Flow, kind: &str) -> Option<KindFlow> {
    store.kinds().await.unwrap().into_iter().find(|k| k.kind == kind)
}

async fn paused(store: &impl Flow, name: &str) -> Option<Paused> {
    kind(store, name).await.and_then(|k| k.paused)
}

/// An operator's session on the database `backend` names, `store` a second handle on it.
async fn pause_limit_resume(backend: &str, schema: &str, store: &impl Flow) {
    let run = |args: &[&str]| redrive(backend, schema, args);
    assert_eq!(run(&["kind", "list"]).status.code(), Some(2), "nothing paused or limited");

    // Pause: the store says who and why, the list shows them.
    let out = run(&["kind", "pause", "charge_order", "--reason", "provider down", "--by", "ada"]);
    assert_eq!(stdout(&out).trim(), "paused charge_order by ada: provider down");
    let p = paused(store, "charge_order").await.expect("paused in the store");
    assert_eq!((p.by.as_str(), p.reason.as_str(), p.probe_at), ("ada", "provider down", None));
    let list = json(&run(&["--json", "kind", "list"]));
    assert_eq!(list[0]["kind"], "charge_order", "{list}");
    assert_eq!((&list[0]["paused"]["by"], &list[0]["paused"]["reason"]), (&"ada".into(), &"provider down".into()));
    assert!(list[0]["paused"]["at"].is_string() && list[0]["paused"]["probe_at"].is_null(), "{list}");
    let table = stdout(&run(&["kind", "list"]));
    assert!(table.starts_with("KIND ") && table.contains("NEXT PROBE (UTC)"), "{table}");
    let row = table.lines().find(|l| l.starts_with("charge_order")).expect("a row");
    assert!(row.contains("paused") && row.contains("ada") && row.ends_with("provider down"), "{row}");

    // A second pause: the first stands, and the command says whose it is.
    let again = stdout(&run(&["kind", "pause", "charge_order", "--reason", "also down", "--by", "grace"]));
    assert!(again.contains("was paused already by ada") && again.contains("nothing changed"), "{again}");
    assert_eq!(paused(store, "charge_order").await.unwrap().by, "ada");

    // Limits: those given change, the others stay; `none` removes one.
    let set = json(&run(&[
        "--json",
        "kind",
        "limit",
        "charge_order",
        "--concurrency",
        "5",
        "--rate",
        "100/1s",
        "--by",
        "grace",
    ]));
    assert_eq!((&set["limits"]["concurrency"], &set["limits"]["rate"]), (&5.into(), &"100/1s".into()), "{set}");
    let more = stdout(&run(&["kind", "limit", "charge_order", "--key-rate", "10/1s", "--by", "grace"]));
    assert_eq!(more.trim(), "charge_order: 5 at once, 100/1s, 10/1s per key (before: 5 at once, 100/1s)");
    run(&["kind", "limit", "charge_order", "--rate", "none", "--key-concurrency", "2", "--by", "grace"]);
    let expected =
        Limits { concurrency: Some(5), rate: None, key_concurrency: Some(2), key_rate: Some(Rate::per_second(10)) };
    assert_eq!(kind(store, "charge_order").await.unwrap().limits, expected);

    // Bad input: refused with why, and nothing changes, not even the history.
    let history = store.events(None, 100).await.unwrap();
    refused(&run(&["kind", "pause", "ship", "--reason", "  ", "--by", "ada"]), "--reason is required");
    refused(&run(&["kind", "pause", "ship", "--reason", "down", "--by", ""]), "--by is required");
    refused(&run(&["kind", "pause", " ", "--reason", "down", "--by", "ada"]), "a job kind is required");
    refused(&run(&["kind", "limit", "charge_order", "--concurrency", "0", "--by", "ada"]), "pause it instead");
    refused(&run(&["kind", "limit", "charge_order", "--key-concurrency", "0", "--by", "ada"]), "pause it instead");
    refused(&run(&["kind", "limit", "charge_order", "--rate", "0/1s", "--by", "ada"]), "a count of 1 or more");
    refused(&run(&["kind", "limit", "charge_order", "--key-rate", "fast", "--by", "ada"]), "expected COUNT/PERIOD");
    refused(&run(&["kind", "limit", "charge_order", "--concurrency", "lots", "--by", "ada"]), "a whole number");
    refused(&run(&["kind", "limit", "charge_order", "--by", "ada"]), "give a limit");
    refused(&run(&["kind", "resume", "charge_order", "--by", " "]), "--by is required");
    assert_eq!(paused(store, "ship").await, None);
    assert_eq!(kind(store, "charge_order").await.unwrap().limits, expected);
    assert!(paused(store, "charge_order").await.is_some(), "still paused");
    assert_eq!(store.events(None, 100).await.unwrap(), history, "nothing new in the history");

    // Resume; a second resume changes nothing.
    assert_eq!(stdout(&run(&["kind", "resume", "charge_order", "--by", "grace"])).trim(), "resumed charge_order");
    assert_eq!(paused(store, "charge_order").await, None);
    let again = json(&run(&["--json", "kind", "resume", "charge_order", "--by", "grace"]));
    assert_eq!(again["changed"], false, "{again}");

    // Cleared: a kind with neither pause nor limits is not listed.
    run(&["kind", "limit", "charge_order", "--clear", "--by", "grace"]);
    assert_eq!(kind(store, "charge_order").await, None);
    assert_eq!(run(&["kind", "list"]).status.code(), Some(2));

    // The history, newest first, with who did each.
    let events = json(&run(&["--json", "kind", "history", "charge_order"]));
    let said: Vec<(&str, &str)> =
        events.as_array().unwrap().iter().map(|e| (e["action"].as_str().unwrap(), e["by"].as_str().unwrap())).collect();
    let expected = [
        ("limits", "grace"),
        ("resumed", "grace"),
        ("limits", "grace"),
        ("limits", "grace"),
        ("limits", "grace"),
        ("paused", "ada"),
    ];
    assert_eq!(said, expected);
    assert_eq!(events[5]["detail"], "provider down");
    assert_eq!(events[0]["detail"], "no limits");
    let stored: Vec<FlowAction> = store.events(None, 2).await.unwrap().iter().map(|e| e.action).collect();
    assert_eq!(stored, [FlowAction::Limits, FlowAction::Resumed], "the store's own history agrees");
    let two = stdout(&run(&["kind", "history", "--limit", "2"]));
    assert!(two.starts_with("AT (UTC) ") && two.lines().count() == 3, "{two}");
    assert_eq!(run(&["kind", "history", "ship"]).status.code(), Some(2), "no history for ship");

    // A circuit breaker's pause: listed with its next probe; a person may resume it.
    store.pause("send_mail", "5 failures in a row", BREAKER, Some(Duration::from_secs(300))).await.unwrap();
    let list = json(&run(&["--json", "kind", "list"]));
    assert_eq!((&list[0]["kind"], &list[0]["paused"]["by"]), (&"send_mail".into(), &"breaker".into()), "{list}");
    let probe: DateTime<Utc> = list[0]["paused"]["probe_at"].as_str().expect("a probe time").parse().unwrap();
    assert!(probe > Utc::now() + chrono::Duration::seconds(240), "{probe}");
    let table = stdout(&run(&["kind", "list"]));
    let row = table.lines().find(|l| l.starts_with("send_mail")).expect("a row");
    assert!(row.contains("breaker") && row.contains(&probe.format("%Y-%m-%d %H:%M:%S").to_string()), "{row}");
    stdout(&run(&["kind", "resume", "send_mail", "--by", "ada"]));
    assert_eq!(paused(store, "send_mail").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_an_operator_pauses_limits_and_resumes_a_kind() {
    let db = database().await;
    let other = PgConfig::new(database_url()).with_schema(db.schema()).with_max_connections(2);
    let other = PgBackend::connect(other).await.unwrap();
    pause_limit_resume(&database_url(), db.schema(), &other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_an_operator_pauses_limits_and_resumes_a_kind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let file = redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(&path)).await.unwrap();
    pause_limit_resume(&format!("sqlite://{}", path.display()), "-", &file).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqs_the_records_database_is_the_flow_store() {
    let db = database().await;
    let name = format!("rdt-kind-{}", common::unique().replace('_', "-"));
    let config = redrive_sqs::SqsConfig::new(&name)
        .with_endpoint(common::sqs_endpoint())
        .with_region("us-east-1")
        .with_static_credentials("test", "test");
    redrive_sqs::SqsBackend::setup(config, redrive_sqs::QueueSetup::default(), db.clone())
        .await
        .unwrap_or_else(|e| panic!("moto's SQS is required (run scripts/test): {e}"));
    let backend = format!("sqs://{name}");
    let out = redrive(&backend, db.schema(), &["kind", "pause", "ship", "--reason", "carrier down", "--by", "ada"]);
    assert_eq!(stdout(&out).trim(), "paused ship by ada: carrier down");
    let p = paused(&db, "ship").await.expect("paused in the records database");
    assert_eq!((p.by.as_str(), p.reason.as_str()), ("ada", "carrier down"));
    stdout(&redrive(&backend, db.schema(), &["kind", "resume", "ship", "--by", "ada"]));
    assert_eq!(paused(&db, "ship").await, None);
}
