//! The file format: serde structs and enums that mirror a rules file, field
//! for field. The checks across a rule's fields are in `check`.

use serde::Deserialize;

use super::parse::{DurationSpec, KeySpec, MissingSpec, NearLimitSpec, OffsetSpec, QuotaSpec};
use crate::failure::FailureMode;
use crate::key::TrustedProxies;
#[cfg(feature = "redis")]
use crate::policy::LeasePolicy;
use crate::rule::KeySpaceFull;
use crate::{algorithm::Algorithm, headers::HeaderStyle, headers::ResetFormat, quota::Quota};

/// A rate-limit configuration read from a file: layer settings and rules, in
/// evaluation order. Turn it into a layer with [`into_builder`](Self::into_builder)
/// or [`into_layer`](Self::into_layer).
///
/// ```
/// use keyed_rate_limit::RulesConfig;
///
/// let config = RulesConfig::from_yaml_str("
/// rules:
///   - name: per-ip
///     key: peer_ip
///     quota: 10/5s
/// ")?;
/// assert_eq!(config.rule_names().collect::<Vec<_>>(), ["per-ip"]);
/// # Ok::<(), keyed_rate_limit::config::ConfigError>(())
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesConfig {
    #[serde(default)]
    pub(super) headers: HeaderStyle,
    #[serde(default)]
    pub(super) legacy_reset: ResetFormat,
    pub(super) instances: Option<u32>,
    pub(super) max_key_len: Option<usize>,
    /// The registry's `exempt_fn` that lets requests past every rule.
    pub(super) exempt_fn: Option<String>,
    pub(super) rules: Vec<RuleConfig>,
    /// `[[bandwidth]]` entries, built one by one with
    /// [`bandwidth_layer`](Self::bandwidth_layer).
    #[serde(default)]
    pub(super) bandwidth: Vec<BandwidthConfig>,
    /// Where it was read from, to place errors found when building.
    #[serde(skip)]
    pub(super) origin: super::locate::Origin,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum ScopeSpec {
    #[default]
    Local,
    Global,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
// Parsed without the `redis` feature too, so a file checks the same either way.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(super) struct BreakerSpec {
    pub(super) failure_threshold: Option<u32>,
    pub(super) open_for: Option<DurationSpec>,
}

/// `lockout = { after = 5, within = "1m", block_for = "15m" }`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LockoutSpec {
    pub(super) after: u32,
    pub(super) within: DurationSpec,
    pub(super) block_for: DurationSpec,
}

/// `lease = { ttl = "50ms", max_units = 500 }`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(super) struct LeaseSpec {
    pub(super) ttl: DurationSpec,
    pub(super) max_units: Option<u32>,
}

#[cfg(feature = "redis")]
impl LeaseSpec {
    pub(super) fn policy(self) -> LeasePolicy {
        let p = LeasePolicy::new(self.ttl.0);
        self.max_units.map_or(p, |n| p.with_max_units(n))
    }
}

/// A lease as a file writes it, `{ ttl = "50ms", max_units = 500 }`: for
/// formats of other programs that carry one (`keyed-rls`'s descriptors).
#[cfg(feature = "redis")]
impl<'de> Deserialize<'de> for LeasePolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        LeaseSpec::deserialize(d).map(LeaseSpec::policy)
    }
}

/// One rule as written; checked as a whole by [`RuleConfig::try_from`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) name: String,
    pub(super) key: KeySpec,
    pub(super) trusted_proxies: Option<Vec<String>>,
    pub(super) quota: Option<QuotaSpec>,
    pub(super) quota_fn: Option<String>,
    pub(super) burst: Option<u32>,
    pub(super) utc_offset: Option<OffsetSpec>,
    pub(super) cost: Option<u32>,
    pub(super) cost_fn: Option<String>,
    #[serde(default)]
    pub(super) algorithm: Algorithm,
    #[serde(default)]
    pub(super) scope: ScopeSpec,
    pub(super) failure_mode: Option<FailureMode>,
    pub(super) timeout: Option<DurationSpec>,
    pub(super) breaker: Option<BreakerSpec>,
    #[serde(default)]
    pub(super) shadow: bool,
    #[serde(default)]
    pub(super) hidden: bool,
    #[serde(default)]
    pub(super) blockable: bool,
    #[serde(default)]
    pub(super) partition_key: bool,
    #[serde(default)]
    pub(super) split_across_instances: bool,
    pub(super) on_missing_key: Option<MissingSpec>,
    pub(super) max_keys: Option<usize>,
    pub(super) on_key_space_full: Option<KeySpaceFull>,
    pub(super) lockout: Option<LockoutSpec>,
    pub(super) coalesce: Option<bool>,
    pub(super) lease: Option<LeaseSpec>,
    /// The any-of group: consecutive rules naming the same one form it.
    pub(super) any_of: Option<String>,
    pub(super) on_quota_change: Option<crate::rule::QuotaChange>,
    pub(super) exempt_ips: Option<Vec<String>>,
    pub(super) exempt_fn: Option<String>,
    pub(super) near_limit_ratio: Option<NearLimitSpec>,
}

impl RawRule {
    /// `quota` with `burst` and `utc_offset` (a placeholder under `quota_fn`).
    pub(super) fn static_quota(&self) -> Quota {
        let q = self.quota.map_or(Quota::per_second(1), |q| q.0);
        let q = self.burst.map_or(q, |b| q.with_burst(b));
        self.utc_offset.map_or(q, |o| q.with_utc_offset(o.0))
    }
}

/// A rule whose fields agree with each other. The checks run while
/// deserializing, so their errors carry the rule's line and column.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawRule")]
pub(super) struct RuleConfig {
    pub(super) raw: RawRule,
    pub(super) proxies: Option<TrustedProxies>,
}

/// One `[[bandwidth]]` entry as written: a
/// [`BandwidthLimitLayer`](crate::BandwidthLimitLayer)'s settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
// Parsed without the `redis` feature too, so a file checks the same either way.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(super) struct BandwidthConfig {
    pub(super) name: String,
    pub(super) key: KeySpec,
    pub(super) trusted_proxies: Option<Vec<String>>,
    pub(super) bytes_per_second: u32,
    pub(super) burst: Option<u32>,
    #[serde(default)]
    pub(super) direction: crate::bandwidth::Direction,
    #[serde(default)]
    pub(super) scope: ScopeSpec,
    pub(super) on_missing_key: Option<MissingSpec>,
    pub(super) max_keys: Option<usize>,
    pub(super) failure_mode: Option<FailureMode>,
    pub(super) timeout: Option<DurationSpec>,
    pub(super) lease: Option<LeaseSpec>,
}
