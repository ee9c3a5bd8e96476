//! What SQS messages and queues look like to redrive: names, attributes, the job a body carries,
//! and the queue calls setup needs.

use redrive_core::kit::broker;

use super::*;

/// Room kept in the DLQ beside a job's message for what a failure record sent there adds (when
/// the record store is down): the record's attributes with the longest error kept. Enqueue
/// refuses a job that would leave less, so that every job can always be dead-lettered.
pub(super) const RECORD_ROOM: usize = 16 * 1024;

/// The history carried in `attrs`, with attempt `attempt`'s `error` added, as the attribute's
/// JSON text (see [`broker::add_error`]); errors are cleaned before they go in, so the text is
/// always what SQS accepts.
pub(super) fn history(attrs: &HashMap<String, MessageAttributeValue>, attempt: u32, error: &str) -> String {
    history_text(&broker::add_error(carried_errors(Some(attrs)), attempt, error))
}

/// A history as the attribute's JSON text.
pub(super) fn history_text(errors: &[AttemptError]) -> String {
    broker::clean(&serde_json::to_string(errors).expect("errors serialize")).into_owned()
}

/// The history a message carries, oldest first; empty where it has none.
pub(super) fn carried_errors(attrs: Option<&HashMap<String, MessageAttributeValue>>) -> Vec<AttemptError> {
    attrs
        .and_then(|a| a.get(ATTR_ERRORS))
        .and_then(|v| v.string_value())
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// The bytes SQS counts for a message: the body, and each attribute's name, type and value.
pub(super) fn message_size(body: &str, attrs: &HashMap<String, MessageAttributeValue>) -> usize {
    let attr = |(name, value): (&String, &MessageAttributeValue)| {
        name.len() + value.data_type().len() + value.string_value().map_or(0, str::len)
    };
    body.len() + attrs.iter().map(attr).sum::<usize>()
}

/// Splits messages of `sizes` bytes into batches of at most ten that SQS accepts: together no
/// more than `max` bytes, attributes counted. A message is never split; one alone may be `max`.
pub(super) fn batches(sizes: &[usize], max: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < sizes.len() {
        let (mut end, mut bytes) = (start, 0);
        while end < sizes.len() && end - start < 10 && (end == start || bytes + sizes[end] <= max) {
            bytes += sizes[end];
            end += 1;
        }
        out.push(start..end);
        start = end;
    }
    out
}

/// SQS queue names: 1 to 80 of A-Z a-z 0-9 - _, with `.fifo` at the end of FIFO queues.
pub(super) fn check_queue_name(name: &str) -> Result<()> {
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    let ok = !base.is_empty()
        && name.len() <= 80
        && base.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::InvalidName, format!("queue name {name:?} must be 1 to 80 of A-Z a-z 0-9 - _")))
    }
}

pub(super) fn secs(d: Duration) -> i32 {
    d.min(MAX_VISIBILITY).as_secs_f64().ceil() as i32
}

pub(super) fn string_attr(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder().data_type("String").string_value(value).build().expect("type and value are set")
}

pub(super) fn config_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Config, message)
}

/// Whether `text` is in a body or any attribute's value.
#[cfg(any(test, feature = "test-hooks"))]
pub(super) fn mentions(body: &str, attrs: Option<&HashMap<String, MessageAttributeValue>>, text: &str) -> bool {
    body.contains(text) || attrs.is_some_and(|a| a.values().any(|v| v.string_value().is_some_and(|s| s.contains(text))))
}

/// The attempts a deferred copy carries over ([`ATTR_SPENT`]); 0 on a message never deferred.
pub(super) fn spent(attrs: &HashMap<String, MessageAttributeValue>) -> u32 {
    attrs.get(ATTR_SPENT).and_then(|v| v.string_value()).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

pub(super) fn sent_at(system: &HashMap<MessageSystemAttributeName, String>) -> DateTime<Utc> {
    system
        .get(&MessageSystemAttributeName::SentTimestamp)
        .and_then(|t| t.parse::<i64>().ok())
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single())
        .unwrap_or_else(Utc::now)
}

pub(super) async fn queue_url(client: &Client, name: &str) -> Result<String> {
    let out = client.get_queue_url().queue_name(name).send().await.map_err(|e| sdk(e, "find queue"))?;
    out.queue_url.ok_or_else(|| Error::new(ErrorKind::NotFound, format!("queue {name} has no URL")))
}

pub(super) async fn queue_attributes(client: &Client, url: &str) -> Result<HashMap<QueueAttributeName, String>> {
    let out = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .map_err(|e| sdk(e, "read queue attributes"))?;
    Ok(out.attributes.unwrap_or_default())
}

pub(super) async fn create_queue(
    client: &Client,
    name: &str,
    attrs: &[(QueueAttributeName, String)],
) -> Result<String> {
    check_queue_name(name)?;
    let mut request = client.create_queue().queue_name(name);
    for (k, v) in attrs {
        request = request.attributes(k.clone(), v);
    }
    let out = request.send().await.map_err(|e| sdk(e, "create queue"))?;
    out.queue_url.ok_or_else(|| Error::temporary(format!("queue {name} was created without a URL")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_count_attributes_and_keep_ten_at_most() {
        // Bodies alone would fit one batch; their attributes push it over the limit.
        assert_eq!(batches(&[400, 400, 400], 1000), [0..2, 2..3]);
        assert_eq!(batches(&[1000, 1, 1], 1000), [0..1, 1..3], "a message at the limit goes alone");
        assert_eq!(batches(&[1; 25], 1000), [0..10, 10..20, 20..25]);
        assert!(batches(&[], 1000).is_empty());
    }

    #[test]
    fn queue_names_follow_sqs_rules() {
        for ok in ["jobs", "jobs-dlq", "a_b-9.fifo", &"q".repeat(80)] {
            assert!(check_queue_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".fifo", "with space", "dots.in.name", &"q".repeat(81)] {
            assert_eq!(check_queue_name(bad).unwrap_err().kind(), ErrorKind::InvalidName, "{bad}");
        }
    }

    #[test]
    fn a_deferred_copy_adds_its_spent_attempts_to_its_receives() {
        let with = |v: &str| HashMap::from([(ATTR_SPENT.to_owned(), string_attr(v))]);
        assert_eq!(spent(&HashMap::new()), 0, "never deferred");
        assert_eq!(spent(&with("3")), 3);
        assert_eq!(spent(&with("not a number")), 0, "a producer's garbage costs no attempts");
        let widest = string_attr(&u32::MAX.to_string());
        assert!(COPY_ROOM >= ATTR_SPENT.len() + 6 + widest.string_value().unwrap().len(), "enqueue keeps room for it");
        assert!(mentions("{}", Some(&with("7")), "7") && !mentions("{}", Some(&with("7")), "8"));
    }
}
