//! What the shared store is (`cluster.topology`), and what a server says it is: asked at
//! start and after every reconnection, so a Redis Cluster node, a replica or a Sentinel
//! named where a single master is expected is refused with a message saying which,
//! instead of the gateway going on half-shared (keys of other slots answered `MOVED`,
//! writes refused `READONLY`: every instance then falls back to its own state, unseen).

use std::time::Duration;

use super::ClusterSettings;

/// Asks a server what it is (`INFO server`, `INFO replication`; two commands, for servers
/// older than Redis 7).
pub(crate) async fn ask(
    conn: &mut impl redis::aio::ConnectionLike,
) -> redis::RedisResult<ServerInfo> {
    let (server, replication): (String, String) = redis::pipe()
        .cmd("INFO")
        .arg("server")
        .cmd("INFO")
        .arg("replication")
        .query_async(conn)
        .await?;
    Ok(ServerInfo::parse(&format!("{server}\n{replication}")))
}

/// Why `redis_url` could not serve as `cluster.topology` says, when the store's own
/// client failed: a standalone server named as a Redis Cluster seed or as a Sentinel.
/// `None` when it cannot be asked either, or fits.
pub(crate) async fn diagnose(s: &ClusterSettings, within: Duration) -> Option<String> {
    if s.topology == Topology::Single {
        return None;
    }
    let url = s.redis_url.as_str();
    let client = redis::Client::open(url).ok()?;
    let run = async {
        let mut c = client.get_multiplexed_async_connection().await?;
        ask(&mut c).await
    };
    let info = tokio::time::timeout(within, run).await.ok()?.ok()?;
    match s.topology {
        Topology::Sentinel if info.mode != "sentinel" => Some(format!(
            "{url} is not a Redis Sentinel (redis_mode:{}), but cluster.topology is \
             \"sentinel\" (redis_url and redis_urls name Sentinels): set cluster.topology = \
             \"{}\"",
            info.mode,
            if info.mode == "cluster" {
                "cluster"
            } else {
                "single"
            }
        )),
        Topology::Sentinel => None,
        t => info.misfit(t, url),
    }
}

/// `[cluster] topology`: what `redis_url` (and `redis_urls`) name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// One Redis master (`redis_url`); the default.
    #[default]
    Single,
    /// A Redis Cluster: `redis_url` and `redis_urls` are seed nodes; slots are discovered
    /// and followed (`MOVED`/`ASK`, failovers).
    Cluster,
    /// A master under Redis Sentinel: `redis_url` and `redis_urls` are Sentinels, asked for
    /// the master named `sentinel_master`; a promotion is followed.
    Sentinel,
}

impl Topology {
    /// Its name in the config.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::Cluster => "cluster",
            Topology::Sentinel => "sentinel",
        }
    }
}

/// What a server said of itself (`INFO server` and `INFO replication`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ServerInfo {
    /// `redis_mode`: `standalone`, `cluster` or `sentinel`.
    pub mode: String,
    /// `role`: `master` or `slave` (none for a Sentinel).
    pub role: String,
    /// For a replica, its master (`master_host:master_port`).
    pub master: Option<String>,
}

impl ServerInfo {
    /// Reads the `field:value` lines of `INFO` sections.
    pub(crate) fn parse(text: &str) -> ServerInfo {
        let mut info = ServerInfo::default();
        let (mut host, mut port) = (None, None);
        for line in text.lines() {
            let Some((k, v)) = line.trim().split_once(':') else {
                continue;
            };
            match k {
                "redis_mode" | "server_mode" => info.mode = v.to_owned(),
                "role" => info.role = v.to_owned(),
                "master_host" => host = Some(v.to_owned()),
                "master_port" => port = Some(v.to_owned()),
                _ => {}
            }
        }
        if let (Some(h), Some(p)) = (host, port) {
            info.master = Some(format!("{h}:{p}"));
        }
        info
    }

    /// `None` when this server is what `topology` expects of the server it writes to
    /// (for `cluster`: any node of it), else why not and what to configure instead.
    pub(crate) fn misfit(&self, topology: Topology, url: &str) -> Option<String> {
        let how = "set cluster.topology = \"cluster\" (redis_url: any node; redis_urls: more \
                   seed nodes), so each key goes to the node that holds its slot";
        match (topology, self.mode.as_str()) {
            (Topology::Single | Topology::Sentinel, "cluster") => Some(format!(
                "{url} is a Redis Cluster node (redis_mode:cluster), but cluster.topology is \
                 \"{}\": as one server it would answer MOVED for the keys of the slots other \
                 nodes hold, and every instance would go on alone; {how}",
                topology.name()
            )),
            (Topology::Single, "sentinel") => Some(format!(
                "{url} is a Redis Sentinel (redis_mode:sentinel), not a Redis server: set \
                 cluster.topology = \"sentinel\" and cluster.sentinel_master to the master's \
                 name"
            )),
            (Topology::Cluster, "standalone" | "sentinel") => Some(format!(
                "{url} is not a Redis Cluster node (redis_mode:{}), but cluster.topology is \
                 \"cluster\": set cluster.topology = \"{}\"",
                self.mode,
                if self.mode == "sentinel" {
                    "sentinel"
                } else {
                    "single"
                }
            )),
            (Topology::Single | Topology::Sentinel, _) if self.role != "master" => Some(format!(
                "{url} is a replica (role:{}{}), not a master: it refuses writes \
                     (READONLY) and every instance would go on alone; name the master, or set \
                     cluster.topology = \"sentinel\" to follow failovers",
                self.role,
                self.master
                    .as_deref()
                    .map(|m| format!(", master at {m}"))
                    .unwrap_or_default()
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER_NODE: &str = "# Server\r\nredis_version:7.0.15\r\nredis_mode:cluster\r\n\
        # Replication\r\nrole:master\r\nconnected_slaves:0\r\n";
    const REPLICA: &str = "# Server\r\nredis_mode:standalone\r\n# Replication\r\n\
        role:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:7000\r\n";
    const MASTER: &str = "# Server\r\nredis_mode:standalone\r\n# Replication\r\nrole:master\r\n";

    /// Each misfit is named with what to configure; a fit is silent.
    #[test]
    fn servers_are_told_apart() {
        let url = "redis://h:1";
        let node = ServerInfo::parse(CLUSTER_NODE);
        assert_eq!(node.mode, "cluster");
        let msg = node.misfit(Topology::Single, url).unwrap();
        assert!(msg.contains("Redis Cluster node") && msg.contains("topology = \"cluster\""));
        assert_eq!(node.misfit(Topology::Cluster, url), None);

        let replica = ServerInfo::parse(REPLICA);
        assert_eq!(replica.master.as_deref(), Some("127.0.0.1:7000"));
        let msg = replica.misfit(Topology::Single, url).unwrap();
        assert!(msg.contains("replica") && msg.contains("master at 127.0.0.1:7000"));
        assert!(replica.misfit(Topology::Sentinel, url).is_some());

        let master = ServerInfo::parse(MASTER);
        assert_eq!(master.misfit(Topology::Single, url), None);
        assert_eq!(master.misfit(Topology::Sentinel, url), None);
        let msg = master.misfit(Topology::Cluster, url).unwrap();
        assert!(msg.contains("not a Redis Cluster node") && msg.contains("\"single\""));

        let sentinel = ServerInfo::parse("redis_mode:sentinel\r\n");
        assert!(sentinel
            .misfit(Topology::Single, url)
            .unwrap()
            .contains("Sentinel"));
    }
}
