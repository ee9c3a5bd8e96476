//! `SqsConfig::doctor`: the rules an SQS queue and its dead-letter queue must hold (see
//! `redrive_core::doctor`), read without the checks `SqsBackend::connect` refuses on, so that
//! each broken rule is reported with its fix rather than stop the look.

use std::collections::HashMap;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;
use redrive_core::doctor::{Check, Expect, Status};
use redrive_core::{Error, ErrorKind, Result};
use serde_json::Value;

use super::alarm;
use super::message::{queue_attributes, queue_url};
use crate::SqsConfig;

/// What the rules read: the source's attributes, and the dead-letter queue's where its policy
/// names one that exists.
pub(super) struct Facts {
    queue: String,
    pub(super) source_url: String,
    pub(super) source: HashMap<QueueAttributeName, String>,
    /// The dead-letter queue's URL and attributes.
    pub(super) dlq: Option<(String, HashMap<QueueAttributeName, String>)>,
}

impl Facts {
    /// Reads the source queue's attributes and its dead-letter queue's.
    pub(super) async fn read(client: &Client, queue: &str) -> Result<Self> {
        let source_url = queue_url(client, queue).await?;
        let source = queue_attributes(client, &source_url).await?;
        let dlq_name = policy(&source).ok().map(|(arn, _)| arn.rsplit(':').next().unwrap_or_default().to_owned());
        let dlq = match dlq_name {
            Some(name) => match queue_url(client, &name).await {
                Ok(url) => Some((url.clone(), queue_attributes(client, &url).await?)),
                Err(_) => None,
            },
            None => None,
        };
        Ok(Self { queue: queue.to_owned(), source_url, source, dlq })
    }

    /// Why a backend must not start on this pair: the first of the rules that lose data when
    /// broken (the redrive policy, the DLQ's place, retention and size) that fails. The
    /// workers' lease and caps are checked where they are known, at claim and enqueue.
    pub(super) fn refusal(&self) -> Option<Error> {
        const LOSE_DATA: [&str; 4] = ["sqs.redrive-policy", "sqs.dlq-placement", "sqs.dlq-retention", "sqs.dlq-size"];
        judge(self, &Expect::default())
            .into_iter()
            .find(|c| c.status == Status::Fail && LOSE_DATA.contains(&c.rule))
            .map(|c| Error::new(ErrorKind::Config, format!("{}: {}", c.found, c.fix.unwrap_or_default())))
    }
}

impl SqsConfig {
    /// Checks the rules the queue must hold: a redrive policy, a visibility timeout no shorter
    /// than the workers' lease, a `maxReceiveCount` no lower than the largest cap, a dead-letter
    /// queue in the same account and region that keeps messages longer and takes messages as
    /// large, and a CloudWatch alarm that acts on the messages waiting in it. Reads only.
    pub async fn doctor(&self, expect: &Expect) -> Result<Vec<Check>> {
        // One load of the AWS settings serves both SQS and CloudWatch.
        let aws = self.sdk_config().await;
        let client = Self::client_from(&aws, &Default::default());
        let facts = Facts::read(&client, &self.queue).await?;
        let mut checks = judge(&facts, expect);
        if facts.dlq.is_some()
            && let Ok((arn, _)) = policy(&facts.source)
        {
            let dlq = arn.rsplit(':').next().unwrap_or_default();
            checks.push(alarm::rule(dlq, alarm::describe(&aws, self.endpoint.as_deref()).await));
        }
        Ok(checks)
    }
}

/// The redrive policy's target ARN and `maxReceiveCount`, or what is wrong with it.
fn policy(attrs: &HashMap<QueueAttributeName, String>) -> std::result::Result<(String, u32), &'static str> {
    let text = attrs.get(&QueueAttributeName::RedrivePolicy).ok_or("no redrive policy")?;
    let policy: Value = serde_json::from_str(text).map_err(|_| "a redrive policy that is not JSON")?;
    let arn = policy["deadLetterTargetArn"].as_str().ok_or("a redrive policy without a target")?;
    let count = match &policy["maxReceiveCount"] {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .ok_or("a redrive policy without maxReceiveCount")?;
    Ok((arn.to_owned(), u32::try_from(count).unwrap_or(u32::MAX)))
}

/// The policy's `maxReceiveCount`, once [`Facts::refusal`] found the policy sound.
pub(super) fn max_receive_count(attrs: &HashMap<QueueAttributeName, String>) -> u32 {
    policy(attrs).map_or(0, |(_, count)| count)
}

fn number(attrs: &HashMap<QueueAttributeName, String>, name: QueueAttributeName, default: u64) -> u64 {
    attrs.get(&name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `arn:partition:sqs:region:account:name` → (region, account).
fn place(arn: &str) -> Option<(&str, &str)> {
    let parts: Vec<&str> = arn.split(':').collect();
    (parts.len() == 6 && parts[2] == "sqs").then(|| (parts[3], parts[4]))
}

fn judge(facts: &Facts, expect: &Expect) -> Vec<Check> {
    let queue = &facts.queue;
    let lease = expect.lease.as_secs();
    let mut checks = Vec::new();
    let visibility = number(&facts.source, QueueAttributeName::VisibilityTimeout, 30);
    // SQS keeps a received message hidden at most 12 hours from its receipt, heartbeats or not.
    const MAX_HIDDEN: u64 = 12 * 3600;
    let job_timeout = expect.job_timeout.map(|t| t.as_secs());
    checks.push(if visibility < lease {
        Check::fail(
            "sqs.visibility",
            format!("{queue} hides a received message {visibility} s, less than the workers' {lease} s lease"),
            format!("SetQueueAttributes VisibilityTimeout={lease} on {queue} (or shorten the workers' lease)"),
        )
    } else if let Some(timeout) = job_timeout.filter(|t| *t > MAX_HIDDEN) {
        Check::fail(
            "sqs.visibility",
            format!(
                "a job may run {timeout} s, and SQS hides a received message at most 12 h: past that its heartbeat \
                 is refused and the job runs again beside itself"
            ),
            "bound the job under 12 h (`Job::TIMEOUT`), or split it into jobs that are",
        )
    } else {
        Check::pass("sqs.visibility", format!("visibility timeout {visibility} s, lease {lease} s"))
    });
    let (arn, max_receive) = match policy(&facts.source) {
        Ok(policy) => policy,
        Err(why) => {
            checks.push(Check::fail(
                "sqs.redrive-policy",
                format!("{queue} has {why}: a worker crashing on a job's last attempt would lose it"),
                "set a RedrivePolicy (deadLetterTargetArn, maxReceiveCount), or create the pair with SqsBackend::setup",
            ));
            return checks;
        }
    };
    checks.push(Check::pass("sqs.redrive-policy", format!("moves to {arn} after {max_receive} receives")));
    let fifo = facts.source.get(&QueueAttributeName::FifoQueue).is_some_and(|v| v == "true");
    checks.push(if max_receive < expect.cap {
        Check::fail(
            "sqs.max-receive",
            format!("maxReceiveCount {max_receive} is below the cap {}: jobs with that cap are refused", expect.cap),
            format!("raise maxReceiveCount to at least {} (the largest cap)", expect.cap),
        )
    } else if fifo && max_receive <= expect.cap {
        Check::warn(
            "sqs.max-receive",
            format!(
                "maxReceiveCount {max_receive} leaves a FIFO queue no room for deferrals past the cap {}",
                expect.cap
            ),
            format!("raise maxReceiveCount above {}", expect.cap),
        )
    } else {
        Check::pass("sqs.max-receive", format!("maxReceiveCount {max_receive}, cap {}", expect.cap))
    });
    let source_arn = facts.source.get(&QueueAttributeName::QueueArn).map(String::as_str).unwrap_or_default();
    let Some((_, dlq)) = &facts.dlq else {
        checks.push(Check::fail(
            "sqs.dlq-placement",
            format!("the dead-letter queue {arn} does not exist: redriven messages go nowhere"),
            "create it (same account and region), or recreate the pair with SqsBackend::setup",
        ));
        return checks;
    };
    checks.push(match (place(&arn), place(source_arn)) {
        (Some(dlq_place), Some(source_place)) if dlq_place == source_place => {
            Check::pass("sqs.dlq-placement", format!("{arn}, beside the source"))
        }
        _ => Check::fail(
            "sqs.dlq-placement",
            format!("the dead-letter queue {arn} is not in the source's account and region ({source_arn})"),
            "point the redrive policy at a dead-letter queue in the same account and region",
        ),
    });
    let retention = |a| number(a, QueueAttributeName::MessageRetentionPeriod, 345_600);
    let (kept, source_kept) = (retention(dlq), retention(&facts.source));
    checks.push(if kept <= source_kept {
        Check::fail(
            "sqs.dlq-retention",
            format!("the dead-letter queue keeps messages {kept} s, not longer than the source's {source_kept} s"),
            "set the dead-letter queue's MessageRetentionPeriod above the source's (1209600, 14 days, the most)",
        )
    } else {
        Check::pass("sqs.dlq-retention", format!("{kept} s, longer than the source's {source_kept} s"))
    });
    let size = |a| number(a, QueueAttributeName::MaximumMessageSize, 262_144);
    let (takes, source_takes) = (size(dlq), size(&facts.source));
    checks.push(if takes < source_takes {
        Check::fail(
            "sqs.dlq-size",
            format!("the dead-letter queue takes messages up to {takes} bytes, less than the source's {source_takes}"),
            format!("set the dead-letter queue's MaximumMessageSize to {source_takes} or more"),
        )
    } else {
        Check::pass("sqs.dlq-size", format!("{takes} bytes, the source's {source_takes}"))
    });
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(pairs: &[(QueueAttributeName, &str)]) -> HashMap<QueueAttributeName, String> {
        pairs.iter().map(|(k, v)| (k.clone(), (*v).to_owned())).collect()
    }

    #[test]
    fn a_dead_letter_queue_in_another_region_or_account_fails() {
        let policy = |arn: &str| format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":5}}"#);
        for (dlq, passes) in [
            ("arn:aws:sqs:us-east-1:111:orders-dlq", true),
            ("arn:aws:sqs:eu-west-1:111:orders-dlq", false),
            ("arn:aws:sqs:us-east-1:222:orders-dlq", false),
        ] {
            let source = attrs(&[
                (QueueAttributeName::QueueArn, "arn:aws:sqs:us-east-1:111:orders"),
                (QueueAttributeName::RedrivePolicy, &policy(dlq)),
            ]);
            let dlq_attrs = attrs(&[(QueueAttributeName::MessageRetentionPeriod, "1209600")]);
            let facts = Facts {
                queue: "orders".into(),
                source_url: String::new(),
                source,
                dlq: Some((String::new(), dlq_attrs)),
            };
            let checks = judge(&facts, &Expect::default());
            let placed = checks.iter().find(|c| c.rule == "sqs.dlq-placement").unwrap();
            assert_eq!(placed.status == redrive_core::doctor::Status::Pass, passes, "{dlq}: {placed:?}");
        }
    }
}
