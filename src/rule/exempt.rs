//! Who a rule lets through without counting.

use std::sync::Arc;

use http::request::Parts;

use super::Rule;
use crate::key::KeyExtractor;
use crate::settings::ExemptFn;

/// Who a rule lets through without counting: see [`Rule::exempt`] and
/// [`Rule::exempt_ips`]. Boxed in the rule, so a rule without one pays a
/// pointer check.
#[derive(Clone, Default)]
pub(crate) struct Exempt {
    pub(crate) f: Option<Arc<ExemptFn>>,
    /// The networks as written, for `describe()`.
    pub(crate) written: Vec<String>,
    pub(crate) nets: Vec<ipnet::IpNet>,
    /// The first entry that is no CIDR or address: a build error.
    pub(crate) invalid: Option<String>,
}

impl Exempt {
    /// Whether `parts` is exempt from `rule`'s count.
    pub(crate) fn matches(&self, key: &KeyExtractor, parts: &Parts) -> bool {
        if self.f.as_ref().is_some_and(|f| f(parts)) {
            return true;
        }
        !self.nets.is_empty()
            && key
                .client_addr(parts)
                .is_some_and(|ip| self.nets.iter().any(|n| n.contains(&ip)))
    }
}

impl Rule {
    /// Lets requests for which `f` holds through this rule without
    /// counting them: they spend nothing, get no headers from it, and are
    /// counted in `rate_limit_decisions_total{outcome="exempt"}`. Other
    /// rules still apply. Called again, the last closure wins; it adds to
    /// [`exempt_ips`](Self::exempt_ips).
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// // Internal batch jobs carry a header the edge proxy strips from outside traffic.
    /// let api = Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(100))
    ///     .exempt(|parts| parts.headers.contains_key("x-internal-job"));
    /// # let _ = api;
    /// ```
    pub fn exempt<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.exempt.get_or_insert_default().f = Some(Arc::new(f));
        self
    }

    /// Lets requests from these networks (CIDRs like `10.0.0.0/8`, or
    /// single addresses) through this rule without counting them, as
    /// [`exempt`](Self::exempt) does.
    ///
    /// The address checked is the one the rule's key extractor resolves:
    /// for [`KeyExtractor::client_ip`](crate::KeyExtractor::client_ip), the
    /// client behind the [`TrustedProxies`](crate::key::TrustedProxies), so
    /// a forged `X-Forwarded-For` from an untrusted peer earns nothing; for
    /// [`peer_ip`](crate::KeyExtractor::peer_ip), the TCP peer (for an
    /// extractor combining several, the first IP one). With any other
    /// extractor it is the TCP peer's address from `ConnectInfo`; a request
    /// without one is never exempt by address. Adds to the networks of an
    /// earlier call. An entry that is neither a CIDR nor an address is a
    /// [`BuildError::InvalidExemptIp`](crate::error::BuildError::InvalidExemptIp).
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, key::TrustedProxies};
    /// let proxies = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
    /// let per_client = Rule::new("per-client", KeyExtractor::client_ip(proxies), Quota::per_second(10))
    ///     .exempt_ips(["192.0.2.0/24", "2001:db8::1"]);
    /// assert!(RateLimitLayer::builder().rule(per_client).build().is_ok());
    ///
    /// let bad = Rule::new("bad", KeyExtractor::peer_ip(), Quota::per_second(10)).exempt_ips(["10.0.0.0/33"]);
    /// assert!(RateLimitLayer::builder().rule(bad).build().is_err());
    /// ```
    pub fn exempt_ips<I, S>(mut self, cidrs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let e = self.exempt.get_or_insert_default();
        for s in cidrs {
            let s = s.as_ref().trim();
            match crate::key::parse_net(s) {
                Some(net) => e.nets.push(net),
                None => {
                    e.invalid.get_or_insert_with(|| s.to_owned());
                }
            }
            e.written.push(s.to_owned());
        }
        self
    }
}
