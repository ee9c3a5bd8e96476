//! QStash's REST API, over reqwest: publish, batch, the DLQ and the signing keys. Errors map onto
//! redrive's kinds; their messages carry QStash's reason, never the token or a body.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redrive_core::{Error, ErrorKind, Result};
use reqwest::{RequestBuilder, Response};
use serde::Deserialize;
use serde_json::Value;

use crate::config::SigningKeys;
use crate::error::{cause, refusal};

/// The most messages one `/v2/batch` call carries.
pub(crate) const BATCH: usize = 100;

pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
    /// Publish and batch calls made, for the benchmark's publishes per job.
    pub(crate) publishes: AtomicU64,
}

/// What QStash answered to one published message.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Published {
    pub(crate) message_id: String,
    #[serde(default)]
    pub(crate) deduplicated: bool,
}

/// One message to publish: its headers (QStash's and the forwarded ones) and body.
pub(crate) struct Outgoing {
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

/// A DLQ entry, as `GET /v2/dlq` lists it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DlqEntry {
    pub(crate) dlq_id: String,
    pub(crate) message_id: String,
    /// The destination it was sent to: the account's DLQ holds every destination's.
    #[serde(default)]
    pub(crate) url: Option<String>,
    #[serde(default)]
    pub(crate) header: Option<std::collections::HashMap<String, Vec<String>>>,
    #[serde(default)]
    pub(crate) body: Option<String>,
    #[serde(default)]
    pub(crate) body_base64: Option<String>,
    #[serde(default)]
    pub(crate) created_at: Option<i64>,
    #[serde(default)]
    pub(crate) retried: Option<u32>,
    #[serde(default)]
    pub(crate) response_status: Option<u16>,
    #[serde(default)]
    pub(crate) response_header: Option<std::collections::HashMap<String, Vec<String>>>,
    #[serde(default)]
    pub(crate) response_body: Option<String>,
    #[serde(default)]
    pub(crate) response_body_base64: Option<String>,
}

#[derive(Deserialize)]
struct DlqPage {
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    messages: Vec<DlqEntry>,
}

impl Api {
    pub(crate) fn new(base: &str, token: &str, timeout: Duration) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Error::new(ErrorKind::Config, "could not build the HTTP client").with_source(e))?;
        Ok(Self { http, base: base.to_owned(), token: token.to_owned(), publishes: AtomicU64::new(0) })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send(&self, request: RequestBuilder, what: &str) -> Result<Response> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| Error::temporary(format!("QStash {what}: no answer ({})", cause(&e))))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(refusal(what, response).await)
    }

    pub(crate) async fn publish(&self, destination: &str, queue: Option<&str>, message: Outgoing) -> Result<Published> {
        let path = match queue {
            Some(queue) => format!("/v2/enqueue/{queue}/{destination}"),
            None => format!("/v2/publish/{destination}"),
        };
        let mut request = self.http.post(self.url(&path)).body(message.body);
        for (name, value) in message.headers {
            request = request.header(name, value);
        }
        self.publishes.fetch_add(1, Ordering::Relaxed);
        json(self.send(request, "publish").await?, "publish").await
    }

    pub(crate) async fn batch(
        &self,
        destination: &str,
        queue: Option<&str>,
        messages: Vec<Outgoing>,
    ) -> Result<Vec<Published>> {
        let items: Vec<Value> = messages
            .into_iter()
            .map(|m| {
                let headers: serde_json::Map<String, Value> =
                    m.headers.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
                let mut item = serde_json::json!({"destination": destination, "headers": headers, "body": m.body});
                if let Some(queue) = queue {
                    item["queue"] = Value::String(queue.to_owned());
                }
                item
            })
            .collect();
        self.publishes.fetch_add(1, Ordering::Relaxed);
        let response = self.send(self.http.post(self.url("/v2/batch")).json(&items), "batch publish").await?;
        // Each item answers as a publish does, or, for a URL group, as a list of them.
        let answers: Vec<Value> = json(response, "batch publish").await?;
        answers
            .into_iter()
            .map(|a| {
                let one = if let Value::Array(mut many) = a { many.pop().unwrap_or(Value::Null) } else { a };
                serde_json::from_value(one)
                    .map_err(|_| Error::temporary("QStash batch publish: an answer without a message id"))
            })
            .collect()
    }

    /// One page of the DLQ entries of `url` (the list's `url` filter: the DLQ is the account's).
    pub(crate) async fn dlq_page(&self, url: &str, cursor: Option<&str>) -> Result<(Vec<DlqEntry>, Option<String>)> {
        let mut request = self.http.get(self.url("/v2/dlq")).query(&[("count", "100"), ("url", url)]);
        if let Some(cursor) = cursor {
            request = request.query(&[("cursor", cursor)]);
        }
        let page: DlqPage = json(self.send(request, "DLQ list").await?, "DLQ list").await?;
        let cursor = page.cursor.filter(|c| !c.is_empty());
        Ok((page.messages, cursor))
    }

    /// One DLQ entry; `NotFound` when it is gone.
    pub(crate) async fn dlq_get(&self, dlq_id: &str) -> Result<DlqEntry> {
        let request = self.http.get(self.url(&format!("/v2/dlq/{dlq_id}")));
        json(self.send(request, "DLQ get").await?, "DLQ get").await
    }

    /// Deletes DLQ entries; one that is gone already counts as deleted.
    pub(crate) async fn dlq_delete(&self, dlq_ids: &[String]) -> Result<()> {
        for chunk in dlq_ids.chunks(100) {
            let request = self.http.delete(self.url("/v2/dlq")).json(&serde_json::json!({"dlqIds": chunk}));
            self.send(request, "DLQ delete").await?;
        }
        Ok(())
    }

    /// Sends a DLQ entry's message again through QStash's retry API: the new message's id, or
    /// the earlier one's with `deduplicated` when QStash sent nothing (the message's
    /// deduplication id is still in its window). `overrides` are `Upstash-*` headers that change
    /// the message's settings for the retry.
    pub(crate) async fn dlq_retry(&self, dlq_id: &str, overrides: Vec<(String, String)>) -> Result<Published> {
        let mut request = self.http.post(self.url(&format!("/v2/dlq/retry/{dlq_id}")));
        for (name, value) in overrides {
            request = request.header(name, value);
        }
        json(self.send(request, "DLQ retry").await?, "DLQ retry").await
    }

    pub(crate) async fn signing_keys(&self) -> Result<SigningKeys> {
        #[derive(Deserialize)]
        struct Keys {
            current: String,
            next: String,
        }
        let keys: Keys =
            json(self.send(self.http.get(self.url("/v2/keys")), "signing keys").await?, "signing keys").await?;
        Ok(SigningKeys { current: keys.current, next: keys.next })
    }
}

async fn json<T: serde::de::DeserializeOwned>(response: Response, what: &str) -> Result<T> {
    let bytes = response.bytes().await.map_err(|e| Error::temporary(format!("QStash {what}: {}", cause(&e))))?;
    // serde's message may quote the answer: it is left out.
    serde_json::from_slice(&bytes)
        .map_err(|_| Error::temporary(format!("QStash {what}: an answer that is not the expected JSON")))
}
