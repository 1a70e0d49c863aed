//! A Partner embedding the request path (`examples/embedded_partner.rs`, its `serve`
//! run here as is) refuses what the gateway refuses, with the same codes and the id
//! echoed, and its handler sees only what passed.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;

use crate::support::*;

#[path = "../../examples/embedded_partner.rs"]
#[allow(dead_code)]
mod example;

/// A running embedded Partner; stopped on drop.
struct Embedded {
    addr: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start<H, RB>(pki: &Pki, extra: &str, handler: H) -> Embedded
where
    H: aipgw::layers::Handler<Response = Response<RB>>,
    RB: aipgw::layers::HandlerBody,
{
    let text = pki.config(
        "",
        &format!(
            "{extra}\n{}",
            partner_block("embedded", "/", "http://127.0.0.1:9", "")
        ),
    );
    let config = aipgw::config::Config::parse(&text, pki.dir.path()).unwrap();
    let gateway = aipgw::Gateway::new(config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(example::serve(listener, gateway, handler, async {
        let _ = stopped.await;
    }));
    Embedded { addr, _stop: stop }
}

/// The example's answer, counting the requests that reached it.
fn counted(
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<Bytes>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + Sync {
    tower::service_fn(move |req: Request<Bytes>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let caller = req
            .extensions()
            .get::<aipgw::layers::Caller>()
            .map(|c| c.0.aic.to_string())
            .unwrap_or_default();
        let sensitive = req
            .headers()
            .get("authorization")
            .is_some_and(|v| v.is_sensitive());
        let seen_aic = req
            .headers()
            .get("x-aip-client-aic")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let request: serde_json::Value = serde_json::from_slice(req.body()).unwrap();
        let answer = serde_json::json!({
            "jsonrpc": "2.0",
            "id": request["id"],
            "result": {"caller": caller, "header": seen_aic, "sensitive": sensitive},
        });
        async move { Ok(Response::new(Full::new(Bytes::from(answer.to_string())))) }
    })
}

#[tokio::test]
async fn an_embedded_partner_refuses_like_the_gateway_and_serves_the_rest() {
    let pki = Pki::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let partner = start(&pki, "", counted(calls.clone())).await;

    // The caller's own senderId: handed to the Partner's handler, with the verified
    // caller in its extensions and the gateway's identity header.
    let a = pki.leader(LEADER_A, false);
    let r = a
        .post_with(
            partner.addr,
            "/rpc",
            Bytes::from(rpc_start("7", LEADER_A, "t1")),
            &[("authorization", "Bearer secret")],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let json = r.json();
    assert_eq!(json["id"], 7);
    assert_eq!(json["result"]["caller"], LEADER_A);
    assert_eq!(json["result"]["header"], LEADER_A);
    assert_eq!(json["result"]["sensitive"], true);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Another AIC's senderId: -32009, the id echoed, the handler not called.
    let r = a
        .post(partner.addr, "/rpc", &rpc_start("8", LEADER_B, "t2"))
        .await
        .unwrap();
    assert_eq!(r.error(), (-32009, "sender_mismatch".into()));
    assert_eq!(r.json()["id"], 8);

    // No certificate: -32008, the id echoed.
    let anonymous = Leader::new(&pki, None, false);
    let r = anonymous
        .post(partner.addr, "/rpc", &rpc_start("9", LEADER_A, "t3"))
        .await
        .unwrap();
    assert_eq!(r.error(), (-32008, "no_client_certificate".into()));
    assert_eq!(r.json()["id"], 9);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_embedded_partner_applies_its_config_block_list_and_access_rules() {
    let pki = Pki::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let extra = format!("[policy]\nblocked = [\"{LEADER_B}\"]\n");
    let partner = start(&pki, &extra, counted(calls.clone())).await;
    let b = pki.leader(LEADER_B, true);
    let r = b
        .post(partner.addr, "/rpc", &rpc_start("\"x\"", LEADER_B, "t"))
        .await
        .unwrap();
    assert_eq!(r.error(), (-32010, "blocked".into()));
    assert_eq!(r.json()["id"], "x");
    let a = pki.leader(LEADER_A, true);
    let r = a
        .post(partner.addr, "/rpc", &rpc_start("2", LEADER_A, "t"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_panicking_handler_is_answered_with_the_id_and_the_partner_keeps_serving() {
    let pki = Pki::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let handler = tower::service_fn(move |req: Request<Bytes>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        let first = n == 0;
        async move {
            if first {
                panic!("the Partner's handler failed");
            }
            let request: serde_json::Value = serde_json::from_slice(req.body()).unwrap();
            let answer = serde_json::json!({"jsonrpc": "2.0", "id": request["id"], "result": {}});
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(answer.to_string()))))
        }
    });
    let partner = start(&pki, "", handler).await;
    let a = pki.leader(LEADER_A, true);
    let (mut conn, _) = a.h2_connection(partner.addr).await;
    let r = send_on(&mut conn, "/rpc", &rpc_start("41", LEADER_A, "t1")).await;
    assert_eq!(r.error(), (-32603, "panic".into()));
    assert_eq!(r.json()["id"], 41);
    // The same connection serves the next request.
    let r = send_on(&mut conn, "/rpc", &rpc_start("42", LEADER_A, "t2")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], 42);
}
