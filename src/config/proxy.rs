//! `[listener.proxy_protocol]`, validated: the mode, the trusted networks parsed, the
//! bounds checked.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{bail, Context};

use super::raw::{ProxyProtocolMode, RawProxyProtocol};

/// The smallest `max_header_bytes`: a v2 header with UNIX addresses (16 + 216 bytes),
/// so every address family fits; a v1 header is at most 107 bytes.
const MIN_HEADER_BYTES: usize = 232;

/// The largest header the protocol allows: v2's 16 fixed bytes and a 16-bit length.
const MAX_HEADER_BYTES: usize = 16 + 65_535;

/// PROXY protocol settings. Field meanings and defaults: see [`RawProxyProtocol`].
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyProtocol {
    /// `off`, `optional` or `required`.
    pub mode: ProxyProtocolMode,
    /// The networks whose connections may send a header.
    pub from: Vec<Network>,
    /// Time for a trusted connection's header to arrive.
    pub header_timeout: Duration,
    /// Largest header accepted, in bytes.
    pub max_header_bytes: usize,
    /// Trusted connections waiting for their header at once.
    pub max_pending: usize,
}

impl ProxyProtocol {
    /// Whether the PROXY protocol is read at all.
    pub fn on(&self) -> bool {
        self.mode != ProxyProtocolMode::Off
    }

    /// Whether a connection from `ip` may (or must) send a header.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.on() && self.from.iter().any(|n| n.contains(ip))
    }
}

impl TryFrom<&RawProxyProtocol> for ProxyProtocol {
    type Error = anyhow::Error;

    fn try_from(p: &RawProxyProtocol) -> anyhow::Result<ProxyProtocol> {
        let from = p
            .from
            .iter()
            .map(|s| {
                Network::parse(s).with_context(|| format!("listener.proxy_protocol.from: {s:?}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if p.mode != ProxyProtocolMode::Off && from.is_empty() {
            bail!(
                "listener.proxy_protocol.from: name the load balancers' networks (mode is not off)"
            );
        }
        if p.header_timeout.is_zero() {
            bail!("listener.proxy_protocol.header_timeout: must be greater than zero");
        }
        if !(MIN_HEADER_BYTES..=MAX_HEADER_BYTES).contains(&p.max_header_bytes) {
            bail!(
                "listener.proxy_protocol.max_header_bytes: must be between {MIN_HEADER_BYTES} and {MAX_HEADER_BYTES}"
            );
        }
        if p.max_pending == 0 {
            bail!("listener.proxy_protocol.max_pending: must be at least 1");
        }
        Ok(ProxyProtocol {
            mode: p.mode,
            from,
            header_timeout: p.header_timeout,
            max_header_bytes: p.max_header_bytes,
            max_pending: p.max_pending,
        })
    }
}

/// A network: an address and a prefix length (a single address is the whole length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// `10.0.0.0/8`, `fd00::/8`, or one address (`10.1.2.3`). An IPv4-mapped IPv6
    /// address is taken as its IPv4 address.
    pub fn parse(s: &str) -> anyhow::Result<Network> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.trim().parse().context("not an IP address")?;
        let addr = addr.to_canonical();
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.trim().parse::<u8>().context("not a prefix length")?,
            None => bits,
        };
        if prefix > bits {
            bail!("prefix length over {bits}");
        }
        Ok(Network { addr, prefix })
    }

    /// Whether `ip` (an IPv4-mapped IPv6 address as its IPv4 one) is in the network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let keep = |bits: u32| -> u128 {
            let host = bits - u32::from(self.prefix);
            if host >= 128 {
                0
            } else {
                !0u128 << host
            }
        };
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = keep(32);
                (u128::from(u32::from(n)) & mask) == (u128::from(u32::from(a)) & mask)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = keep(128);
                (u128::from(n) & mask) == (u128::from(a) & mask)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_contain_their_addresses_only() {
        let n = Network::parse("10.0.0.0/8").unwrap();
        assert!(n.contains("10.255.1.2".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!n.contains("11.0.0.1".parse().unwrap()));
        assert!(!n.contains("::1".parse().unwrap()));
        let one = Network::parse("127.0.0.1").unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let all = Network::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("1.2.3.4".parse().unwrap()));
        let v6 = Network::parse("fd00::/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        assert!(Network::parse("10.0.0.0/33").is_err());
        assert!(Network::parse("10.0.0/8").is_err());
        assert!(Network::parse("::/129").is_err());
    }

    #[test]
    fn the_section_is_checked_and_off_by_default() {
        let raw = RawProxyProtocol::default();
        let p = ProxyProtocol::try_from(&raw).unwrap();
        assert!(!p.on() && !p.trusts("127.0.0.1".parse().unwrap()));
        let on = |f: fn(&mut RawProxyProtocol)| {
            let mut r = RawProxyProtocol {
                mode: ProxyProtocolMode::Required,
                from: vec!["10.0.0.0/8".into()],
                ..RawProxyProtocol::default()
            };
            f(&mut r);
            ProxyProtocol::try_from(&r).map_err(|e| format!("{e:#}"))
        };
        assert!(on(|_| {}).unwrap().trusts("10.9.9.9".parse().unwrap()));
        assert!(!on(|_| {}).unwrap().trusts("192.0.2.1".parse().unwrap()));
        assert!(on(|r| r.from.clear())
            .unwrap_err()
            .contains("proxy_protocol.from"));
        assert!(on(|r| r.from.push("10.0.0.0/40".into()))
            .unwrap_err()
            .contains("10.0.0.0/40"));
        assert!(on(|r| r.max_header_bytes = 100)
            .unwrap_err()
            .contains("max_header_bytes"));
        assert!(on(|r| r.max_pending = 0)
            .unwrap_err()
            .contains("max_pending"));
        assert!(on(|r| r.header_timeout = Duration::ZERO)
            .unwrap_err()
            .contains("header_timeout"));
    }
}
