//! The error history a broker's messages and records carry, and text every broker accepts.

use std::borrow::Cow;

use chrono::{DateTime, Utc};

use crate::backend::AttemptError;

/// The last error kept in a record, in bytes; the rest is in the worker's log.
pub const MAX_ERROR_LEN: usize = 4096;
/// Failed attempts a message and its record carry: the first (for when the failures began) and
/// the latest ones, each error cut to [`HISTORY_ERROR_LEN`] bytes.
pub const HISTORY: usize = 6;
/// The longest error an entry of the history keeps, in bytes.
pub const HISTORY_ERROR_LEN: usize = 512;
/// Room a message keeps for its history as JSON: each entry's error (cleaned before it is cut,
/// so JSON escaping at most doubles it), attempt and time, and a name to carry it under.
pub const HISTORY_ROOM: usize = HISTORY * (HISTORY_ERROR_LEN * 2 + 80) + 32;

/// `errors` with attempt `attempt`'s `error` added: cleaned, cut to [`HISTORY_ERROR_LEN`], and
/// the history kept to its first entry and the latest, [`HISTORY`] at most.
pub fn add_error(errors: Vec<AttemptError>, attempt: u32, error: &str) -> Vec<AttemptError> {
    add_error_at(errors, attempt, error, Utc::now())
}

/// [`add_error`] for an attempt that failed `at`.
pub(super) fn add_error_at(
    mut errors: Vec<AttemptError>,
    attempt: u32,
    error: &str,
    at: DateTime<Utc>,
) -> Vec<AttemptError> {
    errors.push(AttemptError { attempt, at, error: cut(&clean(error), HISTORY_ERROR_LEN).to_owned() });
    if errors.len() > HISTORY {
        errors.drain(1..errors.len() - (HISTORY - 1));
    }
    errors
}

/// The last error as a record keeps it: cleaned and cut to [`MAX_ERROR_LEN`].
pub fn last_error(error: &str) -> String {
    cut(&clean(error), MAX_ERROR_LEN).to_owned()
}

/// Text every broker accepts: the characters XML allows. Any other (a control character such as
/// ESC or form feed, which an error text may well carry) is written as `\u{1b}`, so that a send
/// never fails on it.
pub fn clean(text: &str) -> Cow<'_, str> {
    let allowed = |c: char| matches!(c, '\u{9}' | '\u{a}' | '\u{d}' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..);
    if text.chars().all(allowed) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars().map(|c| if allowed(c) { c.to_string() } else { format!("\\u{{{:x}}}", c as u32) }).collect(),
    )
}

/// At most `max` bytes of `text`, cut at a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cleaned_of_what_brokers_refuse_and_cut_at_characters() {
        assert_eq!(clean("plain text, tabs\tand newlines\n"), "plain text, tabs\tand newlines\n");
        assert_eq!(clean("red \u{1b}[31m page\u{c} \u{0}"), "red \\u{1b}[31m page\\u{c} \\u{0}");
        assert_eq!(cut("añb", 2), "a", "cut at a character boundary");
    }

    #[test]
    fn the_history_keeps_the_first_and_the_latest_errors() {
        let mut errors = Vec::new();
        for attempt in 1..=9 {
            errors = add_error(errors, attempt, &"x".repeat(2000));
        }
        let attempts: Vec<u32> = errors.iter().map(|e| e.attempt).collect();
        assert_eq!(attempts, [1, 5, 6, 7, 8, 9]);
        assert!(errors.iter().all(|e| e.error.len() == HISTORY_ERROR_LEN));
        assert!(serde_json::to_string(&errors).unwrap().len() <= HISTORY_ROOM);
    }
}
