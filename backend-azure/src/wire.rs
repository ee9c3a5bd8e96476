//! What a message's text is: the job's envelope (`docs/envelope.md`), with what redrive carries
//! across attempts in a `redrive` member, optionally in base64 for queues shared with Azure
//! Functions; and the failure record, as the poison queue holds it.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, Utc};
use redrive_core::kit::broker::{self, Known};
use redrive_core::kit::{AttemptError, Envelope};
use redrive_core::{Error, ErrorKind, FailureRecord, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The most text Azure takes in a message (64 KiB).
pub(crate) const MAX_TEXT: usize = 64 * 1024;
/// The member of the envelope redrive keeps its own state in.
const MEMBER: &str = "redrive";
/// Room a message keeps for [`Carried`] at enqueue, so that every retry's history fits.
pub(crate) const CARRIED_ROOM: usize = broker::HISTORY_ROOM + 64;

/// What a message carries across its attempts, beside the job.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(crate) struct Carried {
    /// Receives given back (deferrals, releases): the attempt is the dequeue count less these.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) given_back: u32,
    /// The failed attempts so far, oldest first, bounded (see [`broker::add_error`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) errors: Vec<AttemptError>,
    /// Its failure record is kept: if the message comes back (its delete failed), it is
    /// recorded again without running, whatever its attempt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) recorded: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A message's text, decoded: the JSON (or other) text, and what redrive carries in it.
#[derive(Debug, Clone)]
pub(crate) struct Text {
    pub(crate) body: String,
    pub(crate) carried: Carried,
}

impl Text {
    /// Reads a message's text, whichever way it was written: JSON as it is, or base64 (Azure
    /// Functions' default, and the Azure SDKs' base64 policies). Text that is neither is kept
    /// as it came.
    pub(crate) fn read(text: &str) -> Self {
        let body = if text.trim_start().starts_with('{') {
            text.to_owned()
        } else {
            STANDARD
                .decode(text.trim())
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .unwrap_or_else(|| text.to_owned())
        };
        let carried = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|mut v| v.get_mut(MEMBER).map(Value::take))
            .and_then(|c| serde_json::from_value(c).ok())
            .unwrap_or_default();
        Self { body, carried }
    }

    /// The job it carries: the envelope, or a stand-in for a text that is not one.
    pub(crate) fn job(&self, id: &str, inserted: DateTime<Utc>) -> (Envelope, Option<String>) {
        broker::carried_job("azure", id, &self.body, Known::default(), inserted)
    }

    /// The text to write back with `carried` in place of what it carried: only an envelope (a
    /// JSON object) can carry it; another text is written back unchanged.
    pub(crate) fn with(&self, carried: Carried) -> Text {
        let body = match serde_json::from_str::<Value>(&self.body) {
            Ok(Value::Object(mut fields)) => {
                fields.insert(MEMBER.to_owned(), serde_json::to_value(&carried).expect("carried serializes"));
                Value::Object(fields).to_string()
            }
            _ => self.body.clone(),
        };
        Text { body, carried }
    }
}

/// Encodes text for the queue: as it is, or in base64. As it is, the noncharacters U+FFFE and
/// U+FFFF, which JSON allows and XML (the queue's request and response bodies) does not, are
/// written as JSON escapes: they decode to the same characters, and a message holding one
/// neither fails to send nor breaks every receive it comes back in.
pub(crate) fn encode(body: &str, base64: bool) -> String {
    if base64 {
        STANDARD.encode(body)
    } else if body.contains(['\u{FFFE}', '\u{FFFF}']) {
        // Only inside a JSON string can they appear, where the escape means the same.
        body.replace('\u{FFFE}', "\\ufffe").replace('\u{FFFF}', "\\uffff")
    } else {
        body.to_owned()
    }
}

/// The largest message text a job's envelope may have, before encoding, so that it fits in
/// 64 KiB once encoded with the history a retry adds.
pub(crate) fn max_body(base64: bool) -> usize {
    let room = if base64 { MAX_TEXT / 4 * 3 } else { MAX_TEXT };
    room - CARRIED_ROOM
}

/// Refuses a body over [`max_body`] with a typed error, before anything is sent: the envelope's
/// text (before base64), or the text as sent (with its escapes).
pub(crate) fn check_size(what: &str, body: &str, base64: bool) -> Result<()> {
    let max = max_body(base64);
    if body.len() > max {
        return Err(Error::new(
            ErrorKind::PayloadTooLarge,
            format!(
                "{what} is {} bytes as message text, over the {max} bytes that leave room, within Azure's 64 KiB{}, \
                 for the error history its retries carry",
                body.len(),
                if base64 { " in base64" } else { "" }
            ),
        ));
    }
    Ok(())
}

/// A failure record as the poison queue holds it (written there while the store was down):
/// the record as JSON, marked, cut to fit 64 KiB once encoded (the oldest errors go first,
/// then the end of the last error).
pub(crate) fn poison_text(record: &FailureRecord, base64: bool) -> String {
    let mut record = record.clone();
    loop {
        let mut value = serde_json::to_value(&record).expect("a record serializes");
        value[POISON_MARK] = Value::from(1);
        let text = encode(&value.to_string(), base64);
        if text.len() <= MAX_TEXT {
            return text;
        }
        if record.errors.len() > 1 {
            record.errors.remove(0);
        } else if !record.last_error.is_empty() {
            let keep = record.last_error.len().saturating_sub(text.len() - MAX_TEXT + 16);
            record.last_error = broker::cut(&record.last_error, keep).to_owned();
        } else {
            record.errors.clear();
            let mut value = serde_json::to_value(&record).expect("a record serializes");
            value[POISON_MARK] = Value::from(1);
            return encode(&value.to_string(), base64);
        }
    }
}

/// Marks a poison message as a record redrive wrote (`"redrive_record": 1`).
pub(crate) const POISON_MARK: &str = "redrive_record";

/// The record a poison message holds, if redrive wrote it.
pub(crate) fn poison_record(text: &Text) -> Option<FailureRecord> {
    let value: Value = serde_json::from_str(&text.body).ok()?;
    value.get(POISON_MARK)?;
    serde_json::from_value(value).ok()
}

#[cfg(test)]
mod tests {
    use redrive_conformance::sample_record;

    use super::*;

    #[test]
    fn text_is_read_as_json_or_base64_and_carries_its_state() {
        let body = r#"{"v":1,"kind":"ship","payload":{}}"#;
        let read = Text::read(&encode(body, true));
        assert_eq!(read.body, body);
        assert_eq!(read.carried.given_back, 0);
        let carried = Carried { given_back: 2, errors: broker::add_error(Vec::new(), 1, "boom"), recorded: false };
        let written = read.with(carried);
        let back = Text::read(&written.body);
        assert_eq!((back.carried.given_back, back.carried.errors.len()), (2, 1));
        assert_eq!(Text::read("not json").body, "not json", "neither JSON nor base64: as it came");
        assert_eq!(Text::read("bm90IGpzb24=").body, "not json", "base64 of any text is decoded");
        assert_eq!(Text::read("<xml/>").with(Carried::default()).body, "<xml/>");
    }

    #[test]
    fn a_poison_record_round_trips_and_fits() {
        let mut record = sample_record(1, serde_json::json!({ "blob": "x".repeat(40_000) }));
        record.last_error = "e".repeat(4096);
        record.errors = (1..=6).map(|a| AttemptError { attempt: a, at: Utc::now(), error: "f".repeat(512) }).collect();
        for base64 in [false, true] {
            let text = poison_text(&record, base64);
            assert!(text.len() <= MAX_TEXT, "{} bytes", text.len());
            let back = poison_record(&Text::read(&text)).expect("a record");
            assert_eq!((back.id, back.payload), (record.id.clone(), record.payload.clone()));
        }
        assert!(poison_record(&Text::read(r#"{"v":1}"#)).is_none(), "an envelope is not a record");
        // The shape docs/envelope.md shows.
        let value: Value = serde_json::from_str(&poison_text(&record, false)).unwrap();
        assert_eq!((&value["redrive_record"], &value["state"]["state"]), (&Value::from(1), &Value::from("open")));
        assert!(value["errors"][0]["attempt"].is_u64() && value["last_failed_at"].is_string());
    }
}
