//! Each section of the file converted into the settings type of the module that uses it
//! (`TryFrom` per section), checked on the way: durations positive, counts at least one,
//! addresses and URLs usable. Errors name the key. Paths arrive resolved (`resolve_paths`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};

use super::raw;
use super::{
    default_path, ListenerConfig, PartnerConfig, PartnerTlsConfig, RateLimitSettings, TaskPolicy,
    UpstreamConfig,
};
use crate::identity::aic::DottedCheck;
use crate::identity::Aic;
use crate::jsonrpc::Method;

fn positive(key: &str, d: Duration) -> anyhow::Result<()> {
    if d.is_zero() {
        bail!("{key}: must be greater than zero");
    }
    Ok(())
}

fn at_least_one(key: &str, n: usize) -> anyhow::Result<()> {
    if n == 0 {
        bail!("{key}: must be at least 1");
    }
    Ok(())
}

/// `[listener]`.
impl TryFrom<raw::RawListener> for ListenerConfig {
    type Error = anyhow::Error;

    fn try_from(l: raw::RawListener) -> anyhow::Result<ListenerConfig> {
        let bind: SocketAddr = l
            .bind
            .parse()
            .with_context(|| format!("listener.bind: {:?} is not an address:port", l.bind))?;
        if l.client_ca.is_empty() {
            bail!("listener.client_ca: at least one CA bundle is required");
        }
        positive("listener.handshake_timeout", l.handshake_timeout)?;
        positive("listener.handover_timeout", l.handover_timeout)?;
        positive("listener.header_read_timeout", l.header_read_timeout)?;
        positive("listener.body_read_timeout", l.body_read_timeout)?;
        positive("listener.write_timeout", l.write_timeout)?;
        positive("listener.idle_timeout", l.idle_timeout)?;
        positive(
            "listener.unverified_idle_timeout",
            l.unverified_idle_timeout,
        )?;
        positive(
            "listener.http2_keepalive_timeout",
            l.http2_keepalive_timeout,
        )?;
        at_least_one("listener.max_connections", l.max_connections)?;
        at_least_one("listener.max_handshakes_per_ip", l.max_handshakes_per_ip)?;
        at_least_one("listener.max_connections_per_ip", l.max_connections_per_ip)?;
        if !(1024..=1024 * 1024).contains(&l.max_head_bytes) {
            bail!("listener.max_head_bytes: must be between 1024 and 1048576");
        }
        if !(1..=crate::server::MAX_HEADERS).contains(&l.max_headers) {
            bail!(
                "listener.max_headers: must be between 1 and {}",
                crate::server::MAX_HEADERS
            );
        }
        if l.http2_max_concurrent_streams == 0 {
            bail!("listener.http2_max_concurrent_streams: must be at least 1");
        }
        Ok(ListenerConfig {
            bind,
            cert: l.cert,
            key: l.key,
            client_ca: l.client_ca,
            crl: l.crl,
            client_auth: l.client_auth,
            allow_expired_crl: l.allow_expired_crl,
            allow_unknown_revocation_status: l.allow_unknown_revocation_status,
            handshake_timeout: l.handshake_timeout,
            header_read_timeout: l.header_read_timeout,
            body_read_timeout: l.body_read_timeout,
            write_timeout: l.write_timeout,
            idle_timeout: l.idle_timeout,
            max_connections: l.max_connections,
            http2_max_concurrent_streams: l.http2_max_concurrent_streams,
            http2_keepalive_timeout: l.http2_keepalive_timeout,
            max_handshakes_per_ip: l.max_handshakes_per_ip,
            max_connections_per_ip: l.max_connections_per_ip,
            unverified_idle_timeout: l.unverified_idle_timeout,
            drain_timeout: l.drain_timeout,
            drain_idle_grace: l.drain_idle_grace,
            idle_release_after: l.idle_release_after,
            max_head_bytes: l.max_head_bytes,
            max_headers: l.max_headers,
            error_status: l.error_status,
            tls_session_cache: l.tls_session_cache,
            verdict_cache: l.verdict_cache,
            proxy_protocol: super::ProxyProtocol::try_from(&l.proxy_protocol)?,
            handover_socket: l.handover_socket,
            handover_timeout: l.handover_timeout,
            tls_groups: super::Groups::defaults(),
        })
    }
}

/// `[upstream]`.
impl TryFrom<&raw::RawUpstream> for UpstreamConfig {
    type Error = anyhow::Error;

    fn try_from(u: &raw::RawUpstream) -> anyhow::Result<UpstreamConfig> {
        positive("upstream.body_idle_timeout", u.body_idle_timeout)?;
        positive("upstream.connect_timeout", u.connect_timeout)?;
        positive("upstream.response_timeout", u.response_timeout)?;
        at_least_one("upstream.max_error_body_bytes", u.max_error_body_bytes)?;
        if !(65_535..=(1 << 31) - 1).contains(&u.http2_connection_window) {
            bail!("upstream.http2_connection_window: must be between 65535 and 2^31-1 bytes");
        }
        if u.max_response_head_bytes < 1024 {
            bail!("upstream.max_response_head_bytes: must be at least 1024");
        }
        at_least_one("upstream.max_connections", u.max_connections)?;
        Ok(UpstreamConfig {
            connect_timeout: u.connect_timeout,
            response_timeout: u.response_timeout,
            pool_idle_timeout: u.pool_idle_timeout,
            pool_max_idle_per_host: u.pool_max_idle_per_host,
            max_connections: u.max_connections,
            body_idle_timeout: u.body_idle_timeout,
            max_error_body_bytes: u.max_error_body_bytes,
            http2_connection_window: u.http2_connection_window,
            max_response_head_bytes: u.max_response_head_bytes,
            tls_groups: super::Groups::defaults(),
        })
    }
}

/// `[stream]`.
impl TryFrom<&raw::RawStream> for crate::sse::relay::StreamSettings {
    type Error = anyhow::Error;

    fn try_from(s: &raw::RawStream) -> anyhow::Result<crate::sse::relay::StreamSettings> {
        positive("stream.keepalive_interval", s.keepalive_interval)?;
        positive("stream.idle_timeout", s.idle_timeout)?;
        positive("stream.detach_timeout", s.detach_timeout)?;
        at_least_one("stream.max_event_bytes", s.max_event_bytes)?;
        Ok(crate::sse::relay::StreamSettings {
            keepalive_interval: s.keepalive_interval,
            idle_timeout: s.idle_timeout,
            detach_timeout: s.detach_timeout,
            max_event_bytes: s.max_event_bytes,
            on_upstream_failure: s.on_upstream_failure,
        })
    }
}

/// `[replay]` (its `sweep_interval` goes to the sweeper, checked with the rest).
impl TryFrom<&raw::RawReplay> for crate::sse::memory::ReplayLimits {
    type Error = anyhow::Error;

    fn try_from(r: &raw::RawReplay) -> anyhow::Result<crate::sse::memory::ReplayLimits> {
        at_least_one("replay.max_events_per_stream", r.max_events_per_stream)?;
        at_least_one("replay.max_bytes_per_stream", r.max_bytes_per_stream)?;
        at_least_one("replay.max_total_bytes", r.max_total_bytes)?;
        at_least_one("replay.max_streams", r.max_streams)?;
        Ok(crate::sse::memory::ReplayLimits {
            max_events_per_stream: r.max_events_per_stream,
            max_bytes_per_stream: r.max_bytes_per_stream,
            max_total_bytes: r.max_total_bytes,
            max_streams: r.max_streams,
            retention: r.retention,
        })
    }
}

/// `[identity]`: how dotted AICs are judged (registrar salts, whether they are required).
impl TryFrom<&raw::RawIdentity> for DottedCheck {
    type Error = anyhow::Error;

    fn try_from(i: &raw::RawIdentity) -> anyhow::Result<DottedCheck> {
        let mut salts = std::collections::HashMap::new();
        for (registrar, hex) in &i.registrar_salts.0 {
            let key = format!("identity.registrar_salts.{registrar:?}");
            let upper = registrar.to_ascii_uppercase();
            if crate::identity::aic::check_level(6, upper.as_bytes()).is_err() {
                bail!("{key}: not a registrar serial (1 to 6 characters of 0-9A-Z, not 0)");
            }
            // The salt itself is never echoed: it is a secret.
            let bytes =
                crate::hex::decode(hex).with_context(|| format!("{key}: the salt is not hex"))?;
            if bytes.len() < 2 {
                bail!("{key}: a salt has at least 2 bytes");
            }
            salts.insert(upper, bytes);
        }
        Ok(DottedCheck {
            required: i.dotted_check == raw::DottedCheckMode::Required,
            salts,
        })
    }
}

/// `[policy]`: sender roles and the block list.
impl TryFrom<&raw::RawPolicy> for crate::policy::GlobalPolicy {
    type Error = anyhow::Error;

    fn try_from(p: &raw::RawPolicy) -> anyhow::Result<crate::policy::GlobalPolicy> {
        Ok(crate::policy::GlobalPolicy {
            sender_roles: p.sender_roles.clone(),
            blocked: p
                .blocked
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    Aic::parse(a).map_err(|e| anyhow::anyhow!("policy.blocked[{i}]: {a:?}: {e}"))
                })
                .collect::<anyhow::Result<_>>()?,
        })
    }
}

/// `[policy.tasks]`.
impl TryFrom<&raw::RawTasks> for TaskPolicy {
    type Error = anyhow::Error;

    fn try_from(t: &raw::RawTasks) -> anyhow::Result<TaskPolicy> {
        if t.max_entries == 0 || t.ttl.is_zero() {
            bail!("policy.tasks: max_entries and ttl must be greater than zero");
        }
        Ok(TaskPolicy {
            max_entries: t.max_entries,
            ttl: t.ttl,
            unknown: t.unknown,
        })
    }
}

/// `[ratelimit]` (each Partner's rates are added as its section is read).
impl TryFrom<&raw::RawRateLimit> for RateLimitSettings {
    type Error = anyhow::Error;

    fn try_from(rl: &raw::RawRateLimit) -> anyhow::Result<RateLimitSettings> {
        if rl.max_keys == 0 || rl.sweep_interval.is_zero() {
            bail!("ratelimit: max_keys and sweep_interval must be greater than zero");
        }
        if rl.max_streams_per_aic == Some(0) {
            bail!("ratelimit.max_streams_per_aic: must be at least 1 (omit it for no limit)");
        }
        let mut limiter = crate::ratelimit::LimiterConfig {
            default: rate("ratelimit", rl.rate, rl.burst, rl.strict)?,
            max_keys: rl.max_keys,
            ..Default::default()
        };
        for (i, o) in rl.overrides.iter().enumerate() {
            let key = format!("ratelimit.aic[{i}]");
            let aic =
                Aic::parse(&o.aic).map_err(|e| anyhow::anyhow!("{key}.aic: {:?}: {e}", o.aic))?;
            let r = rate(&key, Some(o.rate), o.burst, o.strict)?.context("rate")?;
            if limiter.overrides.insert(aic, r).is_some() {
                bail!("{key}.aic: {} appears twice", o.aic);
            }
        }
        Ok(RateLimitSettings {
            limiter,
            sweep_interval: rl.sweep_interval,
            max_streams_per_aic: rl.max_streams_per_aic,
            reply_id_max_bytes: rl.reply_id_max_bytes,
        })
    }
}

/// A rate from `rate` (per second) and `burst` (default: the rate, rounded up).
fn rate(
    key: &str,
    per_second: Option<f64>,
    burst: Option<u32>,
    strict: bool,
) -> anyhow::Result<Option<crate::ratelimit::Rate>> {
    match (per_second, burst) {
        (None, None) => Ok(None),
        (None, Some(_)) => bail!("{key}: a burst needs a rate"),
        (Some(r), _) if !(r.is_finite() && r > 0.0) => {
            bail!("{key}: rate must be a positive number of requests per second")
        }
        (Some(_), Some(0)) => bail!("{key}: burst must be at least 1"),
        (Some(r), b) => Ok(Some(crate::ratelimit::Rate {
            per_second: r,
            burst: b.unwrap_or(r.ceil() as u32).max(1),
            strict,
        })),
    }
}

impl TryFrom<&raw::RawAccess> for crate::policy::PartnerAccess {
    type Error = anyhow::Error;

    fn try_from(a: &raw::RawAccess) -> anyhow::Result<crate::policy::PartnerAccess> {
        // The key is named only when an entry is refused: no string is made per Partner.
        let patterns = |key: &dyn std::fmt::Display,
                        list: &[String]|
         -> anyhow::Result<Vec<crate::policy::AicPattern>> {
            list.iter()
                .enumerate()
                .map(|(i, p)| p.parse().map_err(|e| anyhow::anyhow!("{key}[{i}]: {e}")))
                .collect()
        };
        let base = crate::policy::AccessRule {
            allow: patterns(&"access.allow", &a.allow)?,
            deny: patterns(&"access.deny", &a.deny)?,
        };
        let mut methods = Vec::new();
        for (i, m) in a.methods.iter().enumerate() {
            let key = format!("access.methods[{i}]");
            let set = crate::policy::method_set(&m.methods)
                .map_err(|e| anyhow::anyhow!("{key}.methods: {e}"))?;
            methods.push((
                set,
                crate::policy::AccessRule {
                    allow: patterns(&format_args!("{key}.allow"), &m.allow)?,
                    deny: patterns(&format_args!("{key}.deny"), &m.deny)?,
                },
            ));
        }
        // Compiled once per load (`policy::access`); the pattern lists are dropped here.
        Ok(crate::policy::PartnerAccess::new(&base, &methods))
    }
}

/// A `[[partner]]` (its paths already resolved).
impl TryFrom<raw::RawPartner> for PartnerConfig {
    type Error = anyhow::Error;

    fn try_from(p: raw::RawPartner) -> anyhow::Result<PartnerConfig> {
        if p.name.is_empty() {
            bail!("name: must not be empty");
        }
        if p.protocol == raw::PartnerProtocol::A2a {
            if !p.access.methods.is_empty() {
                bail!("access.methods names AIP methods: an A2A Partner (protocol = \"a2a\") has access.allow and access.deny only");
            }
            if !p.paths.is_empty() {
                bail!("paths names AIP methods: an A2A Partner (protocol = \"a2a\") is reached at its upstream URL itself");
            }
        }
        let prefix = normalize_prefix(&p.prefix).context("prefix")?;
        if p.upstreams.is_empty() {
            bail!("upstreams: at least one upstream URL is required");
        }
        let mut upstreams = Vec::new();
        for (j, u) in p.upstreams.iter().enumerate() {
            let uri: http::Uri = u
                .parse()
                .with_context(|| format!("upstreams[{j}]: {u:?} is not a URL"))?;
            match uri.scheme_str() {
                Some("http") => {}
                Some("https") if p.tls.is_some() => {}
                Some("https") => {
                    bail!("upstreams[{j}]: an https upstream needs [partner.tls] with a ca")
                }
                _ => bail!("upstreams[{j}]: {u:?} must start with http:// or https://"),
            }
            if uri.authority().is_none() || uri.query().is_some() {
                bail!("upstreams[{j}]: {u:?} must be scheme://host:port[/base-path]");
            }
            upstreams.push(uri);
        }
        let aic = p
            .aic
            .as_deref()
            .map(|a| Aic::parse(a).map_err(|e| anyhow::anyhow!("aic: {a:?}: {e}")))
            .transpose()?;
        // The defaults are borrowed: a fleet of Partners on the default paths allocates
        // none of them (seven strings a Partner, and as many again in each clone).
        let mut paths = Method::ALL.map(|m| std::borrow::Cow::Borrowed(default_path(m)));
        for (name, path) in p.paths {
            let m = Method::from_name(&name)
                .with_context(|| format!("paths.{name}: not an AIP method"))?;
            if !path.starts_with('/') {
                bail!("paths.{name}: {path:?} must start with /");
            }
            paths[m.index()] = std::borrow::Cow::Owned(path);
        }
        let tls = match p.tls {
            None => None,
            Some(t) => {
                let client_cert = match (t.cert, t.key) {
                    (Some(c), Some(k)) => Some((c, k)),
                    (None, None) => None,
                    _ => bail!("tls: cert and key go together"),
                };
                Some(PartnerTlsConfig {
                    ca: t.ca,
                    client_cert,
                    server_name: t.server_name,
                })
            }
        };
        let access = crate::policy::PartnerAccess::try_from(&p.access)?;
        let l = &p.limits;
        let rates = crate::ratelimit::PartnerRates {
            total: rate("limits", l.rate, l.burst, l.strict)?,
            per_aic: rate("limits.per_aic", l.per_aic_rate, l.per_aic_burst, l.strict)?,
        };
        if l.max_in_flight == Some(0) {
            bail!("limits.max_in_flight: must be at least 1 (omit it for no limit)");
        }
        let a2a = p.protocol == raw::PartnerProtocol::A2a;
        let (card, push) = (&p.a2a.card, &p.a2a.push);
        let a2a_card = a2a
            .then(|| {
                crate::a2a::card::settings::CardSettings::new(
                    card.public_url.as_deref(),
                    card.max_bytes,
                    card.refresh,
                    card.fetch_timeout,
                    card.max_stale,
                )
            })
            .transpose()
            .map_err(|e| anyhow::anyhow!("a2a.card.{e}"))?
            .map(std::sync::Arc::new);
        let a2a_push = a2a
            .then(|| {
                crate::a2a::push::PushPolicy::new(
                    &push.allow_hosts,
                    push.allow_http,
                    push.allow_private,
                    push.resolve_timeout,
                    push.max_resolving,
                )
            })
            .transpose()
            .map_err(|e| anyhow::anyhow!("a2a.push.{e}"))?
            .map(std::sync::Arc::new);
        Ok(PartnerConfig {
            access,
            rates,
            max_in_flight: l.max_in_flight,
            aip_version: p.aip_version,
            protocol: p.protocol,
            a2a_card,
            a2a_push,
            http2: p.http2,
            name: p.name,
            prefix,
            hosts: p.hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            upstreams,
            aic,
            paths,
            tls,
        })
    }
}

fn normalize_prefix(prefix: &str) -> anyhow::Result<String> {
    if !prefix.starts_with('/') {
        bail!("{prefix:?} must start with /");
    }
    if prefix.contains(['?', '#', ' ']) || prefix.contains("//") {
        bail!("{prefix:?} is not a plain path");
    }
    let trimmed = prefix.trim_end_matches('/');
    Ok(if trimmed.is_empty() { "/" } else { trimmed }.to_owned())
}

/// `cluster.topology` with the URLs it needs.
fn cluster_topology(c: &raw::RawCluster) -> anyhow::Result<()> {
    use crate::cluster::Topology;
    for u in &c.redis_urls {
        if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
            bail!("cluster.redis_urls: {u:?} must start with redis:// or rediss://");
        }
    }
    match c.topology {
        Topology::Single if !c.redis_urls.is_empty() => bail!(
            "cluster.redis_urls: only with topology = \"cluster\" (seed nodes) or \"sentinel\" \
             (Sentinels); a single server is redis_url alone"
        ),
        Topology::Sentinel if c.redis_url.starts_with("rediss://") => {
            bail!("cluster.redis_url: rediss:// is not supported with topology = \"sentinel\"")
        }
        Topology::Sentinel if c.sentinel_master.is_empty() => {
            bail!("cluster.sentinel_master: the master's name under Sentinel, not empty")
        }
        _ => {}
    }
    at_least_one("cluster.ratelimit.shards", c.ratelimit.shards)
}

/// `[cluster]`.
impl TryFrom<&raw::RawCluster> for crate::cluster::ClusterSettings {
    type Error = anyhow::Error;

    fn try_from(c: &raw::RawCluster) -> anyhow::Result<crate::cluster::ClusterSettings> {
        positive("cluster.command_timeout", c.command_timeout)?;
        positive("cluster.connect_timeout", c.connect_timeout)?;
        positive("cluster.stream_lease_ttl", c.stream_lease_ttl)?;
        positive(
            "cluster.unreachable_warn_interval",
            c.unreachable_warn_interval,
        )?;
        positive("cluster.ratelimit.sync_interval", c.ratelimit.sync_interval)?;
        at_least_one(
            "cluster.ratelimit.max_keys_per_call",
            c.ratelimit.max_keys_per_call,
        )?;
        let r = &c.replay;
        at_least_one("cluster.replay.queue_events", r.queue_events)?;
        at_least_one("cluster.replay.batch_events", r.batch_events)?;
        at_least_one(
            "cluster.replay.max_remote_followers",
            r.max_remote_followers,
        )?;
        positive("cluster.replay.write_timeout", r.write_timeout)?;
        positive("cluster.replay.recorder_lease_ttl", r.recorder_lease_ttl)?;
        positive("cluster.replay.read_block", r.read_block)?;
        positive("cluster.replay.flush_timeout", r.flush_timeout)?;
        let url = c.redis_url.as_str();
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            bail!("cluster.redis_url: {url:?} must start with redis:// or rediss://");
        }
        cluster_topology(c)?;
        let tls_files = c.tls_ca.is_some() || c.tls_cert.is_some() || c.tls_key.is_some();
        if tls_files && !url.starts_with("rediss://") {
            bail!("cluster.tls_ca, tls_cert, tls_key: only with a rediss:// redis_url");
        }
        let client = match (&c.tls_cert, &c.tls_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => bail!("cluster.tls_cert and cluster.tls_key: give both or neither"),
        };
        if c.key_prefix.contains(['{', '}']) {
            bail!("cluster.key_prefix: must not contain braces (keys carry hash tags)");
        }
        Ok(crate::cluster::ClusterSettings {
            mode: c.mode,
            topology: c.topology,
            redis_url: c.redis_url.clone(),
            redis_urls: c.redis_urls.clone(),
            sentinel_master: c.sentinel_master.clone(),
            quota_shards: c.ratelimit.shards,
            tls: crate::cluster::RedisTls {
                ca: c.tls_ca.clone(),
                client,
            },
            key_prefix: c.key_prefix.clone(),
            instance_id: if c.instance_id.is_empty() {
                crate::cluster::default_instance_id()
            } else {
                c.instance_id.clone()
            },
            command_timeout: c.command_timeout,
            connect_timeout: c.connect_timeout,
            on_error: c.on_error,
            unreachable_warn_interval: c.unreachable_warn_interval,
            sync_interval: c.ratelimit.sync_interval,
            max_keys_per_call: c.ratelimit.max_keys_per_call,
            stream_lease_ttl: c.stream_lease_ttl,
            replay: crate::cluster::ReplaySettings {
                enabled: r.enabled,
                queue_events: r.queue_events,
                batch_events: r.batch_events,
                write_timeout: r.write_timeout,
                recorder_lease_ttl: r.recorder_lease_ttl,
                read_block: r.read_block,
                max_remote_followers: r.max_remote_followers,
                flush_timeout: r.flush_timeout,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each section refuses a zero bound itself, naming its key.
    #[test]
    fn each_section_refuses_zero_bounds_naming_the_key() {
        let stream = raw::RawStream {
            detach_timeout: Duration::ZERO,
            ..toml::from_str("").unwrap()
        };
        let e = crate::sse::relay::StreamSettings::try_from(&stream).unwrap_err();
        assert_eq!(
            e.to_string(),
            "stream.detach_timeout: must be greater than zero"
        );

        let replay = raw::RawReplay {
            max_streams: 0,
            ..toml::from_str("").unwrap()
        };
        let e = crate::sse::memory::ReplayLimits::try_from(&replay).unwrap_err();
        assert_eq!(e.to_string(), "replay.max_streams: must be at least 1");

        let upstream = raw::RawUpstream {
            http2_connection_window: 1024,
            ..toml::from_str("").unwrap()
        };
        let e = UpstreamConfig::try_from(&upstream).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("upstream.http2_connection_window"),
            "{e}"
        );

        let tasks = raw::RawTasks {
            ttl: Duration::ZERO,
            ..toml::from_str("").unwrap()
        };
        assert!(TaskPolicy::try_from(&tasks).is_err());

        // The defaults of every section convert.
        let stream: raw::RawStream = toml::from_str("").unwrap();
        assert!(crate::sse::relay::StreamSettings::try_from(&stream).is_ok());
        let rl: raw::RawRateLimit = toml::from_str("").unwrap();
        assert!(RateLimitSettings::try_from(&rl).is_ok());
    }
}
