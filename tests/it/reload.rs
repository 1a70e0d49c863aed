//! Hot reload (issue 5, test 3): through file changes on disk, as an operator makes them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use aipgw::devcerts::CertSpec;
use time::{Duration, OffsetDateTime};

use crate::support::*;

/// Replaces a file atomically (write beside, then rename), as a careful operator does.
fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn reloads(gw: &TestGateway, result: &str) -> u64 {
    let text = gw.admin_get("/metrics").await.1;
    let key = format!("aipgw_config_reloads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

async fn wait_reloads(gw: &TestGateway, result: &str, at_least: u64) {
    let waited = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while reloads(gw, result).await < at_least {
            tokio::task::yield_now().await;
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

fn crl(pki: &Pki, revoked: &[u64]) -> String {
    let now = OffsetDateTime::now_utc();
    pki.ca
        .crl(revoked, now - Duration::hours(1), now + Duration::days(1))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crl_partner_and_invalid_config_changes() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let crl_path = pki.write("crl.pem", &crl(&pki, &[]));
    let base = partner_block("p", "/p", &partner.url(), "");
    let text = pki.config(&format!("crl = [\"{}\"]", crl_path.display()), &base);
    let path = pki.write("aipgw.toml", &text);
    let gw = start_gateway_from_file(&path).await;

    let mut spec = CertSpec::leader_v2(LEADER_A);
    spec.serial = Some(0xAB12);
    let cert = pki.issue(&spec);
    let leader = Leader::new(&pki, Some(&cert), true);
    let body = rpc_start("1", LEADER_A, "t");
    assert_eq!(
        leader.post(gw.addr, "/p/rpc", &body).await.unwrap().status,
        200
    );
    // A connection opened before the reload is judged by the new CRL too (issue 8).
    let stream = leader.connect(gw.addr).await.unwrap();
    let (mut old_conn, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);

    // 1. A new CRL revokes the Leader for new connections and open ones.
    replace_file(&crl_path, &crl(&pki, &[0xAB12]));
    wait_reloads(&gw, "ok", 1).await;
    let r = leader.post(gw.addr, "/p/rpc", &body).await.unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.error(), (-32010, "revoked".into()));
    let req = http::Request::post("https://localhost/p/rpc")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
        .unwrap();
    assert_eq!(old_conn.send_request(req).await.unwrap().status(), 401);

    // 2. A new Partner becomes routable.
    let ok_before = reloads(&gw, "ok").await;
    let b = pki.leader(LEADER_B, false);
    let added = format!("{base}{}", partner_block("q", "/q", &partner.url(), ""));
    replace_file(
        &path,
        &pki.config(&format!("crl = [\"{}\"]", crl_path.display()), &added),
    );
    wait_reloads(&gw, "ok", ok_before + 1).await;
    let r = b
        .post(gw.addr, "/q/rpc", &rpc_start("2", LEADER_B, "u"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    // 3. An invalid config is refused; the old one keeps serving.
    replace_file(&path, "[listener]\nbind = 5\n");
    wait_reloads(&gw, "failed", 1).await;
    let r = b
        .post(gw.addr, "/q/rpc", &rpc_start("3", LEADER_B, "u"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_lose_nothing() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let text = pki.config("", &partner_block("p", "/p", &partner.url(), ""));
    let path = pki.write("aipgw.toml", &text);
    let gw = start_gateway_from_file(&path).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut load = Vec::new();
    for worker in 0..4 {
        let leader = pki.leader(LEADER_A, worker % 2 == 0);
        let (stop, ok, failed, addr) = (stop.clone(), ok.clone(), failed.clone(), gw.addr);
        load.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                match leader
                    .post(addr, "/p/rpc", &rpc_start(&i.to_string(), LEADER_A, "t"))
                    .await
                {
                    Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for n in 1..=20 {
        // Each rewrite is a real change the watcher sees; every one must take effect.
        replace_file(&path, &format!("{text}\n# reload {n}\n"));
        wait_reloads(&gw, "ok", n).await;
    }
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during reloads"
    );
    assert!(
        ok.load(Ordering::Relaxed) >= 20,
        "too little load: {}",
        ok.load(Ordering::Relaxed)
    );
    // A write can occasionally reach the watcher as two bursts: at least 20 reloads.
    assert!(reloads(&gw, "ok").await >= 20);
    assert_eq!(reloads(&gw, "failed").await, 0);
}
