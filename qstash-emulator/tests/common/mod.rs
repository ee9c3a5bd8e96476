//! A destination server for the tests: records every request and answers from a per-path script.

#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

/// One request the destination got.
#[derive(Debug, Clone)]
pub struct Hit {
    pub method: Method,
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

impl Hit {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
    }
}

/// A scripted answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn status(status: u16) -> Answer {
        Answer { status, headers: Vec::new(), body: String::new() }
    }

    pub fn header(mut self, k: &str, v: &str) -> Answer {
        self.headers.push((k.to_owned(), v.to_owned()));
        self
    }

    pub fn body(mut self, b: &str) -> Answer {
        self.body = b.to_owned();
        self
    }
}

#[derive(Default)]
struct Inner {
    hits: Vec<Hit>,
    script: HashMap<String, VecDeque<Answer>>,
    always: HashMap<String, Answer>,
}

/// The destination: `url(path)` gives a full URL on it.
#[derive(Clone)]
pub struct Destination {
    pub base: String,
    inner: Arc<Mutex<Inner>>,
}

impl Destination {
    pub async fn start() -> Destination {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Destination { base: format!("http://{addr}"), inner }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Answers the next requests to `path` with these, in order (then `always`, else 200).
    pub fn script(&self, path: &str, answers: Vec<Answer>) {
        self.inner.lock().unwrap().script.entry(path.to_owned()).or_default().extend(answers);
    }

    /// Answers every request to `path` (after the script) with this.
    pub fn always(&self, path: &str, answer: Answer) {
        self.inner.lock().unwrap().always.insert(path.to_owned(), answer);
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.inner.lock().unwrap().hits.clone()
    }

    pub fn hits_on(&self, path: &str) -> Vec<Hit> {
        self.hits().into_iter().filter(|h| h.path == path).collect()
    }

    pub async fn wait_hits(&self, path: &str, n: usize, timeout: Duration) -> Vec<Hit> {
        let deadline = Instant::now() + timeout;
        loop {
            let hits = self.hits_on(path);
            if hits.len() >= n || Instant::now() > deadline {
                return hits;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let mut g = inner.lock().unwrap();
    g.hits.push(Hit {
        method,
        path: path.clone(),
        query: uri.query().map(str::to_owned),
        headers,
        body,
        at: Instant::now(),
    });
    let answer = g
        .script
        .get_mut(&path)
        .and_then(VecDeque::pop_front)
        .or_else(|| g.always.get(&path).cloned())
        .unwrap_or_else(|| Answer::status(200).body("ok"));
    let mut resp = (StatusCode::from_u16(answer.status).unwrap(), answer.body).into_response();
    for (k, v) in answer.headers {
        resp.headers_mut().insert(HeaderName::try_from(k).unwrap(), HeaderValue::try_from(v).unwrap());
    }
    resp
}
