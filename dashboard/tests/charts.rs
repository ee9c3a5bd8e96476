//! The Charts page over HTTP, on PostgreSQL: bars for the records opened and closed this hour,
//! one per kind, and the queue's depth from the dashboard's own samples.

mod common;

use std::time::Duration;

use common::{database, fail, job, serve};
use redrive_core::{DeadLetter, Enqueue, FailureQuery, Replay, Severity};
use redrive_dashboard::Dashboard;
use reqwest::StatusCode;

/// The SVG whose id is `id`, whole.
fn svg<'a>(page: &'a str, id: &str) -> &'a str {
    let start = page.find(&format!("<svg id=\"{id}\"")).unwrap_or_else(|| panic!("no chart {id}: {page}"));
    let end = page[start..].find("</svg>").expect("the chart ends") + start;
    &page[start..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_show_this_hours_records_by_kind_and_the_sampled_queue() {
    // All in one hour: not across its end.
    use chrono::Timelike;
    let now = chrono::Utc::now();
    if now.minute() == 59 && now.second() >= 45 {
        tokio::time::sleep(Duration::from_secs(20)).await;
    }
    let db = database().await;
    fail(&db, (1..=3).map(|n| job("ship", n, Severity::Error)).collect(), "carrier timeout").await;
    fail(&db, vec![job("charge", 9, Severity::Critical)], "card declined").await;
    let records = db.list(&FailureQuery::open()).await.unwrap();
    let ship = records.iter().find(|r| r.kind == "ship").unwrap();
    let charge = records.iter().find(|r| r.kind == "charge").unwrap();
    db.discard(&ship.id, "refunded", "ada").await.unwrap();
    db.replay(&charge.id, "card fixed", "ada").await.unwrap(); // the charge job is queued again
    db.enqueue(job("ship", 4, Severity::Error)).await.unwrap();
    let url = serve(Dashboard::new(db.clone()).with_sample_every(Duration::from_secs(1)).unwrap()).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // the first sample is taken at once

    let page = reqwest::get(format!("{url}/charts")).await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("default-src 'none'"));
    let page = page.text().await.unwrap();
    assert!(!page.contains("<script"), "no script: {page}");

    let opened = svg(&page, "opened");
    assert_eq!(opened.matches("class=\"bar\"").count(), 2, "a bar per kind in this hour: {opened}");
    assert!(opened.contains(">ship: 3 opened"), "{opened}");
    assert!(opened.contains(">charge: 1 opened"), "{opened}");
    assert_eq!(opened.matches("class=\"key\"").count(), 2, "a legend entry per kind");
    assert_eq!(opened.matches("class=\"hour\"").count(), 8, "every third UTC hour labelled");
    let closed = svg(&page, "closed");
    assert_eq!(closed.matches("class=\"bar\"").count(), 2, "{closed}");
    assert!(closed.contains(">ship: 1 closed") && closed.contains(">charge: 1 closed"), "{closed}");
    assert!(page.contains("4 in the last 24 hours") && page.contains("2 in the last 24 hours"), "{page}");
    assert!(!page.contains("id=\"truncated\""));

    // Two queued (the replayed charge, ship 4), both ready, none running.
    let depth = svg(&page, "depth");
    assert!(depth.contains("UTC: queued 2, ready 2, running 0</title>"), "{depth}");
    assert!(page.contains("samples the queue every 1s"), "{page}");
    let oldest = svg(&page, "oldest");
    assert!(oldest.contains("<title>") && oldest.contains("oldest ready job&#39;s wait"), "{oldest}");

    // Sampled again since: still one column (5 minutes), a dot per series.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let page = reqwest::get(format!("{url}/charts")).await.unwrap().text().await.unwrap();
    let count = page.split(" samples)").next().and_then(|t| t.rsplit('(').next()).and_then(|n| n.parse::<u32>().ok());
    assert!(count.is_some_and(|n| n >= 2), "{count:?}");
    let depth = svg(&page, "depth");
    assert_eq!(depth.matches("class=\"point\"").count(), 3, "{depth}");
    assert_eq!(depth.matches("class=\"hover\"").count(), 1, "{depth}");
}
