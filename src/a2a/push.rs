//! Push-notification URLs: an A2A agent calls the URL a caller hands it, from inside the
//! operator's network, so each one is checked against the Partner's policy
//! (`[partner.a2a.push]`) before the request is forwarded.
//!
//! Where they are ([`find`]): `params.url` of `CreateTaskPushNotificationConfig` (1.0),
//! `params.pushNotificationConfig.url` of `tasks/pushNotificationConfig/set` (0.3), and
//! `params.configuration.taskPushNotificationConfig.url` (1.0) or
//! `params.configuration.pushNotificationConfig.url` (0.3) of every method (the
//! `SendMessage` family carries them), each also under its snake_case spelling, which
//! the agents' parsers (protobuf JSON, pydantic by name) accept too. A body that names no
//! notification config and has no `\u` escape (which could spell one) is not parsed
//! here at all. A body that does, but cannot be read as that shape (a URL that is not a
//! string, a key written twice), is refused: the agent might read it otherwise.
//!
//! What is refused ([`PushPolicy::check`]): a scheme other than `https` (and `http` with
//! `allow_http`); user information, whitespace, control characters or a backslash in the
//! URL; a host outside `allow_hosts` when it is set; and, unless `allow_private`, a host
//! that is, or resolves (within `resolve_timeout`, at most `max_resolving` names at once)
//! to, any non-public address (`addr`).
//! The agent resolves the name again when it calls: a name whose DNS answer changes in
//! between (rebinding) is caught only by `allow_hosts`.

mod addr;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::LazyLock;
use std::time::Duration;

use memchr::memmem::Finder;
use serde::Deserialize;
use serde_json::value::RawValue;

/// A Partner's push-URL policy, validated (`[partner.a2a.push]`).
#[derive(Debug, Clone)]
pub struct PushPolicy {
    /// Exact host names, lowercase, without a trailing dot.
    hosts: Vec<String>,
    /// `*.example.com` entries, as `.example.com`.
    suffixes: Vec<String>,
    allow_http: bool,
    allow_private: bool,
    resolve_timeout: Duration,
    /// Resolutions under way for this Partner (`max_resolving` permits).
    resolving: std::sync::Arc<tokio::sync::Semaphore>,
}

impl PushPolicy {
    /// The policy of `[partner.a2a.push]` (see `config::raw::RawA2aPush`), or what is
    /// wrong with it.
    pub fn new(
        allow_hosts: &[String],
        allow_http: bool,
        allow_private: bool,
        resolve_timeout: Duration,
        max_resolving: usize,
    ) -> Result<PushPolicy, String> {
        let mut hosts = Vec::new();
        let mut suffixes = Vec::new();
        for (i, h) in allow_hosts.iter().enumerate() {
            let h = h.trim_end_matches('.').to_ascii_lowercase();
            let name = h.strip_prefix("*.").unwrap_or(&h);
            let odd = name.contains(['*', '/', ':', '@', ' ']) && name.parse::<IpAddr>().is_err();
            if name.is_empty() || odd {
                return Err(format!(
                    "allow_hosts[{i}]: {h:?} is not a host name, `*.name` or an IP address"
                ));
            }
            match h.strip_prefix('*') {
                Some(suffix) => suffixes.push(suffix.to_owned()),
                None => hosts.push(h),
            }
        }
        if resolve_timeout.is_zero() || max_resolving == 0 {
            return Err("resolve_timeout and max_resolving: must be more than 0".into());
        }
        Ok(PushPolicy {
            hosts,
            suffixes,
            allow_http,
            allow_private,
            resolve_timeout,
            resolving: std::sync::Arc::new(tokio::sync::Semaphore::new(max_resolving)),
        })
    }
}

/// A push URL found in a request, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushUrl {
    /// Where in the body (`params.configuration.taskPushNotificationConfig.url`).
    pub(crate) field: &'static str,
    /// The URL, unescaped.
    pub(crate) url: String,
}

/// Why a body's push URLs could not be read: the body is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable(pub(crate) String);

static NAMES: LazyLock<[Finder<'static>; 3]> = LazyLock::new(|| {
    [
        Finder::new("otificationConfig"),
        Finder::new("otification_config"),
        Finder::new("\\u"),
    ]
});

/// The push URLs `body` hands the agent: `None` when there are none (most bodies, found
/// by a byte search without parsing).
pub fn find(body: &[u8]) -> Option<Result<Vec<PushUrl>, Unreadable>> {
    if !NAMES.iter().any(|f| f.find(body).is_some()) {
        return None;
    }
    let request: Request<'_> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return Some(Err(Unreadable(format!(
                "push notification config unreadable: {e}"
            ))))
        }
    };
    let params = request.params?;
    let mut urls = Vec::new();
    let config_method = request
        .method
        .as_deref()
        .is_some_and(|m| m.contains("ushNotificationConfig"));
    let mut push = |field: &'static str, url: Option<Cow<'_, str>>| {
        if let Some(url) = url {
            urls.push(PushUrl {
                field,
                url: url.into_owned(),
            });
        }
    };
    if config_method {
        if let Some(raw) = params.url {
            match serde_json::from_str::<Option<Cow<'_, str>>>(raw.get()) {
                Ok(url) => push("params.url", url),
                Err(_) => return Some(Err(Unreadable("params.url is not a string".into()))),
            }
        }
    }
    push(
        "params.pushNotificationConfig.url",
        params.push_notification_config.and_then(|c| c.url),
    );
    if let Some(c) = params.configuration {
        push(
            "params.configuration.taskPushNotificationConfig.url",
            c.task_push_notification_config.and_then(|c| c.url),
        );
        push(
            "params.configuration.pushNotificationConfig.url",
            c.push_notification_config.and_then(|c| c.url),
        );
    }
    (!urls.is_empty()).then_some(Ok(urls))
}

/// The parts of a request that may hold a push URL; the rest is skipped unread.
#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<Params<'a>>,
}

#[derive(Deserialize)]
struct Params<'a> {
    /// `CreateTaskPushNotificationConfig` (1.0): the config is the params.
    #[serde(borrow, default)]
    url: Option<&'a RawValue>,
    /// `tasks/pushNotificationConfig/set` (0.3).
    #[serde(
        borrow,
        default,
        rename = "pushNotificationConfig",
        alias = "push_notification_config"
    )]
    push_notification_config: Option<Config<'a>>,
    /// `SendMessage`, `SendStreamingMessage`, `message/send`, `message/stream`.
    #[serde(borrow, default)]
    configuration: Option<Configuration<'a>>,
}

#[derive(Deserialize)]
struct Configuration<'a> {
    /// 1.0.
    #[serde(
        borrow,
        default,
        rename = "taskPushNotificationConfig",
        alias = "task_push_notification_config"
    )]
    task_push_notification_config: Option<Config<'a>>,
    /// 0.3.
    #[serde(
        borrow,
        default,
        rename = "pushNotificationConfig",
        alias = "push_notification_config"
    )]
    push_notification_config: Option<Config<'a>>,
}

#[derive(Deserialize)]
struct Config<'a> {
    #[serde(borrow, default)]
    url: Option<Cow<'a, str>>,
}

/// Where a push URL leads, read from its text.
#[derive(Debug, PartialEq, Eq)]
enum Host {
    Ip(IpAddr),
    Name(String),
}

impl PushPolicy {
    /// Whether the agent may be handed `url`; `Err` says why not.
    pub(crate) async fn check(&self, url: &str) -> Result<(), String> {
        let (host, port) = self.read(url)?;
        if self.allow_private {
            return Ok(());
        }
        let name = match host {
            Host::Ip(ip) => return judge(&ip.to_string(), ip),
            Host::Name(name) => name,
        };
        // At most `max_resolving` at once; waiting for a turn counts in the timeout.
        let lookup = async {
            let _turn = self.resolving.acquire().await;
            tokio::net::lookup_host((name.as_str(), port)).await
        };
        let addrs = match tokio::time::timeout(self.resolve_timeout, lookup).await {
            Err(_) => {
                return Err(format!(
                    "host {name:?} did not resolve within {:?}",
                    self.resolve_timeout
                ))
            }
            Ok(Err(e)) => return Err(format!("host {name:?} does not resolve: {e}")),
            Ok(Ok(addrs)) => addrs,
        };
        let mut any = false;
        for a in addrs {
            any = true;
            judge(&name, a.ip())?;
        }
        if !any {
            return Err(format!("host {name:?} has no address"));
        }
        Ok(())
    }

    /// The checks made on the URL's text: scheme, form, allowed hosts; its host and port.
    fn read(&self, url: &str) -> Result<(Host, u16), String> {
        if url.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'\\') {
            return Err("the URL holds whitespace, a control character or a backslash".into());
        }
        let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        let default_port = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
            Some("https") => 443,
            Some("http") if self.allow_http => 80,
            Some(other) => {
                return Err(format!(
                    "scheme {other:?} is not allowed (https only{})",
                    if self.allow_http { " or http" } else { "" }
                ))
            }
            None => return Err("not an absolute URL".into()),
        };
        let Some(authority) = uri.authority() else {
            return Err("the URL names no host".into());
        };
        if authority.as_str().contains('@') {
            return Err("user information in a push URL is not allowed".into());
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if host.is_empty() {
            return Err("the URL names no host".into());
        }
        if !self.hosts.is_empty() || !self.suffixes.is_empty() {
            let listed = self.hosts.contains(&host)
                || self.suffixes.iter().any(|s| host.ends_with(s.as_str()));
            if !listed {
                return Err(format!("host {host:?} is not in allow_hosts"));
            }
        }
        let port = uri.port_u16().unwrap_or(default_port);
        Ok(match host.parse::<IpAddr>() {
            Ok(ip) => (Host::Ip(ip), port),
            Err(_) => (Host::Name(host), port),
        })
    }
}

/// An address `host` leads to, refused unless it is public.
fn judge(host: &str, ip: IpAddr) -> Result<(), String> {
    match addr::non_public(ip) {
        None => Ok(()),
        Some(kind) if host == ip.to_string() => Err(format!("{ip} is {kind} address")),
        Some(kind) => Err(format!("host {host:?} resolves to {ip}, {kind} address")),
    }
}

#[cfg(test)]
mod tests;
