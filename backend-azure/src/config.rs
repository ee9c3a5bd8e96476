//! Where the account is and how to sign for it: a connection string, or Azurite's development
//! account.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{ClientOptions, Context, Request, RetryOptions, Url};
use azure_storage_queue::{QueueClient, QueueClientOptions};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use redrive_core::{Error, ErrorKind, Result};

use crate::shared_key::SharedKey;

/// The Queue service version every request asks for: the newest Azurite 3.35 accepts (3.35 is
/// the newest Azurite that runs on Node 20; the SDK's default, 2026-04-06, needs Azurite 3.37).
pub const SERVICE_VERSION: &str = "2025-11-05";

/// Azurite's well-known development account and key (published in Azurite's README).
const DEV_ACCOUNT: &str = "devstoreaccount1";
const DEV_KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
const DEV_QUEUE_ENDPOINT: &str = "http://127.0.0.1:10001/devstoreaccount1";

/// An Azure Storage account's queue endpoint and how to sign for it: its shared key, or an
/// Entra ID token credential.
#[derive(Clone)]
pub struct AzureConfig {
    account: String,
    auth: Auth,
    endpoint: Url,
}

#[derive(Clone)]
enum Auth {
    SharedKey(Arc<[u8]>),
    /// Signed by the SDK's own bearer-token policy.
    Token(Arc<dyn TokenCredential>),
}

// The key is a secret: never printed.
impl std::fmt::Debug for AzureConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureConfig")
            .field("account", &self.account)
            .field("endpoint", &self.endpoint.as_str())
            .finish_non_exhaustive()
    }
}

fn config_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Config, message)
}

impl AzureConfig {
    /// Azurite's development account on its default queue port (`UseDevelopmentStorage=true`).
    pub fn development() -> Self {
        Self::from_connection_string("UseDevelopmentStorage=true").expect("the development account parses")
    }

    /// From a storage connection string: `AccountName=…;AccountKey=…` with `QueueEndpoint=…`, or
    /// `DefaultEndpointsProtocol` and `EndpointSuffix` to build it; or `UseDevelopmentStorage=true`.
    /// Errors never quote the string: it holds the key.
    pub fn from_connection_string(text: &str) -> Result<Self> {
        let mut fields = std::collections::HashMap::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) =
                part.split_once('=').ok_or_else(|| config_error("the connection string has a part without `=`"))?;
            fields.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
        let field = |name: &str| fields.get(name).map(String::as_str);
        if field("usedevelopmentstorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Self::new(DEV_ACCOUNT, DEV_KEY, DEV_QUEUE_ENDPOINT);
        }
        let account = field("accountname").ok_or_else(|| config_error("the connection string has no AccountName"))?;
        let key = field("accountkey").ok_or_else(|| {
            config_error(
                "the connection string has no AccountKey (for Entra ID, use AzureConfig::with_token_credential; SAS is \
                 not supported yet)",
            )
        })?;
        let endpoint = match field("queueendpoint") {
            Some(endpoint) => endpoint.to_owned(),
            None => format!(
                "{}://{account}.queue.{}",
                field("defaultendpointsprotocol").unwrap_or("https"),
                field("endpointsuffix").unwrap_or("core.windows.net")
            ),
        };
        Self::new(account, key, &endpoint)
    }

    /// From `AZURE_STORAGE_CONNECTION_STRING`, as Azure's tools read it.
    pub fn from_env() -> Result<Self> {
        let text = std::env::var("AZURE_STORAGE_CONNECTION_STRING")
            .map_err(|_| config_error("AZURE_STORAGE_CONNECTION_STRING is not set"))?;
        Self::from_connection_string(&text)
    }

    fn new(account: &str, key: &str, endpoint: &str) -> Result<Self> {
        let key = STANDARD.decode(key).map_err(|_| config_error("the AccountKey is not base64"))?;
        let endpoint = Url::parse(endpoint.trim_end_matches('/'))
            .map_err(|e| config_error(format!("the queue endpoint is not a URL: {e}")))?;
        if endpoint.cannot_be_a_base() || !matches!(endpoint.scheme(), "http" | "https") {
            return Err(config_error("the queue endpoint must be an http or https URL"));
        }
        Ok(Self { account: account.to_owned(), auth: Auth::SharedKey(key.into()), endpoint })
    }

    /// An endpoint (`https://<account>.queue.core.windows.net`) and an Entra ID token
    /// credential, such as one of the `azure_identity` crate's: the SDK's own authentication.
    /// Tokens go over HTTPS only; an `http` endpoint is a `Config` error.
    pub fn with_token_credential(endpoint: &str, credential: Arc<dyn TokenCredential>) -> Result<Self> {
        let endpoint = Url::parse(endpoint.trim_end_matches('/'))
            .map_err(|e| config_error(format!("the queue endpoint is not a URL: {e}")))?;
        if endpoint.scheme() != "https" || endpoint.cannot_be_a_base() {
            return Err(config_error("a token credential needs an https queue endpoint"));
        }
        let account = endpoint.host_str().and_then(|h| h.split('.').next()).unwrap_or_default().to_owned();
        Ok(Self { account, auth: Auth::Token(credential), endpoint })
    }

    /// The storage account's name.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// The queue service's endpoint (path-style on Azurite: `http://127.0.0.1:10001/<account>`).
    pub fn queue_endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    /// The Azure SDK's client for `queue`, signing with the shared key and asking for
    /// [`SERVICE_VERSION`]: for what this crate does not do itself. Its types are those of the
    /// SDK version this crate re-exports ([`azure_storage_queue`](crate::azure_storage_queue)).
    pub fn queue_client(&self, queue: &str) -> Result<QueueClient> {
        self.client(queue, None)
    }

    /// The client for `queue`, counting every try in `requests`.
    pub(crate) fn client(&self, queue: &str, requests: Option<Arc<RequestCounts>>) -> Result<QueueClient> {
        check_queue_name(queue)?;
        let mut url = self.endpoint.clone();
        url.path_segments_mut()
            .map_err(|()| config_error("the queue endpoint cannot take a path"))?
            .pop_if_empty()
            .push(queue);
        let mut per_try: Vec<Arc<dyn Policy>> = Vec::new();
        if let Some(requests) = requests {
            per_try.push(Arc::new(CountRequests(requests)));
        }
        let credential = match &self.auth {
            Auth::SharedKey(key) => {
                per_try.push(Arc::new(SharedKey::new(self.account.clone(), key.to_vec())));
                None
            }
            Auth::Token(credential) => Some(Arc::clone(credential)),
        };
        // No retries in the SDK: a retried Update Message whose first try was applied carries a
        // dead pop receipt, a retried delete finds nothing, a retried get hides messages never
        // delivered. The worker retries with its backoff, knowing what each call means.
        let retry = RetryOptions::none();
        let options = QueueClientOptions {
            client_options: ClientOptions { per_try_policies: per_try, retry, ..ClientOptions::default() },
            version: SERVICE_VERSION.to_owned(),
        };
        QueueClient::new(url, credential, Some(options)).map_err(|e| config_error(format!("azure: {e}")))
    }
}

/// How a backend's queues are set up and what their messages look like.
#[derive(Debug, Clone, Default)]
pub struct QueueOptions {
    /// Write message text in base64, as Azure Functions' queue trigger expects (default off:
    /// JSON as it is). Either is read.
    pub base64: bool,
    /// How long after it is sent Azure deletes a job's message, whatever its state: waiting,
    /// running, or waiting out a retry's delay, with no failure record (default `None`: never;
    /// Azure's own default of 7 days would lose jobs silently). Set one only for jobs that are
    /// worthless after it. A scheduled job is sent hidden a second less than this at most (Azure
    /// refuses more), and one due later expires unrun.
    pub time_to_live: Option<Duration>,
    /// How long the poison queue keeps a record written there while the record store was down
    /// (default `None`: never expires, until a drain moves it into the store).
    pub poison_time_to_live: Option<Duration>,
}

/// Azure's `messagettl`: seconds, or -1 for never.
pub(crate) fn ttl(time_to_live: Option<Duration>) -> i32 {
    time_to_live.map_or(-1, |d| d.as_secs().clamp(1, i32::MAX as u64) as i32)
}

/// Requests sent, every try, by what they do: what Azure bills.
#[derive(Debug, Default)]
pub struct RequestCounts {
    /// Get Messages, Peek Messages, Get Queue Metadata.
    pub gets: AtomicU64,
    /// Put Message.
    pub puts: AtomicU64,
    /// Update Message (renewals, retries, deferrals, releases), Create Queue.
    pub updates: AtomicU64,
    /// Delete Message.
    pub deletes: AtomicU64,
}

impl RequestCounts {
    /// All of them.
    pub fn total(&self) -> u64 {
        [&self.gets, &self.puts, &self.updates, &self.deletes].iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

/// Counts every try of every request, for cost figures.
#[derive(Debug)]
struct CountRequests(Arc<RequestCounts>);

#[async_trait]
impl Policy for CountRequests {
    async fn send(&self, ctx: &Context, request: &mut Request, next: &[Arc<dyn Policy>]) -> PolicyResult {
        let counter = match request.method().as_str() {
            "GET" | "HEAD" => &self.0.gets,
            "POST" => &self.0.puts,
            "DELETE" => &self.0.deletes,
            _ => &self.0.updates,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        next[0].send(ctx, request, &next[1..]).await
    }
}

/// Azure queue names: 3 to 63 of a-z 0-9 and `-`, starting and ending with a letter or digit,
/// no two `-` in a row.
pub(crate) fn check_queue_name(name: &str) -> Result<()> {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    let ok = (3..=63).contains(&name.len())
        && bytes.iter().all(|&b| alnum(b) || b == b'-')
        && bytes.first().is_some_and(|&b| alnum(b))
        && bytes.last().is_some_and(|&b| alnum(b))
        && !name.contains("--");
    ok.then_some(()).ok_or_else(|| {
        let rules = "3 to 63 of a-z 0-9 -, starting and ending with a letter or digit, with no `--`";
        Error::new(ErrorKind::InvalidName, format!("queue name {name:?} must be {rules}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_give_the_endpoint_and_never_show_the_key() {
        let dev = AzureConfig::development();
        assert_eq!((dev.account(), dev.queue_endpoint()), (DEV_ACCOUNT, DEV_QUEUE_ENDPOINT));
        let cloud = AzureConfig::from_connection_string(
            "DefaultEndpointsProtocol=https;AccountName=shop;AccountKey=c2VjcmV0;EndpointSuffix=core.windows.net",
        )
        .unwrap();
        assert_eq!(cloud.queue_endpoint(), "https://shop.queue.core.windows.net/");
        let explicit = AzureConfig::from_connection_string(
            "AccountName=devstoreaccount1;AccountKey=c2VjcmV0;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;",
        )
        .unwrap();
        assert_eq!(explicit.queue_endpoint(), "http://127.0.0.1:10001/devstoreaccount1");
        assert!(!format!("{cloud:?}").contains("c2VjcmV0") && !format!("{dev:?}").contains("Eby8"));
    }

    #[derive(Debug)]
    struct FixedToken;

    #[async_trait]
    impl TokenCredential for FixedToken {
        async fn get_token(
            &self,
            _scopes: &[&str],
            _options: Option<azure_core::credentials::TokenRequestOptions<'_>>,
        ) -> azure_core::Result<azure_core::credentials::AccessToken> {
            let expires = azure_core::time::OffsetDateTime::now_utc() + azure_core::time::Duration::hours(1);
            Ok(azure_core::credentials::AccessToken::new("token-value", expires))
        }
    }

    #[test]
    fn a_token_credential_needs_https_and_gives_a_client() {
        let config =
            AzureConfig::with_token_credential("https://shop.queue.core.windows.net/", Arc::new(FixedToken)).unwrap();
        assert_eq!((config.account(), config.queue_endpoint()), ("shop", "https://shop.queue.core.windows.net/"));
        assert!(config.queue_client("jobs").is_ok());
        let http = AzureConfig::with_token_credential("http://127.0.0.1:10001/acct", Arc::new(FixedToken));
        assert_eq!(http.unwrap_err().kind(), ErrorKind::Config);
    }

    #[test]
    fn bad_connection_strings_are_config_errors_that_quote_nothing() {
        for bad in ["AccountName=a", "AccountKey=c2VjcmV0", "AccountName=a;AccountKey=not base64!", "garbage"] {
            let err = AzureConfig::from_connection_string(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{bad}");
            assert!(!err.message().contains("c2VjcmV0") && !err.message().contains("base64!"), "{err}");
        }
    }

    #[test]
    fn queue_names_follow_azure_rules() {
        for ok in ["jobs", "job-s1", "abc", &"q".repeat(63)] {
            assert!(check_queue_name(ok).is_ok(), "{ok}");
        }
        for bad in ["ab", "Jobs", "-jobs", "jobs-", "jo--bs", "jobs_1", &"q".repeat(64)] {
            assert_eq!(check_queue_name(bad).unwrap_err().kind(), ErrorKind::InvalidName, "{bad}");
        }
    }
}
