//! Completed TLS handshakes by side and key exchange group, so an operator sees what
//! share of connections a post-quantum group protects. Labels are bounded: two sides, and
//! the groups the build's provider knows (`tls::provider`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// A completed handshake's side and group.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GroupLabels {
    /// `listener` (a Leader's connection) or `partner` (the gateway's to a Partner).
    pub(crate) side: &'static str,
    /// The negotiated group (`X25519MLKEM768`, `X25519`, `secp256r1`, ...).
    pub(crate) group: &'static str,
}

/// Handshakes by side and group; clones count into the same series.
#[derive(Clone, Default, Debug)]
pub(crate) struct GroupTally(Family<GroupLabels, Counter>);

impl GroupTally {
    /// Registers the series.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "tls_handshake_groups",
            "TLS handshakes completed, by side (listener, partner) and negotiated key exchange group",
            self.0.clone(),
        );
    }

    /// Counts a completed handshake on `side`.
    pub(crate) fn count(&self, side: &'static str, tls: &rustls::CommonState) {
        let group = crate::tls::provider::negotiated(tls).group;
        self.0.get_or_create(&GroupLabels { side, group }).inc();
    }
}
