//! A connection string's password never in an error or a log line: connecting to a closed port,
//! to a database that does not exist, with a URL that does not parse and with an unknown option,
//! with everything logged down to trace.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use redrive_postgres::{PgBackend, PgConfig};

const PASSWORD: &str = "pw-canary-5f0e1d";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_in_a_connection_error_or_a_log_line() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let url = common::database_url();
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, r)| r).split(['/', '?']).next().unwrap().to_owned();
    let cases = [
        ("a closed port", format!("{scheme}://postgres:{PASSWORD}@127.0.0.1:1/test")),
        ("no such database", format!("{scheme}://postgres:{PASSWORD}@{host}/rdt_no_such_database")),
        ("a port that does not parse", format!("{scheme}://postgres:{PASSWORD}@127.0.0.1:port/test")),
        ("an unknown sslmode", format!("{scheme}://postgres:{PASSWORD}@{host}/test?sslmode=sometimes")),
    ];
    for (case, url) in cases {
        let config = PgConfig::new(url);
        assert!(!format!("{config:?}").contains(PASSWORD), "{case}: the config's Debug shows the password");
        let e = PgBackend::connect(config).await.err().unwrap_or_else(|| panic!("{case}: the connection should fail"));
        assert!(!e.to_string().contains(PASSWORD), "{case}: the error quotes the password: {e}");
        assert!(!format!("{e:?}").contains(PASSWORD), "{case}: the error's Debug shows the password");
    }
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(!logs.contains(PASSWORD), "the password was written to the log");
}
