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

/// The open-file check, one for `aipgw check`, `aipgw run` and every reload: raises the
/// soft limit to the hard one (as `run` does at start; again is a no-op) and fails when
/// `cfg`'s bounds do not fit under it, naming the numbers and the settings that change
/// them.
pub(crate) fn ensure(cfg: &Config) -> Result<NofileLimit, OverBudget> {
    let limit = raise().map_err(|e| OverBudget {
        need: need(cfg),
        limit: None,
        detail: format!("cannot read or raise the open-file limit: {e}"),
    })?;
    let need = need(cfg);
    match check(&need, &limit) {
        Ok(()) => Ok(limit),
        Err(detail) => Err(OverBudget {
            need,
            limit: Some(limit),
            detail,
        }),
    }
}

/// A config whose bounds do not fit under the open-file limit.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{detail}")]
pub(crate) struct OverBudget {
    /// What it would need.
    pub need: FdNeed,
    /// The limit (`None`: it could not be read).
    pub limit: Option<NofileLimit>,
    detail: String,
}

/// What a configuration may hold open at once. The number of Partners is not part of
/// it: Partners share their origins' pools, and every Partner connection is within
/// `upstream.max_connections`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FdNeed {
    /// `listener.max_connections`.
    pub leaders: u64,
    /// `upstream.max_connections`.
    pub partners: u64,
}

impl FdNeed {
    /// Everything, with [`RESERVED`].
    pub(crate) fn total(&self) -> u64 {
        self.leaders + self.partners + RESERVED
    }
}

/// The descriptors `cfg` may need.
pub(crate) fn need(cfg: &Config) -> FdNeed {
    FdNeed {
        leaders: cfg.listener.max_connections as u64,
        partners: cfg.upstream.max_connections as u64,
    }
}

/// Whether `need` fits under `limit`; the error names the settings that make the sum.
pub(crate) fn check(need: &FdNeed, limit: &NofileLimit) -> Result<(), String> {
    if need.total() <= limit.soft {
        return Ok(());
    }
    Err(format!(
        "the open-file limit is {} (hard limit {}), but listener.max_connections ({}) plus \
         upstream.max_connections ({}) plus {} reserved need {}: lower \
         listener.max_connections or upstream.max_connections, or raise the hard limit \
         (ulimit -Hn, systemd LimitNOFILE=, docker --ulimit nofile=)",
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

    /// Issue 38: the need does not grow with the Partners (10,000 on one origin, with
    /// the defaults, fit under 20,000 open files), and the refusal names the settings
    /// that make the sum, not `max_in_flight`, which cannot change it.
    #[test]
    fn need_is_the_two_connection_bounds_whatever_the_partners() {
        let mut fleet = String::new();
        for n in 0..10_000 {
            fleet.push_str(&partner(
                &n.to_string(),
                "[partner.limits]\nmax_in_flight = 500",
            ));
        }
        let cfg = config("", &fleet);
        let n = need(&cfg);
        assert_eq!(
            n,
            FdNeed {
                leaders: 10_000,
                partners: 4096
            }
        );
        assert_eq!(n.total(), 10_000 + 4096 + RESERVED);
        let limit = NofileLimit {
            soft_before: 1024,
            soft: 20_000,
            hard: 20_000,
        };
        assert!(check(&n, &limit).is_ok());
        let small = config(
            "max_connections = 1000\n[upstream]\nmax_connections = 500",
            &partner("a", ""),
        );
        assert_eq!(need(&small).total(), 1564);
        let short = NofileLimit {
            soft: 1024,
            ..limit
        };
        let e = check(&need(&small), &short).unwrap_err();
        assert!(e.contains("listener.max_connections (1000)"), "{e}");
        assert!(e.contains("upstream.max_connections (500)"), "{e}");
        assert!(e.contains("need 1564"), "{e}");
        assert!(!e.contains("max_in_flight"), "{e}");
    }

    #[test]
    fn raise_reaches_the_hard_limit() {
        let l = raise().unwrap();
        assert!(l.soft == l.hard || l.hard == rlimit::INFINITY, "{l:?}");
        assert!(l.soft >= l.soft_before);
    }
}
