//! The hot path of flow control finds its rows by primary key, however many keys there are: every
//! take of tokens or of a slot, every renewal and release; the claim reads the ready index a
//! priority at a time, in its order; the claim's order check reads the index of each order key's
//! unfinished jobs, never the whole jobs table; the live jobs are read by primary key or key,
//! never sorted; a group of completions finds each job by primary key (`EXPLAIN QUERY PLAN`,
//! never run).

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

/// `EXPLAIN QUERY PLAN` of `sql` with `bind` bound in order: its steps' details.
async fn plan(pool: &sqlx::SqlitePool, name: &str, sql: &str, bind: &[Option<&str>]) -> Vec<String> {
    let explain = format!("EXPLAIN QUERY PLAN {sql}");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(explain));
    for value in bind {
        query = query.bind(value.map(str::to_owned));
    }
    query.fetch_all(pool).await.unwrap_or_else(|e| panic!("{name}: {e}")).iter().map(|row| row.get("detail")).collect()
}

/// Order per key costs a claim one look into the index of each key's unfinished jobs, for a
/// candidate that has an order key, and never a pass over the jobs; `blocked` counts the jobs
/// behind a record in the same index, and a discard frees its job by primary key.
#[tokio::test]
async fn the_order_check_reads_the_index_of_unfinished_jobs_and_never_scans_the_jobs() {
    let (backend, _dir) = common::backend().await;
    // 30 000 jobs: a third done, the rest queued; half of them of 600 order keys.
    let fill = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30000) \
                INSERT INTO redrive_jobs (kind, idempotency_key, provider_key, payload, fingerprint, severity, cap, \
                                          status, ready_at, created_at, done_at, order_key, priority) \
                SELECT 'ship', 'ship:n=' || i, '00000000-0000-0000-0000-000000000000', '{}', 'f', 'error', 3, \
                       CASE WHEN i % 3 = 0 THEN 'done' ELSE 'queued' END, \
                       CASE WHEN i % 3 = 0 THEN NULL ELSE i END, i, \
                       CASE WHEN i % 3 = 0 THEN i END, \
                       CASE WHEN i % 2 = 0 THEN 'account' || (i % 600) END, \
                       CASE i % 10 WHEN 1 THEN 7 WHEN 2 THEN -3 ELSE 0 END \
                FROM n";
    sqlx::raw_sql(fill).execute(backend.pool()).await.expect("fill the jobs");
    let now = "99999999";
    let statements: [(&str, &str, Vec<Option<&str>>); 4] = [
        (
            "claim, any kind",
            include_str!("../queries/claim.sql"),
            vec![Some(now), Some("30000"), Some("t"), None, Some("10")],
        ),
        (
            "claim, some kinds",
            include_str!("../queries/claim.sql"),
            vec![Some(now), Some("30000"), Some("t"), Some(r#"["ship","mail"]"#), Some("10")],
        ),
        ("blocked", include_str!("../queries/blocked.sql"), vec![]),
        ("discard_order", include_str!("../queries/discard_order.sql"), vec![Some("17")]),
    ];
    let mut failures = Vec::new();
    for moment in ["no statistics", "analyzed"] {
        if moment == "analyzed" {
            sqlx::raw_sql("ANALYZE").execute(backend.pool()).await.expect("analyze");
        }
        for (name, sql, bind) in &statements {
            let steps = plan(backend.pool(), name, sql, bind).await;
            // The jobs table under any of its names (the statement's aliases: j, e, w).
            let scans = steps.iter().any(|step| {
                ["SCAN redrive_jobs", "SCAN j", "SCAN e", "SCAN w"]
                    .iter()
                    .any(|scan| step == scan || step.starts_with(&format!("{scan} ")))
            });
            // The index alone: the table's rows are not read for it.
            let ordered =
                steps.iter().any(|step| step.contains("USING COVERING INDEX redrive_jobs_order (order_key=? AND id"));
            let needs_order = name.starts_with("claim") || *name == "blocked";
            // The claim's candidates, a priority at a time and oldest first within one, from the
            // index of ready jobs (with their order keys in it), in its order: no sort.
            let ready = steps
                .iter()
                .any(|step| step.starts_with("SEARCH j USING INDEX redrive_jobs_ready (priority=? AND ready_at<?)"))
                && !steps.iter().any(|step| step.contains("TEMP B-TREE"));
            if scans || (needs_order && !ordered) || (name.starts_with("claim") && !ready) {
                failures.push(format!("{moment}: {name}: {steps:#?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "order statements that scan the jobs or miss the order index:\n{}",
        failures.join("\n")
    );
}

/// The live jobs are listed from the primary key, from the page's `after` on, whatever the
/// filters; a job is found by its id or its key's unique index; a cancel goes by primary key.
#[tokio::test]
async fn the_live_jobs_are_read_by_primary_key_or_key_and_never_sorted() {
    let (backend, _dir) = common::backend().await;
    let fill = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30000) \
                INSERT INTO redrive_jobs (kind, idempotency_key, provider_key, payload, fingerprint, severity, cap, \
                                          status, ready_at, created_at, done_at) \
                SELECT CASE WHEN i % 2 = 0 THEN 'ship' ELSE 'mail' END, 'ship:n=' || i, \
                       '00000000-0000-0000-0000-000000000000', '{}', 'f', 'error', 3, \
                       CASE WHEN i % 3 = 0 THEN 'done' ELSE 'queued' END, \
                       CASE WHEN i % 3 = 0 THEN NULL ELSE i END, i, CASE WHEN i % 3 = 0 THEN i END \
                FROM n";
    sqlx::raw_sql(fill).execute(backend.pool()).await.expect("fill the jobs");
    let now = "99999999";
    let statements: [(&str, &str, Vec<Option<&str>>, &str); 5] = [
        (
            "list_jobs, first page",
            include_str!("../queries/list_jobs.sql"),
            vec![Some("0"), None, None, None, None, Some("50"), Some(now)],
            "SEARCH redrive_jobs USING INTEGER PRIMARY KEY (rowid>?)",
        ),
        (
            "list_jobs, filtered",
            include_str!("../queries/list_jobs.sql"),
            vec![Some("100"), Some("ship"), Some("queued"), Some("10"), Some("20000"), Some("50"), Some(now)],
            "SEARCH redrive_jobs USING INTEGER PRIMARY KEY (rowid>?)",
        ),
        (
            "get_job, by id",
            include_str!("../queries/get_job.sql"),
            vec![Some("17"), None, Some(now)],
            "USING INTEGER PRIMARY KEY (rowid=?)",
        ),
        (
            "get_job, by key",
            include_str!("../queries/get_job.sql"),
            vec![None, Some("ship:n=17"), Some(now)],
            "(idempotency_key=?)",
        ),
        (
            "cancel_job",
            include_str!("../queries/cancel_job.sql"),
            vec![Some("17"), Some(now), Some("superseded"), Some("ana")],
            "USING INTEGER PRIMARY KEY (rowid=?)",
        ),
    ];
    let mut failures = Vec::new();
    for moment in ["no statistics", "analyzed"] {
        if moment == "analyzed" {
            sqlx::raw_sql("ANALYZE").execute(backend.pool()).await.expect("analyze");
        }
        for (name, sql, bind, wanted) in &statements {
            let steps = plan(backend.pool(), name, sql, bind).await;
            let scans = steps.iter().any(|step| step == "SCAN redrive_jobs" || step.starts_with("SCAN redrive_jobs "));
            let sorts = steps.iter().any(|step| step.contains("TEMP B-TREE"));
            if scans || sorts || !steps.iter().any(|step| step.contains(wanted)) {
                failures.push(format!("{moment}: {name}: {steps:#?}"));
            }
        }
    }
    assert!(failures.is_empty(), "live-job statements that scan or sort the jobs:\n{}", failures.join("\n"));
}

/// A group of completions is one statement that walks its list of jobs and finds each by primary
/// key: its cost follows the group, never the size of the jobs table.
#[tokio::test]
async fn a_group_of_completions_finds_each_job_by_primary_key() {
    let (backend, _dir) = common::backend().await;
    let fill = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30000) \
                INSERT INTO redrive_jobs (kind, idempotency_key, provider_key, payload, fingerprint, severity, cap, \
                                          status, ready_at, created_at, lease_token, lease_expires) \
                SELECT 'ship', 'ship:n=' || i, '00000000-0000-0000-0000-000000000000', '{}', 'f', 'error', 3, \
                       'running', NULL, i, 't' || (i / 128), 99999999 \
                FROM n";
    sqlx::raw_sql(fill).execute(backend.pool()).await.expect("fill the jobs");
    let held = r#"[[17,"t0"],[129,"t1"],[130,"t1"]]"#;
    for moment in ["no statistics", "analyzed"] {
        if moment == "analyzed" {
            sqlx::raw_sql("ANALYZE").execute(backend.pool()).await.expect("analyze");
        }
        let steps =
            plan(backend.pool(), "complete", include_str!("../queries/complete.sql"), &[Some(held), Some("1")]).await;
        let by_key = steps.iter().any(|step| step == "SEARCH redrive_jobs USING INTEGER PRIMARY KEY (rowid=?)");
        let scans = steps.iter().any(|step| step == "SCAN redrive_jobs" || step.starts_with("SCAN redrive_jobs "));
        assert!(by_key && !scans, "{moment}: the completion does not go by primary key: {steps:#?}");
    }
}
