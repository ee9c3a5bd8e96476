//! `PgmqConfig::doctor`: pgmq installed in the records database, and the queue there (see
//! `redrive_core::doctor`). The database's own rules are `PgBackend::doctor_broker_records`'.

use redrive_core::Result;
use redrive_core::doctor::Check;
use redrive_postgres::PgBackend;
use sqlx::Row;

use crate::PgmqConfig;
use crate::config::check_queue_name;
use crate::error::db;
use crate::sql::{Sql, q};

impl PgmqConfig {
    /// Checks that pgmq is installed in `records`' database and has this queue. Reads only.
    pub async fn doctor(&self, records: &PgBackend) -> Result<Vec<Check>> {
        check_queue_name(&self.queue)?;
        let row = q(&Sql::new(records.schema(), &self.queue).exists)
            .bind(&self.queue)
            .fetch_one(records.pool())
            .await
            .map_err(|e| db(e, "look for pgmq"))?;
        let (installed, queue) = (row.get::<bool, _>("installed"), row.get::<bool, _>("queue"));
        Ok(vec![
            if installed {
                Check::pass("pgmq.installed", "pgmq's schema is in the database")
            } else {
                Check::fail(
                    "pgmq.installed",
                    "pgmq is not installed in the database",
                    "`CREATE EXTENSION pgmq` (Supabase: enable Queues), or pgmq's SQL-only install (docs/pgmq.md)",
                )
            },
            if queue {
                Check::pass("pgmq.queue", format!("pgmq has the queue {}", self.queue))
            } else {
                Check::fail(
                    "pgmq.queue",
                    format!("pgmq has no queue {}", self.queue),
                    format!("`SELECT pgmq.create('{}')`, or PgmqBackend::setup", self.queue),
                )
            },
        ])
    }
}
