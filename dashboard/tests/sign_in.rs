//! Signing in to the dashboard over a real listener: where a sign-in may send the browser, the
//! session cookie's `Secure` flag, wrong tokens throttled, and sessions signed out and revoked.

mod common;

use common::{csrf, database, serve};
use redrive_dashboard::Dashboard;
use reqwest::redirect::Policy;
use reqwest::{StatusCode, Url};

const TOKEN: &str = "correct-horse-battery-staple";

fn client() -> reqwest::Client {
    reqwest::Client::builder().cookie_store(true).redirect(Policy::none()).build().unwrap()
}

/// Signs in with `token`, asking to go to `next`.
async fn sign_in(http: &reqwest::Client, url: &str, token: &str, next: &str) -> reqwest::Response {
    let page = http.get(format!("{url}/login")).send().await.unwrap().text().await.unwrap();
    let csrf = csrf(&page);
    let form = [("csrf", csrf.as_str()), ("token", token), ("next", next)];
    http.post(format!("{url}/login")).form(&form).send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_never_sends_the_browser_to_another_site() {
    let url = serve(Dashboard::new(database().await).with_token(TOKEN).unwrap()).await;
    let base = Url::parse(&url).unwrap();
    // Browsers drop tabs and newlines from a URL and read a backslash as a slash: `/\t/evil`
    // becomes `//evil`, another site. The `url` crate parses as browsers do.
    let forms = [
        "/\t/evil.example/",
        "/\n/evil.example/",
        "/\r\n/evil.example/",
        "\t//evil.example/",
        "//evil.example/",
        "/\\evil.example/",
        "\\/evil.example/",
        "/\\/evil.example/",
        "/\u{0}/evil.example/",
        "/\u{b}/evil.example/",
        "https://evil.example/",
        "https:evil.example",
        " //evil.example/",
        "/%09/evil.example/", // stays a path here: only raw tabs are dropped
    ];
    for next in forms {
        let response = sign_in(&client(), &url, TOKEN, next).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{next:?}");
        let location = response.headers()["location"].to_str().unwrap_or_else(|e| panic!("{next:?}: {e}"));
        let to = base.join(location).unwrap();
        assert_eq!((to.host_str(), to.port()), (base.host_str(), base.port()), "{next:?} sent to {to}");
    }
    // A path on the dashboard is kept, with its query.
    let response = sign_in(&client(), &url, TOKEN, "/records?kind=ship").await;
    assert_eq!(response.headers()["location"], "/records?kind=ship");
    // The page's form carries only a local path too.
    let page = client().get(format!("{url}/login?next=%2F%09%2Fevil.example")).send().await.unwrap();
    let page = page.text().await.unwrap();
    assert!(page.contains("name=\"next\" value=\"/\""), "{page}");
}

/// The `Set-Cookie` header of `name` in a response.
fn set_cookie(response: &reqwest::Response, name: &str) -> String {
    let prefix = format!("{name}=");
    let mut cookies = response.headers().get_all("set-cookie").iter().filter_map(|v| v.to_str().ok());
    cookies.rfind(|c| c.starts_with(&prefix)).unwrap_or_else(|| panic!("no {name} cookie")).to_owned()
}

/// Signs in without a cookie store (a `Secure` cookie is not sent back over http): the sign-in
/// page's and the sign-in's `Set-Cookie` headers, CSRF and session.
async fn cookies_of_a_sign_in(url: &str, headers: &[(&str, &str)]) -> (String, String) {
    let http = reqwest::Client::builder().redirect(Policy::none()).build().unwrap();
    let mut get = http.get(format!("{url}/login"));
    for (name, value) in headers {
        get = get.header(*name, *value);
    }
    let page = get.send().await.unwrap();
    let csrf_cookie = set_cookie(&page, "redrive_csrf");
    let value = csrf_cookie.split(';').next().unwrap().to_owned();
    let form = [("csrf", csrf(&page.text().await.unwrap())), ("token", TOKEN.into()), ("next", "/".into())];
    let mut post = http.post(format!("{url}/login")).header("cookie", value).form(&form);
    for (name, value) in headers {
        post = post.header(*name, *value);
    }
    let signed_in = post.send().await.unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    (csrf_cookie, set_cookie(&signed_in, "redrive_session"))
}

fn secure(cookie: &str) -> bool {
    cookie.split(';').any(|attribute| attribute.trim().eq_ignore_ascii_case("secure"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_are_secure_when_served_over_https() {
    let db = database().await;
    let dashboard = || Dashboard::new(db.clone()).with_token(TOKEN).unwrap();
    let forwarded = [("x-forwarded-proto", "https")];

    // Plain http on loopback: not Secure (the browser would drop them), whatever a client says.
    let url = serve(dashboard()).await;
    let (csrf, session) = cookies_of_a_sign_in(&url, &forwarded).await;
    assert!(!secure(&csrf) && !secure(&session), "{csrf} / {session}");

    // TLS at a proxy, declared by the public URL.
    let url = serve(dashboard().with_public_url("https://ops.example.com/").unwrap()).await;
    let (csrf, session) = cookies_of_a_sign_in(&url, &[]).await;
    assert!(secure(&csrf) && secure(&session), "{csrf} / {session}");
    for cookie in [&csrf, &session] {
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    }

    // A proxy trusted to set X-Forwarded-Proto: its word, per request.
    let url = serve(dashboard().trust_forwarded_proto()).await;
    let (csrf, session) = cookies_of_a_sign_in(&url, &forwarded).await;
    assert!(secure(&csrf) && secure(&session), "{csrf} / {session}");
    let (csrf, session) = cookies_of_a_sign_in(&url, &[("x-forwarded-proto", "http")]).await;
    assert!(!secure(&csrf) && !secure(&session), "{csrf} / {session}");

    assert!(dashboard().with_public_url("ops.example.com").is_err(), "a URL with its scheme");
}

/// A browser whose connections come from 127.0.0.`n`.
fn browser_at(n: u8) -> reqwest::Client {
    let address = std::net::IpAddr::from([127, 0, 0, n]);
    reqwest::Client::builder().cookie_store(true).redirect(Policy::none()).local_address(address).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_are_throttled_per_client_address_and_in_all() {
    let url = serve(Dashboard::new(database().await).with_token(TOKEN).unwrap()).await;
    let wrong = "not-the-token-at-all";

    // Five wrong tokens from one address, then 429 with Retry-After, even for the right token,
    // and for a bearer token.
    let mallory = browser_at(2);
    for _ in 0..5 {
        assert_eq!(sign_in(&mallory, &url, wrong, "/").await.status(), StatusCode::UNAUTHORIZED);
    }
    let refused = sign_in(&mallory, &url, TOKEN, "/").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "Retry-After: {wait}");
    let scrape = mallory.get(format!("{url}/metrics")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(scrape.status(), StatusCode::TOO_MANY_REQUESTS);

    // Another address signs in meanwhile.
    let ada = browser_at(3);
    assert_eq!(sign_in(&ada, &url, TOKEN, "/").await.status(), StatusCode::SEE_OTHER);

    // Twenty wrong tokens in all, from any number of addresses: then every sign-in waits, but
    // a browser already signed in goes on.
    for n in 4..=6 {
        for _ in 0..5 {
            assert_eq!(sign_in(&browser_at(n), &url, wrong, "/").await.status(), StatusCode::UNAUTHORIZED);
        }
    }
    assert_eq!(sign_in(&browser_at(7), &url, TOKEN, "/").await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(ada.get(format!("{url}/")).send().await.unwrap().status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_signs_out_and_every_session_can_be_revoked() {
    let url = serve(Dashboard::new(database().await).with_token(TOKEN).unwrap()).await;
    let (ada, grace, linus) = (client(), client(), client());
    let signed_in = sign_in(&ada, &url, TOKEN, "/").await;
    let ada_session = set_cookie(&signed_in, "redrive_session").split(';').next().unwrap().to_owned();
    for browser in [&grace, &linus] {
        assert_eq!(sign_in(browser, &url, TOKEN, "/").await.status(), StatusCode::SEE_OTHER);
    }
    let signed_out = |browser: &reqwest::Client| {
        let request = browser.get(format!("{url}/")).send();
        async move { request.await.unwrap().status() == StatusCode::SEE_OTHER }
    };

    // A sign-out without the form's CSRF token is refused.
    let logout = format!("{url}/logout");
    assert_eq!(ada.post(&logout).form(&[("csrf", "")]).send().await.unwrap().status(), StatusCode::FORBIDDEN);
    assert!(!signed_out(&ada).await);

    // Ada signs out: the cookie is cleared, and the server forgot the session (sent again by
    // hand, it opens nothing).
    let page = ada.get(&logout).send().await.unwrap().text().await.unwrap();
    let out = ada.post(&logout).form(&[("csrf", csrf(&page))]).send().await.unwrap();
    assert_eq!(out.headers()["location"], "/login");
    assert!(set_cookie(&out, "redrive_session").contains("Max-Age=0"), "the cookie is cleared");
    assert!(signed_out(&ada).await);
    let replayed = client().get(format!("{url}/")).header("cookie", &ada_session).send().await.unwrap();
    assert_eq!(replayed.status(), StatusCode::SEE_OTHER, "the session is gone on the server");
    assert!(!signed_out(&linus).await, "the others stay signed in");

    // Grace signs every browser out: Linus too.
    let page = grace.get(&logout).send().await.unwrap().text().await.unwrap();
    let form = [("csrf", csrf(&page)), ("everywhere", "yes".into())];
    assert_eq!(grace.post(&logout).form(&form).send().await.unwrap().status(), StatusCode::SEE_OTHER);
    assert!(signed_out(&grace).await && signed_out(&linus).await);
}
