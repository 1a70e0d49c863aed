//! Which source a connection counts under, and its counts there (handshakes, open
//! connections): its TCP peer's address, taken at the accept; or, from a trusted load
//! balancer ([`ProxyProtocol`]), the client's address its PROXY header names, taken once
//! the header has been read.
//!
//! Until its header has arrived, a trusted connection counts against its balancer's
//! address in `listener.max_handshakes_per_ip` and in the listener-wide
//! `proxy_protocol.max_pending`, and holds its `max_connections` slot, for at most
//! `proxy_protocol.header_timeout`. A host in a trusted network that opens connections
//! and never sends a header thus holds at most `max_handshakes_per_ip` slots, and all
//! such hosts together at most `max_pending`, each for the header timeout; a balancer
//! sends the header at once with the connection, so its count is back within a round
//! trip. A connection that sends no header (`optional`) or a LOCAL one counts under the
//! balancer's address, as a direct one.

use crate::config::raw::ProxyProtocolMode;
use crate::config::{ListenerConfig, ProxyProtocol};
use crate::gateway::Snapshot;

use super::proxy::{self, Header, Refused};
use super::*;

/// The per-source counts and the PROXY protocol settings, read at start.
pub(super) struct Sources {
    /// Connections still in their TLS handshake (or, from a balancer, waiting for their
    /// PROXY header), per source address.
    handshakes: KeyedCounts<IpAddr>,
    /// Connections open per source address, for their whole life.
    per_ip: KeyedCounts<IpAddr>,
    proxy: ProxyProtocol,
    /// Trusted connections waiting for their header (`max_pending`).
    pending: Arc<Semaphore>,
}

/// A connection's counts under its source.
pub(super) struct Counted {
    /// Its count in its source's handshakes, given back after the handshake.
    pub(super) handshake: KeyedPermit<IpAddr>,
    /// Its count in its source's open connections.
    pub(super) per_ip: KeyedPermit<IpAddr>,
}

/// What a connection holds at its accept.
pub(super) enum Admission {
    /// Counted under its TCP peer's address.
    Direct(Counted),
    /// From a trusted balancer, its header not read yet: one of the balancer's
    /// handshakes and one of `max_pending`.
    Pending {
        balancer: KeyedPermit<IpAddr>,
        pending: OwnedSemaphorePermit,
    },
}

impl Sources {
    pub(super) fn new(l: &ListenerConfig) -> Sources {
        Sources {
            handshakes: KeyedCounts::new(Some(l.max_handshakes_per_ip)),
            per_ip: KeyedCounts::new(Some(l.max_connections_per_ip)),
            proxy: l.proxy_protocol.clone(),
            pending: Arc::new(Semaphore::new(l.proxy_protocol.max_pending)),
        }
    }

    /// A connection just accepted from `peer`, counted; `None` (counted as a closed
    /// connection, to be closed at once) when a bound is reached.
    pub(super) fn admit(&self, peer: SocketAddr, gateway: &Gateway) -> Option<Admission> {
        if !self.proxy.trusts(peer.ip()) {
            return self.count(peer, gateway).map(Admission::Direct);
        }
        let Ok(pending) = self.pending.clone().try_acquire_owned() else {
            refused(&gateway.snapshot().metrics, peer, Refused::PendingLimit);
            return None;
        };
        let Some(balancer) = self.handshakes.try_take(&peer.ip()) else {
            handshake_limit(gateway, peer);
            return None;
        };
        Some(Admission::Pending { balancer, pending })
    }

    /// One of `source`'s open connections and one of its handshakes; `None` (counted)
    /// when either is at its bound.
    fn count(&self, source: SocketAddr, gateway: &Gateway) -> Option<Counted> {
        let Some(per_ip) = self.per_ip.try_take(&source.ip()) else {
            tracing::debug!(peer = %source, "too many connections from this address: closed");
            closed(&gateway.snapshot().metrics, "per_ip_limit");
            return None;
        };
        let Some(handshake) = self.handshakes.try_take(&source.ip()) else {
            handshake_limit(gateway, source);
            return None;
        };
        Some(Counted { handshake, per_ip })
    }

    /// Before TLS: the connection's address (the client's, from a trusted balancer's
    /// header), its counts under it, and when its TLS handshake must be done; `None`
    /// (counted) when it is to be closed. A direct connection that starts with a PROXY
    /// header is closed; its first bytes are waited for within its handshake's time.
    pub(super) async fn resolve(
        &self,
        tcp: &mut TcpStream,
        peer: SocketAddr,
        admission: Admission,
        gateway: &Gateway,
        snap: &Snapshot,
    ) -> Option<(SocketAddr, Counted, Instant)> {
        let handshake_timeout = snap.config.listener.handshake_timeout;
        let (balancer, pending) = match admission {
            Admission::Direct(counted) => {
                let deadline = Instant::now() + handshake_timeout;
                if self.proxy.on() {
                    match tokio::time::timeout_at(deadline, proxy::sends_header(tcp)).await {
                        Ok(Ok(true)) => {
                            refused(&snap.metrics, peer, Refused::Untrusted);
                            return None;
                        }
                        Err(_) => {
                            let labels = ReasonLabels { reason: "timeout" };
                            snap.metrics.handshake_failures.get_or_create(&labels).inc();
                            return None;
                        }
                        // A failed peek fails the handshake too, counted there.
                        Ok(_) => {}
                    }
                }
                return Some((peer, counted, deadline));
            }
            Admission::Pending { balancer, pending } => (balancer, pending),
        };
        let required = self.proxy.mode == ProxyProtocolMode::Required;
        let read = proxy::read_header(tcp, required, self.proxy.max_header_bytes);
        let read = tokio::time::timeout(self.proxy.header_timeout, read).await;
        drop((balancer, pending));
        let source = match read.unwrap_or(Err(Refused::Timeout)) {
            Ok(Header::Client(client)) => client,
            Ok(Header::Local | Header::Absent) => peer,
            Err(why) => {
                refused(&snap.metrics, peer, why);
                return None;
            }
        };
        let counted = self.count(source, gateway)?;
        Some((source, counted, Instant::now() + handshake_timeout))
    }
}

/// Counts a connection closed over its source's handshakes.
fn handshake_limit(gateway: &Gateway, peer: SocketAddr) {
    tracing::debug!(%peer, "too many handshakes from this address: closed");
    let reason = ReasonLabels {
        reason: "per_ip_handshake_limit",
    };
    let snap = gateway.snapshot();
    snap.metrics.handshake_failures.get_or_create(&reason).inc();
}

/// Counts a connection closed before TLS over its PROXY header.
fn refused(metrics: &Metrics, peer: SocketAddr, why: Refused) {
    let reason = why.reason();
    tracing::debug!(%peer, reason, "PROXY protocol: connection closed before TLS");
    closed(metrics, reason);
}
