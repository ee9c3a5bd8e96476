//! A replay followed to its confirmation on the dashboard (`redrive serve`) in a real browser:
//! Debian's chromium driven by playwright-core, both installed by `scripts/services`, over
//! PostgreSQL. The script (tests/browser/replays.cjs) replays a record; this test plays the
//! worker between its steps (the replayed job fails again, then the next replay's job is done),
//! and the script reads each state and follows the links. Screenshots land in
//! `$CARGO_TARGET_TMPDIR/dashboard-screenshots`. A missing browser fails the test; it never skips.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{database, database_url, serve};
use redrive_core::kit::{Claim, Kinds};
use redrive_core::{DeadLetter, Enqueue, FailureQuery, IdempotencyKey, NewJob, RecordState, Replay};
use redrive_postgres::PgBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn tool(name: &str, default: &str) -> String {
    let value = std::env::var(name).unwrap_or_else(|_| default.into());
    assert!(std::path::Path::new(&value).exists(), "{name}={value} is missing: run scripts/services start");
    value
}

fn ship(parcel: u32, address: &str) -> NewJob {
    let key = IdempotencyKey::builder("ship").fact("parcel", parcel).build().unwrap();
    NewJob::new("ship", key, serde_json::json!({ "parcel": parcel, "address": address })).unwrap()
}

/// Claims the one queued job, as a worker would, and fails it for good or completes it.
async fn work(db: &PgBackend, fail: bool) {
    let claimed = db.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::from_secs(2)).await.unwrap();
    assert_eq!(claimed.len(), 1, "the replayed job is queued once");
    if fail {
        db.dead_letter(&claimed[0], "carrier 503").await.unwrap();
    } else {
        db.complete(&claimed[0].lease, None).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_follows_a_replay_to_its_confirmation_in_chromium() {
    let chromium = tool("REDRIVE_CHROMIUM", "/usr/bin/chromium");
    let playwright = tool("REDRIVE_PLAYWRIGHT", "/var/cache/redrive-tools/browser/node_modules");
    let db = database().await;
    db.enqueue_batch(vec![ship(7, "1 Main St"), ship(8, "malformed")]).await.unwrap();
    for claimed in db.claim(&Kinds::Any, 2, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap() {
        db.dead_letter(&claimed, "carrier said no").await.unwrap();
    }
    let records = db.list(&FailureQuery::open()).await.unwrap();
    let id_of = |parcel: u32| records.iter().find(|r| r.payload["parcel"] == parcel).unwrap().id.clone();
    let (first, amended) = (id_of(7), id_of(8));
    let fixed = serde_json::json!({ "parcel": 8, "address": "8 Elm St" });
    db.replay_amended(&amended, &fixed, "typo in the address", "ada").await.unwrap();
    work(&db, false).await;

    let token = "browser-test-token-0123456789";
    let (_served, url) = serve(&database_url(), db.schema(), Some(token));
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/replays.cjs");
    let mut node = tokio::process::Command::new("node")
        .arg(script)
        .env("DASHBOARD", &url)
        .env("TOKEN", token)
        .env("REDRIVE_CHROMIUM", chromium)
        .env("REDRIVE_PLAYWRIGHT", playwright)
        .env("SCREENSHOTS", &shots)
        .env("FIRST", &first.0)
        .env("AMENDED", &amended.0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let mut answer = node.stdin.take().unwrap();
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();
    let mut steps = Vec::new();
    let talk = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let Some(name) = line.strip_prefix("step ") else { continue };
            steps.push(name.to_owned());
            // The worker's part: the first replay's job fails again, the second's is done.
            work(&db, name == "replayed").await;
            answer.write_all(b"ok\n").await.unwrap();
        }
    };
    let finished = tokio::time::timeout(Duration::from_secs(120), talk).await;
    if finished.is_err() {
        let _ = node.start_kill();
    }
    let out = node.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(finished.is_ok(), "the browser did not finish in 2 minutes:\n{stderr}");
    assert!(out.status.success(), "the browser script failed:\n{stderr}");
    assert_eq!(steps, ["replayed", "replayed-again"]);

    let old = db.get(&first).await.unwrap();
    let RecordState::FailedAgain { next, actor, .. } = &old.state else { panic!("not failed again: {:?}", old.state) };
    assert_eq!(actor, "grace");
    let new = db.get(next).await.unwrap();
    assert!(matches!(&new.state, RecordState::Confirmed { actor, .. } if actor == "grace"), "{:?}", new.state);
    assert_eq!(new.replay_of.as_ref(), Some(&first));
    for name in ["01-replaying", "02-failed-again", "03-next-record", "04-confirmed", "05-amended", "06-audit"] {
        assert!(shots.join(format!("replays-{name}.png")).exists(), "screenshot {name}");
    }
}
