//! Schedulers on PostgreSQL: two of them over several periods of a one-second cron make one job
//! per period; a missed period is caught up once or skipped, as configured.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redrive_core::{Job, KeyBuilder};
use redrive_postgres::sqlx::{self, AssertSqlSafe, Row};
use redrive_postgres::{PgBackend, PgConfig};
use redrive_schedule::{Missed, Scheduler};
use serde::{Deserialize, Serialize};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

async fn database() -> PgBackend {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let schema = format!("rdt_{}_{}_{nanos:x}_cron", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let backend = PgBackend::connect(PgConfig::new(url()).with_schema(schema).with_max_connections(3))
        .await
        .expect("PostgreSQL is required (run scripts/test)");
    backend.migrate().await.expect("migrate");
    backend
}

/// The nightly rollup of one ledger.
#[derive(Serialize, Deserialize)]
struct Rollup {
    ledger: u32,
}

impl Job for Rollup {
    const KIND: &'static str = "rollup";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("ledger", self.ledger)
    }
}

/// The periods of the jobs enqueued, in order.
async fn periods(db: &PgBackend) -> Vec<String> {
    let sql = format!("SELECT idempotency_key FROM \"{}\".jobs ORDER BY idempotency_key", db.schema());
    let rows = sqlx::query(AssertSqlSafe(sql)).fetch_all(db.pool()).await.unwrap();
    rows.iter()
        .map(|r| r.get::<String, _>(0))
        .map(|key| key.rsplit_once("period=").map(|(_, p)| p.to_owned()).unwrap_or(key))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_on_one_postgres_make_one_job_per_period() {
    let first = database().await;
    let config = PgConfig::new(url()).with_schema(first.schema()).with_max_connections(3);
    let second = PgBackend::connect(config).await.unwrap(); // another machine's scheduler
    let every_second = |queue: PgBackend| {
        Scheduler::new(queue).every("* * * * * *", chrono_tz::UTC, Missed::Skip, |_| Rollup { ledger: 7 }).unwrap()
    };
    let window = || tokio::time::sleep(Duration::from_millis(4500));
    tokio::join!(every_second(first.clone()).run_until(window()), every_second(second).run_until(window()));

    let periods = periods(&first).await;
    assert!((4..=5).contains(&periods.len()), "one job per second for 4.5 s: {periods:?}");
    let parse = |p: &String| chrono::NaiveDateTime::parse_from_str(p, redrive_schedule::PERIOD_FORMAT);
    let times: Vec<chrono::NaiveDateTime> =
        periods.iter().map(|p| parse(p).unwrap_or_else(|e| panic!("{p}: {e}"))).collect();
    for pair in times.windows(2) {
        assert_eq!((pair[1] - pair[0]).num_seconds(), 1, "consecutive periods, none twice, none missed: {periods:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_period_is_caught_up_once_or_skipped() {
    // Midnight on the first of January: this year's is past, and the next far away.
    let yearly = "0 0 0 1 1 *";
    let db = database().await;
    let briefly = || tokio::time::sleep(Duration::from_millis(300));
    let skip = Scheduler::new(db.clone()).every(yearly, chrono_tz::UTC, Missed::Skip, |_| Rollup { ledger: 1 });
    skip.unwrap().run_until(briefly()).await;
    assert!(periods(&db).await.is_empty(), "skipped");

    for _ in 0..2 {
        let catch_up =
            Scheduler::new(db.clone()).every(yearly, chrono_tz::UTC, Missed::CatchUpLast, |_| Rollup { ledger: 1 });
        catch_up.unwrap().run_until(briefly()).await;
    }
    let year = chrono::Datelike::year(&chrono::Utc::now());
    assert_eq!(periods(&db).await, [format!("{year}0101T000000Z")], "the last missed period, once");

    let bad = Scheduler::new(db.clone()).every("not cron", chrono_tz::UTC, Missed::Skip, |_| Rollup { ledger: 1 });
    assert_eq!(bad.err().map(|e| e.kind()), Some(redrive_core::ErrorKind::Config));
}
