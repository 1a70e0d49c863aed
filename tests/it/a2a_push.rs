//! A2A push-notification URLs (`[partner.a2a.push]`): a URL the agent would call is
//! checked before the request is forwarded. Refused: http, loopback, private, link-local,
//! v4-mapped IPv6, a host outside `allow_hosts`, in `CreateTaskPushNotificationConfig`,
//! `tasks/pushNotificationConfig/set` and inside `SendMessage`'s `configuration`; the
//! agent never sees those requests. Accepted: a public address, an allowed host; a body
//! without a push config reaches the agent byte for byte.

use bytes::Bytes;

use crate::a2a::a2a_error;
use crate::support::*;

/// A gateway in front of an A2A agent (a recording JSON-RPC upstream), with `push` as the
/// `[partner.a2a.push]` lines.
async fn a2a_gateway(push: &str) -> (Pki, TestPartner, TestGateway) {
    let pki = Pki::new();
    let agent = TestPartner::start(Behaviour::Fixed(
        r#"{"jsonrpc":"2.0","id":"1","result":{"id":"task-1","contextId":"c-1","status":{"state":"TASK_STATE_SUBMITTED"}}}"#,
    ))
    .await;
    let extra = format!("protocol = \"a2a\"\n[partner.a2a.push]\n{push}\n");
    let gw = start_gateway(&pki.config(
        "",
        &partner_block("agent", "/a2a/agent", &agent.url(), &extra),
    ))
    .await;
    (pki, agent, gw)
}

fn create_config(id: &str, url: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":"{id}","method":"CreateTaskPushNotificationConfig","params":{{"taskId":"task-1","id":"cfg","url":"{url}","token":"tok"}}}}"#
    )
}

fn set_config_v03(id: &str, url: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":"{id}","method":"tasks/pushNotificationConfig/set","params":{{"taskId":"task-1","pushNotificationConfig":{{"url":"{url}"}}}}}}"#
    )
}

fn send_message(id: &str, url: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":"{id}","method":"SendMessage","params":{{"message":{{"role":"ROLE_USER","messageId":"m1","parts":[{{"text":"hi"}}]}},"configuration":{{"returnImmediately":true,"taskPushNotificationConfig":{{"url":"{url}","token":"t"}}}}}}}}"#
    )
}

fn message_send_v03(id: &str, url: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":"{id}","method":"message/send","params":{{"message":{{"role":"user","messageId":"m1","kind":"message","parts":[{{"kind":"text","text":"hi"}}]}},"configuration":{{"pushNotificationConfig":{{"url":"{url}"}}}}}}}}"#
    )
}

/// Each body is refused 403 -32600 `push_url_refused`, its id echoed, naming the field
/// and the problem; the agent sees none of them.
#[tokio::test]
async fn private_loopback_link_local_mapped_and_http_urls_are_refused() {
    let (pki, agent, gw) = a2a_gateway("").await;
    let leader = pki.leader(LEADER_A, false);
    let cases = [
        (
            create_config("1", "https://10.1.2.3/hook"),
            "params.url",
            "a private address",
        ),
        (
            create_config("2", "https://127.0.0.1:8443/hook"),
            "params.url",
            "a loopback address",
        ),
        (
            create_config("3", "https://localhost/hook"),
            "params.url",
            "resolves to",
        ),
        (
            create_config("4", "https://169.254.169.254/latest/meta-data"),
            "params.url",
            "a link-local address",
        ),
        (
            create_config("5", "https://[::ffff:127.0.0.1]/hook"),
            "params.url",
            "a loopback address",
        ),
        (
            create_config("6", "https://[fd00::1]/hook"),
            "params.url",
            "unique local",
        ),
        (
            create_config("7", "http://93.184.215.14/hook"),
            "params.url",
            "scheme \\\"http\\\"",
        ),
        (
            set_config_v03("8", "https://192.168.1.10/hook"),
            "params.pushNotificationConfig.url",
            "a private address",
        ),
        (
            send_message("9", "https://100.64.0.7/hook"),
            "params.configuration.taskPushNotificationConfig.url",
            "CGNAT",
        ),
        (
            message_send_v03("10", "https://[::1]/hook"),
            "params.configuration.pushNotificationConfig.url",
            "a loopback address",
        ),
    ];
    for (i, (body, field, why)) in cases.iter().enumerate() {
        let reply = leader.post(gw.addr, "/a2a/agent", body).await.unwrap();
        let v = reply.json();
        assert_eq!(
            a2a_error(&reply),
            (403, -32600, "push_url_refused".into()),
            "{body}: {}",
            reply.text()
        );
        assert_eq!(v["id"], (i + 1).to_string(), "the id is echoed");
        assert_eq!(v["error"]["data"][0]["metadata"]["field"], *field, "{body}");
        assert!(reply.text().contains(why), "{body}: {}", reply.text());
    }
    assert!(
        agent.seen().is_empty(),
        "a refused push URL reached the agent"
    );
}

/// A config the gateway cannot read as the agent would (a key twice) is refused too.
#[tokio::test]
async fn an_ambiguous_config_is_refused() {
    let (pki, agent, gw) = a2a_gateway("").await;
    let leader = pki.leader(LEADER_A, true);
    let body = r#"{"jsonrpc":"2.0","id":7,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"m1","parts":[{"text":"hi"}]},"configuration":{"taskPushNotificationConfig":{"url":"https://93.184.215.14/a","url":"https://127.0.0.1/b"}}}}"#;
    let reply = leader.post(gw.addr, "/a2a/agent", body).await.unwrap();
    assert_eq!(
        a2a_error(&reply),
        (403, -32600, "push_url_refused".into()),
        "{}",
        reply.text()
    );
    assert_eq!(reply.json()["id"], 7);
    // Escaped so a byte search for the name misses it; the agent would still read it.
    let body = r#"{"jsonrpc":"2.0","id":8,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"m1","parts":[{"text":"hi"}]},"configuration":{"taskPushNotification\u0043onfig":{"url":"https://127.0.0.1/b"}}}}"#;
    let reply = leader.post(gw.addr, "/a2a/agent", body).await.unwrap();
    assert_eq!(
        a2a_error(&reply),
        (403, -32600, "push_url_refused".into()),
        "{}",
        reply.text()
    );
    assert!(agent.seen().is_empty());
}

/// Public addresses pass by default; with `allow_hosts` only the hosts listed do, and
/// with `allow_private` a listed internal host is accepted. Accepted bodies reach the
/// agent unchanged.
#[tokio::test]
async fn allowed_urls_reach_the_agent_unchanged() {
    let (pki, agent, gw) = a2a_gateway("").await;
    let leader = pki.leader(LEADER_A, false);
    let bodies = [
        create_config("1", "https://93.184.215.14/hook"),
        send_message("2", "https://[2606:4700::1111]:8443/hook"),
    ];
    for body in &bodies {
        let reply = leader.post(gw.addr, "/a2a/agent", body).await.unwrap();
        assert_eq!(reply.status, 200, "{body}: {}", reply.text());
        assert_eq!(reply.json()["result"]["id"], "task-1");
    }
    let seen = agent.seen();
    assert_eq!(seen.len(), 2);
    for (s, body) in seen.iter().zip(&bodies) {
        assert_eq!(s.body, body.as_bytes(), "body changed in transit");
    }

    let push = "allow_hosts = [\"localhost\", \"*.hooks.example\"]\nallow_private = true";
    let (pki, agent, gw) = a2a_gateway(push).await;
    let leader = pki.leader(LEADER_A, true);
    let ok = send_message("3", "https://localhost:9443/hook");
    let reply = leader.post(gw.addr, "/a2a/agent", &ok).await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = leader
        .post(
            gw.addr,
            "/a2a/agent",
            &create_config("4", "https://93.184.215.14/hook"),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 403, "{}", reply.text());
    assert!(
        reply.text().contains("not in allow_hosts"),
        "{}",
        reply.text()
    );
    let seen = agent.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, ok.as_bytes());
}

/// A body without a push config is forwarded as it came, over HTTP/1.1 and HTTP/2.
#[tokio::test]
async fn a_body_without_push_config_is_forwarded_unchanged() {
    let (pki, agent, gw) = a2a_gateway("").await;
    let body = r#"{"jsonrpc":"2.0","id":"s1","method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"m9","parts":[{"text":"the url https://127.0.0.1/ is only text"}]},"configuration":{"returnImmediately":true}}}"#;
    for h2 in [false, true] {
        let reply = pki
            .leader(LEADER_B, h2)
            .post_with(
                gw.addr,
                "/a2a/agent",
                Bytes::from_static(body.as_bytes()),
                &[("a2a-version", "1.0")],
            )
            .await
            .unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let seen = agent.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(s.body, body.as_bytes());
        assert_eq!(s.headers["a2a-version"], "1.0");
    }
}
