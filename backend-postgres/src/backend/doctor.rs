//! `PgBackend::doctor`: the configuration rules this database must hold for its jobs, records and
//! keys (see `redrive_core::doctor`).

use std::collections::BTreeMap;

use redrive_core::doctor::{self, Applied, Check, Expect};
use redrive_core::{FailureId, Result};
use sqlx::Row;

use super::PgBackend;
use crate::error::db;
use crate::sql::{migrator, q};

/// The unique keys `ON CONFLICT` relies on: a job's key (the enqueue dedupe), the ledger's key,
/// a same-database effect's key, a broker record's id.
const UNIQUE_KEYS: [(&str, &[&str]); 4] = [
    ("job_keys", &["idempotency_key"]),
    ("processed_keys", &["idempotency_key"]),
    ("applied_effects", &["idempotency_key"]),
    ("broker_records", &["queue", "id"]),
];

/// What the migrations rule finds on a schema without redrive's tables.
const NOT_MIGRATED: &str = "the schema is not migrated: none of redrive's tables are there";

impl PgBackend {
    /// Checks the rules this schema must hold: its migrations current, the unique indexes the
    /// keys rely on present and valid, autovacuum on for it and keeping up, and its open records
    /// alerted.
    /// Reads only; a rule whose facts cannot be read fails with why.
    pub async fn doctor(&self, expect: &Expect) -> Result<Vec<Check>> {
        let migrations = self.migrations().await?;
        if migrations.iter().any(|c| c.found == NOT_MIGRATED) {
            // No tables to read the other rules from.
            return Ok(migrations);
        }
        let vacuum = vec![self.vacuum_analyze().await?];
        Ok(vec![migrations, self.unique_keys().await?, self.autovacuum().await?, vacuum, self.alerted(expect).await?]
            .into_iter()
            .flatten()
            .collect())
    }

    /// Checks the rules this schema must hold as a broker's records database (SQS, Azure, QStash
    /// keep their failure records and ledger here): its migrations, unique keys and vacuum as
    /// [`Self::doctor`], and the open broker records (of every queue kept here) alerted.
    pub async fn doctor_broker_records(&self, expect: &Expect) -> Result<Vec<Check>> {
        let migrations = self.migrations().await?;
        if migrations.iter().any(|c| c.found == NOT_MIGRATED) {
            return Ok(migrations);
        }
        let vacuum = vec![self.vacuum_analyze().await?];
        let alerted = vec![self.brokers_alerted(expect).await?];
        Ok(vec![migrations, self.unique_keys().await?, self.autovacuum().await?, vacuum, alerted]
            .into_iter()
            .flatten()
            .collect())
    }

    async fn migrations(&self) -> Result<Vec<Check>> {
        const RULE: &str = "pg.migrations";
        let migrate = format!("run PgBackend::migrate (or a worker's start-up that does) on schema {}", self.schema());
        let rows = match q(&self.inner.sql.doctor_migrations).fetch_all(&self.inner.pool).await {
            Ok(rows) => rows,
            // No migrations table: the schema was never migrated.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => {
                return Ok(vec![Check::fail(RULE, NOT_MIGRATED, migrate)]);
            }
            Err(e) => return Err(db(e, "read the applied migrations")),
        };
        let applied: BTreeMap<i64, Applied> = rows
            .iter()
            .map(|r| (r.get("version"), Applied { success: r.get("success"), checksum: r.get("checksum") }))
            .collect();
        let known = migrator(self.schema());
        let known = known.iter().map(|m| (m.version, &*m.checksum));
        Ok(vec![doctor::migrations(RULE, &applied, known, &migrate)])
    }

    async fn unique_keys(&self) -> Result<Vec<Check>> {
        const RULE: &str = "pg.unique-key";
        let rows = q(&self.inner.sql.doctor_unique)
            .bind(self.schema())
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| db(e, "read the unique indexes"))?;
        let mut checks = Vec::new();
        for (table, columns) in UNIQUE_KEYS {
            let covering: Vec<_> = rows
                .iter()
                .filter(|r| r.get::<String, _>("table_name") == table)
                .filter(|r| r.get::<Vec<String>, _>("columns") == columns)
                .collect();
            let usable = covering.iter().find(|r| r.get("valid") && r.get("immediate") && r.get("whole"));
            let key = columns.join(", ");
            checks.push(match (usable, covering.first()) {
                (Some(index), _) => Check::pass(
                    RULE,
                    format!("{table} ({key}) is unique through {}", index.get::<String, _>("index_name")),
                ),
                (None, Some(index)) => Check::fail(
                    RULE,
                    format!(
                        "{table} ({key}): the unique index {} cannot serve (invalid, deferrable or partial)",
                        index.get::<String, _>("index_name")
                    ),
                    format!(
                        "remove duplicate keys from {table}, then REINDEX INDEX CONCURRENTLY {}.{} (or drop it \
                         and create it again)",
                        self.schema(),
                        index.get::<String, _>("index_name")
                    ),
                ),
                (None, None) => Check::fail(
                    RULE,
                    format!("{table} ({key}) has no unique index: keys can repeat, and with them effects"),
                    format!("ALTER TABLE {}.{table} ADD PRIMARY KEY ({key}) (remove duplicates first)", self.schema()),
                ),
            });
        }
        Ok(checks)
    }

    async fn autovacuum(&self) -> Result<Vec<Check>> {
        let row = q(&self.inner.sql.doctor_autovacuum)
            .bind(self.schema())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| db(e, "read the autovacuum settings"))?;
        let on = |setting: &str| row.get::<String, _>(setting) == "on";
        let server = if on("autovacuum") && on("track_counts") {
            Check::pass("pg.autovacuum", "autovacuum and track_counts are on")
        } else {
            Check::fail(
                "pg.autovacuum",
                format!(
                    "autovacuum is {}, track_counts {}: the queue tables bloat and their statistics go stale, \
                     and claims slow down",
                    row.get::<String, _>("autovacuum"),
                    row.get::<String, _>("track_counts")
                ),
                "set autovacuum = on and track_counts = on in postgresql.conf, then reload",
            )
        };
        let disabled: Vec<String> = row.get("disabled");
        let tables = if disabled.is_empty() {
            Check::pass("pg.autovacuum-tables", "no table of the schema turns autovacuum off")
        } else {
            let fix: Vec<String> = disabled
                .iter()
                .map(|t| format!("ALTER TABLE {}.{t} RESET (autovacuum_enabled)", self.schema()))
                .collect();
            Check::fail(
                "pg.autovacuum-tables",
                format!("autovacuum is off for {}", disabled.join(", ")),
                fix.join("; "),
            )
        };
        Ok(vec![server, tables])
    }

    /// Whether vacuum and analyze keep up with the schema's tables (`pg_stat_user_tables`):
    /// dead rows slow every claim's scan, stale statistics give plans that scan the table.
    async fn vacuum_analyze(&self) -> Result<Check> {
        const RULE: &str = "pg.vacuum-analyze";
        let rows = q(&self.inner.sql.doctor_vacuum)
            .bind(self.schema())
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| db(e, "read the tables' vacuum and analyze counts"))?;
        let schema = self.schema();
        let (mut behind, mut fix) = (Vec::new(), Vec::new());
        for row in &rows {
            let table: String = row.get("table_name");
            if row.get::<bool, _>("vacuum_behind") {
                behind.push(format!("{table}: {} dead rows", row.get::<i64, _>("dead")));
                fix.push(format!("VACUUM (ANALYZE) {schema}.{table}"));
            } else if row.get::<bool, _>("analyze_behind") {
                behind.push(format!("{table}: {} rows changed since its last analyze", row.get::<i64, _>("changed")));
                fix.push(format!("ANALYZE {schema}.{table}"));
            }
        }
        Ok(if behind.is_empty() {
            Check::pass(RULE, format!("vacuum and analyze keep up with the schema's {} tables", rows.len()))
        } else {
            Check::warn(
                RULE,
                format!("{}: cleanup or statistics are behind, and claims slow down", behind.join("; ")),
                format!(
                    "{}; then find what holds autovacuum back (autovacuum off, a long transaction, too few workers)",
                    fix.join("; ")
                ),
            )
        })
    }

    async fn alerted(&self, expect: &Expect) -> Result<Vec<Check>> {
        let row = q(&self.inner.sql.doctor_unalerted)
            .bind(expect.alert_grace.as_secs_f64())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| db(e, "read the open records' alerts"))?;
        let (open, unalerted, log_only): (i64, Vec<String>, i64) =
            (row.get("open"), row.get("unalerted"), row.get("log_only"));
        Ok(vec![doctor::alerted(open.max(0) as u64, &unalerted, log_only.max(0) as u64, expect)])
    }

    /// The alerts rule over broker records, whose ids (a broker's message ids) go into their alert
    /// keys through the key's encoding, so the keys are built here rather than in SQL.
    async fn brokers_alerted(&self, expect: &Expect) -> Result<Check> {
        let rows = q(&self.inner.sql.doctor_broker_open)
            .bind(expect.alert_grace.as_secs_f64())
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| db(e, "read the open broker records"))?;
        let open: i64 = rows.first().map_or(0, |r| r.get("open"));
        let records: Vec<(FailureId, bool)> = rows.iter().map(|r| (FailureId(r.get("id")), r.get("overdue"))).collect();
        let keys: Vec<String> =
            records.iter().filter_map(|(id, _)| doctor::alert_key(id)).map(|k| k.as_str().to_owned()).collect();
        let marks: BTreeMap<String, Option<String>> = q(&self.inner.sql.doctor_alert_marks)
            .bind(&keys)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| db(e, "read the open broker records' alerts"))?
            .iter()
            .map(|r| (r.get("idempotency_key"), r.get("sink")))
            .collect();
        let mark = |id: &FailureId| doctor::alert_key(id).and_then(|k| marks.get(k.as_str()).cloned());
        let unalerted: Vec<String> =
            records.iter().filter(|(id, overdue)| *overdue && mark(id).is_none()).map(|(id, _)| id.0.clone()).collect();
        let log_only = records.iter().filter(|(id, _)| mark(id).flatten().as_deref() == Some("tracing")).count();
        Ok(doctor::alerted(open.max(0) as u64, &unalerted, log_only as u64, expect))
    }
}
