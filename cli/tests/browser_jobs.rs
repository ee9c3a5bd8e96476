//! The dashboard's Jobs page (`redrive serve`) in a real browser: Debian's chromium driven by
//! playwright-core, both installed by `scripts/services`, over PostgreSQL. The script
//! (tests/browser/jobs.cjs) signs in, lists and filters the live jobs, opens one and cancels it
//! after the confirmation; this test checks the result in the database. Screenshots land in
//! `$CARGO_TARGET_TMPDIR/dashboard-screenshots`. A missing browser fails the test; it never skips.

mod common;

use std::time::Duration;

use common::{database, database_url, serve};

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{Enqueue, Enqueued, IdempotencyKey, JobId, JobState, Jobs, NewJob};

fn job(kind: &str, n: u32) -> NewJob {
    let key = IdempotencyKey::builder(kind).fact("n", n).build().unwrap();
    let payload = serde_json::json!({ "n": n, "note": "<script>alert(\"payload\")</script>" });
    NewJob::new(kind, key, payload).unwrap()
}

fn tool(name: &str, default: &str) -> String {
    let value = std::env::var(name).unwrap_or_else(|_| default.into());
    assert!(std::path::Path::new(&value).exists(), "{name}={value} is missing: run scripts/services start");
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lists_opens_and_cancels_a_job_in_chromium() {
    let chromium = tool("REDRIVE_CHROMIUM", "/usr/bin/chromium");
    let playwright = tool("REDRIVE_PLAYWRIGHT", "/var/cache/redrive-tools/browser/node_modules");
    let db = database().await;
    // One failed, one running, one queued, one scheduled for tomorrow.
    db.enqueue_batch(vec![job("charge", 1), job("ship", 2)]).await.unwrap();
    let claimed = db.claim(&Kinds::Any, 2, Duration::from_secs(300), Duration::from_secs(1)).await.unwrap();
    db.dead_letter(&claimed[0], "card declined").await.unwrap();
    db.enqueue(job("ship", 3)).await.unwrap();
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    db.enqueue(job("send_digest", 4).run_at(tomorrow)).await.unwrap();

    let token = "browser-test-token-0123456789";
    let (_served, url) = serve(&database_url(), db.schema(), Some(token));
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/jobs.cjs");
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

    // What the clicks did, read from the database: the scheduled job cancelled with who and why.
    let id = JobId(done["cancelled"].as_str().unwrap().into());
    let cancelled = db.get_job(&id).await.unwrap();
    assert_eq!(cancelled.kind, "send_digest");
    assert_eq!(cancelled.state, JobState::Cancelled);
    let audit = cancelled.cancelled.expect("the cancel's audit");
    assert_eq!((audit.reason.as_str(), audit.actor.as_str()), ("the campaign was withdrawn", "ada"));
    let again = db.enqueue(job("send_digest", 4)).await.unwrap();
    assert!(matches!(&again, Enqueued::Duplicate { id: dup, .. } if *dup == id), "its key stays taken: {again:?}");
    for name in ["01-list", "02-scheduled", "03-job", "04-cancel-confirm", "05-cancelled", "06-cancelled-list"] {
        assert!(shots.join(format!("jobs-{name}.png")).exists(), "screenshot {name}");
    }
}
