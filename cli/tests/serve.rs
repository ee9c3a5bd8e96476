//! `redrive serve` on the brokers, SQS (moto), Azure Queue Storage (Azurite) and Inngest (the
//! emulator) with their records in PostgreSQL, and on a SQLite file. The dashboard lists what the queues dead-lettered, discards
//! one and replays the other through its forms, its process restarted keeps the audit trail, and
//! the replayed job is back on the queue once; a kind paused on its Kinds page is paused in the
//! file, or in the broker's records database. The browser
//! test (browser.rs) covers the pages themselves on PostgreSQL.

mod common;

use std::time::Duration;

use common::{database, serve_in, sqs_endpoint, unique};
use redrive_azure::{AzureBackend, QueueOptions};
use redrive_core::kit::{Claim, Kinds};
use redrive_core::{DeadLetter, Enqueue, FailureQuery, Flow, IdempotencyKey, NewJob, RecordState};
use redrive_sqs::{QueueSetup, SqsBackend, SqsConfig};
use reqwest::StatusCode;

/// Two jobs dead-lettered on `queue` the way a worker does it: claimed, then recorded.
async fn two_failures(queue: &(impl Enqueue + Claim)) {
    let jobs = (1..=2).map(|n| {
        let key = IdempotencyKey::builder("ship").fact("parcel", n).build().unwrap();
        NewJob::new("ship", key, serde_json::json!({ "parcel": n })).unwrap()
    });
    queue.enqueue_batch(jobs.collect()).await.unwrap();
    let mut claimed = Vec::new();
    for _ in 0..50 {
        claimed
            .extend(queue.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::from_millis(100)).await.unwrap());
        if claimed.len() == 2 {
            break;
        }
    }
    assert_eq!(claimed.len(), 2);
    for c in &claimed {
        queue.dead_letter(c, "carrier said no").await.unwrap();
    }
}

/// Through the dashboard: the overview counts two open records; one is discarded with a reason
/// and a name, the other replayed. The dashboard restarted, its audit trail still says who did
/// what and why. Returns the replayed record's key.
async fn operate(backend: &str, schema: &str, queue: &impl DeadLetter, env: &[(&str, String)]) -> IdempotencyKey {
    let (served, url) = serve_in(backend, schema, None, &[], env);
    let http =
        reqwest::Client::builder().cookie_store(true).redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let overview = http.get(format!("{url}/")).send().await.unwrap().text().await.unwrap();
    assert!(overview.contains("<th>open records</th><td class=\"n\">2</td>"), "{overview}");
    let records = queue.list(&FailureQuery::open()).await.unwrap();
    let (discard, replay) = (&records[0].id.0, &records[1].id.0);
    let page = http.get(format!("{url}/records/{discard}")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("carrier said no") && page.contains("parcel"), "{page}");

    let confirm = http.get(format!("{url}/records/{discard}/discard")).send().await.unwrap().text().await.unwrap();
    let start = confirm.find("name=\"csrf\" value=\"").unwrap() + 19;
    let csrf = confirm[start..].split('"').next().unwrap();
    let form = [("csrf", csrf), ("reason", "sent by hand"), ("by", "ada")];
    let done = http.post(format!("{url}/records/{discard}/discard")).form(&form).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let form = [("csrf", csrf), ("by", "ada"), ("reason", "carrier back")];
    let done = http.post(format!("{url}/records/{replay}/replay")).form(&form).send().await;
    assert_eq!(done.unwrap().headers()["location"], format!("/records/{replay}?done=replayed").as_str());

    assert!(matches!(queue.get(&records[0].id).await.unwrap().state, RecordState::Discarded { .. }));
    assert!(matches!(queue.get(&records[1].id).await.unwrap().state, RecordState::Replaying { .. }));

    drop(served); // the process is killed
    let (_served, url) = serve_in(backend, schema, None, &[], env);
    let audit = reqwest::get(format!("{url}/audit")).await.unwrap().text().await.unwrap();
    assert!(audit.contains("discarded by ada: sent by hand"), "{audit}");
    assert!(audit.contains("replayed by ada: carrier back"), "{audit}");
    records[1].key.clone()
}

/// Through the dashboard's Kinds page: a pause with a reason and a name, kept in `store` (the
/// file, or a broker's records database), then a resume.
async fn pause_and_resume(backend: &str, schema: &str, store: &impl Flow, env: &[(&str, String)]) {
    let (_served, url) = serve_in(backend, schema, None, &[], env);
    let http =
        reqwest::Client::builder().cookie_store(true).redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let confirm = http.get(format!("{url}/kinds/pause?kind=ship")).send().await.unwrap().text().await.unwrap();
    let start = confirm.find("name=\"csrf\" value=\"").unwrap() + 19;
    let csrf = confirm[start..].split('"').next().unwrap();
    let form = [("csrf", csrf), ("kind", "ship"), ("reason", "carrier down"), ("by", "ada")];
    let done = http.post(format!("{url}/kinds/pause")).form(&form).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let paused = store.kinds().await.unwrap().into_iter().find_map(|k| k.paused.filter(|_| k.kind == "ship"));
    assert_eq!(paused.map(|p| (p.by, p.reason)), Some(("ada".into(), "carrier down".into())));
    let form = [("csrf", csrf), ("kind", "ship"), ("by", "ada")];
    http.post(format!("{url}/kinds/resume")).form(&form).send().await.unwrap();
    assert!(store.kinds().await.unwrap().is_empty(), "resumed");
}

async fn back_once(queue: &impl Claim, key: &IdempotencyKey) {
    let mut back = Vec::new();
    for _ in 0..30 {
        back.extend(queue.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::from_millis(100)).await.unwrap());
        if !back.is_empty() {
            tokio::time::sleep(Duration::from_millis(300)).await;
            back.extend(queue.claim(&Kinds::Any, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap());
            break;
        }
    }
    assert_eq!(back.len(), 1, "the replayed job is back once");
    assert_eq!(&back[0].job.key, key, "with its original key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_an_sqs_queue() {
    let db = database().await;
    let name = format!("rdt-serve-{}", unique().replace('_', "-"));
    let config = SqsConfig::new(&name)
        .with_endpoint(sqs_endpoint())
        .with_region("us-east-1")
        .with_static_credentials("test", "test")
        .with_max_wait(Duration::ZERO);
    let queue = SqsBackend::setup(config, QueueSetup::default(), db.clone())
        .await
        .unwrap_or_else(|e| panic!("moto's SQS is required (run scripts/test): {e}"));
    two_failures(&queue).await;
    let key = operate(&format!("sqs://{name}"), db.schema(), &queue, &[]).await;
    back_once(&queue, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_an_azure_queue() {
    let db = database().await;
    let name = format!("rdt-serve-{}", unique().replace('_', "-"));
    let account = common::azure_account();
    let queue = AzureBackend::setup(&account, &name, QueueOptions::default(), db.clone())
        .await
        .unwrap_or_else(|e| panic!("Azurite is required (run scripts/test): {e}"));
    two_failures(&queue).await;
    let key = operate(&format!("azure://{name}"), db.schema(), &queue, &[]).await;
    back_once(&queue, &key).await;
    pause_and_resume(&format!("azure://{name}"), db.schema(), &db, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_a_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let file = redrive_sqlite::SqliteBackend::open(redrive_sqlite::SqliteConfig::new(&path)).await.unwrap();
    two_failures(&file).await;
    let key = operate(&format!("sqlite://{}", path.display()), "-", &file, &[]).await;
    back_once(&file, &key).await;
    pause_and_resume(&format!("sqlite://{}", path.display()), "-", &file, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_an_inngest_app() {
    let db = database().await;
    let shop = common::InngestApp::start(&db, "shop").await;
    shop.backend.sync().await.unwrap();
    let (url, env) = (shop.url(), shop.env());
    two_failures(&shop.backend).await;
    let key = operate(&url, db.schema(), &shop.backend, &env).await;
    // The replay is a new event: Inngest calls the endpoint, and the job is there to claim.
    back_once(&shop.backend, &key).await;
    pause_and_resume(&url, db.schema(), &db, &env).await;
}
