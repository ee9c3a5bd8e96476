//! `PgBackend::doctor`: a migrated schema passes every rule but the server-wide autovacuum one,
//! which says what this server has; each broken setup fails its rule with the fix named, and
//! leaves the other rules as they were.

mod common;

use std::time::Duration;

use common::{backend, charge};
use redrive_core::doctor::{Check, Expect, Status};
use redrive_core::kit::{Claim, Kinds};
use redrive_core::{Enqueue, Worker};
use redrive_postgres::PgBackend;

async fn exec(db: &PgBackend, sql: &str) {
    let sql = sql.replace("{s}", &format!("\"{}\"", db.schema()));
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone())).execute(db.pool()).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

fn of<'a>(checks: &'a [Check], rule: &str) -> Vec<&'a Check> {
    checks.iter().filter(|c| c.rule == rule).collect()
}

/// Every check of `rule` has `status`; a failing one names `fix`.
fn holds(checks: &[Check], rule: &str, status: Status, fix: &str) {
    let found = of(checks, rule);
    assert!(!found.is_empty(), "{rule} is checked: {checks:#?}");
    assert!(found.iter().any(|c| c.status == status), "{rule} should be {status:?}: {found:#?}");
    if status != Status::Pass {
        assert!(
            found.iter().any(|c| c.fix.as_deref().is_some_and(|f| f.contains(fix))),
            "{rule} names {fix}: {found:#?}"
        );
    }
}

async fn server_autovacuum(db: &PgBackend) -> Status {
    let on: String = sqlx::query_scalar("SELECT current_setting('autovacuum')").fetch_one(db.pool()).await.unwrap();
    if on == "on" { Status::Pass } else { Status::Fail }
}

/// The rules that stay passing whatever the broken setup, but `except`.
fn others_pass(checks: &[Check], except: &str) {
    for check in checks.iter().filter(|c| c.rule != except && c.rule != "pg.autovacuum") {
        assert_eq!(check.status, Status::Pass, "only {except} is broken: {check:#?}");
    }
}

#[tokio::test]
async fn a_migrated_schema_passes_and_the_server_setting_is_read() {
    let db = backend("doctor_ok").await;
    let checks = db.doctor(&Expect::default()).await.unwrap();
    others_pass(&checks, "none");
    assert_eq!(of(&checks, "pg.unique-key").len(), 4, "each key the conflicts rely on: {checks:#?}");
    // This machine's PostgreSQL runs with autovacuum off (for the benchmarks): said as it is.
    holds(&checks, "pg.autovacuum", server_autovacuum(&db).await, "postgresql.conf");
}

#[tokio::test]
async fn a_missing_migration_fails_with_the_fix() {
    let db = backend("doctor_migr").await;
    exec(&db, "DELETE FROM {s}._sqlx_migrations WHERE version = 13").await;
    let checks = db.doctor(&Expect::default()).await.unwrap();
    holds(&checks, "pg.migrations", Status::Fail, "PgBackend::migrate");
    assert!(of(&checks, "pg.migrations")[0].found.contains("13"), "{checks:#?}");
    others_pass(&checks, "pg.migrations");
}

#[tokio::test]
async fn a_dropped_or_invalid_unique_index_fails_with_the_fix() {
    let db = backend("doctor_uniq").await;
    exec(&db, "ALTER TABLE {s}.job_keys DROP CONSTRAINT job_keys_pkey").await;
    let checks = db.doctor(&Expect::default()).await.unwrap();
    holds(&checks, "pg.unique-key", Status::Fail, "ADD PRIMARY KEY (idempotency_key)");
    others_pass(&checks, "pg.unique-key");
    // A duplicate key row, then a unique index built concurrently: it fails and stays, invalid.
    exec(&db, "INSERT INTO {s}.job_keys (idempotency_key, fingerprint) VALUES ('a:n=1', 'x'), ('a:n=1', 'x')").await;
    let build =
        format!("CREATE UNIQUE INDEX CONCURRENTLY job_keys_again ON \"{}\".job_keys (idempotency_key)", db.schema());
    assert!(sqlx::raw_sql(sqlx::AssertSqlSafe(build)).execute(db.pool()).await.is_err(), "the build fails");
    let checks = db.doctor(&Expect::default()).await.unwrap();
    holds(&checks, "pg.unique-key", Status::Fail, "REINDEX INDEX CONCURRENTLY");
    assert!(of(&checks, "pg.unique-key").iter().any(|c| c.found.contains("job_keys_again")), "{checks:#?}");
}

#[tokio::test]
async fn a_table_without_autovacuum_fails_with_the_fix() {
    let db = backend("doctor_vac").await;
    exec(&db, "ALTER TABLE {s}.jobs SET (autovacuum_enabled = false)").await;
    let checks = db.doctor(&Expect::default()).await.unwrap();
    holds(&checks, "pg.autovacuum-tables", Status::Fail, "RESET (autovacuum_enabled)");
    assert!(of(&checks, "pg.autovacuum-tables")[0].found.contains("jobs"));
    others_pass(&checks, "pg.autovacuum-tables");
}

/// Polls the doctor until `rule` has `status` and has found `found` (the statistics reach
/// `pg_stat_user_tables` about a second after the writes, the inserts' before the deletes'); the
/// last checks.
async fn until(db: &PgBackend, rule: &str, status: Status, found: &str) -> Vec<Check> {
    let mut checks = Vec::new();
    for _ in 0..150 {
        checks = db.doctor(&Expect::default()).await.unwrap();
        if of(&checks, rule).iter().all(|c| c.status == status && c.found.contains(found)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    checks
}

#[tokio::test]
async fn dead_rows_past_what_starts_a_vacuum_warn_until_vacuumed() {
    let db = backend("doctor_dead").await;
    // Autovacuum kept off the table, so that it cannot clean up first where the server runs it.
    exec(&db, "ALTER TABLE {s}.processed_keys SET (autovacuum_enabled = false)").await;
    exec(
        &db,
        "INSERT INTO {s}.processed_keys (idempotency_key, fingerprint, state) \
         SELECT 'k' || g, 'x', 'done' FROM generate_series(1, 12000) g",
    )
    .await;
    exec(&db, "DELETE FROM {s}.processed_keys WHERE idempotency_key LIKE 'k%'").await;
    let checks = until(&db, "pg.vacuum-analyze", Status::Warn, "12000 dead rows").await;
    holds(&checks, "pg.vacuum-analyze", Status::Warn, "VACUUM (ANALYZE)");
    assert!(of(&checks, "pg.vacuum-analyze")[0].found.contains("processed_keys: 12000 dead rows"), "{checks:#?}");
    exec(&db, "VACUUM (ANALYZE) {s}.processed_keys").await;
    let checks = until(&db, "pg.vacuum-analyze", Status::Pass, "keep up").await;
    holds(&checks, "pg.vacuum-analyze", Status::Pass, "");
}

#[tokio::test]
async fn an_open_record_never_alerted_fails_and_passes_once_alerted() {
    let db = backend("doctor_alert").await;
    db.enqueue(charge(1)).await.unwrap();
    let claimed = db.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap().remove(0);
    let record = db.dead_letter(&claimed, "card declined").await.unwrap().expect("written at once");
    let young = db.doctor(&Expect::default()).await.unwrap();
    holds(&young, "alerts.open-records", Status::Pass, "");
    exec(&db, "UPDATE {s}.failed_jobs SET last_failed_at = now() - interval '1 hour'").await;
    let checks = db.doctor(&Expect::default()).await.unwrap();
    holds(&checks, "alerts.open-records", Status::Fail, "alert sink");
    others_pass(&checks, "alerts.open-records");
    // A worker's alert sweep sends it: the key its alert holds is then done.
    let key = format!("redrive_alert:record={}:sink=0", record.id);
    exec(
        &db,
        &format!(
            "INSERT INTO {{s}}.processed_keys (idempotency_key, fingerprint, state) VALUES ('{key}', 'x', 'done')"
        ),
    )
    .await;
    let checks = db.doctor(&Expect::default()).await.unwrap();
    holds(&checks, "alerts.open-records", Status::Pass, "");
}

/// Workers given no sink alert to their log only: the record counts as alerted, with a warning;
/// a sink that reaches a person passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_alerted_only_to_the_log_warn() {
    for (sink, status) in [(None, Status::Warn), (Some(()), Status::Pass)] {
        let db = backend("doctor_sink").await;
        db.enqueue(charge(1)).await.unwrap();
        let claimed =
            db.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap().remove(0);
        db.dead_letter(&claimed, "card declined").await.unwrap().expect("written at once");
        exec(&db, "UPDATE {s}.failed_jobs SET last_failed_at = now() - interval '1 hour'").await;
        let mut builder = Worker::builder(db.clone(), db.clone()).alert_sweep(Duration::from_millis(100));
        if sink.is_some() {
            builder = builder.alert_fn(|_alert| async { Ok(()) });
        }
        let worker = builder.build().start();
        let mut checks = Vec::new();
        for _ in 0..100 {
            checks = db.doctor(&Expect::default()).await.unwrap();
            if of(&checks, "alerts.open-records").iter().all(|c| c.status != Status::Fail) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        worker.shutdown().await;
        holds(&checks, "alerts.open-records", status, "WorkerBuilder::alert");
    }
}

/// As a broker's records database: a record kept for an SQS queue (its id a message id, which
/// the alert key encodes) fails once overdue and unalerted, warns alerted to the log alone, and
/// passes alerted to a sink; the database's own rules are checked beside it.
#[tokio::test]
async fn a_broker_s_open_record_never_alerted_fails_and_passes_once_alerted() {
    use redrive_core::FailureId;
    use redrive_core::kit::RecordStore;

    let db = backend("doctor_broker").await;
    db.enqueue(charge(1)).await.unwrap();
    let claimed = db.claim(&Kinds::Any, 1, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap().remove(0);
    let mut record = db.dead_letter(&claimed, "card declined").await.unwrap().expect("written at once");
    // Only the broker's record is under test here.
    exec(&db, "DELETE FROM {s}.failed_jobs").await;
    record.id = FailureId("b7c1e0d2-41f3:rd/1 a=b".to_owned());
    let queue = "arn:aws:sqs:us-east-1:000000000000:orders";
    assert_eq!(db.keep_records(queue, std::slice::from_ref(&record)).await.unwrap(), 1);
    let young = db.doctor_broker_records(&Expect::default()).await.unwrap();
    holds(&young, "alerts.open-records", Status::Pass, "");
    others_pass(&young, "none");
    assert_eq!(of(&young, "pg.unique-key").len(), 4, "{young:#?}");
    exec(&db, "UPDATE {s}.broker_records SET last_failed_at = now() - interval '1 hour'").await;
    let overdue = db.doctor_broker_records(&Expect::default()).await.unwrap();
    holds(&overdue, "alerts.open-records", Status::Fail, "alert sink");
    assert!(of(&overdue, "alerts.open-records")[0].found.contains("b7c1e0d2-41f3:rd/1 a=b"), "{overdue:#?}");
    let key = redrive_core::doctor::alert_key(&record.id).unwrap();
    for (sink, status) in [("tracing", Status::Warn), ("webhook", Status::Pass)] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO \"{}\".processed_keys (idempotency_key, fingerprint, state, result) \
             VALUES ($1, 'x', 'done', jsonb_build_object('sink', $2::text)) \
             ON CONFLICT (idempotency_key) DO UPDATE SET result = excluded.result",
            db.schema()
        )))
        .bind(key.as_str())
        .bind(sink)
        .execute(db.pool())
        .await
        .unwrap();
        let checks = db.doctor_broker_records(&Expect::default()).await.unwrap();
        holds(&checks, "alerts.open-records", status, "WorkerBuilder::alert");
    }
}

#[tokio::test]
async fn a_schema_never_migrated_fails_that_rule_alone() {
    let db = backend("doctor_none").await;
    exec(&db, "DROP TABLE {s}._sqlx_migrations").await;
    let checks = db.doctor(&Expect::default()).await.unwrap();
    assert_eq!(checks.len(), 1, "{checks:#?}");
    holds(&checks, "pg.migrations", Status::Fail, "PgBackend::migrate");
}
