//! `SqsConfig::doctor` on moto: a pair made by `SqsBackend::setup` passes every rule; each broken
//! setup (made with the raw SDK, as a console or a template would) fails its rule with the fix
//! named, which is also what `SqsBackend::connect` refuses. A missing service fails; never skips.

mod common;

use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use common::{config, name, raw_client};
use redrive_core::doctor::{Check, Expect, Status};
use redrive_sqs::QueueSetup;

fn holds(checks: &[Check], rule: &str, status: Status, fix: &str) {
    let found = checks.iter().find(|c| c.rule == rule).unwrap_or_else(|| panic!("{rule} is checked: {checks:#?}"));
    assert_eq!(found.status, status, "{found:#?}");
    if status != Status::Pass {
        assert!(found.fix.as_deref().is_some_and(|f| f.contains(fix)), "{rule} names {fix}: {found:#?}");
    }
}

/// A source and a dead-letter queue made by hand, with these attributes.
async fn pair(label: &str, source: &[(QueueAttributeName, String)], dlq: &[(QueueAttributeName, String)]) -> String {
    let client = raw_client().await;
    let (source_name, dlq_name) = (name(label), name(&format!("{label}-dlq")));
    let mut create = client.create_queue().queue_name(&dlq_name);
    for (k, v) in dlq {
        create = create.attributes(k.clone(), v);
    }
    let dlq_url = create.send().await.expect("moto's SQS is required (run scripts/test)").queue_url.unwrap();
    let arn = client
        .get_queue_attributes()
        .queue_url(&dlq_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()[&QueueAttributeName::QueueArn]
        .clone();
    let policy = format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"5"}}"#);
    let mut create =
        client.create_queue().queue_name(&source_name).attributes(QueueAttributeName::RedrivePolicy, policy);
    for (k, v) in source {
        create = create.attributes(k.clone(), v);
    }
    create.send().await.unwrap();
    source_name
}

/// Makes or deletes a CloudWatch alarm with boto3, as an operator would.
fn boto3_alarm(args: &[&str]) {
    let python = std::env::var("REDRIVE_BOTO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(&python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/boto3_alarm.py"))
        .args(args)
        .env("REDRIVE_SQS_ENDPOINT", common::endpoint())
        .output()
        .unwrap_or_else(|e| panic!("boto3's Python ({python}) is required (run scripts/test): {e}"));
    assert!(out.status.success(), "boto3 failed: {}", String::from_utf8_lossy(&out.stderr));
}

const VISIBLE: &str = "ApproximateNumberOfMessagesVisible";
const PAGE: &str = "arn:aws:sns:us-east-1:123456789012:page";

#[tokio::test]
async fn a_pair_made_by_setup_with_its_alarm_passes_every_rule() {
    let queue = name("doctor-ok");
    common::queue_named(&queue, QueueSetup::default(), common::ledger().await).await;
    let checks = config(&queue).doctor(&Expect::default()).await.unwrap();
    holds(&checks, "sqs.dlq-alarm", Status::Warn, VISIBLE);
    // moto's alarms are the account's: named for this test, deleted after.
    let alarm = format!("{queue}-dlq-visible");
    boto3_alarm(&["put", &alarm, VISIBLE, &format!("{queue}-dlq"), PAGE]);
    let checks = config(&queue).doctor(&Expect::default()).await.unwrap();
    boto3_alarm(&["delete", &alarm]);
    for check in &checks {
        assert_eq!(check.status, Status::Pass, "{check:#?}");
    }
    assert_eq!(checks.len(), 7, "{checks:#?}");
}

#[tokio::test]
async fn an_alarm_on_messages_sent_to_the_dead_letter_queue_fails() {
    let queue = name("doctor-sent");
    common::queue_named(&queue, QueueSetup::default(), common::ledger().await).await;
    let alarm = format!("{queue}-dlq-sent");
    boto3_alarm(&["put", &alarm, "NumberOfMessagesSent", &format!("{queue}-dlq"), PAGE]);
    let checks = config(&queue).doctor(&Expect::default()).await.unwrap();
    boto3_alarm(&["delete", &alarm]);
    holds(&checks, "sqs.dlq-alarm", Status::Fail, VISIBLE);
}

#[tokio::test]
async fn a_visibility_timeout_below_the_lease_fails() {
    let source = pair(
        "doctor-vis",
        &[(QueueAttributeName::VisibilityTimeout, "5".into())],
        &[(QueueAttributeName::MessageRetentionPeriod, "1209600".into())],
    )
    .await;
    let checks = config(&source).doctor(&Expect::default()).await.unwrap();
    holds(&checks, "sqs.visibility", Status::Fail, "VisibilityTimeout=30");
    holds(&checks, "sqs.dlq-retention", Status::Pass, "");
}

#[tokio::test]
async fn a_dead_letter_queue_keeping_messages_less_long_fails() {
    let source = pair(
        "doctor-ret",
        &[(QueueAttributeName::MessageRetentionPeriod, "600".into())],
        &[(QueueAttributeName::MessageRetentionPeriod, "300".into())],
    )
    .await;
    let checks = config(&source).doctor(&Expect::default()).await.unwrap();
    holds(&checks, "sqs.dlq-retention", Status::Fail, "MessageRetentionPeriod");
    holds(&checks, "sqs.visibility", Status::Pass, "");
    let refused = redrive_sqs::SqsBackend::connect(config(&source), common::ledger().await).await;
    assert!(refused.is_err(), "connect refuses what doctor fails");
}

#[tokio::test]
async fn a_job_longer_than_sqs_can_hide_it_fails() {
    let queue = name("doctor-long");
    common::queue_named(&queue, QueueSetup::default(), common::ledger().await).await;
    let expect = |hours: u64| Expect { job_timeout: Some(Duration::from_secs(hours * 3600)), ..Expect::default() };
    let checks = config(&queue).doctor(&expect(13)).await.unwrap();
    holds(&checks, "sqs.visibility", Status::Fail, "Job::TIMEOUT");
    let checks = config(&queue).doctor(&expect(2)).await.unwrap();
    holds(&checks, "sqs.visibility", Status::Pass, "");
}

#[tokio::test]
async fn a_cap_above_max_receive_count_fails() {
    let source = pair("doctor-cap", &[], &[(QueueAttributeName::MessageRetentionPeriod, "1209600".into())]).await;
    let checks = config(&source).doctor(&Expect { cap: 8, ..Expect::default() }).await.unwrap();
    holds(&checks, "sqs.max-receive", Status::Fail, "maxReceiveCount to at least 8");
}

#[tokio::test]
async fn no_redrive_policy_or_a_deleted_dead_letter_queue_fails() {
    let client = raw_client().await;
    let bare = name("doctor-bare");
    client.create_queue().queue_name(&bare).send().await.unwrap();
    let checks = config(&bare).doctor(&Expect::default()).await.unwrap();
    holds(&checks, "sqs.redrive-policy", Status::Fail, "RedrivePolicy");

    let source = pair("doctor-gone", &[], &[(QueueAttributeName::MessageRetentionPeriod, "1209600".into())]).await;
    // The dead-letter queue the policy names, deleted (moto keeps the policy).
    let attrs = client
        .get_queue_attributes()
        .queue_url(client.get_queue_url().queue_name(&source).send().await.unwrap().queue_url.unwrap())
        .attribute_names(QueueAttributeName::RedrivePolicy)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap();
    let policy: serde_json::Value = serde_json::from_str(&attrs[&QueueAttributeName::RedrivePolicy]).unwrap();
    let dlq_name = policy["deadLetterTargetArn"].as_str().unwrap().rsplit(':').next().unwrap().to_owned();
    let dlq_url = client.get_queue_url().queue_name(&dlq_name).send().await.unwrap().queue_url.unwrap();
    client.delete_queue().queue_url(dlq_url).send().await.unwrap();
    let checks = config(&source).doctor(&Expect::default()).await.unwrap();
    holds(&checks, "sqs.dlq-placement", Status::Fail, "create it");
}
