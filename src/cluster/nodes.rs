//! The shared store's nodes as this instance sees them, for operators: which node holds
//! which slots and whether it answers (`aipgw_redis_node_up{node}`), failed commands by
//! operation and node (`aipgw_redis_node_errors_total{op,node}`), a warning naming the
//! nodes and slot ranges out of reach (at most once per
//! `cluster.unreachable_warn_interval`), and `/readyz`'s detail.
//!
//! The `node` label is bounded by the store itself: the master of `single` and
//! `sentinel`, the current masters of a Redis Cluster. A node that stops being a master
//! (a failover) has its series removed.
//!
//! A Redis Cluster is probed every `sync_interval`: `CLUSTER SLOTS` asked of every known
//! master and seed at once, on a connection of the probe's own per node, each within
//! `command_timeout`; a node that answers is up, and the first answer is the slot map.
//! `single` and `sentinel` have one node, up while the last command succeeded.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, IntoConnectionInfo, Value};
use tokio::time::Instant;

use super::slots::NO_SLOT;
use super::{lock, Cluster, OnClusterError, Topology};
use crate::metrics::{NodeLabels, NodeOpLabels};

/// One node as last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeState {
    /// `host:port`.
    pub addr: String,
    /// The slot ranges it serves (a Redis Cluster's master; empty otherwise).
    pub slots: Vec<(u16, u16)>,
    /// Whether it answered the last probe.
    pub up: bool,
}

/// What this instance knows of the store's nodes.
#[derive(Default)]
pub(crate) struct Nodes {
    view: Mutex<View>,
    /// How many times the masters changed after the first probe (a failover, slots moved):
    /// the task owners this instance knows are written back then (`tasks`), as writes
    /// the old master had not yet replicated are gone.
    changes: AtomicU64,
}

#[derive(Default)]
struct View {
    nodes: Vec<NodeState>,
    /// Whether a probe has run.
    probed: bool,
    /// `(op, node)` pairs counted in `aipgw_redis_node_errors_total`, to remove with their
    /// node.
    counted: BTreeSet<(&'static str, String)>,
    /// When the last warning was logged.
    warned: Option<Instant>,
}

impl Nodes {
    /// How many times the masters (or which slots each serves) changed since start.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// The slot ranges of each master last seen (a Redis Cluster; empty before the first
    /// probe and for other topologies).
    pub(crate) fn master_slots(&self) -> Vec<Vec<(u16, u16)>> {
        lock(&self.view)
            .nodes
            .iter()
            .filter(|n| !n.slots.is_empty())
            .map(|n| n.slots.clone())
            .collect()
    }

    /// The node a failed command went to: the master holding `slot` (a Redis Cluster),
    /// else the one master.
    fn node_of(&self, slot: u32) -> Option<String> {
        let view = lock(&self.view);
        if slot == NO_SLOT {
            return (view.nodes.len() == 1).then(|| view.nodes[0].addr.clone());
        }
        let slot = u16::try_from(slot).ok()?;
        view.nodes
            .iter()
            .find(|n| n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .map(|n| n.addr.clone())
    }
}

impl Cluster {
    /// Counts a failed operation against the node it went to (`slot`: the slot of its
    /// keys, or [`NO_SLOT`]); nothing when that node is not known yet.
    pub(crate) fn count_node_error(&self, op: &'static str, slot: u32) {
        let Some(node) = self.nodes.node_of(slot) else {
            return;
        };
        self.metrics
            .redis_node_errors
            .get_or_create(&NodeOpLabels {
                op,
                node: node.clone(),
            })
            .inc();
        lock(&self.nodes.view).counted.insert((op, node));
    }

    /// Records a probe's view: the gauges, series of nodes gone removed, and the warning
    /// when some node does not answer.
    fn publish(&self, nodes: Vec<NodeState>) {
        let mut view = lock(&self.nodes.view);
        let now: BTreeSet<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
        for old in &view.nodes {
            if !now.contains(old.addr.as_str()) {
                self.metrics.redis_node_up.remove(&NodeLabels {
                    node: old.addr.clone(),
                });
            }
        }
        let gone: Vec<(&'static str, String)> = view
            .counted
            .iter()
            .filter(|(_, n)| !now.contains(n.as_str()))
            .cloned()
            .collect();
        for (op, node) in gone {
            self.metrics.redis_node_errors.remove(&NodeOpLabels {
                op,
                node: node.clone(),
            });
            view.counted.remove(&(op, node));
        }
        for n in &nodes {
            self.metrics
                .redis_node_up
                .get_or_create(&NodeLabels {
                    node: n.addr.clone(),
                })
                .set(i64::from(n.up));
        }
        let down: Vec<&NodeState> = nodes.iter().filter(|n| !n.up).collect();
        let every = self.settings.unreachable_warn_interval;
        if !down.is_empty() && view.warned.is_none_or(|at| at.elapsed() >= every) {
            view.warned = Some(Instant::now());
            let what = if down.len() == nodes.len() {
                "shared store unreachable"
            } else {
                "shared store partly unreachable"
            };
            tracing::warn!(
                nodes = %down.iter().map(|n| n.addr.as_str()).collect::<Vec<_>>().join(", "),
                slots = %slot_ranges(&down),
                on_error = ?self.settings.on_error,
                "{what}: on_error applies to the keys these nodes hold (logged at most once per {every:?})"
            );
        }
        let masters = |n: &[NodeState]| -> Vec<(String, Vec<(u16, u16)>)> {
            n.iter()
                .map(|n| (n.addr.clone(), n.slots.clone()))
                .collect()
        };
        if !view.nodes.is_empty() && !nodes.is_empty() && masters(&view.nodes) != masters(&nodes) {
            tracing::warn!(
                before = ?masters(&view.nodes),
                now = ?masters(&nodes),
                "the shared store's masters changed: task owners known here are written back"
            );
            self.nodes.changes.fetch_add(1, Ordering::AcqRel);
            // A Redis Cluster connection would find the new master only after its own
            // commands failed on the old one (seen to take up to half a second more); one
            // made now starts from the new slot map.
            if self.settings.topology == Topology::Cluster {
                self.link.reset();
                // Made now, so the next sync finds it made.
                let link = self.link.clone();
                tokio::spawn(async move { link.get().await.map(|_| ()) });
            }
        }
        view.nodes = nodes;
        view.probed = true;
    }

    /// `/readyz`: whether this instance should take traffic as far as the store goes
    /// (false only under `on_error = "closed"` while no node answers: every request under
    /// a quota would be refused), and a description of the store and its nodes.
    pub fn readiness(&self) -> (bool, String) {
        let view = lock(&self.nodes.view);
        let mut text = format!(
            "store: {} {}\n",
            self.settings.topology.name(),
            self.link.describe()
        );
        if !view.probed {
            text.push_str("nodes: not probed yet\n");
        }
        for n in &view.nodes {
            let slots = if n.slots.is_empty() {
                String::new()
            } else {
                format!(" slots {}", slot_ranges(&[n]))
            };
            let state = if n.up { "answers" } else { "does not answer" };
            text.push_str(&format!("node {} {state}{slots}\n", n.addr));
        }
        let none_up = view.probed && !view.nodes.iter().any(|n| n.up);
        let ready = !(none_up && self.settings.on_error == OnClusterError::Closed);
        (ready, text)
    }
}

/// `0-5460, 10923-16383`.
fn slot_ranges(nodes: &[&NodeState]) -> String {
    let mut all: Vec<(u16, u16)> = nodes.iter().flat_map(|n| n.slots.clone()).collect();
    all.sort_unstable();
    all.iter()
        .map(|(a, b)| format!("{a}-{b}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Probes the store every `sync_interval` (see the module documentation).
pub(crate) async fn probe_loop(cluster: Arc<Cluster>) {
    let mut tick = tokio::time::interval(cluster.settings.sync_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probe = Probe::default();
    loop {
        tick.tick().await;
        let nodes = match cluster.settings.topology {
            Topology::Cluster => probe.cluster(&cluster).await,
            Topology::Single | Topology::Sentinel => match cluster.link.master_addr() {
                Some(addr) => vec![NodeState {
                    addr,
                    slots: Vec::new(),
                    up: cluster.is_up(),
                }],
                None => Vec::new(),
            },
        };
        cluster.publish(nodes);
    }
}

/// The probe's own connections, one per node asked.
#[derive(Default)]
struct Probe {
    conns: HashMap<String, MultiplexedConnection>,
    /// The last slot map: master address to its slot ranges.
    masters: BTreeMap<String, Vec<(u16, u16)>>,
}

impl Probe {
    /// Asks every known master and seed for `CLUSTER SLOTS` at once.
    async fn cluster(&mut self, cluster: &Cluster) -> Vec<NodeState> {
        let s = &cluster.settings;
        let mut asked: BTreeSet<String> = self.masters.keys().cloned().collect();
        for url in std::iter::once(&s.redis_url).chain(&s.redis_urls) {
            if let Some(a) = addr_of(url) {
                asked.insert(a);
            }
        }
        let asks = asked.iter().map(|addr| {
            let conn = self.conns.get(addr).cloned();
            async move {
                let within = s.command_timeout.max(Duration::from_millis(1));
                let run = async {
                    let mut c = match conn {
                        Some(c) => c,
                        None => connect(cluster, addr).await?,
                    };
                    let v: Value = redis::cmd("CLUSTER")
                        .arg("SLOTS")
                        .query_async(&mut c)
                        .await?;
                    Ok::<_, redis::RedisError>((c, v))
                };
                let answer = tokio::time::timeout(within + s.connect_timeout, run).await;
                (addr.clone(), answer.ok().and_then(Result::ok))
            }
        });
        let answers = futures_util::future::join_all(asks).await;
        let mut up = BTreeSet::new();
        let mut map = None;
        for (addr, answer) in answers {
            match answer {
                Some((c, v)) => {
                    if map.is_none() {
                        map = parse_slots(&v, host_of(&addr));
                    }
                    self.conns.insert(addr.clone(), c);
                    up.insert(addr);
                }
                None => {
                    if self.conns.remove(&addr).is_some() {
                        cluster.count_error("probe");
                    }
                }
            }
        }
        if let Some(m) = map {
            self.masters = m;
        }
        self.conns
            .retain(|a, _| self.masters.contains_key(a) || asked.contains(a));
        self.masters
            .iter()
            .map(|(addr, slots)| NodeState {
                addr: addr.clone(),
                slots: slots.clone(),
                up: up.contains(addr),
            })
            .collect()
    }
}

/// A connection of the probe's own to `addr`, with `redis_url`'s credentials and TLS.
async fn connect(cluster: &Cluster, addr: &str) -> redis::RedisResult<MultiplexedConnection> {
    let s = &cluster.settings;
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| redis::RedisError::from(std::io::Error::other("not host:port")))?;
    let info = s.redis_url.as_str().into_connection_info()?;
    let tls = s.redis_url.starts_with("rediss://");
    let info = info.set_addr(if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    });
    let client = super::conn::client_for(s, info)
        .map_err(|e| redis::RedisError::from(std::io::Error::other(e.to_string())))?;
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(s.connect_timeout))
        .set_response_timeout(Some(s.command_timeout));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
}

/// `host:port` of a Redis URL.
fn addr_of(url: &str) -> Option<String> {
    match url.into_connection_info().ok()?.addr() {
        a @ (ConnectionAddr::Tcp(..) | ConnectionAddr::TcpTls { .. }) => Some(a.to_string()),
        _ => None,
    }
}

fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

/// `CLUSTER SLOTS`: master address to its slot ranges (an empty host is the node asked).
fn parse_slots(v: &Value, asked_host: &str) -> Option<BTreeMap<String, Vec<(u16, u16)>>> {
    let Value::Array(ranges) = v else {
        return None;
    };
    let mut map: BTreeMap<String, Vec<(u16, u16)>> = BTreeMap::new();
    for r in ranges {
        let Value::Array(parts) = r else { continue };
        let (Some(Value::Int(a)), Some(Value::Int(b)), Some(Value::Array(master))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            continue;
        };
        let host = match master.first() {
            Some(Value::BulkString(h)) if !h.is_empty() => String::from_utf8_lossy(h).into_owned(),
            _ => asked_host.to_owned(),
        };
        let (Some(Value::Int(port)), Ok(a), Ok(b)) =
            (master.get(1), u16::try_from(*a), u16::try_from(*b))
        else {
            continue;
        };
        map.entry(format!("{host}:{port}"))
            .or_default()
            .push((a, b));
    }
    for slots in map.values_mut() {
        slots.sort_unstable();
    }
    Some(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::slots::slot;
    use crate::cluster::{ClusterMode, ClusterSettings};
    use crate::config::raw::RawCluster;

    fn cluster(on_error: OnClusterError) -> Arc<Cluster> {
        let raw = RawCluster {
            mode: ClusterMode::Redis,
            topology: Topology::Cluster,
            on_error,
            ..RawCluster::default()
        };
        let settings = ClusterSettings::try_from(&raw).expect("valid settings");
        Cluster::new(&settings, Arc::new(crate::metrics::Metrics::new()))
            .expect("builds")
            .expect("redis mode")
    }

    fn node(port: u16, slots: (u16, u16), up: bool) -> NodeState {
        NodeState {
            addr: format!("10.0.0.1:{port}"),
            slots: vec![slots],
            up,
        }
    }

    /// Log lines written while `f` runs.
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Logs {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            lock(&self.0).extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Logs {
        fn text(&self) -> String {
            String::from_utf8_lossy(&lock(&self.0)).into_owned()
        }
    }

    /// A node that does not answer: its gauge is 0, `/readyz` names it with its slots, the
    /// warning names it and its slot range, once per `unreachable_warn_interval` however
    /// often it is probed; a node no longer a master (failover) loses its series; under
    /// `closed` the store with no node answering makes `/readyz` fail, under `local` not.
    #[tokio::test(start_paused = true)]
    async fn nodes_out_of_reach_are_shown_and_warned_of_at_a_bounded_rate() {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let c = cluster(OnClusterError::Local);
        c.publish(vec![
            node(7000, (0, 5460), true),
            node(7001, (5461, 16383), false),
        ]);
        c.publish(vec![
            node(7000, (0, 5460), true),
            node(7001, (5461, 16383), false),
        ]);
        let text = logs.text();
        assert_eq!(text.matches("partly unreachable").count(), 1, "{text}");
        assert!(
            text.contains("10.0.0.1:7001") && text.contains("5461-16383"),
            "{text}"
        );
        assert!(!text.contains("10.0.0.1:7000"), "{text}");
        let (ready, detail) = c.readiness();
        assert!(ready, "{detail}");
        assert!(
            detail.contains("node 10.0.0.1:7001 does not answer slots 5461-16383"),
            "{detail}"
        );
        assert!(
            detail.contains("node 10.0.0.1:7000 answers slots 0-5460"),
            "{detail}"
        );
        let render = || c.metrics.render(Default::default(), std::iter::empty());
        assert!(render().contains("aipgw_redis_node_up{node=\"10.0.0.1:7001\"} 0"));

        // An error counted against the node holding the slot.
        c.count_node_error("task_owner", u32::from(slot(b"{foo}")));
        assert!(
            render().contains(
                "aipgw_redis_node_errors_total{op=\"task_owner\",node=\"10.0.0.1:7001\"} 1"
            ),
            "{}",
            render()
        );

        tokio::time::advance(c.settings.unreachable_warn_interval).await;
        c.publish(vec![node(7000, (0, 16383), false)]);
        let text = logs.text();
        assert_eq!(text.matches("unreachable").count(), 2, "{text}");
        assert!(text.contains("shared store unreachable"), "{text}");
        assert!(
            !render().contains("10.0.0.1:7001"),
            "a node gone keeps no series"
        );

        assert!(c.readiness().0, "local: ready with the store out of reach");
        let closed = cluster(OnClusterError::Closed);
        assert!(closed.readiness().0, "not probed yet");
        closed.publish(vec![node(7000, (0, 16383), false)]);
        assert!(
            !closed.readiness().0,
            "closed: not ready with no node answering"
        );
        closed.publish(vec![node(7000, (0, 16383), true)]);
        assert!(closed.readiness().0);
    }

    #[test]
    fn cluster_slots_are_read() {
        let node = |h: &str, p: i64| {
            Value::Array(vec![
                Value::BulkString(h.as_bytes().to_vec()),
                Value::Int(p),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let v = Value::Array(vec![
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node("", 7001)]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
        ]);
        let map = parse_slots(&v, "10.0.0.9").unwrap();
        assert_eq!(map["10.0.0.1:7000"], vec![(0, 5460)]);
        assert_eq!(map["10.0.0.9:7001"], vec![(5461, 10922)]);
        assert_eq!(map.len(), 2, "replicas are not masters");
    }
}
