//! The whole request path's allocation budget: `rpc` requests through a real gateway
//! (mutual TLS, HTTP/1.1 and HTTP/2, a Partner on loopback), allocations counted on the
//! gateway's own thread only: the gateway runs on a single-threaded runtime of its own,
//! the Leader and the Partner on others. The bare tokio + hyper + rustls proxy of the load
//! comparison (`benches/support/bare.rs`) is counted the same way, for reference
//! (`benches/README.md`, "Allocations per request").
#![allow(missing_docs)]

#[path = "../benches/support/backend.rs"]
mod backend;
#[path = "../benches/support/bare.rs"]
mod bare;
#[path = "common/counting.rs"]
mod counting;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use aipgw::config::Config;
use aipgw::devcerts::{CertSpec, DevCa};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::TlsConnector;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

/// The budgets: what the path allocates today, with a little room. A change that adds
/// allocations per request fails here; one that removes some should lower these.
const BUDGET_HTTP1: f64 = 40.0;
const BUDGET_HTTP2: f64 = 43.0;

const LEADER: &str = "10001000011K912345E789ABCDEF2353";
const REQUESTS: usize = 400;

fn body() -> Bytes {
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","method":"rpc","id":1,"params":{{"message":{{"type":"message","id":"m1","sentAt":"2026-11-21T10:00:00+08:00","senderRole":"leader","senderId":"{LEADER}","command":"start","dataItems":[{{"type":"text","text":"Plan a trip"}}],"taskId":"task-alloc","sessionId":"s1"}}}}}}"#
    ))
}

struct Pki {
    dir: tempfile::TempDir,
    ca: DevCa,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = DevCa::new("alloc test CA").unwrap();
        let server = ca
            .issue(&CertSpec::server(&["localhost", "127.0.0.1"]))
            .unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", &ca.cert_pem());
        write("gateway.pem", &server.cert_pem);
        write("gateway.key", &server.key_pem);
        Pki { dir, ca }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn leader_tls(&self, h2: bool) -> Arc<rustls::ClientConfig> {
        let leader = self
            .ca
            .issue(&CertSpec::leader_v1(LEADER, "acps.pub"))
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.cert_der()).unwrap();
        let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![leader.cert_der.clone()], leader.key_der())
        .unwrap();
        cfg.alpn_protocols = vec![if h2 {
            b"h2".to_vec()
        } else {
            b"http/1.1".to_vec()
        }];
        Arc::new(cfg)
    }
}

/// A server on a single-threaded runtime of its own thread; `count()` asks that thread
/// for its allocation count.
struct Counted {
    addr: SocketAddr,
    ask: mpsc::UnboundedSender<oneshot::Sender<usize>>,
}

impl Counted {
    fn start<F, Fut>(serve: F) -> Counted
    where
        F: FnOnce(TcpListener) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (ask, mut asked) = mpsc::unbounded_channel::<oneshot::Sender<usize>>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                tokio::task::spawn_local(serve(listener));
                while let Some(reply) = asked.recv().await {
                    let _ = reply.send(counting::allocations());
                }
            });
        });
        Counted {
            addr: addr_rx.recv().unwrap(),
            ask,
        }
    }

    async fn count(&self) -> usize {
        let (tx, rx) = oneshot::channel();
        self.ask.send(tx).unwrap();
        rx.await.unwrap()
    }
}

fn start_backend() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            backend::serve(listener, 10).await;
        });
    });
    rx.recv().unwrap()
}

fn start_gateway(pki: &Pki, backend: SocketAddr) -> Counted {
    let text = format!(
        r#"
[listener]
bind = "127.0.0.1:0"
cert = "{gw}"
key = "{key}"
client_ca = ["{ca}"]
[log]
level = "off"
[[partner]]
name = "alloc"
prefix = "/aip"
upstreams = ["http://{backend}"]
"#,
        gw = pki.path("gateway.pem").display(),
        key = pki.path("gateway.key").display(),
        ca = pki.path("ca.pem").display(),
    );
    let config = Config::parse(&text, std::path::Path::new("/")).unwrap();
    Counted::start(move |listener| async move {
        let gateway = aipgw::Gateway::new(config).unwrap();
        let _ = aipgw::server::run(listener, gateway, std::future::pending()).await;
    })
}

fn start_bare(pki: &Pki, backend: SocketAddr) -> Counted {
    let tls = bare::tls_config(
        &pki.path("gateway.pem"),
        &pki.path("gateway.key"),
        &pki.path("ca.pem"),
        &[],
        true,
    )
    .unwrap();
    let uri: http::Uri = format!("http://{backend}").parse().unwrap();
    Counted::start(move |listener| bare::serve(listener, tls, uri))
}

/// Allocations per request on the server's thread over `REQUESTS` requests on one
/// keep-alive connection (after a warm-up on the same connection).
async fn per_request(server: &Counted, pki: &Pki, h2: bool) -> f64 {
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let tls = TlsConnector::from(pki.leader_tls(h2))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let io = TokioIo::new(tls);
    let request = || {
        let uri = if h2 {
            "https://localhost/aip/rpc"
        } else {
            "/aip/rpc"
        };
        let mut r = Request::post(uri).header("content-type", "application/json");
        if !h2 {
            r = r.header("host", "localhost");
        }
        r.body(Full::new(body())).unwrap()
    };
    macro_rules! run {
        ($send:expr) => {{
            let mut send = $send;
            let mut round = async |n: usize| {
                for _ in 0..n {
                    let resp = send.send_request(request()).await.unwrap();
                    assert_eq!(resp.status(), 200);
                    let b = resp.into_body().collect().await.unwrap().to_bytes();
                    assert_eq!(b, backend::RPC_ANSWER.as_bytes());
                }
            };
            round(50).await;
            let before = server.count().await;
            round(REQUESTS).await;
            let after = server.count().await;
            (after - before) as f64 / REQUESTS as f64
        }};
    }
    if h2 {
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        run!(send)
    } else {
        let (send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        run!(send)
    }
}

#[tokio::test]
async fn the_request_path_stays_within_its_allocation_budget() {
    let pki = Pki::new();
    let backend = start_backend();
    let gateway = start_gateway(&pki, backend);
    let bare = start_bare(&pki, backend);
    let gw1 = per_request(&gateway, &pki, false).await;
    let gw2 = per_request(&gateway, &pki, true).await;
    let bare1 = per_request(&bare, &pki, false).await;
    let bare2 = per_request(&bare, &pki, true).await;
    eprintln!(
        "allocations per request: aipgw HTTP/1.1 {gw1:.1}, HTTP/2 {gw2:.1}; \
         bare proxy HTTP/1.1 {bare1:.1}, HTTP/2 {bare2:.1}"
    );
    assert!(
        gw1 <= BUDGET_HTTP1,
        "HTTP/1.1: {gw1:.1} allocations per request, budget {BUDGET_HTTP1}"
    );
    assert!(
        gw2 <= BUDGET_HTTP2,
        "HTTP/2: {gw2:.1} allocations per request, budget {BUDGET_HTTP2}"
    );
    // The harness counts: the bare proxy allocates per request too.
    assert!(bare1 > 1.0 && bare2 > 1.0, "{bare1} {bare2}");
}
