//! Where the queues are and how to reach them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_sqs::Client;

/// The SQS backend's configuration. The AWS SDK reads credentials and region from the
/// environment as usual (`AWS_ACCESS_KEY_ID`, `AWS_REGION`, profiles, instance roles);
/// `REDRIVE_SQS_ENDPOINT` (or [`with_endpoint`](Self::with_endpoint)) points it elsewhere,
/// such as a local moto server.
#[derive(Clone)]
pub struct SqsConfig {
    pub(crate) queue: String,
    pub(crate) endpoint: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) wait: Duration,
    pub(crate) static_credentials: Option<(String, String)>,
}

// Credentials are secrets: never printed.
impl std::fmt::Debug for SqsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsConfig")
            .field("queue", &self.queue)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl SqsConfig {
    /// The source queue by name; its dead-letter queue is read from its redrive policy.
    pub fn new(queue: impl Into<String>) -> Self {
        Self {
            queue: queue.into(),
            endpoint: std::env::var("REDRIVE_SQS_ENDPOINT").ok(),
            region: None,
            wait: Duration::from_secs(20),
            static_credentials: None,
        }
    }

    /// Sends every request to `url` instead of AWS (moto, LocalStack, a VPC endpoint).
    pub fn with_endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// The region, when the environment does not say.
    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Fixed credentials, for local emulators (moto, LocalStack) that accept any; real
    /// deployments should let the SDK find theirs.
    pub fn with_static_credentials(mut self, access_key_id: impl Into<String>, secret: impl Into<String>) -> Self {
        self.static_credentials = Some((access_key_id.into(), secret.into()));
        self
    }

    /// The longest long poll of one receive (default and maximum 20 s). `Duration::ZERO` turns
    /// long polling off: an empty receive then waits out the worker's poll interval before the
    /// next one, and a drain of the DLQ uses short polls, which on AWS sample the servers and can
    /// end a drain early (the rest is drained by the next read). (moto holds a long poll for its
    /// whole wait even when messages are ready, so the tests use short polling.)
    pub fn with_max_wait(mut self, wait: Duration) -> Self {
        self.wait = wait.min(Duration::from_secs(20));
        self
    }
}

/// The queues [`SqsBackend::setup`](crate::SqsBackend::setup) creates.
#[derive(Debug, Clone)]
pub struct QueueSetup {
    /// Receives after which SQS itself moves a message to the DLQ: the safety net for workers
    /// that crash on their last attempt. Must be at least every job's cap (default 5).
    pub max_receive_count: u32,
    /// How long messages are kept, on both queues (default 4 days; the DLQ never keeps less).
    pub retention: Duration,
    /// The largest message, envelope and attributes included (default 256 KiB, at most 1 MiB).
    pub max_message_size: usize,
    /// A FIFO queue pair (`.fifo` is appended to the names).
    pub fifo: bool,
}

impl Default for QueueSetup {
    fn default() -> Self {
        Self {
            max_receive_count: 5,
            retention: Duration::from_secs(4 * 24 * 3600),
            max_message_size: 256 * 1024,
            fifo: false,
        }
    }
}

impl SqsConfig {
    /// The SQS client this configuration reaches, counting its requests in `requests`.
    pub(crate) async fn client(&self, requests: &Arc<AtomicU64>) -> Client {
        Self::client_from(&self.sdk_config().await, requests)
    }

    /// The SQS client on settings already loaded, for a caller that needs them for more than SQS.
    pub(crate) fn client_from(shared: &aws_config::SdkConfig, requests: &Arc<AtomicU64>) -> Client {
        let sqs = aws_sdk_sqs::config::Builder::from(shared).interceptor(CountRequests(Arc::clone(requests))).build();
        Client::from_conf(sqs)
    }

    /// The AWS settings: region, credentials and endpoint, from the environment unless given.
    pub(crate) async fn sdk_config(&self) -> aws_config::SdkConfig {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(endpoint) = &self.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some(region) = &self.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some((key, secret)) = &self.static_credentials {
            let credentials = aws_sdk_sqs::config::Credentials::new(key, secret, None, None, "redrive-static");
            loader = loader.credentials_provider(credentials);
        }
        loader.load().await
    }
}

#[derive(Debug)]
/// Counts every HTTP attempt the client makes, for cost and efficiency figures.
struct CountRequests(Arc<AtomicU64>);

impl aws_sdk_sqs::config::Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "redrive-count-requests"
    }

    fn read_before_transmit(
        &self,
        _context: &aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _components: &aws_sdk_sqs::config::RuntimeComponents,
        _cfg: &mut aws_sdk_sqs::config::ConfigBag,
    ) -> std::result::Result<(), aws_sdk_sqs::error::BoxError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
