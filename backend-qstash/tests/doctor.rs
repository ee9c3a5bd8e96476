//! `QStashConfig::doctor` on the emulator, with the receiver mounted on a real listener: the rig
//! passes every rule; a token QStash refuses, stale signing keys given by hand, a destination
//! with nothing mounted or nothing listening, and a cap the plan's retries cannot hold each fail
//! their rule with the fix named.

mod common;

use common::TOKEN;
use redrive_core::doctor::{Check, Expect, Status};
use redrive_qstash::QStashConfig;

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

fn config(rig: &common::Rig, token: &str, destination: &str) -> QStashConfig {
    QStashConfig::new(token, destination).with_api_url(rig.emulator.url()).allow_plain_http()
}

#[tokio::test]
async fn the_rig_passes_every_rule() {
    let rig = common::rig().await;
    let checks = config(&rig, TOKEN, &rig.destination).doctor(&Expect::default()).await.unwrap();
    assert_eq!(checks.len(), 4, "{checks:#?}");
    for check in &checks {
        assert_eq!(check.status, Status::Pass, "{check:#?}");
    }
}

#[tokio::test]
async fn a_refused_token_fails_the_dlq_and_the_keys() {
    let rig = common::rig().await;
    let checks = config(&rig, "not-the-token", &rig.destination).doctor(&Expect::default()).await.unwrap();
    holds(&checks, "qstash.dlq-access", Status::Fail, "QSTASH_TOKEN");
    holds(&checks, "qstash.signing-keys", Status::Fail, "QSTASH_TOKEN");
    holds(&checks, "qstash.destination", Status::Pass, "");
}

#[tokio::test]
async fn keys_given_by_hand_warn_and_fail_once_rotated_away() {
    let rig = common::rig().await;
    let keys = rig.emulator.signing_keys();
    let given = || config(&rig, TOKEN, &rig.destination).with_signing_keys(keys.current.clone(), keys.next.clone());
    let checks = given().doctor(&Expect::default()).await.unwrap();
    holds(&checks, "qstash.signing-keys", Status::Warn, "/v2/keys");
    rig.emulator.rotate_keys();
    rig.emulator.rotate_keys();
    let checks = given().doctor(&Expect::default()).await.unwrap();
    holds(&checks, "qstash.signing-keys", Status::Fail, "QSTASH_CURRENT_SIGNING_KEY");
}

#[tokio::test]
async fn a_destination_with_nothing_mounted_or_listening_fails() {
    let rig = common::rig().await;
    let elsewhere = rig.destination.replace("/qstash", "/jobs");
    let checks = config(&rig, TOKEN, &elsewhere).doctor(&Expect::default()).await.unwrap();
    holds(&checks, "qstash.destination", Status::Fail, "QStashBackend::receiver");
    assert!(rule(&checks, "qstash.destination").found.contains("404"), "{checks:#?}");
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/qstash", listener.local_addr().unwrap())
    };
    let checks = config(&rig, TOKEN, &closed).doctor(&Expect::default()).await.unwrap();
    holds(&checks, "qstash.destination", Status::Fail, "receiver");
    assert!(rule(&checks, "qstash.destination").found.contains("could not connect"), "{checks:#?}");
}

#[tokio::test]
async fn a_cap_beyond_the_plan_s_retries_fails() {
    let rig = common::rig().await;
    let expect = Expect { cap: 8, ..Expect::default() };
    let checks = config(&rig, TOKEN, &rig.destination).doctor(&expect).await.unwrap();
    holds(&checks, "qstash.retries", Status::Fail, "with_max_retries");
    let raised = config(&rig, TOKEN, &rig.destination).with_max_retries(7).doctor(&expect).await.unwrap();
    holds(&raised, "qstash.retries", Status::Pass, "");
    assert!(rule(&raised, "qstash.retries").found.contains("allows 7"), "{raised:#?}");
}
