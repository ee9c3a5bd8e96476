//! The Kinds page over HTTP, on PostgreSQL: an operator pauses a kind (after a confirmation),
//! limits it and resumes it, each kept with their name, and a second handle on the same database
//! agrees at each step; forged and incomplete posts change nothing.

mod common;

use std::time::Duration;

use common::{csrf, database, serve};
use redrive_core::{BREAKER, Flow, FlowAction, KindFlow, Limits, Rate};
use redrive_dashboard::Dashboard;
use redrive_postgres::{PgBackend, PgConfig};
use reqwest::StatusCode;
use reqwest::redirect::Policy;

fn client() -> reqwest::Client {
    reqwest::Client::builder().cookie_store(true).redirect(Policy::none()).build().unwrap()
}

/// A second handle on `db`'s schema: what any other process (a worker, the command) reads.
async fn second_handle(db: &PgBackend) -> PgBackend {
    let config = PgConfig::new(common::database_url()).with_schema(db.schema()).with_max_connections(2);
    PgBackend::connect(config).await.unwrap()
}

async fn kind(store: &impl Flow, kind: &str) -> Option<KindFlow> {
    store.kinds().await.unwrap().into_iter().find(|k| k.kind == kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_limits_and_resumes_a_kind_and_the_store_agrees() {
    let db = database().await;
    let other = second_handle(&db).await;
    let url = serve(Dashboard::new(db.clone()).with_flow(db.clone())).await;
    let http = client();

    let page = http.get(format!("{url}/kinds")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("No kind is paused."), "{page}");
    let overview = http.get(format!("{url}/")).send().await.unwrap().text().await.unwrap();
    assert!(overview.contains("href=\"/kinds\""), "the overview links the Kinds page: {overview}");

    // The confirmation page, then the pause with a reason and a name.
    let confirm = http.get(format!("{url}/kinds/pause?kind=charge_order")).send().await.unwrap();
    assert_eq!(confirm.status(), StatusCode::OK);
    let confirm = confirm.text().await.unwrap();
    assert!(confirm.contains("Pause charge_order") && confirm.contains("name=\"reason\""), "{confirm}");
    let token = csrf(&confirm);
    let pause = format!("{url}/kinds/pause");
    let form = |reason: &str, by: &str| {
        vec![("csrf", token.clone()), ("kind", "charge_order".into()), ("reason", reason.into()), ("by", by.into())]
    };
    let done = http.post(&pause).form(&form("provider <down>", "ada")).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert_eq!(done.headers()["location"], "/kinds?done=paused&kind=charge_order");
    let paused = kind(&other, "charge_order").await.and_then(|k| k.paused).expect("paused in the store");
    assert_eq!((paused.by.as_str(), paused.reason.as_str(), paused.probe_at), ("ada", "provider <down>", None));

    // Listed with who and why (escaped), on the Kinds page and the overview.
    let page =
        http.get(format!("{url}/kinds?done=paused&kind=charge_order")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("Paused charge_order"), "{page}");
    assert!(page.contains("<td>ada</td>") && page.contains("<td>provider &#60;down&#62;</td>"), "{page}");
    assert!(page.contains("none: until resumed"), "a person's pause has no probe: {page}");
    let overview = http.get(format!("{url}/")).send().await.unwrap().text().await.unwrap();
    assert!(overview.contains("<td>charge_order</td><td>ada</td>"), "{overview}");

    // A second pause: the first stands.
    let again = http.post(&pause).form(&form("another reason", "grace")).send().await.unwrap();
    assert_eq!(again.headers()["location"], "/kinds?done=already&kind=charge_order");
    assert_eq!(kind(&other, "charge_order").await.and_then(|k| k.paused).unwrap().by, "ada");

    // Limits: set, shown, then cleared.
    let limits_page = http.get(format!("{url}/kinds/limits?kind=charge_order")).send().await.unwrap();
    assert!(limits_page.text().await.unwrap().contains("Now: no limits."));
    let limits = format!("{url}/kinds/limits");
    let set = [
        ("csrf", token.as_str()),
        ("kind", "charge_order"),
        ("concurrency", "5"),
        ("rate", "100/1s"),
        ("key_concurrency", ""),
        ("key_rate", "2/1m"),
        ("by", "grace"),
    ];
    let done = http.post(&limits).form(&set).send().await.unwrap();
    assert_eq!(done.headers()["location"], "/kinds?done=limits&kind=charge_order");
    let expected = Limits {
        concurrency: Some(5),
        rate: Some(Rate::per_second(100)),
        key_concurrency: None,
        key_rate: Some(Rate::per_minute(2)),
    };
    assert_eq!(kind(&other, "charge_order").await.unwrap().limits, expected);
    let page = http.get(format!("{url}/kinds")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("5 at once, 100/1s, 2/1m per key"), "{page}");

    // Resume, with a name.
    let resume = [("csrf", token.as_str()), ("kind", "charge_order"), ("by", "grace")];
    let done = http.post(format!("{url}/kinds/resume")).form(&resume).send().await.unwrap();
    assert_eq!(done.headers()["location"], "/kinds?done=resumed&kind=charge_order");
    assert!(kind(&other, "charge_order").await.unwrap().paused.is_none(), "resumed in the store");
    let clear = [("csrf", token.as_str()), ("kind", "charge_order"), ("by", "grace")];
    http.post(&limits).form(&clear).send().await.unwrap();
    assert_eq!(kind(&other, "charge_order").await, None, "no pause and no limits: nothing kept");

    // The history, newest first, names each.
    let events = other.events(Some("charge_order"), 10).await.unwrap();
    let said: Vec<(FlowAction, &str)> = events.iter().map(|e| (e.action, e.by.as_str())).collect();
    let expected = [
        (FlowAction::Limits, "grace"),
        (FlowAction::Resumed, "grace"),
        (FlowAction::Limits, "grace"),
        (FlowAction::Paused, "ada"),
    ];
    assert_eq!(said, expected);
    let page = http.get(format!("{url}/kinds")).send().await.unwrap().text().await.unwrap();
    let history = &page[page.find("id=\"history\"").expect("the history")..];
    let (resumed, paused) = (history.find("<td>resumed</td>").unwrap(), history.find("<td>paused</td>").unwrap());
    assert!(resumed < paused, "newest first: {history}");

    // A circuit breaker's pause shows when its probe may run.
    other.pause("send_mail", "5 failures in a row", BREAKER, Some(Duration::from_secs(300))).await.unwrap();
    let page = http.get(format!("{url}/kinds")).send().await.unwrap().text().await.unwrap();
    let row = &page[page.find("<td>send_mail</td>").expect("listed")..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("<td>breaker</td>") && row.contains("<td>in 4m"), "{row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_blank_and_bad_posts_change_nothing() {
    let db = database().await;
    let url = serve(Dashboard::new(db.clone()).with_flow(db.clone())).await;
    let http = client();
    let token = csrf(&http.get(format!("{url}/kinds/pause?kind=ship")).send().await.unwrap().text().await.unwrap());
    let pause = format!("{url}/kinds/pause");
    let form = |csrf: &str, reason: &str, by: &str| {
        vec![("csrf", csrf.to_owned()), ("kind", "ship".into()), ("reason", reason.into()), ("by", by.into())]
    };

    // Forged: no token, a wrong one, another site, another origin, a browser without the cookie.
    let refused = [
        http.post(&pause).form(&form("", "down", "ada")).send().await.unwrap(),
        http.post(&pause).form(&form(&"0".repeat(64), "down", "ada")).send().await.unwrap(),
        http.post(&pause)
            .header("sec-fetch-site", "cross-site")
            .form(&form(&token, "down", "ada"))
            .send()
            .await
            .unwrap(),
        http.post(&pause)
            .header("origin", "http://evil.example")
            .form(&form(&token, "down", "ada"))
            .send()
            .await
            .unwrap(),
        client().post(&pause).form(&form(&token, "down", "ada")).send().await.unwrap(),
    ];
    for response in refused {
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
    }
    // A blank reason, a blank name, a blank kind.
    for (reason, by) in [("  ", "ada"), ("down", " ")] {
        let response = http.post(&pause).form(&form(&token, reason, by)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
    let no_kind = [("csrf", token.as_str()), ("kind", " "), ("reason", "down"), ("by", "ada")];
    assert_eq!(http.post(&pause).form(&no_kind).send().await.unwrap().status(), StatusCode::UNPROCESSABLE_ENTITY);

    // Limits: 0 at once, a bad rate, a word for a number; each says why.
    let limits = format!("{url}/kinds/limits");
    for (field, value, why) in [
        ("concurrency", "0", "pause it instead"),
        ("rate", "0/1s", "a rate needs a count of 1 or more"),
        ("key_rate", "fast", "expected COUNT/PERIOD"),
        ("key_concurrency", "many", "not a whole number"),
    ] {
        let post = [("csrf", token.as_str()), ("kind", "ship"), (field, value), ("by", "ada")];
        let response = http.post(&limits).form(&post).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{field}={value}");
        let said = response.text().await.unwrap();
        assert!(said.contains(why) && said.contains("Nothing was changed"), "{field}={value}: {said}");
    }
    let resume = [("csrf", "".to_owned()), ("kind", "ship".to_owned()), ("by", "ada".to_owned())];
    assert_eq!(
        http.post(format!("{url}/kinds/resume")).form(&resume).send().await.unwrap().status(),
        StatusCode::FORBIDDEN
    );

    assert!(db.kinds().await.unwrap().is_empty(), "nothing was paused or limited");
    assert!(db.events(None, 10).await.unwrap().is_empty(), "nothing in the history");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_flow_store_the_page_says_so_and_with_a_token_it_asks_to_sign_in() {
    let db = database().await;
    let url = serve(Dashboard::new(db.clone())).await;
    let page = client().get(format!("{url}/kinds")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::NOT_FOUND);
    assert!(page.text().await.unwrap().contains("Flow control is off on this dashboard"));
    let overview = client().get(format!("{url}/")).send().await.unwrap().text().await.unwrap();
    assert!(!overview.contains("Paused kinds"), "{overview}");

    let url =
        serve(Dashboard::new(db.clone()).with_flow(db.clone()).with_token("correct-horse-battery-staple").unwrap())
            .await;
    let http = client();
    for path in ["/kinds", "/kinds/pause?kind=ship", "/kinds/limits?kind=ship"] {
        let page = http.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(page.status(), StatusCode::SEE_OTHER, "{path}");
    }
    let post = [("kind", "ship"), ("reason", "x"), ("by", "y")];
    let refused = http.post(format!("{url}/kinds/pause")).form(&post).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert!(db.kinds().await.unwrap().is_empty());
}
