//! Configuration: the TOML file ([`raw`]) turned into a validated [`Config`].
//!
//! Every check happens here, once, at load: addresses parse, durations are positive,
//! Partner names and routes are unique, URLs are usable, paths are resolved against the
//! config file's folder. Nothing is re-checked per request. Errors name the key.
//! Must not: read certificate contents (that is `tls`), or touch the network.

pub mod raw;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::identity::Aic;
use crate::jsonrpc::Method;
pub use raw::ClientAuthMode;
use raw::{RawConfig, RawPartner};

/// Settings enums the rest of the gateway names (the file's raw structs stay in `raw`).
pub use raw::{AipVersion, LogFormat};

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, if any.
    pub source: Option<PathBuf>,
    /// The listener.
    pub listener: ListenerConfig,
    /// DNS suffix of v1-profile AIC names.
    pub aic_domain_suffix: String,
    /// How dotted AIC check codes are verified (with the registrars' salts).
    pub dotted: crate::identity::aic::DottedCheck,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Partner connection settings.
    pub upstream: UpstreamConfig,
    /// SSE relay bounds.
    pub stream: crate::sse::relay::StreamSettings,
    /// Replay buffer bounds.
    pub replay: crate::sse::memory::ReplayLimits,
    /// How often the upkeep task expires finished replay records and task owners.
    pub replay_sweep_interval: Duration,
    /// Gateway-wide authorization rules.
    pub policy: crate::policy::GlobalPolicy,
    /// Task ownership settings.
    pub tasks: TaskPolicy,
    /// Rate limit settings.
    pub ratelimit: RateLimitSettings,
    /// The admin listener's address (`None`: off).
    pub admin_bind: Option<SocketAddr>,
    /// Log filter.
    pub log_level: String,
    /// Log format.
    pub log_format: raw::LogFormat,
    /// Worker threads (`0`: one per CPU the process may run on); read at start only.
    pub worker_threads: usize,
    /// Watch files for hot reload.
    pub reload_watch: bool,
    /// Reload debounce.
    pub reload_debounce: Duration,
    /// The Partners, in file order.
    pub partners: Vec<PartnerConfig>,
}

/// `[listener]`, validated. Field meanings and defaults: see [`raw::RawListener`].
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct ListenerConfig {
    pub bind: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Vec<PathBuf>,
    pub crl: Vec<PathBuf>,
    pub client_auth: ClientAuthMode,
    pub allow_expired_crl: bool,
    pub allow_unknown_revocation_status: bool,
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub http2_max_concurrent_streams: u32,
    pub http2_keepalive_timeout: Duration,
    pub max_handshakes_per_ip: usize,
    pub drain_timeout: Duration,
    pub error_status: raw::ErrorStatus,
    pub tls_session_cache: usize,
}

/// `[upstream]`, validated. Field meanings and defaults: see [`raw::RawUpstream`].
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct UpstreamConfig {
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    pub body_idle_timeout: Duration,
    pub max_error_body_bytes: usize,
    pub http2_connection_window: u32,
}

/// `[policy.tasks]`, validated.
#[derive(Debug, Clone, Copy)]
pub struct TaskPolicy {
    /// Tasks remembered at most.
    pub max_entries: usize,
    /// Forgotten this long after last use.
    pub ttl: Duration,
    /// Commands on tasks with no known owner.
    pub unknown: raw::UnknownTask,
}

/// `[ratelimit]` (and every `[partner.limits]` quota), validated.
#[derive(Debug, Clone)]
pub struct RateLimitSettings {
    /// What the limiter is built from.
    pub limiter: crate::ratelimit::LimiterConfig,
    /// Sweep period.
    pub sweep_interval: Duration,
    /// Open streams per AIC at most.
    pub max_streams_per_aic: Option<usize>,
    /// A refused request's body is read only up to this size, to echo its id.
    pub reply_id_max_bytes: usize,
}

/// One Partner, validated.
#[derive(Debug, Clone)]
pub struct PartnerConfig {
    /// Unique name.
    pub name: String,
    /// Normalized path prefix (`/` or `/a/b`, no trailing slash).
    pub prefix: String,
    /// Lowercase host names; empty = any.
    pub hosts: Vec<String>,
    /// Upstream base URLs.
    pub upstreams: Vec<http::Uri>,
    /// The Partner's own AIC, checked in its certificate over https.
    pub aic: Option<Aic>,
    /// Which AIP generation it speaks.
    pub aip_version: raw::AipVersion,
    /// HTTP/2 only (prior knowledge over `http://`).
    pub http2: bool,
    /// Upstream path for each method, indexed by [`Method::index`].
    pub paths: [String; Method::ALL.len()],
    /// TLS to the Partner.
    pub tls: Option<PartnerTlsConfig>,
    /// Who may call it.
    pub access: crate::policy::PartnerAccess,
    /// Its quotas.
    pub rates: crate::ratelimit::PartnerRates,
    /// Requests in flight to it at most.
    pub max_in_flight: Option<usize>,
}

/// `[partner.tls]`, with resolved paths.
#[derive(Debug, Clone)]
pub struct PartnerTlsConfig {
    /// CA bundle for the Partner's server certificate.
    pub ca: PathBuf,
    /// Gateway client certificate and key, for mutual TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Name to verify instead of the URL host.
    pub server_name: Option<String>,
}

/// The default upstream path of each method.
pub fn default_path(method: Method) -> &'static str {
    match method {
        Method::Rpc => "/rpc",
        Method::Stream => "/stream",
        Method::NotificationSet => "/notification/set",
        Method::NotificationGet => "/notification/get",
        Method::NotificationDelete => "/notification/delete",
        Method::NotificationStart => "/notification/start",
        Method::Group => "/group/rpc",
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut cfg = Config::parse(&text, base)
            .with_context(|| format!("invalid config file {}", path.display()))?;
        cfg.source = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// Parses and validates TOML text; relative paths are resolved against `base`.
    pub fn parse(text: &str, base: &Path) -> anyhow::Result<Config> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        Config::from_raw(raw, base)
    }

    fn from_raw(raw: RawConfig, base: &Path) -> anyhow::Result<Config> {
        let resolve = |p: &Path| -> PathBuf {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        let l = raw.listener;
        let bind: SocketAddr = l
            .bind
            .parse()
            .with_context(|| format!("listener.bind: {:?} is not an address:port", l.bind))?;
        if l.client_ca.is_empty() {
            bail!("listener.client_ca: at least one CA bundle is required");
        }
        for (key, d) in [
            ("listener.handshake_timeout", l.handshake_timeout),
            ("listener.header_read_timeout", l.header_read_timeout),
            ("listener.body_read_timeout", l.body_read_timeout),
            ("listener.idle_timeout", l.idle_timeout),
            (
                "listener.http2_keepalive_timeout",
                l.http2_keepalive_timeout,
            ),
            ("upstream.body_idle_timeout", raw.upstream.body_idle_timeout),
            ("upstream.connect_timeout", raw.upstream.connect_timeout),
            ("upstream.response_timeout", raw.upstream.response_timeout),
            ("stream.keepalive_interval", raw.stream.keepalive_interval),
            ("stream.idle_timeout", raw.stream.idle_timeout),
            ("stream.detach_timeout", raw.stream.detach_timeout),
        ] {
            if d.is_zero() {
                bail!("{key}: must be greater than zero");
            }
        }
        if l.max_connections == 0 {
            bail!("listener.max_connections: must be at least 1");
        }
        if l.max_handshakes_per_ip == 0 {
            bail!("listener.max_handshakes_per_ip: must be at least 1");
        }
        if l.http2_max_concurrent_streams == 0 {
            bail!("listener.http2_max_concurrent_streams: must be at least 1");
        }
        for (key, n) in [
            ("stream.max_event_bytes", raw.stream.max_event_bytes),
            (
                "replay.max_events_per_stream",
                raw.replay.max_events_per_stream,
            ),
            (
                "replay.max_bytes_per_stream",
                raw.replay.max_bytes_per_stream,
            ),
            ("replay.max_total_bytes", raw.replay.max_total_bytes),
            ("replay.max_streams", raw.replay.max_streams),
            (
                "upstream.max_error_body_bytes",
                raw.upstream.max_error_body_bytes,
            ),
        ] {
            if n == 0 {
                bail!("{key}: must be at least 1");
            }
        }
        if !(65_535..=(1 << 31) - 1).contains(&raw.upstream.http2_connection_window) {
            bail!("upstream.http2_connection_window: must be between 65535 and 2^31-1 bytes");
        }
        if raw.limits.max_body_bytes == 0 {
            bail!("limits.max_body_bytes: must be at least 1");
        }
        let suffix = raw.identity.aic_domain_suffix.trim_matches('.').to_owned();
        if suffix.is_empty() {
            bail!("identity.aic_domain_suffix: must not be empty");
        }
        let listener = ListenerConfig {
            bind,
            cert: resolve(&l.cert),
            key: resolve(&l.key),
            client_ca: l.client_ca.iter().map(|p| resolve(p)).collect(),
            crl: l.crl.iter().map(|p| resolve(p)).collect(),
            client_auth: l.client_auth,
            allow_expired_crl: l.allow_expired_crl,
            allow_unknown_revocation_status: l.allow_unknown_revocation_status,
            handshake_timeout: l.handshake_timeout,
            header_read_timeout: l.header_read_timeout,
            body_read_timeout: l.body_read_timeout,
            idle_timeout: l.idle_timeout,
            max_connections: l.max_connections,
            http2_max_concurrent_streams: l.http2_max_concurrent_streams,
            http2_keepalive_timeout: l.http2_keepalive_timeout,
            max_handshakes_per_ip: l.max_handshakes_per_ip,
            drain_timeout: l.drain_timeout,
            error_status: l.error_status,
            tls_session_cache: l.tls_session_cache,
        };
        let mut salts = std::collections::HashMap::new();
        for (registrar, hex) in &raw.identity.registrar_salts.0 {
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
        let dotted = crate::identity::aic::DottedCheck {
            required: raw.identity.dotted_check == raw::DottedCheckMode::Required,
            salts,
        };
        let policy = crate::policy::GlobalPolicy {
            sender_roles: raw.policy.sender_roles.clone(),
            blocked: raw
                .policy
                .blocked
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    Aic::parse(a).map_err(|e| anyhow::anyhow!("policy.blocked[{i}]: {a:?}: {e}"))
                })
                .collect::<anyhow::Result<_>>()?,
        };
        let t = &raw.policy.tasks;
        if t.max_entries == 0 || t.ttl.is_zero() {
            bail!("policy.tasks: max_entries and ttl must be greater than zero");
        }
        let tasks = TaskPolicy {
            max_entries: t.max_entries,
            ttl: t.ttl,
            unknown: t.unknown,
        };
        let rl = &raw.ratelimit;
        if rl.max_keys == 0 || rl.sweep_interval.is_zero() {
            bail!("ratelimit: max_keys and sweep_interval must be greater than zero");
        }
        if raw.replay.sweep_interval.is_zero() {
            bail!("replay.sweep_interval must be greater than zero");
        }
        if rl.max_streams_per_aic == Some(0) {
            bail!("ratelimit.max_streams_per_aic: must be at least 1 (omit it for no limit)");
        }
        let mut limiter = crate::ratelimit::LimiterConfig {
            default: rate("ratelimit", rl.rate, rl.burst)?,
            max_keys: rl.max_keys,
            ..Default::default()
        };
        for (i, o) in rl.overrides.iter().enumerate() {
            let key = format!("ratelimit.aic[{i}]");
            let aic =
                Aic::parse(&o.aic).map_err(|e| anyhow::anyhow!("{key}.aic: {:?}: {e}", o.aic))?;
            let r = rate(&key, Some(o.rate), o.burst)?.context("rate")?;
            if limiter.overrides.insert(aic, r).is_some() {
                bail!("{key}.aic: {} appears twice", o.aic);
            }
        }
        let mut names = HashSet::new();
        let mut routes = HashSet::new();
        let mut partners = Vec::with_capacity(raw.partners.len());
        for (i, p) in raw.partners.into_iter().enumerate() {
            let key = format!("partner[{i}] ({})", p.name);
            let partner = partner_from_raw(p, &resolve).with_context(|| key.clone())?;
            if let Some(aic) = partner.aic {
                dotted
                    .judge(&aic)
                    .map_err(|e| anyhow::anyhow!("{key}.aic: {aic}: {e}"))?;
            }
            if !names.insert(partner.name.clone()) {
                bail!("{key}.name: another Partner has this name");
            }
            let hosts: Vec<Option<String>> = if partner.hosts.is_empty() {
                vec![None]
            } else {
                partner.hosts.iter().cloned().map(Some).collect()
            };
            for h in hosts {
                if !routes.insert((partner.prefix.clone(), h.clone())) {
                    bail!(
                        "{key}.prefix: another Partner already has prefix {} for {}",
                        partner.prefix,
                        h.as_deref().unwrap_or("any host")
                    );
                }
            }
            limiter.partners.insert(partner.name.clone(), partner.rates);
            partners.push(partner);
        }
        Ok(Config {
            source: None,
            listener,
            aic_domain_suffix: suffix,
            dotted: dotted.clone(),
            max_body_bytes: raw.limits.max_body_bytes,
            upstream: UpstreamConfig {
                connect_timeout: raw.upstream.connect_timeout,
                response_timeout: raw.upstream.response_timeout,
                pool_idle_timeout: raw.upstream.pool_idle_timeout,
                pool_max_idle_per_host: raw.upstream.pool_max_idle_per_host,
                body_idle_timeout: raw.upstream.body_idle_timeout,
                max_error_body_bytes: raw.upstream.max_error_body_bytes,
                http2_connection_window: raw.upstream.http2_connection_window,
            },
            stream: crate::sse::relay::StreamSettings {
                keepalive_interval: raw.stream.keepalive_interval,
                idle_timeout: raw.stream.idle_timeout,
                detach_timeout: raw.stream.detach_timeout,
                max_event_bytes: raw.stream.max_event_bytes,
                on_upstream_failure: raw.stream.on_upstream_failure,
            },
            replay: crate::sse::memory::ReplayLimits {
                max_events_per_stream: raw.replay.max_events_per_stream,
                max_bytes_per_stream: raw.replay.max_bytes_per_stream,
                max_total_bytes: raw.replay.max_total_bytes,
                max_streams: raw.replay.max_streams,
                retention: raw.replay.retention,
            },
            replay_sweep_interval: raw.replay.sweep_interval,
            admin_bind: match raw.admin.bind.as_str() {
                "" => None,
                b => Some(
                    b.parse()
                        .with_context(|| format!("admin.bind: {b:?} is not an address:port"))?,
                ),
            },
            log_level: raw.log.level.clone(),
            reload_watch: raw.reload.watch,
            reload_debounce: raw.reload.debounce,
            log_format: raw.log.format,
            worker_threads: raw.runtime.worker_threads,
            policy,
            tasks,
            ratelimit: RateLimitSettings {
                limiter,
                sweep_interval: rl.sweep_interval,
                max_streams_per_aic: rl.max_streams_per_aic,
                reply_id_max_bytes: rl.reply_id_max_bytes,
            },
            partners,
        })
    }
}

/// A rate from `rate` (per second) and `burst` (default: the rate, rounded up).
fn rate(
    key: &str,
    per_second: Option<f64>,
    burst: Option<u32>,
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
        })),
    }
}

fn access_from_raw(a: &raw::RawAccess) -> anyhow::Result<crate::policy::PartnerAccess> {
    let patterns =
        |key: String, list: &[String]| -> anyhow::Result<Vec<crate::policy::AicPattern>> {
            list.iter()
                .enumerate()
                .map(|(i, p)| p.parse().map_err(|e| anyhow::anyhow!("{key}[{i}]: {e}")))
                .collect()
        };
    let mut access = crate::policy::PartnerAccess {
        base: crate::policy::AccessRule {
            allow: patterns("access.allow".into(), &a.allow)?,
            deny: patterns("access.deny".into(), &a.deny)?,
        },
        methods: Vec::new(),
    };
    for (i, m) in a.methods.iter().enumerate() {
        let key = format!("access.methods[{i}]");
        let set = crate::policy::method_set(&m.methods)
            .map_err(|e| anyhow::anyhow!("{key}.methods: {e}"))?;
        access.methods.push((
            set,
            crate::policy::AccessRule {
                allow: patterns(format!("{key}.allow"), &m.allow)?,
                deny: patterns(format!("{key}.deny"), &m.deny)?,
            },
        ));
    }
    Ok(access)
}

fn partner_from_raw(
    p: RawPartner,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> anyhow::Result<PartnerConfig> {
    if p.name.is_empty() {
        bail!("name: must not be empty");
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
    let mut paths = Method::ALL.map(|m| default_path(m).to_owned());
    for (name, path) in p.paths {
        let m =
            Method::from_name(&name).with_context(|| format!("paths.{name}: not an AIP method"))?;
        if !path.starts_with('/') {
            bail!("paths.{name}: {path:?} must start with /");
        }
        paths[m.index()] = path;
    }
    let tls = match p.tls {
        None => None,
        Some(t) => {
            let client_cert = match (t.cert, t.key) {
                (Some(c), Some(k)) => Some((resolve(&c), resolve(&k))),
                (None, None) => None,
                _ => bail!("tls: cert and key go together"),
            };
            Some(PartnerTlsConfig {
                ca: resolve(&t.ca),
                client_cert,
                server_name: t.server_name,
            })
        }
    };
    let access = access_from_raw(&p.access)?;
    let l = &p.limits;
    let rates = crate::ratelimit::PartnerRates {
        total: rate("limits", l.rate, l.burst)?,
        per_aic: rate("limits.per_aic", l.per_aic_rate, l.per_aic_burst)?,
    };
    if l.max_in_flight == Some(0) {
        bail!("limits.max_in_flight: must be at least 1 (omit it for no limit)");
    }
    Ok(PartnerConfig {
        access,
        rates,
        max_in_flight: l.max_in_flight,
        aip_version: p.aip_version,
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

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[listener]
bind = "127.0.0.1:8443"
cert = "certs/gateway.pem"
key = "certs/gateway.key"
client_ca = ["certs/ca.pem"]
[[partner]]
name = "demo"
prefix = "/partners/demo/"
upstreams = ["http://127.0.0.1:9021"]
[partner.paths]
rpc = "/acps-aip-v1/rpc"
"#;

    #[test]
    fn defaults_and_resolution() {
        let c = Config::parse(BASE, Path::new("/etc/aipgw")).unwrap();
        assert_eq!(c.listener.cert, Path::new("/etc/aipgw/certs/gateway.pem"));
        assert_eq!(c.listener.handshake_timeout, Duration::from_secs(10));
        assert_eq!(c.max_body_bytes, 1 << 20);
        assert_eq!(c.aic_domain_suffix, "acps.pub");
        let p = &c.partners[0];
        assert_eq!(p.prefix, "/partners/demo");
        assert_eq!(p.paths[Method::Rpc.index()], "/acps-aip-v1/rpc");
        assert_eq!(p.paths[Method::Group.index()], "/group/rpc");
    }

    fn error_of(text: &str) -> String {
        format!("{:#}", Config::parse(text, Path::new(".")).unwrap_err())
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = error_of(&BASE.replace("[listener]", "[listener]\nbogus = 1"));
        assert!(e.contains("bogus"), "{e}");
        let e = error_of(&BASE.replace("rpc = ", "fly = "));
        assert!(e.contains("paths.fly"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let e = error_of(&BASE.replace("127.0.0.1:8443", "nowhere"));
        assert!(e.contains("listener.bind"), "{e}");
        let e = error_of(&BASE.replace("http://127.0.0.1:9021", "https://127.0.0.1:9021"));
        assert!(e.contains("upstreams[0]"), "{e}");
        let e = error_of(&format!("{BASE}\n[limits]\nmax_body_bytes = 0"));
        assert!(e.contains("limits.max_body_bytes"), "{e}");
        let e = error_of(&BASE.replace("name = \"demo\"", "name = \"demo\"\naic = \"123\""));
        assert!(e.contains("aic"), "{e}");
        let twice = format!("{BASE}\n{}", &BASE[BASE.find("[[partner]]").unwrap()..]);
        assert!(error_of(&twice).contains("name"), "{}", error_of(&twice));
        let e = error_of(
            &BASE
                .replace("handshake_timeout", "x")
                .replace("[listener]", "[listener]\nhandshake_timeout = \"0s\""),
        );
        assert!(e.contains("listener.handshake_timeout"), "{e}");
    }

    #[test]
    fn registrar_salts_and_dotted_pins() {
        let salted = |salts: &str| {
            BASE.replace(
                "[[partner]]",
                &format!("[identity]\n[identity.registrar_salts]\n{salts}\n[[partner]]"),
            )
        };
        let c = Config::parse(&salted("\"1\" = \"1234\"\nab = \"00FF\""), Path::new(".")).unwrap();
        assert_eq!(c.dotted.salts["1"], vec![0x12, 0x34]);
        assert_eq!(
            c.dotted.salts["AB"],
            vec![0x00, 0xff],
            "registrars are uppercased"
        );
        assert!(!c.dotted.required);
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("4660") && !shown.contains("0x12"),
            "{shown}"
        );
        for (bad, named) in [
            ("\"1\" = \"12\"", "at least 2 bytes"),
            ("\"1\" = \"12345\"", "not hex"),
            ("\"1\" = \"zz34\"", "not hex"),
            ("\"0\" = \"1234\"", "registrar serial"),
            ("\"1234567\" = \"1234\"", "registrar serial"),
        ] {
            let e = error_of(&salted(bad));
            assert!(e.contains(named), "{bad}: {e}");
            assert!(
                !e.contains("1234\"") && !e.contains("zz34"),
                "the salt is echoed: {e}"
            );
        }
        // A dotted pin is judged with the salts when the config loads.
        let pin = |aic: &str| {
            salted("\"1\" = \"1234\"").replace(
                "name = \"demo\"",
                &format!("name = \"demo\"\naic = \"{aic}\"\naip_version = \"v2\""),
            )
        };
        let c = Config::parse(
            &pin("1.2.156.3088.1.1.34c2.478BDF.3GF546.0JU4"),
            Path::new("."),
        )
        .unwrap();
        assert_eq!(
            c.partners[0].aic.map(|a| a.to_string()).as_deref(),
            Some("1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU4")
        );
        assert_eq!(c.partners[0].aip_version, raw::AipVersion::V2);
        let e = error_of(&pin("1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU5"));
        assert!(e.contains("check code"), "{e}");
        let required = BASE
            .replace(
                "[[partner]]",
                "[identity]\ndotted_check = \"required\"\n[[partner]]",
            )
            .replace(
                "name = \"demo\"",
                "name = \"demo\"\naic = \"1.2.156.3088.1.1.34C2.478BDF.3GF546.0JU4\"",
            );
        assert!(
            error_of(&required).contains("salt"),
            "{}",
            error_of(&required)
        );
    }
}
