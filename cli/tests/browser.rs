//! The dashboard (`redrive serve`) in a real browser: Debian's chromium driven by
//! playwright-core, both installed by `scripts/services`, over PostgreSQL. The script
//! (tests/browser/dashboard.cjs) signs in, reads, discards one record and replays another, finds
//! records by their error text and discards them together, signs out; this test checks the results
//! in the database. Screenshots land in
//! `$CARGO_TARGET_TMPDIR/dashboard-screenshots`. A missing browser fails the test; it never skips.

mod common;

use std::time::Duration;

use common::{database, database_url, serve};

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{DeadLetter, Enqueue, FailureId, IdempotencyKey, NewJob, RecordState, Severity};

fn job(kind: &str, n: u32, severity: Severity) -> NewJob {
    let key = IdempotencyKey::builder(kind).fact("n", n).build().unwrap();
    let payload = serde_json::json!({ "n": n, "note": "<script>alert(\"payload\")</script>" });
    let mut job = NewJob::new(kind, key, payload).unwrap();
    job.severity = severity;
    job
}

fn tool(name: &str, default: &str) -> String {
    let value = std::env::var(name).unwrap_or_else(|_| default.into());
    assert!(std::path::Path::new(&value).exists(), "{name}={value} is missing: run scripts/services start");
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_signs_in_reads_discards_and_replays_in_chromium() {
    let chromium = tool("REDRIVE_CHROMIUM", "/usr/bin/chromium");
    let playwright = tool("REDRIVE_PLAYWRIGHT", "/var/cache/redrive-tools/browser/node_modules");
    let db = database().await;
    let mut jobs: Vec<NewJob> = (1..=3).map(|n| job("ship", n, Severity::Error)).collect();
    jobs.push(job("charge", 9, Severity::Critical));
    db.enqueue_batch(jobs).await.unwrap();
    for claimed in db.claim(&Kinds::Any, 4, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap() {
        db.dead_letter(&claimed, "carrier said no").await.unwrap();
    }
    // Two more, found by their error text and discarded together.
    db.enqueue_batch((1..=2).map(|n| job("mail", n, Severity::Warning)).collect()).await.unwrap();
    for claimed in db.claim(&Kinds::Any, 2, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap() {
        db.dead_letter(&claimed, "SMTP 550: mailbox full (quota 100%)").await.unwrap();
    }

    let token = "browser-test-token-0123456789";
    let (_served, url) = serve(&database_url(), db.schema(), Some(token));
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/dashboard.cjs");
    let run = tokio::process::Command::new("node")
        .arg(script)
        .env("DASHBOARD", &url)
        .env("TOKEN", token)
        .env("REDRIVE_CHROMIUM", chromium)
        .env("REDRIVE_PLAYWRIGHT", playwright)
        .env("SCREENSHOTS", &shots)
        .output();
    let out =
        tokio::time::timeout(Duration::from_secs(120), run).await.expect("the browser finishes").expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the browser script failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let done: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();

    // What the clicks did, read from the database.
    let discarded = db.get(&FailureId(done["discarded"].as_str().unwrap().into())).await.unwrap();
    match discarded.state {
        RecordState::Discarded { reason, actor, .. } => {
            assert_eq!((reason.as_str(), actor.as_str()), ("refunded by hand", "ada"))
        }
        other => panic!("not discarded: {other:?}"),
    }
    let replayed = db.get(&FailureId(done["replayed"].as_str().unwrap().into())).await.unwrap();
    assert!(
        matches!(&replayed.state, RecordState::Replaying { reason, actor, .. } if reason == "carrier back" && actor == "grace"),
        "{:?}",
        replayed.state
    );
    let back = db.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap();
    assert_eq!(back.len(), 1, "one job back on the queue");
    assert_eq!(back[0].job.key, replayed.key, "with its original key");
    for id in done["bulk_discarded"].as_array().unwrap() {
        let record = db.get(&FailureId(id.as_str().unwrap().into())).await.unwrap();
        assert_eq!(record.kind, "mail", "only the records whose error matched");
        assert!(
            matches!(&record.state, RecordState::Discarded { reason, actor, .. } if reason == "the addresses are gone" && actor == "ada"),
            "{:?}",
            record.state
        );
    }
    assert_eq!(db.count_open().await.unwrap(), 2);
    for name in [
        "02-overview",
        "04-record",
        "06-discarded",
        "08-replayed",
        "09-audit",
        "10-sign-out",
        "11-error-search",
        "12-bulk-discard-confirm",
        "13-bulk-discarded",
    ] {
        assert!(shots.join(format!("{name}.png")).exists(), "screenshot {name}");
    }
}
