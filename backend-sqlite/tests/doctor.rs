//! `redrive_sqlite::doctor`: a file a backend opened passes every rule; each broken setup fails
//! its rule with the fix named, and leaves the others as they were; the file is never changed by
//! the look.

mod common;

use std::path::Path;
use std::time::Duration;

use common::backend;
use redrive_core::doctor::{Check, Expect, Status};
use redrive_core::kit::{Claim, Kinds};
use redrive_core::{Enqueue, IdempotencyKey, NewJob};
use redrive_sqlite::SqliteBackend;

async fn exec(db: &SqliteBackend, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn doctor(path: &Path) -> Vec<Check> {
    redrive_sqlite::doctor(path, &Expect::default()).await.unwrap()
}

/// The check of `rule` whose finding mentions `about`, with `status` and, unless it passed, `fix`.
fn holds(checks: &[Check], rule: &str, about: &str, status: Status, fix: &str) {
    let found = checks.iter().find(|c| c.rule == rule && c.found.contains(about));
    let found = found.unwrap_or_else(|| panic!("{rule} about {about} is checked: {checks:#?}"));
    assert_eq!(found.status, status, "{found:#?}");
    if status != Status::Pass {
        assert!(found.fix.as_deref().is_some_and(|f| f.contains(fix)), "{rule} names {fix}: {found:#?}");
    }
}

fn others_pass(checks: &[Check], except: &str) {
    for check in checks.iter().filter(|c| c.rule != except) {
        assert_eq!(check.status, Status::Pass, "only {except} is broken: {check:#?}");
    }
}

fn job(n: u32) -> NewJob {
    NewJob::new("ship", IdempotencyKey::builder("ship").fact("n", n).build().unwrap(), serde_json::json!({ "n": n }))
        .unwrap()
}

#[tokio::test]
async fn a_file_a_backend_opened_passes_every_rule() {
    let (db, dir) = backend().await;
    db.enqueue(job(1)).await.unwrap();
    let checks = doctor(&dir.path().join("jobs.db")).await;
    others_pass(&checks, "none");
    assert_eq!(checks.iter().filter(|c| c.rule == "sqlite.unique-key").count(), 4, "{checks:#?}");
    let missing = redrive_sqlite::doctor(&dir.path().join("none.db"), &Expect::default()).await;
    assert!(missing.is_err() && !dir.path().join("none.db").exists(), "a missing file is an error, not created");
}

#[tokio::test]
async fn a_missing_migration_fails_and_the_look_does_not_migrate() {
    let (db, dir) = backend().await;
    exec(&db, "DELETE FROM _sqlx_migrations WHERE version = 11").await;
    let checks = doctor(&dir.path().join("jobs.db")).await;
    holds(&checks, "sqlite.migrations", "[11]", Status::Fail, "SqliteBackend::open");
    others_pass(&checks, "sqlite.migrations");
    let again = doctor(&dir.path().join("jobs.db")).await;
    holds(&again, "sqlite.migrations", "[11]", Status::Fail, "SqliteBackend::open");
}

#[tokio::test]
async fn a_key_table_without_its_unique_index_fails_with_the_fix() {
    let (db, dir) = backend().await;
    // An index cannot be dropped from under a primary key: the table is rebuilt without it.
    exec(
        &db,
        "CREATE TABLE redrive_applied_effects_new (idempotency_key TEXT NOT NULL, applied_at INTEGER NOT NULL); \
         INSERT INTO redrive_applied_effects_new SELECT idempotency_key, applied_at FROM redrive_applied_effects; \
         DROP TABLE redrive_applied_effects; \
         ALTER TABLE redrive_applied_effects_new RENAME TO redrive_applied_effects;",
    )
    .await;
    let checks = doctor(&dir.path().join("jobs.db")).await;
    holds(&checks, "sqlite.unique-key", "redrive_applied_effects", Status::Fail, "CREATE UNIQUE INDEX");
    holds(&checks, "sqlite.unique-key", "redrive_jobs", Status::Pass, "");
}

#[tokio::test]
async fn a_damaged_page_fails_the_integrity_rule() {
    let (db, dir) = backend().await;
    for n in 0..400 {
        db.enqueue(job(n)).await.unwrap();
    }
    let root: i64 = sqlx::query_scalar("SELECT rootpage FROM sqlite_schema WHERE name = 'redrive_jobs'")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size").fetch_one(db.pool()).await.unwrap();
    exec(&db, "PRAGMA wal_checkpoint(TRUNCATE)").await;
    db.pool().close().await;
    drop(db);
    // The table's root page: its cell pointers scrambled.
    let path = dir.path().join("jobs.db");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = ((root - 1) * page_size) as usize + 12;
    bytes[at..at + 64].iter_mut().for_each(|b| *b = 0xA5);
    std::fs::write(&path, bytes).unwrap();
    let checks = doctor(&path).await;
    holds(&checks, "sqlite.integrity", "quick_check", Status::Fail, "backup");
}

#[tokio::test]
async fn an_open_record_never_alerted_fails_and_passes_once_alerted() {
    let (db, dir) = backend().await;
    let path = dir.path().join("jobs.db");
    db.enqueue(job(1)).await.unwrap();
    let claimed = db.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap().remove(0);
    let record = db.dead_letter(&claimed, "card declined").await.unwrap().expect("written at once");
    holds(&doctor(&path).await, "alerts.open-records", "open records", Status::Pass, "");
    exec(&db, "UPDATE redrive_failed_jobs SET last_failed_at = last_failed_at - 3600000").await;
    let checks = doctor(&path).await;
    holds(&checks, "alerts.open-records", "never alerted", Status::Fail, "alert sink");
    others_pass(&checks, "alerts.open-records");
    let key = format!("redrive_alert:record={}:sink=0", record.id);
    exec(
        &db,
        &format!(
            "INSERT INTO redrive_processed_keys (idempotency_key, fingerprint, provider_key, done_at) \
             VALUES ('{key}', 'x', 'p', 1)"
        ),
    )
    .await;
    holds(&doctor(&path).await, "alerts.open-records", "each alerted", Status::Pass, "");
}

#[tokio::test]
async fn an_open_record_alerted_only_to_the_log_warns() {
    let (db, dir) = backend().await;
    let path = dir.path().join("jobs.db");
    db.enqueue(job(1)).await.unwrap();
    let claimed = db.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap().remove(0);
    let record = db.dead_letter(&claimed, "card declined").await.unwrap().expect("written at once");
    // As a worker given no sink marks the alert it logged (`TracingAlerts`).
    let key = format!("redrive_alert:record={}:sink=0", record.id);
    exec(
        &db,
        &format!(
            "INSERT INTO redrive_processed_keys (idempotency_key, fingerprint, provider_key, done_at, result) \
             VALUES ('{key}', 'x', 'p', 1, '{{\"sink\":\"tracing\"}}')"
        ),
    )
    .await;
    holds(
        &doctor(&path).await,
        "alerts.open-records",
        "only to the workers' log",
        Status::Warn,
        "WorkerBuilder::alert",
    );
}

#[tokio::test]
async fn a_file_out_of_wal_mode_warns() {
    let (db, dir) = backend().await;
    let path = dir.path().join("jobs.db");
    holds(&doctor(&path).await, "sqlite.wal", "WAL", Status::Pass, "");
    db.pool().close().await;
    drop(db);
    // As a tool that opened the file in the rollback journal would leave it.
    let mut conn =
        sqlx::ConnectOptions::connect(&sqlx::sqlite::SqliteConnectOptions::new().filename(&path)).await.unwrap();
    sqlx::raw_sql("PRAGMA journal_mode=DELETE").execute(&mut conn).await.unwrap();
    drop(conn);
    let checks = doctor(&path).await;
    holds(&checks, "sqlite.wal", "journal_mode delete", Status::Warn, "SqliteBackend::open");
    others_pass(&checks, "sqlite.wal");
}
