//! Issue 31, item 2: OCSP for Leader certificates, against a real `openssl ocsp`
//! responder on loopback over an `openssl ca`-style index the test writes. Leader
//! certificates are made at test time with an AIA OCSP URL pointing at it. Every wait is
//! on a metric or a refused request, within a deadline. Under `CI=true` a missing
//! `openssl` (or Python `cryptography`, for the replayed old answer) is a failure.

use std::convert::Infallible;
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use aipgw::devcerts::{CertSpec, DevCa, Issued};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::support::*;

/// One index line: `V` (valid) or `R` (revoked) for `cert`.
pub(crate) fn index_line(cert: &Issued, revoked: bool) -> String {
    let serial = format!("{:X}", cert.serial);
    let serial = if serial.len() % 2 == 1 {
        format!("0{serial}")
    } else {
        serial
    };
    if revoked {
        format!("R\t351231235959Z\t250101000000Z\t{serial}\tunknown\t/CN=leader\n")
    } else {
        format!("V\t351231235959Z\t\t{serial}\tunknown\t/CN=leader\n")
    }
}

/// `openssl ocsp` answering over `index.txt` in its own folder, signing with `signer`.
pub(crate) struct Responder {
    dir: tempfile::TempDir,
    ca_pem: std::path::PathBuf,
    signer: (std::path::PathBuf, std::path::PathBuf),
    port: u16,
    child: Option<Child>,
}

impl Responder {
    /// Starts one on a free port (`None`: openssl missing outside CI).
    pub(crate) fn start(pki: &Pki, signer: &Issued, index: &str) -> Option<Responder> {
        if !installed("openssl", &["version"]) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("rsigner.pem");
        let key = dir.path().join("rsigner.key");
        std::fs::write(&cert, &signer.cert_pem).unwrap();
        std::fs::write(&key, &signer.key_pem).unwrap();
        let mut r = Responder {
            dir,
            ca_pem: pki.ca_pem.clone(),
            signer: (cert, key),
            port: 0,
            child: None,
        };
        r.serve(index);
        Some(r)
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/acps-atr-v2/ocsp", self.port)
    }

    /// (Re)starts the responder over `index` on the same port (the first time: any).
    pub(crate) fn serve(&mut self, index: &str) {
        self.stop();
        let idx = self.dir.path().join("index.txt");
        std::fs::write(&idx, index).unwrap();
        let mut child = Command::new("openssl")
            .arg("ocsp")
            .arg("-index")
            .arg(&idx)
            .arg("-port")
            .arg(self.port.to_string())
            .arg("-rsigner")
            .arg(&self.signer.0)
            .arg("-rkey")
            .arg(&self.signer.1)
            .arg("-CA")
            .arg(&self.ca_pem)
            .arg("-nmin")
            .arg("60")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Its first line names the port it listens on: `ACCEPT [::]:PORT PID=...` (the
        // port is never probed with a bare connect, which leaves openssl deaf).
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .split_whitespace()
            .nth(1)
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("openssl ocsp said {line:?}"));
        self.port = port;
        self.child = Some(child);
    }

    pub(crate) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A delegated responder certificate of `ca` (`id-kp-OCSPSigning`).
pub(crate) fn responder_cert(ca: &DevCa) -> Issued {
    let mut spec = CertSpec::server(&["ocsp"]);
    spec.ocsp_signing = true;
    ca.issue(&spec).unwrap()
}

/// A Leader certificate for `aic` with `serial`, naming `url` as its OCSP responder.
fn leader_cert(pki: &Pki, aic: &str, serial: u64, url: &str) -> Issued {
    let mut spec = CertSpec::leader_v2(aic);
    spec.serial = Some(serial);
    spec.ocsp_urls = vec![url.to_owned()];
    pki.issue(&spec)
}

fn config(pki: &Pki, partner: &TestPartner, policy: &str) -> String {
    let revocation = format!(
        "[revocation]\nocsp = \"{policy}\"\nocsp_max_age = \"1s\"\nocsp_retry_interval = \"1s\"\nocsp_timeout = \"2s\"\n"
    );
    pki.config(
        "",
        &format!(
            "{revocation}{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    )
}

/// The series `key` (`name{a="x",...}`), summed over the series of that name whose
/// labels include all of `key`'s (the OCSP series also carry a `responder` label).
pub(crate) async fn counter(gw: &TestGateway, key: &str) -> f64 {
    let m = parse_metrics(&gw.admin_get("/metrics").await.1);
    if let Some(v) = m.get(key) {
        return *v;
    }
    let split = |k: &str| {
        let (name, labels) = k.strip_suffix('}')?.split_once('{')?;
        Some((
            name.to_owned(),
            labels.split(',').map(str::to_owned).collect::<Vec<_>>(),
        ))
    };
    let Some((name, want)) = split(key) else {
        return 0.0;
    };
    m.iter()
        .filter(|(k, _)| {
            split(k).is_some_and(|(n, labels)| n == name && want.iter().all(|w| labels.contains(w)))
        })
        .map(|(_, v)| v)
        .sum()
}

/// Waits (10 s at most) until the counter `key` is above `after`.
pub(crate) async fn wait_counter(gw: &TestGateway, key: &str, after: f64) {
    within(10, async {
        while counter(gw, key).await <= after {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
}

fn error_key(reason: &str) -> String {
    format!("aipgw_ocsp_errors_total{{reason=\"{reason}\"}}")
}

pub(crate) fn answers_key(status: &str) -> String {
    format!("aipgw_ocsp_answers_total{{status=\"{status}\"}}")
}

const SERIAL: u64 = 0x1122_3344_5566_7788;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_leader_is_cut_off_on_its_open_http2_connection() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let signer = responder_cert(&pki.ca);
    let Some(mut responder) = Responder::start(&pki, &signer, "") else {
        return;
    };
    let cert = leader_cert(&pki, LEADER_A, SERIAL, &responder.url());
    responder.serve(&index_line(&cert, false));
    let gw = start_gateway(&config(&pki, &partner, "soft")).await;

    let leader = Leader::new(&pki, Some(&cert), true);
    let (mut conn, _) = leader.h2_connection(gw.addr).await;
    let body = rpc_start("1", LEADER_A, "t");
    assert_eq!(send_on(&mut conn, "/p/rpc", &body).await.status, 200);
    // The answer (good, from the delegated responder) comes after the handshake.
    wait_counter(&gw, &answers_key("good"), 0.0).await;
    assert_eq!(send_on(&mut conn, "/p/rpc", &body).await.status, 200);

    // The CA revokes the Leader: its next request on the same connection, once the
    // cached answer (ocsp_max_age = 1 s) has been asked again, is refused.
    responder.serve(&index_line(&cert, true));
    let r = refused_on(&mut conn, &body).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.error(), (-32010, "revoked".into()));
    let r = leader.post(gw.addr, "/p/rpc", &body).await.unwrap();
    assert_eq!(
        r.error(),
        (-32010, "revoked".into()),
        "a new connection too"
    );
    // Every series names the responder.
    let url = responder.url();
    let m = parse_metrics(&gw.admin_get("/metrics").await.1);
    let at = |k: &str| m.get(k).copied().unwrap_or(0.0);
    let answers =
        |s: &str| format!("aipgw_ocsp_answers_total{{responder=\"{url}\",status=\"{s}\"}}");
    assert!(at(&answers("good")) >= 1.0, "{m:?}");
    assert!(at(&answers("revoked")) >= 1.0);
    let lookups =
        |r: &str| format!("aipgw_ocsp_cache_lookups_total{{responder=\"{url}\",result=\"{r}\"}}");
    assert!(at(&lookups("hit")) >= 1.0);
    assert!(at(&lookups("miss")) >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responder_that_is_down_passes_under_soft_and_refuses_under_hard() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/ocsp");
    let cert = leader_cert(&pki, LEADER_A, SERIAL, &url);
    let body = rpc_start("1", LEADER_A, "t");

    let soft = start_gateway(&config(&pki, &partner, "soft")).await;
    let leader = Leader::new(&pki, Some(&cert), true);
    let (mut conn, _) = leader.h2_connection(soft.addr).await;
    assert_eq!(send_on(&mut conn, "/p/rpc", &body).await.status, 200);
    wait_counter(&soft, &error_key("unreachable"), 0.0).await;
    assert_eq!(send_on(&mut conn, "/p/rpc", &body).await.status, 200);

    let hard = start_gateway(&config(&pki, &partner, "hard")).await;
    let r = leader.post(hard.addr, "/p/rpc", &body).await.unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.error(), (-32010, "revocation_status_unknown".into()));
    assert!(counter(&hard, &error_key("unreachable")).await >= 1.0);
}

/// A responder that answers every query with the answer to another: `forward` turns
/// the body the gateway sent into the one asked of `upstream`.
async fn answering_for(upstream: String, ask: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ask = Bytes::from(ask);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (upstream, ask) = (upstream.clone(), ask.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| {
                    let (upstream, ask) = (upstream.clone(), ask.clone());
                    async move {
                        let body = ocsp_post(&upstream, ask).await;
                        Ok::<_, Infallible>(Response::new(Full::new(body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

async fn ocsp_post(url: &str, body: Bytes) -> Bytes {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = Request::post(url)
        .header("content-type", "application/ocsp-request")
        .body(Full::new(body))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    resp.into_body().collect().await.unwrap().to_bytes()
}

/// A static responder: every query gets `body`.
async fn serving(body: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Bytes::from(body);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| {
                    let body = body.clone();
                    async move { Ok::<_, Infallible>(Response::new(Full::new(body))) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

/// Under `soft`, an answer not taken lets the Leader through and is counted with
/// `reason`; under `hard` (when `hard_too`) it refuses with revocation_status_unknown.
/// Every such answer says `revoked`: taken, it would refuse with `revoked`.
async fn not_taken(pki: &Pki, cert: &Issued, reason: &str, hard_too: bool) {
    let partner = TestPartner::start(Behaviour::Echo).await;
    let body = rpc_start("1", LEADER_A, "t");
    let leader = Leader::new(pki, Some(cert), true);
    let soft = start_gateway(&config(pki, &partner, "soft")).await;
    let (mut conn, _) = leader.h2_connection(soft.addr).await;
    assert_eq!(send_on(&mut conn, "/p/rpc", &body).await.status, 200);
    wait_counter(&soft, &error_key(reason), 0.0).await;
    let r = send_on(&mut conn, "/p/rpc", &body).await;
    assert_eq!(r.status, 200, "{reason}: {}", r.text());
    assert_eq!(
        counter(&soft, &answers_key("revoked")).await,
        0.0,
        "{reason}"
    );
    if hard_too {
        let hard = start_gateway(&config(pki, &partner, "hard")).await;
        let r = leader.post(hard.addr, "/p/rpc", &body).await.unwrap();
        assert_eq!(
            r.error(),
            (-32010, "revocation_status_unknown".into()),
            "{reason}"
        );
        wait_counter(&hard, &error_key(reason), 0.0).await;
    }
}

/// A responder that takes connections and never answers.
async fn silent() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responder_answering_garbage_passes_under_soft_and_refuses_under_hard() {
    let pki = Pki::new();
    let garbage = serving(b"\x30\x03not an OCSP response".to_vec()).await;
    let cert = leader_cert(&pki, LEADER_A, SERIAL, &format!("http://{garbage}/ocsp"));
    not_taken(&pki, &cert, "malformed", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_responder_passes_under_soft_and_refuses_under_hard_within_the_timeout() {
    let pki = Pki::new();
    let slow = silent().await;
    let cert = leader_cert(&pki, LEADER_A, SERIAL, &format!("http://{slow}/ocsp"));
    not_taken(&pki, &cert, "timeout", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_for_another_serial_is_not_taken() {
    let pki = Pki::new();
    let signer = responder_cert(&pki.ca);
    let other = pki.issue(&CertSpec::leader_v2(LEADER_B));
    // The responder knows the other certificate as revoked; the proxy asks about it
    // whatever the gateway asked.
    let Some(responder) = Responder::start(&pki, &signer, &index_line(&other, true)) else {
        return;
    };
    let ask = aipgw::revocation::ocsp::wire::Subject::of(
        std::slice::from_ref(&other.cert_der),
        &[pki.ca.cert_der()],
        Some(&responder.url()),
    )
    .unwrap()
    .request;
    let proxy = answering_for(responder.url(), ask).await;
    let cert = leader_cert(&pki, LEADER_A, SERIAL, &format!("http://{proxy}/ocsp"));
    not_taken(&pki, &cert, "wrong_certificate", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_signed_by_an_undelegated_key_is_not_taken() {
    let pki = Pki::new();
    // A responder certificate with id-kp-OCSPSigning, but from another CA.
    let rogue = responder_cert(&DevCa::new("rogue CA").unwrap());
    let Some(mut responder) = Responder::start(&pki, &rogue, "") else {
        return;
    };
    let cert = leader_cert(&pki, LEADER_A, SERIAL, &responder.url());
    responder.serve(&index_line(&cert, true));
    not_taken(&pki, &cert, "undelegated", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_old_answer_is_not_taken() {
    // The python3 on PATH, or else the system's (where Debian's python3-cryptography
    // goes: `.ci/run` installs it when neither has the module).
    let check = ["-c", "import cryptography.x509.ocsp"];
    let Some(python) = ["python3", "/usr/bin/python3"].into_iter().find(|p| {
        Command::new(p)
            .args(check)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }) else {
        installed("python3", &check);
        return;
    };
    let pki = Pki::new();
    let cert = leader_cert(&pki, LEADER_A, SERIAL, "http://127.0.0.1:1/unused");
    // A genuine answer by the issuer, `revoked`, from two days ago: valid until
    // yesterday (plus five minutes' skew).
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    std::fs::write(path("leaf.pem"), &cert.cert_pem).unwrap();
    std::fs::write(path("ca.pem"), pki.ca.cert_pem()).unwrap();
    std::fs::write(path("ca.key"), pki.ca.key_pem()).unwrap();
    let script = r#"
import datetime, sys
from cryptography import x509
from cryptography.x509 import ocsp
from cryptography.hazmat.primitives import hashes, serialization
d = sys.argv[1]
leaf = x509.load_pem_x509_certificate(open(d + "/leaf.pem", "rb").read())
ca = x509.load_pem_x509_certificate(open(d + "/ca.pem", "rb").read())
key = serialization.load_pem_private_key(open(d + "/ca.key", "rb").read(), None)
now = datetime.datetime.now(datetime.timezone.utc)
b = ocsp.OCSPResponseBuilder().add_response(
    cert=leaf, issuer=ca, algorithm=hashes.SHA1(), cert_status=ocsp.OCSPCertStatus.REVOKED,
    this_update=now - datetime.timedelta(days=2), next_update=now - datetime.timedelta(days=1),
    revocation_time=now - datetime.timedelta(days=3), revocation_reason=None,
).responder_id(ocsp.OCSPResponderEncoding.HASH, ca)
open(d + "/old.der", "wb").write(b.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER))
"#;
    let ok = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(ok.success());
    let old = std::fs::read(path("old.der")).unwrap();
    let addr = serving(old).await;
    // The same serial and key, now naming the replaying responder.
    let mut spec = CertSpec::leader_v2(LEADER_A);
    spec.serial = Some(SERIAL);
    spec.ocsp_urls = vec![format!("http://{addr}/ocsp")];
    let cert2 = pki.issue(&spec);
    not_taken(&pki, &cert2, "stale", true).await;
}
