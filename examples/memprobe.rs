//! Memory probe: N concurrent `stream` requests through a gateway process, printing its
//! RSS per open stream and per buffered event at each step (issue 13).
//!
//! ```sh
//! cargo build --release && cargo run --release --example memprobe -- \
//!     --streams 10000 --connections 50 --interval 5s --hold 300s
//! ```
//!
//! It starts, on loopback: a Partner (in this process) that answers every `stream` with an
//! SSE stream of ~150-byte events, one per `--interval`; the gateway (`--gateway`, a
//! separate process, so its RSS is its own) with fresh certificates and the default replay
//! bounds; and the Leaders (in this process): `--connections` HTTP/2 connections carrying
//! `--streams` streams in all. Phases: idle, opened, the hold (a sample every
//! `--sample`), the end (each Partner stream sends a terminal event), and after
//! `replay.retention` (`--retention`) plus a sweep. Every event is counted at the Leaders.
#![allow(missing_docs)]
#![expect(
    clippy::disallowed_methods,
    reason = "a measurement program: wall-clock timings of a whole run"
)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aipgw::devcerts::{CertSpec, DevCa, DEV_LEADER_V2_AIC};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

#[derive(Parser)]
struct Args {
    /// Streams in all.
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    /// HTTP/2 connections they are spread over.
    #[arg(long, default_value_t = 10)]
    connections: usize,
    /// One event per stream this often.
    #[arg(long, default_value = "5s", value_parser = humantime_serde::re::humantime::parse_duration)]
    interval: Duration,
    /// How long the streams stay open.
    #[arg(long, default_value = "60s", value_parser = humantime_serde::re::humantime::parse_duration)]
    hold: Duration,
    /// A sample this often during the hold.
    #[arg(long, default_value = "15s", value_parser = humantime_serde::re::humantime::parse_duration)]
    sample: Duration,
    /// `replay.retention` for the gateway.
    #[arg(long, default_value = "20s", value_parser = humantime_serde::re::humantime::parse_duration)]
    retention: Duration,
    /// The gateway binary.
    #[arg(long, default_value = "target/release/aipgw")]
    gateway: PathBuf,
    /// `policy.tasks.ttl` for the gateway (how long a task's owner is remembered).
    #[arg(long, default_value = "24h")]
    tasks_ttl: String,
    /// The gateway speaks HTTP/2 to the Partner (`[[partner]] http2 = true`).
    #[arg(long)]
    partner_http2: bool,
    /// `upstream.pool_max_idle_per_host` for the gateway (idle Partner connections kept
    /// per worker).
    #[arg(long, default_value_t = 64)]
    pool_max_idle: usize,
}

/// Event padding: each event is about this long (at least its fields: ~165 bytes).
const EVENT_BYTES: usize = 150;

fn event(id: &str, task: &str, seq: u64, state: &str) -> Bytes {
    let head = format!(
        "data: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"eventSeq\":{seq},\"eventData\":{{\"type\":\"status-update\",\"taskId\":\"{task}\",\"status\":{{\"state\":\"{state}\"}}"
    );
    let pad = EVENT_BYTES.saturating_sub(head.len() + 16);
    Bytes::from(format!("{head},\"p\":\"{}\"}}}}}}\n\n", "x".repeat(pad)))
}

/// The Partner: every request gets an event stream until `ending` is set, then a
/// terminal event.
async fn partner(listener: TcpListener, interval: Duration, ending: Arc<AtomicBool>, h2: bool) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let ending = ending.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let ending = ending.clone();
                async move {
                    let body = req.into_body().collect().await.map(|b| b.to_bytes());
                    let v: serde_json::Value = body
                        .ok()
                        .and_then(|b| serde_json::from_slice(&b).ok())
                        .unwrap_or_default();
                    let id = v["id"].to_string();
                    let task = v["params"]["message"]["taskId"]
                        .as_str()
                        .unwrap_or("t")
                        .to_owned();
                    let (tx, rx) =
                        tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
                    tokio::spawn(async move {
                        let mut tick = tokio::time::interval(interval);
                        for seq in 1.. {
                            tick.tick().await;
                            let done = ending.load(Ordering::Relaxed);
                            let state = if done { "completed" } else { "working" };
                            if tx
                                .send(Ok(Frame::data(event(&id, &task, seq, state))))
                                .await
                                .is_err()
                                || done
                            {
                                return;
                            }
                        }
                    });
                    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
                        rx.recv().await.map(|f| (f, rx))
                    });
                    let body = StreamBody::new(frames);
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "text/event-stream")
                            .body(body)
                            .unwrap(),
                    )
                }
            });
            if h2 {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(None)
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            } else {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            }
        });
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The gateway's `/metrics` text.
async fn metrics_text(admin: SocketAddr) -> String {
    let mut text = String::new();
    if let Ok(mut tcp) = TcpStream::connect(admin).await {
        let _ = tcp
            .write_all(b"GET /metrics HTTP/1.0\r\nhost: localhost\r\n\r\n")
            .await;
        let _ = tcp.read_to_string(&mut text).await;
    }
    text
}

/// `name` from the gateway's `/metrics`.
async fn metric(admin: SocketAddr, name: &str) -> f64 {
    metrics_text(admin)
        .await
        .lines()
        .find_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k == name).then(|| v.parse().ok()).flatten()
        })
        .unwrap_or(f64::NAN)
}

/// What the allocator holds live against what it keeps resident (jemalloc builds; empty
/// otherwise).
async fn heap(admin: SocketAddr) -> String {
    let mut out = String::new();
    for line in metrics_text(admin).await.lines() {
        if let Some(rest) = line.strip_prefix("aipgw_allocator_bytes{kind=\"") {
            if let Some((kind, v)) = rest.split_once("\"} ") {
                let mib = v.parse::<f64>().unwrap_or(f64::NAN) / 1048576.0;
                out.push_str(&format!("{kind} {mib:.1} MiB  "));
            }
        }
    }
    out
}

struct Probe {
    pid: u32,
    admin: SocketAddr,
    received: Arc<AtomicU64>,
    /// Bytes of the events counted in `received`.
    received_bytes: Arc<AtomicU64>,
    started: Instant,
}

impl Probe {
    async fn report(&self, phase: &str, base_kib: u64, open: usize) {
        let rss = rss_kib(self.pid);
        let buffered = metric(self.admin, "aipgw_replay_buffer_events").await;
        let counted = metric(self.admin, "aipgw_replay_buffer_bytes").await;
        let per_stream = if open > 0 {
            format!("{:.1}", rss.saturating_sub(base_kib) as f64 / open as f64)
        } else {
            "-".into()
        };
        println!(
            "{:>6.0}s {phase:<10} rss {:>8.1} MiB  per stream {per_stream:>6} KiB  events received {:>9}  buffered {:>9}  replay_buffer_bytes {:>8.1} MiB",
            self.started.elapsed().as_secs_f64(),
            rss as f64 / 1024.0,
            self.received.load(Ordering::Relaxed),
            buffered,
            counted / 1048576.0
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let ca = DevCa::new("memprobe CA")?;
    let server = ca.issue(&CertSpec::server(&["localhost", "127.0.0.1"]))?;
    let leader = ca.issue(&CertSpec::leader_v2(DEV_LEADER_V2_AIC))?;
    let path = |n: &str| dir.path().join(n);
    std::fs::write(path("ca.pem"), ca.cert_pem())?;
    std::fs::write(path("gw.pem"), &server.cert_pem)?;
    std::fs::write(path("gw.key"), &server.key_pem)?;

    let ending = Arc::new(AtomicBool::new(false));
    let partner_listener = TcpListener::bind("127.0.0.1:0").await?;
    let partner_addr = partner_listener.local_addr()?;
    tokio::spawn(partner(
        partner_listener,
        args.interval,
        ending.clone(),
        args.partner_http2,
    ));

    let (port, admin_port) = (free_port(), free_port());
    let per_conn = args.streams.div_ceil(args.connections.max(1));
    let config = format!(
        r#"[listener]
bind = "127.0.0.1:{port}"
cert = "{d}/gw.pem"
key = "{d}/gw.key"
client_ca = ["{d}/ca.pem"]
max_connections = 1000
max_connections_per_ip = 1000
http2_max_concurrent_streams = {per_conn}
idle_timeout = "10m"
[replay]
retention = "{retention}s"
sweep_interval = "2s"
[log]
level = "warn"
[policy.tasks]
ttl = "{tasks_ttl}"
[upstream]
pool_max_idle_per_host = {pool_max_idle}
[admin]
bind = "127.0.0.1:{admin_port}"
[[partner]]
name = "p"
prefix = "/p"
upstreams = ["http://{partner_addr}"]
http2 = {h2}
"#,
        d = dir.path().display(),
        retention = args.retention.as_secs(),
        h2 = args.partner_http2,
        tasks_ttl = args.tasks_ttl,
        pool_max_idle = args.pool_max_idle,
    );
    std::fs::write(path("aipgw.toml"), config)?;
    let mut gw = std::process::Command::new(&args.gateway)
        .args(["run", "--config"])
        .arg(path("aipgw.toml"))
        .spawn()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(admin).await.is_err() {
        anyhow::ensure!(Instant::now() < deadline, "the gateway did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let probe = Probe {
        pid: gw.id(),
        admin,
        received: Arc::new(AtomicU64::new(0)),
        received_bytes: Arc::new(AtomicU64::new(0)),
        started: Instant::now(),
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss_kib(probe.pid);
    let idle_heap = heap(admin).await;
    probe.report("idle", idle, 0).await;

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der())?;
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_root_certificates(roots)
    .with_client_auth_cert(vec![leader.cert_der.clone()], leader.key_der())?;
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let connector = TlsConnector::from(Arc::new(tls));

    let done = Arc::new(AtomicU64::new(0));
    let mut opened = 0usize;
    let mut readers = Vec::new();
    for c in 0..args.connections {
        let tcp = TcpStream::connect(addr).await?;
        let stream = connector
            .connect(rustls::pki_types::ServerName::try_from("localhost")?, tcp)
            .await?;
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        tokio::spawn(conn);
        for s in 0..per_conn.min(args.streams - opened) {
            let task = format!("task-{c}-{s}");
            let body = format!(
                r#"{{"jsonrpc":"2.0","method":"stream","id":"{task}","params":{{"message":{{"type":"message","id":"m","senderRole":"leader","senderId":"{DEV_LEADER_V2_AIC}","command":"start","taskId":"{task}","sessionId":"s"}}}}}}"#
            );
            let req = Request::post("https://localhost/p/stream")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))?;
            let mut send = send.clone();
            let (received, done) = (probe.received.clone(), done.clone());
            let received_bytes = probe.received_bytes.clone();
            readers.push(tokio::spawn(async move {
                let Ok(resp) = send.send_request(req).await else {
                    return;
                };
                let mut body = resp.into_body();
                while let Some(Ok(frame)) = body.frame().await {
                    if let Ok(data) = frame.into_data() {
                        let n = data.windows(2).filter(|w| w == b"\n\n").count();
                        received.fetch_add(n as u64, Ordering::Relaxed);
                        received_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            }));
            opened += 1;
        }
    }
    // Every stream has its first event once each has been asked for and an interval passed.
    tokio::time::sleep(args.interval + Duration::from_secs(1)).await;
    let open_kib = rss_kib(probe.pid);
    let open_buffered = metric(admin, "aipgw_replay_buffer_events").await;
    println!("        allocator idle: {idle_heap}");
    probe.report("opened", idle, opened).await;
    let hold_end = Instant::now() + args.hold;
    while Instant::now() < hold_end {
        tokio::time::sleep(args.sample.min(hold_end - Instant::now())).await;
        probe.report("hold", idle, opened).await;
    }
    // The events buffered during the hold, against the RSS grown meanwhile.
    let buffered = metric(admin, "aipgw_replay_buffer_events").await - open_buffered;
    let grown = rss_kib(probe.pid).saturating_sub(open_kib);
    let event_bytes = probe.received_bytes.load(Ordering::Relaxed) as f64
        / probe.received.load(Ordering::Relaxed).max(1) as f64;
    println!(
        "growth during the hold: {:.0} B per buffered event of {event_bytes:.0} B ({} KiB over {buffered} events)",
        grown as f64 * 1024.0 / buffered,
        grown
    );
    ending.store(true, Ordering::Relaxed);
    for r in readers {
        let _ = r.await;
    }
    probe.report("ended", idle, 0).await;
    for line in metrics_text(admin).await.lines() {
        if line.starts_with("aipgw_streams_ended_total")
            || line.starts_with("aipgw_upstream_errors_total")
        {
            println!("        {line}");
        }
    }
    tokio::time::sleep(args.retention + Duration::from_secs(5)).await;
    probe.report("retained", idle, 0).await;
    // Allocators give memory back on their own schedule (jemalloc's decay is 10 s).
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        probe.report("later", idle, 0).await;
    }
    println!("        allocator after retention: {}", heap(admin).await);
    let after = rss_kib(probe.pid);
    println!(
        "after retention: {:.1} MiB, {:.2}x the idle {:.1} MiB; streams done {}/{}",
        after as f64 / 1024.0,
        after as f64 / idle.max(1) as f64,
        idle as f64 / 1024.0,
        done.load(Ordering::Relaxed),
        opened
    );
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(gw.id().to_string())
        .status();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let _ = gw.kill();
    let _ = gw.wait();
    Ok(())
}
