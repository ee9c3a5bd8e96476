//! The dashboard over HTTP, on PostgreSQL: what an operator sees and does, and what it refuses
//! (a form post without its CSRF token or from another site, a request without the token).

mod common;

use std::time::Duration;

use common::{csrf, database, fail, job, serve};
use redrive_core::{DeadLetter, FailureQuery, QueueStats, RecordState, Severity};
use redrive_dashboard::Dashboard;
use reqwest::StatusCode;
use reqwest::redirect::Policy;

fn client() -> reqwest::Client {
    reqwest::Client::builder().cookie_store(true).redirect(Policy::none()).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reads_discards_and_replays_and_forged_posts_are_refused() {
    let db = database().await;
    // The first with its producer's trace context, which its record keeps the trace id of.
    let traced = |job: redrive_core::NewJob| {
        job.with_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap()
    };
    let ships = (1..=3).map(|n| job("ship", n, Severity::Error)).enumerate();
    let ships = ships.map(|(i, job)| if i == 0 { traced(job) } else { job }).collect();
    fail(&db, ships, "carrier said <no>").await;
    fail(&db, vec![job("charge", 9, Severity::Critical)], "card declined").await;
    let records = db.list(&FailureQuery::open()).await.unwrap();
    let url = serve(Dashboard::new(db.clone())).await;
    let http = client();

    // The overview: depth, and the open records grouped by kind and severity, critical first.
    let page = http.get(format!("{url}/")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("default-src 'none'"));
    let page = page.text().await.unwrap();
    let (charge, ship) = (page.find(">charge<").expect("charge listed"), page.find(">ship<").expect("ship listed"));
    assert!(charge < ship, "critical first: {page}");
    assert!(page.contains("<th>open records</th><td class=\"n\">4</td>"), "{page}");

    // One record: the payload and the error escaped, never markup.
    let id = &records[0].id.0;
    let page = http.get(format!("{url}/records/{id}")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("&#60;b&#62;parcel&#60;/b&#62; 1") && !page.contains("<b>parcel"), "{page}");
    assert!(page.contains("carrier said &#60;no&#62;"), "{page}");
    assert!(page.contains("<code id=\"trace\">4bf92f3577b34da6a3ce929d0e0e4736</code>"), "the trace id: {page}");
    let untraced = http.get(format!("{url}/records/{}", records[1].id)).send().await.unwrap().text().await.unwrap();
    assert!(!untraced.contains("id=\"trace\""), "no trace row without one: {untraced}");
    let missing = http.get(format!("{url}/records/4242424242")).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);

    // Forged discards: no token, a wrong token, another site. The record stays open.
    let confirm = http.get(format!("{url}/records/{id}/discard")).send().await.unwrap().text().await.unwrap();
    let token = csrf(&confirm);
    let discard = format!("{url}/records/{id}/discard");
    let form = |csrf: &str| vec![("csrf", csrf.to_owned()), ("reason", "refunded".into()), ("by", "ada".into())];
    let refused = [
        http.post(&discard).form(&form("")).send().await.unwrap(),
        http.post(&discard).form(&form(&"0".repeat(64))).send().await.unwrap(),
        http.post(&discard).header("sec-fetch-site", "cross-site").form(&form(&token)).send().await.unwrap(),
        http.post(&discard).header("origin", "http://evil.example").form(&form(&token)).send().await.unwrap(),
        client().post(&discard).form(&form(&token)).send().await.unwrap(), // a browser without the cookie
    ];
    for response in refused {
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
    }
    assert!(db.get(&records[0].id).await.unwrap().state.is_open(), "nothing forged took effect");
    let no_reason = http.post(&discard).form(&[("csrf", token.as_str()), ("by", "ada")]).send().await.unwrap();
    assert_eq!(no_reason.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // The real discard, with reason and name.
    let done = http.post(&discard).form(&form(&token)).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    match db.get(&records[0].id).await.unwrap().state {
        RecordState::Discarded { reason, actor, .. } => {
            assert_eq!((reason.as_str(), actor.as_str()), ("refunded", "ada"))
        }
        other => panic!("{other:?}"),
    }

    // A replay: the job is back once; a second post sends nothing.
    let second = &records[1].id.0;
    let replay = format!("{url}/records/{second}/replay");
    let confirm = http.get(&replay).send().await.unwrap().text().await.unwrap();
    assert!(confirm.contains("Replay this job"), "{confirm}");
    let form = [("csrf", token.as_str()), ("by", "grace")];
    let done = http.post(&replay).form(&form).send().await.unwrap();
    assert_eq!(done.headers()["location"], format!("/records/{second}?done=replayed").as_str());
    let again = http.post(&replay).form(&form).send().await.unwrap();
    assert_eq!(again.headers()["location"], format!("/records/{second}?done=closed").as_str());
    assert_eq!(db.counts().await.unwrap().queued, 1, "replayed once");

    // The audit trail names both.
    let audit = http.get(format!("{url}/audit")).send().await.unwrap().text().await.unwrap();
    assert!(
        audit.contains("discarded by ada: refunded") && audit.contains("<td>replayed by grace, not confirmed yet</td>"),
        "{audit}"
    );

    // A bulk replay of the filter, at a capped rate, with its progress page.
    let bulk = http.get(format!("{url}/replay?kind=ship")).send().await.unwrap().text().await.unwrap();
    assert!(bulk.contains("1 open records of kind ship"), "{bulk}");
    let mut form = hidden_fields(&bulk);
    form.extend([("by".into(), "ada".into()), ("rate".into(), "5".into())]);
    let started = http.post(format!("{url}/replay")).form(&form).send().await.unwrap();
    assert_eq!(started.status(), StatusCode::SEE_OTHER);
    let progress = format!("{url}{}", started.headers()["location"].to_str().unwrap());
    for _ in 0..50 {
        let page = http.get(&progress).send().await.unwrap().text().await.unwrap();
        if page.contains("Done.") {
            assert!(page.contains("id=\"replayed\">1<"), "{page}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(db.count_open().await.unwrap(), 1, "the critical one is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_loopback_it_needs_a_token_and_without_one_every_page_asks_for_it() {
    let db = database().await;
    fail(&db, vec![job("ship", 1, Severity::Error)], "carrier said no").await;

    let anywhere = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let refused = Dashboard::new(db.clone()).serve(anywhere, std::future::pending()).await;
    assert_eq!(refused.unwrap_err().kind(), redrive_core::ErrorKind::Config, "no token, not beyond loopback");
    assert!(Dashboard::new(db.clone()).with_token("short").is_err(), "a token is 16 characters at least");

    let token = "correct-horse-battery-staple";
    let url = serve(Dashboard::new(db.clone()).with_token(token).unwrap()).await;
    let http = client();
    let id = &db.list(&FailureQuery::open()).await.unwrap()[0].id.0;
    for path in ["/", "/records", &format!("/records/{id}"), "/audit"] {
        let page = http.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(page.status(), StatusCode::SEE_OTHER, "{path}");
        assert!(page.headers()["location"].to_str().unwrap().starts_with("/login?next="));
    }
    let post = http.post(format!("{url}/records/{id}/discard")).form(&[("reason", "x"), ("by", "y")]).send().await;
    assert_eq!(post.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!(http.get(format!("{url}/metrics")).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);

    // Signing in: a wrong token is refused, the right one opens the pages.
    let login = http.get(format!("{url}/login?next=/audit")).send().await.unwrap().text().await.unwrap();
    let csrf = csrf(&login);
    let wrong = [("csrf", csrf.as_str()), ("token", "not-the-token-at-all"), ("next", "/audit")];
    assert_eq!(http.post(format!("{url}/login")).form(&wrong).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let outside = [("csrf", csrf.as_str()), ("token", token), ("next", "//evil.example/")];
    let signed_in = http.post(format!("{url}/login")).form(&outside).send().await.unwrap();
    assert_eq!(signed_in.headers()["location"], "/", "never sent to another site");
    let page = http.get(format!("{url}/records/{id}")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("carrier said no"));

    // A scraper sends the token as a bearer token (metrics are off here: 404, not 401).
    let scrape = reqwest::Client::new().get(format!("{url}/metrics")).bearer_auth(token).send().await.unwrap();
    assert_eq!(scrape.status(), StatusCode::NOT_FOUND);
}

/// The hidden fields of the first form on `page`, as the browser would post them.
fn hidden_fields(page: &str) -> Vec<(String, String)> {
    page.split("<input type=\"hidden\" ")
        .skip(1)
        .map(|input| {
            let field = |name: &str| {
                let start = input.find(&format!("{name}=\"")).expect("a hidden field") + name.len() + 2;
                input[start..].split('"').next().unwrap().to_owned()
            };
            (field("name"), field("value"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_comes_from_the_records_and_survives_a_restart() {
    let db = database().await;
    fail(&db, (1..=2).map(|n| job("ship", n, Severity::Error)).collect(), "carrier said no").await;
    let records = db.list(&FailureQuery::open()).await.unwrap();
    let (first, second) = (&records[0].id.0, &records[1].id.0);
    let url = serve(Dashboard::new(db.clone())).await;
    let http = client();
    let token = csrf(&http.get(format!("{url}/records/{first}/replay")).send().await.unwrap().text().await.unwrap());
    let replay = [("csrf", token.as_str()), ("by", "grace"), ("reason", "fixed in 1.4.2")];
    let done = http.post(format!("{url}/records/{first}/replay")).form(&replay).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let discard = [("csrf", token.as_str()), ("by", "ada"), ("reason", "refunded")];
    let done = http.post(format!("{url}/records/{second}/discard")).form(&discard).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);

    // Another dashboard process over the same schema: a restart forgets nothing.
    let schema = db.schema().to_owned();
    let again = redrive_postgres::PgBackend::connect(
        redrive_postgres::PgConfig::new(common::database_url()).with_schema(schema).with_max_connections(2),
    )
    .await
    .unwrap();
    let url = serve(Dashboard::new(again)).await;
    let audit = client().get(format!("{url}/audit")).send().await.unwrap().text().await.unwrap();
    assert!(audit.contains("replayed by grace: fixed in 1.4.2"), "{audit}");
    assert!(audit.contains("discarded by ada: refunded"), "{audit}");
    let page = client().get(format!("{url}/records/{first}")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("by grace: fixed in 1.4.2"), "the record says who replayed it: {page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_replay_sends_only_the_records_confirmed() {
    let db = database().await;
    fail(&db, (1..=2).map(|n| job("ship", n, Severity::Error)).collect(), "carrier said no").await;
    let url = serve(Dashboard::new(db.clone())).await;
    let http = client();
    let confirm = http.get(format!("{url}/replay?kind=ship")).send().await.unwrap().text().await.unwrap();
    assert!(confirm.contains("2 open records of kind ship"), "{confirm}");
    let mut form = hidden_fields(&confirm);
    form.extend([("by".into(), "ada".into()), ("rate".into(), "100".into())]);

    // A record arrives between the confirmation and the post: only the two confirmed are replayed.
    fail(&db, vec![job("ship", 3, Severity::Error)], "carrier said no").await;
    let started = http.post(format!("{url}/replay")).form(&form).send().await.unwrap();
    assert_eq!(started.status(), StatusCode::SEE_OTHER);
    for _ in 0..100 {
        if db.count_open().await.unwrap() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // a third replay would have been sent by now
    let open = db.list(&FailureQuery::open()).await.unwrap();
    assert_eq!(open.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["ship:n=3"], "the newcomer stays open");

    // A confirmed set that changed before the post (one of them discarded): refused, nothing sent.
    fail(&db, vec![job("ship", 4, Severity::Error)], "carrier said no").await;
    let confirm = http.get(format!("{url}/replay?kind=ship")).send().await.unwrap().text().await.unwrap();
    assert!(confirm.contains("2 open records of kind ship"), "{confirm}");
    let mut form = hidden_fields(&confirm);
    form.extend([("by".into(), "ada".into()), ("rate".into(), "100".into())]);
    db.discard(&open[0].id, "shipped by hand", "grace").await.unwrap();
    let refused = http.post(format!("{url}/replay")).form(&form).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let said = refused.text().await.unwrap();
    assert!(said.contains("changed since you confirmed"), "{said}");
    assert_eq!(db.count_open().await.unwrap(), 1, "nothing was replayed");
}

/// Records searched by their error text, then discarded together: a post without its CSRF token
/// or a reason changes nothing, only the records confirmed are discarded (each with who and why),
/// and a set that changed before the post is confirmed again.
#[tokio::test]
async fn a_bulk_discard_closes_only_the_records_confirmed_by_their_error() {
    let db = database().await;
    fail(&db, (1..=2).map(|n| job("mail", n, Severity::Error)).collect(), "SMTP 550: mailbox_full").await;
    fail(&db, vec![job("mail", 3, Severity::Error)], "SMTP 421: try later").await;
    let url = serve(Dashboard::new(db.clone())).await;
    let http = client();
    let listed = http.get(format!("{url}/records?error=MAILBOX_FULL")).send().await.unwrap().text().await.unwrap();
    assert!(listed.contains("mailbox_full") && !listed.contains("try later"), "{listed}");
    let none = http.get(format!("{url}/records?error=mailboxXfull")).send().await.unwrap().text().await.unwrap();
    assert!(none.contains("No records match"), "an _ in the text is itself: {none}");
    assert!(listed.contains(r#"href="/discard?error=MAILBOX_FULL""#), "{listed}");

    let confirm = http.get(format!("{url}/discard?error=MAILBOX_FULL")).send().await.unwrap().text().await.unwrap();
    assert!(confirm.contains("2 open records, last error holding"), "{confirm}");
    let form = hidden_fields(&confirm);
    let with = |extra: &[(&str, &str)]| {
        let mut form = form.clone();
        form.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        form
    };
    let forged: Vec<_> = with(&[("by", "ada"), ("reason", "gone")]).into_iter().filter(|(k, _)| k != "csrf").collect();
    let refused = http.post(format!("{url}/discard")).form(&forged).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let refused = http.post(format!("{url}/discard")).form(&with(&[("by", "ada"), ("reason", " ")])).send().await;
    assert_eq!(refused.unwrap().status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(db.count_open().await.unwrap(), 3, "nothing refused was discarded");

    // A matching record arrives between the confirmation and the post: left open, as it failed
    // after the instant confirmed.
    fail(&db, vec![job("mail", 4, Severity::Error)], "SMTP 550: mailbox_full").await;
    let started = http.post(format!("{url}/discard")).form(&with(&[("by", "ada"), ("reason", "gone")])).send().await;
    let started = started.unwrap();
    assert_eq!(started.status(), StatusCode::SEE_OTHER);
    let progress = started.headers()["location"].to_str().unwrap().to_owned();
    assert!(progress.starts_with("/discards/"), "{progress}");
    for _ in 0..100 {
        if db.count_open().await.unwrap() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let open = db.list(&FailureQuery::open()).await.unwrap();
    let keys: Vec<_> = open.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["mail:n=3", "mail:n=4"], "the other error and the newcomer stay open");
    let closed = db.list(&FailureQuery { open: Some(false), ..FailureQuery::default() }).await.unwrap();
    assert_eq!(closed.len(), 2);
    for record in closed {
        assert!(
            matches!(&record.state, RecordState::Discarded { reason, actor, .. } if reason == "gone" && actor == "ada"),
            "{:?}",
            record.state
        );
    }

    // A confirmed set that changed before the post (one discarded by someone else): refused.
    fail(&db, vec![job("mail", 5, Severity::Error)], "SMTP 550: mailbox_full").await;
    let confirm = http.get(format!("{url}/discard?error=mailbox_full")).send().await.unwrap().text().await.unwrap();
    assert!(confirm.contains("2 open records"), "{confirm}");
    let mut form = hidden_fields(&confirm);
    form.extend([("by".into(), "ada".into()), ("reason".into(), "the addresses are gone".into())]);
    db.discard(&open[1].id, "sent by hand", "grace").await.unwrap();
    let refused = http.post(format!("{url}/discard")).form(&form).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert!(refused.text().await.unwrap().contains("changed since you confirmed"));
    assert_eq!(db.count_open().await.unwrap(), 2, "nothing was discarded");
    let page = http.get(format!("{url}{progress}")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("Discarded") && page.contains("Done."), "{page}");
}
