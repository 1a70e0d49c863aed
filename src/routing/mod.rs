//! The Partner table: which Partner serves a request's host and path, and which method
//! the path names.
//!
//! A Partner is reached at `<prefix>/<method>` (the path names the method; the body's
//! `method` must agree) or at `<prefix>` alone (one fixed endpoint; the body decides).
//! The longest matching prefix wins; among equal prefixes a host-specific Partner wins
//! over a host-agnostic one. The table is indexed by prefix and host once per config
//! load ([`table`]): a lookup costs the same with one Partner or ten thousand.

mod table;

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::PartnerConfig;
use crate::jsonrpc::Method;
use crate::upstream::UpstreamPool;

/// A Partner: its config and its connection pool.
pub struct Partner {
    /// Validated config.
    pub config: Arc<PartnerConfig>,
    /// Its name, shared by every request's log and metric labels (a clone is a count).
    pub label: Arc<str>,
    /// Pooled clients to its upstreams.
    pub pool: UpstreamPool,
    /// Its requests in flight (limited by `limits.max_in_flight` when set); kept across
    /// reloads for the same Partner name.
    pub in_flight: Arc<crate::ratelimit::concurrency::InFlight>,
    /// An A2A Partner's cached agent cards (`None` for AIP).
    pub card: Option<crate::a2a::card::CardCache>,
}

impl Partner {
    /// The upstream path for a method.
    pub fn path_for(&self, method: Method) -> &str {
        &self.config.paths[method.index()]
    }

    /// The next upstream URL for a method (see [`UpstreamPool::target_for`]).
    pub(crate) fn target_for(&self, method: Method) -> http::Uri {
        self.pool.target_for(&self.config.paths[method.index()])
    }
}

/// The result of a lookup.
#[derive(Clone)]
pub struct Route {
    /// The Partner.
    pub partner: Arc<Partner>,
    /// The method the path names (`None` at the bare prefix).
    pub path_method: Option<Method>,
}

/// The Partner table, indexed for lookup once per config load (see [`table`]).
pub struct Router {
    /// In config order.
    partners: Vec<Arc<Partner>>,
    index: table::RouteIndex,
    /// Name -> index in `partners`.
    names: HashMap<Box<str>, usize, ahash::RandomState>,
}

impl Router {
    /// Builds the table and its indexes, in one pass over the Partners in config order
    /// (the index answers by exact key, so the table needs no sort: a reload stays linear
    /// in the number of Partners).
    pub fn new(partners: Vec<Arc<Partner>>) -> Router {
        let mut index = table::RouteIndex::with_capacity(partners.len());
        let mut names = HashMap::with_capacity_and_hasher(partners.len(), Default::default());
        for (i, p) in partners.iter().enumerate() {
            index.insert(&p.config.prefix, &p.config.hosts, i);
            names.entry(p.config.name.as_str().into()).or_insert(i);
        }
        Router {
            partners,
            index: index.build(),
            names,
        }
    }

    /// Every Partner.
    pub fn partners(&self) -> &[Arc<Partner>] {
        &self.partners
    }

    /// The Partner named `name`.
    pub fn partner(&self, name: &str) -> Option<&Arc<Partner>> {
        self.partners.get(*self.names.get(name)?)
    }

    /// Finds the Partner for a host (lowercase, no port) and path.
    pub fn route(&self, host: Option<&str>, path: &str) -> Option<Route> {
        let (i, path_method) = self.index.find(host, path)?;
        Some(Route {
            partner: self.partners[i].clone(),
            path_method,
        })
    }
}

/// The host a request is for: the URI authority (HTTP/2), else the Host header, else
/// the TLS SNI; lowercased, without a port.
pub(crate) fn request_host<'a>(
    uri: &'a http::Uri,
    headers: &'a http::HeaderMap,
    sni: Option<&'a str>,
) -> Option<std::borrow::Cow<'a, str>> {
    let raw = uri
        .host()
        .or_else(|| {
            headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(|h| match h.rsplit_once(':') {
                    Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
                    _ => h,
                })
        })
        .or(sni)?;
    let host = raw.trim_matches(['[', ']']);
    // Copied only when it has capitals to fold.
    Some(if host.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(host.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(host)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn router(extra: &str) -> Router {
        table_of(&format!(
            r#"
[[partner]]
name = "demo"
prefix = "/partners/demo"
upstreams = ["http://127.0.0.1:9"]
[[partner]]
name = "root"
prefix = "/"
upstreams = ["http://127.0.0.1:9"]
{extra}"#
        ))
    }

    /// A table of the `[[partner]]` sections in `partners`.
    fn table_of(partners: &str) -> Router {
        let text = format!(
            r#"
[listener]
bind = "127.0.0.1:1"
cert = "c"
key = "k"
client_ca = ["ca"]
{partners}"#
        );
        let cfg = Config::parse(&text, std::path::Path::new(".")).unwrap();
        let up = cfg.upstream.clone();
        Router::new(
            cfg.partners
                .into_iter()
                .map(|p| {
                    let pool = UpstreamPool::new(&p, &up, "acps.pub", 1).unwrap();
                    Arc::new(Partner {
                        label: p.name.as_str().into(),
                        config: p,
                        pool,
                        in_flight: crate::ratelimit::concurrency::InFlight::new(None),
                        card: None,
                    })
                })
                .collect(),
        )
    }

    /// The lookup as it was before the index: every Partner in the old table order
    /// (longest prefix first, host-specific first), the first that takes the path: the
    /// oracle the index is tested against.
    fn linear(r: &Router, host: Option<&str>, path: &str) -> Option<(String, Option<Method>)> {
        let mut table: Vec<&Arc<Partner>> = r.partners().iter().collect();
        table.sort_by_key(|p| {
            (
                std::cmp::Reverse(p.config.prefix.len()),
                p.config.hosts.is_empty(),
            )
        });
        table.into_iter().find_map(|p| {
            let c = &p.config;
            if !c.hosts.is_empty() && !host.is_some_and(|h| c.hosts.iter().any(|x| x == h)) {
                return None;
            }
            let rest = if c.prefix == "/" {
                path.strip_prefix('/')?
            } else if path == c.prefix {
                ""
            } else {
                path.strip_prefix(c.prefix.as_str())?.strip_prefix('/')?
            };
            let path_method = match rest {
                "" => None,
                name => Some(Method::from_name(name)?),
            };
            Some((c.name.clone(), path_method))
        })
    }

    fn hit(r: &Router, host: Option<&str>, path: &str) -> Option<(String, Option<Method>)> {
        r.route(host, path)
            .map(|x| (x.partner.config.name.clone(), x.path_method))
    }

    #[tokio::test]
    async fn prefixes_and_methods() {
        let r = router("");
        let demo = |m| Some(("demo".to_string(), m));
        assert_eq!(hit(&r, None, "/partners/demo"), demo(None));
        assert_eq!(hit(&r, None, "/partners/demo/rpc"), demo(Some(Method::Rpc)));
        assert_eq!(
            hit(&r, None, "/partners/demo/notification/set"),
            demo(Some(Method::NotificationSet))
        );
        assert_eq!(hit(&r, None, "/partners/demox/rpc"), None);
        assert_eq!(hit(&r, None, "/partners/demo/bogus"), None);
        assert_eq!(
            hit(&r, None, "/stream"),
            Some(("root".into(), Some(Method::Stream)))
        );
        assert_eq!(hit(&r, None, "/"), Some(("root".into(), None)));
    }

    #[tokio::test]
    async fn host_specific_wins() {
        let r = router(
            r#"[[partner]]
name = "other"
prefix = "/partners/demo"
hosts = ["other.example"]
upstreams = ["http://127.0.0.1:9"]"#,
        );
        assert_eq!(
            hit(&r, Some("other.example"), "/partners/demo/rpc")
                .unwrap()
                .0,
            "other"
        );
        assert_eq!(
            hit(&r, Some("x.example"), "/partners/demo/rpc").unwrap().0,
            "demo"
        );
    }

    #[tokio::test]
    async fn slashes_and_the_root() {
        let r = router("");
        let demo = |m| Some(("demo".to_string(), m));
        let root = |m| Some(("root".to_string(), m));
        assert_eq!(hit(&r, None, "/partners/demo/"), demo(None));
        assert_eq!(hit(&r, None, "/partners/demo//"), None);
        assert_eq!(hit(&r, None, "/partners/demo/rpc/"), None);
        assert_eq!(hit(&r, None, "/partners/demo//rpc"), None);
        assert_eq!(
            hit(&r, None, "/partners/demo/group"),
            demo(Some(Method::Group))
        );
        assert_eq!(
            hit(&r, None, "/notification/start"),
            root(Some(Method::NotificationStart))
        );
        assert_eq!(hit(&r, None, "//rpc"), None);
        assert_eq!(hit(&r, None, "//"), None);
        assert_eq!(hit(&r, None, ""), None);
        assert_eq!(hit(&r, None, "*"), None);
        assert_eq!(hit(&r, None, "/partners"), None);
        let no_root = table_of(
            r#"[[partner]]
name = "a"
prefix = "/a/rpc"
hosts = ["h.example"]
upstreams = ["http://127.0.0.1:9"]
[[partner]]
name = "b"
prefix = "/a"
upstreams = ["http://127.0.0.1:9"]"#,
        );
        let at = |host, path| hit(&no_root, host, path).map(|(n, m)| (n, m.map(Method::name)));
        let named = |n: &str, m: Option<&'static str>| Some((n.to_string(), m));
        assert_eq!(at(Some("h.example"), "/a/rpc"), named("a", None));
        assert_eq!(at(Some("h.example"), "/a/rpc/rpc"), named("a", Some("rpc")));
        assert_eq!(at(None, "/a/rpc"), named("b", Some("rpc")));
        assert_eq!(at(Some("x.example"), "/a/rpc"), named("b", Some("rpc")));
        assert_eq!(at(None, "/a/rpc/rpc"), None);
        assert_eq!(at(None, "/rpc"), None);
    }

    /// The index picks what the Partner-by-Partner scan picked, on random tables (nested
    /// prefixes, some named like methods, some for named hosts) and random paths.
    #[tokio::test]
    async fn the_index_routes_as_the_linear_scan() {
        const SEGMENTS: [&str; 6] = ["a", "b", "rpc", "notification", "set", "group"];
        const HOSTS: [&str; 2] = ["x.example", "y.example"];
        let mut rng = fastrand::Rng::with_seed(38);
        let mut routed = 0;
        for _ in 0..60 {
            let mut text = String::new();
            let mut taken = std::collections::HashSet::new();
            for i in 0..rng.usize(1..12) {
                let depth = rng.usize(0..4);
                let prefix: String = (0..depth)
                    .map(|_| format!("/{}", SEGMENTS[rng.usize(..SEGMENTS.len())]))
                    .collect();
                let prefix = if prefix.is_empty() {
                    "/".into()
                } else {
                    prefix
                };
                let hosts: Vec<&str> = HOSTS.iter().copied().filter(|_| rng.u8(..3) == 0).collect();
                let keys: Vec<_> = if hosts.is_empty() {
                    vec![(prefix.clone(), None)]
                } else {
                    hosts.iter().map(|h| (prefix.clone(), Some(*h))).collect()
                };
                if keys.iter().any(|k| taken.contains(k)) {
                    continue;
                }
                taken.extend(keys);
                text += &format!(
                    "[[partner]]\nname = \"p{i}\"\nprefix = \"{prefix}\"\nhosts = {hosts:?}\nupstreams = [\"http://127.0.0.1:9\"]\n"
                );
            }
            let r = table_of(&text);
            for _ in 0..300 {
                let mut path: String = (0..rng.usize(0..5))
                    .map(|_| match rng.u8(..12) {
                        0 => "/".to_string(),
                        _ => format!("/{}", SEGMENTS[rng.usize(..SEGMENTS.len())]),
                    })
                    .collect();
                if path.is_empty() || rng.u8(..6) == 0 {
                    path.push('/');
                }
                let host = [
                    None,
                    Some("x.example"),
                    Some("y.example"),
                    Some("z.example"),
                ][rng.usize(..4)];
                let want = linear(&r, host, &path);
                routed += usize::from(want.is_some());
                assert_eq!(hit(&r, host, &path), want, "{host:?} {path} in\n{text}");
            }
        }
        assert!(routed > 3000, "only {routed} of 18,000 paths had a Partner");
    }

    #[tokio::test]
    async fn ten_thousand_partners() {
        let text: String = (0..10_000)
            .map(|i| {
                format!(
                    "[[partner]]\nname = \"p{i}\"\nprefix = \"/aip/p{i}\"\nupstreams = [\"http://127.0.0.1:9\"]\n"
                )
            })
            .collect();
        let r = table_of(&text);
        assert_eq!(
            hit(&r, None, "/aip/p9999/rpc"),
            Some(("p9999".into(), Some(Method::Rpc)))
        );
        assert_eq!(hit(&r, None, "/aip/p10000/rpc"), None);
        assert_eq!(r.partner("p1234").unwrap().config.prefix, "/aip/p1234");
        assert!(r.partner("p10000").is_none());
    }

    #[test]
    fn host_sources() {
        let h = |uri: &str, host: Option<&str>, sni| {
            let mut headers = http::HeaderMap::new();
            if let Some(v) = host {
                headers.insert(http::header::HOST, v.parse().unwrap());
            }
            request_host(&uri.parse().unwrap(), &headers, sni).map(|h| h.into_owned())
        };
        assert_eq!(
            h("/x", Some("A.example:8443"), None).as_deref(),
            Some("a.example")
        );
        assert_eq!(
            h("https://b.example/x", Some("a"), None).as_deref(),
            Some("b.example")
        );
        assert_eq!(
            h("/x", None, Some("sni.example")).as_deref(),
            Some("sni.example")
        );
        assert_eq!(h("/x", Some("[::1]:8443"), None).as_deref(), Some("::1"));
    }
}
