//! What only a backend author needs: the contracts a backend implements beyond what an
//! application calls, and the parts backends share.
//!
//! - [`Backend`] declares the backend's [`Capabilities`] (its [`Dedupe`] among them); the worker
//!   and the conformance suite read them, and the suite holds the backend to each.
//! - [`Claim`] takes jobs ([`Claimed`]) of some [`Kinds`] under a [`Lease`] and settles them;
//!   [`Renew`] extends a lease where the backend can ([`NoRenewal`] where it cannot). A claimed
//!   job is a [`JobRecord`]; its error history is a list of [`AttemptError`]s.
//! - [`Ledger`] is the effect ledger: [`Begin`] says what a key's [`Hold`] found. Its entries
//!   compare payloads by [`payload_fingerprint`].
//! - [`broker`] is what message-queue backends (SQS, Azure, QStash) share: they implement its
//!   `Broker` calls and keep failure records in a [`RecordStore`] (a record is [`Taken`] while
//!   a replay sends it), and carry jobs in an [`Envelope`].
//! - A ledger may keep flow control ([`Ledger::flow`], the application's [`Flow`](crate::Flow));
//!   its stores share the checks [`check_pause`], [`check_kind`] and [`require_history`] and the
//!   [`gcra`] step and the stored form of a rate ([`rate_columns`], [`stored_rate`],
//!   [`stored_count`]), and
//!   hand out [`Tokens`] and [`Slot`]s ([`NoFlow`] where a ledger keeps none).
//! - [`require_audit`] is the check every backend makes before a discard or a replay.
//! - [`BoxFuture`] is the boxed future of the object-safe traits ([`RecordStore`], alert sinks).
//!
//! A backend starts by saying what it can do; the conformance suite then holds it to each promise:
//!
//! ```
//! use redrive_core::kit::{Backend, Capabilities, Dedupe};
//!
//! struct MyQueue;
//!
//! impl Backend for MyQueue {
//!     fn capabilities(&self) -> Capabilities {
//!         // A broker-like queue: both copies of a key delivered, ten jobs a claim, batches
//!         // that may half succeed, claims of any kind.
//!         Capabilities {
//!             dedupe: Dedupe::None,
//!             max_claim: 10,
//!             atomic_batch: false,
//!             claim_by_kind: false,
//!             ..Capabilities::default()
//!         }
//!     }
//! }
//! # let _ = MyQueue.capabilities();
//! ```

pub mod broker;
pub mod group;

pub use crate::alert::BoxFuture;
pub use crate::backend::{
    AttemptError, Backend, Begin, Capabilities, Claim, Claimed, Dedupe, Hold, Kinds, Lease, Ledger, NoFlow, NoRenewal,
    Renew, Slot, Tokens, check_cancel, check_kind, check_pause, gcra, rate_columns, refuse_amend, require_audit,
    require_cancel_audit, require_history, stored_count, stored_rate,
};
pub use crate::envelope::{ENVELOPE_VERSION, Envelope};
pub use crate::job::{JobRecord, payload_fingerprint};
pub use crate::records::{RecordStore, Taken};
