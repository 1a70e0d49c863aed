//! Issue 38: a config snapshot lives as long as something uses it, and no longer. The
//! real binary (jemalloc, its own figures on `/metrics`) fronting a fleet of Partners on
//! one origin is reloaded 20 times while keep-alive connections (HTTP/1.1 and HTTP/2),
//! each accepted under another snapshot, stay open and keep sending requests; once the
//! Partner connections have been idle past `upstream.pool_idle_timeout`, its allocated
//! memory and open files are back within 10% of what one snapshot cost, and no request
//! got anything but its answer.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use super::support::*;

/// Partners in the config: enough that a snapshot kept is plain in the allocated bytes.
const PARTNERS: usize = 1000;
/// Keep-alive connections held open throughout, every other one HTTP/2.
const HELD: usize = 20;
const RELOADS: usize = 20;

/// The gateway process, killed when the test ends however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The descriptors `pid` has open.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The gateway's metrics, by `name{labels}`.
async fn metrics(admin: SocketAddr) -> std::collections::HashMap<String, f64> {
    parse_metrics(&admin_get(admin, "/metrics").await.unwrap_or_default())
}

/// What the gateway holds: jemalloc's allocated bytes and its open descriptors.
async fn held(admin: SocketAddr, pid: u32) -> (f64, usize) {
    let m = metrics(admin).await;
    let allocated = m["aipgw_allocator_bytes{kind=\"allocated\"}"];
    (allocated, open_files(pid))
}

/// Idle Partner connections the gateway keeps (every Partner's figure).
async fn idle_partner_connections(admin: SocketAddr) -> f64 {
    metrics(admin)
        .await
        .iter()
        .filter(|(k, _)| k.starts_with("aipgw_upstream_idle_connections"))
        .map(|(_, v)| v)
        .sum()
}

/// Polls `what` until it is true; panics with `describe` after `secs`.
async fn until<F: std::future::Future<Output = bool>>(
    secs: u64,
    describe: &str,
    what: impl Fn() -> F,
) {
    let waited = tokio::time::timeout(Duration::from_secs(secs), async {
        while !what().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {describe}");
}

/// A keep-alive connection to the gateway.
enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(H2),
}

impl Conn {
    async fn open(leader: &Leader, addr: SocketAddr) -> Conn {
        if leader.h2 {
            return Conn::H2(leader.h2_connection(addr).await.0);
        }
        let tls = leader.connect(addr).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        Conn::H1(send)
    }

    /// POSTs a `start` to Partner `n`; the status and body.
    async fn start(&mut self, n: usize, id: usize) -> (u16, String) {
        let body = rpc_start(&id.to_string(), LEADER_A, &format!("t-{id}"));
        let path = format!("/p{n}/rpc");
        let reply = match self {
            Conn::H2(send) => send_on(send, &path, &body).await,
            Conn::H1(send) => {
                send.ready().await.unwrap();
                let req = http::Request::post(path)
                    .header("host", "localhost")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .unwrap();
                let resp = send.send_request(req).await.unwrap();
                let (parts, body) = resp.into_parts();
                Reply {
                    status: parts.status,
                    headers: parts.headers,
                    body: body.collect().await.unwrap().to_bytes(),
                }
            }
        };
        (reply.status.as_u16(), reply.text())
    }
}

fn fleet_config(pki: &Pki, addr: SocketAddr, admin: SocketAddr, partner: &str) -> String {
    let mut fleet = format!(
        "pool_idle_timeout = \"1s\"\npool_max_idle_per_host = 2\n\
         [admin]\nbind = \"{admin}\"\n\
         [runtime]\nworker_threads = 1\ncache_flush_interval = \"50ms\"\n\
         [replay]\nsweep_interval = \"50ms\"\n\
         [reload]\nwatch = false\n\
         [log]\nlevel = \"warn\"\n"
    );
    for n in 0..PARTNERS {
        fleet.push_str(&partner_block(
            &format!("p{n}"),
            &format!("/p{n}"),
            partner,
            "",
        ));
    }
    pki.config("max_connections = 100", &fleet)
        .replace("bind = \"127.0.0.1:0\"", &format!("bind = \"{addr}\""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_with_held_connections_give_back_memory_and_files() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let (addr, admin) = (free_port(), free_port());
    let config = pki.write(
        "fleet.toml",
        &fleet_config(&pki, addr, admin, &partner.url()),
    );
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_aipgw"))
        .args(["run", "--config", config.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let gateway = Child(child);
    let pid = gateway.0.id();
    until(60, "the gateway to be ready", || async {
        admin_get(admin, "/readyz")
            .await
            .is_some_and(|r| r.starts_with("HTTP/1.1 200"))
    })
    .await;
    let leaders = [pki.leader(LEADER_A, false), pki.leader(LEADER_A, true)];

    // One snapshot: the held connections open and answered, the Partner connections they
    // used idle past their timeout and closed.
    let mut conns = Vec::with_capacity(HELD);
    for i in 0..HELD {
        conns.push(Conn::open(&leaders[i % 2], addr).await);
    }
    let mut sent = 0;
    for (i, c) in conns.iter_mut().enumerate() {
        sent += 1;
        let (status, text) = c.start(i * 37 % PARTNERS, sent).await;
        assert_eq!(status, 200, "{text}");
    }
    until(30, "the Partner connections to be swept", || async {
        idle_partner_connections(admin).await == 0.0
    })
    .await;
    let (base_bytes, base_files) = held(admin, pid).await;

    // Each reload: a new connection replaces one held since an earlier snapshot, and
    // every held connection sends a request under the new one.
    for r in 1..=RELOADS {
        let hup = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(hup.success());
        until(30, "the reload", || async {
            metrics(admin)
                .await
                .get("aipgw_config_reloads_total{result=\"ok\"}")
                .is_some_and(|n| *n as usize >= r)
        })
        .await;
        conns[r % HELD] = Conn::open(&leaders[r % 2], addr).await;
        for (i, c) in conns.iter_mut().enumerate() {
            sent += 1;
            let (status, text) = c.start((r * HELD + i) * 37 % PARTNERS, sent).await;
            assert_eq!(status, 200, "reload {r}, connection {i}: {text}");
        }
    }

    // Once the Partner connections are past their idle timeout, what is held is what one
    // snapshot held.
    let back = |(bytes, files): (f64, usize)| {
        bytes <= base_bytes * 1.1 && files as f64 <= base_files as f64 * 1.1
    };
    let settled = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let now = held(admin, pid).await;
            if idle_partner_connections(admin).await == 0.0 && back(now) {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let now = held(admin, pid).await;
    assert!(
        settled.is_ok(),
        "after {RELOADS} reloads with {HELD} connections held: {:.1} MB allocated and {} \
         files open, against {:.1} MB and {} with one snapshot",
        now.0 / 1e6,
        now.1,
        base_bytes / 1e6,
        base_files
    );
    eprintln!(
        "one snapshot: {:.1} MB, {base_files} files; after {RELOADS} reloads: {:.1} MB, {} files",
        base_bytes / 1e6,
        now.0 / 1e6,
        now.1
    );
    assert_eq!(
        partner.seen().len(),
        sent,
        "every request reached the Partner"
    );
}

/// A Partner over raw HTTP/1.1 that answers every request with `{}` on a kept-alive
/// connection and counts the connections it accepted.
async fn counting_partner() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut tcp, _) = listener.accept().await.unwrap();
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                loop {
                    read_http1_message(&mut tcp).await;
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 36\r\n\r\n{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}";
                    if tcp.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, accepted)
}

/// Issue 38: Partners that share an origin share its pool: one after another, requests
/// to 50 Partners on one origin take one Partner connection, not 50.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partners_on_one_origin_share_one_connection() {
    let pki = Pki::new();
    let (url, accepted) = counting_partner().await;
    let partners: String = (0..50)
        .map(|n| partner_block(&format!("p{n}"), &format!("/p{n}"), &url, ""))
        .collect();
    let gw = start_gateway(&pki.config("", &partners)).await;
    let leader = pki.leader(LEADER_A, true);
    let (mut conn, _) = leader.h2_connection(gw.addr).await;
    for n in 0..50 {
        let body = rpc_start(&n.to_string(), LEADER_A, &format!("t-{n}"));
        let reply = send_on(&mut conn, &format!("/p{n}/rpc"), &body).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// The hard open-file limit of this process (what the gateway's check raises the soft
/// limit to).
fn hard_nofile() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(4).unwrap().parse().unwrap()
}

/// Issue 38: a reload runs the open-file check `check` and `run` make; a config over the
/// limit is refused (counted as `over_budget`) and the old one keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_over_the_open_file_limit_is_refused_and_the_old_config_serves() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let old = pki.config("", &partner_block("old", "/old", &partner.url(), ""));
    let path = pki.write("aipgw.toml", &old);
    let gw = start_gateway_from_file(&path).await;
    let leader = pki.leader(LEADER_A, false);
    let body = rpc_start("1", LEADER_A, "t-1");
    let status = |r: Result<Reply, String>| r.unwrap().status.as_u16();
    assert_eq!(status(leader.post(gw.addr, "/old/rpc", &body).await), 200);

    // One more client connection than the hard limit: it cannot fit.
    let over = format!("max_connections = {}", hard_nofile() + 1);
    let new = pki.config(&over, &partner_block("new", "/new", &partner.url(), ""));
    replace_file(&path, &new);
    wait_reloads(&gw, "over_budget", 1).await;
    assert_eq!(reloads(&gw, "ok").await, 0);
    let body = rpc_start("2", LEADER_A, "t-2");
    assert_eq!(status(leader.post(gw.addr, "/old/rpc", &body).await), 200);
    let body = rpc_start("3", LEADER_A, "t-3");
    assert_ne!(status(leader.post(gw.addr, "/new/rpc", &body).await), 200);
}

/// Issue 38: one budget for every Partner connection. With `upstream.max_connections = 1`
/// the connection left idle to one origin is closed for a request to another, which is
/// answered (not left waiting or refused), and the first origin then needs a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_budget_takes_an_idle_connection_from_another_origin() {
    let pki = Pki::new();
    let (a, a_accepted) = counting_partner().await;
    let (b, b_accepted) = counting_partner().await;
    let partners = format!(
        "max_connections = 1\n{}{}",
        partner_block("a", "/a", &a, ""),
        partner_block("b", "/b", &b, "")
    );
    let gw = start_gateway(&pki.config("", &partners)).await;
    let leader = pki.leader(LEADER_A, true);
    let (mut conn, _) = leader.h2_connection(gw.addr).await;
    let accepted = |c: &std::sync::Arc<std::sync::atomic::AtomicUsize>| {
        c.load(std::sync::atomic::Ordering::SeqCst)
    };
    for (n, to) in ["a", "b", "a"].into_iter().enumerate() {
        let body = rpc_start(&n.to_string(), LEADER_A, &format!("t-{n}"));
        let reply = send_on(&mut conn, &format!("/{to}/rpc"), &body).await;
        assert_eq!(reply.status, 200, "{to}: {}", reply.text());
    }
    assert_eq!((accepted(&a_accepted), accepted(&b_accepted)), (2, 1));
}
