//! `AzureConfig::doctor`: the rules an Azure queue and its `-poison` queue must hold (see
//! `redrive_core::doctor`), read without `AzureBackend::connect`, which refuses a missing poison
//! queue rather than report it.

use azure_core::time::OffsetDateTime;
use azure_storage_queue::QueueClient;
use azure_storage_queue::models::QueueClientPeekMessagesOptions;
use redrive_core::doctor::{Check, Expect};
use redrive_core::{ErrorKind, Result};
use serde_json::Value;

use crate::AzureConfig;
use crate::error::azure;
use crate::wire::POISON_MARK;

/// Messages peeked per queue: the most one peek returns.
const PEEK: u8 = 32;
/// Azure's default message time to live, which a producer gets unless it sends its own.
const DEFAULT_TTL_SECS: i64 = 7 * 24 * 3600;

/// A visible message as a peek shows it.
struct Peeked {
    text: String,
    /// Seconds from insertion to expiry; `None` for never (Azure writes year 9999).
    ttl: Option<i64>,
}

/// What the rules read: each queue's messages, or `None` where the queue does not exist.
struct Facts {
    queue: String,
    source: Option<Vec<Peeked>>,
    poison: Option<Vec<Peeked>>,
}

impl AzureConfig {
    /// Checks the rules `queue` must hold: it and its `<queue>-poison` queue exist; its
    /// messages never expire on their own (Azure drops a message after 7 days unless its
    /// producer says otherwise); and their encoding suits an Azure Functions trigger when
    /// [`Expect::functions`] says one reads the queue. Reads only: messages are peeked, at most
    /// 32 per queue.
    pub async fn doctor(&self, queue: &str, expect: &Expect) -> Result<Vec<Check>> {
        let source = peek(&self.queue_client(queue)?).await?;
        let poison = peek(&self.queue_client(&format!("{queue}-poison"))?).await?;
        Ok(judge(&Facts { queue: queue.to_owned(), source, poison }, expect))
    }
}

/// The visible messages of a queue (up to [`PEEK`]), or `None` when it does not exist.
async fn peek(client: &QueueClient) -> Result<Option<Vec<Peeked>>> {
    let options = QueueClientPeekMessagesOptions { number_of_messages: Some(PEEK.into()), ..Default::default() };
    let peeked = match client.peek_messages(Some(options)).await {
        Ok(peeked) => peeked,
        Err(e) => {
            let e = azure(e, "peek the queue");
            return if e.kind() == ErrorKind::NotFound { Ok(None) } else { Err(e) };
        }
    };
    let peeked = peeked.into_model().map_err(|e| azure(e, "read peeked messages"))?;
    let messages = peeked
        .items
        .unwrap_or_default()
        .into_iter()
        .map(|m| Peeked { text: m.message_text.unwrap_or_default(), ttl: ttl(m.insertion_time, m.expiration_time) });
    Ok(Some(messages.collect()))
}

fn ttl(inserted: Option<OffsetDateTime>, expires: Option<OffsetDateTime>) -> Option<i64> {
    let (inserted, expires) = (inserted?, expires?);
    (expires.year() < 9999).then(|| (expires - inserted).whole_seconds())
}

/// How a message's text is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Json,
    Base64,
    Other,
}

fn encoding(text: &str) -> Encoding {
    use base64::Engine;
    if text.trim_start().starts_with('{') {
        Encoding::Json
    } else if base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .is_ok_and(|bytes| serde_json::from_slice::<Value>(&bytes).is_ok())
    {
        Encoding::Base64
    } else {
        Encoding::Other
    }
}

fn judge(facts: &Facts, expect: &Expect) -> Vec<Check> {
    let queue = &facts.queue;
    let poison = format!("{queue}-poison");
    let mut checks = Vec::new();
    let exists = |rule, name: &str, found: &Option<Vec<Peeked>>, why: &str| match found {
        Some(_) => Check::pass(rule, format!("{name} exists")),
        None => Check::fail(
            rule,
            format!("{name} does not exist{why}"),
            format!("create {name} (`AzureBackend::setup` creates the queue and its poison queue)"),
        ),
    };
    checks.push(exists("azure.queue", queue, &facts.source, ""));
    checks.push(exists(
        "azure.poison-queue",
        &poison,
        &facts.poison,
        ": failure records have no fallback while the records store is down, and the workers refuse to start",
    ));
    let peeked: Vec<&Peeked> = facts.source.iter().chain(&facts.poison).flatten().collect();
    checks.push(ttl_rule(queue, &peeked));
    checks.push(encoding_rule(queue, facts, expect));
    checks
}

fn ttl_rule(queue: &str, peeked: &[&Peeked]) -> Check {
    let sampled = format!("of {} visible messages peeked", peeked.len());
    let default = peeked.iter().filter(|p| p.ttl.is_some_and(|t| (t - DEFAULT_TTL_SECS).abs() <= 60)).count();
    let mut finite: Vec<i64> = peeked.iter().filter_map(|p| p.ttl).collect();
    finite.sort_unstable();
    finite.dedup();
    if peeked.is_empty() {
        Check::pass(
            "azure.ttl",
            format!(
                "no message waiting in {queue} or its poison queue; redrive's producers send messages that never expire"
            ),
        )
    } else if default > 0 {
        Check::fail(
            "azure.ttl",
            format!(
                "{default} {sampled} expire 7 days after they were sent: Azure's default, which deletes a job unrun and unrecorded"
            ),
            "send every message with messagettl=-1 (redrive's producers do unless `QueueOptions::time_to_live` is set; another producer must pass it)",
        )
    } else if !finite.is_empty() {
        Check::warn(
            "azure.ttl",
            format!("messages {sampled} expire after {finite:?} s"),
            "keep a finite time to live only for jobs worthless after it; otherwise send with messagettl=-1",
        )
    } else {
        Check::pass("azure.ttl", format!("none {sampled} expires"))
    }
}

fn encoding_rule(queue: &str, facts: &Facts, expect: &Expect) -> Check {
    let source: Vec<Encoding> = facts.source.iter().flatten().map(|p| encoding(&p.text)).collect();
    let (json, base64) = (
        source.iter().filter(|e| **e == Encoding::Json).count(),
        source.iter().filter(|e| **e == Encoding::Base64).count(),
    );
    // What another consumer moved to the poison queue: a Functions trigger moves a message it
    // could not decode as base64 there after five tries.
    let moved_json = facts
        .poison
        .iter()
        .flatten()
        .filter(|p| encoding(&p.text) == Encoding::Json)
        .filter(|p| serde_json::from_str::<Value>(&p.text).is_ok_and(|v| v.get(POISON_MARK).is_none()))
        .count();
    let sampled = format!("{} messages peeked in {queue}", source.len());
    if expect.functions && json > 0 {
        Check::fail(
            "azure.encoding",
            format!(
                "{json} of {sampled} are plain JSON, which an Azure Functions trigger (base64 by default) cannot decode"
            ),
            "set `QueueOptions { base64: true, .. }` in every producer, or host.json extensions.queues.messageEncoding \"none\"",
        )
    } else if json > 0 && base64 > 0 {
        Check::warn(
            "azure.encoding",
            format!("{sampled}: {json} plain JSON and {base64} base64"),
            "use one encoding in every producer (`QueueOptions::base64`); redrive reads both, a Functions trigger only its own",
        )
    } else if moved_json > 0 {
        Check::warn(
            "azure.encoding",
            format!(
                "{moved_json} plain-JSON messages in {queue}-poison were moved there by another consumer, not by redrive"
            ),
            "if an Azure Functions trigger reads the queue, send base64 (`QueueOptions { base64: true, .. }`) or set its messageEncoding to \"none\"",
        )
    } else {
        let how = match (json, base64) {
            (0, 0) => "nothing to read".to_owned(),
            (_, 0) => "plain JSON".to_owned(),
            _ => "base64".to_owned(),
        };
        Check::pass("azure.encoding", format!("{sampled}: {how}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_core::doctor::Status;

    fn peeked(text: &str, ttl: Option<i64>) -> Peeked {
        Peeked { text: text.to_owned(), ttl }
    }

    fn rule<'a>(checks: &'a [Check], rule: &str) -> &'a Check {
        checks.iter().find(|c| c.rule == rule).expect("checked")
    }

    #[test]
    fn seven_days_fails_never_passes_and_another_ttl_warns() {
        let facts = |ttl| Facts { queue: "q".into(), source: Some(vec![peeked("{}", ttl)]), poison: Some(vec![]) };
        let status = |ttl| rule(&judge(&facts(ttl), &Expect::default()), "azure.ttl").status;
        assert_eq!(status(None), Status::Pass);
        assert_eq!(status(Some(DEFAULT_TTL_SECS)), Status::Fail);
        assert_eq!(status(Some(DEFAULT_TTL_SECS - 30)), Status::Fail);
        assert_eq!(status(Some(3600)), Status::Warn);
    }

    #[test]
    fn plain_json_fails_only_for_functions_and_mixed_encodings_warn() {
        let b64 = "eyJqb2IiOjF9"; // {"job":1}
        let facts = |texts: &[&str]| Facts {
            queue: "q".into(),
            source: Some(texts.iter().map(|t| peeked(t, None)).collect()),
            poison: Some(vec![]),
        };
        let functions = Expect { functions: true, ..Expect::default() };
        let status = |texts: &[&str], expect: &Expect| rule(&judge(&facts(texts), expect), "azure.encoding").status;
        assert_eq!(status(&["{\"job\":1}"], &functions), Status::Fail);
        assert_eq!(status(&[b64], &functions), Status::Pass);
        assert_eq!(status(&["{\"job\":1}"], &Expect::default()), Status::Pass);
        assert_eq!(status(&["{\"job\":1}", b64], &Expect::default()), Status::Warn);
    }

    #[test]
    fn a_missing_poison_queue_fails() {
        let facts = Facts { queue: "q".into(), source: Some(vec![]), poison: None };
        let checks = judge(&facts, &Expect::default());
        assert_eq!(rule(&checks, "azure.poison-queue").status, Status::Fail);
        assert_eq!(rule(&checks, "azure.queue").status, Status::Pass);
    }
}
