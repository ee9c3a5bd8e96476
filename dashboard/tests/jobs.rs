//! The dashboard's Jobs page over HTTP, on PostgreSQL: the live jobs filtered, a job's payload
//! escaped, and cancel refused without its CSRF token, from another site, without a reason, or
//! while the job runs; done with them, kept on the job.

mod common;

use std::time::Duration;

use common::{csrf, database, job, serve};
use redrive_core::kit::{Claim, Kinds};
use redrive_core::{Enqueue, JobId, JobState, Jobs, Severity};
use redrive_dashboard::Dashboard;
use reqwest::StatusCode;
use reqwest::redirect::Policy;

fn client() -> reqwest::Client {
    reqwest::Client::builder().cookie_store(true).redirect(Policy::none()).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lists_and_cancels_jobs_and_forged_cancels_are_refused() {
    let db = database().await;
    db.enqueue_batch((1..=3).map(|n| job("ship", n, Severity::Error)).collect()).await.unwrap();
    let running = db.claim(&Kinds::Any, 1, Duration::from_secs(300), Duration::from_secs(1)).await.unwrap();
    let running = running[0].job.id.0.clone();
    let url = serve(Dashboard::new(db.clone())).await;
    let http = client();

    let page = http.get(format!("{url}/jobs?state=queued")).send().await.unwrap().text().await.unwrap();
    assert_eq!(page.matches("<td class=\"state\">queued</td>").count(), 2, "{page}");
    assert!(!page.contains("<td class=\"state\">running"), "{page}");
    let bad = http.get(format!("{url}/jobs?state=paused")).send().await.unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let queued = redrive_core::JobQuery { state: Some(JobState::Queued), ..Default::default() };
    let id = db.list_jobs(&queued).await.unwrap()[0].id.0.clone();
    let page = http.get(format!("{url}/jobs/{id}")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("&#60;b&#62;parcel") && !page.contains("<b>parcel"), "the payload escaped: {page}");
    assert!(page.contains("id=\"cancel\""), "{page}");

    // Forged: no token, another site, a browser without the cookie. Then no reason.
    let confirm = http.get(format!("{url}/jobs/{id}/cancel")).send().await.unwrap().text().await.unwrap();
    let token = csrf(&confirm);
    let cancel = format!("{url}/jobs/{id}/cancel");
    let form =
        |csrf: &str, reason: &str| vec![("csrf", csrf.to_owned()), ("reason", reason.into()), ("by", "ada".into())];
    let refused = [
        http.post(&cancel).form(&form("", "withdrawn")).send().await.unwrap(),
        http.post(&cancel)
            .header("sec-fetch-site", "cross-site")
            .form(&form(&token, "withdrawn"))
            .send()
            .await
            .unwrap(),
        client().post(&cancel).form(&form(&token, "withdrawn")).send().await.unwrap(),
    ];
    for response in refused {
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
    }
    let blank = http.post(&cancel).form(&form(&token, " ")).send().await.unwrap();
    assert_eq!(blank.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(db.get_job(&JobId(id.clone())).await.unwrap().state, JobState::Queued, "nothing forged took effect");

    // A running job: its confirmation says what happens, and the cancel asks it to stop.
    let busy = format!("{url}/jobs/{running}/cancel");
    let confirm_running = http.get(&busy).send().await.unwrap().text().await.unwrap();
    assert!(confirm_running.contains("id=\"running-warning\""), "{confirm_running}");
    let asked = http.post(&busy).form(&form(&token, "too late")).send().await.unwrap();
    assert_eq!(asked.status(), StatusCode::SEE_OTHER);
    assert_eq!(asked.headers()["location"], format!("/jobs/{running}?done=requested"));
    let job = db.get_job(&JobId(running.clone())).await.unwrap();
    assert_eq!(job.state, JobState::Running, "running until its worker stops it");
    assert_eq!(job.cancelled.map(|c| c.reason), Some("too late".to_owned()));
    let page = http.get(format!("{url}/jobs/{running}?done=requested")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("Asked to stop") && page.contains("Cancel asked"), "{page}");
    assert!(!page.contains("id=\"cancel\""), "a cancel asked already offers no second one: {page}");

    let done = http.post(&cancel).form(&form(&token, "order withdrawn")).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let job = db.get_job(&JobId(id.clone())).await.unwrap();
    assert_eq!(job.state, JobState::Cancelled);
    let audit = job.cancelled.unwrap();
    assert_eq!((audit.reason.as_str(), audit.actor.as_str()), ("order withdrawn", "ada"));
    let page = http.get(format!("{url}/jobs/{id}?done=cancelled")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("by ada: order withdrawn") && !page.contains("id=\"cancel\""), "{page}");
}
