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

mod proxy;
mod revocation;
mod sections;
mod split;

pub use proxy::{Network, ProxyProtocol};

use crate::identity::aic::DottedCheck;

/// Key exchange groups (`[tls]`), checked against the build's crypto provider.
pub use crate::tls::provider::Groups;
/// Settings enums the rest of the gateway names (the file's raw structs stay in `raw`).
pub use raw::{AipVersion, ErrorStatus, LogFormat, PartnerProtocol, Scheduler, UnknownTask};

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
    /// Deepest nesting of arrays and objects in a request body (unknown fields included).
    pub max_json_depth: usize,
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
    /// Which Partners have `/metrics` series of their own (checked against the Partners).
    pub partner_metrics: raw::PartnerMetrics,
    /// Log filter.
    pub log_level: String,
    /// Log format.
    pub log_format: raw::LogFormat,
    /// Worker threads (`0`: one per CPU the process may run on); read at start only.
    pub worker_threads: usize,
    /// How connections are spread over them; read at start only.
    pub scheduler: raw::Scheduler,
    /// How often each per-core worker flushes its allocation cache (`None`: never); read
    /// at start only.
    pub cache_flush_interval: Option<Duration>,
    /// How long the allocator keeps freed pages before they go back to the system
    /// (`runtime.freed_page_decay`); read at start only.
    pub freed_page_decay: Duration,
    /// Watch files for hot reload.
    pub reload_watch: bool,
    /// Reload debounce.
    pub reload_debounce: Duration,
    /// Shared state for several instances; read at start only.
    pub cluster: crate::cluster::ClusterSettings,
    /// CRLs fetched over HTTP(S) and kept current (`[revocation]`).
    pub revocation: crate::revocation::settings::RevocationSettings,
    /// AMP records (`[log] format = "amp"`; `None`: off).
    pub amp: Option<crate::amp::sink::AmpSettings>,
    /// The audit log (`[audit]`; `None`: off).
    pub audit: Option<crate::audit::AuditSettings>,
    /// OTLP trace export (`[tracing]`; `None`: off); read at start only.
    pub tracing: Option<crate::otel::TracingSettings>,
    /// The Partners, in file order; each shared with the snapshot's `Partner` built from
    /// it (a reload neither copies a Partner's config nor keeps two of its access sets).
    pub partners: Vec<std::sync::Arc<PartnerConfig>>,
}

/// `[listener]`, validated. Field meanings and defaults: see [`raw::RawListener`].
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// Address to listen on.
    pub bind: SocketAddr,
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM).
    pub key: PathBuf,
    /// CA bundles trusted to issue client certificates (PEM).
    pub client_ca: Vec<PathBuf>,
    /// CRL files (PEM or DER).
    pub crl: Vec<PathBuf>,
    /// `jsonrpc` or `strict`.
    pub client_auth: ClientAuthMode,
    /// Accept a CRL past its nextUpdate (default false: such a CRL rejects).
    pub allow_expired_crl: bool,
    /// Accept certificates no configured CRL covers (default false when CRLs are set).
    pub allow_unknown_revocation_status: bool,
    /// Time for the TLS handshake to complete.
    pub handshake_timeout: Duration,
    /// Time for a request's headers to arrive (HTTP/1.1).
    pub header_read_timeout: Duration,
    /// Time for a whole request body to arrive.
    pub body_read_timeout: Duration,
    /// How long an answer's write may wait for the client to read (HTTP/1.1).
    pub write_timeout: Duration,
    /// Close a connection with no request in flight for this long.
    pub idle_timeout: Duration,
    /// Open client connections at most. At the limit, a new connection makes the one
    /// idle longest close (one without a verified AIC first); it waits in the accept
    /// queue only while every connection has a request in flight.
    pub max_connections: usize,
    /// Concurrent HTTP/2 streams per connection.
    pub http2_max_concurrent_streams: u32,
    /// An HTTP/2 keep-alive PING (sent after `idle_timeout` of silence) must be answered
    /// within this, or the connection is closed.
    pub http2_keepalive_timeout: Duration,
    /// Connections from one source address still in their TLS handshake, at most; more
    /// are closed at once (they count against `max_connections` meanwhile).
    pub max_handshakes_per_ip: usize,
    /// Open connections from one source address, at most, for their whole life (the
    /// handshake included); more are closed at once.
    pub max_connections_per_ip: usize,
    /// Close a connection without a verified AIC at its handshake after this long with no
    /// request in flight (instead of `idle_timeout`); after the answer to its refusal it
    /// is closed, at the latest this long after.
    pub unverified_idle_timeout: Duration,
    /// Time open requests get to finish at shutdown.
    pub drain_timeout: Duration,
    /// At a drain, how long an idle HTTP/1.1 connection stays open for a request on its
    /// way.
    pub drain_idle_grace: Duration,
    /// An idle HTTP/1.1 connection lets go of its HTTP buffers after this long (`0`:
    /// never); see [`raw::RawListener::idle_release_after`].
    pub idle_release_after: Duration,
    /// The most bytes of an HTTP/1.1 request head.
    pub max_head_bytes: usize,
    /// The most header fields in an HTTP/1.1 request head.
    pub max_headers: usize,
    /// The HTTP status of the gateway's JSON-RPC errors: `mapped` or `ok` (200).
    pub error_status: raw::ErrorStatus,
    /// TLS sessions remembered for resumption (TLS 1.3 tickets naming a server-side
    /// session); `0` turns resumption off, so every new connection is a full handshake.
    pub tls_session_cache: usize,
    /// Certificate verdicts remembered per trust generation (by chain), so a resumed
    /// session or a returning client is not verified again until a reload or an expiry;
    /// `0` verifies every connection's chain.
    pub verdict_cache: usize,
    /// PROXY headers from load balancers (`[listener.proxy_protocol]`).
    pub proxy_protocol: ProxyProtocol,
    /// The control socket a new process takes the listening sockets over through.
    pub handover_socket: Option<PathBuf>,
    /// How long each side of a hand-over waits for the other.
    pub handover_timeout: Duration,
    /// Key exchange groups accepted, in order of preference (`tls.listener_groups`).
    pub tls_groups: Groups,
}

/// `[upstream]`, validated. Field meanings and defaults: see [`raw::RawUpstream`].
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    /// Time to open a TCP (and TLS) connection to a Partner.
    pub connect_timeout: Duration,
    /// Time for a Partner's response headers to arrive.
    pub response_timeout: Duration,
    /// Idle pooled connections are closed after this long.
    pub pool_idle_timeout: Duration,
    /// Idle pooled connections kept per upstream address.
    pub pool_max_idle_per_host: usize,
    /// A relayed Partner body (after its headers) may pause this long between frames.
    pub body_idle_timeout: Duration,
    /// How much of a Partner answer that is not a 2xx JSON or event stream is read to
    /// tell whether it is a JSON-RPC response (relayed unchanged) or not (answered `502`
    /// `upstream_bad_response`); a longer one is not a JSON-RPC response.
    pub max_error_body_bytes: usize,
    /// HTTP/2 Partners (`[[partner]] http2`): the connection's receive window, the most
    /// its streams together may have in flight unread. It also sets how many small DATA
    /// frames (SSE events) may wait to be read before the HTTP/2 library calls the
    /// Partner abusive (half the window, counted per frame below 256 bytes), so it must
    /// allow for a burst of events across every open stream.
    pub http2_connection_window: u32,
    /// HTTP/1.1 Partners: the longest response head (status line and fields) read; a
    /// longer one is answered `502` (`upstream_protocol`).
    pub max_response_head_bytes: usize,
    /// Partner connections open at once, for the whole gateway (HTTP/1.1 busy or idle,
    /// and HTTP/2): what the open-file check counts for them.
    pub max_connections: usize,
    /// Key exchange groups offered to Partners, in order (`tls.partner_groups`).
    pub tls_groups: Groups,
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
    /// What the Partner speaks: AIP or A2A.
    pub protocol: raw::PartnerProtocol,
    /// An A2A Partner's agent card settings (`[partner.a2a.card]`; `None` for AIP).
    pub a2a_card: Option<std::sync::Arc<crate::a2a::card::settings::CardSettings>>,
    /// An A2A Partner's push-notification URL policy (`[partner.a2a.push]`; `None` for
    /// AIP).
    pub a2a_push: Option<std::sync::Arc<crate::a2a::push::PushPolicy>>,
    /// HTTP/2 only (prior knowledge over `http://`).
    pub http2: bool,
    /// Upstream path for each method, indexed by [`Method::index`].
    pub paths: [std::borrow::Cow<'static, str>; Method::ALL.len()],
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
    /// How many worker threads serve connections: `runtime.worker_threads`, or one per
    /// CPU the process may run on.
    pub fn workers(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// Whether any revocation source is configured (`listener.crl` files, fetched CRLs,
    /// OCSP): `https` Partners' certificates are then checked too.
    pub fn checks_revocation(&self) -> bool {
        !self.listener.crl.is_empty()
            || self.revocation.fetches()
            || self.revocation.ocsp.policy != crate::revocation::settings::OcspPolicy::Off
    }

    /// How many pools each Partner has: one per worker with `scheduler = "per_core"`
    /// (a worker's requests use its own Partner connections), else one.
    pub fn partner_pools(&self) -> usize {
        match self.scheduler {
            raw::Scheduler::PerCore => self.workers(),
            raw::Scheduler::Shared => 1,
        }
    }

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
        let raw = match split::split(text) {
            Some(parts) if !parts.partners.is_empty() => by_parts(&parts).or_else(|_| whole(text)),
            _ => whole(text),
        }?;
        Config::from_raw(raw, base)
    }

    fn from_raw(mut raw: RawConfig, base: &Path) -> anyhow::Result<Config> {
        resolve_paths(&mut raw, base);
        let suffix = raw.identity.aic_domain_suffix.trim_matches('.').to_owned();
        if suffix.is_empty() {
            bail!("identity.aic_domain_suffix: must not be empty");
        }
        if raw.limits.max_body_bytes == 0 {
            bail!("limits.max_body_bytes: must be at least 1");
        }
        if raw.limits.max_json_depth < crate::jsonrpc::envelope::MIN_MAX_DEPTH {
            bail!(
                "limits.max_json_depth: must be at least {} (the envelope's own nesting)",
                crate::jsonrpc::envelope::MIN_MAX_DEPTH
            );
        }
        if raw.replay.sweep_interval.is_zero() {
            bail!("replay.sweep_interval must be greater than zero");
        }
        let dotted = DottedCheck::try_from(&raw.identity)?;
        let mut ratelimit = RateLimitSettings::try_from(&raw.ratelimit)?;
        let cluster = crate::cluster::ClusterSettings::try_from(&raw.cluster)?;
        let revocation =
            crate::revocation::settings::RevocationSettings::try_from(&raw.revocation)?;
        ratelimit.limiter.counting = cluster.mode == crate::cluster::ClusterMode::Redis;
        let partners = raw
            .partners
            .into_iter()
            .enumerate()
            .map(|(i, p)| checked_partner(i, p, &dotted).map(std::sync::Arc::new))
            .collect::<anyhow::Result<Vec<_>>>()?;
        check_unique_routes(&partners)?;
        ratelimit.limiter.partners = partners.iter().map(|p| (p.name.clone(), p.rates)).collect();
        let names: Vec<&str> = partners.iter().map(|p| p.name.as_str()).collect();
        raw.admin.partner_metrics.check(&names)?;
        let audit = raw.audit.settings(&raw.listener.cert, &suffix)?;
        let amp = raw.log.amp(&raw.listener.cert, &suffix)?;
        Ok(Config {
            source: None,
            listener: ListenerConfig {
                tls_groups: Groups::parse("tls.listener_groups", &raw.tls.listener_groups)?,
                ..ListenerConfig::try_from(raw.listener)?
            },
            aic_domain_suffix: suffix,
            dotted,
            max_body_bytes: raw.limits.max_body_bytes,
            max_json_depth: raw.limits.max_json_depth,
            upstream: UpstreamConfig {
                tls_groups: Groups::parse("tls.partner_groups", &raw.tls.partner_groups)?,
                ..UpstreamConfig::try_from(&raw.upstream)?
            },
            stream: crate::sse::relay::StreamSettings::try_from(&raw.stream)?,
            replay: crate::sse::memory::ReplayLimits::try_from(&raw.replay)?,
            replay_sweep_interval: raw.replay.sweep_interval,
            admin_bind: match raw.admin.bind.as_str() {
                "" => None,
                b => Some(
                    b.parse()
                        .with_context(|| format!("admin.bind: {b:?} is not an address:port"))?,
                ),
            },
            partner_metrics: raw.admin.partner_metrics,
            log_level: raw.log.level.clone(),
            reload_watch: raw.reload.watch,
            reload_debounce: raw.reload.debounce,
            log_format: raw.log.format,
            worker_threads: raw.runtime.worker_threads,
            scheduler: raw.runtime.scheduler,
            cache_flush_interval: Some(raw.runtime.cache_flush_interval).filter(|d| !d.is_zero()),
            freed_page_decay: raw.runtime.freed_page_decay,
            policy: crate::policy::GlobalPolicy::try_from(&raw.policy)?,
            tasks: TaskPolicy::try_from(&raw.policy.tasks)?,
            ratelimit,
            cluster,
            revocation,
            audit,
            amp,
            tracing: crate::otel::TracingSettings::from_raw(&raw.tracing)?,
            partners,
        })
    }
}

/// The file read as one TOML document.
fn whole(text: &str) -> anyhow::Result<RawConfig> {
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The file read part by part ([`split`]): the rest, then each Partner on its own. An
/// error here is not reported: the caller reads the whole file again, whose error names
/// the line and column in the file.
fn by_parts(parts: &split::Parts) -> Result<RawConfig, toml::de::Error> {
    let mut raw: RawConfig = toml::from_str(&parts.rest)?;
    raw.partners.reserve_exact(parts.partners.len());
    for p in &parts.partners {
        raw.partners.extend(one_partner(p)?);
    }
    Ok(raw)
}

/// One `[[partner]]` table (with its sub-tables), read as a document of its own.
pub(crate) fn one_partner(text: &str) -> Result<Vec<RawPartner>, toml::de::Error> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct One {
        partner: Vec<RawPartner>,
    }
    toml::from_str::<One>(text).map(|one| one.partner)
}

/// One `[[partner]]` table checked, named by its place in the file when it is refused.
fn checked_partner(i: usize, p: RawPartner, dotted: &DottedCheck) -> anyhow::Result<PartnerConfig> {
    let name = format!("partner[{i}] ({})", p.name);
    let partner = PartnerConfig::try_from(p).with_context(|| name.clone())?;
    if let Some(aic) = partner.aic {
        dotted
            .judge(&aic)
            .map_err(|e| anyhow::anyhow!("{name}.aic: {aic}: {e}"))?;
    }
    Ok(partner)
}

/// No two Partners share a name, or a route (prefix and host). The sets borrow the
/// checked configs and are sized once, so a fleet of 10,000 costs no rehash or copy.
fn check_unique_routes(partners: &[std::sync::Arc<PartnerConfig>]) -> anyhow::Result<()> {
    let mut names = HashSet::with_capacity_and_hasher(partners.len(), ahash::RandomState::new());
    let mut routes = HashSet::with_capacity_and_hasher(partners.len(), ahash::RandomState::new());
    for (i, p) in partners.iter().enumerate() {
        let key = || format!("partner[{i}] ({})", p.name);
        if !names.insert(p.name.as_str()) {
            bail!("{}.name: another Partner has this name", key());
        }
        let hosts = p.hosts.iter().map(|h| Some(h.as_str()));
        let any = p.hosts.is_empty().then_some(None);
        for h in hosts.chain(any) {
            if !routes.insert((p.prefix.as_str(), h)) {
                bail!(
                    "{}.prefix: another Partner already has prefix {} for {}",
                    key(),
                    p.prefix,
                    h.unwrap_or("any host")
                );
            }
        }
    }
    Ok(())
}

/// Relative paths in the file (certificates, keys, CAs, CRLs) resolved against `base`,
/// the config file's folder.
fn resolve_paths(raw: &mut RawConfig, base: &Path) {
    let resolve = |p: &mut PathBuf| {
        if !p.is_absolute() {
            *p = base.join(&*p);
        }
    };
    let l = &mut raw.listener;
    resolve(&mut l.cert);
    resolve(&mut l.key);
    l.handover_socket.iter_mut().for_each(resolve);
    l.client_ca
        .iter_mut()
        .chain(l.crl.iter_mut())
        .for_each(resolve);
    for t in raw.partners.iter_mut().filter_map(|p| p.tls.as_mut()) {
        resolve(&mut t.ca);
        t.cert.iter_mut().chain(t.key.iter_mut()).for_each(resolve);
    }
    let c = &mut raw.cluster;
    c.tls_ca
        .iter_mut()
        .chain(c.tls_cert.iter_mut())
        .chain(c.tls_key.iter_mut())
        .for_each(resolve);
    raw.revocation.tls_ca.iter_mut().for_each(resolve);
    let a = &mut raw.audit;
    a.file.iter_mut().chain(a.key.iter_mut()).for_each(resolve);
    raw.log.amp_file.iter_mut().for_each(resolve);
    let t = &mut raw.tracing;
    t.ca.iter_mut()
        .chain(t.client_cert.iter_mut())
        .chain(t.client_key.iter_mut())
        .for_each(resolve);
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
        assert_eq!(c.listener.max_connections_per_ip, 256);
        assert_eq!(c.listener.unverified_idle_timeout, Duration::from_secs(5));
        assert_eq!(c.max_body_bytes, 1 << 20);
        assert_eq!(c.max_json_depth, 64);
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
    fn a_fleet_error_names_its_line_in_the_file() {
        // The Partners are read one by one (`split`); an error is still reported by the
        // whole file's reading, at the line where it is.
        let mut text = BASE.to_owned();
        for i in 0..50 {
            text.push_str(&format!(
                "[[partner]]\nname = \"p{i}\"\nprefix = \"/p{i}\"\nupstreams = [\"http://127.0.0.1:9\"]\n"
            ));
        }
        let line = text.lines().count() + 1;
        text.push_str("[[partner]]\nname = \"x\"\nname = \"y\"\n");
        let e = error_of(&text);
        assert!(e.contains(&format!("line {}", line + 2)), "{e}");
        assert!(e.contains("duplicate key"), "{e}");
        let c = Config::parse(
            &text.replace(
                "name = \"y\"\n",
                "prefix = \"/x\"\nupstreams = [\"http://127.0.0.1:9\"]\n",
            ),
            Path::new("."),
        )
        .unwrap();
        assert_eq!(c.partners.len(), 52);
        assert_eq!(c.partners[51].name, "x");
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
        let e = error_of(&format!("{BASE}\n[limits]\nmax_json_depth = 3"));
        assert!(e.contains("limits.max_json_depth"), "{e}");
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
        let e = error_of(&BASE.replace("[listener]", "[listener]\nmax_connections_per_ip = 0"));
        assert!(e.contains("listener.max_connections_per_ip"), "{e}");
        let e =
            error_of(&BASE.replace("[listener]", "[listener]\nunverified_idle_timeout = \"0s\""));
        assert!(e.contains("listener.unverified_idle_timeout"), "{e}");
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

    /// `protocol = "a2a"` makes an A2A Partner (AIP by default); the AIP method names of
    /// `access.methods` and `paths` mean nothing to it and are refused.
    #[test]
    fn partner_protocol() {
        let c = Config::parse(BASE, Path::new(".")).unwrap();
        assert_eq!(c.partners[0].protocol, PartnerProtocol::Aip);
        // BASE's Partner, its `paths` table replaced by `extra`.
        let a2a = |extra: &str| {
            BASE.replace("name = \"demo\"", "name = \"demo\"\nprotocol = \"a2a\"")
                .replace("[partner.paths]\nrpc = \"/acps-aip-v1/rpc\"\n", extra)
        };
        let c = Config::parse(&a2a(""), Path::new(".")).unwrap();
        assert_eq!(c.partners[0].protocol, PartnerProtocol::A2a);
        let e = error_of(&a2a(
            "[[partner.access.methods]]\nmethods = [\"rpc\"]\nallow = [\"*\"]\n",
        ));
        assert!(e.contains("access.methods"), "{e}");
        let e = error_of(&a2a("[partner.paths]\nrpc = \"/x\"\n"));
        assert!(e.contains("paths names AIP methods"), "{e}");
        let e = error_of(&BASE.replace("name = \"demo\"", "name = \"demo\"\nprotocol = \"grpc\""));
        assert!(e.contains("grpc"), "{e}");
    }
}
