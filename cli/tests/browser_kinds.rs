//! The dashboard's Kinds page (`redrive serve`) in a real browser: Debian's chromium driven by
//! playwright-core, both installed by `scripts/services`, over PostgreSQL. The script
//! (tests/browser/kinds.cjs) signs in, pauses a kind with a reason, limits it and resumes it;
//! after each step it waits while this test reads the store through a handle of its own.
//! Screenshots land in `$CARGO_TARGET_TMPDIR/dashboard-screenshots`. A missing browser fails the
//! test; it never skips.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{database, database_url, serve};
use redrive_core::{Flow, FlowAction, KindFlow, Limits, Rate};
use redrive_postgres::PgBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn tool(name: &str, default: &str) -> String {
    let value = std::env::var(name).unwrap_or_else(|_| default.into());
    assert!(std::path::Path::new(&value).exists(), "{name}={value} is missing: run scripts/services start");
    value
}

async fn charge_order(store: &PgBackend) -> Option<KindFlow> {
    store.kinds().await.unwrap().into_iter().find(|k| k.kind == "charge_order")
}

/// What the store must say after the browser's step `name`; why not, if it does not.
async fn agrees(store: &PgBackend, name: &str) -> Result<(), String> {
    let flow = charge_order(store).await;
    let paused = flow.as_ref().and_then(|k| k.paused.clone());
    let limits = flow.as_ref().map(|k| k.limits).unwrap_or_default();
    let ok = match name {
        "paused" => paused.as_ref().is_some_and(|p| p.by == "ada" && p.reason == "provider down since 14:02"),
        "limited" => {
            paused.is_some()
                && limits == Limits { concurrency: Some(5), rate: Some(Rate::per_second(100)), ..Limits::default() }
        }
        "resumed" => paused.is_none() && limits.concurrency == Some(5),
        other => return Err(format!("an unknown step {other}")),
    };
    if ok { Ok(()) } else { Err(format!("after {name} the store has {flow:?}")) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_limits_and_resumes_a_kind_in_chromium() {
    let chromium = tool("REDRIVE_CHROMIUM", "/usr/bin/chromium");
    let playwright = tool("REDRIVE_PLAYWRIGHT", "/var/cache/redrive-tools/browser/node_modules");
    let db = database().await;
    let token = "browser-test-token-0123456789";
    let (_served, url) = serve(&database_url(), db.schema(), Some(token));
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/kinds.cjs");
    let mut node = tokio::process::Command::new("node")
        .arg(script)
        .env("DASHBOARD", &url)
        .env("TOKEN", token)
        .env("REDRIVE_CHROMIUM", chromium)
        .env("REDRIVE_PLAYWRIGHT", playwright)
        .env("SCREENSHOTS", &shots)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let mut answer = node.stdin.take().unwrap();
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();

    // Each step the browser finished, checked in the store before it goes on.
    let mut steps = Vec::new();
    let mut disagreed = None;
    let talk = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let Some(name) = line.strip_prefix("step ") else { continue };
            steps.push(name.to_owned());
            match agrees(&db, name).await {
                Ok(()) => answer.write_all(b"ok\n").await.unwrap(),
                Err(why) => {
                    let _ = answer.write_all(format!("{why}\n").as_bytes()).await;
                    disagreed = Some(why);
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), talk).await.expect("the browser finishes");
    let out = node.wait_with_output().await.unwrap();
    assert_eq!(disagreed, None);
    assert!(out.status.success(), "the browser script failed:\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(steps, ["paused", "limited", "resumed"]);

    let events = db.events(None, 10).await.unwrap();
    let said: Vec<(&str, FlowAction, &str)> =
        events.iter().map(|e| (e.kind.as_str(), e.action, e.by.as_str())).collect();
    let expected = [
        ("charge_order", FlowAction::Resumed, "grace"),
        ("charge_order", FlowAction::Limits, "ada"),
        ("charge_order", FlowAction::Paused, "ada"),
    ];
    assert_eq!(said, expected, "only the operator's changes: the forged pause of ship was refused");
    for name in ["01-none-paused", "02-pause-confirm", "03-paused", "04-limits", "05-resumed"] {
        assert!(shots.join(format!("kinds-{name}.png")).exists(), "screenshot {name}");
    }
}
