//! The two calls the backend makes: events to the event API, and its functions to the API.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redrive_core::{Error, ErrorKind, Result};
use serde_json::Value;

use crate::config::InngestConfig;
use crate::error::{refusal, transport};

/// Events sent in one request at most.
pub(crate) const BATCH: usize = 100;

pub(crate) struct Api {
    http: reqwest::Client,
    events_url: String,
    register_url: String,
    api_url: String,
    bearer: String,
    /// Requests to the event API so far (the benchmark's requests per job).
    pub(crate) event_requests: AtomicU64,
}

impl Api {
    pub(crate) fn new(config: &InngestConfig) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Error::new(ErrorKind::Config, format!("Inngest: an HTTP client: {e}")))?;
        Ok(Self {
            http,
            events_url: format!("{}/e/{}", config.event_api_url, config.event_key),
            register_url: format!("{}/fn/register", config.api_url),
            api_url: config.api_url.clone(),
            bearer: crate::signature::bearer(&config.signing_key),
            event_requests: AtomicU64::new(0),
        })
    }

    /// Sends events (at most [`BATCH`]); the ids Inngest answers, one per event in order.
    pub(crate) async fn send(&self, events: &[Value]) -> Result<Vec<String>> {
        self.event_requests.fetch_add(1, Ordering::Relaxed);
        let response =
            self.http.post(&self.events_url).json(&events).send().await.map_err(|e| transport("send events", &e))?;
        if !response.status().is_success() {
            return Err(refusal("send events", response).await);
        }
        let answer: Value = response.json().await.map_err(|e| transport("send events", &e))?;
        let ids: Vec<String> = answer
            .get("ids")
            .and_then(Value::as_array)
            .map(|ids| ids.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default();
        if ids.len() != events.len() {
            return Err(Error::temporary("Inngest send events: not one id per event"));
        }
        Ok(ids)
    }

    /// Registers the app's functions.
    pub(crate) async fn register(&self, body: &Value) -> Result<Value> {
        let response = self
            .http
            .post(&self.register_url)
            .bearer_auth(&self.bearer)
            .json(body)
            .send()
            .await
            .map_err(|e| transport("register the functions", &e))?;
        if !response.status().is_success() {
            return Err(refusal("register the functions", response).await);
        }
        response.json().await.map_err(|e| transport("register the functions", &e))
    }

    /// The functions Inngest has registered for `app` (its REST API, read with the signing key).
    pub(crate) async fn functions(&self, app: &str) -> Result<Vec<Value>> {
        let url = format!("{}/v1/apps/{app}/functions", self.api_url);
        let what = "read the app's functions";
        let response = self.http.get(&url).bearer_auth(&self.bearer).send().await.map_err(|e| transport(what, &e))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(Vec::new());
        }
        if !response.status().is_success() {
            return Err(refusal(what, response).await);
        }
        let answer: Value = response.json().await.map_err(|e| transport(what, &e))?;
        Ok(answer.get("data").and_then(Value::as_array).cloned().unwrap_or_default())
    }
}
