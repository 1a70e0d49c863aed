//! File descriptors: every Leader connection and every Partner connection is one, so a
//! system's default soft `nofile` limit (often 1,024) caps the gateway far below its own
//! `listener.max_connections`. At start the soft limit is raised to the hard one, and the
//! gateway refuses to start when its configured bounds cannot fit under it.

use crate::config::Config;

/// Descriptors kept for everything else: the listeners, the admin listener, the config
/// watcher, DNS lookups, log files, and headroom.
pub(crate) const RESERVED: u64 = 64;

/// The open-file limit before and after raising it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NofileLimit {
    /// The soft limit found at start.
    pub soft_before: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
}

/// Raises the soft `nofile` limit to the hard limit.
pub(crate) fn raise() -> std::io::Result<NofileLimit> {
    use rlimit::Resource;
    let (soft_before, hard) = Resource::NOFILE.get()?;
    if soft_before < hard && Resource::NOFILE.set(hard, hard).is_err() {
        // An unlimited hard limit is capped by the kernel (`fs.nr_open` on Linux).
        let cap = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(soft_before);
        Resource::NOFILE.set(cap.clamp(soft_before, hard), hard)?;
    }
    let (soft, hard) = Resource::NOFILE.get()?;
    Ok(NofileLimit {
        soft_before,
        soft,
        hard,
    })
}

/// At start: raises the limit, logs it, warns of Partners without a connection bound,
/// and fails when `cfg`'s bounds do not fit.
pub(crate) fn ensure(cfg: &Config) -> anyhow::Result<()> {
    let limit =
        raise().map_err(|e| anyhow::anyhow!("cannot read or raise the open-file limit: {e}"))?;
    tracing::info!(
        soft_before = limit.soft_before,
        soft = limit.soft,
        hard = limit.hard,
        "open-file limit"
    );
    let need = need(cfg);
    if !need.unbounded.is_empty() {
        tracing::warn!(
            partners = ?need.unbounded,
            "Partners without [partner.limits] max_in_flight: their connections are bounded only by the Leaders' requests"
        );
    }
    check(&need, &limit).map_err(anyhow::Error::msg)
}

/// What a configuration may hold open at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FdNeed {
    /// `listener.max_connections`.
    pub leaders: u64,
    /// Partner connections: per HTTP/1.1 Partner, its `limits.max_in_flight` requests
    /// (one connection each) or its idle pools (`upstream.pool_max_idle_per_host` per
    /// upstream URL and per Partner pool), whichever is larger; per HTTP/2 Partner, one
    /// per upstream URL and per Partner pool. Each worker thread has its own Partner
    /// pools with `runtime.scheduler = "per_core"` ([`Config::partner_pools`]).
    pub partners: u64,
    /// Partners without `limits.max_in_flight`, whose connections only the Leaders'
    /// requests bound (counted at their idle pools).
    pub unbounded: Vec<String>,
}

impl FdNeed {
    /// Everything, with [`RESERVED`].
    pub(crate) fn total(&self) -> u64 {
        self.leaders + self.partners + RESERVED
    }
}

/// The descriptors `cfg` may need.
pub(crate) fn need(cfg: &Config) -> FdNeed {
    let idle = cfg.upstream.pool_max_idle_per_host as u64;
    let pools = cfg.partner_pools() as u64;
    let mut need = FdNeed {
        leaders: cfg.listener.max_connections as u64,
        partners: 0,
        unbounded: Vec::new(),
    };
    for p in &cfg.partners {
        if p.http2 {
            // One multiplexed connection per upstream URL in each pool.
            need.partners += p.upstreams.len() as u64 * pools;
            continue;
        }
        let idle = idle * p.upstreams.len() as u64 * pools;
        match p.max_in_flight {
            Some(n) => need.partners += (n as u64).max(idle),
            None => {
                need.partners += idle;
                need.unbounded.push(p.name.clone());
            }
        }
    }
    need
}

/// Whether `need` fits under `limit`; the error names the settings to change.
pub(crate) fn check(need: &FdNeed, limit: &NofileLimit) -> Result<(), String> {
    if need.total() <= limit.soft {
        return Ok(());
    }
    Err(format!(
        "the open-file limit is {} (hard limit {}), but listener.max_connections ({}) plus \
         the Partners' connections ([partner.limits] max_in_flight, else \
         upstream.pool_max_idle_per_host: {}) plus {} reserved need {}: lower \
         listener.max_connections or max_in_flight, or raise the hard limit (ulimit -Hn, \
         systemd LimitNOFILE=, docker --ulimit nofile=)",
        limit.soft,
        limit.hard,
        need.leaders,
        need.partners,
        RESERVED,
        need.total()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str, partners: &str) -> Config {
        let text = format!(
            "[listener]\nbind = \"127.0.0.1:0\"\ncert = \"c.pem\"\nkey = \"k.pem\"\nclient_ca = [\"ca.pem\"]\n{extra}\n{partners}"
        );
        Config::parse(&text, std::path::Path::new("/")).unwrap()
    }

    const P: &str =
        "[[partner]]\nname = \"{n}\"\nprefix = \"/{n}\"\nupstreams = [\"http://127.0.0.1:1\"]\n";

    fn partner(n: &str, extra: &str) -> String {
        format!("{}{extra}\n", P.replace("{n}", n))
    }

    /// Per-core workers each keep their own Partner pools: idle HTTP/1.1 connections and
    /// HTTP/2 connections count once per worker; `max_in_flight` stays one bound.
    #[test]
    fn need_counts_a_partner_pool_per_worker() {
        let partners = format!(
            "{}{}{}",
            partner("a", "[partner.limits]\nmax_in_flight = 500"),
            partner("c", ""),
            partner("d", "http2 = true")
        );
        let upstream = "[upstream]\npool_max_idle_per_host = 8";
        let per_core = config(
            &format!("max_connections = 10\n[runtime]\nworker_threads = 4\n{upstream}"),
            &partners,
        );
        assert_eq!(need(&per_core).partners, 500 + 8 * 4 + 4);
        let shared = config(
            &format!(
                "max_connections = 10\n[runtime]\nworker_threads = 4\nscheduler = \"shared\"\n{upstream}"
            ),
            &partners,
        );
        assert_eq!(need(&shared).partners, 500 + 8 + 1);
    }

    #[test]
    fn need_counts_leaders_partners_and_names_unbounded_ones() {
        let cfg = config(
            "max_connections = 1000\n[runtime]\nworker_threads = 1\n[upstream]\npool_max_idle_per_host = 8",
            &format!(
                "{}{}{}{}",
                partner("a", "[partner.limits]\nmax_in_flight = 500"),
                partner("b", "[partner.limits]\nmax_in_flight = 4"),
                partner("c", ""),
                partner("d", "http2 = true")
            ),
        );
        let n = need(&cfg);
        assert_eq!(n.leaders, 1000);
        assert_eq!(n.partners, 500 + 8 + 8 + 1);
        assert_eq!(n.unbounded, vec!["c".to_owned()]);
        assert_eq!(n.total(), 1000 + 517 + RESERVED);
        let fits = NofileLimit {
            soft_before: 1024,
            soft: 2000,
            hard: 2000,
        };
        assert!(check(&n, &fits).is_ok());
        let short = NofileLimit { soft: 1024, ..fits };
        let e = check(&n, &short).unwrap_err();
        assert!(e.contains("listener.max_connections (1000)"), "{e}");
        assert!(e.contains("max_in_flight"), "{e}");
        assert!(e.contains("need 1581"), "{e}");
    }

    #[test]
    fn raise_reaches_the_hard_limit() {
        let l = raise().unwrap();
        assert!(l.soft == l.hard || l.hard == rlimit::INFINITY, "{l:?}");
        assert!(l.soft >= l.soft_before);
    }
}
