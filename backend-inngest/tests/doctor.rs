//! `InngestConfig::doctor` on the emulator, with the endpoint served on a real listener: every
//! rule passes for a synced app, and each fails (or warns) with its fix when the app is not
//! synced, synced by another configuration, read with another key, or its endpoint is not there
//! or is something else; and for a job longer than a call.

mod common;

use std::time::Duration;

use redrive_core::doctor::{Check, Expect, Status};
use redrive_inngest::InngestConfig;

fn rule<'a>(checks: &'a [Check], rule: &str) -> &'a Check {
    checks.iter().find(|c| c.rule == rule).unwrap_or_else(|| panic!("{rule}: {checks:#?}"))
}

/// The rig's settings, with another app, signing key or serve URL where given.
fn settings(rig: &common::Rig, app: Option<&str>, signing_key: Option<&str>, serve_url: Option<&str>) -> InngestConfig {
    let config = rig.backend.config();
    InngestConfig::new(
        rig.emulator.event_key(),
        signing_key.unwrap_or(rig.emulator.signing_key()),
        serve_url.unwrap_or(&rig.serve_url),
    )
    .with_base_url(rig.emulator.url())
    .with_app_id(app.unwrap_or(config.app_id()))
    .allow_plain_http()
}

#[tokio::test]
async fn a_synced_app_passes_every_rule() {
    let rig = common::rig().await;
    let checks = rig.backend.config().doctor(&Expect::default()).await.unwrap();
    assert_eq!(checks.len(), 3, "{checks:#?}");
    assert!(checks.iter().all(|c| c.status == Status::Pass), "{checks:#?}");
    assert!(rule(&checks, "inngest.endpoint").found.contains("refuses an unsigned call"), "{checks:#?}");
}

#[tokio::test]
async fn an_app_not_synced_or_synced_by_another_configuration_is_named_with_the_fix() {
    let rig = common::rig().await;
    let never = settings(&rig, Some("never-synced"), None, None).doctor(&Expect::default()).await.unwrap();
    let functions = rule(&never, "inngest.functions");
    assert_eq!(functions.status, Status::Fail, "{never:#?}");
    assert!(functions.found.contains("never-synced-jobs"), "{functions:?}");
    assert!(functions.fix.as_deref().unwrap().contains("InngestBackend::sync"), "{functions:?}");

    // The workers run with 2 retries; the app was synced with the rig's 4.
    let other = rig.backend.config().clone().with_retries(2).doctor(&Expect::default()).await.unwrap();
    let functions = rule(&other, "inngest.functions");
    assert_eq!(functions.status, Status::Warn, "{other:#?}");
    assert!(functions.found.contains("4 retries, this configuration says 2"), "{functions:?}");
}

#[tokio::test]
async fn another_signing_key_is_refused_by_inngest_and_said_so() {
    let rig = common::rig().await;
    let key = "signkey-test-00112233445566778899aabbccddeeff";
    let checks = settings(&rig, None, Some(key), None).doctor(&Expect::default()).await.unwrap();
    let functions = rule(&checks, "inngest.functions");
    assert_eq!(functions.status, Status::Fail, "{checks:#?}");
    assert!(functions.found.contains("refused the signing key"), "{functions:?}");
    // The key itself is never shown.
    assert!(checks.iter().all(|c| !format!("{c:?}").contains("00112233")), "{checks:#?}");
}

#[tokio::test]
async fn a_serve_url_with_nothing_or_something_else_there_fails() {
    let rig = common::rig().await;
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let nothing = format!("http://{free}/api/inngest");
    let checks = settings(&rig, None, None, Some(&nothing)).doctor(&Expect::default()).await.unwrap();
    let endpoint = rule(&checks, "inngest.endpoint");
    assert_eq!(endpoint.status, Status::Fail, "{checks:#?}");
    assert!(endpoint.found.contains("could not connect"), "{endpoint:?}");

    // A route that takes anything: the workers' endpoint is not mounted there.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other = format!("http://{}/api/inngest", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/api/inngest", axum::routing::post(|| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let checks = settings(&rig, None, None, Some(&other)).doctor(&Expect::default()).await.unwrap();
    let endpoint = rule(&checks, "inngest.endpoint");
    assert_eq!(endpoint.status, Status::Fail, "{checks:#?}");
    assert!(endpoint.found.contains("200 OK"), "{endpoint:?}");
}

#[tokio::test]
async fn a_job_longer_than_a_call_fails_until_the_call_timeout_is_raised() {
    let rig = common::rig().await;
    let expect = Expect { job_timeout: Some(Duration::from_secs(120)), ..Expect::default() };
    let checks = rig.backend.config().doctor(&expect).await.unwrap();
    let call = rule(&checks, "inngest.call-timeout");
    assert_eq!(call.status, Status::Fail, "{checks:#?}");
    assert!(call.found.contains("120 s, outlives a call (55 s"), "{call:?}");
    assert!(call.fix.as_deref().unwrap().contains("with_call_timeout"), "{call:?}");
    // Raised past the job: it fits.
    let raised = rig.backend.config().clone().with_call_timeout(Duration::from_secs(300));
    let checks = raised.doctor(&expect).await.unwrap();
    assert_eq!(rule(&checks, "inngest.call-timeout").status, Status::Pass, "{checks:#?}");
}
