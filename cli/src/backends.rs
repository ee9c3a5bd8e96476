//! The backend a URL names, through the facade's registry of backends (`redrive::any`): every
//! command works the same on each.

use redrive::any::{AnyBackend, AnyOptions};
use redrive::{DeadLetter, Error, ErrorKind, FailureQuery, FailureRecord, Result, Severity};

use crate::Cli;

/// Connects to the backend `--backend` (or `REDRIVE_URL`) names, its records where `--records`
/// (or `DATABASE_URL`) says. Errors never quote a URL: it may hold a password.
pub(crate) async fn connect(cli: &Cli) -> Result<AnyBackend> {
    options(cli)?.connect().await
}

/// The backend `--backend` (or `REDRIVE_URL`) names, with the command's `--records`, `--schema`
/// and connections.
pub(crate) fn options(cli: &Cli) -> Result<AnyOptions> {
    let url = cli.backend.as_deref().ok_or_else(|| {
        Error::new(
            ErrorKind::Config,
            "no backend: pass --backend (postgres://…, sqlite://PATH, sqs://QUEUE, azure://QUEUE, \
             qstash://HOST/PATH) or set REDRIVE_URL",
        )
    })?;
    // A command opens few connections; a verification runs workers.
    let connections = if matches!(cli.command, crate::Command::Verify(_)) { 8 } else { 2 };
    let mut options = AnyOptions::new(url).with_schema(&cli.schema).with_max_connections(connections);
    if let Some(records) = &cli.records {
        options = options.with_records(records);
    }
    Ok(options)
}

/// One page of records matching `query`, of `severity` if given (filtered here: the stores do not
/// index it).
pub(crate) async fn list_of(
    backend: &AnyBackend,
    query: &FailureQuery,
    severity: Option<Severity>,
) -> Result<Vec<FailureRecord>> {
    let page = backend.list(query).await?;
    Ok(page.into_iter().filter(|r| severity.is_none_or(|s| r.severity == s)).collect())
}
