//! The listener's TLS stream (`tls::stream`, `tls::accept`: rustls's unbuffered API)
//! attacked over real sockets by hostile or careless clients: records trickled, split or
//! oversized, handshake messages fragmented or huge, empty and tiny records, key-update
//! storms, half-closes and resets, clients that never read, and HTTP/2 with large bodies.
//! Every wait is bounded and ends on a signal (EOF, a metric, an answer).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use aipgw::devcerts::{CertSpec, Issued};
use bytes::Bytes;
use rustls::crypto::cipher::{
    InboundOpaqueMessage, MessageDecrypter, MessageEncrypter, OutboundChunks, OutboundPlainMessage,
};
use rustls::pki_types::ServerName;
use rustls::{ConnectionTrafficSecrets, ContentType, ProtocolVersion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support::*;

/// Taken exclusively by the test that measures CPU time per thread, shared by the others
/// (so that this file's own busy tests do not count in that measurement).
static CPU: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

const TIMEOUT: &str = "aipgw_tls_handshake_failures_total{reason=\"timeout\"}";
const TLS_ERROR: &str = "aipgw_tls_handshake_failures_total{reason=\"tls_error\"}";
const OPEN: &str = "aipgw_open_connections";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A Leader's client settings presenting `chain` (HTTP/1.1 or HTTP/2 by ALPN).
fn client_config(
    pki: &Pki,
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: &Issued,
    h2: bool,
) -> rustls::ClientConfig {
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots(&pki.ca))
        .with_client_auth_cert(chain, key.key_der())
        .unwrap();
    cfg.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    cfg
}

fn leader_config(pki: &Pki, h2: bool) -> rustls::ClientConfig {
    let cert = pki.issue(&CertSpec::leader_v2(LEADER_A));
    client_config(pki, vec![cert.cert_der.clone()], &cert, h2)
}

/// A Leader with [`leader_config`]'s settings.
fn leader(pki: &Pki, h2: bool) -> Leader {
    Leader {
        tls: Arc::new(leader_config(pki, h2)),
        h2,
    }
}

/// Another connection's `rpc` (task `task`) is answered: the gateway still serves.
async fn still_serves(pki: &Pki, gw: &TestGateway, id: &str, task: &str) {
    let r = leader(pki, false)
        .post(gw.addr, "/p/rpc", &rpc_start(id, LEADER_A, task))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Writes `byte` every `every_ms` until the gateway closes the connection (what it sends
/// meanwhile is read and dropped); how many were written.
async fn trickle_until_closed(tcp: &mut TcpStream, byte: u8, every_ms: u64) -> usize {
    let mut buf = [0u8; 1024];
    let mut sent = 0;
    loop {
        tokio::select! {
            r = tcp.read(&mut buf) => match r {
                Ok(0) | Err(_) => return sent,
                Ok(_) => {}
            },
            _ = tokio::time::sleep(Duration::from_millis(every_ms)) => {
                if tcp.write_all(&[byte]).await.is_err() {
                    return sent;
                }
                sent += 1;
            }
        }
    }
}

/// A JSON-RPC answer of about `pad` bytes (a Partner's fixed answer lives as long as it).
fn padded_answer(pad: usize) -> &'static str {
    let text = format!(
        r#"{{"jsonrpc":"2.0","id":"p","result":{{"pad":"{}"}}}}"#,
        "x".repeat(pad)
    );
    Box::leak(text.into_boxed_str())
}

/// A raw HTTP/1.x POST of `body` to `path`, with `host` when given.
fn post(path: &str, body: &str, version: &str, host: Option<&str>) -> String {
    let host = host.map_or(String::new(), |h| format!("host: {h}\r\n"));
    format!(
        "POST {path} HTTP/{version}\r\n{host}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// A metric's value now (0 when absent).
async fn value(gw: &TestGateway, key: &str) -> f64 {
    parse_metrics(&gw.admin_get("/metrics").await.1)
        .get(key)
        .copied()
        .unwrap_or(0.0)
}

/// Waits (at most `secs`) until `key` satisfies `ok`; panics with its last value.
async fn wait_metric(gw: &TestGateway, key: &str, secs: u64, ok: impl Fn(f64) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = value(gw, key).await;
        if ok(v) {
            return;
        }
        assert!(Instant::now() < deadline, "{key} stayed at {v}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `bytes` hold a plaintext TLS alert record (the server's refusal before its
/// keys are set).
fn has_alert(bytes: &[u8]) -> bool {
    bytes.first() == Some(&0x15)
}

/// A gateway (handshake timeout `handshake`) with extra `[listener]` lines, in front of an
/// echoing Partner at `/p`.
async fn gateway(listener: &str, handshake: &str) -> (Pki, TestPartner, TestGateway) {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let config = pki
        .config(listener, &partner_block("p", "/p", &partner.url(), ""))
        .replace(
            "handshake_timeout = \"5s\"",
            &format!("handshake_timeout = \"{handshake}\""),
        );
    let gw = start_gateway(&config).await;
    (pki, partner, gw)
}

// ---------------------------------------------------------------------------------------
// A client on rustls's own connection, the bytes on the wire in the test's hands.

struct Raw {
    tcp: TcpStream,
    tls: rustls::ClientConnection,
    plain: Vec<u8>,
}

impl Raw {
    async fn connect(addr: SocketAddr, cfg: rustls::ClientConfig, name: &str) -> Raw {
        let tcp = TcpStream::connect(addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        let tls = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
        Raw {
            tcp,
            tls,
            plain: Vec::new(),
        }
    }

    /// The records rustls has queued.
    fn take_tls(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        while self.tls.wants_write() {
            self.tls.write_tls(&mut out).unwrap();
        }
        out
    }

    async fn send_tls(&mut self) -> std::io::Result<()> {
        let out = self.take_tls();
        self.tcp.write_all(&out).await
    }

    /// One read from the socket through rustls; `false` at its end.
    async fn receive(&mut self) -> std::io::Result<bool> {
        let mut buf = vec![0; 32 * 1024];
        let n = self.tcp.read(&mut buf).await?;
        if n == 0 {
            return Ok(false);
        }
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            self.tls.read_tls(&mut rest)?;
            self.tls
                .process_new_packets()
                .map_err(std::io::Error::other)?;
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match self.tls.reader().read(&mut chunk) {
                    Ok(0) => break,
                    Ok(k) => self.plain.extend_from_slice(&chunk[..k]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(true)
    }

    async fn finish_handshake(&mut self) -> std::io::Result<()> {
        loop {
            self.send_tls().await?;
            if !self.tls.is_handshaking() {
                return Ok(());
            }
            if !self.receive().await? {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    async fn write_plain(&mut self, data: &[u8]) {
        self.tls.writer().write_all(data).unwrap();
        self.send_tls().await.unwrap();
    }

    /// One HTTP/1.x message (head and `content-length` body).
    async fn read_message(&mut self) -> String {
        loop {
            if let Some(end) = aipgw::test_util::http1_message_end(&self.plain) {
                let msg: Vec<u8> = self.plain.drain(..end).collect();
                return String::from_utf8_lossy(&msg).into_owned();
            }
            let more = self.receive().await.unwrap();
            assert!(
                more,
                "closed mid-message: {}",
                String::from_utf8_lossy(&self.plain)
            );
        }
    }
}

/// The first record of `hello` (a whole ClientHello) framed again as records of at most
/// `size` payload bytes (handshake message fragmentation, RFC 8446 §5.1).
fn fragmented(hello: &[u8], size: usize) -> Vec<u8> {
    assert_eq!(hello[0], 0x16, "a handshake record");
    let len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
    assert_eq!(hello.len(), 5 + len, "the ClientHello in one record");
    let mut out = Vec::new();
    for chunk in hello[5..].chunks(size) {
        out.extend_from_slice(&hello[..3]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

// ---------------------------------------------------------------------------------------
// 1. Records that never complete.

/// A record header announcing 16 KiB during the handshake, then a byte now and then: the
/// handshake timeout still closes the connection, counted as a timeout.
#[tokio::test]
async fn a_handshake_record_trickled_byte_by_byte_is_closed_by_the_handshake_timeout() {
    let _shared = CPU.read().await;
    let (_pki, _partner, gw) = gateway("", "600ms").await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let started = Instant::now();
    // A ClientHello record of 16 KiB: its type and a length, then zeros.
    tcp.write_all(&[0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0x3f, 0xfc])
        .await
        .unwrap();
    let sent = 9 + within(10, trickle_until_closed(&mut tcp, 0, 40)).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(550) && took < Duration::from_secs(3),
        "closed after {took:?} (handshake timeout 600 ms), {sent} bytes sent"
    );
    wait_metric(&gw, TIMEOUT, 10, |v| v == 1.0).await;
    assert_eq!(value(&gw, TLS_ERROR).await, 0.0);
}

/// After the handshake, a record header announcing the largest record and a trickle of
/// its bytes: the gateway does not spin on the partial record (none of its workers busy
/// for more than half the time), and the idle timeout still closes it.
#[tokio::test]
async fn a_partial_record_after_the_handshake_does_not_spin_and_is_closed_when_idle() {
    let _alone = CPU.write().await;
    // The threads of the process before this test's gateway: its workers are the new ones
    // (other tests' gateways run in this process too, on threads of their own).
    let others = thread_cpu();
    let (pki, partner, gw) = gateway("idle_timeout = \"1500ms\"", "5s").await;
    let leader = leader(&pki, false);
    let mut tls = leader.connect(gw.addr).await.unwrap();
    // One request first, so the connection is fully set up (and verified).
    let body = rpc_start("1", LEADER_A, "t-partial");
    tls.write_all(post("/p/rpc", &body, "1.1", Some("localhost")).as_bytes())
        .await
        .unwrap();
    let got = String::from_utf8_lossy(&within(5, read_http1_message(&mut tls)).await).into_owned();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let (tcp, _) = tls.get_mut();
    // An application-data record of 2^14 + 256 bytes (TLS 1.3's largest), 100 of them.
    let mut partial = vec![0x17, 0x03, 0x03, 0x41, 0x00];
    partial.extend_from_slice(&[0xaa; 100]);
    tcp.write_all(&partial).await.unwrap();
    let before = thread_cpu();
    let started = Instant::now();
    within(10, trickle_until_closed(tcp, 0xaa, 20)).await;
    let took = started.elapsed();
    let after = thread_cpu();
    let busiest = after
        .iter()
        .filter(|(tid, (name, _))| name.starts_with("aipgw-worker") && !others.contains_key(tid))
        .map(|(tid, (name, t))| {
            let was = before.get(tid).map_or(0, |b| b.1);
            (t - was, name.clone())
        })
        .max()
        .unwrap();
    let busy = Duration::from_millis(busiest.0 * 1000 / ticks_per_second());
    assert!(
        took < Duration::from_secs(4),
        "idle timeout 1.5 s: closed after {took:?}"
    );
    assert!(
        busy < took / 2 + Duration::from_millis(50),
        "thread {:?} busy {busy:?} of {took:?} while a record was partial",
        busiest.1
    );
    assert_eq!(partner.seen().len(), 1);
}

fn ticks_per_second() -> u64 {
    100
}

/// Each thread of this process: its id -> (name, CPU ticks used, user and system).
fn thread_cpu() -> std::collections::HashMap<u64, (String, u64)> {
    let mut out = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_owned();
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        // After the name: state is field 3; utime and stime are fields 14 and 15.
        let ticks = fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        out.insert(tid, (name, ticks));
    }
    out
}

// ---------------------------------------------------------------------------------------
// 2. A ClientHello split across TCP writes and across records.

/// A gateway whose certificate also names `sni.example`, and a Partner that answers only
/// requests for that host (Host header, else the SNI).
async fn sni_gateway() -> (Pki, TestPartner, TestGateway) {
    let pki = Pki::new();
    let server = pki.issue(&CertSpec::server(&[
        "localhost",
        "127.0.0.1",
        "sni.example",
    ]));
    pki.write_pair("gateway", &server);
    let partner = TestPartner::start(Behaviour::Echo).await;
    let config = pki
        .config(
            "",
            &partner_block("p", "/p", &partner.url(), "hosts = [\"sni.example\"]"),
        )
        .replace("handshake_timeout = \"5s\"", "handshake_timeout = \"20s\"");
    let gw = start_gateway(&config).await;
    (pki, partner, gw)
}

/// Sends `hello` (records) in TCP writes of `write` bytes, pausing now and then so that
/// they arrive apart; then completes the handshake and sends an HTTP/1.0 request without
/// a Host header (routed by the SNI alone): the answer's head.
async fn via_sni(raw: &mut Raw, hello: &[u8], write: usize) -> String {
    for (i, piece) in hello.chunks(write).enumerate() {
        raw.tcp.write_all(piece).await.unwrap();
        if i % 4 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    within(20, raw.finish_handshake()).await.unwrap();
    let body = rpc_start("1", LEADER_A, "t-sni");
    raw.write_plain(post("/p/rpc", &body, "1.0", None).as_bytes())
        .await;
    within(10, raw.read_message()).await
}

#[tokio::test]
async fn a_client_hello_split_across_tcp_writes_and_records_still_carries_its_sni() {
    let _shared = CPU.read().await;
    let (pki, partner, gw) = sni_gateway().await;
    // A large ClientHello too: many ALPN names make it several KiB.
    let mut large = leader_config(&pki, false);
    large.alpn_protocols.extend(
        (0..40).map(|i| format!("x-padding-protocol-{i:03}-{}", "p".repeat(80)).into_bytes()),
    );
    // (records' payload size, TCP write size, settings)
    let cases = [
        (usize::MAX, 1 << 20, leader_config(&pki, false)),
        (usize::MAX, 1, leader_config(&pki, false)),
        (1, 64, leader_config(&pki, false)),
        (3, 5, leader_config(&pki, false)),
        (100, 7, leader_config(&pki, false)),
        (1, 512, large.clone()),
        (usize::MAX, 3, large),
    ];
    for (n, (record, write, cfg)) in cases.into_iter().enumerate() {
        let mut raw = Raw::connect(gw.addr, cfg, "sni.example").await;
        let hello = raw.take_tls();
        let hello = if record == usize::MAX {
            hello
        } else {
            fragmented(&hello, record)
        };
        let wire = hello.len();
        let head = via_sni(&mut raw, &hello, write).await;
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "case {n}: records of {record} bytes, TCP writes of {write}, {wire} bytes on the \
             wire: {head}"
        );
        assert_eq!(partner.seen().len(), n + 1, "case {n}");
    }
}

// ---------------------------------------------------------------------------------------
// 3. Oversized records and handshake messages.

/// A record header over TLS's bound, and a ClientHello announcing 16 MiB: refused at once
/// (an alert, or at least a close, long before the handshake timeout), as TLS errors.
#[tokio::test]
async fn oversized_records_and_handshake_messages_are_refused_at_once() {
    let _shared = CPU.read().await;
    let (_pki, _partner, gw) = gateway("", "20s").await;
    let mut record_too_large = vec![0x16, 0x03, 0x01, 0xff, 0xff];
    record_too_large.extend_from_slice(&[0; 100]);
    // A ClientHello announcing 16 MiB, in two whole records (rustls judges its length
    // when the second joins the first).
    let mut sixteen_mib = vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0xff, 0xff, 0xff];
    sixteen_mib.resize(5 + 0x4000, 0);
    let mut second = vec![0x16, 0x03, 0x01, 0x40, 0x00];
    second.resize(5 + 0x4000, 0);
    sixteen_mib.extend_from_slice(&second);
    let cases = [
        ("a 64 KiB record", record_too_large),
        ("a 16 MiB ClientHello", sixteen_mib.clone()),
    ];
    let mut failures = 0.0;
    // The bytes alone (nothing after them): the close, with rustls's alert when it queues
    // one (it does for a record over its bound; for a handshake message over 64 KiB it
    // returns the error alone, as in its buffered API).
    for (n, (what, first)) in cases.iter().enumerate() {
        let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
        let started = Instant::now();
        tcp.write_all(first).await.unwrap();
        let mut got = Vec::new();
        let _ = within(10, tcp.read_to_end(&mut got)).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(3),
            "{what}: closed after {took:?} (handshake timeout 20 s)"
        );
        if n == 0 {
            assert!(
                has_alert(&got),
                "{what}: no alert before the close: {got:?}"
            );
        }
        failures += 1.0;
        wait_metric(&gw, TLS_ERROR, 10, |v| v == failures).await;
    }
    // Followed by a flood of 16 KiB records: closed as soon, having taken a bounded part.
    for (what, first) in cases {
        let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
        let started = Instant::now();
        tcp.write_all(&first).await.unwrap();
        let (mut rd, mut wr) = tcp.into_split();
        let flood = second.clone();
        let feeding = tokio::spawn(async move {
            let mut sent = 0usize;
            while sent < 64 << 20 && wr.write_all(&flood).await.is_ok() {
                sent += flood.len();
            }
            sent
        });
        let mut sink = Vec::new();
        let _ = within(10, rd.read_to_end(&mut sink)).await;
        let took = started.elapsed();
        let sent = within(10, feeding).await.unwrap();
        assert!(
            took < Duration::from_secs(3),
            "{what} and more: closed after {took:?} (handshake timeout 20 s)"
        );
        assert!(
            sent < 16 << 20,
            "{what}: the gateway took {sent} bytes after it"
        );
        failures += 1.0;
        wait_metric(&gw, TLS_ERROR, 10, |v| v == failures).await;
    }
    assert_eq!(value(&gw, TIMEOUT).await, 0.0);
}

/// A client certificate message over 64 KiB (the chain padded with copies of another
/// certificate): refused promptly, as a TLS error; the gateway serves others.
#[tokio::test]
async fn a_client_certificate_chain_over_64_kib_is_refused() {
    let _shared = CPU.read().await;
    let (pki, partner, gw) = gateway("", "20s").await;
    let leaf = pki.issue(&CertSpec::leader_v2(LEADER_A));
    let other = aipgw::devcerts::DevCa::new("padding CA")
        .unwrap()
        .cert_der();
    let mut chain = vec![leaf.cert_der.clone()];
    while chain.iter().map(|c| c.len() + 5).sum::<usize>() < 80 * 1024 {
        chain.push(other.clone());
    }
    let cfg = client_config(&pki, chain, &leaf, false);
    let leader = Leader {
        tls: Arc::new(cfg),
        h2: false,
    };
    let started = Instant::now();
    // TLS 1.3: the client's handshake ends when it has sent its flight; the refusal comes
    // after it.
    let refused = match leader.connect(gw.addr).await {
        Err(e) => format!("handshake: {e}"),
        Ok(mut tls) => {
            let body = rpc_start("1", LEADER_A, "t-huge");
            let _ = tls
                .write_all(post("/p/rpc", &body, "1.1", Some("localhost")).as_bytes())
                .await;
            let mut out = Vec::new();
            match within(10, tls.read_to_end(&mut out)).await {
                Err(e) => format!("read: {e}"),
                Ok(_) => format!("closed after {:?}", String::from_utf8_lossy(&out)),
            }
        }
    };
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "refused after {took:?} ({refused})"
    );
    assert!(partner.seen().is_empty(), "{refused}");
    wait_metric(&gw, TLS_ERROR, 10, |v| v == 1.0).await;
    // Others are served.
    still_serves(&pki, &gw, "2", "t-ok").await;
}

/// A client certificate message under rustls's 64 KiB bound sent in small records (the
/// client's `max_fragment_size`): every record adds its header and tag, and the message is
/// accepted all the same.
#[tokio::test]
async fn a_large_client_certificate_message_in_small_records_is_accepted() {
    let _shared = CPU.read().await;
    let (pki, partner, gw) = gateway("", "20s").await;
    let leaf = pki.issue(&CertSpec::leader_v2(LEADER_A));
    let other = aipgw::devcerts::DevCa::new("padding CA")
        .unwrap()
        .cert_der();
    let mut chain = vec![leaf.cert_der.clone()];
    // The Certificate message: 4 (header) + 1 (context) + 3 (list) + per entry 3 + der + 2.
    let size = |c: &[rustls::pki_types::CertificateDer<'_>]| {
        8 + c.iter().map(|d| d.len() + 5).sum::<usize>()
    };
    while size(&chain) + other.len() + 5 < 60 * 1024 {
        chain.push(other.clone());
    }
    for fragment in [16 * 1024, 4096, 1024, 512] {
        let mut cfg = client_config(&pki, chain.clone(), &leaf, false);
        cfg.max_fragment_size = Some(fragment);
        let leader = Leader {
            tls: Arc::new(cfg),
            h2: false,
        };
        let body = rpc_start("1", LEADER_A, &format!("t-{fragment}"));
        let r = within(10, leader.post(gw.addr, "/p/rpc", &body)).await;
        let r = r.unwrap_or_else(|e| {
            panic!(
                "a {} byte Certificate message in records of {fragment} bytes: {e}",
                size(&chain)
            )
        });
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(partner.seen().len(), 4);
}

// ---------------------------------------------------------------------------------------
// 4. Empty and tiny application-data records.

/// A connection whose records the test seals and opens itself (the client's traffic keys
/// taken from rustls after the handshake): any record shape on the wire.
struct Sealed {
    tcp: TcpStream,
    enc: Box<dyn MessageEncrypter>,
    dec: Box<dyn MessageDecrypter>,
    tx: u64,
    rx: u64,
    wire: Vec<u8>,
    plain: Vec<u8>,
}

impl Sealed {
    async fn connect(pki: &Pki, addr: SocketAddr) -> Sealed {
        let cert = pki.issue(&CertSpec::leader_v2(LEADER_A));
        let suite = rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;
        let provider = Arc::new(rustls::crypto::CryptoProvider {
            cipher_suites: vec![suite],
            ..rustls::crypto::aws_lc_rs::default_provider()
        });
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots(&pki.ca))
            .with_client_auth_cert(vec![cert.cert_der.clone()], cert.key_der())
            .unwrap();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        cfg.enable_secret_extraction = true;
        let mut raw = Raw::connect(addr, cfg, "localhost").await;
        within(10, raw.finish_handshake()).await.unwrap();
        let secrets = raw.tls.dangerous_extract_secrets().unwrap();
        let aead = suite.tls13().unwrap().aead_alg;
        let keys = |s| match s {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (key, iv),
            _ => unreachable!("AES-128-GCM only"),
        };
        let (tx, tx_secret) = secrets.tx;
        let (rx, rx_secret) = secrets.rx;
        let (k, iv) = keys(tx_secret);
        let enc = aead.encrypter(k, iv);
        let (k, iv) = keys(rx_secret);
        let dec = aead.decrypter(k, iv);
        Sealed {
            tcp: raw.tcp,
            enc,
            dec,
            tx,
            rx,
            wire: Vec::new(),
            plain: raw.plain,
        }
    }

    /// One application-data record of `data` (empty too).
    fn record(&mut self, data: &[u8]) -> Vec<u8> {
        let msg = OutboundPlainMessage {
            typ: ContentType::ApplicationData,
            version: ProtocolVersion::TLSv1_2,
            payload: OutboundChunks::Single(data),
        };
        let sealed = self.enc.encrypt(msg, self.tx).unwrap();
        self.tx += 1;
        sealed.encode()
    }

    /// The next whole record read from the gateway, decrypted: its type and plaintext.
    fn next_record(&mut self) -> Option<(ContentType, Vec<u8>)> {
        let len = usize::from(u16::from_be_bytes([*self.wire.get(3)?, *self.wire.get(4)?]));
        if self.wire.len() < 5 + len {
            return None;
        }
        let mut rec: Vec<u8> = self.wire.drain(..5 + len).collect();
        let typ = ContentType::from(rec[0]);
        let opaque = InboundOpaqueMessage::new(typ, ProtocolVersion::TLSv1_2, &mut rec[5..]);
        let open = self.dec.decrypt(opaque, self.rx).unwrap();
        self.rx += 1;
        Some((open.typ, open.payload.to_vec()))
    }

    /// Reads until one HTTP/1.x message has come; its text.
    async fn read_message(&mut self) -> String {
        loop {
            if let Some(end) = aipgw::test_util::http1_message_end(&self.plain) {
                let msg: Vec<u8> = self.plain.drain(..end).collect();
                return String::from_utf8_lossy(&msg).into_owned();
            }
            while let Some((typ, payload)) = self.next_record() {
                match typ {
                    ContentType::ApplicationData => self.plain.extend_from_slice(&payload),
                    ContentType::Handshake => {} // a session ticket
                    other => panic!("record of type {other:?}: {payload:?}"),
                }
            }
            if aipgw::test_util::http1_message_end(&self.plain).is_some() {
                continue;
            }
            let mut buf = [0u8; 16 * 1024];
            let n = self.tcp.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed mid-message: {}",
                String::from_utf8_lossy(&self.plain)
            );
            self.wire.extend_from_slice(&buf[..n]);
        }
    }
}

impl Sealed {
    /// The content types of the records that come until the gateway closes.
    async fn until_closed(&mut self) -> Vec<ContentType> {
        let mut types = Vec::new();
        loop {
            while let Some((typ, _)) = self.next_record() {
                if typ != ContentType::Handshake {
                    types.push(typ);
                }
            }
            let mut buf = [0u8; 16 * 1024];
            match self.tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return types,
                Ok(n) => self.wire.extend_from_slice(&buf[..n]),
            }
        }
    }
}

/// Empty application-data records (RFC 8446 §5.1 allows them) in runs up to rustls's
/// limit (32 in a row), and every byte of a request in its own record, cut anywhere by
/// TCP: the requests are answered. A longer run is refused by rustls (its defence against
/// empty-record floods, without an alert): the connection closes.
#[tokio::test]
async fn empty_and_one_byte_records_still_carry_requests() {
    let _shared = CPU.read().await;
    let (pki, partner, gw) = gateway("", "5s").await;
    let mut c = Sealed::connect(&pki, gw.addr).await;
    for round in 0..3 {
        let body = rpc_start(&round.to_string(), LEADER_A, &format!("t-tiny-{round}"));
        let req = post("/p/rpc", &body, "1.1", Some("localhost"));
        let mut wire = Vec::new();
        for _ in 0..31 {
            let r = c.record(&[]);
            wire.extend_from_slice(&r);
        }
        for (i, b) in req.as_bytes().iter().enumerate() {
            for _ in 0..(i % 32) {
                let r = c.record(&[]);
                wire.extend_from_slice(&r);
            }
            let r = c.record(std::slice::from_ref(b));
            wire.extend_from_slice(&r);
        }
        for piece in wire.chunks(997) {
            c.tcp.write_all(piece).await.unwrap();
        }
        let head = within(10, c.read_message()).await;
        assert!(head.starts_with("HTTP/1.1 200"), "round {round}: {head}");
        let seen = partner.seen();
        assert_eq!(seen.len(), round + 1);
        assert_eq!(seen[round].body, body.as_bytes(), "round {round}");
    }
    let mut flood = Vec::new();
    for _ in 0..40 {
        let r = c.record(&[]);
        flood.extend_from_slice(&r);
    }
    c.tcp.write_all(&flood).await.unwrap();
    let types = within(10, c.until_closed()).await;
    assert!(
        !types.contains(&ContentType::ApplicationData),
        "after 40 empty records: {types:?}"
    );
    wait_metric(&gw, OPEN, 10, |v| v == 0.0).await;
}

/// The client's smallest records (`max_fragment_size` 32) on HTTP/1.1 and HTTP/2.
#[tokio::test]
async fn the_smallest_fragments_carry_requests_both_ways() {
    let _shared = CPU.read().await;
    let (pki, partner, gw) = gateway("", "5s").await;
    for h2 in [false, true] {
        let mut cfg = leader_config(&pki, h2);
        cfg.max_fragment_size = Some(32);
        let leader = Leader {
            tls: Arc::new(cfg),
            h2,
        };
        let body = rpc_start("1", LEADER_A, &format!("t-frag-{h2}"));
        let r = within(10, leader.post(gw.addr, "/p/rpc", &body))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "h2 {h2}: {}", r.text());
        assert_eq!(partner.seen().last().unwrap().body, body.as_bytes());
    }
}

// ---------------------------------------------------------------------------------------
// 5. Early data.

/// A resuming client that would send 0-RTT data: the gateway's tickets do not offer it,
/// and the request is served once, after the handshake.
#[tokio::test]
async fn early_data_is_not_offered_and_requests_are_served_once() {
    let _shared = CPU.read().await;
    let (pki, partner, gw) = gateway("", "5s").await;
    let mut cfg = leader_config(&pki, false);
    cfg.enable_early_data = true;
    let cfg = Arc::new(cfg);
    let body = rpc_start("1", LEADER_A, "t-early");
    let req = post("/p/rpc", &body, "1.1", Some("localhost"));
    let mut resumed = 0;
    let mut offered = 0;
    for round in 0..3 {
        let mut raw = Raw::connect(gw.addr, (*cfg).clone(), "localhost").await;
        // The request as 0-RTT data when the ticket allows it.
        if let Some(mut early) = raw.tls.early_data() {
            early.write_all(req.as_bytes()).unwrap();
            offered += 1;
        }
        within(10, raw.finish_handshake()).await.unwrap();
        assert!(
            !raw.tls.is_early_data_accepted(),
            "round {round}: 0-RTT accepted"
        );
        raw.write_plain(req.as_bytes()).await;
        let got = within(10, raw.read_message()).await;
        assert!(got.starts_with("HTTP/1.1 200"), "round {round}: {got}");
        if raw.tls.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
            resumed += 1;
        }
        assert_eq!(
            partner.seen().len(),
            round + 1,
            "round {round}: served once"
        );
    }
    assert_eq!(offered, 0, "the gateway's tickets offer early data");
    eprintln!("resumed handshakes: {resumed} of 3");
}

// ---------------------------------------------------------------------------------------
// 6. Key updates.

/// Key updates (each asking the gateway to update its own keys too) before every request,
/// and bursts of 31 (rustls refuses a 33rd with no application data between): every
/// answer arrives, under keys that keep changing both ways.
#[tokio::test]
async fn key_update_storms_on_a_keep_alive_connection_lose_no_answer() {
    let _shared = CPU.read().await;
    let (pki, partner, gw) = gateway("", "5s").await;
    let leader = leader(&pki, false);
    let mut tls = leader.connect(gw.addr).await.unwrap();
    for i in 0..200 {
        let updates = if i % 10 == 0 { 31 } else { 1 };
        for _ in 0..updates {
            tls.get_mut().1.refresh_traffic_keys().unwrap();
            tls.flush().await.unwrap();
        }
        let body = rpc_start(&i.to_string(), LEADER_A, &format!("t-ku-{i}"));
        let req = post("/p/rpc", &body, "1.1", Some("localhost"));
        // The request's head and body in two writes, a key update between them.
        let (head, rest) = req.split_at(req.len() / 2);
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.get_mut().1.refresh_traffic_keys().unwrap();
        tls.write_all(rest.as_bytes()).await.unwrap();
        tls.flush().await.unwrap();
        let got = within(10, read_http1_message(&mut tls)).await;
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 200"), "request {i}: {got}");
    }
    assert_eq!(partner.seen().len(), 200);
}

// ---------------------------------------------------------------------------------------
// 7. Half-closes and resets.

/// A client that sends close_notify (and its FIN) right after its request: the gateway
/// ends the request with it (`h1`: no half-close, as hyper), counts the connection closed
/// and serves others.
#[tokio::test]
async fn a_client_that_half_closes_after_its_request_is_counted_closed() {
    let _shared = CPU.read().await;
    let (pki, partner, gw) = gateway("", "5s").await;
    let leader = leader(&pki, false);
    let mut tls = leader.connect(gw.addr).await.unwrap();
    let body = rpc_start("1", LEADER_A, "t-half");
    tls.write_all(post("/p/rpc", &body, "1.1", Some("localhost")).as_bytes())
        .await
        .unwrap();
    tls.shutdown().await.unwrap();
    let mut out = Vec::new();
    let _ = within(10, tls.read_to_end(&mut out)).await;
    wait_metric(&gw, OPEN, 10, |v| v == 0.0).await;
    assert!(partner.seen().len() <= 1);
    still_serves(&pki, &gw, "2", "t-half-2").await;
}

/// A client that closes an idle keep-alive connection with close_notify gets the
/// gateway's close_notify before the TCP close (RFC 8446 §6.1: each party sends one
/// before closing its write side), so it can tell a clean end from a truncation.
#[tokio::test]
async fn a_client_close_notify_is_answered_with_close_notify() {
    let _shared = CPU.read().await;
    let (pki, _partner, gw) = gateway("", "5s").await;
    for h2 in [false, true] {
        let leader = Leader {
            tls: Arc::new(leader_config(&pki, h2)),
            h2,
        };
        let mut tls = leader.connect(gw.addr).await.unwrap();
        if h2 {
            // The client preface and an empty SETTINGS; the gateway's SETTINGS back.
            tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                .await
                .unwrap();
            let mut some = [0u8; 64];
            assert!(within(10, tls.read(&mut some)).await.unwrap() > 0);
        } else {
            let body = rpc_start("1", LEADER_A, "t-cn");
            tls.write_all(post("/p/rpc", &body, "1.1", Some("localhost")).as_bytes())
                .await
                .unwrap();
            let got = within(10, read_http1_message(&mut tls)).await;
            assert!(got.starts_with(b"HTTP/1.1 200"));
        }
        tls.shutdown().await.unwrap();
        let mut out = Vec::new();
        let ended = within(10, tls.read_to_end(&mut out)).await;
        assert!(
            ended.is_ok(),
            "h2 {h2}: the gateway closed without close_notify: {ended:?}"
        );
    }
}

#[tokio::test]
async fn a_client_that_resets_mid_answer_is_counted_closed_and_others_are_served() {
    let _shared = CPU.read().await;
    let pki = Pki::new();
    let big = padded_answer(4 << 20);
    let partner = TestPartner::start(Behaviour::Fixed(big)).await;
    let partners = format!(
        "[limits]\nmax_body_bytes = 8388608\n{}",
        partner_block("p", "/p", &partner.url(), "")
    );
    let gw = start_gateway(&pki.config("", &partners)).await;
    for h2 in [false, true] {
        let leader = Leader {
            tls: Arc::new(leader_config(&pki, h2)),
            h2,
        };
        let body = rpc_start("1", LEADER_A, "t-reset");
        let (resp, conn) = within(10, leader.send(gw.addr, "/p/rpc", Bytes::from(body), &[]))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        // Part of the answer read, then the client's connection task aborted: its socket
        // closes with unread data in its receive buffer, which the kernel answers with a
        // reset.
        let mut body = resp.into_body();
        use http_body_util::BodyExt;
        let first = within(10, body.frame()).await.unwrap().unwrap();
        assert!(first.is_data());
        drop(body);
        conn.abort();
        let _ = conn.await;
        wait_metric(&gw, OPEN, 10, |v| v == 0.0).await;
    }
    // A raw reset (SO_LINGER 0) in the middle of an HTTP/1.1 answer.
    let leader = leader(&pki, false);
    let mut tls = leader.connect(gw.addr).await.unwrap();
    let body = rpc_start("2", LEADER_A, "t-rst");
    tls.write_all(post("/p/rpc", &body, "1.1", Some("localhost")).as_bytes())
        .await
        .unwrap();
    let mut some = [0u8; 1024];
    let n = within(10, tls.read(&mut some)).await.unwrap();
    assert!(n > 0);
    tls.get_ref().0.set_zero_linger().unwrap();
    drop(tls);
    wait_metric(&gw, OPEN, 10, |v| v == 0.0).await;
    // Others are served.
    let r = leader
        .post(gw.addr, "/p/rpc", &rpc_start("3", LEADER_A, "t-after"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), big.len());
}

// ---------------------------------------------------------------------------------------
// 8. A client that never reads.

#[tokio::test]
async fn a_client_that_never_reads_its_pipelined_answers_is_closed_by_the_write_timeout() {
    let _shared = CPU.read().await;
    let pki = Pki::new();
    let big = padded_answer(512 << 10);
    let partner = TestPartner::start(Behaviour::Fixed(big)).await;
    let gw = start_gateway(&pki.config(
        "write_timeout = \"1s\"",
        &partner_block("p", "/p", &partner.url(), ""),
    ))
    .await;
    let leader = leader(&pki, false);
    let tls = leader.connect(gw.addr).await.unwrap();
    let mut all = String::new();
    for i in 0..64 {
        all.push_str(&post(
            "/p/rpc",
            &rpc_start(&i.to_string(), LEADER_A, &format!("t-pipe-{i}")),
            "1.1",
            Some("localhost"),
        ));
    }
    // Written from another task (the gateway may stop reading them); never read.
    let (_rd, mut wr) = tokio::io::split(tls);
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(all.as_bytes()).await;
        let _ = wr.flush().await;
        wr
    });
    wait_metric(&gw, OPEN, 10, |v| v == 1.0).await;
    let started = Instant::now();
    // 64 answers of 512 KiB (32 MiB) do not fit the sockets' buffers: the gateway's writes
    // stall, and the write timeout closes the connection.
    wait_metric(&gw, OPEN, 30, |v| v == 0.0).await;
    let seen = partner.seen().len();
    assert!(
        seen < 64,
        "every request taken ({seen}) while no answer was read: after {:?}",
        started.elapsed()
    );
    writer.abort();
}

// ---------------------------------------------------------------------------------------
// 9. HTTP/2: large bodies and many streams.

#[tokio::test]
async fn http2_large_bodies_and_many_concurrent_streams_arrive_intact() {
    let _shared = CPU.read().await;
    let pki = Pki::new();
    let echo = TestPartner::start(Behaviour::Echo).await;
    let big: &'static str = Box::leak(
        format!(
            r#"{{"jsonrpc":"2.0","id":"p","result":{{"pad":"{}"}}}}"#,
            (0..(1 << 20))
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect::<String>()
        )
        .into_boxed_str(),
    );
    let large = TestPartner::start(Behaviour::Fixed(big)).await;
    let partners = format!(
        "[limits]\nmax_body_bytes = 4194304\n{}{}",
        partner_block("p", "/p", &echo.url(), ""),
        partner_block("big", "/big", &large.url(), "")
    );
    let gw = start_gateway(&pki.config("", &partners)).await;
    let leader = leader(&pki, true);
    let (send, _) = leader.h2_connection(gw.addr).await;
    // 1 MiB of request body.
    let text: String = (0..(1 << 20))
        .map(|i| char::from(b'A' + (i % 26) as u8))
        .collect();
    let huge = rpc_start("1", LEADER_A, "t-h2-big").replace("\"hello\"", &format!("\"{text}\""));
    let mut tasks = Vec::new();
    {
        let mut send = send.clone();
        let huge = huge.clone();
        tasks.push(tokio::spawn(async move {
            let r = send_on(&mut send, "/p/rpc", &huge).await;
            assert_eq!(r.status, 200, "{}", r.text());
        }));
    }
    for i in 0..40 {
        let mut send = send.clone();
        tasks.push(tokio::spawn(async move {
            if i % 4 == 0 {
                let r = send_on(
                    &mut send,
                    "/big/rpc",
                    &rpc_start(&i.to_string(), LEADER_A, &format!("t-b{i}")),
                )
                .await;
                assert_eq!(r.status, 200);
                assert!(
                    r.body == big.as_bytes(),
                    "stream {i}: {} bytes",
                    r.body.len()
                );
            } else {
                let body = rpc_start(&i.to_string(), LEADER_A, &format!("t-s{i}"))
                    .replace("\"hello\"", &format!("\"{}\"", "z".repeat(20_000 + i)));
                let r = send_on(&mut send, "/p/rpc", &body).await;
                assert_eq!(r.status, 200, "stream {i}: {}", r.text());
            }
        }));
    }
    for t in tasks {
        within(60, t).await.unwrap();
    }
    let seen = echo.seen();
    assert_eq!(seen.len(), 31);
    let got = seen
        .iter()
        .find(|s| s.body.len() > 1 << 20)
        .expect("the 1 MiB request");
    assert!(
        got.body == huge.as_bytes(),
        "the 1 MiB body changed on its way"
    );
    for s in &seen {
        let v: serde_json::Value = serde_json::from_slice(&s.body).unwrap();
        let task = v["params"]["message"]["taskId"]
            .as_str()
            .unwrap()
            .to_owned();
        if let Some(i) = task.strip_prefix("t-s") {
            let i: usize = i.parse().unwrap();
            let t = v["params"]["message"]["dataItems"][0]["text"]
                .as_str()
                .unwrap();
            assert_eq!(t, "z".repeat(20_000 + i), "stream {i}");
        }
    }
}
