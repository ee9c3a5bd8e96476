#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use redrive_core::*;

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
