//! Faults of the shared store on a Redis Cluster and under Sentinel (issue 30): the
//! single-node tests' assertions for a store restarted empty (task owners and stream
//! leases come back) and for a paused node (the request path unaffected, within
//! `command_timeout`), plus what the instance shows of it: `aipgw_redis_node_up` and
//! `aipgw_redis_node_errors_total` by node, and `/readyz`'s detail.
//! A started topology is shared by the assertions of one test.

use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::{
    metric, pair, stream_leases_come_back_after_redis_restarts_empty_on,
    task_owners_come_back_after_redis_restarts_empty_on, three_masters, Store, Two, FAST,
};
use crate::cluster_topology::*;
use crate::support::*;

/// Owners and leases after every node of a three-master Redis Cluster restarts empty
/// (each keeps its slots): the single-node tests' assertions, on one cluster.
#[tokio::test]
async fn a_redis_cluster_restarted_empty() {
    let Some(mut cluster) = three_masters() else {
        return;
    };
    task_owners_come_back_after_redis_restarts_empty_on(&mut cluster).await;
    stream_leases_come_back_after_redis_restarts_empty_on(&mut cluster).await;
}

/// The instance markers each master of `cluster` holds.
fn markers_on(cluster: &RedisCluster) -> Vec<usize> {
    cluster
        .nodes
        .iter()
        .map(|n| match n.cmd(&["KEYS", "aipgw:*:marker"]) {
            Ok(redis::Value::Array(keys)) => keys.len(),
            _ => 0,
        })
        .collect()
}

/// One master of a three-master Redis Cluster (no replicas) restarted empty, the others
/// untouched: the task owners it held come back, although the instances' markers on the
/// other masters were never lost.
#[tokio::test]
async fn one_master_of_a_redis_cluster_restarted_empty() {
    let Some(mut cluster) = three_masters() else {
        return;
    };
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let (a, b) = pair(&pki, &cluster, FAST, "", &partner.url()).await;
    // Both instances have marked every master (before, each instance had one marker, in
    // one slot: a master without one lost its owners for good). Polled between awaits:
    // the instances run here.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let marks = markers_on(&cluster);
        if marks.iter().all(|&n| n >= 2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a marker of each instance on every master: {marks:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = 1;
    // A task whose owner lives on master `m`.
    let (task, key) = (0..500)
        .map(|i| {
            let task = format!("t{i}");
            let key = format!("aipgw:{{aipgw:task:1:p:{}:{task}}}:owner", task.len());
            (task, key)
        })
        .find(|(_, key)| cluster.node_of(key) == m)
        .expect("a task on each master");
    let la = pki.leader(LEADER_A, false);
    let r = la
        .post(a.addr, "/p/rpc", &rpc_start("1", LEADER_A, &task))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let owner = redis::Value::BulkString(LEADER_A.as_bytes().to_vec());
    assert_eq!(cluster.cmd(&["GET", &key]), owner);

    cluster.nodes[m].restart_empty();
    cluster.until_ok(Duration::from_secs(30));
    assert_eq!(cluster.cmd(&["GET", &key]), redis::Value::Nil);
    let deadline = Instant::now() + Duration::from_secs(15);
    while cluster.cmd(&["GET", &key]) != owner {
        assert!(
            Instant::now() < deadline,
            "the owner was not written back after master {m} restarted empty"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lb = pki.leader(LEADER_B, false);
    let r = lb
        .post(b.addr, "/p/rpc", &rpc_start("2", LEADER_B, &task))
        .await
        .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.error(), (-32009, "not_task_owner".into()));
}

/// The same under Sentinel: the master (without a replica to promote) restarts empty.
#[tokio::test]
async fn a_master_under_sentinel_restarted_empty() {
    let Some(mut store) = Sentinels::start(0) else {
        return;
    };
    task_owners_come_back_after_redis_restarts_empty_on(&mut store).await;
    stream_leases_come_back_after_redis_restarts_empty_on(&mut store).await;
}

/// One master of a three-master Redis Cluster stopped (SIGSTOP; the cluster configured to
/// go on serving the other slots, `cluster-require-full-coverage no`): the node holding
/// the caller's quota state. Requests are answered as before, none held near the pause;
/// the instance counts the failed syncs against that node, shows it down with its slots
/// in `/readyz` (still ready: `on_error = "local"`) while the other masters answer, and
/// up again once it resumes. Before, nothing named the node.
#[tokio::test]
async fn a_paused_node_of_a_redis_cluster() {
    let Some(cluster) = RedisCluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"])
    else {
        return;
    };
    let t = Paused::start(&cluster).await;
    // Polled between awaits: the instances run on this test's runtime.
    let deadline = Instant::now() + Duration::from_secs(5);
    let key = loop {
        if let Some(k) = cluster.quota_key(&format!("aic:{LEADER_A}")) {
            break k;
        }
        assert!(
            Instant::now() < deadline,
            "no shared state for the caller's quota"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let i = cluster.node_of(&key);
    let node = cluster.addr(i);
    for n in 0..3 {
        t.until_node(&cluster.addr(n), 1.0).await;
    }
    let (status, body) = t.a.admin_get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("store: cluster"), "{body}");
    assert_eq!(body.matches(" answers slots ").count(), 3, "{body}");

    cluster.nodes[i].signal("STOP");
    let resumed = Resume(&cluster.nodes[i]);
    t.answered_while_paused().await;
    t.until_node(&node, 0.0).await;
    for n in (0..3).filter(|&n| n != i) {
        assert_eq!(t.node_up(&cluster.addr(n)).await, Some(1.0), "{n}");
    }
    t.sync_errors_on(&node).await;
    let (status, body) = t.a.admin_get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!("node {node} does not answer slots ")),
        "{body}"
    );
    drop(resumed);
    t.until_node(&node, 1.0).await;
}

/// The master under Sentinel stopped (no replica to promote): the same assertions, the
/// master named as the node.
#[tokio::test]
async fn a_paused_master_under_sentinel() {
    let Some(store) = Sentinels::start(0) else {
        return;
    };
    let t = Paused::start(&store).await;
    let node = format!("127.0.0.1:{}", store.data[0].port);
    t.until_node(&node, 1.0).await;
    store.data[0].signal("STOP");
    let resumed = Resume(&store.data[0]);
    t.answered_while_paused().await;
    t.until_node(&node, 0.0).await;
    t.sync_errors_on(&node).await;
    let (status, body) = t.a.admin_get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("store: sentinel"), "{body}");
    assert!(
        body.contains(&format!("node {node} does not answer")),
        "{body}"
    );
    drop(resumed);
    t.until_node(&node, 1.0).await;
}

/// Sends SIGCONT when dropped (also when an assertion fails first).
struct Resume<'a>(&'a Node);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.signal("CONT");
    }
}

/// Two instances with a quota that admits everything, the caller's quota state in Redis.
struct Paused {
    two: Two<TestPartner>,
}

impl std::ops::Deref for Paused {
    type Target = Two<TestPartner>;
    fn deref(&self) -> &Two<TestPartner> {
        &self.two
    }
}

impl Paused {
    async fn start(store: &impl Store) -> Paused {
        let two = Two::echo(store, FAST, "[ratelimit]\nrate = 1000.0\nburst = 1000").await;
        let r = two
            .leader
            .post(two.a.addr, "/p/rpc", &rpc_start("0", LEADER_A, "t"))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        Paused { two }
    }

    /// The single-node test's assertion: every request answered, none held near the pause.
    async fn answered_while_paused(&self) {
        let mut slowest = Duration::ZERO;
        for i in 0..30 {
            let t = Instant::now();
            let gw = [self.a.addr, self.b.addr][i % 2];
            let r = self
                .leader
                .post(gw, "/p/rpc", &rpc_start(&i.to_string(), LEADER_A, "t"))
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            slowest = slowest.max(t.elapsed());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            slowest < Duration::from_millis(1000),
            "a request waited {slowest:?} while a node was paused"
        );
    }

    async fn node_up(&self, node: &str) -> Option<f64> {
        metric(&self.a, &format!("aipgw_redis_node_up{{node=\"{node}\"}}")).await
    }

    /// Waits until instance A's probe shows `node` up (1) or down (0).
    async fn until_node(&self, node: &str, want: f64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.node_up(node).await != Some(want) {
            assert!(
                Instant::now() < deadline,
                "{node} not {want}: {}",
                self.a.admin_get("/metrics").await.1
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The failed syncs are counted against `node`, on A or on B (whichever admitted
    /// the requests of the sync).
    async fn sync_errors_on(&self, node: &str) {
        let name =
            format!("aipgw_redis_node_errors_total{{op=\"ratelimit_sync\",node=\"{node}\"}}");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut n = 0.0;
            for gw in [&self.a, &self.b] {
                n += metric(gw, &name).await.unwrap_or(0.0);
            }
            if n > 0.0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no sync failure counted against {node}: {}",
                self.a.admin_get("/metrics").await.1
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
