//! The log capture: every line the process's tests write, searched for texts that must never
//! appear (payloads, receipts, tokens).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Tracing output of every test in the process, searched for the texts registered with
/// [`LogWatch::watch`] as it is written, and the latest lines kept: a text learnt only when a
/// call returns (a receipt) is looked for in what that call logged too.
pub(crate) struct LogWatch {
    texts: Mutex<Vec<(String, Arc<AtomicBool>)>>,
    recent: Mutex<std::collections::VecDeque<String>>,
}

/// Lines [`LogWatch`] keeps: the tests of one process, well past one call's.
const RECENT_LINES: usize = 20_000;

impl LogWatch {
    /// The process's watch, installed as the global tracing subscriber on first use; `None` if
    /// another subscriber was installed first.
    pub(crate) fn get() -> Option<&'static LogWatch> {
        static WATCH: OnceLock<Option<&'static LogWatch>> = OnceLock::new();
        *WATCH.get_or_init(|| {
            let watch: &'static LogWatch =
                Box::leak(Box::new(LogWatch { texts: Mutex::default(), recent: Mutex::default() }));
            // Everything redrive logs (every crate named redrive*), down to trace; other crates
            // (SDKs, drivers) at info.
            let filter = tracing_subscriber::EnvFilter::new("info,redrive=trace");
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(move || WatchWriter(watch))
                .finish();
            tracing::subscriber::set_global_default(subscriber).ok().map(|()| watch)
        })
    }

    /// Starts looking for `text`; the flag turns true once a log line holds it.
    pub(crate) fn watch(&self, text: &str) -> Arc<AtomicBool> {
        let mut texts = self.texts.lock().unwrap();
        let logged = self.recent.lock().unwrap().iter().any(|line| line.contains(text));
        let seen = Arc::new(AtomicBool::new(logged));
        texts.push((text.to_owned(), Arc::clone(&seen)));
        seen
    }
}

struct WatchWriter(&'static LogWatch);

impl std::io::Write for WatchWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        let texts = self.0.texts.lock().unwrap();
        for (text, seen) in texts.iter() {
            if line.contains(text.as_str()) {
                seen.store(true, Ordering::SeqCst);
            }
        }
        let mut recent = self.0.recent.lock().unwrap();
        if recent.len() == RECENT_LINES {
            recent.pop_front();
        }
        recent.push_back(line.into_owned());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
