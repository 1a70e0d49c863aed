//! Issue 5 (operations): metrics, access log, trace context, readiness.

use std::sync::{Arc, Mutex};

use crate::support::*;

#[tokio::test]
async fn metrics_count_good_and_bad_requests() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    assert_eq!(gw.admin_get("/healthz").await.0, 200);
    assert_eq!(gw.admin_get("/readyz").await.0, 200);
    let a = pki.leader(LEADER_A, false);
    let anon = Leader::new(&pki, None, false);
    for i in 0..2 {
        a.post(gw.addr, "/p/rpc", &rpc_start(&i.to_string(), LEADER_A, "t"))
            .await
            .unwrap();
    }
    anon.post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "t"))
        .await
        .unwrap();
    a.post(gw.addr, "/p/rpc", "{not json").await.unwrap();
    a.post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_B, "t"))
        .await
        .unwrap();
    let m = metric(
        &gw,
        r#"aipgw_requests_total{partner="p",method="rpc",status="200",code="0"}"#,
        2.0,
    )
    .await;
    let want = [
        (
            r#"aipgw_requests_total{partner="p",method="",status="401",code="-32008"}"#,
            1.0,
        ),
        (
            r#"aipgw_requests_total{partner="p",method="",status="400",code="-32700"}"#,
            1.0,
        ),
        (
            r#"aipgw_requests_total{partner="p",method="rpc",status="403",code="-32009"}"#,
            1.0,
        ),
        (
            r#"aipgw_identity_failures_total{reason="no_client_certificate"}"#,
            1.0,
        ),
        (
            r#"aipgw_policy_refusals_total{reason="sender_mismatch"}"#,
            1.0,
        ),
        (
            r#"aipgw_request_duration_seconds_count{partner="p",method="rpc"}"#,
            3.0,
        ),
        (
            r#"aipgw_upstream_duration_seconds_count{partner="p",method="rpc"}"#,
            2.0,
        ),
        ("aipgw_replay_buffer_streams", 0.0),
    ];
    for (key, value) in want {
        assert_eq!(m.get(key), Some(&value), "{key}");
    }
    assert!(
        m.keys()
            .any(|k| k.starts_with("aipgw_certificate_expiry_timestamp_seconds{kind=\"server\"")),
        "no certificate expiry"
    );
    assert!(m.contains_key("aipgw_open_connections"));
}

#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    /// Every access-log line captured so far, of every test.
    pub fn all_lines(&self) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "aipgw::access")
            .collect()
    }

    /// This test's access lines (its Partners are named `logged-*`; other tests log too).
    pub fn access_lines(&self) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "aipgw::access")
            .filter(|v| {
                v["partner"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("logged-"))
            })
            .collect()
    }
}

/// One global subscriber for this test binary, capturing access-log events as JSON. (A
/// thread-scoped `set_default` misses events when other tests on other threads hit the
/// same callsite first: tracing caches callsite interest process-wide.)
pub fn capture() -> &'static Capture {
    static CAPTURE: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_target(true)
            .with_writer(move || writer.clone())
            .with_env_filter(tracing_subscriber::EnvFilter::new("aipgw::access=info"))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
        capture
    })
}

#[tokio::test]
async fn access_log_lines_have_the_fields_and_no_secrets() {
    let capture = capture();

    let pki = Pki::new();
    let echo = TestPartner::start(Behaviour::Echo).await;
    let sse = SsePartner::start(Restream::Error).await;
    let gw = start_gateway(
        &pki.config(
            "",
            &[
                partner_block("logged-p", "/p", &echo.url(), ""),
                partner_block("logged-s", "/s", &sse.url(), ""),
            ]
            .concat(),
        ),
    )
    .await;
    let a = pki.leader(LEADER_A, false);
    let r = a
        .post(gw.addr, "/p/rpc", &rpc_start("\"r1\"", LEADER_A, "task-9"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let secret = r#"{"jsonrpc":"2.0","method":"notification/set","id":2,"params":{"url":"https://l/cb","token":"secret-token-xyz","taskId":"task-9"}}"#;
    let b = pki.leader(LEADER_B, false);
    let r = b
        .post(gw.addr, "/p/notification/set", secret)
        .await
        .unwrap();
    assert_eq!(r.status, 403, "B may not touch A's task");
    let mut stream = a
        .open_stream(
            gw.addr,
            "/s/stream",
            &stream_body("\"st\"", LEADER_A, "task-s", "start", None),
            &[],
        )
        .await;
    let feed = sse.feed("task-s").await;
    for n in 1..=3 {
        let state = if n == 3 { "completed" } else { "working" };
        feed.send(Ok(sse_event("\"st\"", n, state))).await.unwrap();
    }
    drop(feed);
    while within(10, stream.next_event()).await.is_some() {}
    drop(stream);

    let lines = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            // This test's Partners only: other tests log `logged-*` lines too.
            let l: Vec<_> = capture
                .access_lines()
                .into_iter()
                .filter(|v| v["partner"] == "logged-p" || v["partner"] == "logged-s")
                .collect();
            if l.len() >= 3 {
                return l;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        let all = String::from_utf8_lossy(&capture.0.lock().unwrap()).into_owned();
        panic!(
            "access lines: {:?}\nall captured: {} bytes: {:.2000}",
            capture.access_lines(),
            all.len(),
            all
        )
    });
    let by_method = |m: &str| {
        lines
            .iter()
            .find(|l| l["method"] == m)
            .unwrap_or_else(|| panic!("no {m} line: {lines:?}"))
            .clone()
    };
    let rpc = by_method("rpc");
    for key in [
        "timestamp",
        "peer",
        "aic",
        "partner",
        "method",
        "command",
        "task_id",
        "session_id",
        "status",
        "code",
        "bytes_in",
        "bytes_out",
        "events",
        "upstream_ms",
        "total_ms",
        "request_id",
        "trace_id",
    ] {
        assert!(rpc.get(key).is_some(), "{key} missing: {rpc}");
    }
    assert_eq!(rpc["aic"], LEADER_A);
    assert_eq!(
        (
            rpc["partner"].as_str(),
            rpc["command"].as_str(),
            rpc["task_id"].as_str()
        ),
        (Some("logged-p"), Some("start"), Some("task-9"))
    );
    assert_eq!(rpc["status"], 200);
    assert_eq!(rpc["trace_id"].as_str().unwrap().len(), 32);

    let refused = by_method("notification/set");
    assert_eq!(
        (refused["status"].as_u64(), refused["code"].as_i64()),
        (Some(403), Some(-32009))
    );
    assert_eq!(refused["reason"], "not_task_owner");

    let stream = by_method("stream");
    assert_eq!(stream["events"], 3);
    assert!(stream["bytes_out"].as_u64().unwrap() > 300);
    assert_eq!(
        (&stream["code"], &stream["reason"]),
        (&0.into(), &"".into())
    );
    metric(
        &gw,
        r#"aipgw_streams_ended_total{partner="logged-s",outcome="completed"}"#,
        1.0,
    )
    .await;

    let all = serde_json::to_string(&lines).unwrap();
    assert!(!all.contains("secret-token-xyz"), "a token was logged");
    assert!(!all.contains("hello"), "message text was logged");
}

#[tokio::test]
async fn traceparent_reaches_the_partner() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let a = pki.leader(LEADER_A, false);
    let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let body = bytes::Bytes::from(rpc_start("1", LEADER_A, "t"));
    a.post_with(gw.addr, "/p/rpc", body.clone(), &[("traceparent", given)])
        .await
        .unwrap();
    a.post_with(gw.addr, "/p/rpc", body, &[]).await.unwrap();
    let seen = partner.seen();
    assert_eq!(seen[0].headers["traceparent"], given, "forwarded unchanged");
    let made = seen[1].headers["traceparent"].to_str().unwrap();
    assert!(
        aipgw::test_util::parse_traceparent(made).is_some(),
        "created: {made}"
    );
    assert!(seen[1].headers.contains_key("x-request-id"));
}

/// Shutdown under load: readiness goes false, no new connection is served, the in-flight
/// request is answered, and an open stream gets a final event before closing.
#[tokio::test]
async fn graceful_shutdown_answers_everything_accepted() {
    let pki = Pki::new();
    let slow = TestPartner::start(Behaviour::Delay(std::time::Duration::from_millis(300))).await;
    let sse = SsePartner::start(Restream::Error).await;
    let mut gw = start_gateway(
        &pki.config(
            "drain_timeout = \"1s\"",
            &[
                partner_block("slow", "/slow", &slow.url(), ""),
                partner_block("s", "/s", &sse.url(), ""),
            ]
            .concat(),
        ),
    )
    .await;
    let a = pki.leader(LEADER_A, false);
    let mut stream = a
        .open_stream(
            gw.addr,
            "/s/stream",
            &stream_body("\"st\"", LEADER_A, "t", "start", None),
            &[],
        )
        .await;
    let feed = sse.feed("t").await;
    feed.send(Ok(sse_event("\"st\"", 1, "working")))
        .await
        .unwrap();
    assert_eq!(
        within(10, stream.next_event()).await.unwrap().seq(),
        Some(1)
    );
    let in_flight = tokio::spawn({
        let a = a.clone();
        let addr = gw.addr;
        async move {
            a.post(addr, "/slow/rpc", &rpc_start("7", LEADER_A, "u"))
                .await
        }
    });
    within(10, async {
        while slow.seen().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;

    let server = gw.shutdown();
    within(10, async {
        while gw.admin_get("/readyz").await.0 != 503 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let reply = within(10, in_flight).await.unwrap().unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["result"]["late"], true);
    assert!(
        a.connect(gw.addr).await.is_err(),
        "a new connection was served while draining"
    );

    let last = within(10, stream.next_event()).await.expect("final event");
    assert_eq!(last.json["error"]["data"]["reason"], "shutting_down");
    assert_eq!(last.json["error"]["data"]["lastEventSeq"], 1);
    assert_eq!(last.json["id"], "st");
    assert!(within(10, stream.next_event()).await.is_none());
    within(10, server).await.unwrap().unwrap();
    drop(feed);
}

/// Open connections are counted per worker thread, placed on the least loaded worker,
/// and uncounted when they close (every integration test serves through two workers).
#[tokio::test]
async fn connections_are_counted_per_worker() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let a = pki.leader(LEADER_A, true);
    let mut held = Vec::new();
    for i in 0..3 {
        let (mut send, _) = a.h2_connection(gw.addr).await;
        let r = send_on(
            &mut send,
            "/p/rpc",
            &rpc_start(&i.to_string(), LEADER_A, "t"),
        )
        .await;
        assert_eq!(r.status, 200);
        held.push(send);
    }
    let m = metric(&gw, "aipgw_open_connections", 3.0).await;
    let per_worker = |m: &std::collections::HashMap<String, f64>| {
        [0, 1].map(|w| {
            m.get(&format!("aipgw_worker_connections{{worker=\"{w}\"}}"))
                .copied()
        })
    };
    // Three connections on two workers, each to the one with fewer: two and one.
    let mut counts = per_worker(&m).map(|c| c.expect("a gauge per worker"));
    counts.sort_by(f64::total_cmp);
    assert_eq!(counts, [1.0, 2.0]);
    drop(held);
    let m = metric(&gw, "aipgw_open_connections", 0.0).await;
    assert_eq!(per_worker(&m), [Some(0.0), Some(0.0)]);
}
