//! Decode errors that say where and what, never the value.
//!
//! serde's messages quote the input (`invalid type: string "4111…", expected u32`), and a decode
//! error becomes a failure record's last error, a log line, an alert and a webhook body. The
//! message kept here names the field (its path, `card.number`) and the expected type, and
//! replaces the value by its JSON type.

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::{Path, Segment};

/// Decodes a payload, or says which field failed and what it expected, without its value.
pub(crate) fn payload<J: DeserializeOwned>(payload: &Value) -> Result<J, String> {
    serde_path_to_error::deserialize(payload).map_err(|e| describe(Some(e.path()), e.inner()))
}

/// Decodes JSON bytes (a message body), or says where and what, without any of its values.
pub(crate) fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| describe(Some(e.path()), e.inner()))?;
    // Trailing characters after the value: no field to name.
    deserializer.end().map_err(|e| describe(None, &e))?;
    Ok(value)
}

/// `field `card.number`: invalid type: string, expected u32`.
fn describe(path: Option<&Path>, error: &serde_json::Error) -> String {
    let mut message = error.to_string();
    // A syntax error's position is in the text, not its content: keep it apart from the message.
    let position = format!(" at line {} column {}", error.line(), error.column());
    if error.line() != 0 && message.ends_with(&position) {
        message.truncate(message.len() - position.len());
    }
    let (message, path) = match error.classify() {
        // Syntax errors name what the parser expected, never the input; the position says where,
        // and a path into a document that does not parse is mostly `?`.
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof | serde_json::error::Category::Io => {
            (message, None)
        }
        serde_json::error::Category::Data => (without_values(&message), path),
    };
    let position = if error.line() != 0 { position } else { String::new() };
    match path.and_then(field) {
        Some(field) => format!("field `{field}`: {message}{position}"),
        None => format!("{message}{position}"),
    }
}

/// The path, with map keys that do not look like field names written `?`: a map keyed by data
/// (card numbers, email addresses) would otherwise put a value into the path. `None` at the top.
fn field(path: &Path) -> Option<String> {
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(if looks_like_a_name(key) { key } else { "?" });
            }
            Segment::Unknown => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push('?');
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

fn looks_like_a_name(key: &str) -> bool {
    let mut bytes = key.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && key.len() <= 64
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// serde's own messages have fixed shapes (the provided methods of `serde::de::Error`); only
/// those are repeated, with the input taken out. Any other message (a `Deserialize` impl's
/// `custom` one) may quote the value, so it is not repeated at all.
fn without_values(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some((unexpected, expected)) = message.strip_prefix(prefix).and_then(|r| r.rsplit_once(", expected ")) {
            return format!("{prefix}{}, expected {expected}", json_type(unexpected));
        }
    }
    // The length, the type's field names: no input in these.
    if ["invalid length ", "missing field `", "duplicate field `"].iter().any(|p| message.starts_with(p)) {
        return message.to_owned();
    }
    // The name is the input's; what was expected is the type's.
    for (prefix, what) in [("unknown variant `", "unknown variant"), ("unknown field `", "unknown field")] {
        if message.starts_with(prefix) {
            let rest = ["`, expected ", "`, there are no "].iter().find_map(|tail| message.rfind(tail).map(|i| i + 3));
            return match rest {
                Some(i) => format!("{what}, {}", &message[i..]),
                None => what.to_owned(),
            };
        }
    }
    "the value does not fit this field (the decoder's message is left out: it may quote the value)".to_owned()
}

/// What serde's `Unexpected` names, without the value it quotes (`string "…"`, `integer `5``).
fn json_type(unexpected: &str) -> &str {
    const KNOWN: [&str; 17] = [
        "boolean",
        "integer",
        "floating point",
        "character",
        "string",
        "byte array",
        "unit value",
        "Option value",
        "newtype struct",
        "sequence",
        "map",
        "enum",
        "unit variant",
        "newtype variant",
        "tuple variant",
        "struct variant",
        "number",
    ];
    let cut = [" `", " \""].iter().filter_map(|q| unexpected.find(q)).min().unwrap_or(unexpected.len());
    let kind = &unexpected[..cut];
    KNOWN.iter().find(|k| **k == kind).copied().unwrap_or("a value")
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Card {
        number: u32,
        brand: Brand,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Brand {
        Visa,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Order {
        card: Card,
        lines: Vec<u8>,
    }

    const CANARY: &str = "4111111111111111";

    #[test]
    fn errors_name_the_field_and_the_type_but_not_the_value() {
        let cases = [
            (
                json!({"card": {"number": CANARY, "brand": "visa"}, "lines": []}),
                "field `card.number`: invalid type: string, expected u32",
            ),
            (
                json!({"card": {"number": 1, "brand": CANARY}, "lines": []}),
                "field `card.brand`: unknown variant, expected `visa`",
            ),
            (
                json!({"card": {"number": 1, "brand": "visa"}, "lines": [1, 4111]}),
                "field `lines[1]`: invalid value: integer, expected u8",
            ),
            (
                json!({"card": {"number": 4.111, "brand": "visa"}, "lines": []}),
                "field `card.number`: invalid type: floating point, expected u32",
            ),
            (json!({"card": {"brand": "visa"}, "lines": []}), "field `card`: missing field `number`"),
            (json!([CANARY]), "field `[0]`: invalid type: string, expected struct Card"),
            (json!(CANARY), "invalid type: string, expected struct Order"),
        ];
        for (payload, expected) in cases {
            let message = super::payload::<Order>(&payload).unwrap_err();
            assert_eq!(message, expected);
            assert!(!message.contains("4111"), "{message}");
        }
    }

    #[test]
    fn map_keys_that_look_like_data_are_not_repeated() {
        let payload = json!({ "by_card": { CANARY: "x" } });
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Balances {
            by_card: std::collections::HashMap<String, u32>,
        }
        let message = super::payload::<Balances>(&payload).unwrap_err();
        assert_eq!(message, "field `by_card.?`: invalid type: string, expected u32");
    }

    #[test]
    fn custom_messages_are_left_out_and_syntax_errors_keep_their_position() {
        #[derive(Debug)]
        struct Strict;
        impl<'de> Deserialize<'de> for Strict {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Err(serde::de::Error::custom(format!("{s} is not allowed")))
            }
        }
        let message = super::payload::<Strict>(&json!(CANARY)).unwrap_err();
        assert!(!message.contains(CANARY) && message.contains("left out"), "{message}");
        let message = body::<Value>(format!("{{\"a\": {CANARY}x}}").as_bytes()).unwrap_err();
        assert_eq!(message, "expected `,` or `}` at line 1 column 23");
        let message = body::<Card>(format!("{{\"number\": \"{CANARY}\"}}").as_bytes()).unwrap_err();
        assert_eq!(message, "field `number`: invalid type: string, expected u32 at line 1 column 29");
    }
}
