//! Issue 4: who may call what, and rate limits, through the gateway (tests 1-6; the
//! fake-clock refill and the 100,000-AIC cap are `ratelimit`'s unit tests).

use aipgw::identity::Aic;

use crate::support::*;

/// An AIC of another identity provider (`0002`).
fn other_provider() -> String {
    Aic::with_check_code("100020000111K9AAAAAAAAAAAAAAAA")
        .unwrap()
        .to_string()
}

fn body_for(method: &str, sender: &str, task: &str, command: &str) -> String {
    match method {
        "rpc" | "stream" => rpc_start("1", sender, task)
            .replace("\"method\":\"rpc\"", &format!("\"method\":\"{method}\""))
            .replace(
                "\"command\":\"start\"",
                &format!("\"command\":\"{command}\""),
            ),
        "notification/set" => format!(
            r#"{{"jsonrpc":"2.0","method":"notification/set","id":1,"params":{{"url":"https://l/cb","token":"secret","taskId":"{task}"}}}}"#
        ),
        m => format!(r#"{{"jsonrpc":"2.0","method":"{m}","id":1,"params":{{"taskId":"{task}"}}}}"#),
    }
}

#[tokio::test]
async fn allow_and_deny_lists() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let c = other_provider();
    let a_serial = &LEADER_A[..22];
    let partners = [
        // Provider prefix allowed, B denied by exact AIC.
        partner_block("p1", "/p1", &partner.url(), &format!("[partner.access]\nallow = [\"10001*\"]\ndeny = [\"{LEADER_B}\"]")),
        // Only A's agent serial (22-character field prefix).
        partner_block("p2", "/p2", &partner.url(), &format!("[partner.access]\nallow = [\"{a_serial}*\"]")),
        // Deny wins over allow.
        partner_block("p3", "/p3", &partner.url(), &format!("[partner.access]\nallow = [\"{LEADER_A}\"]\ndeny = [\"1000100001*\"]")),
        // Per method: only A may use notification/* and group; rpc is open.
        partner_block("p4", "/p4", &partner.url(), &format!("[[partner.access.methods]]\nmethods = [\"notification/*\", \"group\"]\nallow = [\"{LEADER_A}\"]")),
    ]
    .concat();
    let gw = start_gateway(&pki.config("", &partners)).await;
    let leader = |aic: &str| pki.leader(aic, false);
    let (a, b, cc) = (leader(LEADER_A), leader(LEADER_B), leader(&c));
    let call = |l: &Leader, path: &'static str, body: String| {
        let l = l.clone();
        let addr = gw.addr;
        async move { l.post(addr, path, &body).await.unwrap() }
    };
    let rpc = |aic: &str, task: &str| body_for("rpc", aic, task, "start");
    let expect = [
        (&a, "/p1/rpc", rpc(LEADER_A, "t1"), None),
        (&b, "/p1/rpc", rpc(LEADER_B, "t2"), Some("aic_denied")),
        (&cc, "/p1/rpc", rpc(&c, "t3"), Some("aic_not_allowed")),
        (&a, "/p2/rpc", rpc(LEADER_A, "t4"), None),
        (&b, "/p2/rpc", rpc(LEADER_B, "t5"), Some("aic_not_allowed")),
        (&a, "/p3/rpc", rpc(LEADER_A, "t6"), Some("aic_denied")),
        (&b, "/p4/rpc", rpc(LEADER_B, "t7"), None),
        (
            &b,
            "/p4/notification/set",
            body_for("notification/set", LEADER_B, "t7", ""),
            Some("aic_not_allowed"),
        ),
        (
            &a,
            "/p4/notification/set",
            body_for("notification/set", LEADER_A, "t8", ""),
            None,
        ),
        (
            &b,
            "/p4/group",
            r#"{"jsonrpc":"2.0","method":"group","id":1,"params":{}}"#.to_owned(),
            Some("aic_not_allowed"),
        ),
    ];
    for (i, (who, path, body, refusal)) in expect.into_iter().enumerate() {
        let r = call(who, path, body).await;
        match refusal {
            None => assert_eq!(r.status, 200, "case {i}: {}", r.text()),
            Some(reason) => {
                assert_eq!(r.status, 403, "case {i}: {}", r.text());
                assert_eq!(r.error(), (-32009, reason.to_owned()), "case {i}");
            }
        }
    }
}

#[tokio::test]
async fn only_leaders_call_through_the_gateway() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let a = pki.leader(LEADER_A, false);
    let body = rpc_start("\"r\"", LEADER_A, "t")
        .replace("\"senderRole\":\"leader\"", "\"senderRole\":\"partner\"");
    let r = a.post(gw.addr, "/p/rpc", &body).await.unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(r.error(), (-32009, "sender_role".into()));
    assert_eq!(r.json()["id"], "r");
    assert!(partner.seen().is_empty());
}

#[tokio::test]
async fn leaders_cannot_touch_each_others_tasks() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config("", &partner_block("p", "/p", &partner.url(), ""))).await;
    let a = pki.leader(LEADER_A, false);
    let b = pki.leader(LEADER_B, false);
    let r = a
        .post(
            gw.addr,
            "/p/rpc",
            &body_for("rpc", LEADER_A, "task-a", "start"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let attempts = [
        ("/p/rpc", body_for("rpc", LEADER_B, "task-a", "start")),
        ("/p/rpc", body_for("rpc", LEADER_B, "task-a", "get")),
        ("/p/rpc", body_for("rpc", LEADER_B, "task-a", "continue")),
        ("/p/rpc", body_for("rpc", LEADER_B, "task-a", "cancel")),
        ("/p/rpc", body_for("rpc", LEADER_B, "task-a", "complete")),
        (
            "/p/stream",
            body_for("stream", LEADER_B, "task-a", "re-stream"),
        ),
        (
            "/p/notification/set",
            body_for("notification/set", LEADER_B, "task-a", ""),
        ),
        (
            "/p/notification/get",
            body_for("notification/get", LEADER_B, "task-a", ""),
        ),
        (
            "/p/notification/delete",
            body_for("notification/delete", LEADER_B, "task-a", ""),
        ),
    ];
    for (path, body) in &attempts {
        let r = b.post(gw.addr, path, body).await.unwrap();
        assert_eq!(r.status, 403, "{path} {body}: {}", r.text());
        assert_eq!(r.error(), (-32009, "not_task_owner".into()), "{path}");
    }
    assert_eq!(partner.seen().len(), 1, "B's attempts reached the Partner");
    // A can do all of it (the stream re-stream is forwarded: nothing buffered).
    for (path, body) in &attempts[1..] {
        if path.ends_with("stream") {
            continue;
        }
        let body = body.replace(LEADER_B, LEADER_A);
        let r = a.post(gw.addr, path, &body).await.unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
}

#[tokio::test]
async fn blocked_aics_are_invalid_credentials() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "[policy]\nblocked = [\"{LEADER_B}\"]\n{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    ))
    .await;
    let b = pki.leader(LEADER_B, false);
    let r = b
        .post(gw.addr, "/p/rpc", &rpc_start("4", LEADER_B, "t"))
        .await
        .unwrap();
    assert_eq!(r.status, 401);
    assert_eq!(r.error(), (-32010, "blocked".into()));
    assert_eq!(r.json()["id"], 4);
    assert!(partner.seen().is_empty());
}

#[tokio::test]
async fn per_aic_rate_limit_answers_429() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    // 3 at once, then one every 100 s: the refill cannot happen during the test.
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "[ratelimit]\nrate = 0.01\nburst = 3\n{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    ))
    .await;
    let a = pki.leader(LEADER_A, true);
    let b = pki.leader(LEADER_B, false);
    for i in 0..3 {
        let r = a
            .post(gw.addr, "/p/rpc", &rpc_start(&i.to_string(), LEADER_A, "t"))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let r = a
        .post(gw.addr, "/p/rpc", &rpc_start("\"over\"", LEADER_A, "t"))
        .await
        .unwrap();
    assert_eq!(r.status, 429);
    assert_eq!(r.error(), (-32029, "aic_rate".into()));
    assert_eq!(r.json()["id"], "over");
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((90..=100).contains(&retry), "{retry}");
    let ms = r.json()["error"]["data"]["retryAfterMs"].as_u64().unwrap();
    assert!(ms > 90_000 && ms <= 100_000, "{ms}");
    assert_eq!(partner.seen().len(), 3);
    let r = b
        .post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_B, "u"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "another AIC is unaffected");
}

#[tokio::test]
async fn partner_total_and_in_flight_limits() {
    let pki = Pki::new();
    let fast = TestPartner::start(Behaviour::Echo).await;
    let slow = TestPartner::start(Behaviour::Hang).await;
    let gw = start_gateway(
        &pki.config(
            "",
            &[
                partner_block(
                    "fast",
                    "/fast",
                    &fast.url(),
                    "[partner.limits]\nrate = 0.01\nburst = 2",
                ),
                partner_block(
                    "slow",
                    "/slow",
                    &slow.url(),
                    "[partner.limits]\nmax_in_flight = 1",
                ),
            ]
            .concat(),
        ),
    )
    .await;
    let a = pki.leader(LEADER_A, false);
    let b = pki.leader(LEADER_B, false);
    assert_eq!(
        a.post(gw.addr, "/fast/rpc", &rpc_start("1", LEADER_A, "t1"))
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        b.post(gw.addr, "/fast/rpc", &rpc_start("1", LEADER_B, "t2"))
            .await
            .unwrap()
            .status,
        200
    );
    let r = a
        .post(gw.addr, "/fast/rpc", &rpc_start("1", LEADER_A, "t1"))
        .await
        .unwrap();
    assert_eq!(r.error(), (-32029, "partner_rate".into()));

    // One request hangs at the slow Partner; the next one is refused at once.
    let hung = tokio::spawn({
        let a = a.clone();
        let addr = gw.addr;
        async move {
            a.post(addr, "/slow/rpc", &rpc_start("1", LEADER_A, "t3"))
                .await
        }
    });
    within(10, async {
        while slow.seen().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let r = b
        .post(gw.addr, "/slow/rpc", &rpc_start("2", LEADER_B, "t4"))
        .await
        .unwrap();
    assert_eq!(r.status, 429);
    assert_eq!(r.error(), (-32029, "partner_in_flight".into()));
    assert_eq!(slow.seen().len(), 1);
    hung.abort();
}

#[tokio::test]
async fn concurrent_streams_per_aic() {
    let pki = Pki::new();
    let partner = SsePartner::start(Restream::Error).await;
    let gw = start_gateway(&pki.config(
        "",
        &format!(
            "[ratelimit]\nmax_streams_per_aic = 1\n{}",
            partner_block("p", "/p", &partner.url(), "")
        ),
    ))
    .await;
    let a = pki.leader(LEADER_A, false);
    let mut first = a
        .open_stream(
            gw.addr,
            "/p/stream",
            &stream_body("1", LEADER_A, "s1", "start", None),
            &[],
        )
        .await;
    assert_eq!(first.status, 200);
    let feed = partner.feed("s1").await;
    let second = a
        .post(
            gw.addr,
            "/p/stream",
            &stream_body("2", LEADER_A, "s2", "start", None),
        )
        .await
        .unwrap();
    assert_eq!(second.status, 429);
    assert_eq!(second.error(), (-32029, "aic_streams".into()));
    // The first stream ends; a new one may open.
    feed.send(Ok(sse_event("1", 1, "completed"))).await.unwrap();
    drop(feed);
    while within(10, first.next_event()).await.is_some() {}
    drop(first);
    let third = a
        .open_stream(
            gw.addr,
            "/p/stream",
            &stream_body("3", LEADER_A, "s3", "start", None),
            &[],
        )
        .await;
    assert_eq!(third.status, 200);
}
