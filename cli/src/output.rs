//! What the commands print: aligned tables for people, JSON for scripts.

use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive::{
    Blocked, CancelOutcome, Counts, FailureRecord, FlowEvent, IdempotencyKey, JobId, JobState, KindFlow, Limits,
    LiveJob, Paused, Rate, RecordState, ReplayOutcome,
};
use serde_json::json;

pub(crate) struct Output {
    pub(crate) json: bool,
}

/// The first line of `text`, at most `max` characters.
fn short(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max - 1).collect::<String>())
    } else {
        line.into()
    }
}

fn state(state: &RecordState) -> String {
    let when = |at: &DateTime<Utc>| at.format("%Y-%m-%d %H:%M:%S").to_string();
    let replayed = |at: &DateTime<Utc>, reason: &str, actor: &str, amended: bool| {
        let mut text = format!("replayed {}", when(at));
        if amended {
            text += " with an amended payload";
        }
        if !actor.is_empty() {
            text += &format!(" by {actor}");
        }
        if !reason.is_empty() {
            text += &format!(": {reason}");
        }
        text
    };
    match state {
        RecordState::Open => "open".into(),
        RecordState::Replaying { at, reason, actor, amended } => {
            format!("replaying: {}; waiting for its job's effect", replayed(at, reason, actor, *amended))
        }
        RecordState::Confirmed { at, reason, actor, amended, confirmed_at } => {
            format!("confirmed {}: its effect done once; {}", when(confirmed_at), replayed(at, reason, actor, *amended))
        }
        RecordState::FailedAgain { at, reason, actor, amended, failed_at, next } => format!(
            "failed again {} as record {next} (see `redrive failed show {next}`); {}",
            when(failed_at),
            replayed(at, reason, actor, *amended)
        ),
        RecordState::Discarded { at, reason, actor } => {
            format!("discarded {} by {actor}: {reason}", at.format("%Y-%m-%d %H:%M"))
        }
    }
}

/// Rows under a header, each column as wide as its widest cell.
fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) {
    let header = header.map(String::from);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", cells.join("  ").trim_end());
    }
}

fn print_json(value: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(value).expect("serializes"));
}

impl Output {
    pub(crate) fn records(&self, records: &[FailureRecord]) {
        if self.json {
            return print_json(&records);
        }
        let rows: Vec<[String; 7]> = records
            .iter()
            .map(|r| {
                [
                    r.id.0.clone(),
                    r.kind.clone(),
                    r.key.to_string(),
                    format!("{:?}", r.severity).to_lowercase(),
                    format!("{}/{}", r.attempts, r.cap),
                    r.last_failed_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                    short(&r.last_error, 60),
                ]
            })
            .collect();
        table(["ID", "KIND", "KEY", "SEVERITY", "ATTEMPTS", "LAST FAILED (UTC)", "LAST ERROR"], &rows);
        if let Some(last) = records.last() {
            let plural = if records.len() == 1 { "" } else { "s" };
            println!("\n{} record{plural}; the next page: --after {}", records.len(), last.id);
        } else {
            println!("no records match");
        }
    }

    pub(crate) fn blocked(&self, blocked: &[Blocked]) {
        if self.json {
            return print_json(&blocked);
        }
        if blocked.is_empty() {
            return println!("no order key is blocked");
        }
        let rows: Vec<[String; 5]> = blocked
            .iter()
            .map(|b| {
                [b.order_key.clone(), b.record.0.clone(), b.kind.clone(), b.key.to_string(), b.waiting.to_string()]
            })
            .collect();
        table(["ORDER KEY", "RECORD", "KIND", "KEY", "WAITING"], &rows);
        println!(
            "\neach waits for its record: `redrive replay RECORD` runs the job in its place, `redrive discard` drops it"
        );
    }

    pub(crate) fn record(&self, r: &FailureRecord) {
        if self.json {
            return print_json(r);
        }
        println!("record        {}", r.id);
        println!("job           {}", r.job_id);
        println!("kind          {}", r.kind);
        println!("key           {}", r.key);
        println!("provider key  {}", r.provider_key);
        println!("severity      {}", format!("{:?}", r.severity).to_lowercase());
        println!("state         {}", state(&r.state));
        if let Some(earlier) = &r.replay_of {
            println!("replay of     record {earlier}: its replayed job failed again into this one");
        }
        if let Some(trace) = &r.trace_id {
            println!("trace         {trace} (the failing attempt's trace id: look it up in your tracing backend)");
        }
        println!("attempts      {} of {}", r.attempts, r.cap);
        println!(
            "failed        {} to {} (UTC)",
            r.first_failed_at.format("%Y-%m-%d %H:%M:%S"),
            r.last_failed_at.format("%Y-%m-%d %H:%M:%S")
        );
        println!("last error    {}", r.last_error);
        println!("errors");
        for e in &r.errors {
            println!("  #{:<3} {}  {}", e.attempt, e.at.format("%Y-%m-%d %H:%M:%S"), short(&e.error, 100));
        }
        println!("payload");
        let payload = serde_json::to_string_pretty(&r.payload).expect("serializes");
        for line in payload.lines() {
            println!("  {line}");
        }
        if let Some(amended) = &r.amended {
            println!("amended payload (replayed in place of the one above)");
            let amended = serde_json::to_string_pretty(amended).expect("serializes");
            for line in amended.lines() {
                println!("  {line}");
            }
        }
    }

    /// What an amended replay would send (`--dry-run`).
    pub(crate) fn amended(&self, id: &redrive::FailureId, payload: &serde_json::Value) {
        if self.json {
            return print_json(&json!({ "record": id, "amended": payload }));
        }
        println!("record {id} would be replayed with this payload (nothing sent):");
        for line in serde_json::to_string_pretty(payload).expect("serializes").lines() {
            println!("  {line}");
        }
    }

    /// Each rule's verdict, what was found, and the fix where it did not pass.
    pub(crate) fn checks(&self, checks: &[redrive::doctor::Check]) {
        if self.json {
            let count = |s| checks.iter().filter(|c| c.status == s).count();
            use redrive::doctor::Status::{Fail, Pass, Warn};
            return print_json(&json!({
                "checks": checks, "passed": count(Pass), "warned": count(Warn), "failed": count(Fail),
            }));
        }
        for check in checks {
            let status = match check.status {
                redrive::doctor::Status::Pass => "PASS",
                redrive::doctor::Status::Warn => "WARN",
                redrive::doctor::Status::Fail => "FAIL",
            };
            println!("{status}  {:<22} {}", check.rule, check.found);
            if let Some(fix) = &check.fix {
                println!("      {:<22} fix: {fix}", "");
            }
        }
    }

    /// A verification's verdict per test, and where its evidence is.
    pub(crate) fn verified(&self, evidence: &crate::evidence::Evidence, written: &[std::path::PathBuf; 2]) {
        if self.json {
            return print_json(&serde_json::to_value(evidence).unwrap_or_default());
        }
        for test in &evidence.tests {
            let verdict = if test.passed { "passed" } else { "FAILED" };
            println!("{:<8} {verdict:<7} {}", test.name, test.failure.as_deref().unwrap_or(&test.checks));
        }
        println!("evidence: {} and {}", written[0].display(), written[1].display());
    }

    /// Whether the newest evidence still holds, and if not, why.
    pub(crate) fn freshness(&self, newest: Option<&crate::evidence::Evidence>, stale: &[String]) {
        let when = newest.map(|e| e.finished_at.to_rfc3339());
        if self.json {
            return print_json(&json!({ "fresh": stale.is_empty(), "newest": when, "why_not": stale }));
        }
        match (&when, stale.is_empty()) {
            (Some(when), true) => println!("the evidence of {when} holds"),
            _ => stale.iter().for_each(|why| println!("stale: {why}")),
        }
    }

    pub(crate) fn count(&self, what: &str, n: u64) {
        if self.json {
            return print_json(&json!({ what.replace(' ', "_"): n }));
        }
        println!("{what}: {n}");
    }

    pub(crate) fn outcome(&self, id: &str, outcome: &ReplayOutcome) {
        let (replayed, text) = match outcome {
            ReplayOutcome::Replayed(job) => (true, format!("record {id} replayed as job {job}")),
            ReplayOutcome::AlreadyClosed(s) => {
                (false, format!("record {id} was closed already ({}): nothing sent", state(s)))
            }
        };
        if self.json {
            let job = match outcome {
                ReplayOutcome::Replayed(job) => Some(job.0.clone()),
                ReplayOutcome::AlreadyClosed(_) => None,
            };
            return print_json(&json!({ "record": id, "replayed": replayed, "job": job }));
        }
        println!("{text}");
    }

    pub(crate) fn bulk(&self, replayed: u64, closed: u64) {
        if self.json {
            return print_json(&json!({ "replayed": replayed, "already_closed": closed }));
        }
        println!("replayed {replayed}; {closed} were closed meanwhile");
    }

    pub(crate) fn discarded(&self, discarded: u64, closed: u64) {
        if self.json {
            return print_json(&json!({ "discarded": discarded, "already_closed": closed }));
        }
        println!("discarded {discarded}; {closed} were closed meanwhile");
    }

    pub(crate) fn stats(&self, counts: Counts, open: u64) {
        let ready = counts.scheduled.map(|s| counts.queued.saturating_sub(s));
        let oldest = counts.oldest_ready.map(|age| age.as_secs_f64());
        if self.json {
            return print_json(&json!({
                "queued": counts.queued,
                "ready": ready,
                "scheduled": counts.scheduled,
                "running": counts.running,
                "oldest_ready_seconds": oldest,
                "open_records": open,
            }));
        }
        let unknown = || "unknown".to_owned();
        println!("queued        {}", counts.queued);
        println!("  ready       {}", ready.map_or_else(unknown, |n| n.to_string()));
        println!("  scheduled   {}", counts.scheduled.map_or_else(unknown, |n| n.to_string()));
        println!("running       {}", counts.running);
        let oldest = match counts.oldest_ready {
            Some(age) => humantime::format_duration(Duration::from_secs(age.as_secs())).to_string(),
            None if ready == Some(0) => "nothing ready".to_owned(),
            None => unknown(),
        };
        println!("oldest ready  {oldest}");
        println!("open records  {open}");
    }
}

fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}

fn paused_json(p: &Paused) -> serde_json::Value {
    json!({ "reason": p.reason, "by": p.by, "at": p.at, "probe_at": p.probe_at })
}

fn limits_json(l: &Limits) -> serde_json::Value {
    let rate = |r: Option<Rate>| r.map(|r| r.to_string());
    json!({
        "concurrency": l.concurrency,
        "rate": rate(l.rate),
        "key_concurrency": l.key_concurrency,
        "key_rate": rate(l.key_rate),
    })
}

/// When a breaker's probe may run: `due now`, or the time.
fn probe(p: &Paused) -> String {
    match p.probe_at {
        Some(at) if at <= Utc::now() => "due now".into(),
        Some(at) => time(at),
        None => "-".into(),
    }
}

impl Output {
    pub(crate) fn kinds(&self, kinds: &[KindFlow]) {
        if self.json {
            let kinds: Vec<_> = kinds
                .iter()
                .map(|k| json!({ "kind": k.kind, "paused": k.paused.as_ref().map(paused_json), "limits": limits_json(&k.limits) }))
                .collect();
            return print_json(&kinds);
        }
        if kinds.is_empty() {
            return println!("no kind is paused or limited");
        }
        let rows: Vec<[String; 7]> = kinds
            .iter()
            .map(|k| {
                let (state, by, since, next, reason) = match &k.paused {
                    Some(p) => ("paused".into(), p.by.clone(), time(p.at), probe(p), short(&p.reason, 60)),
                    None => ("running".into(), "-".into(), "-".into(), "-".into(), String::new()),
                };
                [k.kind.clone(), state, by, since, next, k.limits.to_string(), reason]
            })
            .collect();
        table(["KIND", "STATE", "BY", "SINCE (UTC)", "NEXT PROBE (UTC)", "LIMITS", "REASON"], &rows);
    }

    /// After a pause: the kind's pause as the store has it, ours (`changed`) or an earlier one.
    pub(crate) fn paused(&self, flow: &KindFlow, changed: bool) {
        if self.json {
            let paused = flow.paused.as_ref().map(paused_json);
            return print_json(&json!({ "kind": flow.kind, "changed": changed, "paused": paused }));
        }
        match (&flow.paused, changed) {
            (Some(p), true) => println!("paused {} by {}: {}", flow.kind, p.by, p.reason),
            (Some(p), false) => println!(
                "{} was paused already by {} since {} UTC: {}; nothing changed",
                flow.kind,
                p.by,
                time(p.at),
                p.reason
            ),
            // Resumed by someone else between the two reads.
            (None, _) => println!("{} is not paused now", flow.kind),
        }
    }

    pub(crate) fn resumed(&self, kind: &str, changed: bool) {
        if self.json {
            return print_json(&json!({ "kind": kind, "changed": changed }));
        }
        if changed {
            println!("resumed {kind}");
        } else {
            println!("{kind} was not paused: nothing changed");
        }
    }

    pub(crate) fn limits(&self, kind: &str, before: &Limits, after: &Limits) {
        if self.json {
            return print_json(&json!({ "kind": kind, "limits": limits_json(after), "before": limits_json(before) }));
        }
        println!("{kind}: {after} (before: {before})");
    }

    pub(crate) fn events(&self, events: &[FlowEvent]) {
        if self.json {
            let events: Vec<_> = events
                .iter()
                .map(|e| json!({ "at": e.at, "kind": e.kind, "action": e.action.as_str(), "by": e.by, "detail": e.detail }))
                .collect();
            return print_json(&events);
        }
        if events.is_empty() {
            return println!("no flow events");
        }
        let rows: Vec<[String; 5]> = events
            .iter()
            .map(|e| [time(e.at), e.kind.clone(), e.action.as_str().into(), e.by.clone(), short(&e.detail, 80)])
            .collect();
        table(["AT (UTC)", "KIND", "WHAT", "BY", "DETAIL"], &rows);
    }
}

impl Output {
    pub(crate) fn jobs(&self, jobs: &[LiveJob]) {
        if self.json {
            return print_json(&jobs);
        }
        let rows: Vec<[String; 7]> = jobs
            .iter()
            .map(|j| {
                [
                    j.id.0.clone(),
                    j.kind.clone(),
                    j.key.to_string(),
                    crate::jobs::state_text(j),
                    format!("{}/{}", j.attempts, j.cap),
                    time(j.created_at),
                    j.run_at.map_or_else(|| "-".into(), time),
                ]
            })
            .collect();
        table(["ID", "KIND", "KEY", "STATE", "ATTEMPTS", "ENQUEUED (UTC)", "RUNS AT (UTC)"], &rows);
        if let Some(last) = jobs.last() {
            let plural = if jobs.len() == 1 { "" } else { "s" };
            println!("\n{} job{plural}; the next page: --after {}", jobs.len(), last.id);
        } else {
            println!("no jobs match");
        }
    }

    pub(crate) fn job(&self, j: &LiveJob) {
        if self.json {
            return print_json(j);
        }
        println!("job           {}", j.id);
        println!("kind          {}", j.kind);
        println!("key           {}", j.key);
        println!("state         {}", j.state);
        println!("attempts      {} of {}", j.attempts, j.cap);
        println!("enqueued      {} UTC", time(j.created_at));
        if let Some(at) = j.run_at {
            println!("runs at       {} UTC", time(at));
        }
        if let Some(r) = &j.running {
            let since = r.since.map_or_else(|| "not kept".into(), |t| format!("{} UTC", time(t)));
            println!("running since {since}");
            println!("lease until   {} UTC (which worker holds it is not recorded)", time(r.lease_until));
        }
        if let Some(c) = &j.cancelled {
            // On a running job, a cancel asked: its worker stops it at its next renewal.
            let label = if j.state == JobState::Running { "cancel asked " } else { "cancelled    " };
            println!("{label} {} UTC by {}: {}", time(c.at), c.actor, c.reason);
        }
        println!("errors");
        for e in &j.errors {
            println!("  #{:<3} {}  {}", e.attempt, time(e.at), short(&e.error, 100));
        }
        println!("payload");
        let payload = serde_json::to_string_pretty(&j.payload).expect("serializes");
        for line in payload.lines() {
            println!("  {line}");
        }
    }

    pub(crate) fn key_cancelled(&self, key: &IdempotencyKey, outcome: &CancelOutcome) {
        if self.json {
            let already = match outcome {
                CancelOutcome::AlreadyCancelled(c) => Some(c),
                _ => None,
            };
            return print_json(&json!({ "key": key, "cancelled": already.is_none(), "already_cancelled": already }));
        }
        println!("{}", crate::jobs::key_outcome_text(key, outcome));
    }

    pub(crate) fn cancelled(&self, id: &JobId, outcome: &CancelOutcome) {
        if self.json {
            let (cancelled, asked, already) = match outcome {
                CancelOutcome::Cancelled => (true, false, None),
                CancelOutcome::Requested => (false, true, None),
                CancelOutcome::AlreadyCancelled(c) => (false, false, Some(c)),
            };
            return print_json(
                &json!({ "job": id, "cancelled": cancelled, "stop_asked": asked, "already_cancelled": already }),
            );
        }
        println!("{}", crate::jobs::outcome_text(id, outcome));
    }
}
