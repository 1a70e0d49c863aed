//! Issue 31, item 1: CRLs fetched from a URL and kept current while the gateway runs. The
//! CRL server is a tiny hyper server on loopback whose answer the test changes; every
//! wait is on a metric or a refused request, within a deadline.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use aipgw::devcerts::{CertSpec, DevCa, Issued};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use time::{Duration, OffsetDateTime};
use tokio::net::TcpListener;

use crate::support::*;

/// A CRL server: serves whatever body it holds (with an ETag, and `304` to a request
/// that names it), until stopped.
pub(crate) struct CrlServer {
    addr: SocketAddr,
    body: Arc<Mutex<Bytes>>,
    task: tokio::task::JoinHandle<()>,
}

impl CrlServer {
    pub(crate) async fn start(body: impl Into<Bytes>) -> CrlServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let body = Arc::new(Mutex::new(body.into()));
        let held = body.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let held = held.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let body = held.lock().unwrap().clone();
                        async move { Ok::<_, Infallible>(answer(&req, body)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        CrlServer { addr, body, task }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/acps-atr-v2/crl/current", self.addr)
    }

    pub(crate) fn serve(&self, body: impl Into<Bytes>) {
        *self.body.lock().unwrap() = body.into();
    }

    /// Stops accepting: the port is closed.
    async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

fn answer(req: &Request<Incoming>, body: Bytes) -> Response<Full<Bytes>> {
    let etag = format!(
        "\"{}\"",
        aipgw::identity::sha256_hex(&body).get(..16).unwrap_or("")
    );
    let named = req
        .headers()
        .get(http::header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == etag.as_bytes());
    let mut resp = Response::builder().header(http::header::ETAG, &etag);
    if named {
        resp = resp.status(StatusCode::NOT_MODIFIED);
        return resp.body(Full::new(Bytes::new())).unwrap();
    }
    resp.header("content-type", "application/pkix-crl")
        .body(Full::new(body))
        .unwrap()
}

/// A CRL of `ca` revoking `serials`, issued now (a second later than the last one, so a
/// newer CRL is never taken for a replay), valid for a day.
pub(crate) fn crl(ca: &DevCa, serials: &[u64]) -> String {
    let now = OffsetDateTime::now_utc();
    ca.crl(serials, now, now + Duration::days(1)).unwrap()
}

fn issue(pki: &Pki, aic: &str, serial: u64) -> Issued {
    let mut spec = CertSpec::leader_v2(aic);
    spec.serial = Some(serial);
    pki.issue(&spec)
}

/// The gateway's config: one Partner, CRLs fetched from `url` (refreshed every 200 ms).
fn config(pki: &Pki, partner: &TestPartner, url: &str, extra: &str) -> String {
    let revocation = format!(
        "[revocation]\ncrl_urls = [\"{url}\"]\nrefresh_interval = \"200ms\"\nretry_interval = \"50ms\"\nfetch_timeout = \"2s\"\n{extra}\n"
    );
    pki.config(
        "",
        &format!(
            "{revocation}{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    )
}

/// `aipgw_crl_fetches_total{source,result}` as the admin listener shows it.
pub(crate) async fn fetches(gw: &TestGateway, url: &str, result: &str) -> f64 {
    let m = parse_metrics(&gw.admin_get("/metrics").await.1);
    let key = format!("aipgw_crl_fetches_total{{source=\"{url}\",result=\"{result}\"}}");
    m.get(&key).copied().unwrap_or(0.0)
}

/// Waits (10 s at most) until `result` has been counted more than `after` times.
pub(crate) async fn wait_fetches(gw: &TestGateway, url: &str, result: &str, after: f64) {
    within(10, async {
        while fetches(gw, url, result).await <= after {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetched_crl_revokes_a_leader_on_its_open_http2_connection() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let server = CrlServer::start(crl(&pki.ca, &[])).await;
    let url = server.url();
    let gw = start_gateway(&config(&pki, &partner, &url, "")).await;
    wait_fetches(&gw, &url, "ok", 0.0).await;

    let leader = Leader::new(&pki, Some(&issue(&pki, LEADER_A, 0xC0FFEE)), true);
    let (mut conn, _) = leader.h2_connection(gw.addr).await;
    let body = rpc_start("1", LEADER_A, "t");
    assert_eq!(send_on(&mut conn, "/p/rpc", &body).await.status, 200);
    // Unchanged CRLs are asked for with their ETag and answered 304.
    wait_fetches(&gw, &url, "not_modified", 0.0).await;

    // The CA revokes the Leader: its next request on the same connection is refused
    // within the refresh bound.
    server.serve(crl(&pki.ca, &[0xC0FFEE]));
    let r = refused_on(&mut conn, &body).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.error(), (-32010, "revoked".into()));
    // A new connection too.
    let r = leader.post(gw.addr, "/p/rpc", &body).await.unwrap();
    assert_eq!(r.error(), (-32010, "revoked".into()));

    let m = parse_metrics(&gw.admin_get("/metrics").await.1);
    let src = format!("{{source=\"{url}\"}}");
    assert_eq!(m[&format!("aipgw_crl_last_fetch_success{src}")], 1.0);
    assert!(m[&format!("aipgw_crl_bytes{src}")] > 0.0);
    let next = m[&format!("aipgw_crl_next_update_timestamp_seconds{src}")];
    let day = OffsetDateTime::now_utc().unix_timestamp() as f64 + 86400.0;
    assert!((next - day).abs() < 60.0, "nextUpdate {next}");
    assert!(m[&format!("aipgw_crl_age_seconds{src}")] < 60.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_foreign_or_missing_crl_leaves_the_last_good_one() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let good = crl(&pki.ca, &[0xA1]);
    let server = CrlServer::start(good.clone()).await;
    let url = server.url();
    let max = good.len() + 100;
    let gw = start_gateway(&config(
        &pki,
        &partner,
        &url,
        &format!("max_crl_bytes = {max}"),
    ))
    .await;
    wait_fetches(&gw, &url, "ok", 0.0).await;

    let revoked = Leader::new(&pki, Some(&issue(&pki, LEADER_A, 0xA1)), true);
    let fine = Leader::new(&pki, Some(&issue(&pki, LEADER_B, 0xB2)), true);
    // A refused connection is closed after its answer: the revoked Leader connects anew
    // each time; the other keeps one HTTP/2 connection open throughout.
    let (mut fine_conn, _) = fine.h2_connection(gw.addr).await;
    let (a, b) = (rpc_start("1", LEADER_A, "t"), rpc_start("2", LEADER_B, "u"));
    let expect = |revoked: Reply, fine: Reply, after: &str| {
        assert_eq!(
            revoked.error(),
            (-32010, "revoked".into()),
            "after {after}: the last good CRL still revokes"
        );
        assert_eq!(fine.status, 200, "after {after}: {}", fine.text());
    };
    expect(
        revoked.post(gw.addr, "/p/rpc", &a).await.unwrap(),
        send_on(&mut fine_conn, "/p/rpc", &b).await,
        "the first fetch",
    );

    // 1. Too large: a CRL revoking nothing, padded past the bound.
    let mut big = crl(&pki.ca, &[]).into_bytes();
    big.resize(max + 1, b'\n');
    server.serve(big);
    wait_fetches(&gw, &url, "too_large", 0.0).await;
    expect(
        revoked.post(gw.addr, "/p/rpc", &a).await.unwrap(),
        send_on(&mut fine_conn, "/p/rpc", &b).await,
        "an oversized body",
    );

    // 2. Signed by another CA of the same name (it names the issuer, not its key), and
    //    by a CA the gateway does not trust at all.
    let twin = DevCa::new("test CA").unwrap();
    server.serve(crl(&twin, &[]));
    wait_fetches(&gw, &url, "bad_signature", 0.0).await;
    expect(
        revoked.post(gw.addr, "/p/rpc", &a).await.unwrap(),
        send_on(&mut fine_conn, "/p/rpc", &b).await,
        "a CRL signed by another key",
    );
    server.serve(crl(&DevCa::new("another CA").unwrap(), &[]));
    wait_fetches(&gw, &url, "unknown_issuer", 0.0).await;

    // 3. The server goes down.
    let before = fetches(&gw, &url, "unreachable").await;
    server.stop().await;
    wait_fetches(&gw, &url, "unreachable", before).await;
    expect(
        revoked.post(gw.addr, "/p/rpc", &a).await.unwrap(),
        send_on(&mut fine_conn, "/p/rpc", &b).await,
        "the server went down",
    );
    let m = parse_metrics(&gw.admin_get("/metrics").await.1);
    assert_eq!(
        m[&format!("aipgw_crl_last_fetch_success{{source=\"{url}\"}}")],
        0.0
    );
    assert_eq!(fine.post(gw.addr, "/p/rpc", &b).await.unwrap().status, 200);
}

/// A Leader certificate for `aic` with `serial`, naming `urls` as its CRL Distribution
/// Points.
fn issue_with_cdp(pki: &Pki, aic: &str, serial: u64, urls: &[String]) -> Issued {
    let mut spec = CertSpec::leader_v2(aic);
    spec.serial = Some(serial);
    spec.crl_distribution_points = urls.to_vec();
    pki.issue(&spec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_is_cut_off_through_its_own_certificates_distribution_point() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let server = CrlServer::start(crl(&pki.ca, &[])).await;
    let url = server.url();
    // No crl_urls: the only source is the one the Leader's certificate names.
    let revocation = "[revocation]\ncrl_from_presented = true\nmax_presented_crl_urls = 2\n\
                      refresh_interval = \"200ms\"\nretry_interval = \"50ms\"\nfetch_timeout = \"2s\"\n";
    let cfg = pki.config(
        "",
        &format!(
            "{revocation}{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    );
    let gw = start_gateway(&cfg).await;

    let cert = issue_with_cdp(&pki, LEADER_A, 0xCD9, std::slice::from_ref(&url));
    let leader = Leader::new(&pki, Some(&cert), true);
    let (mut conn, _) = leader.h2_connection(gw.addr).await;
    let body = rpc_start("1", LEADER_A, "t");
    assert_eq!(send_on(&mut conn, "/p/rpc", &body).await.status, 200);
    // The distribution point is fetched in the background after the first request.
    wait_fetches(&gw, &url, "ok", 0.0).await;
    assert_eq!(send_on(&mut conn, "/p/rpc", &body).await.status, 200);

    // The CA revokes the Leader there: its next request on the open connection is
    // refused within the refresh bound.
    server.serve(crl(&pki.ca, &[0xCD9]));
    let r = refused_on(&mut conn, &body).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.error(), (-32010, "revoked".into()));

    // Another Leader names three distribution points: the one already followed, and two
    // new ones; the bound (2) lets one in and counts the other, never fetched.
    let second = format!("{url}?second");
    let third = format!("{url}?third");
    let other = issue_with_cdp(
        &pki,
        LEADER_B,
        0xB0B,
        &[url.clone(), second.clone(), third.clone()],
    );
    let b = Leader::new(&pki, Some(&other), true);
    let r = b
        .post(gw.addr, "/p/rpc", &rpc_start("2", LEADER_B, "u"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let refused = "aipgw_crl_presented_refused_total";
    within(10, async {
        while parse_metrics(&gw.admin_get("/metrics").await.1)
            .get(refused)
            .copied()
            .unwrap_or(0.0)
            < 1.0
        {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    wait_fetches(&gw, &second, "ok", 0.0).await;
    let m = parse_metrics(&gw.admin_get("/metrics").await.1);
    assert_eq!(m[refused], 1.0);
    assert_eq!(m["aipgw_crl_presented_urls"], 2.0);
    assert!(
        !m.keys().any(|k| k.contains(&third)),
        "the URL past the bound is never fetched"
    );
}
