//! `Debug` that never shows payloads or tokens: a `{:?}` of a job, a lease or a record must be
//! safe to log.

/// Implements `Debug` for a struct, showing the `show` fields and `<redacted>` for the `hide`
/// ones. Every field must be named in one list or the other (the struct is destructured), so a
/// field added later cannot slip through unredacted or unnoticed.
macro_rules! debug_redacted {
    ($ty:ident { show: [$($shown:ident),* $(,)?], hide: [$($hidden:ident),* $(,)?] $(,)? }) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let $ty { $($shown,)* $($hidden: _,)* } = self;
                let mut out = f.debug_struct(stringify!($ty));
                $(out.field(stringify!($shown), $shown);)*
                $(out.field(stringify!($hidden), &format_args!("<redacted>"));)*
                out.finish()
            }
        }
    };
}

pub(crate) use debug_redacted;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::backend::{FailureId, FailureRecord, Hold, Lease, RecordState};
    use crate::envelope::Envelope;
    use crate::job::{JobId, JobRecord, NewJob, Severity};
    use crate::key::IdempotencyKey;

    #[test]
    fn debug_shows_no_payload_and_no_token() {
        const CANARY: &str = "4111-1111-1111-1111";
        let key = IdempotencyKey::builder("charge").fact("order", 7).build().unwrap();
        let new = NewJob::new("charge", key.clone(), json!({ "card": CANARY })).unwrap();
        let job = JobRecord {
            id: JobId("1".into()),
            kind: new.kind.clone(),
            key: key.clone(),
            provider_key: new.provider_key,
            payload: new.payload.clone(),
            attempt: 1,
            cap: 5,
            severity: Severity::Error,
            priority: 0,
            enqueued_at: chrono::Utc::now(),
            deadline: None,
            not_before: None,
            stranded: 0,
            undecodable: None,
            replay_of: None,
            traceparent: None,
        };
        let lease = Lease { job_id: job.id.clone(), token: CANARY.into() };
        let hold =
            Hold { key: key.clone(), token: CANARY.into(), provider_key: new.provider_key, lease: Some(lease.clone()) };
        let record = FailureRecord {
            id: FailureId("1".into()),
            job_id: job.id.clone(),
            kind: job.kind.clone(),
            key: key.clone(),
            provider_key: job.provider_key,
            payload: job.payload.clone(),
            last_error: "declined".into(),
            errors: vec![],
            attempts: 5,
            cap: 5,
            severity: Severity::Error,
            first_failed_at: job.enqueued_at,
            last_failed_at: job.enqueued_at,
            state: RecordState::Open,
            replay_of: None,
            amended: Some(json!({ "card": CANARY })),
            trace_id: None,
        };
        let envelope = Envelope::new(&new);
        for debug in [
            format!("{new:?}"),
            format!("{job:?}"),
            format!("{lease:?}"),
            format!("{hold:?}"),
            format!("{record:?}"),
            format!("{envelope:?}"),
        ] {
            assert!(!debug.contains(CANARY), "{debug}");
            assert!(debug.contains("<redacted>"), "{debug}");
        }
        assert!(format!("{job:?}").contains("charge:order=7"), "the key is shown");
    }
}
