//! `redrive serve` behind TLS: `--public-url https://…`, or `--trust-forwarded-proto` with the
//! proxy's header, makes the dashboard's cookies `Secure`; without either they are not.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use common::{database, database_url, redrive_command};

/// A `redrive serve`, killed when dropped.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `redrive serve` with `args` on a free loopback port; it and its base URL.
fn serve(schema: &str, args: &[&str]) -> (Serving, String) {
    let mut command = redrive_command(&database_url(), schema);
    command.args(["serve", "--bind", "127.0.0.1:0"]).args(args).stderr(Stdio::piped());
    command.env("REDRIVE_DASHBOARD_TOKEN", "serve-https-token-0123456789");
    let mut child = command.spawn().expect("the redrive binary runs");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| line.split_once("the dashboard is on ").map(|(_, url)| url.trim().to_owned()))
        .expect("redrive serve started");
    std::thread::spawn(move || lines.for_each(drop));
    (Serving(child), url)
}

/// Whether the sign-in page's CSRF cookie is `Secure`, asked with `headers`.
async fn secure_cookie(url: &str, headers: &[(&str, &str)]) -> bool {
    let mut request = reqwest::Client::new().get(format!("{url}/login"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let cookie = response.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.starts_with("redrive_csrf="), "{cookie}");
    cookie.split(';').any(|attribute| attribute.trim() == "Secure")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_tls_the_dashboards_cookies_are_secure() {
    let db = database().await;
    let forwarded = [("x-forwarded-proto", "https")];

    let (_plain, url) = serve(db.schema(), &[]);
    assert!(!secure_cookie(&url, &forwarded).await, "a client's X-Forwarded-Proto is not trusted by default");

    let (_public, url) = serve(db.schema(), &["--public-url", "https://ops.example.com/"]);
    assert!(secure_cookie(&url, &[]).await, "an https public URL");

    let (_proxied, url) = serve(db.schema(), &["--trust-forwarded-proto"]);
    assert!(secure_cookie(&url, &forwarded).await, "a trusted proxy said https");
    assert!(!secure_cookie(&url, &[]).await, "and plain http when it did not");

    let refused = redrive_command(&database_url(), db.schema())
        .args(["serve", "--bind", "127.0.0.1:0", "--public-url", "ops.example.com"])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "a public URL without its scheme is refused");
}
