//! The four checks of reliable jobs on PostgreSQL, with the rows that prove them.
//!
//! Run: `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p redrive-examples --example postgres
//! --features postgres`
//! (it uses, and first empties, the schema `redrive_example`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive::alert::BoxFuture;
use redrive::postgres::sqlx::{self, Row};
use redrive::postgres::{PgBackend, PgConfig};
use redrive::{
    Alert, AlertSink, Backoff, DeadLetter, Enqueue, FailureQuery, Job, JobContext, JobError, KeyBuilder, NewJob,
    Replay, RunningWorker, Worker,
};
use serde::{Deserialize, Serialize};

/// Grant a month's credits to an account: once per account and billing period.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GrantCredits {
    account: String,
    period: String,
    credits: u32,
}

impl Job for GrantCredits {
    const KIND: &'static str = "grant_credits";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("account", &self.account).fact("period", &self.period)
    }
}

#[derive(Default)]
struct Billing {
    /// One entry per credit grant made: the account and period.
    grants: Mutex<Vec<String>>,
    down: AtomicBool,
}

impl Billing {
    fn total(&self) -> usize {
        self.grants.lock().unwrap().len()
    }

    fn for_account(&self, account: &str) -> usize {
        self.grants.lock().unwrap().iter().filter(|g| g.starts_with(&format!("{account} "))).count()
    }
}

struct Alerts(Arc<Mutex<Vec<Alert>>>);

impl AlertSink for Alerts {
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, redrive::Result<()>> {
        self.0.lock().unwrap().push(alert.clone());
        Box::pin(async { Ok(()) })
    }
}

fn worker(backend: &PgBackend, billing: &Arc<Billing>, alerts: &Arc<Mutex<Vec<Alert>>>) -> RunningWorker {
    let billing = Arc::clone(billing);
    Worker::builder(backend.clone(), backend.clone())
        .handle::<GrantCredits>(move |job: GrantCredits, _ctx: JobContext| {
            let billing = Arc::clone(&billing);
            async move {
                if billing.down.load(Ordering::SeqCst) {
                    return Err(JobError::retry("billing API timed out after 10 s"));
                }
                billing.grants.lock().unwrap().push(format!("{} {}", job.account, job.period));
                Ok(serde_json::json!({ "granted": job.credits }))
            }
        })
        .backoff(Backoff { base: Duration::from_millis(20), max: Duration::from_millis(200), ..Backoff::default() })
        .alert(Alerts(Arc::clone(alerts)))
        .build()
        .start()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = PgConfig::from_env()?.with_schema("redrive_example");
    let backend = PgBackend::connect(config).await?;
    sqlx::query("DROP SCHEMA IF EXISTS redrive_example CASCADE").execute(backend.pool()).await?;
    backend.migrate().await?;
    let (billing, alerts) = (Arc::new(Billing::default()), Arc::new(Mutex::new(Vec::new())));
    let rows_for = |key: String| {
        let pool = backend.pool().clone();
        async move {
            sqlx::query(
                "SELECT id, status, attempts, result::text FROM redrive_example.jobs WHERE idempotency_key = $1",
            )
            .bind(key)
            .fetch_all(&pool)
            .await
        }
    };

    println!("== 1. replay: the same job enqueued twice");
    let grant = GrantCredits { account: "acct_7".into(), period: "2026-11".into(), credits: 500 };
    let job = NewJob::from_job(&grant)?;
    println!("   enqueue #1 -> {:?}", backend.enqueue(job.clone()).await?);
    println!(
        "   enqueue #2 -> {:?}   (INSERT … ON CONFLICT DO NOTHING returned no row)",
        backend.enqueue(NewJob::from_job(&grant)?).await?
    );
    let w = worker(&backend, &billing, &alerts);
    wait_until("the grant", || billing.total() == 1).await;
    w.shutdown().await;
    for row in rows_for(job.key.to_string()).await? {
        println!(
            "   jobs row for {}: id {} status {} attempts {} result {}  <- the key's one ledger entry",
            job.key,
            row.get::<i64, _>(0),
            row.get::<String, _>(1),
            row.get::<i32, _>(2),
            row.get::<Option<String>, _>(3).unwrap_or_default()
        );
    }
    println!("   credits granted to acct_7: {}", billing.for_account("acct_7"));

    println!("\n== 2. race: two producers and two workers, one account-period");
    let race = GrantCredits { account: "acct_8".into(), period: "2026-11".into(), credits: 500 };
    let (a, b) = tokio::join!(backend.enqueue(NewJob::from_job(&race)?), backend.enqueue(NewJob::from_job(&race)?));
    println!("   producer A -> {:?}, producer B -> {:?}", a?, b?);
    println!("   (the recorded skip: one producer's INSERT … ON CONFLICT DO NOTHING returned no row)");
    let (w1, w2) = (worker(&backend, &billing, &alerts), worker(&backend, &billing, &alerts));
    wait_until("the second grant", || billing.total() == 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s1, s2) = (w1.shutdown().await, w2.shutdown().await);
    println!(
        "   worker 1 claimed {}, worker 2 claimed {} (FOR UPDATE SKIP LOCKED: one holder)",
        s1.claimed, s2.claimed
    );
    let key = NewJob::from_job(&race)?.key;
    println!(
        "   job rows for {key}: {}; credits granted to acct_8: {}",
        rows_for(key.to_string()).await?.len(),
        billing.for_account("acct_8")
    );

    println!("\n== 3. exhaust: the billing API is down");
    billing.down.store(true, Ordering::SeqCst);
    let failing = GrantCredits { account: "acct_9".into(), period: "2026-11".into(), credits: 500 };
    backend.enqueue(NewJob::from_job(&failing)?).await?;
    let w = worker(&backend, &billing, &alerts);
    wait_until("the alert", || !alerts.lock().unwrap().is_empty()).await;
    w.shutdown().await;
    let row = sqlx::query(
        "SELECT id, kind, idempotency_key, payload::text, last_error, attempts, cap, jsonb_array_length(errors), state \
         FROM redrive_example.failed_jobs",
    )
    .fetch_one(backend.pool())
    .await?;
    println!("   failed_jobs row {}:", row.get::<i64, _>(0));
    println!("     kind {}  key {}", row.get::<String, _>(1), row.get::<String, _>(2));
    println!("     payload  {}", row.get::<String, _>(3));
    println!("     error    {}", row.get::<String, _>(4));
    println!(
        "     attempts {} of {} ({} errors kept)  state {}",
        row.get::<i32, _>(5),
        row.get::<i32, _>(6),
        row.get::<i32, _>(7),
        row.get::<String, _>(8)
    );
    for alert in alerts.lock().unwrap().iter() {
        println!("   ALERT at {}: {}", alert.raised_at.format("%Y-%m-%d %H:%M:%S%.3f UTC"), alert.summary());
    }

    println!("\n== 4. recover: billing is back; replay the record");
    billing.down.store(false, Ordering::SeqCst);
    let record = backend.list(&FailureQuery::open()).await?.remove(0);
    println!("   replay {} -> {:?}", record.id, backend.replay(&record.id, "the API is back", "example").await?);
    let w = worker(&backend, &billing, &alerts);
    wait_until("the replayed grant", || billing.total() == 3).await;
    println!("   replay {} again -> {:?}", record.id, backend.replay(&record.id, "the API is back", "example").await?);
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.shutdown().await;
    let key = NewJob::from_job(&failing)?.key;
    let rows = rows_for(key.to_string()).await?;
    println!(
        "   jobs row for {key}: status {}; credits granted to acct_9: {}",
        rows[0].get::<String, _>(1),
        billing.for_account("acct_9")
    );
    println!(
        "   record state: {:?}; open records: {}",
        backend.get(&record.id).await?.state,
        backend.count_open().await?
    );
    Ok(())
}
