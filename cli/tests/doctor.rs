//! `redrive doctor` on PostgreSQL, as an operator runs it: the rules as JSON with their verdicts,
//! exit 1 once one fails, the fix named. A missing service fails the test; it never skips.

mod common;

use common::{database, database_url, redrive_command};
use serde_json::Value;

fn doctor(schema: &str) -> (Option<i32>, Value) {
    let out = redrive_command(&database_url(), schema).args(["--json", "doctor"]).output().unwrap();
    let json =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), json)
}

fn status<'a>(report: &'a Value, rule: &str) -> Vec<&'a Value> {
    report["checks"].as_array().unwrap().iter().filter(|c| c["rule"] == rule).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_each_rule_and_fails_on_a_dropped_unique_index() {
    let db = database().await;
    let schema = db.schema().to_owned();
    let autovacuum: String = redrive_postgres::sqlx::query_scalar("SELECT current_setting('autovacuum')")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let (code, report) = doctor(&schema);
    // This machine's server runs with autovacuum off (for the benchmarks): the one failing rule.
    let server_fails = usize::from(autovacuum != "on");
    assert_eq!(report["failed"], server_fails, "{report:#}");
    assert_eq!(code, Some(if server_fails == 0 { 0 } else { 1 }), "{report:#}");
    assert!(status(&report, "pg.unique-key").iter().all(|c| c["status"] == "pass"), "{report:#}");

    let drop = format!("ALTER TABLE \"{schema}\".job_keys DROP CONSTRAINT job_keys_pkey");
    redrive_postgres::sqlx::raw_sql(redrive_postgres::sqlx::AssertSqlSafe(drop)).execute(db.pool()).await.unwrap();
    let (code, report) = doctor(&schema);
    assert_eq!(code, Some(1), "{report:#}");
    let broken = status(&report, "pg.unique-key");
    let job_keys = broken.iter().find(|c| c["found"].as_str().unwrap().starts_with("job_keys")).unwrap();
    assert_eq!(job_keys["status"], "fail");
    assert!(job_keys["fix"].as_str().unwrap().contains("ADD PRIMARY KEY"), "{job_keys}");
    assert_eq!(report["failed"], server_fails + 1, "{report:#}");
}

/// Connecting refuses an Azure queue without its poison queue; doctor reports it with the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_an_azure_queue_without_its_poison_queue() {
    let db = database().await;
    let name = format!("rdt-doctor-{}", common::unique().replace('_', "-"));
    let account = common::azure_account();
    account.queue_client(&name).unwrap().create(None).await.expect("Azurite is required (run scripts/test)");
    let out = redrive_command(&format!("azure://{name}"), db.schema()).args(["--json", "doctor"]).output().unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let poison = status(&report, "azure.poison-queue");
    assert_eq!(poison[0]["status"], "fail", "{report:#}");
    assert!(poison[0]["fix"].as_str().unwrap().contains("AzureBackend::setup"), "{report:#}");
    assert_eq!(status(&report, "azure.queue")[0]["status"], "pass", "{report:#}");
    // The records database (DATABASE_URL) is checked beside the queue.
    assert_eq!(status(&report, "pg.migrations")[0]["status"], "pass", "{report:#}");
    assert_eq!(status(&report, "alerts.open-records")[0]["status"], "pass", "{report:#}");
    let without = redrive_command(&format!("azure://{name}"), db.schema())
        .env_remove("DATABASE_URL")
        .args(["--json", "doctor"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&without.stdout).unwrap();
    assert_eq!(status(&report, "records.database")[0]["status"], "warn", "{report:#}");
    assert!(status(&report, "pg.migrations").is_empty(), "{report:#}");
}

/// pgmq: its schema and the queue in the records database, with that database's own rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_a_missing_pgmq_queue_with_the_fix() {
    let db = database().await;
    let name = format!("rdt_doctor_{}", common::unique());
    redrive_pgmq::PgmqBackend::setup(redrive_pgmq::PgmqConfig::new(&name), db.clone())
        .await
        .unwrap_or_else(|e| panic!("pgmq is required in the test database (run scripts/services): {e}"));
    let report = |queue: &str| {
        let out = redrive_command(&format!("pgmq://{queue}"), db.schema()).args(["--json", "doctor"]).output().unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        report
    };
    let found = report(&name);
    for rule in ["pgmq.installed", "pgmq.queue", "pg.migrations", "alerts.open-records"] {
        assert_eq!(status(&found, rule)[0]["status"], "pass", "{rule}: {found:#}");
    }
    let missing = report("rdt_no_such_queue");
    let queue = status(&missing, "pgmq.queue");
    assert_eq!(queue[0]["status"], "fail", "{missing:#}");
    assert!(queue[0]["fix"].as_str().unwrap().contains("pgmq.create('rdt_no_such_queue')"), "{missing:#}");
}

/// Inngest: an app whose functions were never synced fails with the fix; once the workers sync,
/// its rules pass, with the records database's beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_an_inngest_app_not_synced_then_passes_once_it_is() {
    let db = database().await;
    let shop = common::InngestApp::start(&db, "shop").await;
    let report = || {
        let out =
            redrive_command(&shop.url(), db.schema()).envs(shop.env()).args(["--json", "doctor"]).output().unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), report)
    };
    let (code, unsynced) = report();
    assert_eq!(code, Some(1), "{unsynced:#}");
    let functions = status(&unsynced, "inngest.functions");
    assert_eq!(functions[0]["status"], "fail", "{unsynced:#}");
    assert!(functions[0]["fix"].as_str().unwrap().contains("InngestBackend::sync"), "{unsynced:#}");
    assert_eq!(status(&unsynced, "inngest.endpoint")[0]["status"], "pass", "{unsynced:#}");

    shop.backend.sync().await.unwrap();
    let (_, synced) = report();
    for rule in ["inngest.functions", "inngest.endpoint", "inngest.call-timeout", "pg.migrations"] {
        assert_eq!(status(&synced, rule)[0]["status"], "pass", "{rule}: {synced:#}");
    }
}
