//! Shared helpers: a PKI generated at test time, a recording test Partner, the gateway on
//! a free loopback port, and a Leader client over real TLS (HTTP/1.1 or HTTP/2).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aipgw::config::Config;
use aipgw::devcerts::{CertSpec, DevCa, Issued};
use aipgw::Gateway;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_rustls::{TlsAcceptor, TlsConnector};

pub const LEADER_A: &str = "10001000011K912345E789ABCDEF2353";
pub const LEADER_B: &str = "10001000011K94ZH3VDXLP4S5EB63614";
pub const PARTNER_AIC: &str = "10001000011K96TFZ2B9H9I1J85AUF77";
pub const GATEWAY_AIC: &str = "10001000011K9DX1GW14X1VSP2QQNG44";

/// A CA and the files a gateway config needs, in a temporary folder.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: DevCa,
    pub ca_pem: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = DevCa::new("test CA").unwrap();
        let ca_pem = dir.path().join("ca.pem");
        std::fs::write(&ca_pem, ca.cert_pem()).unwrap();
        let pki = Pki { dir, ca, ca_pem };
        let server = pki.issue(&CertSpec::server(&["localhost", "127.0.0.1"]));
        pki.write_pair("gateway", &server);
        pki
    }

    /// A Leader with a fresh v2.1-profile certificate for `aic`.
    pub fn leader(&self, aic: &str, h2: bool) -> Leader {
        Leader::new(self, Some(&self.issue(&CertSpec::leader_v2(aic))), h2)
    }

    pub fn issue(&self, spec: &CertSpec) -> Issued {
        self.ca.issue(spec).unwrap()
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    pub fn write_pair(&self, name: &str, issued: &Issued) -> (PathBuf, PathBuf) {
        (
            self.write(&format!("{name}.pem"), &issued.cert_pem),
            self.write(&format!("{name}.key"), &issued.key_pem),
        )
    }

    /// A gateway config: the listener part, then `partners` (TOML) verbatim.
    pub fn config(&self, listener_extra: &str, partners: &str) -> String {
        format!(
            r#"
[listener]
bind = "127.0.0.1:0"
cert = "{dir}/gateway.pem"
key = "{dir}/gateway.key"
client_ca = ["{dir}/ca.pem"]
handshake_timeout = "5s"
{listener_extra}
[upstream]
connect_timeout = "2s"
response_timeout = "5s"
{partners}
"#,
            dir = self.dir.path().display()
        )
    }
}

/// A running gateway (and its admin listener) on free loopback ports; stopped on drop.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TestGateway {
    /// Starts the graceful shutdown; the handle completes when the server has drained.
    pub fn shutdown(&mut self) -> tokio::task::JoinHandle<anyhow::Result<()>> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.server.take().expect("shut down once")
    }

    /// GETs a path on the admin listener: (status, body).
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = TcpStream::connect(self.admin).await.unwrap();
        tcp.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        tcp.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out
            .split_once("\r\n\r\n")
            .map(|x| x.1.to_owned())
            .unwrap_or_default();
        (status, body)
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub async fn start_gateway(config_text: &str) -> TestGateway {
    let config = Config::parse(config_text, std::path::Path::new("/")).unwrap();
    serve(Gateway::new(config).unwrap()).await
}

/// A gateway from a config file, reloading it when its files change (debounce 100 ms).
pub async fn start_gateway_from_file(path: &std::path::Path) -> TestGateway {
    let at_load = aipgw::reload::AtLoad::config_file(path);
    let config = Config::load(path).unwrap();
    let at_load = at_load.and_named(path, &config);
    let gateway = Gateway::new(config).unwrap();
    aipgw::reload::spawn(
        gateway.clone(),
        path.to_path_buf(),
        Duration::from_millis(100),
        true,
        at_load,
    );
    serve(gateway).await
}

async fn serve(gateway: Arc<Gateway>) -> TestGateway {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let admin_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = admin_listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // Served as the binary serves by default: each connection on one of two per-core
    // workers (`aipgw::workers`), off the test's own runtime.
    let workers = Arc::new(aipgw::workers::Workers::start(2, None).unwrap());
    let server = tokio::spawn(aipgw::server::run_on(
        listener,
        gateway.clone(),
        async move {
            let _ = rx.await;
        },
        Some(workers),
    ));
    tokio::spawn(aipgw::admin::run(
        admin_listener,
        gateway.clone(),
        std::future::pending(),
    ));
    TestGateway {
        addr,
        admin,
        stop: Some(tx),
        server: Some(server),
    }
}

/// One request as the test Partner saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The AIC of the client certificate (mTLS Partners only).
    pub tls_client_aic: Option<String>,
}

/// How the test Partner answers.
#[derive(Clone)]
pub enum Behaviour {
    /// A JSON-RPC result echoing the path.
    Echo,
    /// A fixed JSON body.
    Fixed(&'static str),
    /// Never answers (until the test ends).
    Hang,
    /// Answers like `Echo` after a pause.
    Delay(Duration),
    /// A 404 HTML page when the body contains this text, else like `Echo`.
    RefuseFrom(&'static str),
    /// A 200 response head and the start of a body, then nothing more.
    StallAfterHead,
}

/// A Partner that records what reaches it.
pub struct TestPartner {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// TCP connections accepted.
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    _stop: Arc<Notify>,
}

impl TestPartner {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn start(behaviour: Behaviour) -> TestPartner {
        TestPartner::start_with(behaviour, None).await
    }

    /// With `tls`, the Partner speaks TLS 1.3 and requires a client certificate.
    pub async fn start_with(
        behaviour: Behaviour,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> TestPartner {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(Notify::new());
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (seen2, stop2, accepted2) = (seen.clone(), stop.clone(), accepted.clone());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    r = listener.accept() => r.unwrap(),
                    _ = stop2.notified() => return,
                };
                accepted2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let seen = seen2.clone();
                let behaviour = behaviour.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => serve_partner(TokioIo::new(tcp), seen, behaviour, None).await,
                        Some(cfg) => {
                            let Ok(stream) = TlsAcceptor::from(cfg).accept(tcp).await else {
                                return;
                            };
                            let aic = stream.get_ref().1.peer_certificates().and_then(|c| {
                                aipgw::identity::cert::aic_from_certificate(&c[0], "acps.pub")
                                    .ok()
                                    .map(|a| a.to_string())
                            });
                            serve_partner(TokioIo::new(stream), seen, behaviour, aic).await
                        }
                    }
                });
            }
        });
        TestPartner {
            addr,
            seen,
            accepted,
            _stop: stop,
        }
    }
}

impl Drop for TestPartner {
    fn drop(&mut self) {
        self._stop.notify_waiters();
    }
}

async fn serve_partner<I>(
    io: I,
    seen: Arc<Mutex<Vec<Seen>>>,
    behaviour: Behaviour,
    aic: Option<String>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: Request<Incoming>| {
        let seen = seen.clone();
        let behaviour = behaviour.clone();
        let aic = aic.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let refused = matches!(behaviour, Behaviour::RefuseFrom(who)
                if String::from_utf8_lossy(&body).contains(who));
            seen.lock().unwrap().push(Seen {
                path: parts.uri.path().to_owned(),
                headers: parts.headers,
                body,
                tls_client_aic: aic,
            });
            type Boxed = http_body_util::combinators::BoxBody<Bytes, Infallible>;
            let respond = |status: u16, ctype: &str, body: Boxed| {
                let mut r = Response::new(body);
                *r.status_mut() = StatusCode::from_u16(status).unwrap();
                r.headers_mut()
                    .insert("content-type", ctype.parse().unwrap());
                Ok::<_, Infallible>(r)
            };
            if refused {
                let page = Full::new(Bytes::from_static(b"<!DOCTYPE html><h1>Not Found</h1>"));
                return respond(404, "text/html", page.boxed());
            }
            if let Behaviour::StallAfterHead = behaviour {
                let head = futures_util::stream::iter([Ok::<_, Infallible>(
                    hyper::body::Frame::data(Bytes::from_static(b"{\"jsonrpc\":\"2.0\",")),
                )]);
                let body = futures_util::StreamExt::chain(head, futures_util::stream::pending());
                return respond(
                    200,
                    "application/json",
                    http_body_util::StreamBody::new(body).boxed(),
                );
            }
            let text = match behaviour {
                Behaviour::Echo | Behaviour::RefuseFrom(_) => format!(
                    r#"{{"jsonrpc":"2.0","id":"p","result":{{"path":"{}"}}}}"#,
                    parts.uri.path()
                ),
                Behaviour::Fixed(s) => s.to_owned(),
                Behaviour::Hang => {
                    std::future::pending::<()>().await;
                    unreachable!()
                }
                Behaviour::Delay(d) => {
                    tokio::time::sleep(d).await;
                    r#"{"jsonrpc":"2.0","id":"p","result":{"late":true}}"#.to_owned()
                }
                Behaviour::StallAfterHead => unreachable!(),
            };
            respond(
                200,
                "application/json",
                Full::new(Bytes::from(text)).boxed(),
            )
        }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(io, svc)
        .await;
}

/// A JSON-RPC answer's `(error.code, error.data.reason)`; `(0, "")` for none.
pub fn error_of(v: &serde_json::Value) -> (i64, String) {
    (
        v["error"]["code"].as_i64().unwrap_or(0),
        v["error"]["data"]["reason"]
            .as_str()
            .unwrap_or("")
            .to_owned(),
    )
}

/// A reply as the Leader saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// `(error.code, error.data.reason)`.
    pub fn error(&self) -> (i64, String) {
        error_of(&self.json())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A Leader: its TLS client settings.
#[derive(Clone)]
pub struct Leader {
    pub tls: Arc<rustls::ClientConfig>,
    pub h2: bool,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

pub fn roots(ca: &DevCa) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der()).unwrap();
    roots
}

impl Leader {
    /// A Leader trusting `pki`'s CA, presenting `cert` (or none).
    pub fn new(pki: &Pki, cert: Option<&Issued>, h2: bool) -> Leader {
        Leader::with_versions(pki, cert, h2, &[&rustls::version::TLS13])
    }

    pub fn with_versions(
        pki: &Pki,
        cert: Option<&Issued>,
        h2: bool,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Leader {
        let b = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots(&pki.ca));
        let cfg = match cert {
            Some(c) => b
                .with_client_auth_cert(vec![c.cert_der.clone()], c.key_der())
                .unwrap(),
            None => b.with_no_client_auth(),
        };
        Leader::from_config(cfg, h2)
    }

    /// A Leader with these TLS settings, offering HTTP/2 or HTTP/1.1 by ALPN.
    fn from_config(mut cfg: rustls::ClientConfig, h2: bool) -> Leader {
        cfg.alpn_protocols = if h2 {
            vec![b"h2".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        Leader {
            tls: Arc::new(cfg),
            h2,
        }
    }

    /// A Leader presenting `leaf` followed by `intermediates` (the v2.1 CA's chain).
    pub fn with_chain(pki: &Pki, leaf: &Issued, intermediates: &[&DevCa], h2: bool) -> Leader {
        let mut chain = vec![leaf.cert_der.clone()];
        chain.extend(intermediates.iter().map(|ca| ca.cert_der()));
        let cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots(&pki.ca))
            .with_client_auth_cert(chain, leaf.key_der())
            .unwrap();
        Leader::from_config(cfg, h2)
    }

    /// A TLS connection to the gateway.
    pub async fn connect(
        &self,
        addr: SocketAddr,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        TlsConnector::from(self.tls.clone())
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }

    /// POSTs `body` to `path` on a new connection.
    pub async fn post(&self, addr: SocketAddr, path: &str, body: &str) -> Result<Reply, String> {
        self.post_with(addr, path, Bytes::from(body.to_owned()), &[])
            .await
    }

    pub async fn post_with(
        &self,
        addr: SocketAddr,
        path: &str,
        body: Bytes,
        headers: &[(&str, &str)],
    ) -> Result<Reply, String> {
        let (resp, _conn) = self.send(addr, path, body, headers).await?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// POSTs on a new connection; returns the response head and the connection's task.
    pub async fn send(
        &self,
        addr: SocketAddr,
        path: &str,
        body: Bytes,
        headers: &[(&str, &str)],
    ) -> Result<(Response<Incoming>, tokio::task::JoinHandle<()>), String> {
        let stream = self
            .connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let io = TokioIo::new(stream);
        // HTTP/2 carries the authority in the URI; HTTP/1.1 in the Host header.
        let uri = if self.h2 {
            format!("https://localhost{path}")
        } else {
            path.to_owned()
        };
        let mut req = Request::post(uri).header("content-type", "application/json");
        if !self.h2 && !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req = req.header("host", "localhost");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(body)).unwrap();
        if self.h2 {
            let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| format!("h2 handshake: {e}"))?;
            let conn = tokio::spawn(async move {
                let _ = conn.await;
            });
            let resp = send
                .send_request(req)
                .await
                .map_err(|e| format!("send: {e}"))?;
            Ok((resp, conn))
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("h1 handshake: {e}"))?;
            let conn = tokio::spawn(async move {
                let _ = conn.await;
            });
            let resp = send
                .send_request(req)
                .await
                .map_err(|e| format!("send: {e}"))?;
            Ok((resp, conn))
        }
    }
}

/// A TLS server config for an mTLS test Partner: its certificate, requiring clients
/// issued by `pki`'s CA.
pub fn partner_tls(pki: &Pki, server: &Issued) -> Arc<rustls::ServerConfig> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(&pki.ca)),
        provider(),
    )
    .build()
    .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![server.cert_der.clone()], server.key_der())
        .unwrap();
    Arc::new(cfg)
}

/// A valid `rpc` start body for `sender`.
pub fn rpc_start(id: &str, sender: &str, task: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"rpc","id":{id},"params":{{"message":{{"type":"message","id":"m-{task}","sentAt":"2025-09-01T11:58:00+08:00","senderRole":"leader","senderId":"{sender}","command":"start","dataItems":[{{"type":"text","text":"hello"}}],"taskId":"{task}","sessionId":"s1"}}}}}}"#
    )
}

/// A `[[partner]]` block.
pub fn partner_block(name: &str, prefix: &str, upstream: &str, extra: &str) -> String {
    format!(
        "[[partner]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nupstreams = [\"{upstream}\"]\n{extra}\n"
    )
}

/// Reads one HTTP/1.1 message (its head and a `content-length` body) off `s`, for tests
/// that speak raw HTTP/1.1; bytes after it are dropped.
pub async fn read_http1_message<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = aipgw::test_util::http1_message_end(&buf) {
            buf.truncate(end);
            return buf;
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert!(
            n > 0,
            "closed mid-message: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Waits for `fut` at most `secs` seconds (a safety net, not a measurement).
pub async fn within<T>(secs: u64, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .expect("timed out")
}

/// An SSE response being read event by event.
pub struct StreamReply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: Incoming,
    splitter: aipgw::test_util::Splitter,
    ready: std::collections::VecDeque<Bytes>,
    conn: tokio::task::JoinHandle<()>,
}

/// One event as the Leader saw it.
#[derive(Debug)]
pub struct Event {
    /// The `id:` field.
    pub sse_id: Option<String>,
    /// The data, parsed.
    pub json: serde_json::Value,
    /// The event's bytes as received.
    pub raw: Bytes,
}

impl Event {
    pub fn seq(&self) -> Option<u64> {
        self.json["result"]["eventSeq"].as_u64()
    }
}

impl StreamReply {
    /// The next event (keep-alive comments skipped); `None` at the end of the stream.
    pub async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(raw) = self.ready.pop_front() {
                let f = aipgw::test_util::fields(&raw);
                let Some(data) = f.data else { continue };
                return Some(Event {
                    sse_id: f.id.map(|i| String::from_utf8_lossy(i).into_owned()),
                    json: serde_json::from_slice(&data).unwrap_or_else(|e| {
                        panic!(
                            "event data is not JSON ({e}): {}",
                            String::from_utf8_lossy(&data)
                        )
                    }),
                    raw: raw.clone(),
                });
            }
            match self.body.frame().await {
                None | Some(Err(_)) => {
                    let mut out = Vec::new();
                    self.splitter.finish(&mut out);
                    if out.is_empty() {
                        return None;
                    }
                    self.ready.extend(out.into_iter().map(|e| e.bytes));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let mut out = Vec::new();
                        self.splitter.push(data, &mut out).unwrap();
                        self.ready.extend(out.into_iter().map(|e| e.bytes));
                    }
                }
            }
        }
    }

    /// Drops the connection, as a Leader whose network failed.
    pub fn disconnect(self) {
        self.conn.abort();
    }
}

impl Leader {
    /// POSTs and returns the response head, with the body to read event by event.
    pub async fn open_stream(
        &self,
        addr: SocketAddr,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> StreamReply {
        let (resp, conn) = self
            .send(addr, path, Bytes::from(body.to_owned()), headers)
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        StreamReply {
            status: parts.status,
            headers: parts.headers,
            body,
            splitter: aipgw::test_util::Splitter::new(1 << 24),
            ready: Default::default(),
            conn,
        }
    }
}

/// What an [`SsePartner`] answers to a `re-stream` that reaches it.
#[derive(Clone)]
pub enum Restream {
    /// A JSON-RPC error (it does not support re-stream).
    Error,
    /// These SSE events, then the end.
    Events(Vec<String>),
}

type Feeds = Arc<
    Mutex<
        std::collections::HashMap<String, tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>>,
    >,
>;

/// A Partner whose `stream` answers are fed by the test, event by event.
pub struct SsePartner {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<serde_json::Value>>>,
    feeds: Feeds,
    registered: Arc<Notify>,
}

impl SsePartner {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Commands of every `stream` request the Partner received.
    pub fn commands(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|v| {
                v["params"]["message"]["command"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect()
    }

    /// The feed of the stream opened for `task` (waits until it is opened). Dropping it
    /// ends the Partner's stream.
    pub async fn feed(
        &self,
        task: &str,
    ) -> tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>> {
        loop {
            let notified = self.registered.notified();
            if let Some(tx) = self.feeds.lock().unwrap().remove(task) {
                return tx;
            }
            within(10, notified).await;
        }
    }

    pub async fn start(restream: Restream) -> SsePartner {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
        let feeds: Feeds = Arc::default();
        let registered = Arc::new(Notify::new());
        let (seen2, feeds2, reg2) = (seen.clone(), feeds.clone(), registered.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (seen, feeds, reg, restream) = (
                    seen2.clone(),
                    feeds2.clone(),
                    reg2.clone(),
                    restream.clone(),
                );
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (seen, feeds, reg, restream) =
                            (seen.clone(), feeds.clone(), reg.clone(), restream.clone());
                        async move {
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                            seen.lock().unwrap().push(v.clone());
                            let msg = &v["params"]["message"];
                            let task = msg["taskId"].as_str().unwrap_or("").to_owned();
                            let sse = |body: http_body_util::combinators::BoxBody<
                                Bytes,
                                std::io::Error,
                            >| {
                                let mut r = Response::new(body);
                                r.headers_mut()
                                    .insert("content-type", "text/event-stream".parse().unwrap());
                                r
                            };
                            let resp = match (msg["command"].as_str(), &restream) {
                                (Some("re-stream"), Restream::Error) => {
                                    let e = format!(
                                        r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32004,"message":"Unsupported operation"}}}}"#,
                                        v["id"]
                                    );
                                    let mut r = Response::new(
                                        Full::new(Bytes::from(e)).map_err(|n| match n {}).boxed(),
                                    );
                                    r.headers_mut().insert(
                                        "content-type",
                                        "application/json".parse().unwrap(),
                                    );
                                    r
                                }
                                (Some("re-stream"), Restream::Events(evs)) => {
                                    let all = evs.concat();
                                    sse(Full::new(Bytes::from(all)).map_err(|n| match n {}).boxed())
                                }
                                _ => {
                                    let (tx, rx) = tokio::sync::mpsc::channel(64);
                                    feeds.lock().unwrap().insert(task, tx);
                                    reg.notify_waiters();
                                    let frames =
                                        futures_util::stream::unfold(rx, |mut rx| async move {
                                            rx.recv().await.map(
                                                |r: Result<Bytes, std::io::Error>| {
                                                    (r.map(hyper::body::Frame::data), rx)
                                                },
                                            )
                                        });
                                    sse(http_body_util::StreamBody::new(frames).boxed())
                                }
                            };
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        SsePartner {
            addr,
            seen,
            feeds,
            registered,
        }
    }
}

/// A compact AIP stream event.
pub fn sse_event(id: &str, seq: u64, state: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"eventSeq\":{seq},\"eventData\":{{\"type\":\"status-update\",\"taskId\":\"t\",\"status\":{{\"state\":\"{state}\"}}}}}}}}\n\n"
    ))
}

/// A `stream` request body.
pub fn stream_body(id: &str, sender: &str, task: &str, command: &str, last: Option<u64>) -> String {
    let cp = last.map_or(String::new(), |l| {
        format!(r#","commandParams":{{"lastEventSeq":{l}}}"#)
    });
    format!(
        r#"{{"jsonrpc":"2.0","method":"stream","id":{id},"params":{{"message":{{"type":"message","id":"m","senderRole":"leader","senderId":"{sender}","command":"{command}","taskId":"{task}","sessionId":"s1"{cp}}}}}}}"#
    )
}

/// Feeds events `seqs` to a Partner stream; the one numbered `terminal_at` reports
/// `terminal_state`, the others `working`.
pub async fn feed_events(
    feed: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    seqs: std::ops::RangeInclusive<u64>,
    terminal: Option<(u64, &str)>,
) {
    for n in seqs {
        let state = match terminal {
            Some((t, state)) if t == n => state,
            _ => "working",
        };
        feed.send(Ok(sse_event("\"s1\"", n, state))).await.unwrap();
    }
}

/// Replaces a file atomically (write beside, then rename), as a careful operator does.
pub fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `config_reloads_total{result=...}` on the admin listener.
pub async fn reloads(gw: &TestGateway, result: &str) -> u64 {
    let text = gw.admin_get("/metrics").await.1;
    let key = format!("aipgw_config_reloads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits (20 s at most) until at least `at_least` reloads ended with `result`.
pub async fn wait_reloads(gw: &TestGateway, result: &str, at_least: u64) {
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        while reloads(gw, result).await < at_least {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if waited.is_err() {
        panic!(
            "waited for {at_least} {result} reloads; ok={} failed={}",
            reloads(gw, "ok").await,
            reloads(gw, "failed").await
        );
    }
}

/// An HTTP/2 request sender on one connection.
pub type H2 = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

impl Leader {
    /// An HTTP/2 connection to the gateway, and whether its TLS session was resumed.
    pub async fn h2_connection(&self, addr: SocketAddr) -> (H2, bool) {
        let stream = self.connect(addr).await.unwrap();
        let resumed = stream.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        (send, resumed)
    }
}

/// POSTs `body` to `path` on an open HTTP/2 connection.
pub async fn send_on(send: &mut H2, path: &str, body: &str) -> Reply {
    let req = Request::post(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// `name{labels}` -> value, from the Prometheus text format.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

pub async fn metric(gw: &TestGateway, key: &str, want: f64) -> HashMap<String, f64> {
    // Request metrics are written when the response body ends, just after the client
    // has read it: wait for them rather than race.
    within(10, async {
        loop {
            let m = parse_metrics(&gw.admin_get("/metrics").await.1);
            if m.get(key) == Some(&want) {
                return m;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

/// Whether `program` with `args` runs and succeeds. Outside CI a missing tool skips the
/// test (`false`); under `CI=true` it is a failure (`.ci/run` installs what the tests use).
pub fn installed(program: &str, args: &[&str]) -> bool {
    let found = std::process::Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{program} {args:?} failed (CI=true: .ci/run installs it)"
        );
        eprintln!("{program} is not usable: test skipped");
    }
    found
}

/// Sends on `conn` until a request is refused (10 s at most); the refusal.
pub async fn refused_on(conn: &mut H2, body: &str) -> Reply {
    within(10, async {
        loop {
            let r = send_on(conn, "/p/rpc", body).await;
            if r.status != 200 {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// `GET path` from a gateway's admin listener over plain HTTP/1.1 (`connection: close`):
/// the whole answer, head and body, or `None` when it cannot be reached.
pub async fn admin_get(admin: SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = TcpStream::connect(admin).await.ok()?;
    let head = format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n");
    tcp.write_all(head.as_bytes()).await.ok()?;
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.ok()?;
    Some(out)
}
