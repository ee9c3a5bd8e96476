//! `PgBackend` as the record store of a broker queue: the checks every `RecordStore` passes
//! (records kept once, a replay's take, its give-back and its close, discards, paging, finding
//! any text in a record, purge).

mod common;

#[tokio::test]
async fn a_take_is_exclusive_given_back_or_closed_and_records_are_kept_once() {
    redrive_conformance::check_record_store(&common::backend("brokerrec").await).await;
}
