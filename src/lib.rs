#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

//! # Why `webhook` is a feature here, off by default
//!
//! Core's Slack-compatible webhook sink (`WebhookAlerts`) posts with reqwest over rustls, whose
//! crypto is aws-lc-rs: a C library compiled from source on a first build. The facade
//! depends on core without its default features and offers `webhook` as its own, so that
//! `cargo run --example quickstart`, and an application that alerts another way, build without
//! it. Turn it on (`features = ["webhook"]`) for `WebhookAlerts`. A backend feature may bring
//! it along anyway (its SDK's TLS is the same stack). Measured on a fresh clone with an empty
//! cargo home (2 cores, nothing else building): the quickstart built 69 crates in 21 s; with
//! core's defaults and the backends' examples' dependencies beside it, 172 crates in 56 s.

pub use redrive_core::*;

// The registry of backends by URL (its docs are the module's own).
#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "sqs",
    feature = "azure",
    feature = "qstash",
    feature = "inngest",
    feature = "pgmq"
))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(
        feature = "postgres",
        feature = "sqlite",
        feature = "sqs",
        feature = "azure",
        feature = "qstash",
        feature = "inngest",
        feature = "pgmq"
    )))
)]
pub mod any;

/// PostgreSQL: jobs and failed_jobs tables, `FOR UPDATE SKIP LOCKED` claims, the effect ledger.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    pub use redrive_postgres::*;
}

/// Amazon SQS: a redrive policy and DLQ, dead-lettering with the error, redrive back.
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub mod sqs {
    pub use redrive_sqs::*;
}

/// SQLite: jobs, keys, failure records and the effect ledger in one file, no server.
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite {
    pub use redrive_sqlite::*;
}

/// Azure Queue Storage: dequeue counts, pop-receipt leases, a `-poison` queue, records in your
/// database.
#[cfg(feature = "azure")]
#[cfg_attr(docsrs, doc(cfg(feature = "azure")))]
pub mod azure {
    pub use redrive_azure::*;
}

/// Upstash QStash: push delivery to a signed receiver, dedupe, the QStash DLQ as failure records.
#[cfg(feature = "qstash")]
#[cfg_attr(docsrs, doc(cfg(feature = "qstash")))]
pub mod qstash {
    pub use redrive_qstash::*;
}

/// Inngest: jobs sent as events under a stable id, a signed serve endpoint feeding the same
/// handlers, failed runs as failure records in your database.
#[cfg(feature = "inngest")]
#[cfg_attr(docsrs, doc(cfg(feature = "inngest")))]
pub mod inngest {
    pub use redrive_inngest::*;
}

/// pgmq (Supabase Queues): its queues in your PostgreSQL database, settlements fenced on the
/// read, failure records and replay beside them.
#[cfg(feature = "pgmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "pgmq")))]
pub mod pgmq {
    pub use redrive_pgmq::*;
}
