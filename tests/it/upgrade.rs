//! Issue 37 item 2: an upgrade on one host without a refused connection. The real binary
//! runs as process A with `listener.handover_socket`; under steady load (new connections
//! per request and keep-alive connections, HTTP/1.1 and HTTP/2) process B starts with
//! `run --take-over`, takes A's listening sockets, and A stops accepting and drains: no
//! connection is refused, no request fails, A exits 0, the stream open on A ends with its
//! `shutting_down` event, and B serves on, upgradable in turn.

use std::io::BufRead;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::support::*;

/// A gateway process, killed when the test ends however it ends.
pub struct Proc(Option<std::process::Child>);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Proc {
    /// `aipgw run --config <config>` (and `extra`), its log lines sent to the returned
    /// channel.
    pub fn start(
        config: &std::path::Path,
        extra: &[&str],
    ) -> (Proc, std::sync::mpsc::Receiver<String>) {
        Proc::start_with(config, extra, &[])
    }

    /// [`Proc::start`] with `env` set.
    pub fn start_with(
        config: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> (Proc, std::sync::mpsc::Receiver<String>) {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_aipgw"));
        cmd.args(["run", "--config", config.to_str().unwrap()])
            .args(extra)
            .envs(env.iter().copied());
        Proc::spawn(&mut cmd)
    }

    /// `cmd` started, its log lines (stderr) sent to the returned channel.
    pub fn spawn(cmd: &mut std::process::Command) -> (Proc, std::sync::mpsc::Receiver<String>) {
        let mut child = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        (Proc(Some(child)), rx)
    }

    pub fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// Waits for the process to exit (60 s at most); its exit code.
    pub async fn exited(mut self) -> Option<i32> {
        let mut child = self.0.take().unwrap();
        let waited = tokio::task::spawn_blocking(move || child.wait().unwrap());
        within(60, waited).await.unwrap().code()
    }
}

/// Waits (30 s at most) for a log line containing `what`; the lines before it.
pub async fn log_line(rx: std::sync::mpsc::Receiver<String>, what: &'static str) -> Vec<String> {
    let waited = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        while let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) {
            if line.contains(what) {
                return Ok(seen);
            }
            seen.push(line);
        }
        Err(seen)
    });
    match waited.await.unwrap() {
        Ok(seen) => seen,
        Err(seen) => panic!(
            "no log line {what:?}; the process said:\n{}",
            seen.join("\n")
        ),
    }
}

pub fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Waits (60 s at most) until the admin listener answers `/readyz` with 200.
pub async fn ready(admin: SocketAddr) {
    within(60, async {
        while !admin_get(admin, "/readyz")
            .await
            .is_some_and(|r| r.starts_with("HTTP/1.1 200"))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// What the load's clients saw.
#[derive(Default)]
struct Seen {
    stop: AtomicBool,
    /// Requests answered 200.
    ok: AtomicU64,
    /// Requests a keep-alive connection closed before sending them, sent again on a new
    /// connection (as every pooled client does: the server never saw them).
    resent: AtomicU64,
    /// Connections refused and requests failed, with what happened.
    failed: Mutex<Vec<String>>,
}

impl Seen {
    fn fail(&self, what: String) {
        self.failed.lock().unwrap().push(what);
    }

    /// Waits (60 s at most) until `n` more requests were answered.
    async fn answered(&self, n: u64) {
        let target = self.ok.load(Ordering::Relaxed) + n;
        within(60, async {
            while self.ok.load(Ordering::Relaxed) < target {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }
}

/// One request body for client `c`'s `n`th request.
fn body(c: usize, n: u64) -> String {
    rpc_start(&format!("{}{n:06}", c + 1), LEADER_A, &format!("t-{c}-{n}"))
}

/// A client opening a new connection per request.
async fn new_connections(leader: Leader, addr: SocketAddr, c: usize, seen: Arc<Seen>) {
    let mut n = 0;
    while !seen.stop.load(Ordering::Relaxed) {
        let mut conn = match KeepAlive::open(&leader, addr).await {
            Ok(k) => k,
            Err(e) => {
                seen.fail(format!("new connection (h2 {}): {e}", leader.h2));
                continue;
            }
        };
        n += 1;
        if !conn.request(&leader, c, n, &seen).await {
            n -= 1;
        }
    }
}

/// An HTTP/1.1 or HTTP/2 connection kept open between requests.
enum KeepAlive {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl KeepAlive {
    async fn open(leader: &Leader, addr: SocketAddr) -> Result<KeepAlive, String> {
        let tls = leader
            .connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let io = TokioIo::new(tls);
        if leader.h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| format!("h2 handshake: {e}"))?;
            tokio::spawn(conn);
            Ok(KeepAlive::H2(send))
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("h1 handshake: {e}"))?;
            tokio::spawn(conn);
            Ok(KeepAlive::H1(send))
        }
    }

    /// Sends `req`: `Err(Some(req))` if the connection closed before it was sent.
    async fn send(
        &mut self,
        req: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, Option<String>> {
        let sent = match self {
            KeepAlive::H1(s) => match s.ready().await {
                Ok(()) => s.try_send_request(req).await,
                Err(_) => return Err(None),
            },
            KeepAlive::H2(s) => match s.ready().await {
                Ok(()) => s.try_send_request(req).await,
                Err(_) => return Err(None),
            },
        };
        sent.map_err(|mut e| match e.take_message() {
            Some(_) => None,
            None => Some(e.into_error().to_string()),
        })
    }
}

/// A client sending its requests one after another on a kept-alive connection, opening a
/// new one when the gateway closes it.
async fn keep_alive(leader: Leader, addr: SocketAddr, c: usize, seen: Arc<Seen>) {
    let mut conn: Option<KeepAlive> = None;
    let mut n = 0;
    while !seen.stop.load(Ordering::Relaxed) {
        let Some(open) = conn.as_mut() else {
            match KeepAlive::open(&leader, addr).await {
                Ok(k) => conn = Some(k),
                Err(e) => seen.fail(format!("keep-alive (h2 {}): {e}", leader.h2)),
            }
            continue;
        };
        n += 1;
        if !open.request(&leader, c, n, &seen).await {
            conn = None;
            n -= 1;
        }
    }
}

impl KeepAlive {
    /// Sends client `c`'s `n`th request and counts what came of it; false if the
    /// connection is closed (the request was not sent, or it failed).
    async fn request(&mut self, leader: &Leader, c: usize, n: u64, seen: &Seen) -> bool {
        let uri = if leader.h2 {
            "https://localhost/p/rpc"
        } else {
            "/p/rpc"
        };
        let req = http::Request::post(uri)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body(c, n))))
            .unwrap();
        let h2 = leader.h2;
        match self.send(req).await {
            Ok(resp) => {
                let status = resp.status();
                match resp.into_body().collect().await {
                    Ok(_) if status == 200 => {
                        seen.ok.fetch_add(1, Ordering::Relaxed);
                        return true;
                    }
                    Ok(_) => seen.fail(format!("h2 {h2}: {status}")),
                    Err(e) => seen.fail(format!("h2 {h2}: body: {e}")),
                }
            }
            // Closed before it was sent (an HTTP/2 GOAWAY, an HTTP/1.1 connection closed
            // between requests): the server never saw it, and it is sent again.
            Err(None) => {
                seen.resent.fetch_add(1, Ordering::Relaxed);
            }
            Err(Some(e)) => seen.fail(format!("h2 {h2}: {e}")),
        }
        false
    }
}

fn config(pki: &Pki, addr: SocketAddr, admin: SocketAddr, partner: &str, sse: &str) -> String {
    let socket = pki.dir.path().join("aipgw.sock");
    let listener = format!(
        "drain_timeout = \"1s\"\nhandover_socket = \"{}\"\nhandover_timeout = \"30s\"\n",
        socket.display()
    );
    let rest = format!(
        "[admin]\nbind = \"{admin}\"\n[reload]\nwatch = false\n\
         [log]\nlevel = \"info,aipgw::access=warn\"\n{}{}",
        partner_block("p", "/p", partner, ""),
        partner_block("s", "/s", sse, "")
    );
    pki.config(&listener, &rest)
        .replace("bind = \"127.0.0.1:0\"", &format!("bind = \"{addr}\""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_process_takes_the_sockets_over_without_a_refused_connection() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let sse = SsePartner::start(Restream::Error).await;
    let (addr, admin) = (free_port(), free_port());
    let text = config(&pki, addr, admin, &partner.url(), &sse.url());
    let config = pki.write("gateway.toml", &text);
    let (a, _a_log) = Proc::start(&config, &[]);
    ready(admin).await;

    // A stream open on A, its first event delivered.
    let h2 = pki.leader(LEADER_A, true);
    let body = stream_body("\"st\"", LEADER_A, "streamed", "start", None);
    let mut stream = h2.open_stream(addr, "/s/stream", &body, &[]).await;
    assert_eq!(stream.status, 200);
    let feed = sse.feed("streamed").await;
    feed_events(&feed, 1..=1, None).await;
    assert_eq!(
        within(10, stream.next_event()).await.unwrap().seq(),
        Some(1)
    );

    // Steady load: new connections per request and kept-alive ones, both protocols.
    let seen = Arc::new(Seen::default());
    let mut clients = Vec::new();
    for (c, h2) in [false, true, false, true, false, true]
        .into_iter()
        .enumerate()
    {
        let (leader, seen) = (pki.leader(LEADER_A, h2), seen.clone());
        clients.push(if c < 2 {
            tokio::spawn(new_connections(leader, addr, c, seen))
        } else {
            tokio::spawn(keep_alive(leader, addr, c, seen))
        });
    }
    seen.answered(200).await;

    // B takes the sockets over; A stops accepting, drains and exits 0.
    let (b, b_log) = Proc::start(&config, &["--take-over"]);
    let said = log_line(b_log, "took the listening sockets over").await;
    assert!(!said.iter().any(|l| l.contains("WARN")), "{said:?}");
    assert_eq!(a.exited().await, Some(0), "A's exit");
    // The stream open on A ended as at a drain.
    let last = within(10, stream.next_event()).await.expect("final event");
    assert_eq!(last.json["error"]["data"]["reason"], "shutting_down");
    assert_eq!(last.json["error"]["data"]["lastEventSeq"], 1);
    assert!(within(10, stream.next_event()).await.is_none());

    // B serves on: ready, and the load goes on through it alone.
    ready(admin).await;
    seen.answered(200).await;
    seen.stop.store(true, Ordering::Relaxed);
    for c in clients {
        within(30, c).await.unwrap();
    }
    let failed = seen.failed.lock().unwrap().clone();
    eprintln!(
        "through the take-over: {} answered, {} resent, {} failed",
        seen.ok.load(Ordering::Relaxed),
        seen.resent.load(Ordering::Relaxed),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} refused connections or failed requests (of {} answered, {} resent): {:?}",
        failed.len(),
        seen.ok.load(Ordering::Relaxed),
        seen.resent.load(Ordering::Relaxed),
        &failed[..failed.len().min(10)]
    );
    let m = parse_metrics(&admin_get(admin, "/metrics").await.unwrap_or_default());
    let served: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("aipgw_requests_total"))
        .map(|(_, v)| v)
        .sum();
    assert!(served > 0.0, "B answered nothing itself");
    // B stops on SIGTERM as any gateway does.
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &b.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert_eq!(b.exited().await, Some(0), "B's exit");
    drop(feed);
}
