//! `redrive doctor`: the configuration rules of the backend a URL names, each with a verdict,
//! what was found, and the fix (`redrive_core::doctor`).

use std::time::Duration;

use redrive::any::AnyOptions;
use redrive::doctor::{Expect, Status};
use redrive::{Error, ErrorKind, Result};

use crate::Done;
use crate::output::Output;

/// `redrive doctor`'s arguments: what the checks cannot read from the backend.
#[derive(Debug, clap::Args)]
pub(crate) struct DoctorArgs {
    /// How soon after its record is written an alert must have gone out.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    alert_grace: Duration,
    /// The workers' lease (`WorkerConfig::lease`): a broker must hide a received message at least
    /// this long.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// The largest attempt cap of the queue's jobs.
    #[arg(long, default_value_t = redrive::DEFAULT_CAP)]
    cap: u32,
    /// The longest a job of the queue may run (its kind's `Job::TIMEOUT`).
    #[arg(long, value_parser = humantime::parse_duration)]
    job_timeout: Option<Duration>,
    /// An Azure Functions queue trigger reads the queue (it expects base64 messages).
    #[arg(long)]
    functions: bool,
    /// The most retries the QStash plan allows a message.
    #[arg(long, default_value_t = 5)]
    max_retries: u32,
}

impl DoctorArgs {
    fn expect(&self) -> Expect {
        Expect {
            alert_grace: self.alert_grace,
            lease: self.lease,
            cap: self.cap,
            job_timeout: self.job_timeout,
            functions: self.functions,
        }
    }
}

/// Runs the rules; exit 1 when one fails (warnings pass).
pub(crate) async fn run(target: &AnyOptions, out: &Output, args: &DoctorArgs) -> Result<Done> {
    let target = target.clone().with_qstash_max_retries(args.max_retries);
    verdict(out, &target.doctor(&args.expect()).await?)
}

/// Prints the checks; exit 1 when one failed.
fn verdict(out: &Output, checks: &[redrive::doctor::Check]) -> Result<Done> {
    out.checks(checks);
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if failed == 0 {
        Ok(Done::Done)
    } else {
        Err(Error::new(ErrorKind::Config, format!("{failed} of {} rules failed", checks.len())))
    }
}
