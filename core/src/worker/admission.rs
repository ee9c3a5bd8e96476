//! Admission: whether a claimed job runs now, decided from what the worker knows about it, as the
//! [`RetryPolicy`](crate::RetryPolicy) decides what follows a run. [`admit`] does no I/O and
//! awaits nothing: the mechanics (`attempt.rs`) gather the [`Facts`], ask, carry the answer out,
//! and ask again when they have learned what the answer asked for (the ledger's answer, whether
//! the payload decodes). Each branch is a row of the table test below.
//!
//! A new rule is a fact in [`Facts`], a check in [`admit`] at its place in the order (most
//! "not now" rules belong before the key's hold is taken: waiting then costs the ledger
//! nothing), a reason in [`Deferral`] when it puts the job back, and a row in the table; the
//! mechanics then count, log and settle it by its reason (`defer` in `attempt.rs`). Flow
//! control is such a rule: its facts are whether the kind is ruled and the [`Gate`]'s answer
//! (`flow.rs` takes the slots and tokens the answer needs). A new kind of answer is a variant
//! of [`Admission`] and one arm of the match in `process` (`attempt.rs`) that carries it out.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::flow::Gate;
use crate::backend::Cancellation;
use crate::job::JobRecord;
use crate::policy::Backoff;

/// What the worker knows about a claimed job when it decides whether to run it.
#[derive(Debug, Clone)]
pub(super) struct Facts<'a> {
    /// How long since the job was claimed: it waited this long in the buffer for a handler.
    pub(super) waited: Duration,
    /// Why the backend could not read the job, if it could not.
    pub(super) undecodable: Option<&'a str>,
    /// Whether this worker has a handler for the job's kind.
    pub(super) handled: bool,
    /// The time the job's `not_before` and deadline are read against.
    pub(super) now: DateTime<Utc>,
    pub(super) not_before: Option<DateTime<Utc>>,
    pub(super) deadline: Option<DateTime<Utc>>,
    /// This attempt's number and the cap.
    pub(super) attempt: u32,
    pub(super) cap: u32,
    /// Claims of the job that lapsed unstarted before.
    pub(super) stranded: u32,
    /// What the ledger answered for the key; `None` until it was asked (or the claim carried it).
    pub(super) key: Option<KeyState>,
    /// Why the payload does not decode for its handler, once decoding it failed.
    pub(super) payload_error: Option<String>,
    /// Whether its kind is paused or limited, as the flow store last said.
    pub(super) flow_ruled: bool,
    /// What flow control answered; `None` until it was asked.
    pub(super) gate: Option<Gate>,
}

impl<'a> Facts<'a> {
    /// What the claim itself says, at `now`, `waited` after the claim.
    pub(super) fn claimed(job: &'a JobRecord, handled: bool, now: DateTime<Utc>, waited: Duration) -> Self {
        Self {
            waited,
            undecodable: job.undecodable.as_deref(),
            handled,
            now,
            not_before: job.not_before,
            deadline: job.deadline,
            attempt: job.attempt,
            cap: job.cap,
            stranded: job.stranded,
            key: None,
            payload_error: None,
            flow_ruled: false,
            gate: None,
        }
    }
}

/// The ledger's answer for a job's key, without the hold itself (the mechanics keep that).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum KeyState {
    /// No attempt has started the effect.
    Fresh,
    /// An earlier attempt started the effect and did not finish.
    Resumed,
    /// Another attempt holds the key for about this long.
    Busy(Duration),
    /// The effect is done.
    Done,
    /// A person cancelled the key: the effect shall not happen.
    Cancelled(Cancellation),
    /// The key was begun with another payload: the error, as it reads.
    Conflict(String),
    /// The ledger could not be reached.
    Unreachable {
        /// Failures in a row, this one included.
        failures: u32,
        /// The error, as it reads, for the log.
        error: String,
    },
}

/// The settings admission reads, from the worker's configuration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules {
    /// The full lease of a running job.
    pub(super) lease: Duration,
    /// The lease a job is claimed with.
    pub(super) claim_lease: Duration,
    /// How long a claim waits for work: the delay before a job of a kind not handled here comes
    /// back.
    pub(super) poll: Duration,
    /// Whether the back-off while the ledger is unreachable has jitter (off in tests, so their
    /// delays are exact).
    pub(super) jitter: bool,
}

/// Why a job is put back unrun, at no attempt's cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Deferral {
    /// No handler for its kind here (a backend that cannot claim by kind).
    NotHandledHere,
    /// Received before its time (a broker's delay is capped).
    NotDue,
    /// Another attempt holds its key.
    KeyBusy,
    /// The effect ledger (or its flow store) could not be reached (the error, as it reads, for
    /// the log).
    LedgerDown {
        /// The ledger's error.
        error: String,
    },
    /// Its kind is paused (by this person, or the breaker).
    Paused {
        /// Who paused it.
        by: String,
    },
    /// Its kind's or its key's rate is spent for now.
    RateLimited,
    /// Its kind's or its key's concurrency limit is full.
    AtLimit,
}

/// Why a job is completed without running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Unrun {
    /// The ledger says its key's effect is done: a recorded skip.
    AlreadyDone,
    /// Claimed past its deadline: worthless late, dropped, not a failure.
    Expired,
    /// A person cancelled its key in the ledger (a broker's cancel): who, why.
    Withdrawn(Cancellation),
}

/// What to do with a claimed job before (or instead of) running it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Admission {
    /// Give it back unrun, at no attempt's cost: it waited in the buffer for half its claim
    /// lease, and would run on a lease about to lapse.
    Release,
    /// Put it back for this long, at no attempt's cost, no error written, never a record.
    Defer {
        /// How long until it comes back.
        delay: Duration,
        /// Why.
        why: Deferral,
    },
    /// Complete it without running it.
    Complete(Unrun),
    /// Write its failure record now, with this error: no attempt can succeed.
    DeadLetter(String),
    /// Pass flow control's gate (the kind's pause, its limits' slots and tokens), then admit
    /// again with its answer.
    CheckFlow,
    /// Take the key's hold (ask the ledger), then admit again with its answer.
    TakeHold,
    /// Run the handler: decode the payload (and admit again if it does not decode), then run.
    Run {
        /// An earlier attempt started the effect and did not finish.
        earlier_attempt_pending: bool,
        /// Mark the job started (renew its lease) before the handler runs: claims of it lapsed
        /// unstarted before, so a job that kills its worker at once must be charged this time.
        mark_started: bool,
    },
}

/// Whether and how a claimed job runs, from what is known about it so far. The checks go in
/// order; the first that applies answers.
pub(super) fn admit(facts: &Facts<'_>, rules: &Rules) -> Admission {
    if facts.waited >= rules.claim_lease / 2 {
        return Admission::Release;
    }
    if let Some(why) = facts.undecodable {
        // Its kind and payload are stand-ins: no handler may see it. Reading it again cannot
        // succeed: no retries.
        return Admission::DeadLetter(why.to_owned());
    }
    if !facts.handled {
        // Another worker's job (a rolling deploy, workers that each run some kinds).
        return Admission::Defer { delay: rules.poll, why: Deferral::NotHandledHere };
    }
    if let Some(wait) = facts.not_before.and_then(|at| (at - facts.now).to_std().ok()).filter(|w| !w.is_zero()) {
        return Admission::Defer { delay: wait, why: Deferral::NotDue };
    }
    if facts.deadline.is_some_and(|deadline| deadline < facts.now) {
        return Admission::Complete(Unrun::Expired);
    }
    // Flow control: after what the job itself says, before the key's hold, so a job that waits
    // costs the ledger nothing. Every wait is at no attempt's cost, never a record.
    if facts.flow_ruled {
        match &facts.gate {
            None => return Admission::CheckFlow,
            Some(Gate::Open | Gate::Probe) => {}
            Some(Gate::Paused { by, recheck }) => {
                return Admission::Defer { delay: *recheck, why: Deferral::Paused { by: by.clone() } };
            }
            Some(Gate::RateLimited(wait)) => {
                // A millisecond on: the bucket frees the start at `wait`, not before.
                let delay = *wait + Duration::from_millis(1);
                return Admission::Defer { delay, why: Deferral::RateLimited };
            }
            // A slot frees when a running job of the kind ends: look again soon, not at once.
            Some(Gate::AtLimit) => {
                let delay = (rules.poll / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
                return Admission::Defer { delay, why: Deferral::AtLimit };
            }
            Some(Gate::Unreachable { failures, error }) => {
                let delay = ledger_backoff(rules).delay(*failures);
                return Admission::Defer { delay, why: Deferral::LedgerDown { error: error.clone() } };
            }
        }
    }
    let earlier_attempt_pending = match &facts.key {
        None => return Admission::TakeHold,
        Some(KeyState::Done) => return Admission::Complete(Unrun::AlreadyDone),
        Some(KeyState::Cancelled(cancel)) => return Admission::Complete(Unrun::Withdrawn(cancel.clone())),
        // Not a failure, and never a dead letter: another attempt is doing the work. Look again
        // when its hold ends, not sooner; a holder that dies lets the hold lapse, and then this
        // copy runs. At most a third of the lease: a hold far longer than the worker's own (a
        // direct `Ledger::begin`) and released early is not waited out whole.
        Some(KeyState::Busy(held_for)) => {
            let delay = (*held_for).min(rules.lease / 3) + Duration::from_millis(10);
            return Admission::Defer { delay, why: Deferral::KeyBusy };
        }
        Some(KeyState::Conflict(error)) => {
            return Admission::DeadLetter(format!("key reused with a different payload: {error}"));
        }
        // The ledger, not the job, is at fault: back at no cost, sooner while the outage is
        // young, up to a third of the lease so the queue is back at work soon after the ledger.
        Some(KeyState::Unreachable { failures, error }) => {
            let delay = ledger_backoff(rules).delay(*failures);
            return Admission::Defer { delay, why: Deferral::LedgerDown { error: error.clone() } };
        }
        Some(KeyState::Fresh) => false,
        Some(KeyState::Resumed) => true,
    };
    if facts.attempt > facts.cap {
        // A worker died holding the lease on the last attempt: no attempt is left.
        return Admission::DeadLetter(format!(
            "attempt {} is past the cap of {}: the last attempt's worker lost its lease",
            facts.attempt, facts.cap
        ));
    }
    if let Some(error) = &facts.payload_error {
        // Decoding again cannot succeed: no retries.
        return Admission::DeadLetter(format!("payload does not decode: {error}"));
    }
    Admission::Run { earlier_attempt_pending, mark_started: facts.stranded > 0 }
}

/// The pause after the ledger failed: from 100 ms, doubling, up to a third of the lease.
fn ledger_backoff(rules: &Rules) -> Backoff {
    Backoff {
        base: Duration::from_millis(100),
        max: (rules.lease / 3).max(Duration::from_millis(100)),
        jitter: rules.jitter,
        ..Backoff::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: Rules = Rules {
        lease: Duration::from_secs(30),
        claim_lease: Duration::from_secs(3),
        poll: Duration::from_secs(1),
        jitter: false,
    };

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("in range")
    }

    /// A job claimed just now, handled here, on its first attempt of 5, with nothing known of
    /// its key yet.
    fn claimed() -> Facts<'static> {
        Facts {
            waited: Duration::from_millis(5),
            undecodable: None,
            handled: true,
            now: at(0),
            not_before: None,
            deadline: None,
            attempt: 1,
            cap: 5,
            stranded: 0,
            key: None,
            payload_error: None,
            flow_ruled: false,
            gate: None,
        }
    }

    fn gated(gate: Gate) -> Facts<'static> {
        Facts { flow_ruled: true, gate: Some(gate), ..claimed() }
    }

    fn with_key(key: KeyState) -> Facts<'static> {
        Facts { key: Some(key), ..claimed() }
    }

    fn cancel() -> Cancellation {
        Cancellation { at: at(0), reason: "order withdrawn".into(), actor: "ana".into() }
    }

    fn run(earlier_attempt_pending: bool, mark_started: bool) -> Admission {
        Admission::Run { earlier_attempt_pending, mark_started }
    }

    fn down(failures: u32) -> KeyState {
        KeyState::Unreachable { failures, error: "connection refused".into() }
    }

    fn ledger_down() -> Deferral {
        Deferral::LedgerDown { error: "connection refused".into() }
    }

    fn defer(ms: u64, why: Deferral) -> Admission {
        Admission::Defer { delay: Duration::from_millis(ms), why }
    }

    /// The delay to the millisecond: the backoff's float arithmetic is off by nanoseconds.
    fn to_the_ms(admission: Admission) -> Admission {
        match admission {
            Admission::Defer { delay, why } => {
                Admission::Defer { delay: Duration::from_millis((delay.as_secs_f64() * 1000.0).round() as u64), why }
            }
            other => other,
        }
    }

    #[test]
    fn each_fact_admits_as_the_table_says() {
        let table: Vec<(&str, Facts<'static>, Admission)> = vec![
            // Before the key's hold is taken, in order.
            (
                "waited half its claim lease in the buffer",
                Facts { waited: Duration::from_millis(1500), undecodable: Some("not an envelope"), ..claimed() },
                Admission::Release,
            ),
            (
                "the backend could not read it",
                Facts { undecodable: Some("not an envelope"), handled: false, ..claimed() },
                Admission::DeadLetter("not an envelope".into()),
            ),
            (
                "no handler for its kind here",
                Facts { handled: false, not_before: Some(at(60)), ..claimed() },
                defer(1000, Deferral::NotHandledHere),
            ),
            (
                "received before its time",
                Facts { not_before: Some(at(60)), deadline: Some(at(-1)), ..claimed() },
                defer(60_000, Deferral::NotDue),
            ),
            ("due just now", Facts { not_before: Some(at(0)), ..claimed() }, Admission::TakeHold),
            (
                "claimed past its deadline",
                Facts { deadline: Some(at(-1)), key: Some(KeyState::Fresh), ..claimed() },
                Admission::Complete(Unrun::Expired),
            ),
            ("before its deadline", Facts { deadline: Some(at(1)), ..claimed() }, Admission::TakeHold),
            // Flow control, before the key's hold.
            ("its kind is paused or limited", Facts { flow_ruled: true, ..claimed() }, Admission::CheckFlow),
            (
                "a paused kind, past its deadline",
                Facts { flow_ruled: true, deadline: Some(at(-1)), ..claimed() },
                Admission::Complete(Unrun::Expired),
            ),
            (
                "its kind is paused",
                gated(Gate::Paused { by: "ana".into(), recheck: Duration::from_secs(5) }),
                defer(5000, Deferral::Paused { by: "ana".into() }),
            ),
            (
                "its rate is spent",
                gated(Gate::RateLimited(Duration::from_millis(40))),
                defer(41, Deferral::RateLimited),
            ),
            ("its concurrency limit is full", gated(Gate::AtLimit), defer(250, Deferral::AtLimit)),
            (
                "the flow store is down",
                gated(Gate::Unreachable { failures: 1, error: "connection refused".into() }),
                defer(100, ledger_down()),
            ),
            ("the gate is open", gated(Gate::Open), Admission::TakeHold),
            ("the breaker's probe", Facts { key: Some(KeyState::Fresh), ..gated(Gate::Probe) }, run(false, false)),
            ("nothing known of its key yet", claimed(), Admission::TakeHold),
            // The ledger's answer.
            ("the effect is done", with_key(KeyState::Done), Admission::Complete(Unrun::AlreadyDone)),
            (
                "its key was cancelled, even past the cap",
                Facts { attempt: 9, ..with_key(KeyState::Cancelled(cancel())) },
                Admission::Complete(Unrun::Withdrawn(cancel())),
            ),
            (
                "another attempt holds the key",
                with_key(KeyState::Busy(Duration::from_secs(2))),
                defer(2010, Deferral::KeyBusy),
            ),
            (
                "a hold longer than a third of the lease is not waited out whole",
                with_key(KeyState::Busy(Duration::from_secs(600))),
                defer(10_010, Deferral::KeyBusy),
            ),
            (
                "the key was begun with another payload",
                Facts { attempt: 9, ..with_key(KeyState::Conflict("key k".into())) },
                Admission::DeadLetter("key reused with a different payload: key k".into()),
            ),
            ("the ledger is down", with_key(down(1)), defer(100, ledger_down())),
            ("the ledger is still down", with_key(down(3)), defer(400, ledger_down())),
            ("the ledger has been down long", with_key(down(30)), defer(10_000, ledger_down())),
            // With the key held.
            (
                "past the cap: the last attempt's worker lost its lease",
                Facts { attempt: 6, payload_error: Some("missing field".into()), ..with_key(KeyState::Fresh) },
                Admission::DeadLetter(
                    "attempt 6 is past the cap of 5: the last attempt's worker lost its lease".into(),
                ),
            ),
            ("the last attempt", Facts { attempt: 5, ..with_key(KeyState::Fresh) }, run(false, false)),
            (
                "the payload does not decode for its handler",
                Facts { payload_error: Some("missing field `order`".into()), ..with_key(KeyState::Resumed) },
                Admission::DeadLetter("payload does not decode: missing field `order`".into()),
            ),
            ("a fresh key", with_key(KeyState::Fresh), run(false, false)),
            ("an earlier attempt left the key pending", with_key(KeyState::Resumed), run(true, false)),
            (
                "claims of it lapsed unstarted before",
                Facts { stranded: 2, ..with_key(KeyState::Resumed) },
                run(true, true),
            ),
        ];
        for (case, facts, expected) in table {
            assert_eq!(to_the_ms(admit(&facts, &RULES)), expected, "{case}");
        }
    }

    #[test]
    fn the_ledger_backoff_has_jitter_outside_tests() {
        let rules = Rules { jitter: true, ..RULES };
        let delays: Vec<_> = (0..100)
            .map(|_| match admit(&with_key(down(3)), &rules) {
                Admission::Defer { delay, why: Deferral::LedgerDown { .. } } => delay,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(delays.iter().all(|d| *d >= Duration::from_millis(400) && *d <= Duration::from_millis(800)));
    }
}
