//! Batched deletes: concurrent completions share `DeleteMessageBatch` calls of up to ten.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
use redrive_core::{Error, Result};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::error::{classify, sdk};

struct Request {
    receipt: String,
    reply: oneshot::Sender<Result<()>>,
}

pub(crate) struct Deleter {
    tx: mpsc::UnboundedSender<Request>,
}

/// Batch calls in flight at once.
const IN_FLIGHT: usize = 4;
/// The longest a completion waits for others to share its delete call.
const LINGER: std::time::Duration = std::time::Duration::from_millis(25);

impl Deleter {
    pub(crate) fn start(client: Client, queue_url: String) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(flush_loop(client, queue_url, rx));
        Self { tx }
    }

    pub(crate) async fn delete(&self, receipt: String) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Request { receipt, reply }).map_err(|_| Error::temporary("the deleter stopped"))?;
        answer.await.map_err(|_| Error::temporary("the deleter stopped"))?
    }
}

async fn flush_loop(client: Client, url: String, mut rx: mpsc::UnboundedReceiver<Request>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        let mut batch = Vec::new();
        if rx.recv_many(&mut batch, 10).await == 0 {
            return;
        }
        // Requests are what SQS bills: give a burst of completions a moment to fill the batch.
        let linger = tokio::time::Instant::now() + LINGER;
        while batch.len() < 10 {
            let room = 10 - batch.len();
            match tokio::time::timeout_at(linger, rx.recv_many(&mut batch, room)).await {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            flush(&client, &url, batch).await;
            drop(slot);
        });
    }
}

async fn flush(client: &Client, url: &str, batch: Vec<Request>) {
    let entries = batch.iter().enumerate().map(|(i, r)| {
        DeleteMessageBatchRequestEntry::builder()
            .id(i.to_string())
            .receipt_handle(&r.receipt)
            .build()
            .expect("id and receipt are set")
    });
    match client.delete_message_batch().queue_url(url).set_entries(Some(entries.collect())).send().await {
        Ok(out) => {
            let failed: HashMap<String, String> = out.failed.into_iter().map(|f| (f.id, f.code)).collect();
            for (i, r) in batch.into_iter().enumerate() {
                let answer = match failed.get(&i.to_string()) {
                    None => Ok(()),
                    Some(code) => {
                        let (kind, retry) = classify(Some(code));
                        Err(Error::new(kind, format!("sqs: delete ({code})")).with_retry(retry))
                    }
                };
                let _ = r.reply.send(answer);
            }
        }
        Err(e) => {
            // Each completion gets the failure whole: its kind, retry flag and the SDK's error.
            let error = sdk(e, "delete batch");
            for r in batch {
                let _ = r.reply.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use aws_sdk_sqs::error::SdkError;
    use aws_sdk_sqs::operation::delete_message_batch::DeleteMessageBatchError;
    use redrive_core::{ErrorKind, Retry};

    use super::*;

    #[test]
    fn a_failed_batch_answers_each_completion_with_the_whole_error() {
        let timeout = SdkError::<DeleteMessageBatchError, aws_sdk_sqs::config::http::HttpResponse>::timeout_error(
            std::io::Error::other("read timed out"),
        );
        let error = sdk(timeout, "delete batch");
        for e in [error.clone(), error] {
            assert_eq!((e.kind(), e.retry()), (ErrorKind::Backend, Retry::Temporary));
            assert_eq!(e.message(), "sqs: delete batch (no code)");
            assert!(e.source().is_some(), "the SDK's error is kept as the source");
        }
    }
}
