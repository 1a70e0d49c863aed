//! Which addresses a push URL may not lead to: every address that is not public unicast
//! (loopback, private, link-local, unspecified, multicast, CGNAT, ULA, documentation,
//! reserved), IPv4 and IPv6 alike, and an IPv4 address carried inside an IPv6 one
//! (v4-mapped, v4-compatible, NAT64, 6to4) judged as that IPv4 address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What kind of non-public address `ip` is; `None` for a public unicast address.
pub(crate) fn non_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "an unspecified (this-network)",
        (10, _, _) | (172, 16..=31, _) | (192, 168, _) => "a private",
        (127, _, _) => "a loopback",
        (169, 254, _) => "a link-local",
        (100, 64..=127, _) => "a CGNAT (shared)",
        (192, 0, 0) => "an IETF protocol",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "a documentation",
        (198, 18..=19, _) => "a benchmarking",
        (224..=239, _, _) => "a multicast",
        (240..=255, _, _) => "a reserved (or broadcast)",
        _ => return None,
    })
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    let embedded =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if ip.is_unspecified() {
        return Some("an unspecified");
    }
    if ip.is_loopback() {
        return Some("a loopback");
    }
    // ::ffff:a.b.c.d (v4-mapped): the IPv4 address is what a socket reaches.
    if s[..6] == [0, 0, 0, 0, 0, 0xffff] {
        return non_public_v4(embedded(s[6], s[7]));
    }
    // ::a.b.c.d (v4-compatible): deprecated, refused whatever it carries.
    if s[..6] == [0; 6] {
        return Some(non_public_v4(embedded(s[6], s[7])).unwrap_or("an IPv4-compatible"));
    }
    match s[0] {
        // NAT64 (64:ff9b::/96): the IPv4 address it translates to; the local-use
        // prefix 64:ff9b:1::/48 is private.
        0x64 if s[1] == 0xff9b && s[2..6] == [0; 4] => non_public_v4(embedded(s[6], s[7])),
        0x64 if s[1] == 0xff9b && s[2] == 1 => Some("a local NAT64"),
        // 6to4 (2002::/16): the IPv4 address of the relay's tunnel end.
        0x2002 => non_public_v4(embedded(s[1], s[2])),
        0x2001 if s[1] == 0x0db8 => Some("a documentation"),
        // Teredo (2001::/32) tunnels to an IPv4 address obfuscated in the last 32 bits.
        0x2001 if s[1] == 0 => Some("a Teredo"),
        0x0100 if s[1..4] == [0; 3] => Some("a discard-only"),
        x if x & 0xffc0 == 0xfe80 => Some("a link-local"),
        x if x & 0xffc0 == 0xfec0 => Some("a site-local"),
        x if x & 0xfe00 == 0xfc00 => Some("a unique local (ULA)"),
        x if x & 0xff00 == 0xff00 => Some("a multicast"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(s: &str) -> Option<&'static str> {
        non_public(s.parse().unwrap())
    }

    #[test]
    fn every_non_public_range_is_named() {
        for (ip, want) in [
            ("0.0.0.0", "an unspecified (this-network)"),
            ("10.1.2.3", "a private"),
            ("172.16.0.1", "a private"),
            ("172.31.255.255", "a private"),
            ("192.168.1.1", "a private"),
            ("127.0.0.1", "a loopback"),
            ("127.255.0.9", "a loopback"),
            ("169.254.169.254", "a link-local"),
            ("100.64.0.1", "a CGNAT (shared)"),
            ("100.127.255.255", "a CGNAT (shared)"),
            ("224.0.0.1", "a multicast"),
            ("255.255.255.255", "a reserved (or broadcast)"),
            ("198.18.0.1", "a benchmarking"),
            ("192.0.2.1", "a documentation"),
            ("::", "an unspecified"),
            ("::1", "a loopback"),
            ("fe80::1", "a link-local"),
            ("fd00::1", "a unique local (ULA)"),
            ("fc00::1", "a unique local (ULA)"),
            ("ff02::1", "a multicast"),
            ("fec0::1", "a site-local"),
            ("::ffff:127.0.0.1", "a loopback"),
            ("::ffff:10.0.0.1", "a private"),
            ("::ffff:169.254.169.254", "a link-local"),
            ("::127.0.0.1", "a loopback"),
            ("::8.8.8.8", "an IPv4-compatible"),
            ("64:ff9b::7f00:1", "a loopback"),
            ("64:ff9b:1::1", "a local NAT64"),
            ("2002:c0a8:0101::1", "a private"),
            ("2001:db8::1", "a documentation"),
            ("2001:0:4136:e378::1", "a Teredo"),
        ] {
            assert_eq!(kind(ip), Some(want), "{ip}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "93.184.215.14",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:0808:0808::1",
        ] {
            assert_eq!(kind(ip), None, "{ip}");
        }
    }
}
