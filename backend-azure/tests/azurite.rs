//! Against Azurite (started by `scripts/services`; a missing Azurite fails these tests): the
//! signing, the pinned service version and the pop receipts the backend fences leases with.

use redrive_azure::AzureConfig;
use redrive_azure::azure_storage_queue::models::{QueueClientReceiveMessagesOptions, QueueMessage};

fn unique(label: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("rdt-{label}-{}-{nanos:x}", std::process::id())
}

#[tokio::test]
async fn a_signed_client_sends_receives_and_a_stale_pop_receipt_is_refused() {
    let queue = AzureConfig::development().queue_client(&unique("sign")).unwrap();
    queue.create(None).await.unwrap_or_else(|e| panic!("Azurite is required (run scripts/test): {e}"));
    let text = r#"{"v":1,"kind":"ship"}"#;
    let message = QueueMessage { message_text: Some(text.into()) };
    queue.send_message(message.try_into().unwrap(), None).await.unwrap();
    let options = QueueClientReceiveMessagesOptions {
        number_of_messages: Some(32),
        visibility_timeout: Some(30),
        ..Default::default()
    };
    let got = queue.receive_messages(Some(options)).await.unwrap().into_model().unwrap().items.unwrap_or_default();
    assert_eq!(got.len(), 1);
    let (id, first) = (got[0].message_id.clone().unwrap(), got[0].pop_receipt.clone().unwrap());
    assert_eq!((got[0].dequeue_count, got[0].message_text.as_deref()), (Some(1), Some(text)));

    // An update answers a new pop receipt, in a raw header; the old one no longer settles.
    let updated = queue.update_message(&id, &first, 30, None).await.unwrap();
    let second = updated.headers().iter().find(|(name, _)| name.as_str() == "x-ms-popreceipt");
    let second = second.map(|(_, value)| value.as_str().to_owned()).expect("a new pop receipt");
    assert_ne!(second, first);
    let stale = queue.delete_message(&id, &first, None).await.unwrap_err();
    assert_eq!(stale.http_status().map(u16::from), Some(400), "{stale}");
    queue.delete_message(&id, &second, None).await.unwrap();
    queue.delete(None).await.unwrap();
}

#[tokio::test]
async fn a_wrong_key_is_refused_as_unauthorized() {
    let wrong = AzureConfig::from_connection_string(
        "AccountName=devstoreaccount1;AccountKey=d3Jvbmcga2V5;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1",
    )
    .unwrap();
    let err = wrong.queue_client(&unique("key")).unwrap().create(None).await.unwrap_err();
    assert_eq!(err.http_status().map(u16::from), Some(403), "{err}");
}
