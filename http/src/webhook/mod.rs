//! A webhook inbox: a provider's deliveries verified on their raw bytes, keyed by the provider's
//! event id, and enqueued as one job per event, so that a redelivery, a retry after a timeout or
//! two deliveries at the same instant run the event's effect once.
//!
//! ```no_run
//! # async fn run(queue: redrive_core::MemoryBackend) -> redrive_core::Result<()> {
//! use axum::Router;
//! use redrive_http::webhook::{Event, GitHub, Inbox, Stripe, WebhookEvent};
//! use serde::{Deserialize, Serialize};
//!
//! /// The part of Stripe's event this app reads.
//! #[derive(Serialize, Deserialize)]
//! struct Billing {
//!     #[serde(rename = "type")]
//!     kind: String,
//!     data: serde_json::Value,
//! }
//!
//! impl Event for Billing {
//!     const KIND: &'static str = "stripe_billing";
//! }
//!
//! let inbox = Inbox::new(queue);
//! let app: Router = Router::new()
//!     .route("/webhooks/stripe", inbox.endpoint::<Billing>("billing", Stripe::new("whsec_…")?)?)
//!     .route("/webhooks/github", inbox.endpoint::<serde_json::Value>("ci", GitHub::new("…")?)?);
//! // A worker runs them: `.handle::<WebhookEvent<Billing>>(|event, ctx| …)`.
//! # Ok(()) }
//! ```
//!
//! # What a delivery gets
//!
//! - The signature is checked on the raw body before anything parses it ([`Stripe`],
//!   [`GitHub`], [`StandardWebhooks`]); a missing or malformed header gets `400`, a signature
//!   that matches no secret or a signed timestamp outside the window (five minutes) `401`, and
//!   nothing is stored.
//! - A verified delivery becomes one job of the endpoint's [`Event::KIND`]: its payload is the
//!   provider, the endpoint, the event's id and type and the event's JSON ([`WebhookEvent`]), its
//!   idempotency key the provider, the endpoint and the event id. The enqueue is the store: one
//!   transaction on Postgres, SQLite and pgmq, the job row or message holding the event. Then
//!   `200` at once; the work runs in a worker, with the cap, the failure record, the alert and
//!   the replay. GitHub signs only the body, so its event's identity is the body's SHA-256
//!   ([`GitHub`]).
//! - The same event delivered again, or twice at the same instant, gets `200` and enqueues
//!   nothing (the key's unique constraint; on brokers with a dedupe window, the effect ledger
//!   keeps the effect to one). Its event's job failed for good: `200` too, the record holds it.
//! - The same event id with another body gets `409 Conflict` and is logged as an error: the
//!   first body is kept, the second is not silently dropped.
//! - A body that is not JSON gets `400`; one over [`Inbox::max_body`] (2 MiB) or larger than the
//!   queue carries `413`; a queue that is down `503`, and the provider delivers it again later.
//! - Logs name the provider, endpoint, event id and job, never the body or a secret.

mod github;
mod standard;
mod stripe;
mod verify;

use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use redrive_core::{Enqueue, Enqueued, ErrorKind, IdempotencyKey, Job, KeyBuilder, NewJob, Result, Retry};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::{error, info, warn};

pub use github::GitHub;
pub use standard::StandardWebhooks;
pub use stripe::Stripe;
pub use verify::{Delivery, Provider, Refused};

/// The app's type for one endpoint's events (the provider's JSON as the app reads it, or
/// [`serde_json::Value`]): the kind its jobs are enqueued as, and run by a worker's
/// `.handle::<WebhookEvent<E>>`.
pub trait Event: Serialize + DeserializeOwned + Send + 'static {
    /// The job kind of this endpoint's events, `[A-Za-z0-9_.-]{1,64}`.
    const KIND: &'static str;
    /// The attempts an event's job gets; `None`: the default cap.
    const CAP: Option<u32> = None;
}

/// Any event, as the provider's JSON: kind `webhook`.
impl Event for Value {
    const KIND: &'static str = "webhook";
}

/// One verified event, as its job carries it: who sent it, to which endpoint, its id and type,
/// and the event itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookEvent<E> {
    /// The provider: `stripe`, `github`, `standard`.
    pub provider: String,
    /// The endpoint's name, as mounted.
    pub endpoint: String,
    /// The event's signed identity, the idempotency key's fact ([`Delivery::id`]): Stripe's
    /// event id, Standard Webhooks' message id, the body's SHA-256 for GitHub.
    pub id: String,
    /// The event type, where the provider names one (GitHub's is not signed).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// The event, decoded as the app's type by the worker.
    pub event: E,
}

impl<E: Event> Job for WebhookEvent<E> {
    const KIND: &'static str = E::KIND;
    const CAP: Option<u32> = E::CAP;

    fn key(&self, key: KeyBuilder) -> KeyBuilder {
        event_key(key, &self.provider, &self.endpoint, &self.id)
    }
}

/// One event, one key: scoped by provider and endpoint, so two endpoints (or providers) that
/// happen to use the same id are two events.
fn event_key(key: KeyBuilder, provider: &str, endpoint: &str, id: &str) -> KeyBuilder {
    key.fact("provider", provider).fact("endpoint", endpoint).fact("event", id)
}

/// Mounts webhook endpoints that enqueue on `queue` (any backend: exact dedupe where it has it).
/// Clones share the endpoints' names.
#[derive(Debug, Clone)]
pub struct Inbox<Q> {
    queue: Q,
    names: Arc<Mutex<HashSet<String>>>,
    max_body: usize,
}

impl<Q: Enqueue + Clone + Send + Sync + 'static> Inbox<Q> {
    /// An inbox on `queue`, taking bodies of up to 2 MiB.
    pub fn new(queue: Q) -> Self {
        Self { queue, names: Arc::default(), max_body: 2 << 20 }
    }

    /// The largest body an endpoint reads (2 MiB by default), answered `413` past it before it
    /// is verified. Raise it for GitHub, whose payloads reach 25 MB; a backend's own limit
    /// (SQS: 256 KiB) still refuses a larger event, with `413` and an error logged.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// A `POST` route for endpoint `name` (`[A-Za-z0-9_.-]{1,64}`, part of each event's key)
    /// whose deliveries `provider` checks, each enqueued as a job of `E::KIND`. Mount it with
    /// `Router::route`. A name already mounted on this inbox is refused (`InvalidInput`): two
    /// endpoints under one name would share their events' keys.
    pub fn endpoint<E: Event>(&self, name: &str, provider: impl Provider) -> Result<MethodRouter> {
        redrive_core::key::check_name("webhook endpoint", name)?;
        redrive_core::key::check_name("job kind", E::KIND)?;
        if !self.names.lock().expect("the names' lock is never poisoned").insert(name.to_owned()) {
            return Err(redrive_core::Error::new(
                ErrorKind::InvalidInput,
                format!("the webhook endpoint `{name}` is mounted already"),
            ));
        }
        let endpoint = Endpoint {
            queue: self.queue.clone(),
            name: name.to_owned(),
            provider: Box::new(provider),
            event: PhantomData::<fn() -> E>,
        };
        Ok(post(receive::<Q, E>).with_state(Arc::new(endpoint)).layer(DefaultBodyLimit::max(self.max_body)))
    }
}

struct Endpoint<Q, E> {
    queue: Q,
    name: String,
    provider: Box<dyn Provider>,
    event: PhantomData<fn() -> E>,
}

impl<Q, E: Event> Endpoint<Q, E> {
    /// The job of a verified delivery: its payload is a [`WebhookEvent`] of the body's JSON, so
    /// that a body the app's type does not decode is still kept, as the failure record of its
    /// job (amend and replay it).
    fn job(&self, delivery: &Delivery) -> Result<NewJob> {
        let mut event = delivery.event.clone();
        self.provider.settle(&mut event);
        let provider = self.provider.name();
        let key = event_key(IdempotencyKey::builder(E::KIND), provider, &self.name, &delivery.id).build()?;
        let payload = WebhookEvent {
            provider: provider.to_owned(),
            endpoint: self.name.clone(),
            id: delivery.id.clone(),
            event_type: delivery.event_type.clone(),
            event,
        };
        let job = NewJob::new(E::KIND, key, serde_json::to_value(payload).expect("an event serializes"))?;
        Ok(match E::CAP {
            Some(cap) => job.with_cap(cap),
            None => job,
        })
    }
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

async fn receive<Q: Enqueue, E: Event>(
    State(endpoint): State<Arc<Endpoint<Q, E>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let provider = endpoint.provider.name();
    let name = endpoint.name.as_str();
    let now = chrono::Utc::now().timestamp();
    let delivery = match endpoint.provider.verify(&headers, &body, now) {
        Ok(delivery) => delivery,
        Err(refused) => {
            warn!(provider, endpoint = name, reason = %refused, "webhook delivery refused: nothing stored");
            return answer(refused.status(), json!({ "error": refused.to_string() }));
        }
    };
    let event = delivery.id.as_str();
    let guid = delivery.delivery.as_deref();
    let enqueued = match endpoint.job(&delivery) {
        Ok(job) => endpoint.queue.enqueue(job).await,
        Err(e) => Err(e),
    };
    match enqueued {
        Ok(Enqueued::Created(job)) => {
            info!(provider, endpoint = name, event, guid, job = %job, kind = E::KIND, "webhook event received");
            answer(StatusCode::OK, json!({ "received": event }))
        }
        Ok(Enqueued::Duplicate { id: job, .. } | Enqueued::Failed { id: job }) => {
            info!(provider, endpoint = name, event, guid, job = %job, "webhook event delivered again: nothing enqueued");
            answer(StatusCode::OK, json!({ "received": event, "duplicate": true }))
        }
        Err(e) if e.kind() == ErrorKind::KeyConflict => {
            error!(
                provider,
                endpoint = name,
                event,
                "webhook event delivered again with another body: refused, the first body is kept"
            );
            answer(StatusCode::CONFLICT, json!({ "error": "this event id was received with another body" }))
        }
        Err(e) if e.kind() == ErrorKind::PayloadTooLarge => {
            error!(provider, endpoint = name, event, error = %e, "webhook event too large for the queue: refused");
            answer(StatusCode::PAYLOAD_TOO_LARGE, json!({ "error": "the event is larger than the queue carries" }))
        }
        Err(e) if e.retry() == Retry::Temporary => {
            warn!(provider, endpoint = name, event, error = %e, "webhook event not stored: the queue is unavailable");
            answer(StatusCode::SERVICE_UNAVAILABLE, json!({ "error": "not stored; deliver it again" }))
        }
        Err(e) => {
            error!(provider, endpoint = name, event, error = %e, "webhook event not stored");
            answer(StatusCode::INTERNAL_SERVER_ERROR, json!({ "error": "not stored" }))
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    // The providers' published examples (GitHub's docs, the Standard Webhooks specification),
    // and a header stripe-node's generateTestHeaderString made.
    #[test]
    fn the_providers_examples_verify() {
        let github = GitHub::new("It's a Secret to Everybody").unwrap();
        let signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(github.signature_header(b"Hello, World!"), signature);
        let h =
            headers(&[("x-hub-signature-256", signature), ("x-github-delivery", "d-1"), ("x-github-event", "ping")]);
        // Signed, but not JSON (a form-encoded webhook): refused once the signature checked.
        let refused = github.verify(&h, b"Hello, World!", 0).unwrap_err();
        assert_eq!(refused, Refused::Malformed("the body is not JSON".into()));
        let body = br#"{"zen":"Keep it logically awesome."}"#;
        let h = headers(&[
            ("x-hub-signature-256", &github.signature_header(body)),
            ("x-github-delivery", "d-1"),
            ("x-github-event", "ping"),
        ]);
        let delivery = github.verify(&h, body, 0).unwrap();
        let expected = Delivery {
            id: "0252d04b81792d637d82235c2e3f2f5a1aef4939830565eee2aec25d37681212".into(),
            delivery: Some("d-1".into()),
            event_type: Some("ping".into()),
            event: json!({"zen": "Keep it logically awesome."}),
        };
        assert_eq!(delivery, expected, "the id is the signed body's SHA-256, not the unsigned GUID");

        let standard = StandardWebhooks::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let (id, t, body) = ("msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, br#"{"test": 2432232314}"#);
        let signature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        assert_eq!(standard.signature_header(id, t, body), signature);
        let h = headers(&[("webhook-id", id), ("webhook-timestamp", "1614265330"), ("webhook-signature", signature)]);
        assert_eq!(standard.verify(&h, body, t + 10).unwrap().id, id);
        assert_eq!(standard.verify(&h, body, t + 301), Err(Refused::OutsideWindow { age: 301 }));
        assert_eq!(standard.verify(&h, body, t - 301), Err(Refused::OutsideWindow { age: -301 }));
        assert!(standard.verify(&h, body, t + 300).is_ok(), "the window's edge is inside");
        // Svix's senders (Resend, Clerk) name the headers svix-*.
        let h = headers(&[("svix-id", id), ("svix-timestamp", "1614265330"), ("svix-signature", signature)]);
        assert_eq!(standard.verify(&h, body, t).unwrap().id, id);

        let stripe = Stripe::new("whsec_test_secret").unwrap();
        let body = br#"{"id":"evt_test_123","object":"event","type":"payment_intent.succeeded"}"#;
        let signature = "t=1700000000,v1=a664e91ef71ff03e5f143b0ecc9af428db3fbc0a905d1fa93288032c8cdd37a5";
        assert_eq!(stripe.signature_header(1_700_000_000, body), signature);
        // Test mode adds a v0 that is not checked; a signature that is not hex matches nothing.
        // Empty elements are skipped, as Stripe's libraries do.
        let h = headers(&[("stripe-signature", &format!("{signature},v0=deadbeef,v1=zz,"))]);
        let delivery = stripe.verify(&h, body, 1_700_000_100).unwrap();
        assert_eq!(delivery.id, "evt_test_123");
        assert_eq!(delivery.event_type.as_deref(), Some("payment_intent.succeeded"));
    }

    #[test]
    fn malformed_headers_are_refused_as_such() {
        let stripe = Stripe::new("whsec_x").unwrap();
        let refused = |value: &str| stripe.verify(&headers(&[("stripe-signature", value)]), b"{}", 0).unwrap_err();
        assert!(matches!(refused("v1=00"), Refused::Malformed(_)), "no timestamp");
        assert!(matches!(refused("t=1,t=2,v1=00"), Refused::Malformed(_)), "two timestamps");
        assert_eq!(refused("t=0,v0=00"), Refused::BadSignature, "no v1");
        assert_eq!(refused("t=0"), Refused::BadSignature);
        assert_eq!(Refused::BadSignature.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(Refused::MissingHeader("stripe-signature").status(), StatusCode::BAD_REQUEST);
        assert!(StandardWebhooks::new("whsec_not base64!").is_err());
        // A sender listing many signatures to make each request cost many MACs.
        let many = format!("t=0{}", ",v1=".repeat(10_000));
        assert!(matches!(refused(&many), Refused::Malformed(_)), "too many signatures");
    }

    #[test]
    fn an_empty_secret_is_refused() {
        for refused in [
            Stripe::new("").map(drop),
            Stripe::new("whsec_x").and_then(|s| s.also("")).map(drop),
            GitHub::new("").map(drop),
            StandardWebhooks::new("whsec_").map(drop),
        ] {
            assert_eq!(refused.unwrap_err().kind(), ErrorKind::Config);
        }
    }

    #[test]
    fn stripe_s_pending_webhooks_count_is_not_part_of_the_stored_event() {
        let mut event = json!({"id": "evt_1", "pending_webhooks": 2, "data": {}});
        Stripe::new("whsec_x").unwrap().settle(&mut event);
        assert_eq!(event, json!({"id": "evt_1", "data": {}}));
    }

    #[derive(Serialize, Deserialize)]
    struct Ping;

    impl Event for Ping {
        const KIND: &'static str = "ping";
    }

    /// The key the inbox enqueues under is the one the job type computes: a job the app enqueues
    /// itself for an event (`NewJob::from_job`) has the delivered one's key (a duplicate of it
    /// where its payload serializes to the same JSON, a key conflict otherwise).
    #[test]
    fn the_inbox_s_key_is_the_event_job_s_key() {
        let endpoint = Endpoint {
            queue: (),
            name: "pings".into(),
            provider: Box::new(GitHub::new("s").unwrap()),
            event: PhantomData::<fn() -> Ping>,
        };
        let delivery = Delivery { id: "d 1/é".into(), delivery: None, event_type: None, event: Value::Null };
        let job = endpoint.job(&delivery).unwrap();
        let event = WebhookEvent {
            provider: "github".into(),
            endpoint: "pings".into(),
            id: delivery.id,
            event_type: None,
            event: Ping,
        };
        assert_eq!(job.key, NewJob::from_job(&event).unwrap().key);
        assert_eq!(job.kind, "ping");
    }
}
