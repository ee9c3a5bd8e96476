//! `doctor`: the configuration rules a SQLite file must hold for its jobs, records and keys (see
//! `redrive_core::doctor`), read without changing the file.

use std::collections::BTreeMap;
use std::path::Path;

use redrive_core::doctor::{self, Applied, Check, Expect};
use redrive_core::{Error, ErrorKind, Result};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Row, SqliteConnection};

use crate::error::db;
use crate::sql::{self, migrator, q};

/// The unique keys `ON CONFLICT` relies on: a job's key (the enqueue dedupe), the ledger's key,
/// a same-database effect's key, a broker record's id.
const UNIQUE_KEYS: [(&str, &str); 4] = [
    ("redrive_jobs", "idempotency_key"),
    ("redrive_processed_keys", "idempotency_key"),
    ("redrive_applied_effects", "idempotency_key"),
    ("redrive_broker_records", "queue,id"),
];

/// Checks the rules the file at `path` must hold: its migrations current, the unique indexes the
/// keys rely on present, its pages sound, its open records alerted. Opens it read-only, so a file
/// an older worker wrote is not migrated by looking; a missing file is an error.
pub async fn doctor(path: &Path, expect: &Expect) -> Result<Vec<Check>> {
    if !path.exists() {
        return Err(Error::new(ErrorKind::NotFound, format!("no SQLite file at {}", path.display())));
    }
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .create_if_missing(false)
        .connect()
        .await
        .map_err(|e| db(e, "open the file to check it"))?;
    let mut checks = vec![migrations(&mut conn).await?];
    if checks[0].found == NOT_MIGRATED {
        return Ok(checks);
    }
    checks.extend(unique_keys(&mut conn).await?);
    checks.push(integrity(&mut conn).await?);
    checks.push(wal(&mut conn, path).await?);
    checks.push(alerted(&mut conn, expect).await?);
    Ok(checks)
}

/// A write-ahead log larger than this means checkpoints are not keeping up.
const WAL_WARN_BYTES: u64 = 64 * 1024 * 1024;

/// The journal: WAL, which `SqliteBackend::open` sets (readers and the one writer do not block
/// each other), and a log that checkpoints keep short.
async fn wal(conn: &mut SqliteConnection, path: &Path) -> Result<Check> {
    const RULE: &str = "sqlite.wal";
    let mode: String =
        q(sql::doctor_journal_mode).fetch_one(&mut *conn).await.map_err(|e| db(e, "read the journal mode"))?.get(0);
    let mut log = path.as_os_str().to_owned();
    log.push("-wal");
    let size = std::fs::metadata(&log).map_or(0, |m| m.len());
    Ok(if !mode.eq_ignore_ascii_case("wal") {
        Check::warn(
            RULE,
            format!("journal_mode {mode}: each write blocks every reader, claims and the dashboard wait on it"),
            "open the file with SqliteBackend::open, which sets WAL (or PRAGMA journal_mode=WAL)",
        )
    } else if size > WAL_WARN_BYTES {
        Check::warn(
            RULE,
            format!("the write-ahead log is {} MiB: checkpoints are not keeping up", size / (1024 * 1024)),
            "find the long-lived reader holding them back (an open transaction, a backup tool); the log shrinks at \
             the next checkpoint after it ends",
        )
    } else {
        Check::pass(RULE, format!("WAL, the log {} KiB", size / 1024))
    })
}

/// What the migrations rule finds in a file without redrive's tables.
const NOT_MIGRATED: &str = "the file is not migrated: none of redrive's tables are there";

async fn migrations(conn: &mut SqliteConnection) -> Result<Check> {
    const RULE: &str = "sqlite.migrations";
    let migrate = "open it with SqliteBackend::open (a worker's start-up does), which migrates it";
    let rows = match q(sql::doctor_migrations).fetch_all(&mut *conn).await {
        Ok(rows) => rows,
        Err(sqlx::Error::Database(e)) if e.message().contains("no such table") => {
            return Ok(Check::fail(RULE, NOT_MIGRATED, migrate));
        }
        Err(e) => return Err(db(e, "read the applied migrations")),
    };
    let applied: BTreeMap<i64, Applied> = rows
        .iter()
        .map(|r| (r.get("version"), Applied { success: r.get("success"), checksum: r.get("checksum") }))
        .collect();
    let known = migrator();
    Ok(doctor::migrations(RULE, &applied, known.iter().map(|m| (m.version, &*m.checksum)), migrate))
}

async fn unique_keys(conn: &mut SqliteConnection) -> Result<Vec<Check>> {
    const RULE: &str = "sqlite.unique-key";
    let mut checks = Vec::new();
    for (table, columns) in UNIQUE_KEYS {
        let rows = q(sql::doctor_indexes)
            .bind(table)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db(e, "read the unique indexes"))?;
        let usable = rows
            .iter()
            .find(|r| r.get::<bool, _>("whole") && r.get::<Option<String>, _>("columns").as_deref() == Some(columns));
        let key = columns.replace(',', ", ");
        checks.push(match usable {
            Some(index) => {
                Check::pass(RULE, format!("{table} ({key}) is unique through {}", index.get::<String, _>("index_name")))
            }
            None => Check::fail(
                RULE,
                format!("{table} ({key}) has no unique index over every row: keys can repeat, and with them effects"),
                format!("remove duplicate keys from {table}, then CREATE UNIQUE INDEX {table}_key ON {table} ({key})"),
            ),
        });
    }
    Ok(checks)
}

async fn integrity(conn: &mut SqliteConnection) -> Result<Check> {
    const RULE: &str = "sqlite.integrity";
    let found: Vec<String> = match q(sql::doctor_quick_check).fetch_all(&mut *conn).await {
        Ok(rows) => rows.iter().map(|r| r.get::<String, _>(0)).collect(),
        // A page too damaged to walk: the check's own error is the finding.
        Err(e) => vec![e.to_string()],
    };
    Ok(if found == ["ok"] {
        Check::pass(RULE, "quick_check: ok")
    } else {
        Check::fail(
            RULE,
            format!("quick_check: {}", found.join("; ")),
            "stop the workers, restore the file from a backup (or .recover it into a new one)",
        )
    })
}

async fn alerted(conn: &mut SqliteConnection, expect: &Expect) -> Result<Check> {
    let before = chrono::Utc::now().timestamp_millis() - i64::try_from(expect.alert_grace.as_millis()).unwrap_or(0);
    let row = q(sql::doctor_unalerted)
        .bind(before)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| db(e, "read the open records' alerts"))?;
    let (open, log_only): (i64, i64) = (row.get("open"), row.get("log_only"));
    let unalerted: Vec<String> = row
        .get::<Option<String>, _>("unalerted")
        .map(|ids| ids.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    Ok(doctor::alerted(open.max(0) as u64, &unalerted, log_only.max(0) as u64, expect))
}
