//! `redrive verify` on a push service (QStash, Inngest): the endpoint of its own that the service
//! delivers the verification jobs to. The URL must be a destination no application endpoint
//! answers (its jobs would reach the application's workers, and the service's records are kept
//! per destination or app), and it must lead to `--listen`: both are checked before anything is
//! enqueued.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::MethodRouter;
use redrive::{Error, ErrorKind, Result};

/// How long the destination has to answer a probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Verify's endpoint, served until dropped.
pub(crate) struct Receiver(tokio::task::JoinHandle<()>);

impl Drop for Receiver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Checks that nothing answers at the destination of `url` (`SCHEME[+http]://HOST/PATH`) as an
/// endpoint of `service` does, serves `endpoint` on `listen` at the URL's path, then checks that
/// the destination leads to it.
pub(crate) async fn serve(url: &str, service: &str, endpoint: MethodRouter, listen: SocketAddr) -> Result<Receiver> {
    let (destination, path) = destination(url)?;
    if let Some(status) = receiver_answers(&destination).await? {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "a receiver already answers at {destination} ({status} to an unsigned request): verify's jobs \
                 would reach the application's workers. Give verify a destination of its own (another path), \
                 leading to --listen"
            ),
        ));
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Error::new(ErrorKind::Config, format!("cannot listen on {listen}")).with_source(e))?;
    let hits = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&hits);
    let app = axum::Router::new().route(&path, endpoint).layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            counted.fetch_add(1, Ordering::SeqCst);
            next.run(request)
        },
    ));
    let served = Receiver(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "redrive verify's receiver stopped");
        }
    }));
    let before = hits.load(Ordering::SeqCst);
    let answered = receiver_answers(&destination).await?;
    if answered.is_none() || hits.load(Ordering::SeqCst) == before {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "{destination} does not lead to --listen {listen}: {service} could not deliver verify's jobs. \
                 Route the URL's host and path to that address"
            ),
        ));
    }
    Ok(served)
}

/// The destination the service pushes to (the URL's query, its settings, left out), and its path.
fn destination(url: &str) -> Result<(String, String)> {
    let invalid = || Error::new(ErrorKind::InvalidName, "a push service's URL is SCHEME://HOST/PATH");
    let (scheme, rest) = url.split_once("://").ok_or_else(invalid)?;
    let http = if scheme.ends_with("+http") { "http" } else { "https" };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let path = rest.find('/').map_or("/", |at| &rest[at..]);
    Ok((format!("{http}://{rest}"), path.to_owned()))
}

/// The status of an unsigned POST to `destination` when it is refused as the receiver refuses it
/// (401 or 403); `None` when nothing answers or something else does.
async fn receiver_answers(destination: &str) -> Result<Option<reqwest::StatusCode>> {
    let client = reqwest::Client::builder()
        .timeout(PROBE_TIMEOUT)
        .build()
        .map_err(|e| Error::new(ErrorKind::Config, "cannot build an HTTP client").with_source(e))?;
    Ok(match client.post(destination).send().await {
        Ok(answer) if matches!(answer.status().as_u16(), 401 | 403) => Some(answer.status()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::destination;

    #[test]
    fn the_destination_and_its_path() {
        let (url, path) = destination("qstash+http://127.0.0.1:8080/redrive/verify").unwrap();
        assert_eq!((url.as_str(), path.as_str()), ("http://127.0.0.1:8080/redrive/verify", "/redrive/verify"));
        let (url, path) = destination("qstash://verify.example.com").unwrap();
        assert_eq!((url.as_str(), path.as_str()), ("https://verify.example.com", "/"));
        let (url, path) = destination("inngest+http://127.0.0.1:8080/api/verify?app=shop").unwrap();
        assert_eq!((url.as_str(), path.as_str()), ("http://127.0.0.1:8080/api/verify", "/api/verify"));
        let (url, path) = destination("inngest://verify.example.com?app=shop").unwrap();
        assert_eq!((url.as_str(), path.as_str()), ("https://verify.example.com", "/"));
    }
}
