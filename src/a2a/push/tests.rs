use super::*;

fn policy(extra: &str) -> PushPolicy {
    let raw: crate::config::raw::RawA2aPush = toml::from_str(extra).unwrap();
    let p = (&raw.allow_hosts, raw.allow_http, raw.allow_private);
    PushPolicy::new(p.0, p.1, p.2, raw.resolve_timeout, raw.max_resolving).unwrap()
}

fn urls(body: &str) -> Option<Result<Vec<(&'static str, String)>, Unreadable>> {
    find(body.as_bytes()).map(|r| r.map(|v| v.into_iter().map(|u| (u.field, u.url)).collect()))
}

#[test]
fn finds_every_place_a_push_url_goes() {
    let one = |field, url: &str| Some(Ok(vec![(field, url.to_owned())]));
    assert_eq!(
        urls(
            r#"{"jsonrpc":"2.0","id":1,"method":"CreateTaskPushNotificationConfig","params":{"taskId":"t","url":"https://a.example/h"}}"#
        ),
        one("params.url", "https://a.example/h")
    );
    assert_eq!(
        urls(
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/pushNotificationConfig/set","params":{"taskId":"t","pushNotificationConfig":{"url":"https://b.example/h"}}}"#
        ),
        one("params.pushNotificationConfig.url", "https://b.example/h")
    );
    assert_eq!(
        urls(
            r#"{"id":1,"method":"SendMessage","params":{"message":{},"configuration":{"taskPushNotificationConfig":{"url":"https://c.example"}}}}"#
        ),
        one(
            "params.configuration.taskPushNotificationConfig.url",
            "https://c.example"
        )
    );
    assert_eq!(
        urls(
            r#"{"id":1,"method":"message/send","params":{"configuration":{"push_notification_config":{"url":"http://d.example"}}}}"#
        ),
        one(
            "params.configuration.pushNotificationConfig.url",
            "http://d.example"
        )
    );
    // An escaped key is found as the agent would read it.
    assert_eq!(
        urls(
            r#"{"id":1,"method":"SendMessage","params":{"configuration":{"taskPushNotification\u0043onfig":{"url":"https:\/\/e.example"}}}}"#
        ),
        one(
            "params.configuration.taskPushNotificationConfig.url",
            "https://e.example"
        )
    );
}

#[test]
fn bodies_without_push_config_are_not_parsed() {
    assert_eq!(
        urls(r#"{"id":1,"method":"SendMessage","params":{"message":{"parts":[]}}}"#),
        None
    );
    // Malformed, but nothing names a config: left to the envelope.
    assert_eq!(urls(r#"{"id":1,"params":"#), None);
    // Named, but no URL in it.
    assert_eq!(
        urls(
            r#"{"id":1,"method":"GetTaskPushNotificationConfig","params":{"taskId":"t","id":"c"}}"#
        ),
        None
    );
    // `params.url` counts only in a push-config method.
    assert_eq!(
        urls(
            r#"{"id":1,"method":"SendMessage","params":{"url":"http://x","pushNotificationConfigs":1}}"#
        ),
        None
    );
}

#[test]
fn an_unreadable_config_is_refused() {
    for body in [
        r#"{"id":1,"method":"SendMessage","params":{"configuration":{"taskPushNotificationConfig":{"url":5}}}}"#,
        r#"{"id":1,"method":"SendMessage","params":{"configuration":{"taskPushNotificationConfig":{"url":"https://a.example","url":"http://127.0.0.1"}}}}"#,
        r#"{"id":1,"method":"SendMessage","params":{"configuration":{"taskPushNotificationConfig":{"url":"https://a.example"},"task_push_notification_config":{"url":"http://127.0.0.1"}}}}"#,
        r#"{"id":1,"method":"CreateTaskPushNotificationConfig","params":{"url":["http://127.0.0.1"]}}"#,
    ] {
        assert!(matches!(urls(body), Some(Err(_))), "{body}");
    }
}

#[tokio::test]
async fn the_policy_by_default() {
    let p = policy("");
    for (url, why) in [
        ("http://93.184.215.14/h", "scheme \"http\" is not allowed"),
        ("ftp://93.184.215.14/h", "scheme \"ftp\""),
        ("https://10.0.0.1/h", "10.0.0.1 is a private address"),
        ("https://127.0.0.1:8080/h", "a loopback"),
        ("https://[::1]/h", "a loopback"),
        ("https://[::ffff:169.254.169.254]/h", "a link-local"),
        ("https://[fd12::1]/h", "a unique local"),
        ("https://100.100.1.1/", "a CGNAT"),
        ("https://localhost/h", "resolves to"),
        ("https://user@93.184.215.14/h", "user information"),
        ("https://93.184.215.14\\@127.0.0.1/h", "backslash"),
        ("https://93.184.215.14 /h", "whitespace"),
        ("/relative", "not an absolute URL"),
    ] {
        let e = p.check(url).await.unwrap_err();
        assert!(e.contains(why), "{url}: {e}");
    }
    p.check("https://93.184.215.14/hook").await.unwrap();
    p.check("https://[2606:4700::1111]:8443/hook")
        .await
        .unwrap();
}

#[tokio::test]
async fn allowed_hosts_http_and_private() {
    let p = policy("allow_hosts = [\"localhost\", \"*.hooks.example\"]\nallow_private = true\nallow_http = true");
    p.check("http://localhost:9/h").await.unwrap();
    p.check("https://a.hooks.example/h").await.unwrap();
    let e = p.check("https://127.0.0.1/h").await.unwrap_err();
    assert!(e.contains("not in allow_hosts"), "{e}");
    let e = p.check("https://hooks.example.evil/h").await.unwrap_err();
    assert!(e.contains("not in allow_hosts"), "{e}");
    // Listed but private, without allow_private: still refused.
    let p = policy("allow_hosts = [\"localhost\"]");
    assert!(p
        .check("https://localhost/h")
        .await
        .unwrap_err()
        .contains("a loopback"));
    let bad = PushPolicy::new(&["a/b".into()], false, false, Duration::from_secs(1), 1);
    assert!(bad.unwrap_err().contains("allow_hosts[0]"));
}

/// `max_resolving` names at once: a lookup waiting for a turn counts in its timeout.
#[tokio::test(start_paused = true)]
async fn resolutions_wait_for_a_turn_within_the_timeout() {
    let p = PushPolicy::new(&[], false, false, Duration::from_millis(300), 1).unwrap();
    let turn = p.resolving.clone().acquire_owned().await.unwrap();
    let e = p.check("https://localhost/h").await.unwrap_err();
    assert!(e.contains("did not resolve within 300ms"), "{e}");
    // An IP literal needs no turn.
    p.check("https://93.184.215.14/h").await.unwrap();
    drop(turn);
    assert!(p
        .check("https://localhost/h")
        .await
        .unwrap_err()
        .contains("resolves to"));
}
