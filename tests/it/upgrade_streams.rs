//! Issue 37 item 2, the streams: a Leader whose stream the old process's drain ended
//! re-streams on the new process. With the replay shared in Redis (a real `redis-server`)
//! the new process serves it from the old one's copy; without, it answers a clear
//! JSON-RPC error (`replay_not_handed_over`) instead of forwarding a re-stream the Partner
//! never had. Both over real sockets, the real binary taken over with `run --take-over`.

use std::net::SocketAddr;

use crate::cluster::{RedisServer, Store};
use crate::support::*;
use crate::upgrade::{free_port, log_line, ready, Proc};

/// The take-over config: Partner `s` (an SSE Partner) at `/s`, `sections` added.
fn config(pki: &Pki, addr: SocketAddr, admin: SocketAddr, sse: &str, sections: &str) -> String {
    let socket = pki.dir.path().join("aipgw.sock");
    let listener = format!(
        "drain_timeout = \"1s\"\nhandover_socket = \"{}\"\nhandover_timeout = \"30s\"\n",
        socket.display()
    );
    let rest = format!(
        "[admin]\nbind = \"{admin}\"\n[reload]\nwatch = false\n{sections}\n{}",
        partner_block("s", "/s", sse, "")
    );
    pki.config(&listener, &rest)
        .replace("bind = \"127.0.0.1:0\"", &format!("bind = \"{addr}\""))
}

/// A running process A with task `task`'s stream open on it (events 1..=`events` read by
/// the Leader), then B taking A's sockets over; returns once A exited 0 and the stream got
/// its `shutting_down` event. B is returned, serving.
async fn stream_then_take_over(
    pki: &Pki,
    text: &str,
    (addr, admin): (SocketAddr, SocketAddr),
    sse: &SsePartner,
    task: &str,
    events: u64,
    before_take_over: impl std::future::Future<Output = ()>,
) -> Proc {
    let config = pki.write("gateway.toml", text);
    let (a, _a_log) = Proc::start(&config, &[]);
    ready(admin).await;
    let leader = pki.leader(LEADER_A, false);
    let body = stream_body("\"st\"", LEADER_A, task, "start", None);
    let mut stream = leader.open_stream(addr, "/s/stream", &body, &[]).await;
    assert_eq!(stream.status, 200);
    let feed = sse.feed(task).await;
    feed_events(&feed, 1..=events, None).await;
    for n in 1..=events {
        let ev = within(10, stream.next_event()).await.expect("an event");
        assert_eq!(ev.seq(), Some(n));
    }
    before_take_over.await;
    let (b, b_log) = Proc::start(&config, &["--take-over"]);
    log_line(b_log, "took the listening sockets over").await;
    assert_eq!(a.exited().await, Some(0), "A's exit");
    let last = within(10, stream.next_event()).await.expect("final event");
    assert_eq!(last.json["error"]["data"]["reason"], "shutting_down");
    assert_eq!(last.json["error"]["data"]["lastEventSeq"], events);
    ready(admin).await;
    drop(feed);
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restream_after_a_take_over_is_served_from_the_shared_replay() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let pki = Pki::new();
    let sse = SsePartner::start(Restream::Error).await;
    let (addr, admin) = (free_port(), free_port());
    let cluster = format!("[cluster]\nmode = \"redis\"\n{}\n", redis.lines());
    let text = config(&pki, addr, admin, &sse.url(), &cluster);
    // The copy in Redis holds the three events before B takes over.
    let events = "aipgw:{aipgw:replay:1:s:shared}:events";
    let copied = async {
        within(20, async {
            while !matches!(redis.cmd(&["XLEN", events]), redis::Value::Int(n) if n >= 3) {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
    };
    let b = stream_then_take_over(&pki, &text, (addr, admin), &sse, "shared", 3, copied).await;

    // The Leader resumes after event 1 on B: events 2 and 3 from A's copy, the Partner
    // never asked.
    let leader = pki.leader(LEADER_A, false);
    let body = stream_body("\"again\"", LEADER_A, "shared", "re-stream", Some(1));
    let mut again = leader.open_stream(addr, "/s/stream", &body, &[]).await;
    assert_eq!(again.status, 200, "{:?}", again.headers);
    for n in [2, 3] {
        let ev = within(10, again.next_event())
            .await
            .expect("a replayed event");
        assert_eq!(ev.seq(), Some(n), "{:?}", ev.json);
        assert_eq!(ev.json["id"], "again");
    }
    // Then the end: the one A recorded when its drain time was over, `shutting_down`
    // (A's exit waits for its recordings' ends before the last flush: with the end
    // missed, the copy would lose its recorder unannounced and B say `recorder_lost`).
    let end = within(10, again.next_event()).await.expect("the end");
    assert_eq!(
        end.json["error"]["data"]["reason"], "shutting_down",
        "{:?}",
        end.json
    );
    assert_eq!(end.json["error"]["data"]["lastEventSeq"], 3);
    assert!(within(10, again.next_event()).await.is_none());
    assert_eq!(
        sse.commands(),
        ["start"],
        "the re-stream reached the Partner"
    );
    let m = parse_metrics(&admin_get(admin, "/metrics").await.unwrap_or_default());
    assert_eq!(
        m.get("aipgw_restreams_total{served_by=\"cluster\"}"),
        Some(&1.0),
        "{m:?}"
    );
    drop(b);
}

/// A Partner stream still recorded when the process stops, its Leader gone (within
/// `detach_timeout`): its copy in Redis ends `shutting_down`, written before the exit,
/// rather than being cut with the workers and left without an end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_recorded_with_no_leader_ends_shutting_down_in_the_copy() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let pki = Pki::new();
    let sse = SsePartner::start(Restream::Error).await;
    let (addr, admin) = (free_port(), free_port());
    let cluster = format!("[cluster]\nmode = \"redis\"\n{}\n", redis.lines());
    let config = pki.write(
        "gateway.toml",
        &config(&pki, addr, admin, &sse.url(), &cluster),
    );
    let (a, _a_log) = Proc::start(&config, &[]);
    ready(admin).await;
    let leader = pki.leader(LEADER_A, false);
    let body = stream_body("\"st\"", LEADER_A, "alone", "start", None);
    let mut stream = leader.open_stream(addr, "/s/stream", &body, &[]).await;
    assert_eq!(stream.status, 200);
    let feed = sse.feed("alone").await;
    feed_events(&feed, 1..=2, None).await;
    for n in 1..=2 {
        assert_eq!(
            within(10, stream.next_event()).await.unwrap().seq(),
            Some(n)
        );
    }
    let (events, meta) = (
        "aipgw:{aipgw:replay:1:s:alone}:events",
        "aipgw:{aipgw:replay:1:s:alone}:meta",
    );
    within(20, async {
        while !matches!(redis.cmd(&["XLEN", events]), redis::Value::Int(n) if n >= 2) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    // The Leader leaves; the Partner's stream goes on (its feed is held), recorded.
    stream.disconnect();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &a.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert_eq!(a.exited().await, Some(0), "A's exit");
    assert_eq!(
        redis.cmd(&["HGET", meta, "end"]),
        redis::Value::BulkString(b"shutting_down".to_vec()),
        "the copy's end"
    );
    drop(feed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restream_after_a_take_over_without_a_shared_replay_gets_a_clear_error() {
    let pki = Pki::new();
    let sse = SsePartner::start(Restream::Error).await;
    let (addr, admin) = (free_port(), free_port());
    let text = config(&pki, addr, admin, &sse.url(), "");
    let b = stream_then_take_over(&pki, &text, (addr, admin), &sse, "local", 2, async {}).await;

    // The owner's re-stream: a JSON-RPC error saying the events stayed with the old
    // process, not the Partner's answer to a re-stream it never had.
    let leader = pki.leader(LEADER_A, false);
    let body = stream_body("\"again\"", LEADER_A, "local", "re-stream", Some(2));
    let reply = leader.post(addr, "/s/stream", &body).await.unwrap();
    let json = reply.json();
    assert_eq!(json["id"], "again", "{json}");
    assert_eq!(json["error"]["code"], -32603, "{json}");
    assert_eq!(
        json["error"]["data"]["reason"], "replay_not_handed_over",
        "{json}"
    );
    let detail = json["error"]["data"]["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("\"local\"") && detail.contains("cluster.replay"),
        "{detail}"
    );
    assert_eq!(reply.status, 410, "{json}");
    // Another Leader is refused as it would have been by A.
    let other = pki.leader(LEADER_B, false);
    let body = stream_body("\"b\"", LEADER_B, "local", "re-stream", None);
    let refused = other.post(addr, "/s/stream", &body).await.unwrap();
    assert_eq!(refused.error(), (-32009, "not_stream_owner".to_owned()));
    assert_eq!(sse.commands(), ["start"], "a re-stream reached the Partner");
    // A task A never streamed is forwarded as before (this Partner has no re-stream).
    let body = stream_body("\"new\"", LEADER_A, "elsewhere", "re-stream", None);
    let forwarded = leader.post(addr, "/s/stream", &body).await.unwrap();
    assert_eq!(forwarded.json()["error"]["code"], -32004);
    assert_eq!(sse.commands(), ["start", "re-stream"]);
    drop(b);
}
