//! A gateway, the bare baseline and the static backend, each on a single-threaded runtime
//! of its own thread, on loopback with mutual TLS, and a Leader connection to drive them:
//! shared by the end-to-end bench (`benches/e2e.rs`) and the request path's allocation
//! budget (`tests/request_alloc.rs`), which asks a server's thread for its own count.
//!
//! Needs `mod backend;` and `mod bare;` (this folder) beside it.
#![allow(dead_code)] // each user takes what it needs

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

use super::{backend, bare};

/// The Leader's AIC (v1 profile).
pub(crate) const LEADER: &str = "10001000011K912345E789ABCDEF2353";

/// A ~330-byte AIP v01.00 `rpc` from `LEADER` (the backend answers id 1).
pub(crate) fn rpc_body() -> Bytes {
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","method":"rpc","id":1,"params":{{"message":{{"type":"message","id":"m1","sentAt":"2026-11-21T10:00:00+08:00","senderRole":"leader","senderId":"{LEADER}","command":"start","dataItems":[{{"type":"text","text":"Plan a trip"}}],"taskId":"task-e2e","sessionId":"s1"}}}}}}"#
    ))
}

/// A CA, the servers' certificate and a Leader's, made at run time.
pub(crate) struct Pki {
    dir: tempfile::TempDir,
    ca: DevCa,
}

impl Pki {
    pub(crate) fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = DevCa::new("loopback CA").unwrap();
        let server = ca
            .issue(&CertSpec::server(&["localhost", "127.0.0.1"]))
            .unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", &ca.cert_pem());
        write("server.pem", &server.cert_pem);
        write("server.key", &server.key_pem);
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
            rustls::crypto::aws_lc_rs::default_provider(),
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

/// A server on a single-threaded runtime of its own thread; `probe()` runs `probe_fn` on
/// that thread (e.g. to read its allocation count).
pub(crate) struct OwnThread {
    pub(crate) addr: SocketAddr,
    ask: mpsc::UnboundedSender<oneshot::Sender<usize>>,
}

impl OwnThread {
    pub(crate) fn start<F, Fut>(serve: F, probe_fn: fn() -> usize) -> OwnThread
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
                    let _ = reply.send(probe_fn());
                }
                // Nobody will ask again: go on serving.
                std::future::pending::<()>().await;
            });
        });
        OwnThread {
            addr: addr_rx.recv().unwrap(),
            ask,
        }
    }

    pub(crate) async fn probe(&self) -> usize {
        let (tx, rx) = oneshot::channel();
        self.ask.send(tx).unwrap();
        rx.await.unwrap()
    }
}

fn nothing() -> usize {
    0
}

/// The static backend (plain HTTP/1.1).
pub(crate) fn start_backend() -> SocketAddr {
    OwnThread::start(|listener| backend::serve(listener, 10), nothing).addr
}

/// The gateway in front of `backend`, its routes at `/aip`.
pub(crate) fn start_gateway(pki: &Pki, backend: SocketAddr, probe: fn() -> usize) -> OwnThread {
    let text = format!(
        r#"
[listener]
bind = "127.0.0.1:0"
cert = "{cert}"
key = "{key}"
client_ca = ["{ca}"]
[log]
level = "off"
[[partner]]
name = "loopback"
prefix = "/aip"
upstreams = ["http://{backend}"]
"#,
        cert = pki.path("server.pem").display(),
        key = pki.path("server.key").display(),
        ca = pki.path("ca.pem").display(),
    );
    let config = Config::parse(&text, std::path::Path::new("/")).unwrap();
    OwnThread::start(
        move |listener| async move {
            let gateway = aipgw::Gateway::new(config).unwrap();
            let _ = aipgw::server::run(listener, gateway, std::future::pending()).await;
        },
        probe,
    )
}

/// The bare baseline in front of `backend`.
pub(crate) fn start_bare(pki: &Pki, backend: SocketAddr, probe: fn() -> usize) -> OwnThread {
    let tls = bare::tls_config(
        &pki.path("server.pem"),
        &pki.path("server.key"),
        &pki.path("ca.pem"),
        &[],
        true,
    )
    .unwrap();
    let uri: http::Uri = format!("http://{backend}").parse().unwrap();
    OwnThread::start(move |listener| bare::serve(listener, tls, uri), probe)
}

/// One keep-alive Leader connection (HTTP/1.1 or HTTP/2).
pub(crate) enum Leader {
    Http1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    Http2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Leader {
    pub(crate) async fn connect(pki: &Pki, addr: SocketAddr, h2: bool) -> Leader {
        let tcp = TcpStream::connect(addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let tls = TlsConnector::from(pki.leader_tls(h2))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let io = TokioIo::new(tls);
        if h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            Leader::Http2(send)
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            Leader::Http1(send)
        }
    }

    /// One `rpc`, its answer read whole and checked.
    pub(crate) async fn rpc(&mut self, body: Bytes) {
        let req = Request::post(match self {
            Leader::Http1(_) => "/aip/rpc",
            Leader::Http2(_) => "https://localhost/aip/rpc",
        })
        .header("content-type", "application/json");
        let req = match self {
            Leader::Http1(_) => req.header("host", "localhost"),
            Leader::Http2(_) => req,
        }
        .body(Full::new(body))
        .unwrap();
        let resp = match self {
            Leader::Http1(s) => s.send_request(req).await.unwrap(),
            Leader::Http2(s) => s.send_request(req).await.unwrap(),
        };
        assert_eq!(resp.status(), 200);
        let answer = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(answer, backend::RPC_ANSWER.as_bytes());
    }
}
