//! `AzureConfig::doctor` on Azurite: a queue made by `AzureBackend::setup` passes every rule; a
//! queue without its poison queue, a message sent with Azure's default time to live (as another
//! producer would), and plain JSON read by a Functions trigger each fail their rule with the fix
//! named. A missing service fails; never skips.

mod common;

use redrive_azure::QueueOptions;
use redrive_azure::azure_storage_queue::models::QueueMessage;
use redrive_core::doctor::{Check, Expect, Status};
use redrive_core::{Enqueue, Job, KeyBuilder, NewJob};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Ship {
    parcel: u32,
}

impl Job for Ship {
    const KIND: &'static str = "ship";
    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        key.fact("parcel", self.parcel)
    }
}

fn rule<'a>(checks: &'a [Check], rule: &str) -> &'a Check {
    checks.iter().find(|c| c.rule == rule).unwrap_or_else(|| panic!("{rule} is checked: {checks:#?}"))
}

fn holds(checks: &[Check], name: &str, status: Status, fix: &str) {
    let found = rule(checks, name);
    assert_eq!(found.status, status, "{found:#?}");
    if status != Status::Pass {
        assert!(found.fix.as_deref().is_some_and(|f| f.contains(fix)), "{name} names {fix}: {found:#?}");
    }
}

#[tokio::test]
async fn a_queue_made_by_setup_with_its_jobs_passes_every_rule() {
    let (queue, _store) = common::queue("doctor-ok", QueueOptions::default()).await;
    queue.enqueue(NewJob::from_job(&Ship { parcel: 1 }).unwrap()).await.unwrap();
    let checks = common::config().doctor(queue.queue_name(), &Expect::default()).await.unwrap();
    assert_eq!(checks.len(), 4, "{checks:#?}");
    for check in &checks {
        assert_eq!(check.status, Status::Pass, "{check:#?}");
    }
    assert!(rule(&checks, "azure.ttl").found.contains("none of 1"), "{checks:#?}");
}

#[tokio::test]
async fn a_queue_without_its_poison_queue_fails() {
    let name = common::name("doctor-nopoison");
    common::config().queue_client(&name).unwrap().create(None).await.expect("Azurite is required (run scripts/test)");
    let checks = common::config().doctor(&name, &Expect::default()).await.unwrap();
    holds(&checks, "azure.queue", Status::Pass, "");
    holds(&checks, "azure.poison-queue", Status::Fail, "-poison");
    let missing = common::config().doctor(&common::name("doctor-none"), &Expect::default()).await.unwrap();
    holds(&missing, "azure.queue", Status::Fail, "AzureBackend::setup");
}

#[tokio::test]
async fn a_message_sent_with_azure_s_default_time_to_live_fails() {
    let (queue, _store) = common::queue("doctor-ttl", QueueOptions::default()).await;
    let raw = common::config().queue_client(queue.queue_name()).unwrap();
    let text = redrive_core::kit::Envelope::new(&NewJob::from_job(&Ship { parcel: 2 }).unwrap()).encode();
    // No time to live given: Azure's 7 days, after which the job is gone, unrun and unrecorded.
    raw.send_message(QueueMessage { message_text: Some(text) }.try_into().unwrap(), None).await.unwrap();
    let checks = common::config().doctor(queue.queue_name(), &Expect::default()).await.unwrap();
    holds(&checks, "azure.ttl", Status::Fail, "messagettl=-1");
    holds(&checks, "azure.poison-queue", Status::Pass, "");
}

#[tokio::test]
async fn plain_json_fails_for_a_functions_trigger_and_base64_passes() {
    let functions = Expect { functions: true, ..Expect::default() };
    let (plain, _store) = common::queue("doctor-plain", QueueOptions::default()).await;
    plain.enqueue(NewJob::from_job(&Ship { parcel: 3 }).unwrap()).await.unwrap();
    let checks = common::config().doctor(plain.queue_name(), &functions).await.unwrap();
    holds(&checks, "azure.encoding", Status::Fail, "base64: true");
    let (encoded, _store) = common::queue("doctor-b64", QueueOptions { base64: true, ..QueueOptions::default() }).await;
    encoded.enqueue(NewJob::from_job(&Ship { parcel: 4 }).unwrap()).await.unwrap();
    let checks = common::config().doctor(encoded.queue_name(), &functions).await.unwrap();
    holds(&checks, "azure.encoding", Status::Pass, "");
}
