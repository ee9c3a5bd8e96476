//! The hot path of flow control finds its rows by primary key, however many keys there are: every
//! take of tokens or of a slot, every renewal and release (`EXPLAIN QUERY PLAN`, never run).

mod common;

use redrive_sqlite::sqlx::{self, Row};

#[tokio::test]
async fn flow_statements_find_their_row_by_primary_key() {
    macro_rules! file {
        ($name:literal) => {
            ($name, include_str!(concat!("../queries/", $name, ".sql")))
        };
    }
    let (backend, _dir) = common::backend().await;
    let fill = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) \
                INSERT INTO redrive_flow_slots (key, slot, token, until) SELECT 'k:n=' || i, 0, 't', 0 FROM n; \
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) \
                INSERT INTO redrive_flow_buckets (key, tat) SELECT 'k:n=' || i, 0 FROM n";
    sqlx::raw_sql(fill).execute(backend.pool()).await.expect("fill the tables");
    let statements = [
        (file!("flow_bucket"), 1),
        (file!("flow_bucket_set"), 2),
        (file!("flow_take_slot"), 5),
        (file!("flow_renew_slot"), 4),
        (file!("flow_release_slot"), 3),
    ];
    let mut failures = Vec::new();
    for moment in ["no statistics", "analyzed"] {
        if moment == "analyzed" {
            sqlx::raw_sql("ANALYZE").execute(backend.pool()).await.expect("analyze");
        }
        for ((name, sql), parameters) in statements {
            let explain = format!("EXPLAIN QUERY PLAN {sql}");
            let mut query = sqlx::query(sqlx::AssertSqlSafe(explain));
            for _ in 0..parameters {
                query = query.bind("k:n=17");
            }
            let plan: Vec<String> = query
                .fetch_all(backend.pool())
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .iter()
                .map(|row| row.get("detail"))
                .collect();
            let scans = plan.iter().any(|step| step.starts_with("SCAN redrive_flow_") || step.starts_with("SCAN held"));
            let by_key = plan
                .iter()
                .any(|step| (step.contains("redrive_flow_") || step.contains("held")) && step.contains("PRIMARY KEY"));
            if scans || (!by_key && !name.ends_with("_set")) {
                failures.push(format!("{moment}: {name}: {plan:#?}"));
            }
        }
    }
    assert!(failures.is_empty(), "flow statements that do not go by primary key:\n{}", failures.join("\n"));
}
