//! Redis topologies of the tests' own, on loopback: a Redis Cluster (masters, and
//! replicas if asked) made with `redis-cli --cluster create`, and a master with replicas
//! under Sentinels. Nodes start in parallel, without persistence, in one temporary
//! directory; every wait polls with a deadline. Without `redis-server`/`redis-cli` the
//! tests skip, except under `CI=true`, where a missing binary fails them.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// A loopback port free now whose cluster bus port (+10000) is free too.
fn free_port() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Polls `f` every 20 ms until it answers `Some`, or panics with `what` past `within`.
#[expect(
    clippy::disallowed_methods,
    reason = "polls processes outside the async code, with a deadline"
)]
pub fn poll<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `redis-server` process.
pub struct Node {
    pub port: u16,
    child: Option<Child>,
    /// How it was started (`spawn`'s directory and extra arguments), to start it again.
    started: Option<(std::path::PathBuf, Vec<String>)>,
}

impl Node {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs one command on this node alone.
    pub fn cmd(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let client = redis::Client::open(self.url())?;
        let mut c = client.get_connection_with_timeout(Duration::from_secs(1))?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c)
    }

    /// `INFO section` as text.
    pub fn info(&self, section: &str) -> String {
        match self.cmd(&["INFO", section]) {
            Ok(v) => redis::from_redis_value::<String>(v).unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("kill runs");
        assert!(ok.success(), "kill -{signal} {pid}");
    }

    /// Kills it and starts it again on its port with what it was started with, without
    /// its data (no persistence; a cluster node keeps its `nodes.conf`: its slots and
    /// peers); waits until it answers.
    pub fn restart_empty(&mut self) {
        self.kill();
        let (dir, extra) = self.started.clone().expect("started by spawn");
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        *self = spawn(&dir, self.port, &extra);
        answering(&dir, std::slice::from_ref(self));
    }

    /// Kills it (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `redis-server` on `port` with `extra` arguments, in `dir`.
///
/// Each node has its own snapshot file: a replica's full sync renames the file it
/// received to `dir/dbfilename` and then loads it, so on one shared `dump.rdb` replicas
/// syncing at once (their masters' sync delays start together at the cluster's creation)
/// loaded each other's data, and a replica then held another shard's keys at its own
/// master's offset. A replica deletes the file once loaded (persistence is off), so a node
/// restarted by `restart_empty` starts empty.
fn spawn(dir: &std::path::Path, port: u16, extra: &[&str]) -> Node {
    let p = port.to_string();
    let rdb = format!("dump-{port}.rdb");
    let child = Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            &p,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dbfilename",
            &rdb,
            "--rdb-del-sync-files",
            "yes",
        ])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(format!("redis-{port}.log")))
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server starts");
    Node {
        port,
        child: Some(child),
        started: Some((
            dir.to_owned(),
            extra.iter().map(|s| (*s).to_owned()).collect(),
        )),
    }
}

/// Waits until every node answers `PING`.
fn answering(dir: &std::path::Path, nodes: &[Node]) {
    for n in nodes {
        poll(
            &format!(
                "redis-server on {} answering; its log:\n{}",
                n.port,
                std::fs::read_to_string(dir.join(format!("redis-{}.log", n.port)))
                    .unwrap_or_default()
            ),
            Duration::from_secs(30),
            || n.cmd(&["PING"]).ok(),
        );
    }
}

/// A Redis Cluster on loopback.
pub struct RedisCluster {
    pub nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    /// `masters` masters, each with `replicas` replicas; `None` (skip) without the
    /// binaries outside CI.
    pub fn start(masters: usize, replicas: usize) -> Option<RedisCluster> {
        RedisCluster::start_with(masters, replicas, &[])
    }

    /// [`RedisCluster::start`] with `extra` arguments for every node.
    pub fn start_with(masters: usize, replicas: usize, extra: &[&str]) -> Option<RedisCluster> {
        if !crate::support::installed("redis-server", &["--version"])
            || !crate::support::installed("redis-cli", &["--version"])
        {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let count = masters * (1 + replicas);
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < count {
            let p = free_port();
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        let nodes: Vec<Node> = ports
            .iter()
            .map(|&p| {
                let conf = format!("nodes-{p}.conf");
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    "1000",
                ];
                args.extend_from_slice(extra);
                spawn(dir.path(), p, &args)
            })
            .collect();
        answering(dir.path(), &nodes);
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes, _dir: dir };
        cluster.until_ok(Duration::from_secs(20));
        Some(cluster)
    }

    /// Waits until every live node says `cluster_state:ok` and sees every slot served.
    pub fn until_ok(&self, within: Duration) {
        poll("cluster_state:ok on every node", within, || {
            self.nodes
                .iter()
                .filter(|n| n.child.is_some())
                .all(|n| {
                    let info = match n.cmd(&["CLUSTER", "INFO"]) {
                        Ok(v) => redis::from_redis_value::<String>(v).unwrap_or_default(),
                        Err(_) => return false,
                    };
                    info.contains("cluster_state:ok")
                })
                .then_some(())
        });
    }

    /// The index of the node that serves `key` (the others answer `MOVED`).
    pub fn node_of(&self, key: &str) -> usize {
        poll(
            &format!("the node holding {key}"),
            Duration::from_secs(5),
            || {
                self.nodes
                    .iter()
                    .position(|n| n.child.is_some() && n.cmd(&["EXISTS", key]).is_ok())
            },
        )
    }

    /// `host:port` of node `i`, as the gateway names it.
    pub fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.nodes[i].port)
    }

    /// Every node killed and started again without its data (each keeps its slots), then
    /// waits until the cluster serves every slot again.
    pub fn restart_empty(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
        for n in &mut self.nodes {
            n.restart_empty();
        }
        self.until_ok(Duration::from_secs(30));
    }

    /// The first node's URL (a seed).
    pub fn url(&self) -> String {
        self.nodes[0].url()
    }

    /// Config lines for `[cluster]`: the topology and every node as a seed.
    pub fn config_lines(&self) -> String {
        let rest: Vec<String> = self.nodes[1..]
            .iter()
            .map(|n| format!("\"{}\"", n.url()))
            .collect();
        format!(
            "topology = \"cluster\"\nredis_url = \"{}\"\nredis_urls = [{}]",
            self.url(),
            rest.join(", ")
        )
    }

    /// Runs one command through a cluster client (routed by its key).
    pub fn cmd(&self, args: &[&str]) -> redis::Value {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(Node::url)
            .collect();
        let client = redis::cluster::ClusterClient::builder(seeds)
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let mut c = client.get_connection().unwrap();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c).unwrap()
    }
}

/// A master with replicas under three Sentinels (quorum 2) named `mymaster`.
pub struct Sentinels {
    pub data: Vec<Node>,
    pub sentinels: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl Sentinels {
    /// A master and `replicas` replicas replicating, without Sentinels.
    pub fn start_without_sentinels(replicas: usize) -> Option<Sentinels> {
        if !crate::support::installed("redis-server", &["--version"]) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let master_port = free_port();
        let mut data = vec![spawn(dir.path(), master_port, &[])];
        let mp = master_port.to_string();
        for _ in 0..replicas {
            data.push(spawn(
                dir.path(),
                free_port(),
                &["--replicaof", "127.0.0.1", &mp],
            ));
        }
        answering(dir.path(), &data);
        poll("the replicas connected", Duration::from_secs(30), || {
            data[0]
                .info("replication")
                .contains(&format!("connected_slaves:{replicas}"))
                .then_some(())
        });
        Some(Sentinels {
            data,
            sentinels: Vec::new(),
            _dir: dir,
        })
    }

    /// A master and `replicas` replicas, three Sentinels watching them (down after
    /// 500 ms, failover timeout 2 s).
    pub fn start(replicas: usize) -> Option<Sentinels> {
        let Sentinels {
            data,
            sentinels: _,
            _dir: dir,
        } = Sentinels::start_without_sentinels(replicas)?;
        let mp = data[0].port.to_string();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf = dir.path().join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nsentinel monitor mymaster 127.0.0.1 {mp} 2\n\
                     sentinel down-after-milliseconds mymaster 500\n\
                     sentinel failover-timeout mymaster 2000\n\
                     sentinel parallel-syncs mymaster 1\n"
                ),
            )
            .unwrap();
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .args(["--logfile"])
                .arg(dir.path().join(format!("redis-{port}.log")))
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel starts");
            sentinels.push(Node {
                port,
                child: Some(child),
                started: None,
            });
        }
        answering(dir.path(), &sentinels);
        let s = Sentinels {
            data,
            sentinels,
            _dir: dir,
        };
        // Every Sentinel knows the master and its replicas.
        poll(
            "the Sentinels see the replicas",
            Duration::from_secs(30),
            || {
                s.sentinels
                    .iter()
                    .all(|n| {
                        let info = n.info("sentinel");
                        info.contains(&format!("slaves={replicas}")) && info.contains("sentinels=3")
                    })
                    .then_some(())
            },
        );
        Some(s)
    }

    /// Config lines for `[cluster]`.
    pub fn config_lines(&self) -> String {
        let rest: Vec<String> = self.sentinels[1..]
            .iter()
            .map(|n| format!("\"{}\"", n.url()))
            .collect();
        format!(
            "topology = \"sentinel\"\nsentinel_master = \"mymaster\"\nredis_url = \"{}\"\nredis_urls = [{}]",
            self.sentinels[0].url(),
            rest.join(", ")
        )
    }

    /// The index in `data` of the master the Sentinels name now.
    pub fn master(&self) -> usize {
        let port = poll(
            "a Sentinel naming the master",
            Duration::from_secs(30),
            || {
                self.sentinels.iter().find_map(|s| {
                    let v = s
                        .cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
                        .ok()?;
                    let [_, port]: [String; 2] = redis::from_redis_value(v).ok()?;
                    port.parse::<u16>().ok()
                })
            },
        );
        self.data
            .iter()
            .position(|n| n.port == port)
            .expect("a node of ours")
    }

    /// Runs one command on the current master.
    pub fn cmd(&self, args: &[&str]) -> redis::Value {
        self.data[self.master()].cmd(args).unwrap()
    }
}
