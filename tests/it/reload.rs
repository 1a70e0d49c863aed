//! Hot reload (issue 5, test 3): through file changes on disk, as an operator makes them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use aipgw::devcerts::CertSpec;
use time::{Duration, OffsetDateTime};

use crate::support::*;

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
    let (mut old_conn, _) = leader.h2_connection(gw.addr).await;

    // 1. A new CRL revokes the Leader for new connections and open ones.
    replace_file(&crl_path, &crl(&pki, &[0xAB12]));
    wait_reloads(&gw, "ok", 1).await;
    let r = leader.post(gw.addr, "/p/rpc", &body).await.unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.error(), (-32010, "revoked".into()));
    assert_eq!(send_on(&mut old_conn, "/p/rpc", &body).await.status, 401);

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
