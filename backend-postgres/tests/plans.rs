//! Every statement on the hot path keeps an index-driven plan whatever the planner's statistics
//! say: none taken, taken while every job was queued, while most were running, while most were
//! done, and stale after a bulk enqueue. A quarter of the jobs carry an order key (a thousand
//! accounts), so a claim's check of the earlier jobs of a key is planned too, and a fifth a
//! priority other than 0 (7 or -3): a claim must read the ready index by priority. Each statement is
//! prepared from its `.sql` file and explained (`EXPLAIN (FORMAT JSON) EXECUTE`, never run) with
//! its custom plan and its generic plan, at each of those moments. A plan passes when it reads
//! `jobs`, `job_keys` and `processed_keys` only through an index condition: no sequential scan,
//! and no index scan without a condition (a full scan in index order).

mod common;

use serde_json::Value;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};

/// Rows per table at each moment: enough that a scan of the whole table is the planner's
/// costliest choice, as it is in production.
const ROWS: i64 = 20_000;

/// Tables that must be read through an index condition.
const GUARDED: [&str; 3] = ["jobs", "job_keys", "processed_keys"];

/// A statement, the types of its parameters, and a function giving SQL literals for them.
struct Statement {
    name: &'static str,
    sql: &'static str,
    types: &'static str,
    args: fn(&Sample) -> String,
}

/// Values taken from the table at the moment of the check.
struct Sample {
    /// Ids and lease tokens of 500 jobs, running ones where there are.
    running: Vec<(i64, String)>,
    /// Keys of existing jobs.
    keys: Vec<String>,
    /// A key in `processed_keys`.
    ledger_key: String,
}

impl Sample {
    fn one(&self) -> (i64, String) {
        self.running.first().cloned().unwrap_or((1, "00000000-0000-0000-0000-000000000000".into()))
    }
}

fn ids(s: &Sample) -> String {
    let ids: Vec<String> = s.running.iter().map(|(id, _)| id.to_string()).collect();
    format!("ARRAY[{}]::bigint[]", ids.join(","))
}

fn tokens(s: &Sample) -> String {
    let t: Vec<String> = s.running.iter().map(|(_, t)| format!("'{t}'")).collect();
    format!("ARRAY[{}]::uuid[]", t.join(","))
}

fn text_array(values: &[String]) -> String {
    let v: Vec<String> = values.iter().map(|k| format!("'{}'", k.replace('\'', "''"))).collect();
    format!("ARRAY[{}]::text[]", v.join(","))
}

fn statements() -> Vec<Statement> {
    macro_rules! file {
        ($name:literal) => {
            include_str!(concat!("../queries/", $name, ".sql"))
        };
    }
    vec![
        Statement {
            name: "claim, from the front",
            sql: file!("claim"),
            types: "float8, timestamptz, bigint, text[], smallint",
            args: |_| "30, NULL, NULL, ARRAY['k'], NULL".into(),
        },
        Statement {
            name: "claim, from a scan floor",
            sql: file!("claim"),
            types: "float8, timestamptz, bigint, text[], smallint",
            args: |_| "30, now() - interval '1 hour', 5, NULL, 0".into(),
        },
        Statement {
            name: "claim, from a scan floor at a priority",
            sql: file!("claim"),
            types: "float8, timestamptz, bigint, text[], smallint",
            args: |_| "30, now() - interval '1 hour', 5, NULL, 7".into(),
        },
        Statement {
            name: "complete",
            sql: file!("complete"),
            types: "bigint[], uuid[], jsonb[]",
            args: |s| format!("{}, {}, array_fill(NULL::jsonb, ARRAY[{}])", ids(s), tokens(s), s.running.len()),
        },
        Statement {
            name: "retry",
            sql: file!("retry"),
            types: "bigint, uuid, float8, text",
            args: |s| format!("{}, '{}', 1, 'boom'", s.one().0, s.one().1),
        },
        Statement {
            name: "extend",
            sql: file!("extend"),
            types: "bigint, uuid, float8, boolean",
            args: |s| format!("{}, '{}', 30, true", s.one().0, s.one().1),
        },
        Statement {
            name: "release",
            sql: file!("release"),
            types: "bigint, uuid, float8",
            args: |s| format!("{}, '{}', 0", s.one().0, s.one().1),
        },
        Statement {
            name: "dead_letter",
            sql: file!("dead_letter"),
            types: "bigint, uuid, text, text",
            args: |s| format!("{}, '{}', 'boom', '4bf92f3577b34da6a3ce929d0e0e4736'", s.one().0, s.one().1),
        },
        Statement { name: "sweep", sql: file!("sweep"), types: "", args: |_| String::new() },
        Statement { name: "blocked", sql: file!("blocked"), types: "", args: |_| String::new() },
        Statement {
            name: "discard",
            sql: file!("discard"),
            types: "bigint, text, text",
            args: |_| "1, 'superseded', 'ana'".into(),
        },
        Statement {
            name: "enqueue",
            sql: file!("enqueue"),
            types: "text, text, uuid, jsonb, text, text, int, timestamptz, timestamptz, text, smallint, text",
            args: |s| {
                format!(
                    "'k', '{}', gen_random_uuid(), '{{}}', 'f', 'error', 5, NULL, NULL, 'acct:7', 7, \
                     '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'",
                    s.keys[0]
                )
            },
        },
        Statement {
            name: "enqueue_batch",
            sql: file!("enqueue_batch"),
            types: "text[], text[], uuid[], jsonb[], text[], text[], int[], timestamptz[], timestamptz[], text[], \
                    smallint[], text[]",
            args: |s| {
                let n = s.keys.len();
                format!(
                    "array_fill('k'::text, ARRAY[{n}]), {}, array_fill(gen_random_uuid(), ARRAY[{n}]), \
                     array_fill('{{}}'::jsonb, ARRAY[{n}]), array_fill('f'::text, ARRAY[{n}]), \
                     array_fill('error'::text, ARRAY[{n}]), array_fill(5, ARRAY[{n}]), \
                     array_fill(NULL::timestamptz, ARRAY[{n}]), array_fill(NULL::timestamptz, ARRAY[{n}]), \
                     array_fill('acct:7'::text, ARRAY[{n}]), array_fill(7::smallint, ARRAY[{n}]), \
                     array_fill(NULL::text, ARRAY[{n}])",
                    text_array(&s.keys)
                )
            },
        },
        Statement { name: "existing", sql: file!("existing"), types: "text[]", args: |s| text_array(&s.keys) },
        Statement {
            name: "prune_done",
            sql: file!("prune_done"),
            types: "float8, bigint",
            args: |_| "0, 10000".into(),
        },
        Statement {
            name: "prune_ledger",
            sql: file!("prune_ledger"),
            types: "float8, bigint",
            args: |_| "0, 10000".into(),
        },
        Statement {
            name: "replay",
            sql: file!("replay"),
            types: "bigint, text, text, jsonb, text",
            args: |_| "1, '', 'ops', NULL, NULL".into(),
        },
        Statement {
            name: "replay amended",
            sql: file!("replay"),
            types: "bigint, text, text, jsonb, text",
            args: |_| "1, 'typo', 'ops', '{}', 'a fingerprint'".into(),
        },
        Statement { name: "purge", sql: file!("purge"), types: "float8", args: |_| "0".into() },
        Statement {
            name: "list_jobs, first page",
            sql: file!("list_jobs"),
            types: "bigint, text, text, timestamptz, timestamptz, bigint",
            args: |_| "0, NULL, NULL, NULL, NULL, 100".into(),
        },
        Statement {
            name: "list_jobs, filtered, a later page",
            sql: file!("list_jobs"),
            types: "bigint, text, text, timestamptz, timestamptz, bigint",
            args: |s| format!("{}, 'k', 'queued', NULL, now() - interval '1 minute', 100", s.one().0),
        },
        Statement {
            name: "get_job, by id",
            sql: file!("get_job"),
            types: "bigint, text",
            args: |s| format!("{}, NULL", s.one().0),
        },
        Statement {
            name: "get_job, by key",
            sql: file!("get_job"),
            types: "bigint, text",
            args: |s| format!("NULL, '{}'", s.keys[0]),
        },
        Statement {
            name: "cancel_job",
            sql: file!("cancel_job"),
            types: "bigint, text, text",
            args: |s| format!("{}, 'superseded', 'ana'", s.one().0),
        },
        Statement {
            name: "ledger_begin",
            sql: file!("ledger_begin"),
            types: "text[], text[], uuid[], float8[], uuid[]",
            args: |s| {
                format!(
                    "ARRAY['{}'], ARRAY['f'], ARRAY[gen_random_uuid()], ARRAY[30::float8], ARRAY[gen_random_uuid()]",
                    s.ledger_key
                )
            },
        },
        Statement {
            name: "ledger_state",
            sql: file!("ledger_state"),
            types: "text",
            args: |s| format!("'{}'", s.ledger_key),
        },
        Statement {
            name: "ledger_extend",
            sql: file!("ledger_extend"),
            types: "text, uuid, float8",
            args: |s| format!("'{}', gen_random_uuid(), 30", s.ledger_key),
        },
        Statement {
            name: "ledger_release",
            sql: file!("ledger_release"),
            types: "text, uuid",
            args: |s| format!("'{}', gen_random_uuid()", s.ledger_key),
        },
        Statement {
            name: "ledger_finish",
            sql: file!("ledger_finish"),
            types: "text[], jsonb[]",
            args: |s| format!("ARRAY['{}'], ARRAY['null'::jsonb]", s.ledger_key),
        },
    ]
}

/// Every (node type, relation, has an index condition) in a plan.
fn scans(plan: &Value, out: &mut Vec<(String, String, bool)>) {
    if let Some(relation) = plan.get("Relation Name").and_then(Value::as_str) {
        let node = plan["Node Type"].as_str().unwrap_or_default().to_owned();
        out.push((node, relation.to_owned(), plan.get("Index Cond").is_some()));
    }
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        scans(child, out);
    }
}

/// The index conditions of every scan of `jobs_ready` in a plan.
fn ready_scans(plan: &Value, out: &mut Vec<String>) {
    if plan.get("Index Name").and_then(Value::as_str) == Some("jobs_ready") {
        out.push(plan.get("Index Cond").and_then(Value::as_str).unwrap_or_default().to_owned());
    }
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        ready_scans(child, out);
    }
}

async fn exec(conn: &mut PgConnection, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned())).execute(&mut *conn).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn sample(conn: &mut PgConnection, schema: &str) -> Sample {
    // Running jobs first; at a moment with none, any jobs (an empty array would make the
    // statement's condition false, and any plan right).
    let running = sqlx::query(AssertSqlSafe(format!(
        "SELECT id, coalesce(lease_token, gen_random_uuid())::text FROM \"{schema}\".jobs \
         ORDER BY status <> 'running', id LIMIT 500"
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    let keys = sqlx::query(AssertSqlSafe(format!(
        "SELECT idempotency_key FROM \"{schema}\".job_keys ORDER BY job_id DESC LIMIT 100"
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect();
    Sample { running, keys, ledger_key: "ledger:n=17".into() }
}

/// Explains every statement at this moment, with its custom and its generic plan; returns what
/// failed.
async fn check_plans(conn: &mut PgConnection, schema: &str, moment: &str) -> Vec<String> {
    let sample = sample(conn, schema).await;
    let mut failures = Vec::new();
    for (n, statement) in statements().iter().enumerate() {
        let sql = statement
            .sql
            .replace("{ended_cancelled}", include_str!("../queries/fragments/ended_cancelled.sql").trim_end())
            .replace("{schema}", &format!("\"{schema}\""))
            .replace("{limit}", "128");
        let types = if statement.types.is_empty() { String::new() } else { format!("({})", statement.types) };
        exec(conn, &format!("PREPARE plan_{n}{types} AS {sql}")).await;
        let args = (statement.args)(&sample);
        let args = if args.is_empty() { String::new() } else { format!("({args})") };
        for mode in ["force_custom_plan", "force_generic_plan"] {
            exec(conn, &format!("SET plan_cache_mode = {mode}")).await;
            let explain = format!("EXPLAIN (FORMAT JSON) EXECUTE plan_{n}{args}");
            let row = sqlx::query(AssertSqlSafe(explain.clone()))
                .fetch_one(&mut *conn)
                .await
                .unwrap_or_else(|e| panic!("{explain}: {e}"));
            let plan: Value = row.get(0);
            let mut found = Vec::new();
            scans(&plan[0]["Plan"], &mut found);
            let bad: Vec<_> = found
                .iter()
                .filter(|(node, relation, cond)| {
                    GUARDED.contains(&relation.as_str()) && (node == "Seq Scan" || (node.contains("Index") && !cond))
                })
                .collect();
            // A claim reads the ready index a priority at a time: by `priority` in its condition,
            // not along the whole index with `run_at` as a filter.
            let by_priority = !statement.name.starts_with("claim") || {
                let mut ready = Vec::new();
                ready_scans(&plan[0]["Plan"], &mut ready);
                !ready.is_empty() && ready.iter().all(|cond| cond.contains("priority = ANY"))
            };
            if !bad.is_empty() || !by_priority {
                failures.push(format!(
                    "{moment}: {} ({mode}) reads {bad:?}\n{}",
                    statement.name,
                    serde_json::to_string_pretty(&plan).unwrap_or_default()
                ));
            }
        }
        exec(conn, &format!("DEALLOCATE plan_{n}")).await;
    }
    failures
}

#[tokio::test]
async fn hot_path_plans_hold_whatever_the_statistics_say() {
    let backend = common::backend("plans").await;
    let schema = backend.schema().to_owned();
    let mut conn = PgConnection::connect(&common::database_url()).await.expect("connect");
    let s = format!("\"{schema}\"");
    let fill_jobs = |from: i64, to: i64| {
        format!(
            "WITH k AS (INSERT INTO {s}.job_keys (idempotency_key, fingerprint) \
                 SELECT 'plan:n=' || n, 'f' FROM generate_series({from}, {to}) n RETURNING job_id, idempotency_key) \
             INSERT INTO {s}.jobs (id, kind, idempotency_key, provider_key, payload, cap, order_key, order_prev, \
                                   priority) \
             SELECT job_id, 'plan', idempotency_key, gen_random_uuid(), '{{}}', 5, \
                    CASE WHEN job_id % 4 = 0 THEN 'acct:' || job_id % 1000 END, \
                    CASE WHEN job_id % 4 = 0 AND job_id > 1000 THEN job_id - 1000 END, \
                    CASE job_id % 10 WHEN 1 THEN 7 WHEN 2 THEN -3 ELSE 0 END FROM k; \
             INSERT INTO {s}.job_priorities VALUES (7), (-3) ON CONFLICT DO NOTHING"
        )
    };
    let claim_all_but = |keep: i64| {
        format!(
            "UPDATE {s}.jobs SET status = 'running', run_at = NULL, lease_token = gen_random_uuid(), \
             locked_until = now() + interval '1 hour', attempts = 1, claims = 1 \
             WHERE status = 'queued' AND id > (SELECT min(id) + {keep} FROM {s}.jobs WHERE status = 'queued')"
        )
    };
    let complete_all_but = |keep: i64| {
        format!(
            "UPDATE {s}.jobs SET status = 'done', locked_until = NULL \
             WHERE status = 'running' AND id > (SELECT min(id) + {keep} FROM {s}.jobs WHERE status = 'running')"
        )
    };
    let analyze = format!("ANALYZE {s}.jobs; ANALYZE {s}.job_keys; ANALYZE {s}.processed_keys");
    exec(
        &mut conn,
        &format!(
            "INSERT INTO {s}.processed_keys (idempotency_key, fingerprint, state, result) \
             SELECT 'ledger:n=' || n, 'f', 'done', 'null' FROM generate_series(1, {ROWS}) n"
        ),
    )
    .await;
    exec(&mut conn, &fill_jobs(1, ROWS)).await;

    let mut failures = Vec::new();
    failures.extend(check_plans(&mut conn, &schema, "no statistics, all queued").await);
    exec(&mut conn, &analyze).await;
    failures.extend(check_plans(&mut conn, &schema, "analyzed with all queued").await);
    exec(&mut conn, &claim_all_but(500)).await;
    failures.extend(check_plans(&mut conn, &schema, "all queued in the statistics, most now running").await);
    exec(&mut conn, &analyze).await;
    failures.extend(check_plans(&mut conn, &schema, "analyzed with most running").await);
    exec(&mut conn, &complete_all_but(500)).await;
    failures.extend(check_plans(&mut conn, &schema, "most running in the statistics, most now done").await);
    exec(&mut conn, &analyze).await;
    failures.extend(check_plans(&mut conn, &schema, "analyzed with most done").await);
    exec(&mut conn, &fill_jobs(ROWS + 1, 3 * ROWS)).await;
    exec(&mut conn, &claim_all_but(ROWS)).await;
    failures.extend(check_plans(&mut conn, &schema, "most done in the statistics, after a bulk enqueue").await);

    assert!(failures.is_empty(), "{} plans read a guarded table without an index condition:\n{}", failures.len(), {
        failures.join("\n\n")
    });
}

/// The conflict arbiter indexes of every upsert in a plan.
fn arbiters(plan: &Value) -> Vec<String> {
    let mut found: Vec<String> = plan
        .get("Conflict Arbiter Indexes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| i.as_str().map(str::to_owned))
        .collect();
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        found.extend(arbiters(child));
    }
    found
}

/// The hot path of flow control: every take of tokens or of a slot, every renewal and release,
/// reads `flow_buckets` and `flow_slots` only through their primary key (an index condition, or
/// a bitmap scan of it) and upserts through it as the conflict arbiter, with or without
/// statistics, however many keys there are.
#[tokio::test]
async fn flow_statements_find_their_row_by_primary_key() {
    macro_rules! file {
        ($name:literal) => {
            include_str!(concat!("../queries/", $name, ".sql"))
        };
    }
    // (name, sql, parameter types, arguments, the upsert's arbiter index)
    let statements = [
        (
            "flow_take_tokens",
            file!("flow_take_tokens"),
            "text, bigint, bigint, bigint",
            "'k:n=17', 1000, 100000, 1",
            true,
        ),
        (
            "flow_take_slot",
            file!("flow_take_slot"),
            "text, int, uuid, float8",
            "'k:n=17', 3, gen_random_uuid(), 30",
            true,
        ),
        (
            "flow_renew_slot",
            file!("flow_renew_slot"),
            "text, int, uuid, float8",
            "'k:n=17', 0, gen_random_uuid(), 30",
            false,
        ),
        ("flow_release_slot", file!("flow_release_slot"), "text, int, uuid", "'k:n=17', 0, gen_random_uuid()", false),
    ];
    let backend = common::backend("flowplans").await;
    let schema = backend.schema().to_owned();
    let s = format!("\"{schema}\"");
    let mut conn = PgConnection::connect(&common::database_url()).await.expect("connect");
    exec(
        &mut conn,
        &format!(
            "INSERT INTO {s}.flow_buckets (key, tat) SELECT 'k:n=' || n, 0 FROM generate_series(1, {ROWS}) n; \
             INSERT INTO {s}.flow_slots (key, slot, token, until) \
             SELECT 'k:n=' || n / 4, n % 4, gen_random_uuid(), now() FROM generate_series(1, {ROWS}) n"
        ),
    )
    .await;
    let mut failures = Vec::new();
    for moment in ["no statistics", "analyzed"] {
        if moment == "analyzed" {
            exec(&mut conn, &format!("ANALYZE {s}.flow_buckets; ANALYZE {s}.flow_slots")).await;
        }
        for (n, (name, sql, types, args, upsert)) in statements.iter().enumerate() {
            let sql = sql.replace("{schema}", &s);
            exec(&mut conn, &format!("PREPARE flow_{n}({types}) AS {sql}")).await;
            for mode in ["force_custom_plan", "force_generic_plan"] {
                exec(&mut conn, &format!("SET plan_cache_mode = {mode}")).await;
                let explain = format!("EXPLAIN (FORMAT JSON) EXECUTE flow_{n}({args})");
                let plan: Value = sqlx::query(AssertSqlSafe(explain.clone()))
                    .fetch_one(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{explain}: {e}"))
                    .get(0);
                let mut found = Vec::new();
                scans(&plan[0]["Plan"], &mut found);
                let table_scans: Vec<_> = found
                    .iter()
                    .filter(|(node, relation, _)| relation.starts_with("flow_") && node != "ModifyTable")
                    .collect();
                let by_key = table_scans
                    .iter()
                    .all(|(node, _, cond)| (node.contains("Index") && *cond) || node == "Bitmap Heap Scan");
                let arbiter = arbiters(&plan[0]["Plan"]).iter().any(|i| i.ends_with("_pkey"));
                let reads_by_key = by_key && if *upsert { arbiter } else { !table_scans.is_empty() };
                if !reads_by_key {
                    failures.push(format!(
                        "{moment}: {name} ({mode}) reads {table_scans:?}\n{}",
                        serde_json::to_string_pretty(&plan).unwrap_or_default()
                    ));
                }
            }
            exec(&mut conn, &format!("DEALLOCATE flow_{n}")).await;
        }
    }
    assert!(failures.is_empty(), "{} flow plans do not go by primary key:\n{}", failures.len(), failures.join("\n\n"));
}

/// A claim reads the ready index a priority at a time, each range from its oldest job to its
/// first one not yet due: with 45,000 jobs scheduled for tomorrow at higher priorities and a few
/// ready at a lower one, it reads a few pages of the index, not the scheduled jobs' entries.
#[tokio::test]
async fn a_claim_reads_neither_scheduled_jobs_nor_lower_priorities() {
    const JOBS: i64 = 50_000;
    let backend = common::backend("planprio").await;
    let s = format!("\"{}\"", backend.schema());
    let mut conn = PgConnection::connect(&common::database_url()).await.expect("connect");
    // A tenth ready at -5, the rest tomorrow: a fifth of them at 5, the others at 0.
    exec(
        &mut conn,
        &format!(
            "WITH k AS (INSERT INTO {s}.job_keys (idempotency_key, fingerprint) \
                 SELECT 'prio:n=' || n, 'f' FROM generate_series(1, {JOBS}) n RETURNING job_id, idempotency_key) \
             INSERT INTO {s}.jobs (id, kind, idempotency_key, provider_key, payload, cap, priority, run_at) \
             SELECT job_id, 'plan', idempotency_key, gen_random_uuid(), '{{}}', 5, \
                    CASE WHEN job_id % 10 = 0 THEN -5 WHEN job_id % 5 = 1 THEN 5 ELSE 0 END, \
                    CASE WHEN job_id % 10 = 0 THEN now() - interval '1 minute' ELSE now() + interval '1 day' END \
             FROM k; \
             INSERT INTO {s}.job_priorities VALUES (5), (-5)"
        ),
    )
    .await;
    exec(&mut conn, &format!("VACUUM ANALYZE {s}.jobs")).await;
    let sql = include_str!("../queries/claim.sql").replace("{schema}", &s).replace("{limit}", "10");
    exec(&mut conn, &format!("PREPARE claim(float8, timestamptz, bigint, text[], smallint) AS {sql}")).await;
    for (moment, args) in [("from the front", "30, NULL, NULL, NULL, NULL"), ("from a floor", "30, NULL, 0, NULL, -5")]
    {
        exec(&mut conn, "BEGIN").await;
        let plan: Value =
            sqlx::query(AssertSqlSafe(format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim({args})")))
                .fetch_one(&mut conn)
                .await
                .expect("explain the claim")
                .get(0);
        exec(&mut conn, "ROLLBACK").await;
        let mut ready = Vec::new();
        ready_buffers(&plan[0]["Plan"], &mut ready);
        let claimed = plan[0]["Plan"]["Actual Rows"].as_i64().unwrap_or_default();
        assert_eq!(claimed, 10, "{moment}: the claim takes a full batch of the ready jobs");
        // Each priority's range costs a descent of the index (3 levels here) and a leaf or two,
        // and each job a heap page: some 30 pages, where the scheduled entries are over 100.
        assert!(
            ready.len() == 1 && ready[0] <= 40,
            "{moment}: the claim read {ready:?} pages through jobs_ready\n{}",
            serde_json::to_string_pretty(&plan).unwrap_or_default()
        );
    }
}

/// The shared pages (hit or read) of every scan of `jobs_ready` in an analyzed plan.
fn ready_buffers(plan: &Value, out: &mut Vec<i64>) {
    if plan.get("Index Name").and_then(Value::as_str) == Some("jobs_ready") {
        let count = |field: &str| plan.get(field).and_then(Value::as_i64).unwrap_or_default();
        out.push(count("Shared Hit Blocks") + count("Shared Read Blocks"));
    }
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        ready_buffers(child, out);
    }
}
