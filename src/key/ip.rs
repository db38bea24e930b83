//! IP addresses as keys: IPv4 as is, IPv6 by network prefix.
//!
//! Every IPv6 client owns at least a /64, and ISPs commonly delegate a /56
//! (RIPE-690 recommends /56 or /48 for end sites), so an attacker who keys
//! on single addresses gets 2^64 fresh budgets or more. The default groups
//! IPv6 clients by /56: one customer's delegation shares a budget, while
//! different customers rarely do. IPv4-mapped (`::ffff:a.b.c.d`) and
//! IPv4-compatible (`::a.b.c.d`) addresses are their IPv4 address, so a
//! dual-stack listener keys an IPv4 client the same way as an IPv4 one.

use std::net::{IpAddr, Ipv6Addr};

use super::Key;

/// The IPv6 prefix [`KeyExtractor::peer_ip`](super::KeyExtractor::peer_ip)
/// and [`KeyExtractor::client_ip`](super::KeyExtractor::client_ip) key on.
pub const DEFAULT_V6_PREFIX: u8 = 56;

/// `ip` with IPv4 in IPv6 clothing unwrapped. `::` and `::1` are IPv6's
/// own unspecified and loopback addresses, not IPv4-compatible ones.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let [a, b, c, d, e, f, ..] = v6.segments();
            let low = v6.to_bits() as u32;
            if [a, b, c, d, e, f] == [0; 6] && low > 1 {
                return IpAddr::V4(low.into());
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

/// The key of a client at `ip`: an IPv4 address as is, an IPv6 address as
/// its `/v6_prefix` network (`2001:db8:1234:5600::/56`), or as is at /128.
pub(crate) fn ip_key(ip: IpAddr, v6_prefix: u8) -> Key {
    match canonical(ip) {
        IpAddr::V6(v6) if v6_prefix < 128 => {
            let mask = u128::MAX
                .checked_shl(u32::from(128 - v6_prefix))
                .unwrap_or(0);
            let net = Ipv6Addr::from_bits(v6.to_bits() & mask);
            // Inline when it fits, as `Key::from(IpAddr)` does.
            Key::inline_with(|buf| {
                use std::io::Write;
                let mut out = &mut buf[..];
                write!(out, "{net}/{v6_prefix}").ok()?;
                Some(super::INLINE - out.len())
            })
            .unwrap_or_else(|| Key::from(format!("{net}/{v6_prefix}")))
        }
        ip => Key::from(ip),
    }
}

/// Whether `prefix` is a usable IPv6 prefix length.
pub(crate) fn valid_v6_prefix(prefix: u8) -> bool {
    (1..=128).contains(&prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ip: &str, prefix: u8) -> String {
        let k = ip_key(ip.parse().unwrap(), prefix);
        String::from_utf8(k.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn ipv4_is_kept_whole() {
        assert_eq!(key("203.0.113.9", 56), "203.0.113.9");
        assert_eq!(key("0.0.0.0", 56), "0.0.0.0");
    }

    #[test]
    fn ipv6_is_grouped_by_its_prefix() {
        assert_eq!(
            key("2001:db8:1234:56ff:aaaa::1", 56),
            "2001:db8:1234:5600::/56"
        );
        assert_eq!(
            key("2001:db8:1234:5601::2", 56),
            "2001:db8:1234:5600::/56",
            "same /56"
        );
        assert_eq!(
            key("2001:db8:1234:56ff:aaaa::1", 64),
            "2001:db8:1234:56ff::/64"
        );
        assert_eq!(
            key("2001:db8:1234:56ff:aaaa::1", 128),
            "2001:db8:1234:56ff:aaaa::1"
        );
        assert_eq!(key("2001:db8::1", 1), "::/1");
        assert_eq!(key("ffff::1", 1), "8000::/1");
        assert_ne!(
            key("2001:db8:1234:5700::1", 56),
            key("2001:db8:1234:5600::1", 56)
        );
    }

    #[test]
    fn ipv4_in_ipv6_is_ipv4() {
        assert_eq!(key("::ffff:192.0.2.7", 56), "192.0.2.7", "mapped");
        assert_eq!(key("::192.0.2.7", 56), "192.0.2.7", "compatible");
        assert_eq!(key("::1", 128), "::1", "loopback stays IPv6");
        assert_eq!(key("::", 128), "::", "unspecified stays IPv6");
        assert_eq!(key("::1", 56), "::/56");
        assert_eq!(
            key("64:ff9b::192.0.2.7", 128),
            "64:ff9b::c000:207",
            "NAT64 is not mapped"
        );
    }

    #[test]
    fn link_local_and_loopback_are_addresses_like_any_other() {
        assert_eq!(key("fe80::1", 64), "fe80::/64");
        assert_eq!(key("127.0.0.1", 56), "127.0.0.1");
    }

    #[test]
    fn prefix_lengths_are_checked() {
        assert!(!valid_v6_prefix(0));
        assert!(valid_v6_prefix(1));
        assert!(valid_v6_prefix(128));
        assert!(!valid_v6_prefix(129));
    }
}
