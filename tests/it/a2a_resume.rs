//! A2A streams a client can resume (`layers::a2a_stream`), against the official SDK's
//! agent (`tests/data/a2a_sdk.py`, as in `a2a.rs`): a stream dropped mid-way and resumed
//! with `Last-Event-ID` gets the current `Task` first, then every event after the id,
//! once and in order; an id the buffer does not know is forwarded to the agent; another
//! AIC's resume is refused.

use crate::a2a::{a2a_error, sdk_agent};
use crate::support::*;

/// The ids and data of the events up to the stream's end.
async fn rest(s: &mut StreamReply) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(e) = within(30, s.next_event()).await {
        out.push(e);
    }
    out
}

/// What an event says, for comparison in either generation's shape: its kind and its
/// artifact's name or its state (`TASK_STATE_WORKING` and `working` alike).
fn said(e: &Event) -> String {
    let r = &e.json["result"];
    let state = |s: &serde_json::Value| {
        let s = s["state"].as_str().unwrap();
        s.trim_start_matches("TASK_STATE_").to_ascii_lowercase()
    };
    let name = |a: &serde_json::Value| a["artifact"]["name"].as_str().unwrap().to_owned();
    match r["kind"].as_str() {
        Some("artifact-update") => format!("artifact {}", name(r)),
        Some("status-update") => format!("status {}", state(&r["status"])),
        Some("task") => format!("task {}", state(&r["status"])),
        _ if r.get("artifactUpdate").is_some() => {
            format!("artifact {}", name(&r["artifactUpdate"]))
        }
        _ if r.get("statusUpdate").is_some() => {
            format!("status {}", state(&r["statusUpdate"]["status"]))
        }
        _ if r.get("task").is_some() => format!("task {}", state(&r["task"]["status"])),
        _ => panic!("not an A2A event: {}", e.json),
    }
}

/// A protocol generation's method names, message shape and `A2A-Version`.
#[derive(Clone, Copy)]
enum Gen {
    V03,
    V10,
}

impl Gen {
    fn version(self) -> &'static str {
        match self {
            Gen::V03 => "0.3",
            Gen::V10 => "1.0",
        }
    }

    fn stream(self, text: &str) -> String {
        match self {
            Gen::V03 => format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"message/stream","params":{{"message":{{"kind":"message","messageId":"m-{text}","role":"user","parts":[{{"kind":"text","text":"{text}"}}]}}}}}}"#
            ),
            Gen::V10 => format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"SendStreamingMessage","params":{{"message":{{"messageId":"m1-{text}","role":"ROLE_USER","parts":[{{"text":"{text}"}}]}}}}}}"#
            ),
        }
    }

    fn resubscribe(self, task: &str) -> String {
        let method = match self {
            Gen::V03 => "tasks/resubscribe",
            Gen::V10 => "SubscribeToTask",
        };
        format!(r#"{{"jsonrpc":"2.0","id":"r","method":"{method}","params":{{"id":"{task}"}}}}"#)
    }

    /// The `Task` an event carries (v0.3: the result itself, `kind` "task"; v1.0: the
    /// result's `task`).
    fn task(self, e: &Event) -> Option<&serde_json::Value> {
        let r = &e.json["result"];
        match self {
            Gen::V03 => (r["kind"] == "task").then_some(r),
            Gen::V10 => r.get("task"),
        }
    }
}

fn id_of(e: &Event) -> u64 {
    let id = e
        .sse_id
        .as_deref()
        .unwrap_or_else(|| panic!("no id line: {}", e.json));
    id.parse().unwrap()
}

/// Opens a stream for `text` (six artifacts), drops it after three events, resumes it
/// from the last id got and checks every event came once, in order; the task and the
/// ids got before the drop.
async fn drop_and_resume(
    owner: &Leader,
    addr: std::net::SocketAddr,
    gen: Gen,
    text: &str,
) -> (String, Vec<u64>) {
    let version = [("a2a-version", gen.version())];
    let stream = gen.stream(text);

    // The stream, dropped after its third event.
    let mut first = owner
        .open_stream(addr, "/agents/sdk", &stream, &version)
        .await;
    assert_eq!(first.status, 200);
    let mut before = Vec::new();
    for _ in 0..3 {
        before.push(within(30, first.next_event()).await.expect("an event"));
    }
    first.disconnect();
    let opened = gen
        .task(&before[0])
        .expect("the stream opens with the Task");
    let task = opened["id"].as_str().unwrap().to_owned();
    let ids: Vec<u64> = before.iter().map(id_of).collect();
    assert_eq!(ids, [ids[0], ids[0] + 1, ids[0] + 2], "numbered in order");
    let last = ids[2].to_string();

    // Resumed from the last id it got: the current Task (no id line), then the rest.
    let resubscribe = gen.resubscribe(&task);
    let headers = [
        ("a2a-version", gen.version()),
        ("last-event-id", last.as_str()),
    ];
    let mut again = owner
        .open_stream(addr, "/agents/sdk", &resubscribe, &headers)
        .await;
    assert_eq!(again.status, 200);
    let after = rest(&mut again).await;
    let (current, after) = after.split_first().expect("the current Task");
    let got = gen
        .task(current)
        .unwrap_or_else(|| panic!("a Task: {}", current.json));
    assert_eq!(got["id"], task.as_str());
    assert_eq!(current.json["id"], "r", "the resubscription's JSON-RPC id");
    assert!(current.sse_id.is_none(), "the Task moves no resume point");
    // As of the resume point: working, the one artifact got before the drop; the
    // events after it bring the rest.
    assert_eq!(said(current), "task working", "{got}");
    let names: Vec<&str> = (got["artifacts"].as_array().unwrap().iter())
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a0"], "{got}");
    for e in after {
        assert_eq!(e.json["id"], "r", "{}", e.json);
    }
    let after_ids: Vec<u64> = after.iter().map(id_of).collect();
    let want: Vec<u64> = (ids[2] + 1..=ids[2] + after.len() as u64).collect();
    assert_eq!(
        after_ids, want,
        "every id after the resume point, once, in order"
    );
    // Every event the agent sent, once, in order: working, six artifacts, completed.
    let seen: Vec<String> = before.iter().chain(after).map(said).collect();
    let mut expected = vec!["task submitted".to_owned(), "status working".to_owned()];
    expected.extend((0..6).map(|i| format!("artifact a{i}")));
    expected.push("status completed".to_owned());
    assert_eq!(seen, expected);

    (task, ids)
}

#[tokio::test]
async fn an_a2a_stream_dropped_and_resumed_gets_every_event_once_in_order() {
    let Some((_python, agent)) = sdk_agent().await else {
        return;
    };
    let pki = Pki::new();
    let upstream = format!("http://127.0.0.1:{}", agent.port);
    let partners = partner_block("sdk", "/agents/sdk", &upstream, "protocol = \"a2a\"");
    let gw = start_gateway(&pki.config("", &partners)).await;
    let owner = pki.leader(LEADER_B, false);
    // Resumed while the agent's stream goes on (the held events, then live ones), and
    // once it ended (served from a finished record).
    drop_and_resume(&owner, gw.addr, Gen::V03, "slow 6").await;
    // The same in v1.0's names and shapes (SendStreamingMessage, SubscribeToTask, the
    // StreamResponse members): the Task the gateway folds is in v1.0's shape too.
    drop_and_resume(&owner, gw.addr, Gen::V10, "slow 6").await;
    let (v10_task, v10_ids) = drop_and_resume(&owner, gw.addr, Gen::V10, "stream 6").await;
    let (task, ids) = drop_and_resume(&owner, gw.addr, Gen::V03, "stream 6").await;
    let last = ids[2].to_string();
    let resubscribe = Gen::V03.resubscribe(&task);

    // An id of no record the gateway holds: forwarded, the agent's own semantics (the
    // SDK refuses a finished task: -32004), nothing served from the buffer.
    let stray = ((ids[0] >> 32) ^ 1) << 32 | 2;
    let stray = stray.to_string();
    let headers = [("a2a-version", "0.3"), ("last-event-id", stray.as_str())];
    let mut forwarded = owner
        .open_stream(gw.addr, "/agents/sdk", &resubscribe, &headers)
        .await;
    let answer = within(30, forwarded.next_event())
        .await
        .expect("the agent's answer");
    assert_eq!(answer.json["error"]["code"], -32004, "{}", answer.json);
    assert!(answer.sse_id.is_none(), "the agent's own event");

    // Another AIC: refused as for every task method, -32001 naming no owner.
    let other = pki.leader(LEADER_A, false);
    let headers = [("a2a-version", "0.3"), ("last-event-id", last.as_str())];
    let r = other
        .post_with(gw.addr, "/agents/sdk", resubscribe.clone().into(), &headers)
        .await
        .unwrap();
    assert_eq!(a2a_error(&r), (200, -32001, "task_not_found".into()));

    // And in v1.0: SubscribeToTask with the owner's resume point, from another AIC.
    let last = v10_ids[2].to_string();
    let headers = [("a2a-version", "1.0"), ("last-event-id", last.as_str())];
    let r = other
        .post_with(
            gw.addr,
            "/agents/sdk",
            Gen::V10.resubscribe(&v10_task).into(),
            &headers,
        )
        .await
        .unwrap();
    assert_eq!(a2a_error(&r), (200, -32001, "task_not_found".into()));
}
