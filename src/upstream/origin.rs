//! Partner connections by origin: Partners whose upstream URLs name the same scheme, host
//! and port, speak the same HTTP version to it and trust it the same way (TLS files and
//! their content, `server_name`, pinned AIC) use one pool, not one each: 10,000 Partners
//! on one origin keep the idle connections of one.
//!
//! A snapshot's [`Origins`] are built with the previous snapshot's at hand: an origin the
//! new config still names (same key, same `[upstream]` settings) is the very same pool,
//! found by its key, its idle connections kept. One the new config no longer names closes
//! its connections when the last request using it ends.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::Full;

use super::budget::{Budget, Evict};
use super::conn::Endpoint;
use super::h1::H1Client;
use super::h2::HttpClient;
use super::idle::Idle;
use super::trust::H2Watch;
use super::HeadFuture;
use crate::config::{PartnerConfig, PartnerTlsConfig, UpstreamConfig};
use crate::identity::Aic;
use crate::metrics::tls::GroupTally;
use crate::tls::client::partner_client_config;

/// How a Partner's connections are secured, with what its files held at the load.
#[derive(Clone, PartialEq, Eq, Hash)]
struct TlsKey {
    ca: PathBuf,
    client_cert: Option<(PathBuf, PathBuf)>,
    server_name: Option<String>,
    /// SHA-256 of the files' contents: a rotated certificate is another origin.
    contents: [u8; 32],
}

/// A CA bundle, and a client certificate and key.
type TlsFiles = (PathBuf, Option<(PathBuf, PathBuf)>);

/// What makes connections interchangeable.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct OriginKey {
    https: bool,
    host: String,
    port: u16,
    http2: bool,
    /// Over `https://` only.
    tls: Option<TlsKey>,
    /// Over `https://` only.
    aic: Option<Aic>,
}

/// What every origin of a config is built with; a reload that changes any of it builds
/// every origin anew.
#[derive(Clone, PartialEq)]
struct Settings {
    upstream: UpstreamConfig,
    aic_suffix: String,
    /// Pools per origin (one per worker thread with per-core workers).
    pools: usize,
    /// Partner certificates are checked for revocation (and TLS sessions not resumed).
    revocation: bool,
}

/// One origin's clients.
pub(crate) enum Origin {
    /// The gateway's own HTTP/1.1 client (its idle connections per worker thread).
    H1(Arc<H1Client>),
    /// hyper's HTTP/2 client, one per worker thread (`crate::workers`), and its
    /// connections' revocation verdicts (a Partner with a revocation check).
    H2(Box<[HttpClient]>, Option<Arc<H2Watch>>),
}

impl Origin {
    /// The request sent, its response head awaited under `timeout`.
    pub(crate) fn request(&self, req: Request<Full<Bytes>>, timeout: Duration) -> HeadFuture {
        match self {
            Origin::H1(c) => HeadFuture::H1 {
                sending: c.clone().send(req, tokio::time::Instant::now() + timeout),
            },
            Origin::H2(clients, watch) => {
                let client = &clients[crate::workers::slot(clients.len())];
                // A connection cut for its Partner's revocation: the request waits until
                // hyper has dropped it, then takes a new one.
                if let Some(gone) = watch.as_ref().and_then(|w| w.judge()) {
                    let client = client.clone();
                    let sending: super::H2Resend = Box::pin(async move {
                        super::trust::all_gone(gone).await;
                        client.request(req).await
                    });
                    return HeadFuture::H2After {
                        sending: tokio::time::timeout(timeout, sending),
                    };
                }
                HeadFuture::H2 {
                    sending: tokio::time::timeout(timeout, client.request(req)),
                }
            }
        }
    }

    /// Drops idle HTTP/1.1 connections past `upstream.pool_idle_timeout` or closed by the
    /// Partner; returns how many stay (hyper's HTTP/2 pool keeps its own time).
    pub(crate) fn sweep(&self) -> usize {
        match self {
            Origin::H1(c) => c.idle().sweep(),
            Origin::H2(..) => 0,
        }
    }

    /// Idle HTTP/1.1 connections kept now.
    pub(crate) fn idle_connections(&self) -> usize {
        match self {
            Origin::H1(c) => c.idle().len(),
            Origin::H2(..) => 0,
        }
    }
}

/// A snapshot's origins, by key, and the budget their connections share.
pub(crate) struct Origins {
    settings: Settings,
    budget: Arc<Budget>,
    /// Where the Partner handshakes are counted by group.
    tally: GroupTally,
    by_key: HashMap<OriginKey, Arc<Origin>>,
}

impl Origins {
    /// Every origin, for the upkeep timer's sweep.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<Origin>> {
        self.by_key.values()
    }
}

/// Builds a snapshot's [`Origins`] Partner by Partner, taking each origin the previous
/// snapshot had from it by key.
pub(crate) struct OriginsBuilder<'a> {
    origins: Origins,
    previous: Option<&'a Origins>,
    /// What each set of TLS files held, read once per load however many Partners name it.
    contents: HashMap<TlsFiles, [u8; 32]>,
    /// What `https` Partners' certificates are checked for revocation against.
    revocation: Option<Arc<crate::revocation::partner::PartnerRevocation>>,
}

impl<'a> OriginsBuilder<'a> {
    /// For a config's `[upstream]`, `identity.aic_domain_suffix` and pools per origin
    /// (`Config::partner_pools`); the budget is `previous`'s (its bound set anew), else a
    /// new one.
    pub(crate) fn new(
        u: &UpstreamConfig,
        aic_suffix: &str,
        pools: usize,
        previous: Option<&'a Origins>,
        tally: GroupTally,
    ) -> OriginsBuilder<'a> {
        // What only the Partners' pools or the budget read does not make origins differ.
        let upstream = UpstreamConfig {
            response_timeout: Duration::ZERO,
            body_idle_timeout: Duration::ZERO,
            max_error_body_bytes: 0,
            max_connections: 0,
            ..u.clone()
        };
        let settings = Settings {
            upstream,
            aic_suffix: aic_suffix.to_owned(),
            pools,
            revocation: false,
        };
        let budget = match previous {
            Some(p) => {
                p.budget.set_cap(u.max_connections);
                p.budget.clone()
            }
            None => Budget::new(u.max_connections),
        };
        // Origins are taken over only when they would be built the same.
        let previous = previous.filter(|p| p.settings == settings);
        OriginsBuilder {
            origins: Origins {
                settings,
                budget,
                tally,
                by_key: HashMap::new(),
            },
            previous,
            contents: HashMap::new(),
            revocation: None,
        }
    }

    /// Partner certificates are checked for revocation against `r` (`None`: no
    /// revocation source is configured).
    pub(crate) fn with_revocation(
        mut self,
        r: Option<Arc<crate::revocation::partner::PartnerRevocation>>,
    ) -> OriginsBuilder<'a> {
        self.origins.settings.revocation = r.is_some();
        if self
            .previous
            .is_some_and(|p| p.settings != self.origins.settings)
        {
            self.previous = None;
        }
        self.revocation = r;
        self
    }

    /// The origin of each of `p`'s upstream URLs, with the URL.
    pub(crate) fn partner(&mut self, p: &PartnerConfig) -> anyhow::Result<Vec<(Uri, Arc<Origin>)>> {
        p.upstreams
            .iter()
            .map(|uri| {
                let key = self.key(p, uri)?;
                let origin = match self.origins.by_key.get(&key) {
                    Some(o) => o.clone(),
                    None => {
                        let carried = self.previous.and_then(|prev| prev.by_key.get(&key));
                        let o = match carried {
                            Some(o) => o.clone(),
                            None => Arc::new(self.build(p, uri)?),
                        };
                        self.origins.by_key.insert(key, o.clone());
                        o
                    }
                };
                Ok((uri.clone(), origin))
            })
            .collect()
    }

    /// The origins, each HTTP/1.1 one keeping at most its fair share of the budget idle:
    /// `upstream.max_connections` over the origins and their pools, and never more than
    /// `upstream.pool_max_idle_per_host` per pool.
    pub(crate) fn finish(self) -> Origins {
        let o = self.origins;
        let pools = o.settings.pools.max(1) * o.by_key.len().max(1);
        let share = (o.budget.cap() / pools)
            .max(1)
            .min(o.settings.upstream.pool_max_idle_per_host);
        for origin in o.by_key.values() {
            if let Origin::H1(c) = &**origin {
                c.idle().set_max(share);
            }
        }
        o
    }

    fn key(&mut self, p: &PartnerConfig, uri: &Uri) -> anyhow::Result<OriginKey> {
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().unwrap_or_default().to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = match (&p.tls, https) {
            (Some(t), true) => Some(self.tls_key(t)?),
            _ => None,
        };
        Ok(OriginKey {
            https,
            host,
            port,
            http2: p.http2,
            tls,
            aic: p.aic.filter(|_| https),
        })
    }

    fn tls_key(&mut self, t: &PartnerTlsConfig) -> anyhow::Result<TlsKey> {
        let files = (t.ca.clone(), t.client_cert.clone());
        let contents = match self.contents.get(&files) {
            Some(c) => *c,
            None => {
                let c = digest(&files)?;
                self.contents.insert(files, c);
                c
            }
        };
        Ok(TlsKey {
            ca: t.ca.clone(),
            client_cert: t.client_cert.clone(),
            server_name: t.server_name.clone(),
            contents,
        })
    }

    /// A new origin for `p`'s upstream `uri` (loads its TLS files).
    fn build(&self, p: &PartnerConfig, uri: &Uri) -> anyhow::Result<Origin> {
        let s = &self.origins.settings;
        let u = &s.upstream;
        let (mut tls, check) = match &p.tls {
            Some(t) => partner_client_config(
                t,
                p.aic,
                &s.aic_suffix,
                self.revocation.clone(),
                &u.tls_groups,
            )?,
            None => (super::plain_client_config()?, None),
        };
        let server_name = p.tls.as_ref().and_then(|t| t.server_name.clone());
        if p.http2 {
            let watch = check.map(|c| Arc::new(H2Watch::new(c)));
            let clients = super::h2::clients(
                tls,
                server_name,
                u,
                s.pools,
                &self.origins.budget,
                &self.origins.tally,
                watch.clone(),
            );
            return Ok(Origin::H2(clients, watch));
        }
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let endpoint = Endpoint::new(uri, &Arc::new(tls), server_name.as_deref())?
            .counting(self.origins.tally.clone())
            .judged_by(check);
        let idle = Arc::new(Idle::new(
            s.pools,
            u.pool_max_idle_per_host,
            u.pool_idle_timeout,
        ));
        let evict: Arc<dyn Evict> = idle.clone();
        self.origins.budget.register(Arc::downgrade(&evict));
        Ok(Origin::H1(Arc::new(H1Client::new(
            endpoint,
            idle,
            self.origins.budget.clone(),
            u.connect_timeout,
            u.max_response_head_bytes,
        ))))
    }
}

/// SHA-256 of a CA bundle and a client certificate and key, as they are now.
fn digest(files: &TlsFiles) -> anyhow::Result<[u8; 32]> {
    let (ca, client) = files;
    let read = |f: &PathBuf| -> anyhow::Result<Vec<u8>> {
        std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))
    };
    let mut contents = vec![read(ca)?];
    if let Some((cert, key)) = client {
        contents.push(read(cert)?);
        contents.push(read(key)?);
    }
    Ok(crate::digest::sha256_parts(
        contents.iter().map(Vec::as_slice),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn config(partners: &str) -> Config {
        let text = format!(
            "[listener]\nbind = \"127.0.0.1:0\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = [\"ca\"]\n[runtime]\nworker_threads = 2\n[upstream]\nmax_connections = 40\n{partners}"
        );
        Config::parse(&text, std::path::Path::new("/")).unwrap()
    }

    fn partner(n: usize, upstream: &str, extra: &str) -> String {
        format!("[[partner]]\nname = \"p{n}\"\nprefix = \"/p{n}\"\nupstreams = [\"{upstream}\"]\n{extra}\n")
    }

    /// Each Partner's origins, as pointers, and the table.
    fn build(cfg: &Config, previous: Option<&Origins>) -> (Vec<Vec<*const Origin>>, Origins) {
        let tally = GroupTally::default();
        let pools = cfg.partner_pools();
        let mut b = OriginsBuilder::new(&cfg.upstream, "acps.pub", pools, previous, tally);
        let each = cfg
            .partners
            .iter()
            .map(|p| {
                let targets = b.partner(p).unwrap();
                targets.iter().map(|(_, o)| Arc::as_ptr(o)).collect()
            })
            .collect();
        (each, b.finish())
    }

    #[tokio::test]
    async fn partners_on_one_origin_share_its_pool_and_a_reload_keeps_it() {
        let mut text = String::new();
        for n in 0..100 {
            text.push_str(&partner(n, "http://127.0.0.1:9000/base", ""));
        }
        // Another port, another HTTP version: other origins.
        text.push_str(&partner(100, "http://127.0.0.1:9001", ""));
        text.push_str(&partner(101, "http://127.0.0.1:9000", "http2 = true"));
        // Two URLs, one of them the shared origin (another base path, same origin).
        let both = "http://127.0.0.1:9000/other\", \"http://127.0.0.1:9001";
        text.push_str(&partner(102, both, ""));
        let cfg = config(&text);
        let (each, origins) = build(&cfg, None);
        assert_eq!(origins.by_key.len(), 3);
        assert!(each[..100].iter().all(|o| *o == each[0]));
        assert_ne!(each[100], each[0]);
        assert_ne!(each[101], each[0]);
        assert_eq!(each[102], vec![each[0][0], each[100][0]]);
        // Idle connections: 40 over 3 origins and 2 pools each, at most 6 per pool.
        let shared = origins.by_key.values().find_map(|o| match &**o {
            Origin::H1(c) if Arc::as_ptr(o) == each[0][0] => Some(c.clone()),
            _ => None,
        });
        let shared = shared.unwrap();
        assert_eq!(shared.idle().workers(), 2);
        assert_eq!(shared.idle().max(), 6);

        // A reload with 10,000 more Partners there: the same pool, found by its key.
        for n in 103..10_103 {
            text.push_str(&partner(n, "http://127.0.0.1:9000", ""));
        }
        let (after, reloaded) = build(&config(&text), Some(&origins));
        assert_eq!(reloaded.by_key.len(), 3);
        assert_eq!(after[0], each[0]);
        assert_eq!(after[10_000], each[0]);
        // Other pool settings: every origin anew.
        let other = config(&format!("pool_max_idle_per_host = 3\n{text}"));
        let (anew, _) = build(&other, Some(&reloaded));
        assert_ne!(anew[0], each[0]);
    }
}
