//! The connection to the shared store, one type for every `cluster.topology`:
//! - `single`: a [`ConnectionManager`] on `redis_url` (it reconnects on its own);
//! - `cluster`: a Redis Cluster connection from the seed nodes (slots discovered,
//!   `MOVED`/`ASK` followed, a new master found after a failover);
//! - `sentinel`: a [`ConnectionManager`] on the master the Sentinels name; dropped after a
//!   connection failure, a `READONLY` answer or a probe that finds a replica, so the next
//!   command asks the Sentinels again and follows a promotion.
//!
//! Every call site runs its commands on a [`Conn`] and never knows which.

use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures_util::FutureExt;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::topology::Topology;
use super::{lock, ClusterSettings};

/// A connection to the shared store, whatever its topology.
#[derive(Clone)]
pub(crate) enum Conn {
    /// A single server (also a Sentinel's master), reconnecting on its own.
    Managed(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
    /// One connection of its own to a single server (a follower's blocking reads).
    Plain(MultiplexedConnection),
    /// Another, recording the slot of the keys (of `key_prefix`) sent through it (see
    /// `slots::record_slot`).
    Traced(Box<Conn>, String, Arc<AtomicU32>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Managed(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Plain(c) => c.req_packed_command(cmd),
            Conn::Traced(c, prefix, slot) => {
                super::slots::record_slot(cmd, prefix, slot);
                c.req_packed_command(cmd)
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Managed(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Plain(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Traced(c, prefix, slot) => {
                if let Some(cmd) = pipeline.cmd_iter().next() {
                    super::slots::record_slot(cmd, prefix, slot);
                }
                c.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Managed(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Plain(c) => c.get_db(),
            Conn::Traced(c, ..) => c.get_db(),
        }
    }
}

/// How this instance reaches the store.
enum Store {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
}

/// A connection being made, awaited by every caller that wants one meanwhile.
type Making =
    futures_util::future::Shared<futures_util::future::BoxFuture<'static, RedisResult<Conn>>>;

/// The store and this instance's current connection to it.
pub(crate) struct Link {
    store: Store,
    settings: ClusterSettings,
    conn: Mutex<Option<Conn>>,
    /// The connection being made, if one is.
    making: Mutex<Option<Making>>,
    /// The master the Sentinels named last (for messages).
    master: Mutex<Option<String>>,
}

impl Link {
    /// Reads the TLS files and checks the URLs; connects only when first used.
    pub(crate) fn new(settings: &ClusterSettings) -> anyhow::Result<Link> {
        let store = match settings.topology {
            Topology::Single => Store::Single(client(settings, &settings.redis_url)?),
            Topology::Cluster => Store::Cluster(cluster_client(settings)?),
            Topology::Sentinel => Store::Sentinel(tokio::sync::Mutex::new(sentinel(settings)?)),
        };
        Ok(Link {
            store,
            settings: settings.clone(),
            conn: Mutex::new(None),
            making: Mutex::new(None),
            master: Mutex::new(None),
        })
    }

    /// The current connection, made if there is none (a Sentinel asked which master).
    /// The connection is made on a task of its own, so a caller's timeout does not cancel
    /// it halfway: the next caller finds it made. One is made at a time: callers meanwhile
    /// wait for that one (a Redis Cluster connection discovers the slots and connects to
    /// every master; a dozen made at once after a failover took seconds to all be made).
    pub(crate) async fn get(self: &Arc<Self>) -> RedisResult<Conn> {
        if let Some(c) = lock(&self.conn).clone() {
            return Ok(c);
        }
        let making = {
            let mut making = lock(&self.making);
            match &*making {
                Some(m) => m.clone(),
                None => {
                    let me = self.clone();
                    let task = tokio::spawn(async move {
                        let made = me.connect().await;
                        let mut conn = lock(&me.conn);
                        lock(&me.making).take();
                        Ok::<_, redis::RedisError>(conn.get_or_insert(made?).clone())
                    });
                    let m = async move {
                        task.await.unwrap_or_else(|e| {
                            Err(redis::RedisError::from(std::io::Error::other(format!(
                                "connecting: {e}"
                            ))))
                        })
                    }
                    .boxed()
                    .shared();
                    *making = Some(m.clone());
                    m
                }
            }
        };
        making.await
    }

    /// Drops the connection after `e`, where the topology follows a failover that way
    /// (Sentinel: the next command asks the Sentinels again).
    pub(crate) fn failed(&self, e: Option<&redis::RedisError>) {
        if !matches!(self.store, Store::Sentinel(_)) {
            return;
        }
        let server_said = e.is_some_and(|e| {
            matches!(e.kind(), redis::ErrorKind::Server(k) if k != redis::ServerErrorKind::ReadOnly)
        });
        if !server_said {
            lock(&self.conn).take();
        }
    }

    /// Drops the current connection: the next command makes a new one (on a Redis Cluster,
    /// with the slots discovered anew, when the probe saw the masters change).
    pub(crate) fn reset(&self) {
        lock(&self.conn).take();
    }

    /// `host:port` of the one master (`single`: `redis_url`'s; `sentinel`: the one the
    /// Sentinels named last); `None` for a Redis Cluster, or before a Sentinel answered.
    pub(crate) fn master_addr(&self) -> Option<String> {
        match &self.store {
            Store::Single(c) => Some(c.get_connection_info().addr().to_string()),
            Store::Sentinel(_) => lock(&self.master).clone(),
            Store::Cluster(_) => None,
        }
    }

    /// What the current connection reaches, for messages: `redis_url`, or the master the
    /// Sentinels named.
    pub(crate) fn describe(&self) -> String {
        match &self.store {
            Store::Sentinel(_) => match lock(&self.master).as_deref() {
                Some(m) => format!(
                    "{m} (master {:?} of the Sentinels)",
                    self.settings.sentinel_master
                ),
                None => format!("the Sentinels at {}", self.settings.redis_url),
            },
            _ => self.settings.redis_url.clone(),
        }
    }

    async fn connect(&self) -> RedisResult<Conn> {
        let s = &self.settings;
        match &self.store {
            Store::Single(client) => Ok(Conn::Managed(ConnectionManager::new_lazy_with_config(
                client.clone(),
                manager_config(s),
            )?)),
            Store::Cluster(client) => {
                let cfg = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(s.connect_timeout)
                    .set_response_timeout(response_timeout(s));
                Ok(Conn::Cluster(
                    client.get_async_connection_with_config(cfg).await?,
                ))
            }
            Store::Sentinel(sentinel) => {
                let client = sentinel.lock().await.async_get_client().await?;
                *lock(&self.master) = Some(client.get_connection_info().addr().to_string());
                Ok(Conn::Managed(ConnectionManager::new_lazy_with_config(
                    client,
                    manager_config(s),
                )?))
            }
        }
    }

    /// A connection of its own, without a response timeout (blocking reads), within
    /// `connect_timeout`.
    pub(crate) async fn dedicated(self: &Arc<Self>) -> RedisResult<Conn> {
        let s = &self.settings;
        let plain = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(s.connect_timeout))
            .set_response_timeout(None);
        match &self.store {
            Store::Single(client) => Ok(Conn::Plain(
                client
                    .get_multiplexed_async_connection_with_config(&plain)
                    .await?,
            )),
            Store::Cluster(client) => {
                let cfg = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(s.connect_timeout)
                    .set_response_timeout(Duration::from_secs(86_400));
                Ok(Conn::Cluster(
                    client.get_async_connection_with_config(cfg).await?,
                ))
            }
            Store::Sentinel(sentinel) => {
                let client = sentinel.lock().await.async_get_client().await?;
                Ok(Conn::Plain(
                    client
                        .get_multiplexed_async_connection_with_config(&plain)
                        .await?,
                ))
            }
        }
    }
}

fn response_timeout(s: &ClusterSettings) -> Duration {
    s.replay.write_timeout.max(s.command_timeout)
}

fn manager_config(s: &ClusterSettings) -> ConnectionManagerConfig {
    let reconnect_delay = (s.sync_interval / 2).max(Duration::from_millis(5));
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(s.connect_timeout))
        .set_response_timeout(Some(response_timeout(s)))
        // Reconnect attempts at most half a sync interval apart (jitter adds up to as
        // much again), so an instance is back within about two intervals of Redis
        // answering, however long it was away (a fixed 2 s cap let a long outage add up to
        // 2 s to the return).
        .set_min_delay(reconnect_delay.min(Duration::from_millis(100)))
        .set_max_delay(reconnect_delay)
        .set_number_of_retries(usize::MAX)
}

/// Every URL the config names: `redis_url`, then `redis_urls`.
fn urls(s: &ClusterSettings) -> Vec<&str> {
    std::iter::once(s.redis_url.as_str())
        .chain(s.redis_urls.iter().map(String::as_str))
        .collect()
}

fn tls_files(s: &ClusterSettings) -> anyhow::Result<Option<redis::TlsCertificates>> {
    if !s.redis_url.starts_with("rediss://") {
        return Ok(None);
    }
    let read = |p: &PathBuf, key: &str| {
        std::fs::read(p).with_context(|| format!("cluster.{key}: cannot read {}", p.display()))
    };
    let client_tls = match &s.tls.client {
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert, "tls_cert")?,
            client_key: read(key, "tls_key")?,
        }),
        None => None,
    };
    let root_cert = s.tls.ca.as_ref().map(|p| read(p, "tls_ca")).transpose()?;
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// A client for one node of the store (`info`: `redis_url`'s, another address), with the
/// TLS files.
pub(crate) fn client_for(
    s: &ClusterSettings,
    info: redis::ConnectionInfo,
) -> anyhow::Result<redis::Client> {
    Ok(match tls_files(s)? {
        None => redis::Client::open(info)?,
        Some(certs) => redis::Client::build_with_tls(info, certs)?,
    })
}

fn client(s: &ClusterSettings, url: &str) -> anyhow::Result<redis::Client> {
    match tls_files(s)? {
        None => redis::Client::open(url)
            .with_context(|| format!("cluster.redis_url: {url:?} is not a Redis URL")),
        Some(certs) => redis::Client::build_with_tls(url, certs)
            .with_context(|| format!("cluster.redis_url: {url:?} with its TLS files")),
    }
}

fn cluster_client(s: &ClusterSettings) -> anyhow::Result<redis::cluster::ClusterClient> {
    let mut builder = redis::cluster::ClusterClientBuilder::new(urls(s))
        .connection_timeout(s.connect_timeout)
        .response_timeout(response_timeout(s))
        // A redirection or a failover is retried within the command's own timeout.
        .retries(3)
        .min_retry_wait(5)
        .max_retry_wait(100);
    if let Some(certs) = tls_files(s)? {
        builder = builder.certs(certs);
    }
    builder
        .build()
        .with_context(|| format!("cluster.redis_url, redis_urls: {:?}", urls(s)))
}

/// Sentinels without TLS (config validation refuses `rediss://` with `sentinel`).
fn sentinel(s: &ClusterSettings) -> anyhow::Result<redis::sentinel::SentinelClient> {
    redis::sentinel::SentinelClient::build(
        urls(s),
        s.sentinel_master.as_str(),
        None,
        redis::sentinel::SentinelServerType::Master,
    )
    .with_context(|| format!("cluster.redis_url, redis_urls: {:?} as Sentinels", urls(s)))
}
