//! A list's filters, as the pages' links and forms send them: parsed into a query, described in
//! words, written back into a link.

use chrono::{DateTime, Utc};
use redrive_core::{FailureId, FailureQuery, Severity};
use serde::Deserialize;

use crate::pages::encode;

/// A list's filters, as the pages' links and forms send them. Empty fields mean "any".
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Filter {
    #[serde(default)]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) severity: String,
    /// `open` (the default), `closed` or `all`.
    #[serde(default)]
    pub(crate) state: String,
    /// An age: `2h`, `7d`.
    #[serde(default)]
    pub(crate) older_than: String,
    /// Text the last error holds (letters without case; `%` and `_` as themselves).
    #[serde(default)]
    pub(crate) error: String,
    #[serde(default)]
    pub(crate) after: String,
    /// Only records whose last failure is before this instant (milliseconds since the epoch):
    /// a bulk replay's confirmation fixes `older_than` to it. Wins over `older_than`.
    #[serde(default)]
    pub(crate) before: String,
}

impl Filter {
    pub(crate) fn severity(&self) -> Result<Option<Severity>, String> {
        match self.severity.as_str() {
            "" => Ok(None),
            name => Severity::from_name(name)
                .map(Some)
                .ok_or_else(|| format!("no severity {name:?}: warning, error or critical")),
        }
    }

    pub(crate) fn query(&self, limit: usize) -> Result<FailureQuery, String> {
        let open = match self.state.as_str() {
            "" | "open" => Some(true),
            "closed" => Some(false),
            "all" => None,
            other => return Err(format!("no state {other:?}: open, closed or all")),
        };
        let failed_before = match self.older_than.trim() {
            _ if !self.before.is_empty() => {
                let at = self.before.parse().ok().and_then(DateTime::<Utc>::from_timestamp_millis);
                Some(at.ok_or_else(|| format!("the instant {:?} is not milliseconds since the epoch", self.before))?)
            }
            "" => None,
            age => {
                let age = humantime::parse_duration(age).map_err(|e| format!("the age {age:?}: {e}"))?;
                Some(Utc::now() - chrono::Duration::from_std(age).unwrap_or(chrono::Duration::MAX))
            }
        };
        Ok(FailureQuery {
            kind: (!self.kind.is_empty()).then(|| self.kind.clone()),
            open,
            failed_before,
            error_contains: (!self.error.is_empty()).then(|| self.error.clone()),
            after: (!self.after.is_empty()).then(|| FailureId(self.after.clone())),
            limit,
            ..FailureQuery::default()
        })
    }

    /// The filter in words, for a heading.
    pub(crate) fn describe(&self) -> String {
        let state = match self.state.as_str() {
            "" | "open" => "open",
            "closed" => "closed",
            _ => "all",
        };
        let mut text = format!("{state} records");
        if !self.kind.is_empty() {
            text += &format!(" of kind {}", self.kind);
        }
        if !self.severity.is_empty() {
            text += &format!(", severity {}", self.severity);
        }
        if !self.older_than.is_empty() {
            text += &format!(", last failed over {} ago", self.older_than.trim());
        }
        if !self.error.is_empty() {
            text += &format!(", last error holding \"{}\"", self.error);
        }
        text
    }

    pub(crate) fn query_string(&self, after: Option<&str>) -> String {
        let mut pairs = vec![("kind", self.kind.as_str()), ("severity", &self.severity), ("state", &self.state)];
        pairs.push(("older_than", &self.older_than));
        pairs.push(("error", &self.error));
        pairs.push(("after", after.unwrap_or_default()));
        pairs
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}
