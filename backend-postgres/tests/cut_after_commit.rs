//! A connection cut after the database committed and before the client heard: the worker's
//! settlement has happened, but its call fails. A TCP proxy between the worker and PostgreSQL
//! reads the client's messages and, once the chosen statement has been sent, drops the
//! server's answer (written after the commit) and closes both sides.

mod common;

use common::{Charge, charge, wait_for};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_core::alert::BoxFuture;
use redrive_core::{Alert, AlertSink, DeadLetter, Enqueue, JobContext, JobError, Worker, WorkerConfig};
use redrive_postgres::{PgBackend, PgConfig};
use sqlx::Row;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The proxy: connections to `upstream`; the first statement whose text holds `marker`, once
/// executed (bound after being prepared, or sent as a simple query), has its answer dropped and
/// its connection closed. Later connections pass untouched.
struct CutProxy {
    port: u16,
    cuts: Arc<AtomicU32>,
}

impl CutProxy {
    async fn start(upstream: String, marker: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cuts = Arc::new(AtomicU32::new(0));
        let armed = Arc::new(AtomicBool::new(true));
        let counted = Arc::clone(&cuts);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(&upstream).await.unwrap();
                tokio::spawn(pipe(client, server, marker, Arc::clone(&armed), Arc::clone(&counted)));
            }
        });
        Self { port, cuts }
    }
}

/// Forwards one connection both ways, watching the client's messages for the marked statement.
async fn pipe(client: TcpStream, server: TcpStream, marker: &str, armed: Arc<AtomicBool>, cuts: Arc<AtomicU32>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set once the marked statement has gone to the server: its answer is not passed on.
    let sent = Arc::new(AtomicBool::new(false));
    let upward = {
        let sent = Arc::clone(&sent);
        async move {
            let mut frames = Frames::default();
            let mut buf = vec![0; 64 * 1024];
            loop {
                let n = match client_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if frames.feed(&buf[..n], marker) && armed.swap(false, Ordering::SeqCst) {
                    sent.store(true, Ordering::SeqCst);
                }
                if server_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let downward = async move {
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if sent.load(Ordering::SeqCst) {
                // The server has answered: it committed. The client never hears.
                cuts.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever side ends, both halves drop: the connection is closed.
    tokio::select! {
        () = upward => {}
        () = downward => {}
    }
}

/// The client's side of the PostgreSQL protocol, as far as the proxy needs it: the startup
/// messages (untyped), then typed messages; the statements prepared with the marker.
#[derive(Default)]
struct Frames {
    pending: Vec<u8>,
    started: bool,
    marked: Vec<Vec<u8>>,
}

impl Frames {
    /// Takes more of the client's bytes; whether they execute the marked statement.
    fn feed(&mut self, bytes: &[u8], marker: &str) -> bool {
        self.pending.extend_from_slice(bytes);
        let mut executes = false;
        loop {
            let (kind, header) = if self.started { (self.pending.first().copied(), 1) } else { (None, 0) };
            let Some(len) = self.pending.get(header..header + 4) else { break };
            let len = u32::from_be_bytes(len.try_into().unwrap()) as usize;
            if self.pending.len() < header + len {
                break;
            }
            let body: Vec<u8> = self.pending.drain(..header + len).skip(header + 4).collect();
            match kind {
                // SSL or GSS encryption requests come before the startup message.
                None => self.started = !matches!(body.get(..4), Some([0x04, 0xd2, 0x16, 0x2f | 0x30])),
                Some(b'P') => {
                    let mut parts = body.split(|b| *b == 0);
                    let (name, text) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
                    if String::from_utf8_lossy(text).contains(marker) {
                        self.marked.push(name.to_vec());
                    }
                }
                Some(b'B') => {
                    let statement = body.split(|b| *b == 0).nth(1).unwrap_or_default();
                    executes |= self.marked.iter().any(|m| m == statement);
                }
                Some(b'Q') => executes |= String::from_utf8_lossy(&body).contains(marker),
                _ => {}
            }
        }
        executes
    }
}

/// `DATABASE_URL` with its host and port replaced by the proxy's, in plain text (the proxy
/// reads the messages).
fn through(port: u16) -> String {
    let url = common::database_url();
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth, rest) = rest.rsplit_once('@').map_or(("", rest), |(a, r)| (a, r));
    let path = rest.split_once('/').map_or("", |(_, p)| p);
    let at = if auth.is_empty() { String::new() } else { format!("{auth}@") };
    let plain = if path.contains('?') { "&sslmode=disable" } else { "?sslmode=disable" };
    format!("{scheme}://{at}127.0.0.1:{port}/{path}{plain}")
}

fn upstream() -> String {
    let url = common::database_url();
    let rest = url.split_once("://").unwrap().1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let host = rest.split(['/', '?']).next().unwrap();
    if host.contains(':') { host.to_owned() } else { format!("{host}:5432") }
}

/// The job's status, read past the proxy.
async fn status(probe: &PgBackend) -> String {
    let sql = format!("SELECT status FROM \"{}\".jobs", probe.schema());
    sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(probe.pool()).await.unwrap().get(0)
}

#[derive(Clone, Default)]
struct Pager(Arc<Mutex<Vec<Alert>>>);

impl AlertSink for Pager {
    fn send<'a>(&'a self, alert: &'a Alert) -> BoxFuture<'a, redrive_core::Result<()>> {
        self.0.lock().unwrap().push(alert.clone());
        Box::pin(async { Ok(()) })
    }
}

/// A worker on `schema` through the proxy, its handler counting starts and effects by order;
/// orders in `failing` fail for good.
fn worker(
    backend: &PgBackend,
    starts: &Arc<Mutex<HashMap<u32, u32>>>,
    failing: bool,
    pager: &Pager,
) -> redrive_core::RunningWorker {
    let config = WorkerConfig {
        lease: Duration::from_secs(2),
        heartbeat: Some(Duration::from_millis(600)),
        alert_sweep: Duration::from_millis(500),
        ..WorkerConfig::default()
    };
    let starts = Arc::clone(starts);
    Worker::builder(backend.clone(), backend.clone())
        .config(config)
        .alert(pager.clone())
        .handle::<Charge>(move |job: Charge, _ctx: JobContext| {
            *starts.lock().unwrap().entry(job.order).or_default() += 1;
            async move { if failing { Err(JobError::permanent("card declined")) } else { Ok::<_, JobError>(()) } }
        })
        .build()
        .start()
}

async fn proxied(probe: &PgBackend, proxy: &CutProxy) -> PgBackend {
    let config = PgConfig::new(through(proxy.port))
        .with_schema(probe.schema())
        .with_max_connections(3)
        .with_sweep_every(Duration::from_millis(200))
        .with_poll(Duration::from_millis(200));
    PgBackend::connect(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_answer_is_cut_after_the_commit_leaves_the_job_done_once() {
    let probe = common::backend("cutdone").await;
    let proxy = CutProxy::start(upstream(), "SET status = 'done'").await;
    let backend = proxied(&probe, &proxy).await;
    probe.enqueue(charge(1)).await.unwrap();
    let (starts, pager) = (Arc::default(), Pager::default());
    let worker = worker(&backend, &starts, false, &pager);
    wait_for("the completion's answer to be cut", 30, async || proxy.cuts.load(Ordering::SeqCst) == 1).await;
    wait_for("the job to be done", 30, async || status(&probe).await == "done").await;
    // Past a lease and a sweep: a completion taken for lost would have the job run again now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    worker.shutdown().await;
    assert_eq!(status(&probe).await, "done");
    assert_eq!(starts.lock().unwrap().get(&1), Some(&1), "the handler ran once");
    assert_eq!(probe.count_open().await.unwrap(), 0, "no failure record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_record_whose_answer_is_cut_after_the_commit_is_kept_once_with_one_alert() {
    let probe = common::backend("cutrecord").await;
    let proxy = CutProxy::start(upstream(), "SET status = 'failed'").await;
    let backend = proxied(&probe, &proxy).await;
    probe.enqueue(charge(2)).await.unwrap();
    let (starts, pager) = (Arc::default(), Pager::default());
    let worker = worker(&backend, &starts, true, &pager);
    wait_for("the record's answer to be cut", 30, async || proxy.cuts.load(Ordering::SeqCst) == 1).await;
    wait_for("the alert", 30, async || !pager.0.lock().unwrap().is_empty()).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    worker.shutdown().await;
    assert_eq!(status(&probe).await, "failed");
    assert_eq!(starts.lock().unwrap().get(&2), Some(&1), "a permanent failure runs once");
    assert_eq!(probe.count_open().await.unwrap(), 1, "one failure record");
    assert_eq!(pager.0.lock().unwrap().len(), 1, "one alert");
}
