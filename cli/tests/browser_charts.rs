//! The dashboard's Charts page (`redrive serve --sample-every 1s`) in a real browser: Debian's
//! chromium driven by playwright-core, both installed by `scripts/services`, over PostgreSQL. The
//! script (tests/browser/charts.cjs) signs in, opens Charts from the header and checks that every
//! chart is drawn with its counts in `<title>`s; this test checks those counts against the
//! records it made. Screenshots land in `$CARGO_TARGET_TMPDIR/dashboard-screenshots`
//! (`charts-*.png`). A missing browser fails the test; it never skips.

mod common;

use std::time::Duration;

use common::{database, database_url, serve_with};

use redrive_core::kit::{Claim, Kinds};
use redrive_core::{DeadLetter, Enqueue, FailureQuery, IdempotencyKey, NewJob, Replay};

fn job(kind: &str, n: u32) -> NewJob {
    let key = IdempotencyKey::builder(kind).fact("n", n).build().unwrap();
    NewJob::new(kind, key, serde_json::json!({ "n": n })).unwrap()
}

fn tool(name: &str, default: &str) -> String {
    let value = std::env::var(name).unwrap_or_else(|_| default.into());
    assert!(std::path::Path::new(&value).exists(), "{name}={value} is missing: run scripts/services start");
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reads_the_charts_in_chromium() {
    let chromium = tool("REDRIVE_CHROMIUM", "/usr/bin/chromium");
    let playwright = tool("REDRIVE_PLAYWRIGHT", "/var/cache/redrive-tools/browser/node_modules");
    // All in one hour: not across its end.
    use chrono::Timelike;
    let now = chrono::Utc::now();
    if now.minute() == 59 && now.second() >= 40 {
        tokio::time::sleep(Duration::from_secs(25)).await;
    }
    let db = database().await;
    // Four ship, two charge and one send_digest failed for good; one ship discarded, one charge
    // replayed; three jobs waiting.
    let failing: Vec<NewJob> = (1..=4)
        .map(|n| job("ship", n))
        .chain((5..=6).map(|n| job("charge", n)))
        .chain([job("send_digest", 7)])
        .collect();
    db.enqueue_batch(failing).await.unwrap();
    let claimed = db.claim(&Kinds::Any, 7, Duration::from_secs(300), Duration::from_secs(1)).await.unwrap();
    for c in &claimed {
        db.dead_letter(c, "gave up").await.unwrap();
    }
    let records = db.list(&FailureQuery::open()).await.unwrap();
    let first = |kind: &str| records.iter().find(|r| r.kind == kind).unwrap().id.clone();
    db.discard(&first("ship"), "refunded", "ada").await.unwrap();
    db.replay(&first("charge"), "card fixed", "ada").await.unwrap();
    db.enqueue_batch((8..=9).map(|n| job("ship", n)).collect()).await.unwrap();

    let token = "browser-test-token-0123456789";
    let (_served, url) = serve_with(&database_url(), db.schema(), Some(token), &["--sample-every", "1s"]);
    tokio::time::sleep(Duration::from_secs(2)).await; // a few samples
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/charts.cjs");
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
    let read: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();

    // What the browser's hover texts say, against the records made above.
    let titles = |id: &str| -> Vec<String> {
        read[id].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_owned()).collect()
    };
    let opened = titles("opened");
    for (kind, n) in [("ship", 4), ("charge", 2), ("send_digest", 1)] {
        assert!(opened.iter().any(|t| t.starts_with(&format!("{kind}: {n} opened "))), "{kind}: {opened:?}");
    }
    assert_eq!(opened.len(), 3, "{opened:?}");
    let closed = titles("closed");
    assert_eq!(closed.len(), 2, "{closed:?}");
    assert!(
        closed.iter().any(|t| t.starts_with("ship: 1 closed "))
            && closed.iter().any(|t| t.starts_with("charge: 1 closed "))
    );
    let depth = titles("depth");
    assert!(depth.iter().all(|t| t.ends_with("queued 3, ready 3, running 0")), "{depth:?}");
    for name in ["01-page", "02-opened", "03-depth"] {
        assert!(shots.join(format!("charts-{name}.png")).exists(), "screenshot {name}");
    }
}
