//! A2A agents behind the gateway (`[[partner]] protocol = "a2a"`), against the official
//! Python SDK (`a2a-sdk` 1.3 from the package index, installed at test time as
//! `tests/it/sdk.rs` installs `acps-sdk`; under `CI=true` a missing SDK fails): an agent
//! on the SDK's own server (v1.0 and v0.3 method names on one endpoint) behind the
//! gateway, and the SDK's own JSON-RPC transports (v1.0 and v0.3) through the gateway
//! with client certificates. The script is `tests/data/a2a_sdk.py`.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use aipgw::devcerts::CertSpec;
use bytes::Bytes;

use crate::sdk::python_with;
use crate::support::*;

/// What the test installs: the SDK with its server's extras, and an ASGI server for it.
pub(crate) const SDK: [&str; 2] = ["a2a-sdk[http-server]==1.3.0", "uvicorn==0.54.0"];

/// The helper script, with the agent and the client.
fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/a2a_sdk.py")
}

/// The SDK's agent, stopped on drop.
pub(crate) struct Agent {
    child: Child,
    pub(crate) port: u16,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the agent and waits for the port it listens on (its first line).
pub(crate) fn start_agent(python: &Path) -> Agent {
    let mut child = Command::new(python)
        .arg(script())
        .arg("agent")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the SDK agent starts");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the agent prints its port");
    let port = line
        .trim()
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port from the agent: {line:?}"));
    Agent { child, port }
}

/// A python with the SDK and the SDK's agent started with it, or `None` (skipped) when
/// the SDK cannot be had outside CI.
pub(crate) async fn sdk_agent() -> Option<(PathBuf, Agent)> {
    let python = tokio::task::spawn_blocking(|| {
        python_with(&SDK, "a2a-sdk-venv", "a2a.server.routes, uvicorn")
    })
    .await
    .unwrap()?;
    let agent = {
        let python = python.clone();
        tokio::task::spawn_blocking(move || start_agent(&python))
            .await
            .unwrap()
    };
    Some((python, agent))
}

#[tokio::test]
async fn the_sdks_agent_and_client_through_the_gateway() {
    let Some((python, agent)) = sdk_agent().await else {
        return;
    };
    let pki = Pki::new();
    pki.write_pair("owner", &pki.issue(&CertSpec::leader_v2(LEADER_B)));
    pki.write_pair("other", &pki.issue(&CertSpec::leader_v2(LEADER_A)));
    let upstream = format!("http://127.0.0.1:{}", agent.port);
    let partners = partner_block("sdk", "/agents/sdk", &upstream, "protocol = \"a2a\"");
    let gw = start_gateway(&pki.config("", &partners)).await;

    let mut client = Command::new(&python);
    client
        .arg(script())
        .arg("client")
        .env(
            "URL",
            format!("https://localhost:{}/agents/sdk", gw.addr.port()),
        )
        .env("CERTS", pki.dir.path());
    let run = tokio::task::spawn_blocking(move || client.output());
    let out = within(120, run).await.unwrap().expect("the SDK client ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let step = |name: &str| {
        steps
            .iter()
            .find(|s| s["step"] == name)
            .unwrap_or_else(|| panic!("no step {name}: {stdout}"))
            .clone()
    };

    for g in ["v1", "v03"] {
        // The owner's send (the A2A-Version header passed through: the agent checks it),
        // its get and its subscription (the current Task first).
        let send = step(&format!("{g}/send"));
        let task = send["task"].as_str().unwrap().to_owned();
        assert_eq!(step(&format!("{g}/get"))["result"]["id"], task.as_str());
        let sub = step(&format!("{g}/subscribe"));
        assert_eq!(
            (&sub["first"]["kind"], &sub["first"]["task"]),
            (&serde_json::json!("task"), &serde_json::json!(task)),
            "{sub}"
        );
        // Another AIC, on every task method and on the owner's context: the SDK raises
        // TaskNotFoundError, as for a task that does not exist; in v1.0 its data is the
        // gateway's ErrorInfo metadata.
        let mut refused = vec![
            "get",
            "cancel",
            "subscribe",
            "push_set",
            "push_get",
            "push_list",
            "push_delete",
            "follow_up",
            "same_context",
        ];
        if g == "v1" {
            refused.push("list");
        }
        for name in refused {
            let s = step(&format!("{g}/other/{name}"));
            assert_eq!(s["error"], "TaskNotFoundError", "{g}/{name}: {s}");
            if g == "v1" {
                assert_eq!(s["data"]["reason"], "task_not_found", "{s}");
            }
            assert!(
                !s.to_string().contains(LEADER_B),
                "the owner is not named: {s}"
            );
        }
        if g == "v1" {
            // A list that names no context would span every caller's tasks: 403.
            let s = step("v1/other/list_all");
            assert!(s["text"].as_str().unwrap().contains("403"), "{s}");
            let list = step("v1/list");
            assert_eq!(list["result"]["tasks"][0]["id"], task.as_str(), "{list}");
        }
        // The owner cancels it.
        let cancel = step(&format!("{g}/cancel"));
        assert_eq!(
            cancel["result"]["status"]["state"], "TASK_STATE_CANCELED",
            "{cancel}"
        );
        // A streamed answer: every event relayed in order, its task the caller's.
        let events = step(&format!("{g}/stream"))["events"].clone();
        let kinds: Vec<&str> = events
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "task",
                "statusUpdate",
                "artifactUpdate",
                "artifactUpdate",
                "artifactUpdate",
                "statusUpdate"
            ],
            "{events}"
        );
        let other_get = step(&format!("{g}/stream/other_get"));
        assert_eq!(other_get["error"], "TaskNotFoundError", "{other_get}");
        let get = step(&format!("{g}/stream/get"));
        assert_eq!(get["result"]["status"]["state"], "TASK_STATE_COMPLETED");
    }

    // Metrics name A2A's methods; the refusals are -32001, never an AIP code.
    let m = metric(
        &gw,
        r#"aipgw_requests_total{partner="sdk",method="tasks/get",status="200",code="-32001"}"#,
        2.0,
    )
    .await;
    for (key, want) in [
        (r#"method="GetTask",status="200",code="-32001""#, 2.0),
        (r#"method="SendMessage",status="200",code="0""#, 1.0),
        (r#"method="message/send",status="200",code="0""#, 1.0),
        (r#"method="ListTasks",status="403",code="-32000""#, 1.0),
    ] {
        let key = format!(r#"aipgw_requests_total{{partner="sdk",{key}}}"#);
        assert_eq!(m.get(&key), Some(&want), "{key}");
    }
    assert!(
        !m.keys().any(|k| k.contains(r#"partner="sdk""#)
            && k.contains("code=\"-3200")
            && !k.contains("code=\"-32000\"")
            && !k.contains("code=\"-32001\"")),
        "an AIP code reached an A2A caller"
    );
}

/// `(HTTP status, error.code, ErrorInfo metadata reason)` of an A2A error answer.
pub(crate) fn a2a_error(r: &Reply) -> (u16, i64, String) {
    let v = r.json();
    let info = &v["error"]["data"][0];
    assert_eq!(
        info["@type"], "type.googleapis.com/google.rpc.ErrorInfo",
        "{v}"
    );
    (
        r.status.as_u16(),
        v["error"]["code"].as_i64().unwrap_or(0),
        info["metadata"]["reason"].as_str().unwrap_or("").to_owned(),
    )
}

/// Without the SDK: the agent gets the very bytes the client sent and its `A2A-Version`
/// header, with the caller's AIC; every refusal an A2A caller meets is in A2A's terms,
/// before the route is known too (no certificate), and the agent sees none of them.
#[tokio::test]
async fn an_a2a_agent_gets_the_same_bytes_and_its_callers_a2a_errors() {
    let task = r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t-9","contextId":"c-9","status":{"state":"TASK_STATE_WORKING"}}}}"#;
    let agent = TestPartner::start(Behaviour::Fixed(task)).await;
    let pki = Pki::new();
    let partners = partner_block("a", "/agents/a", &agent.url(), "protocol = \"a2a\"");
    let gw = start_gateway(&pki.config("", &partners)).await;
    let (owner, other) = (pki.leader(LEADER_B, false), pki.leader(LEADER_A, true));
    let send = r#"{"jsonrpc":"2.0","id":"s\u0031","method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"text":"hi"}]},  "metadata":{}}}"#;
    let r = owner
        .post_with(
            gw.addr,
            "/agents/a",
            Bytes::from_static(send.as_bytes()),
            &[("a2a-version", "1.0")],
        )
        .await
        .unwrap();
    assert_eq!((r.status.as_u16(), r.text()), (200, task.to_owned()));
    let seen = agent.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(&seen[0].body[..], send.as_bytes());
    assert_eq!(seen[0].headers["a2a-version"], "1.0");
    assert_eq!(seen[0].headers["x-aip-client-aic"], LEADER_B);

    let get = |method: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{{"id":"t-9"}}}}"#)
    };
    // The owner may read its task; another AIC is told it does not exist.
    let r = owner
        .post(gw.addr, "/agents/a", &get("GetTask"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let r = other
        .post(gw.addr, "/agents/a", &get("tasks/get"))
        .await
        .unwrap();
    assert_eq!(a2a_error(&r), (200, -32001, "task_not_found".into()));
    assert!(!r.text().contains(LEADER_B), "{}", r.text());
    let list = r#"{"jsonrpc":"2.0","id":8,"method":"ListTasks","params":{}}"#;
    let r = owner.post(gw.addr, "/agents/a", list).await.unwrap();
    assert_eq!(a2a_error(&r), (403, -32000, "list_tasks_unscoped".into()));
    let r = owner.post(gw.addr, "/agents/a", &get("rpc")).await.unwrap();
    assert_eq!(a2a_error(&r), (400, -32601, "unknown_method".into()));
    let r = owner
        .post(gw.addr, "/agents/a/rpc", &get("GetTask"))
        .await
        .unwrap();
    assert_eq!(a2a_error(&r), (404, -32601, "no_route".into()));
    let agent_voice = r#"{"jsonrpc":"2.0","id":9,"method":"message/send","params":{"message":{"role":"agent","parts":[]}}}"#;
    let r = owner.post(gw.addr, "/agents/a", agent_voice).await.unwrap();
    assert_eq!(a2a_error(&r), (400, -32602, "invalid_params".into()));
    // No certificate: refused before the route is known, still in A2A's terms (AIP's
    // -32008 means "extension support required" in A2A).
    let anonymous = Leader::new(&pki, None, false);
    let r = anonymous
        .post(gw.addr, "/agents/a", &get("GetTask"))
        .await
        .unwrap();
    assert_eq!(a2a_error(&r), (401, -32000, "no_client_certificate".into()));
    assert_eq!(r.json()["id"], 7);
    assert_eq!(
        agent.seen().len(),
        2,
        "the agent saw only the owner's send and get"
    );
}

/// An A2A event stream (`SubscribeToTask`, `message/stream`) takes one of its caller's
/// open-stream permits while it is open, as an AIP `stream` does: past
/// `ratelimit.max_streams_per_aic`, 429 -32000 `aic_streams`.
#[tokio::test]
async fn an_a2a_stream_counts_against_its_callers_open_streams() {
    let agent = TestPartner::start(Behaviour::Hang).await;
    let pki = Pki::new();
    let partners = format!(
        "[ratelimit]\nmax_streams_per_aic = 1\n{}",
        partner_block("a", "/agents/a", &agent.url(), "protocol = \"a2a\"")
    );
    let gw = start_gateway(&pki.config("", &partners)).await;
    let owner = pki.leader(LEADER_B, false);
    let subscribe = r#"{"jsonrpc":"2.0","id":1,"method":"SubscribeToTask","params":{"id":"t-1"}}"#;
    let (addr, first) = (gw.addr, owner.clone());
    let open = tokio::spawn(async move { first.post(addr, "/agents/a", subscribe).await });
    within(10, async {
        while agent.seen().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let stream = r#"{"jsonrpc":"2.0","id":2,"method":"message/stream","params":{"message":{"role":"user","parts":[]}}}"#;
    // (Forwarded, it would hang at the agent: `within` fails it.)
    let r = within(10, owner.post(gw.addr, "/agents/a", stream))
        .await
        .unwrap();
    assert_eq!(a2a_error(&r), (429, -32000, "aic_streams".into()));
    // Not a stream: not counted.
    let get = r#"{"jsonrpc":"2.0","id":3,"method":"GetTask","params":{"id":"t-1"}}"#;
    let (addr, again) = (gw.addr, owner.clone());
    let plain = tokio::spawn(async move { again.post(addr, "/agents/a", get).await });
    within(10, async {
        while agent.seen().len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(agent.seen().len(), 2);
    open.abort();
    plain.abort();
}

/// Cluster mode: the owner an agent's answer names, recorded through one instance, is
/// known to another that never saw the task (asked of Redis): another AIC's `GetTask`,
/// a message to the owner's context and a list of it are refused there too, the owner's
/// `GetTask` passes.
#[tokio::test]
async fn an_a2a_owner_recorded_on_one_instance_is_known_on_every_instance() {
    use crate::cluster::{RedisServer, Store};
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let task = r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t-9","contextId":"c-9","status":{"state":"TASK_STATE_WORKING"}}}}"#;
    let agent = TestPartner::start(Behaviour::Fixed(task)).await;
    let pki = Pki::new();
    let text = pki.config(
        "",
        &format!(
            "[cluster]\nmode = \"redis\"\n{}\ncommand_timeout = \"1s\"\n{}",
            redis.lines(),
            partner_block("a", "/agents/a", &agent.url(), "protocol = \"a2a\"")
        ),
    );
    let (a, b) = (start_gateway(&text).await, start_gateway(&text).await);
    let (owner, other) = (pki.leader(LEADER_B, false), pki.leader(LEADER_A, false));
    let send = r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","parts":[]}}}"#;
    let r = owner.post(a.addr, "/agents/a", send).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // The owner reaches Redis after the answer (written beside it): waited for there.
    let owned = |key: &str| redis.cmd(&["GET", key]) == redis::Value::BulkString(LEADER_B.into());
    let task_key = "aipgw:{aipgw:task:1:a:3:t-9}:owner";
    let context_key = "aipgw:{aipgw:task:1:a:12:\0context:c-9}:owner";
    within(10, async {
        while !(owned(task_key) && owned(context_key)) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    let get = r#"{"jsonrpc":"2.0","id":2,"method":"GetTask","params":{"id":"t-9"}}"#;
    let r = other.post(b.addr, "/agents/a", get).await.unwrap();
    assert_eq!(a2a_error(&r), (200, -32001, "task_not_found".into()));
    let in_context = r#"{"jsonrpc":"2.0","id":3,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","contextId":"c-9","parts":[]}}}"#;
    let r = other.post(b.addr, "/agents/a", in_context).await.unwrap();
    assert_eq!(a2a_error(&r), (200, -32001, "task_not_found".into()));
    let list = r#"{"jsonrpc":"2.0","id":4,"method":"ListTasks","params":{"contextId":"c-9"}}"#;
    let r = other.post(b.addr, "/agents/a", list).await.unwrap();
    assert_eq!(a2a_error(&r), (200, -32001, "task_not_found".into()));
    let r = owner.post(b.addr, "/agents/a", get).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        agent.seen().len(),
        2,
        "the agent saw the owner's send and get only"
    );
}
