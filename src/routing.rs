//! The Partner table: which Partner serves a request's host and path, and which method
//! the path names.
//!
//! A Partner is reached at `<prefix>/<method>` (the path names the method; the body's
//! `method` must agree) or at `<prefix>` alone (one fixed endpoint; the body decides).
//! The longest matching prefix wins; among equal prefixes a host-specific Partner wins
//! over a host-agnostic one.

use std::sync::Arc;

use crate::config::PartnerConfig;
use crate::jsonrpc::Method;
use crate::upstream::UpstreamPool;

/// A Partner: its config and its connection pool.
pub struct Partner {
    /// Validated config.
    pub config: PartnerConfig,
    /// Its name, shared by every request's log and metric labels (a clone is a count).
    pub label: Arc<str>,
    /// Pooled clients to its upstreams.
    pub pool: UpstreamPool,
    /// Its requests in flight (limited by `limits.max_in_flight` when set); kept across
    /// reloads for the same Partner name.
    pub in_flight: Arc<crate::ratelimit::concurrency::InFlight>,
}

impl Partner {
    /// The upstream path for a method.
    pub fn path_for(&self, method: Method) -> &str {
        &self.config.paths[method.index()]
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

/// The Partner table, sorted for lookup.
pub struct Router {
    partners: Vec<Arc<Partner>>,
}

impl Router {
    /// Builds the table.
    pub fn new(mut partners: Vec<Arc<Partner>>) -> Router {
        partners.sort_by_key(|p| {
            (
                std::cmp::Reverse(p.config.prefix.len()),
                p.config.hosts.is_empty(),
            )
        });
        Router { partners }
    }

    /// Every Partner.
    pub fn partners(&self) -> &[Arc<Partner>] {
        &self.partners
    }

    /// The Partner named `name`.
    pub fn partner(&self, name: &str) -> Option<&Arc<Partner>> {
        self.partners.iter().find(|p| p.config.name == name)
    }

    /// Finds the Partner for a host (lowercase, no port) and path.
    pub fn route(&self, host: Option<&str>, path: &str) -> Option<Route> {
        self.partners.iter().find_map(|p| {
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
            Some(Route {
                partner: p.clone(),
                path_method,
            })
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
        let text = format!(
            r#"
[listener]
bind = "127.0.0.1:1"
cert = "c"
key = "k"
client_ca = ["ca"]
[[partner]]
name = "demo"
prefix = "/partners/demo"
upstreams = ["http://127.0.0.1:9"]
[[partner]]
name = "root"
prefix = "/"
upstreams = ["http://127.0.0.1:9"]
{extra}"#
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
                    })
                })
                .collect(),
        )
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
