//! The special-purpose address table (SECURITY §3) and IPv4-in-IPv6 unwrapping.
//!
//! Embedded IPv4 (see [`embedded_ipv4`]) is *decided as its IPv4 address* (DESIGN §4): an
//! address in `::ffff:0:0/96`, `::/96` or `64:ff9b::/96` is special-purpose exactly when its
//! IPv4 address is (those prefixes lie outside `2000::/3`, so reading the table literally would
//! make unwrapping pointless). `2002::/16` (6to4, deprecated by RFC 7526) and `64:ff9b:1::/48`
//! (local-use NAT64, RFC 8215, not globally reachable) are special-purpose whatever they embed:
//! the table lists 2002::/16, and the local-use prefix routes to a translator of the site's own.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net};

/// IPv4 special-purpose ranges (SECURITY §3; RFC 6890 and its updates).
const V4_SPECIAL: &[(u32, u8)] = &[
    (0x0000_0000, 8),  // 0.0.0.0/8 "this network" (RFC 791)
    (0x0a00_0000, 8),  // 10.0.0.0/8 private (RFC 1918)
    (0x6440_0000, 10), // 100.64.0.0/10 shared address space (RFC 6598)
    (0x7f00_0000, 8),  // 127.0.0.0/8 loopback
    (0xa9fe_0000, 16), // 169.254.0.0/16 link-local (RFC 3927)
    (0xac10_0000, 12), // 172.16.0.0/12 private
    (0xc000_0000, 24), // 192.0.0.0/24 IETF protocol assignments
    (0xc000_0200, 24), // 192.0.2.0/24 TEST-NET-1
    (0xc0a8_0000, 16), // 192.168.0.0/16 private
    (0xc612_0000, 15), // 198.18.0.0/15 benchmarking (RFC 2544)
    (0xc633_6400, 24), // 198.51.100.0/24 TEST-NET-2
    (0xcb00_7100, 24), // 203.0.113.0/24 TEST-NET-3
    (0xe000_0000, 4),  // 224.0.0.0/4 multicast
    (0xf000_0000, 4),  // 240.0.0.0/4 reserved, includes 255.255.255.255 (limited broadcast)
];

/// IPv6 special-purpose ranges inside 2000::/3 (everything outside 2000::/3 is special too).
const V6_SPECIAL_IN_GLOBAL: &[(u128, u8)] = &[
    (0x2001_0000 << 96, 32), // 2001::/32 TEREDO (RFC 4380)
    (0x2001_0002 << 96, 48), // 2001:2::/48 benchmarking (RFC 5180)
    (0x2001_0db8 << 96, 32), // 2001:db8::/32 documentation (RFC 3849)
    (0x2002 << 112, 16),     // 2002::/16 6to4 (RFC 3056)
    (0x3fff << 112, 20),     // 3fff::/20 documentation (RFC 9637)
];

fn in_prefix32(addr: u32, net: u32, len: u8) -> bool {
    len == 0 || (addr ^ net) >> (32 - u32::from(len)) == 0
}

fn in_prefix128(addr: u128, net: u128, len: u8) -> bool {
    len == 0 || (addr ^ net) >> (128 - u32::from(len)) == 0
}

/// The IPv4 address embedded in an IPv6 address, if it has one:
/// - `::ffff:0:0/96` IPv4-mapped (RFC 4291 §2.5.5.2), low 32 bits;
/// - `::/96` IPv4-compatible (deprecated, RFC 4291 §2.5.5.1), low 32 bits, **except** `::`
///   (unspecified) and `::1` (loopback), which are IPv6 addresses in their own right;
/// - `64:ff9b::/96` well-known NAT64 (RFC 6052), low 32 bits;
/// - `64:ff9b:1::/48` local-use NAT64 (RFC 8215), low 32 bits (the RFC 6052 /96 layout, the
///   only one whose position does not depend on the site's prefix length);
/// - `2002::/16` 6to4 (RFC 3056), bits 16..48.
pub fn embedded_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(ip);
    let low = Ipv4Addr::from(bits as u32);
    if in_prefix128(bits, 0xffff << 32, 96) {
        return Some(low);
    }
    if in_prefix128(bits, 0, 96) {
        return (bits > 1).then_some(low);
    }
    if in_prefix128(bits, 0x0064_ff9b << 96, 96) || in_prefix128(bits, 0x0064_ff9b_0001 << 80, 48) {
        return Some(low);
    }
    if in_prefix128(bits, 0x2002 << 112, 16) {
        return Some(Ipv4Addr::from((bits >> 80) as u32));
    }
    None
}

/// The address a policy decides: the embedded IPv4 address if there is one, else `ip` itself.
pub fn effective(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => embedded_ipv4(v6).map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A range written in an IPv4-mapped or well-known-NAT64 IPv6 form with a prefix of at least
/// 96 bits (`::ffff:10.0.0.0/104`, `64:ff9b::a00:0/104`) stands for the IPv4 range
/// (`10.0.0.0/8`), as single addresses do. Any other range is returned unchanged.
pub fn normalize_net(net: IpNet) -> IpNet {
    if let IpNet::V6(n) = net {
        let bits = u128::from(n.network());
        let low96 = [0xffffu128 << 32, 0x0064_ff9b << 96];
        if n.prefix_len() >= 96
            && low96.iter().any(|p| in_prefix128(bits, *p, 96))
            && let Ok(v4) = Ipv4Net::new(Ipv4Addr::from(bits as u32), n.prefix_len() - 96)
        {
            return IpNet::V4(v4);
        }
    }
    net
}

fn is_special_v4(ip: Ipv4Addr) -> bool {
    let a = u32::from(ip);
    V4_SPECIAL.iter().any(|&(net, len)| in_prefix32(a, net, len))
}

/// Whether `ip` is special-purpose (SECURITY §3): refused as a target or resolved answer unless
/// it lies in `allow_private`. Embedded IPv4 is unwrapped and checked (module doc).
pub fn is_special_purpose(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_special_v4(v4),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            // 6to4 and local-use NAT64 stay special whatever they embed (module doc).
            if in_prefix128(bits, 0x2002 << 112, 16)
                || in_prefix128(bits, 0x0064_ff9b_0001 << 80, 48)
            {
                return true;
            }
            if let Some(v4) = embedded_ipv4(v6) {
                return is_special_v4(v4);
            }
            !in_prefix128(bits, 0x2000 << 112, 3)
                || V6_SPECIAL_IN_GLOBAL.iter().any(|&(net, len)| in_prefix128(bits, net, len))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_v4_range_with_edges_on_both_sides() {
        // (first address inside, last address inside, address just below, just above)
        let ranges = [
            ("0.0.0.0", "0.255.255.255", None, Some("1.0.0.0")),
            ("10.0.0.0", "10.255.255.255", Some("9.255.255.255"), Some("11.0.0.0")),
            ("100.64.0.0", "100.127.255.255", Some("100.63.255.255"), Some("100.128.0.0")),
            ("127.0.0.0", "127.255.255.255", Some("126.255.255.255"), Some("128.0.0.0")),
            ("169.254.0.0", "169.254.255.255", Some("169.253.255.255"), Some("169.255.0.0")),
            ("172.16.0.0", "172.31.255.255", Some("172.15.255.255"), Some("172.32.0.0")),
            ("192.0.0.0", "192.0.0.255", Some("191.255.255.255"), Some("192.0.1.0")),
            ("192.0.2.0", "192.0.2.255", Some("192.0.1.255"), Some("192.0.3.0")),
            ("192.168.0.0", "192.168.255.255", Some("192.167.255.255"), Some("192.169.0.0")),
            ("198.18.0.0", "198.19.255.255", Some("198.17.255.255"), Some("198.20.0.0")),
            ("198.51.100.0", "198.51.100.255", Some("198.51.99.255"), Some("198.51.101.0")),
            ("203.0.113.0", "203.0.113.255", Some("203.0.112.255"), Some("203.0.114.0")),
            ("224.0.0.0", "239.255.255.255", Some("223.255.255.255"), None),
            ("240.0.0.0", "255.255.255.254", None, None),
            ("255.255.255.255", "255.255.255.255", None, None),
        ];
        for (first, last, below, above) in ranges {
            assert!(is_special_purpose(ip(first)), "{first}");
            assert!(is_special_purpose(ip(last)), "{last}");
            for outside in [below, above].into_iter().flatten() {
                assert!(!is_special_purpose(ip(outside)), "{outside} is public");
            }
        }
        for public in ["1.1.1.1", "8.8.8.8", "93.184.216.34", "100.63.0.1", "223.255.255.255"] {
            assert!(!is_special_purpose(ip(public)), "{public}");
        }
    }

    #[test]
    fn every_v6_range_with_edges_on_both_sides() {
        let special = [
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "100::1",
            "1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", // just below 2000::/3
            "4000::",                                  // just above 2000::/3
            "2001::",
            "2001:0:ffff:ffff:ffff:ffff:ffff:ffff",
            "2001:2::",
            "2001:2:0:ffff:ffff:ffff:ffff:ffff",
            "2001:db8::",
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
            "2002::",
            "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "3fff::",
            "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff",
            "64:ff9b:1::1",
            "64:ff9b:1:ffff:ffff:ffff:808:808", // local-use NAT64 is special whatever it embeds
        ];
        for s in special {
            assert!(is_special_purpose(ip(s)), "{s} is special");
        }
        let public = [
            "2000::",
            "3fff:1000::", // just above 3fff::/20
            "3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "2001:1::1",        // just above 2001::/32
            "2001:1:ffff::1",   // still in 2001:1::/32 (public)
            "2001:2:1::",       // just above 2001:2::/48
            "2001:db7:ffff::1", // just below 2001:db8::/32
            "2001:db9::",       // just above
            "2001:4860::8888",
            "2003::",            // just above 2002::/16
            "2001:ffff:ffff::1", // below 2002::/16
            "3ffe:ffff::1",      // below 3fff::/20
            "2606:4700:4700::1111",
        ];
        for s in public {
            assert!(!is_special_purpose(ip(s)), "{s} is public");
        }
    }

    #[test]
    fn embedded_forms_unwrap() {
        let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        let v4 = |s: &str| Some(s.parse::<Ipv4Addr>().unwrap());
        assert_eq!(embedded_ipv4(v6("::ffff:127.0.0.1")), v4("127.0.0.1"));
        assert_eq!(embedded_ipv4(v6("::ffff:8.8.8.8")), v4("8.8.8.8"));
        assert_eq!(embedded_ipv4(v6("::10.1.2.3")), v4("10.1.2.3"));
        assert_eq!(embedded_ipv4(v6("::2")), v4("0.0.0.2"));
        assert_eq!(embedded_ipv4(v6("::")), None);
        assert_eq!(embedded_ipv4(v6("::1")), None);
        assert_eq!(embedded_ipv4(v6("64:ff9b::192.168.1.1")), v4("192.168.1.1"));
        assert_eq!(embedded_ipv4(v6("64:ff9b:1::10.0.0.1")), v4("10.0.0.1"));
        assert_eq!(embedded_ipv4(v6("64:ff9b:1:ffff::10.0.0.1")), v4("10.0.0.1"));
        assert_eq!(embedded_ipv4(v6("2002:7f00:1::")), v4("127.0.0.1"));
        assert_eq!(embedded_ipv4(v6("2002:c0a8:101:1::5")), v4("192.168.1.1"));
        // Neighbours of the embedding prefixes embed nothing.
        assert_eq!(embedded_ipv4(v6("::1:ffff:7f00:1")), None);
        assert_eq!(embedded_ipv4(v6("::fffe:7f00:1")), None);
        assert_eq!(embedded_ipv4(v6("64:ff9b::1:7f00:1")), None);
        assert_eq!(embedded_ipv4(v6("64:ff9b:2::7f00:1")), None);
        assert_eq!(embedded_ipv4(v6("2003:7f00:1::")), None);
        assert_eq!(embedded_ipv4(v6("2001:db8::7f00:1")), None);
    }

    #[test]
    fn embedded_forms_are_classified_as_their_ipv4() {
        for s in [
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::10.0.0.1",
            "64:ff9b::127.0.0.1",
            "2002:a00:1::",
            "2002:808:808::", // 6to4 stays special (SECURITY §3 lists 2002::/16)
        ] {
            assert!(is_special_purpose(ip(s)), "{s}");
        }
        for s in ["::ffff:8.8.8.8", "::8.8.8.8", "64:ff9b::8.8.8.8", "64:ff9b::1.1.1.1"] {
            assert!(!is_special_purpose(ip(s)), "{s} embeds a public address");
        }
        assert_eq!(effective(ip("::ffff:1.2.3.4")), ip("1.2.3.4"));
        assert_eq!(effective(ip("::1")), ip("::1"));
        assert_eq!(effective(ip("1.2.3.4")), ip("1.2.3.4"));
    }

    #[test]
    fn mapped_ranges_normalize_to_ipv4() {
        let n = |s: &str| normalize_net(s.parse().unwrap()).to_string();
        assert_eq!(n("::ffff:10.0.0.0/104"), "10.0.0.0/8");
        assert_eq!(n("::ffff:10.1.2.3/128"), "10.1.2.3/32");
        assert_eq!(n("64:ff9b::c0a8:0/112"), "192.168.0.0/16");
        assert_eq!(n("::ffff:0:0/96"), "0.0.0.0/0");
        assert_eq!(n("::fffe:0:0/95"), "::fffe:0:0/95");
        assert_eq!(n("2001:db8::/32"), "2001:db8::/32");
        assert_eq!(n("::/96"), "::/96");
        assert_eq!(n("10.0.0.0/8"), "10.0.0.0/8");
    }
}
