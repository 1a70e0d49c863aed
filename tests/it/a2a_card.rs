//! A2A agent cards (`[partner.a2a.card]`): `GET {prefix}/.well-known/agent-card.json` is
//! answered by the gateway with the agent's card, its endpoint URLs pointing at the
//! gateway and mutual TLS declared; a signed card is served unchanged; the card is cached,
//! refreshed, bounded in size; an agent that cannot be reached is a 502 JSON error, or
//! the last card while it is within `max_stale`. The caller's identity and the access
//! rules come first.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use aipgw::devcerts::CertSpec;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::a2a::a2a_error;
use crate::support::*;

/// An agent serving its card at both well-known paths (and answering JSON-RPC POSTs);
/// `stop` closes its listener and every connection.
struct CardAgent {
    addr: SocketAddr,
    card: Arc<Mutex<String>>,
    hits: Arc<Mutex<Vec<String>>>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl CardAgent {
    async fn start(card: String) -> CardAgent {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let card = Arc::new(Mutex::new(card));
        let hits = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (card2, hits2) = (card.clone(), hits.clone());
        tokio::spawn(async move {
            let mut stopping = stopped.clone();
            loop {
                let tcp = tokio::select! {
                    r = listener.accept() => r.unwrap().0,
                    _ = stopping.changed() => return,
                };
                let (card, hits, mut stopped) = (card2.clone(), hits2.clone(), stopped.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (card, hits) = (card.clone(), hits.clone());
                        async move {
                            let path = req.uri().path().to_owned();
                            hits.lock()
                                .unwrap()
                                .push(format!("{} {path}", req.method()));
                            let body = if req.method() == http::Method::GET {
                                card.lock().unwrap().clone()
                            } else {
                                r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.to_owned()
                            };
                            let mut r = Response::new(Full::new(Bytes::from(body)));
                            r.headers_mut()
                                .insert("content-type", "application/json".parse().unwrap());
                            Ok::<_, Infallible>(r)
                        }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let conn = builder.serve_connection(TokioIo::new(tcp), svc);
                    tokio::select! {
                        _ = conn => {}
                        _ = stopped.changed() => {}
                    }
                });
            }
        });
        CardAgent {
            addr,
            card,
            hits,
            stop,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn card_fetches(&self) -> usize {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.starts_with("GET"))
            .count()
    }
}

/// A card as the Python SDK serves it: 1.0 fields and the 0.3 ones for older clients.
fn sdk_card(name: &str, agent: &str) -> String {
    json!({
        "name": name,
        "description": "test agent",
        "version": "1.0.0",
        "documentationUrl": "https://agent.example/docs",
        "supportedInterfaces": [
            {"url": format!("{agent}/"), "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": "127.0.0.1:50051", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
            {"url": format!("{agent}/"), "protocolBinding": "JSONRPC", "protocolVersion": "0.3"}
        ],
        "capabilities": {"streaming": true},
        "defaultInputModes": ["text"], "defaultOutputModes": ["text"], "skills": [],
        "url": format!("{agent}/"),
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3.0",
        "additionalInterfaces": [{"url": "127.0.0.1:50051", "transport": "GRPC"}]
    })
    .to_string()
}

/// A gateway in front of `agent` at `/a2a/agent`, with `card` as the
/// `[partner.a2a.card]` lines and `extra` as more `[[partner]]` lines.
async fn gateway_for(pki: &Pki, agent: &str, card: &str, extra: &str) -> TestGateway {
    let lines = format!("protocol = \"a2a\"\n{extra}\n[partner.a2a.card]\n{card}\n");
    start_gateway(&pki.config("", &partner_block("agent", "/a2a/agent", agent, &lines))).await
}

/// A GET over TLS as `leader`, naming the gateway as `localhost:<port>`.
async fn get(leader: &Leader, addr: SocketAddr, path: &str) -> Reply {
    let stream = leader.connect(addr).await.unwrap();
    let io = TokioIo::new(stream);
    let authority = format!("localhost:{}", addr.port());
    let req = if leader.h2 {
        Request::get(format!("https://{authority}{path}"))
    } else {
        Request::get(path).header("host", &authority)
    };
    let req = req.body(Full::new(Bytes::new())).unwrap();
    let resp = if leader.h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    let (parts, body) = resp.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

const CARD: &str = "/a2a/agent/.well-known/agent-card.json";
const SCHEME: &str = "aipgwMutualTls";

#[tokio::test]
async fn the_card_points_at_the_gateway_and_declares_mutual_tls() {
    let pki = Pki::new();
    let agent = CardAgent::start(String::new()).await;
    *agent.card.lock().unwrap() = sdk_card("agent", &agent.url());
    let gw = gateway_for(&pki, &agent.url(), "", "").await;
    let me = format!("https://localhost:{}/a2a/agent", gw.addr.port());
    for h2 in [false, true] {
        for path in [CARD, "/a2a/agent/.well-known/agent.json"] {
            let reply = get(&pki.leader(LEADER_A, h2), gw.addr, path).await;
            assert_eq!(reply.status, 200, "{path}: {}", reply.text());
            assert_eq!(reply.headers["content-type"], "application/json");
            assert_eq!(reply.headers["x-aipgw-card"], "fresh");
            let card = reply.json();
            assert_eq!(card["url"], me.as_str());
            let ifaces = card["supportedInterfaces"].as_array().unwrap();
            assert_eq!(ifaces.len(), 2, "the gRPC interface is dropped: {card}");
            assert!(ifaces.iter().all(|i| i["url"] == me.as_str()), "{card}");
            assert_eq!(card["additionalInterfaces"], json!([]));
            assert_eq!(card["documentationUrl"], "https://agent.example/docs");
            let scheme = &card["securitySchemes"][SCHEME];
            assert!(
                scheme["mtlsSecurityScheme"]["description"].is_string(),
                "{card}"
            );
            assert_eq!(scheme["type"], "mutualTLS");
            assert_eq!(
                card["securityRequirements"],
                json!([{"schemes": {SCHEME: {"list": []}}}])
            );
            assert_eq!(card["security"], json!([{SCHEME: []}]));
            assert!(!reply.text().contains(&agent.addr.to_string()), "{card}");
        }
    }
    // Cached: one fetch per well-known path, whatever the number of callers.
    assert_eq!(
        *agent.hits.lock().unwrap(),
        [
            "GET /.well-known/agent-card.json",
            "GET /.well-known/agent.json"
        ]
    );

    // `public_url` names the gateway whatever the Host.
    let gw = gateway_for(
        &pki,
        &agent.url(),
        "public_url = \"https://agents.example.com/team/x/\"",
        "",
    )
    .await;
    let card = get(&pki.leader(LEADER_B, false), gw.addr, CARD)
        .await
        .json();
    assert_eq!(card["url"], "https://agents.example.com/team/x");
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        "https://agents.example.com/team/x"
    );
}

#[tokio::test]
async fn a_signed_card_is_served_unchanged() {
    let pki = Pki::new();
    let agent = CardAgent::start(String::new()).await;
    let signed = json!({
        "name": "signed", "url": format!("{}/", agent.url()),
        "supportedInterfaces": [{"url": format!("{}/", agent.url()), "protocolBinding": "JSONRPC"}],
        "signatures": [{"protected": "eyJhbGciOiJFUzI1NiJ9", "signature": "c2ln"}]
    })
    .to_string();
    *agent.card.lock().unwrap() = signed.clone();
    let gw = gateway_for(&pki, &agent.url(), "", "").await;
    let reply = get(&pki.leader(LEADER_A, true), gw.addr, CARD).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["x-aipgw-card"], "signed");
    assert_eq!(
        reply.body,
        signed.as_bytes(),
        "a signed card must not change"
    );
}

#[tokio::test]
async fn the_card_is_cached_then_refreshed() {
    let pki = Pki::new();
    let agent = CardAgent::start(String::new()).await;
    *agent.card.lock().unwrap() = sdk_card("v1", &agent.url());
    let gw = gateway_for(&pki, &agent.url(), "refresh = \"200ms\"", "").await;
    let leader = pki.leader(LEADER_A, false);
    assert_eq!(get(&leader, gw.addr, CARD).await.json()["name"], "v1");
    *agent.card.lock().unwrap() = sdk_card("v2", &agent.url());
    // The agent's new card is served once the old one is `refresh` old.
    within(10, async {
        while get(&leader, gw.addr, CARD).await.json()["name"] != "v2" {}
    })
    .await;
    assert!(agent.card_fetches() >= 2);
}

#[tokio::test]
async fn a_card_larger_than_max_bytes_is_a_502() {
    let pki = Pki::new();
    let agent = CardAgent::start(String::new()).await;
    let mut card: Value = serde_json::from_str(&sdk_card("big", &agent.url())).unwrap();
    card["description"] = Value::from("x".repeat(4096));
    *agent.card.lock().unwrap() = card.to_string();
    let gw = gateway_for(&pki, &agent.url(), "max_bytes = 1024", "").await;
    let reply = get(&pki.leader(LEADER_A, false), gw.addr, CARD).await;
    assert_eq!(
        a2a_error(&reply),
        (502, -32603, "upstream_bad_response".into()),
        "{}",
        reply.text()
    );
    assert!(reply.text().contains("max_bytes"), "{}", reply.text());
}

#[tokio::test]
async fn an_agent_that_cannot_be_reached() {
    let pki = Pki::new();
    // Never reached: a 502 naming the Partner.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let gw = gateway_for(&pki, &url, "", "").await;
    let reply = get(&pki.leader(LEADER_A, false), gw.addr, CARD).await;
    assert_eq!(
        a2a_error(&reply),
        (502, -32603, "upstream_unavailable".into()),
        "{}",
        reply.text()
    );
    assert_eq!(
        reply.json()["error"]["data"][0]["metadata"]["partner"],
        "agent"
    );

    // Reached once, then gone: the last card while it is within `max_stale`, then 502.
    let agent = CardAgent::start(String::new()).await;
    *agent.card.lock().unwrap() = sdk_card("kept", &agent.url());
    let stale_ok = gateway_for(&pki, &agent.url(), "refresh = \"100ms\"", "").await;
    let no_stale = gateway_for(
        &pki,
        &agent.url(),
        "refresh = \"100ms\"\nmax_stale = \"0s\"",
        "",
    )
    .await;
    let leader = pki.leader(LEADER_A, true);
    for gw in [&stale_ok, &no_stale] {
        assert_eq!(get(&leader, gw.addr, CARD).await.status, 200);
    }
    agent.stop.send(true).unwrap();
    let stale = within(10, async {
        loop {
            let r = get(&leader, stale_ok.addr, CARD).await;
            if r.headers.get("x-aipgw-card").is_some_and(|v| v == "stale") {
                return r;
            }
        }
    })
    .await;
    assert_eq!(stale.status, 200);
    assert_eq!(stale.json()["name"], "kept");
    let gone = within(10, async {
        loop {
            let r = get(&leader, no_stale.addr, CARD).await;
            if r.status != StatusCode::OK {
                return r;
            }
        }
    })
    .await;
    assert_eq!(
        a2a_error(&gone),
        (502, -32603, "upstream_unavailable".into()),
        "{}",
        gone.text()
    );
}

/// Identity first: no certificate is 401, a caller the access rules refuse 403;
/// only GET on the well-known paths is let through, everything else stays POST-only.
#[tokio::test]
async fn identity_and_access_rules_come_first() {
    let pki = Pki::new();
    let agent = CardAgent::start(String::new()).await;
    *agent.card.lock().unwrap() = sdk_card("agent", &agent.url());
    let aip = TestPartner::start(Behaviour::Echo).await;
    let access = format!("[partner.access]\ndeny = [\"{LEADER_B}\"]");
    let lines = format!("protocol = \"a2a\"\n{access}\n");
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "{}{}",
            partner_block("agent", "/a2a/agent", &agent.url(), &lines),
            partner_block("aip", "/partners/aip", &aip.url(), "")
        ),
    ))
    .await;
    let anonymous = Leader::new(&pki, None, false);
    let reply = get(&anonymous, gw.addr, CARD).await;
    // In A2A's terms, as every refusal on an A2A Partner's route (never AIP's -32008).
    assert_eq!(
        a2a_error(&reply),
        (401, -32000, "no_client_certificate".into())
    );
    let reply = get(&pki.leader(LEADER_B, false), gw.addr, CARD).await;
    assert_eq!(a2a_error(&reply), (403, -32000, "aic_denied".into()));
    assert_eq!(
        agent.card_fetches(),
        0,
        "nothing fetched for refused callers"
    );
    let leader = pki.leader(LEADER_A, false);
    for path in [
        "/a2a/agent",
        "/a2a/agent/.well-known/other.json",
        "/partners/aip/.well-known/agent-card.json",
    ] {
        let reply = get(&leader, gw.addr, path).await;
        assert_eq!(reply.status, 405, "{path}: {}", reply.text());
    }
    let v1 = pki.issue(&CertSpec::leader_v1(LEADER_A, "acps.pub"));
    let reply = Leader::new(&pki, Some(&v1), false)
        .post(
            gw.addr,
            CARD,
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}",
        )
        .await
        .unwrap();
    assert_eq!(
        reply.status,
        404,
        "a POST to the card path: {}",
        reply.text()
    );
    assert_eq!(get(&leader, gw.addr, CARD).await.status, 200);
}

/// The A2A Python SDK version the test pins (its card builder and card resolver).
const A2A_SDK: &str = "a2a-sdk[http-server]==1.3.0";

/// `card URL`: the card the SDK's server serves for an agent at URL (as its well-known
/// route writes it, 1.0 fields and the 0.3 ones). `resolve BASE`: the SDK's card resolver
/// reads the card at BASE over mutual TLS (CA, CERT, KEY), as 1.0 (`v1`), and the same
/// bytes as the 0.3 compat model (`v03`).
const SDK_SCRIPT: &str = r#"
import asyncio, json, os, ssl, sys

def make_card(agent_url):
    from a2a.types.a2a_pb2 import AgentCard, AgentInterface, AgentCapabilities, AgentSkill
    from a2a.server.request_handlers.response_helpers import agent_card_to_dict
    card = AgentCard(
        name="sdk-agent", description="an agent built on the SDK", version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=agent_url, protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=agent_url, protocol_binding="JSONRPC", protocol_version="0.3"),
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text"], default_output_modes=["text"],
        skills=[AgentSkill(id="echo", name="echo", description="echoes", tags=["test"])],
    )
    print(json.dumps(agent_card_to_dict(card)), flush=True)

async def resolve(base):
    import httpx
    from google.protobuf.json_format import MessageToDict
    from a2a.client.card_resolver import A2ACardResolver
    from a2a.compat.v0_3.types import AgentCard as V03Card
    ctx = ssl.create_default_context(cafile=os.environ["CA"])
    ctx.load_cert_chain(os.environ["CERT"], os.environ["KEY"])
    out = {}
    async with httpx.AsyncClient(verify=ctx) as client:
        card = await A2ACardResolver(client, base).get_agent_card()
        out["v1"] = MessageToDict(card)
        raw = (await client.get(base + "/.well-known/agent-card.json")).json()
    try:
        out["v03"] = V03Card.model_validate(raw).model_dump(mode="json", exclude_none=True, by_alias=True)
    except Exception as e:
        out["v03_error"] = str(e)
    # The SDK's own client, made from the card (so at the interface URL it names), hands
    # the agent a push URL to a private address.
    from a2a.client.client import ClientConfig
    from a2a.client.client_factory import ClientFactory
    from a2a.types.a2a_pb2 import TaskPushNotificationConfig
    async with httpx.AsyncClient(verify=ctx) as http:
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        try:
            config = TaskPushNotificationConfig(task_id="t-1", url="https://10.0.0.1/hook")
            await client.create_task_push_notification_config(config)
            out["push"] = "accepted"
        except Exception as e:
            out["push"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)

if sys.argv[1] == "card":
    make_card(sys.argv[2])
else:
    asyncio.run(resolve(sys.argv[2]))
"#;

/// A python with the A2A SDK, or `None` (skipped) when it cannot be had outside CI:
/// installed as `sdk.rs` installs `acps-sdk` (`crate::sdk::python_with`).
fn a2a_sdk_python() -> Option<std::path::PathBuf> {
    crate::sdk::python_with(
        &[A2A_SDK],
        "a2a-sdk-card-venv",
        "a2a.client.card_resolver, a2a.server.request_handlers.response_helpers",
    )
}

/// Runs the SDK script with `args` and `env`; its one line of output.
async fn sdk_run(python: &std::path::Path, args: &[&str], env: &[(&str, String)]) -> String {
    let mut cmd = std::process::Command::new(python);
    cmd.arg("-c").arg(SDK_SCRIPT).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The card an SDK agent serves, through the gateway, read by the SDK's own card
/// resolver over mutual TLS: its interfaces name the gateway, and mutual TLS is among
/// its schemes and requirements, read as 1.0 and as 0.3. The SDK's client made from that
/// card reaches the gateway, which refuses its push URL to a private address (the SDK
/// reports an HTTP 403 as its HTTP error, and under `listener.error_status = "ok"` the
/// JSON-RPC error -32600 as its InvalidRequestError); the agent sees no POST.
#[tokio::test]
async fn the_sdk_card_resolver_reads_the_rewritten_card() {
    let Some(python) = tokio::task::spawn_blocking(a2a_sdk_python).await.unwrap() else {
        return;
    };
    let pki = Pki::new();
    let agent = CardAgent::start(String::new()).await;
    let card = sdk_run(&python, &["card", &format!("{}/", agent.url())], &[]).await;
    *agent.card.lock().unwrap() = card.trim().to_owned();
    let gw = gateway_for(&pki, &agent.url(), "", "").await;
    let (cert, key) = pki.write_pair("sdk-leader", &pki.issue(&CertSpec::leader_v2(LEADER_A)));
    let base = format!("https://localhost:{}/a2a/agent", gw.addr.port());
    let env = [
        ("CA", pki.ca_pem.display().to_string()),
        ("CERT", cert.display().to_string()),
        ("KEY", key.display().to_string()),
    ];
    let out = sdk_run(&python, &["resolve", &base], &env).await;
    let out: Value = serde_json::from_str(&out).unwrap();
    let v1 = &out["v1"];
    assert_eq!(v1["name"], "sdk-agent");
    let ifaces = v1["supportedInterfaces"].as_array().unwrap();
    assert_eq!(ifaces.len(), 2, "{v1}");
    assert!(ifaces.iter().all(|i| i["url"] == base.as_str()), "{v1}");
    assert!(
        v1["securitySchemes"][SCHEME]["mtlsSecurityScheme"]["description"].is_string(),
        "{v1}"
    );
    assert_eq!(
        v1["securityRequirements"],
        json!([{"schemes": {SCHEME: {}}}]),
        "an empty scope list reads back as an empty StringList: {v1}"
    );
    let v03 = &out["v03"];
    assert!(out.get("v03_error").is_none(), "{out}");
    assert_eq!(v03["url"], base.as_str());
    assert_eq!(v03["securitySchemes"][SCHEME]["type"], "mutualTLS", "{v03}");
    assert_eq!(v03["security"], json!([{SCHEME: []}]));
    let push = out["push"].as_str().unwrap();
    assert!(push.contains("403"), "{push}");

    let gw = start_gateway(&pki.config(
        "error_status = \"ok\"",
        &partner_block("agent", "/a2a/agent", &agent.url(), "protocol = \"a2a\""),
    ))
    .await;
    let base = format!("https://localhost:{}/a2a/agent", gw.addr.port());
    let out = sdk_run(&python, &["resolve", &base], &env).await;
    let out: Value = serde_json::from_str(&out).unwrap();
    let push = out["push"].as_str().unwrap();
    // -32600 as the SDK names it (its message is its own: the reason travels in A2A's
    // ErrorInfo metadata); the agent got no POST (below).
    assert!(push.starts_with("InvalidRequestError"), "{push}");
    let posts = agent
        .hits
        .lock()
        .unwrap()
        .iter()
        .filter(|h| h.starts_with("POST"))
        .count();
    assert_eq!(posts, 0, "a refused push URL reached the agent");
}
