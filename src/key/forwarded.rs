use std::net::IpAddr;

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};
use ipnet::IpNet;

use crate::error::BuildError;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// A CIDR (`10.0.0.0/8`) or a single address, as a network.
pub(crate) fn parse_net(s: &str) -> Option<IpNet> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .ok()
}

/// Which forwarding header the trusted proxies write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:443"`.
    Forwarded,
}

/// The reverse proxies whose forwarding headers may be believed.
///
/// A client can write anything into `X-Forwarded-For`, so the leftmost entry
/// is worthless. Each proxy appends the address it saw, so the header is
/// walked from the right: starting from the TCP peer, as long as the current
/// hop is a trusted proxy, step to the address it reports. The first address
/// that is not a trusted proxy is the client. When the peer itself is not
/// trusted, the header is ignored. A malformed entry stops the walk at the
/// proxy that forwarded it, so garbage can never pick an arbitrary key.
///
/// ```
/// use keyed_rate_limit::key::TrustedProxies;
/// let proxies = TrustedProxies::new(["10.0.0.0/8", "192.0.2.1"]).unwrap();
/// let mut headers = http::HeaderMap::new();
/// // The client tried to spoof 1.2.3.4; the load balancer 10.0.0.2 appended what it saw.
/// headers.insert("x-forwarded-for", "1.2.3.4, 203.0.113.9, 10.0.0.2".parse().unwrap());
/// let peer = "10.0.0.3".parse().unwrap();
/// assert_eq!(proxies.client_ip(peer, &headers).to_string(), "203.0.113.9");
/// // An untrusted peer's header is ignored.
/// let peer = "198.51.100.1".parse().unwrap();
/// assert_eq!(proxies.client_ip(peer, &headers), peer);
/// ```
#[derive(Debug, Clone)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
    header: ForwardedHeader,
}

impl TrustedProxies {
    /// Trusted proxies by CIDR (`10.0.0.0/8`, `fd00::/8`) or single address.
    ///
    /// ```
    /// use keyed_rate_limit::key::TrustedProxies;
    /// assert!(TrustedProxies::new(["10.0.0.0/8", "::1"]).is_ok());
    /// assert!(TrustedProxies::new(["10.0.0.0/33"]).is_err());
    /// ```
    pub fn new<I, S>(cidrs: I) -> Result<Self, BuildError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = cidrs
            .into_iter()
            .map(|s| {
                let s = s.as_ref().trim();
                parse_net(s).ok_or_else(|| BuildError::InvalidProxy(s.to_owned()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            nets,
            header: ForwardedHeader::default(),
        })
    }

    /// Reads `Forwarded` (RFC 7239) instead of `X-Forwarded-For`. Trust only
    /// the header your proxies overwrite or append to.
    ///
    /// ```
    /// use keyed_rate_limit::key::{ForwardedHeader, TrustedProxies};
    /// let p = TrustedProxies::new(["10.0.0.1"]).unwrap().header(ForwardedHeader::Forwarded);
    /// let mut h = http::HeaderMap::new();
    /// h.insert("forwarded", r#"for="[2001:db8::7]:4711";proto=https"#.parse().unwrap());
    /// assert_eq!(p.client_ip("10.0.0.1".parse().unwrap(), &h).to_string(), "2001:db8::7");
    /// ```
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Whether `ip` is one of the trusted proxies.
    pub(crate) fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// The client address for a connection from `peer` carrying `headers`.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = super::canonical(peer);
        if !self.is_trusted(client) {
            return client;
        }
        let name = match self.header {
            ForwardedHeader::XForwardedFor => X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => FORWARDED,
        };
        // Several header lines form one list, in order; walk it right to left.
        let mut hops: Vec<&[u8]> = Vec::new();
        for value in headers.get_all(&name) {
            hops.extend(value.as_bytes().split(|b| *b == b','));
        }
        for hop in hops.iter().rev() {
            let parsed = match self.header {
                ForwardedHeader::XForwardedFor => parse_addr(hop),
                ForwardedHeader::Forwarded => parse_forwarded_for(hop),
            };
            let Some(ip) = parsed else { break };
            client = super::canonical(ip);
            if !self.is_trusted(client) {
                break;
            }
        }
        client
    }
}

/// An address as proxies write it: bare, `ip:port`, or `[v6]:port`, an
/// IPv6 zone (`fe80::1%eth0`, `%25eth0` in URI form) dropped: it names the
/// proxy's interface, not the client.
fn parse_addr(raw: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(raw).ok()?.trim();
    let unzoned = |a: &str| a.split('%').next().unwrap_or(a).parse::<IpAddr>().ok();
    if let Some(ip) = unzoned(s) {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return unzoned(rest.split_once(']')?.0);
    }
    let (host, port) = s.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// The `for=` parameter of one `Forwarded` element. Obfuscated identifiers
/// (`for=_hidden`, `for=unknown`) are not addresses and stop the walk.
fn parse_forwarded_for(element: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(element).ok()?;
    let value = s.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then_some(v.trim())
    })?;
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    parse_addr(value.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(X_FORWARDED_FOR, v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn walks_right_to_left_across_header_lines() {
        let p = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        let h = xff(&["6.6.6.6, 203.0.113.5", "10.1.1.1"]);
        assert_eq!(p.client_ip(ip("10.0.0.1"), &h), ip("203.0.113.5"));
    }

    #[test]
    fn all_trusted_gives_leftmost() {
        let p = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        let h = xff(&["10.9.9.9, 10.1.1.1"]);
        assert_eq!(p.client_ip(ip("10.0.0.1"), &h), ip("10.9.9.9"));
    }

    #[test]
    fn garbage_stops_at_the_proxy_that_forwarded_it() {
        let p = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        let h = xff(&["1.2.3.4, not-an-ip, 10.1.1.1"]);
        assert_eq!(p.client_ip(ip("10.0.0.1"), &h), ip("10.1.1.1"));
        let h = xff(&["1.2.3.4, unknown"]);
        assert_eq!(p.client_ip(ip("10.0.0.1"), &h), ip("10.0.0.1"));
    }

    #[test]
    fn ports_brackets_and_mapped_addresses() {
        let p = TrustedProxies::new(["10.0.0.0/8", "::1"]).unwrap();
        let h = xff(&["[2001:db8::1]:443, 198.51.100.2:8080"]);
        assert_eq!(p.client_ip(ip("::ffff:10.0.0.1"), &h), ip("198.51.100.2"));
        assert_eq!(
            p.client_ip(ip("::1"), &xff(&["[2001:db8::1]:1"])),
            ip("2001:db8::1")
        );
    }

    #[test]
    fn forwarded_header_quoted_and_obfuscated() {
        let p = TrustedProxies::new(["10.0.0.0/8"])
            .unwrap()
            .header(ForwardedHeader::Forwarded);
        let mut h = HeaderMap::new();
        h.append(
            FORWARDED,
            "for=192.0.2.60;proto=http, For=\"10.2.2.2:80\""
                .parse()
                .unwrap(),
        );
        assert_eq!(p.client_ip(ip("10.0.0.1"), &h), ip("192.0.2.60"));
        let mut h = HeaderMap::new();
        h.append(FORWARDED, "for=192.0.2.60, for=_hidden".parse().unwrap());
        assert_eq!(p.client_ip(ip("10.0.0.1"), &h), ip("10.0.0.1"));
    }

    #[test]
    fn non_utf8_hop_is_malformed() {
        let p = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        let mut h = HeaderMap::new();
        h.append(
            X_FORWARDED_FOR,
            http::HeaderValue::from_bytes(b"1.2.3.4, \xff\xfe").unwrap(),
        );
        assert_eq!(p.client_ip(ip("10.0.0.1"), &h), ip("10.0.0.1"));
    }

    #[test]
    fn zone_ids_and_ipv4_compatible_addresses() {
        let p = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        for hop in ["fe80::1%eth0", "[fe80::1%25eth0]:443", "fe80::1%25eth0"] {
            let h = xff(&[hop]);
            assert_eq!(p.client_ip(ip("10.0.0.1"), &h), ip("fe80::1"), "{hop}");
        }
        let h = xff(&["::203.0.113.9"]);
        assert_eq!(
            p.client_ip(ip("10.0.0.1"), &h),
            ip("203.0.113.9"),
            "IPv4-compatible"
        );
        let p = p.header(ForwardedHeader::Forwarded);
        let mut h = HeaderMap::new();
        h.insert(FORWARDED, r#"for="[fe80::2%25en0]:80""#.parse().unwrap());
        assert_eq!(p.client_ip(ip("10.0.0.1"), &h), ip("fe80::2"));
        assert_eq!(
            p.client_ip(ip("::10.0.0.1"), &h),
            ip("fe80::2"),
            "a compatible peer is trusted as IPv4"
        );
    }

    /// Arbitrary forwarding headers never panic, and the client is always
    /// the peer or an address some header entry names.
    mod never_panic {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn any_header_bytes(
                values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..4),
                forwarded in any::<bool>(),
            ) {
                let mut h = HeaderMap::new();
                let name = if forwarded { FORWARDED } else { X_FORWARDED_FOR };
                for v in &values {
                    if let Ok(v) = http::HeaderValue::from_bytes(v) {
                        h.append(name.clone(), v);
                    }
                }
                let p = TrustedProxies::new(["0.0.0.0/0", "::/0"]).unwrap();
                let p = if forwarded { p.header(ForwardedHeader::Forwarded) } else { p };
                let peer = ip("10.0.0.1");
                let client = p.client_ip(peer, &h);
                if h.is_empty() {
                    prop_assert_eq!(client, peer, "no header: the peer");
                }
            }

            #[test]
            fn address_shaped_hops(
                a in any::<[u8; 4]>(),
                b in any::<[u16; 8]>(),
                port in any::<u16>(),
                zone in "[a-z0-9%]{0,6}",
            ) {
                let v4 = std::net::Ipv4Addr::from(a);
                let v6 = std::net::Ipv6Addr::from(b);
                for hop in [
                    format!("{v4}"), format!("{v4}:{port}"), format!("{v6}"),
                    format!("[{v6}]:{port}"), format!("{v6}%{zone}"), format!("[{v6}%{zone}]:{port}"),
                ] {
                    let parsed = parse_addr(hop.as_bytes());
                    prop_assert!(parsed.is_some(), "{hop}");
                }
            }
        }
    }
}
