//! A single-binary app on SQLite: its jobs, their keys and its own table in one file, kept across
//! restarts. Kill it mid-run (`kill -9`) and run it again: it goes on where it stopped, and every
//! job is done once.
//!
//! Run: `cargo run -p redrive-examples --example sqlite --features sqlite -- [PATH] [JOBS]` (default: a file in the
//! temporary directory, 200 jobs).

use std::time::Duration;

use redrive::sqlite::sqlx::{self, Row};
use redrive::sqlite::{EffectOnce, SqliteBackend, SqliteConfig};
use redrive::{DeadLetter, Enqueue, Job, JobContext, JobError, KeyBuilder, NewJob, QueueStats, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};

/// Grant an account its monthly credits: once per account, whatever happens to the process.
#[derive(Debug, Serialize, Deserialize)]
struct GrantCredits {
    account: u32,
}

impl Job for GrantCredits {
    const KIND: &'static str = "grant_credits";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("account", self.account).fact("month", "2026-12")
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().map_or_else(|| std::env::temp_dir().join("redrive-example.db"), Into::into);
    let jobs: u32 = args.next().map_or(Ok(200), |n| n.parse())?;
    let backend = SqliteBackend::open(SqliteConfig::new(&path)).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS grants (account INTEGER NOT NULL)").execute(backend.pool()).await?;

    // Enqueued on every start: the keys make a restart's second enqueue a no-op.
    let batch = (1..=jobs).map(|account| NewJob::from_job(&GrantCredits { account })).collect::<Result<_, _>>()?;
    let created = backend.enqueue_batch(batch).await?.iter().filter(|e| e.is_created()).count();
    let before = backend.counts().await?;
    println!("{}: {created} jobs new, {} waiting", path.display(), before.unfinished());

    let app = backend.clone();
    let worker = Worker::builder(backend.clone(), backend.clone())
        .config(WorkerConfig { concurrency: 8, lease: Duration::from_secs(5), ..WorkerConfig::default() })
        .handle::<GrantCredits>(move |job: GrantCredits, ctx: JobContext| {
            let app = app.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await; // the rest of the work
                // The grant and its key commit together: a crash before the commit leaves
                // neither, after it both.
                let mut tx = app.pool().begin_with("BEGIN IMMEDIATE").await.map_err(JobError::retry)?;
                if app.effect_once(&mut tx, &ctx.key).await.map_err(JobError::retry)? == EffectOnce::Fresh {
                    sqlx::query("INSERT INTO grants (account) VALUES (?1)")
                        .bind(job.account)
                        .execute(&mut *tx)
                        .await
                        .map_err(JobError::retry)?;
                }
                tx.commit().await.map_err(JobError::retry)?;
                Ok::<_, JobError>(())
            }
        })
        .build()
        .start();
    loop {
        let counts = backend.counts().await?;
        println!("  {} left", counts.unfinished());
        if counts.is_drained() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    worker.shutdown().await;

    let row = sqlx::query("SELECT count(*), count(DISTINCT account) FROM grants").fetch_one(backend.pool()).await?;
    let (grants, accounts): (i64, i64) = (row.get(0), row.get(1));
    println!("{grants} grants for {accounts} accounts, {} failure records", backend.count_open().await?);
    if grants != i64::from(jobs) || accounts != i64::from(jobs) {
        return Err(format!("expected {jobs} grants, one per account").into());
    }
    println!("every job done once");
    Ok(())
}
