//! The README's demo: the committed config and development certificates, the demo
//! Partner behind the gateway (on free ports instead of the demo's fixed ones).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use aipgw::config::Config;
use aipgw::demo::{partner, DemoOptions, DemoPartner};
use aipgw::test_util::{load_certs, load_key};
use aipgw::Gateway;
use tokio::net::TcpListener;

use crate::support::*;

fn dev_leader(name: &str, h2: bool) -> Leader {
    let certs = Path::new(env!("CARGO_MANIFEST_DIR")).join("certs");
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(&certs.join("ca.pem")).unwrap() {
        roots.add(c).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(
        load_certs(&certs.join(format!("{name}.pem"))).unwrap(),
        load_key(&certs.join(format!("{name}.key"))).unwrap(),
    )
    .unwrap();
    cfg.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    Leader {
        tls: Arc::new(cfg),
        h2,
    }
}

/// The demo Partner (no pause between its events) on a free port.
pub(crate) async fn demo_partner() -> SocketAddr {
    let partner_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let paddr = partner_listener.local_addr().unwrap();
    tokio::spawn(partner::serve(
        partner_listener,
        DemoPartner::new(DemoOptions {
            event_interval: std::time::Duration::ZERO,
            ..DemoOptions::default()
        }),
        std::future::pending(),
    ));
    paddr
}

/// A gateway on a free port with the committed demo config (changed by `configure`), its
/// Partner at `partner`.
pub(crate) async fn demo_gateway(
    partner: SocketAddr,
    configure: impl FnOnce(&mut Config),
) -> SocketAddr {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/aipgw.toml");
    let mut config = Config::load(&path).expect("config/aipgw.toml must load");
    std::sync::Arc::make_mut(&mut config.partners[0]).upstreams =
        vec![format!("http://{partner}").parse().unwrap()];
    configure(&mut config);
    let gateway = Gateway::new(config).expect("dev certificates must load");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(aipgw::server::run(
        listener,
        gateway,
        std::future::pending(),
    ));
    addr
}

#[tokio::test]
async fn demo_config_and_dev_certificates_work_end_to_end() {
    let addr = demo_gateway(demo_partner().await, |_| {}).await;

    let v1 = dev_leader("leader-v1", false);
    let r = v1
        .post(
            addr,
            "/partners/demo/rpc",
            &rpc_start("\"1\"", LEADER_A, "task-1"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["result"]["status"]["state"], "awaiting-completion");
    assert!(v["result"]["products"][0]["dataItems"][0]["text"]
        .as_str()
        .unwrap()
        .contains(LEADER_A));
    let complete = rpc_start("\"2\"", LEADER_A, "task-1").replace("\"start\"", "\"complete\"");
    let r = v1
        .post(addr, "/partners/demo/rpc", &complete)
        .await
        .unwrap();
    assert_eq!(r.json()["result"]["status"]["state"], "completed");

    // The v2.1-profile Leader streams over HTTP/2: working, three chunks,
    // awaiting-completion; the stream stays open until the task is completed over rpc.
    let v2 = dev_leader("leader-v2", true);
    let body = rpc_start("\"s\"", LEADER_B, "task-2")
        .replace("\"method\":\"rpc\"", "\"method\":\"stream\"");
    let mut stream = v2
        .open_stream(addr, "/partners/demo/stream", &body, &[])
        .await;
    assert_eq!(stream.headers["content-type"], "text/event-stream");
    for n in 1..=5 {
        let ev = within(10, stream.next_event()).await.unwrap();
        assert_eq!(ev.seq(), Some(n));
        assert_eq!(ev.sse_id.as_deref(), Some(n.to_string().as_str()));
    }
    // The demo Partner has no re-stream: the gateway answers from its buffer.
    let restream = body
        .replace("\"start\"", "\"re-stream\"")
        .replace("\"id\":\"s\"", "\"id\":\"again\"")
        .replace(
            "\"sessionId\":\"s1\"",
            "\"sessionId\":\"s1\",\"commandParams\":{\"lastEventSeq\":3}",
        );
    let mut again = v2
        .open_stream(addr, "/partners/demo/stream", &restream, &[])
        .await;
    for n in 4..=5 {
        let ev = within(10, again.next_event()).await.unwrap();
        assert_eq!((ev.seq(), ev.json["id"].as_str()), (Some(n), Some("again")));
    }
    let complete = rpc_start("\"c\"", LEADER_B, "task-2").replace("\"start\"", "\"complete\"");
    let r = v2
        .post(addr, "/partners/demo/rpc", &complete)
        .await
        .unwrap();
    assert_eq!(r.json()["result"]["status"]["state"], "completed");
    for s in [&mut stream, &mut again] {
        let ev = within(10, s.next_event()).await.unwrap();
        assert_eq!(ev.seq(), Some(6));
        assert_eq!(
            ev.json["result"]["eventData"]["status"]["state"],
            "completed"
        );
        assert!(within(10, s.next_event()).await.is_none());
    }

    // A v2.1-profile Leader with a dotted AIC (leaf + intermediate) speaks AIP v02.01:
    // its TaskCommand in `params.command`, TaskResults and `task-status-update` events back.
    let dotted = dev_leader("leader-dotted", false);
    let aic = aipgw::devcerts::DEV_LEADER_DOTTED_AIC;
    let command = |id: &str, command: &str, task: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"rpc","id":"{id}","params":{{"command":{{"type":"task-command","id":"c-{id}","sentAt":"2026-01-01T00:00:00Z","senderRole":"leader","senderId":"{aic}","command":"{command}","taskId":"{task}","sessionId":"s2","dataItems":[{{"type":"text","text":"hello v2"}}]}}}}}}"#
        )
    };
    let r = dotted
        .post(
            addr,
            "/partners/demo/rpc",
            &command("v2-1", "start", "task-3"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["result"]["type"], "task-result", "{v}");
    assert_eq!(v["result"]["taskId"], "task-3");
    assert!(v["result"]["products"][0]["dataItems"][0]["text"]
        .as_str()
        .unwrap()
        .contains(aic));
    let body = command("v2-s", "start", "task-4")
        .replace("\"method\":\"rpc\"", "\"method\":\"stream\"")
        .replace("\"params\":{\"command\":", "\"params\":{\"message\":");
    let mut stream = dotted
        .open_stream(addr, "/partners/demo/stream", &body, &[])
        .await;
    let first = within(10, stream.next_event()).await.unwrap();
    assert_eq!(
        first.json["result"]["eventData"]["type"],
        "task-status-update"
    );
    let r = dotted
        .post(
            addr,
            "/partners/demo/rpc",
            &command("v2-c", "complete", "task-4"),
        )
        .await
        .unwrap();
    assert_eq!(r.json()["result"]["status"]["state"], "completed");
    let mut last = None;
    while let Some(ev) = within(10, stream.next_event()).await {
        last = Some(ev);
    }
    let last = last.unwrap();
    assert_eq!(
        last.json["result"]["eventData"]["status"]["state"],
        "completed"
    );
}
