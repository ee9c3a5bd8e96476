//! What `redrive verify` keeps: a file per run, JSON for `--check-fresh` and scripts, Markdown
//! for people, each named by the run's time; and the fingerprint that tells whether the backend,
//! its configuration or a job kind's key format changed since.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The version of the canonical key encoding (`redrive_core::key`): a change to it changes every
/// key, so it is part of the fingerprint.
pub(crate) const KEY_ENCODING: u32 = 1;

/// One run's evidence.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Evidence {
    pub(crate) run: String,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) finished_at: DateTime<Utc>,
    pub(crate) redrive_version: String,
    pub(crate) identity: Identity,
    /// The SHA-256 of `identity`: what `--check-fresh` compares.
    pub(crate) fingerprint: String,
    pub(crate) passed: bool,
    pub(crate) tests: Vec<Test>,
    /// What the run forgot once done, key by key: everything it made.
    pub(crate) cleaned_up: Vec<Value>,
}

/// What the evidence holds for: a change to any of it calls for a new run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Identity {
    /// The backend's URL without credentials or query (`postgres://db.internal/app`).
    pub(crate) backend: String,
    /// What the backend says of itself (capabilities, limits, a broker's redrive policy).
    pub(crate) configuration: BTreeMap<String, String>,
    /// The key encoding's version ([`KEY_ENCODING`]).
    pub(crate) key_encoding: u32,
    /// The application's job kinds' key formats, as `--key-format KIND=FORMAT` gave them.
    pub(crate) key_formats: BTreeMap<String, String>,
}

impl Identity {
    pub(crate) fn fingerprint(&self) -> String {
        let canonical = serde_json::to_vec(self).expect("an identity serializes");
        hex::encode(Sha256::digest(&canonical))
    }

    /// What changed from `before` to this one, in words; empty when nothing did.
    pub(crate) fn changes_since(&self, before: &Identity) -> Vec<String> {
        let mut changes = Vec::new();
        if self.backend != before.backend {
            changes.push(format!("the backend is {}, the evidence is of {}", self.backend, before.backend));
        }
        for (what, now, then) in [
            ("configuration", &self.configuration, &before.configuration),
            ("key format of kind", &self.key_formats, &before.key_formats),
        ] {
            for (name, value) in now {
                match then.get(name) {
                    Some(old) if old != value => changes.push(format!("{what} {name}: {old} then, {value} now")),
                    None => changes.push(format!("{what} {name}: {value} now, not in the evidence")),
                    _ => {}
                }
            }
            for name in then.keys().filter(|n| !now.contains_key(*n)) {
                changes.push(format!("{what} {name}: in the evidence, not given now"));
            }
        }
        if self.key_encoding != before.key_encoding {
            changes.push(format!("key encoding v{} now, v{} then", self.key_encoding, before.key_encoding));
        }
        changes
    }
}

/// One test's evidence: each item with its time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Test {
    pub(crate) name: String,
    pub(crate) checks: String,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) finished_at: Option<DateTime<Utc>>,
    pub(crate) passed: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failure: Option<String>,
    pub(crate) items: Vec<Item>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Item {
    pub(crate) what: String,
    pub(crate) at: DateTime<Utc>,
    pub(crate) detail: Value,
}

impl Test {
    pub(crate) fn start(name: &str, checks: &str) -> Self {
        Self {
            name: name.to_owned(),
            checks: checks.to_owned(),
            started_at: Utc::now(),
            finished_at: None,
            passed: false,
            failure: None,
            items: Vec::new(),
        }
    }

    pub(crate) fn item(&mut self, what: impl Into<String>, detail: Value) {
        self.items.push(Item { what: what.into(), at: Utc::now(), detail });
    }

    /// Ends it failed, with why.
    pub(crate) fn fail(mut self, why: String) -> Self {
        self.failure = Some(why);
        self.finish()
    }

    /// Ends it: passed unless a failure was noted.
    pub(crate) fn finish(mut self) -> Self {
        self.passed = self.failure.is_none();
        self.finished_at = Some(Utc::now());
        self
    }
}

impl Evidence {
    /// Writes `<dir>/redrive-verify-<time>.json` and `.md`; returns both paths.
    pub(crate) fn write(&self, dir: &Path) -> Result<[PathBuf; 2]> {
        let io = |what: &str, e: std::io::Error| {
            Error::new(ErrorKind::Config, format!("cannot write the evidence ({what})")).with_source(e)
        };
        std::fs::create_dir_all(dir).map_err(|e| io("create its folder", e))?;
        let stem = format!("redrive-verify-{}", self.started_at.format("%Y%m%dT%H%M%SZ"));
        let json = dir.join(format!("{stem}.json"));
        let md = dir.join(format!("{stem}.md"));
        let text = serde_json::to_string_pretty(self).expect("evidence serializes");
        std::fs::write(&json, text + "\n").map_err(|e| io("the JSON file", e))?;
        std::fs::write(&md, self.markdown()).map_err(|e| io("the Markdown file", e))?;
        Ok([json, md])
    }

    fn markdown(&self) -> String {
        let mut md = String::new();
        let verdict = if self.passed { "passed" } else { "FAILED" };
        let _ = writeln!(md, "# redrive verify: {verdict}\n");
        let _ = writeln!(md, "| | |\n|---|---|");
        let _ = writeln!(md, "| run | `{}` |", self.run);
        let _ = writeln!(md, "| started | {} |", self.started_at.to_rfc3339());
        let _ = writeln!(md, "| finished | {} |", self.finished_at.to_rfc3339());
        let _ = writeln!(md, "| backend | `{}` |", self.identity.backend);
        let _ = writeln!(md, "| redrive | {} |", self.redrive_version);
        let _ = writeln!(md, "| key encoding | v{} |", self.identity.key_encoding);
        for (kind, format) in &self.identity.key_formats {
            let _ = writeln!(md, "| key format of `{kind}` | `{format}` |");
        }
        for (name, value) in &self.identity.configuration {
            let _ = writeln!(md, "| {name} | `{value}` |");
        }
        let _ = writeln!(md, "| fingerprint | `{}` |", self.fingerprint);
        let _ = writeln!(md, "\nForgotten once done: {}", serde_json::Value::from(self.cleaned_up.clone()));
        for test in &self.tests {
            let verdict = if test.passed { "passed" } else { "FAILED" };
            let _ = writeln!(md, "\n## {}: {verdict}\n\n{}.\n", test.name, test.checks);
            if let Some(why) = &test.failure {
                let _ = writeln!(md, "**Failed:** {why}\n");
            }
            for item in &test.items {
                let _ = writeln!(md, "- {} ({}): `{}`", item.what, item.at.to_rfc3339(), item.detail);
            }
        }
        md
    }
}

/// The newest evidence in `dir` (by its run's start), if any.
pub(crate) fn newest(dir: &Path) -> Result<Option<Evidence>> {
    let io = |e: std::io::Error| {
        Error::new(ErrorKind::Config, format!("cannot read the evidence folder {}", dir.display())).with_source(e)
    };
    let mut newest: Option<Evidence> = None;
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let named = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("redrive-verify-"));
        if !named || path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(io)?;
        let evidence: Evidence = serde_json::from_str(&text).map_err(|e| {
            Error::new(ErrorKind::Decode, format!("{} is not redrive verify's evidence", path.display())).with_source(e)
        })?;
        if newest.as_ref().is_none_or(|n| evidence.started_at > n.started_at) {
            newest = Some(evidence);
        }
    }
    Ok(newest)
}

/// Why the newest evidence no longer holds for `now` (empty: it does).
pub(crate) fn stale(evidence: Option<&Evidence>, now: &Identity, max_age: Duration) -> Vec<String> {
    let Some(evidence) = evidence else { return vec!["there is no evidence: run redrive verify".into()] };
    let mut why = Vec::new();
    if !evidence.passed {
        why.push(format!("the newest run ({}) failed", evidence.started_at.to_rfc3339()));
    }
    let age = (Utc::now() - evidence.finished_at).to_std().unwrap_or_default();
    if age > max_age {
        why.push(format!(
            "the newest run is {} old, more than {}",
            humantime::format_duration(Duration::from_secs(age.as_secs())),
            humantime::format_duration(max_age)
        ));
    }
    why.extend(now.changes_since(&evidence.identity).into_iter().map(|c| format!("changed since the run: {c}")));
    why
}

/// `KIND=FORMAT` pairs, checked.
pub(crate) fn key_formats(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    let mut formats = BTreeMap::new();
    for pair in pairs {
        let Some((kind, format)) = pair.split_once('=').filter(|(k, f)| !k.trim().is_empty() && !f.trim().is_empty())
        else {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("--key-format takes KIND=FORMAT (send_receipt=order), not {pair:?}"),
            ));
        };
        formats.insert(kind.trim().to_owned(), format.trim().to_owned());
    }
    Ok(formats)
}

/// A backend URL without what must not be written down: credentials, query, fragment.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let path = if path.is_empty() { String::new() } else { format!("/{path}") };
    if scheme.is_empty() { format!("{host}{path}") } else { format!("{scheme}://{host}{path}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_written_down_without_credentials_or_query() {
        for (url, kept) in [
            ("postgres://app:s3cret@db.internal:5432/app?sslmode=require", "postgres://db.internal:5432/app"),
            ("sqlite:///var/lib/app/jobs.db", "sqlite:///var/lib/app/jobs.db"),
            ("sqs://orders", "sqs://orders"),
            ("qstash://user:pw@jobs.example.com/redrive#x", "qstash://jobs.example.com/redrive"),
        ] {
            assert_eq!(redact(url), kept);
        }
    }

    #[test]
    fn a_changed_key_format_is_named() {
        let then = Identity {
            backend: "postgres://db/app".into(),
            configuration: BTreeMap::new(),
            key_encoding: KEY_ENCODING,
            key_formats: key_formats(&["send_receipt=order".into()]).unwrap(),
        };
        let now = Identity { key_formats: key_formats(&["send_receipt=order,email".into()]).unwrap(), ..then.clone() };
        assert_ne!(now.fingerprint(), then.fingerprint());
        assert_eq!(now.changes_since(&then), ["key format of kind send_receipt: order then, order,email now"]);
        assert!(then.changes_since(&then).is_empty());
        assert!(key_formats(&["no_equals".into()]).is_err());
    }
}
