//! Tests 5 and 6: https Partners with mutual TLS and AIC pinning; Partner down -> 502,
//! Partner too slow -> 504, each a JSON-RPC error within the timeouts.

use aipgw::devcerts::CertSpec;

use crate::support::*;

async fn mtls_setup(pinned_aic: &str) -> (Pki, TestPartner, TestGateway) {
    let pki = Pki::new();
    let server = pki.issue(&CertSpec::partner_server(
        PARTNER_AIC,
        &["localhost", "127.0.0.1"],
    ));
    let partner = TestPartner::start_with(Behaviour::Echo, Some(partner_tls(&pki, &server))).await;
    let client = pki.issue(&CertSpec::leader_v2(GATEWAY_AIC));
    let (cert, key) = pki.write_pair("gw-client", &client);
    let tls = format!(
        "aic = \"{pinned_aic}\"\n[partner.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"",
        pki.ca_pem.display(),
        cert.display(),
        key.display()
    );
    let gw = start_gateway(&pki.config(
        "",
        &partner_block(
            "secure",
            "/s",
            &format!("https://localhost:{}", partner.addr.port()),
            &tls,
        ),
    ))
    .await;
    (pki, partner, gw)
}

#[tokio::test]
async fn https_partner_with_mutual_tls() {
    let (pki, partner, gw) = mtls_setup(PARTNER_AIC).await;
    let leader = pki.leader(LEADER_A, false);
    let body = rpc_start("1", LEADER_A, "t");
    let r = leader.post(gw.addr, "/s/rpc", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = partner.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, body.as_bytes());
    // The Partner saw the gateway's own client certificate.
    assert_eq!(seen[0].tls_client_aic.as_deref(), Some(GATEWAY_AIC));
    assert_eq!(seen[0].headers["x-aip-client-aic"], LEADER_A);
}

#[tokio::test]
async fn https_partner_with_the_wrong_aic_is_refused() {
    let (pki, partner, gw) = mtls_setup(LEADER_B).await;
    let leader = pki.leader(LEADER_A, false);
    let r = leader
        .post(gw.addr, "/s/rpc", &rpc_start("\"x\"", LEADER_A, "t"))
        .await
        .unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error(), (-32603, "upstream_tls".into()), "{}", r.text());
    assert!(r.text().contains(LEADER_B), "{}", r.text());
    assert_eq!(r.json()["id"], "x");
    assert!(partner.seen().is_empty());
}

#[tokio::test]
async fn partner_down_is_502() {
    let pki = Pki::new();
    // A port that was free a moment ago: nothing listens there.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let gw = start_gateway(&pki.config(
        "",
        &partner_block("gone", "/g", &format!("http://127.0.0.1:{port}"), ""),
    ))
    .await;
    let leader = pki.leader(LEADER_A, true);
    // connect_timeout is 2s in the test config; a refused connection must not wait for it.
    let r = within(
        5,
        leader.post(gw.addr, "/g/rpc", &rpc_start("5", LEADER_A, "t")),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 502);
    assert_eq!(r.error(), (-32603, "upstream_unavailable".into()));
    assert_eq!(r.json()["id"], 5);
    assert_eq!(r.json()["error"]["data"]["partner"], "gone");
}

#[tokio::test]
async fn slow_partner_is_504() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Hang).await;
    let config = pki
        .config("", &partner_block("slow", "/slow", &partner.url(), ""))
        .replace("response_timeout = \"5s\"", "response_timeout = \"300ms\"");
    let gw = start_gateway(&config).await;
    let leader = pki.leader(LEADER_A, false);
    let r = within(
        5,
        leader.post(gw.addr, "/slow/rpc", &rpc_start("6", LEADER_A, "t")),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 504);
    assert_eq!(r.error(), (-32603, "upstream_timeout".into()));
    assert_eq!(partner.seen().len(), 1);
}

/// Issue 13: with `http2 = true` the gateway speaks HTTP/2 to an `http://` Partner (prior
/// knowledge), and concurrent requests share one Partner connection per worker thread
/// instead of taking one each (a descriptor and its buffers per open stream).
#[tokio::test]
async fn http2_partner_shares_one_connection() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let versions: Arc<Mutex<Vec<http::Version>>> = Arc::default();
    let (acc, seen) = (accepted.clone(), versions.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            acc.fetch_add(1, Ordering::SeqCst);
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: http::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            seen.lock().unwrap().push(req.version());
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                            // Held long enough for every request to be in flight at once.
                            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                            let answer = format!(
                                r#"{{"jsonrpc":"2.0","id":{},"result":{{"type":"task","status":{{"state":"completed"}}}}}}"#,
                                v["id"]
                            );
                            Ok::<_, std::convert::Infallible>(
                                http::Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(bytes::Bytes::from(answer)))
                                    .unwrap(),
                            )
                        }
                    },
                );
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    let pki = Pki::new();
    let gw = start_gateway(&pki.config(
        "",
        &partner_block("h2", "/h2", &format!("http://{addr}"), "http2 = true"),
    ))
    .await;
    let leader = pki.leader(LEADER_A, true);
    let replies = futures_util::future::join_all((0..20).map(|i| {
        let leader = &leader;
        let gw = &gw;
        async move {
            leader
                .post(
                    gw.addr,
                    "/h2/rpc",
                    &rpc_start(&i.to_string(), LEADER_A, &format!("t{i}")),
                )
                .await
                .unwrap()
        }
    }))
    .await;
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["id"], i);
    }
    assert_eq!(versions.lock().unwrap().len(), 20);
    assert!(versions
        .lock()
        .unwrap()
        .iter()
        .all(|v| *v == http::Version::HTTP_2));
    // One Partner connection per worker thread (the test gateway runs two), not one
    // per request.
    let conns = accepted.load(Ordering::SeqCst);
    assert!((1..=2).contains(&conns), "{conns} Partner connections");
}
