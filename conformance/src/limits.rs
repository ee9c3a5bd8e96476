//! Payloads at the edges of what a backend can carry: exactly its declared limit, multibyte
//! characters straddling it, and characters some stores or brokers refuse.

use std::collections::BTreeMap;

use redrive_core::ErrorKind;
use redrive_core::kit::Ledger;

use crate::harness::{Probe, Run, ensure};
use crate::{Outcome, Queue, Subject};

/// Bodies with characters a store or broker may refuse or rewrite: NUL (PostgreSQL `jsonb`),
/// the noncharacters U+FFFE and U+FFFF (SQS and XML allow neither), control characters, the
/// edges of the ranges SQS allows, a byte-order mark, line separators, and text that means
/// something in an XML envelope.
const AWKWARD: [&str; 8] = [
    "nul \u{0} inside",
    "noncharacters \u{FFFE}\u{FFFF}",
    "controls \u{1}\u{8}\u{B}\u{C}\u{1B}\u{1F}\u{7F}\u{80}\u{9F}",
    "range edges \u{D7FF}\u{E000}\u{FFFD}\u{10000}\u{10FFFF}",
    "\u{FEFF}byte-order mark, then \r\n\t and \u{2028}\u{2029}",
    "</MessageText><![CDATA[ & ]]> &amp; \"quoted\" \\ back",
    "  spaces at both ends  ",
    "emoji 😀 and combining e\u{301} and 日本語",
];

/// A probe whose payload is exactly `len` bytes: `fill` repeated, `x` to make up what a wide
/// `fill` leaves, then `tail`.
fn sized(id: u32, len: usize, fill: char, tail: &str) -> Probe {
    let overhead = Probe { id, body: tail.to_owned() }.new_job().payload_len();
    let room = len.saturating_sub(overhead);
    let mut body: String = std::iter::repeat_n(fill, room / fill.len_utf8()).collect();
    body.extend(std::iter::repeat_n('x', room % fill.len_utf8()));
    body.push_str(tail);
    Probe { id, body }
}

/// Behaviour 28: Payloads at the backend's declared limit (ASCII, multibyte, XML-special), in
/// one enqueue and in a batch, are accepted and reach the handler byte for byte; multibyte
/// characters straddling the limit are refused with `PayloadTooLarge` (bytes are counted, not
/// characters); payloads with characters a store or broker may refuse are either delivered
/// intact or refused at enqueue with a typed, permanent error. Nothing is lost or mangled.
pub async fn payload_limits<Q: Queue, L: Ledger + Clone + 'static>(subject: Subject<Q, L>) -> Outcome {
    let run = Run::new("payload_limits", subject);
    let limit = run.caps.max_payload;
    let mut sent: BTreeMap<u32, String> = BTreeMap::new();

    // At the limit exactly: what the backend declares it accepts.
    let exact =
        [sized(1, limit, 'x', ""), sized(2, limit, 'x', "😀"), sized(3, limit, 'あ', ""), sized(4, limit, '&', "<")];
    for probe in &exact {
        let job = probe.new_job();
        ensure!(run, job.payload_len() == limit, "test setup: probe {} should be {limit} bytes", probe.id);
        let enqueued = run.s.queue.enqueue(job).await;
        ensure!(
            run,
            enqueued.is_ok(),
            "a payload of exactly the declared {limit} bytes (probe {}) should be accepted, got {enqueued:?}",
            probe.id
        );
        sent.insert(probe.id, probe.body.clone());
    }
    let batch = [sized(5, limit, 'x', ""), sized(6, limit, 'é', "")];
    let enqueued = run.s.queue.enqueue_batch(batch.iter().map(Probe::new_job).collect()).await;
    ensure!(run, enqueued.is_ok(), "a batch of payloads at the limit should be accepted, got {enqueued:?}");
    sent.extend(batch.iter().map(|p| (p.id, p.body.clone())));

    // A character that fits by count but not by bytes.
    let straddling = [sized(10, limit + 2, 'x', "😀"), sized(11, limit + 1, 'x', "é"), sized(12, limit + 2, 'x', "€")];
    for probe in &straddling {
        ensure!(run, probe.body.chars().count() < limit, "test setup: probe {} fits by characters", probe.id);
        let refused = run.s.queue.enqueue(probe.new_job()).await;
        ensure!(
            run,
            refused.as_ref().is_err_and(|e| e.kind() == ErrorKind::PayloadTooLarge),
            "a payload whose last character ends past the limit (probe {}) should be refused with \
             PayloadTooLarge, got {refused:?}",
            probe.id
        );
    }

    // Characters some stores or brokers refuse: delivered as they are, or refused typed.
    for (id, body) in (20..).zip(AWKWARD) {
        let probe = Probe { id, body: body.to_owned() };
        match run.s.queue.enqueue(probe.new_job()).await {
            Ok(_) => {
                sent.insert(id, probe.body);
            }
            Err(e) => ensure!(
                run,
                e.kind() != ErrorKind::Backend && !e.is_temporary(),
                "probe {id} ({body:?}) should be delivered or refused with a typed, permanent error, got {e}"
            ),
        }
    }
    // The same characters in a job that carries its own: an enqueue that takes one takes both.
    let awkward_all = Probe { id: 30, body: AWKWARD.concat() };
    if run.s.queue.enqueue(awkward_all.new_job()).await.is_ok() {
        sent.insert(30, awkward_all.body);
    }

    let worker = run.worker(4);
    if let Err(mut violation) = run.wait_for_effects(sent.len()).await {
        let missing: Vec<u32> =
            sent.keys().copied().filter(|id| run.script.effects_of(&Probe::key(*id)).is_empty()).collect();
        violation.message = format!("{}: no effect for probes {missing:?}", violation.message);
        return Err(violation);
    }
    run.settle().await;
    worker.shutdown().await;
    for (id, body) in &sent {
        let effects = run.script.effects_of(&Probe::key(*id));
        let mangled = effects.iter().find(|e| e.body != *body);
        ensure!(
            run,
            mangled.is_none(),
            "probe {id}'s payload reached the handler changed ({} bytes sent, {} received)",
            body.len(),
            mangled.map_or(0, |e| e.body.len())
        );
    }
    let ids: Vec<u32> = sent.into_keys().collect();
    run.report(&ids, &[]).await
}

#[cfg(test)]
mod tests {
    use redrive_core::NewJob;

    use super::*;

    #[test]
    fn sized_probes_are_the_asked_length() {
        for (fill, tail) in [('x', ""), ('x', "😀"), ('あ', ""), ('&', "<"), ('é', "")] {
            for len in [1000, 1001, 1002, 1003] {
                let p = sized(1, len, fill, tail);
                let n = NewJob::from_job(&p).unwrap().payload_len();
                assert_eq!(n, len, "{fill:?} {tail:?}");
            }
        }
    }
}
