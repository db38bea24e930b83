//! Building a configuration: each rule as written into a [`Rule`], with the
//! registry's extractors, closures and Redis backend, and the file's
//! settings into a [`RateLimitBuilder`] or [`RateLimitLayer`].

#[cfg(feature = "redis")]
use crate::failure::BreakerConfig;
use crate::key::lookup::OnMissingKey;
use crate::key::{KeyExtractor, TrustedProxies};
use crate::rule::{Cost, Lockout, QuotaSource};
use crate::{rate_limit::RateLimitBuilder, rate_limit::RateLimitLayer, rule::Rule};

use super::error::ConfigError;
use super::locate::Origin;
use super::parse::{KeyAtom, KeySpec, MissingSpec};
use super::registry::{Registry, lookup};
use super::schema::{RuleConfig, RulesConfig, ScopeSpec};

/// A setter applied to a builder when the file sets its field.
pub(super) trait SetIfAny: Sized {
    fn set<T>(self, field: Option<T>, setter: impl FnOnce(Self, T) -> Self) -> Self {
        match field {
            Some(value) => setter(self, value),
            None => self,
        }
    }
}

impl<B> SetIfAny for B {}

impl RulesConfig {
    /// A builder with the file's rules and settings, to add more (e.g. a
    /// [`deny_response`](RateLimitBuilder::deny_response)) before building.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, Registry, Rule, RulesConfig};
    ///
    /// let config = RulesConfig::from_toml_str("[[rules]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"10/s\"\n")?;
    /// let layer = config
    ///     .into_builder(&Registry::new())?
    ///     .rule(Rule::new("everyone", KeyExtractor::everyone(), Quota::per_second(1000)))
    ///     .build()?;
    /// assert_eq!(layer.rules().len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A name the registry doesn't hold, or a global rule without
    /// [`Registry::redis`].
    pub fn into_builder(self, registry: &Registry) -> Result<RateLimitBuilder, ConfigError> {
        let mut builder = RateLimitLayer::builder()
            .headers(self.headers)
            .legacy_reset(self.legacy_reset)
            .set(self.instances, RateLimitBuilder::instances)
            .set(self.max_key_len, RateLimitBuilder::max_key_len);
        if let Some(name) = &self.exempt_fn {
            let f = lookup(&registry.exempts, "exempt_fn", name)
                .map_err(|e| self.origin.field_error("exempt_fn", e))?
                .clone();
            builder = builder.exempt(move |p| f(p));
        }
        Ok(builder.rules(self.into_rules(registry)?))
    }

    /// The file's rules, built with `registry`.
    pub(super) fn into_rules(self, registry: &Registry) -> Result<Vec<Rule>, ConfigError> {
        let origin = self.origin;
        self.rules
            .into_iter()
            .map(|rule| {
                let name = rule.raw.name.clone();
                rule.into_rule(registry)
                    .map_err(|e| origin.rule_error(&name, 0, format!("rule {name:?}: {e}")))
            })
            .collect()
    }

    /// Where the configuration was read from, for errors found later.
    pub(super) fn origin(&self) -> Origin {
        self.origin.clone()
    }

    /// The settings of the layer as a whole, which a reload can't change.
    pub(super) fn layer_settings(&self) -> super::watch::LayerSettings {
        super::watch::LayerSettings {
            headers: self.headers,
            legacy_reset: self.legacy_reset,
            instances: self.instances,
            max_key_len: self.max_key_len,
            exempt_fn: self.exempt_fn.clone(),
        }
    }

    /// [`into_builder`](Self::into_builder), then
    /// [`build`](RateLimitBuilder::build).
    ///
    /// # Errors
    ///
    /// As [`into_builder`](Self::into_builder), and any [`BuildError`](crate::error::BuildError).
    pub fn into_layer(self, registry: &Registry) -> Result<RateLimitLayer, ConfigError> {
        let origin = self.origin();
        self.into_builder(registry)?
            .build()
            .map_err(|e| origin.build_error(e))
    }
}

impl RuleConfig {
    fn into_rule(self, reg: &Registry) -> Result<Rule, String> {
        let Self { raw, proxies } = self;
        let key = key_extractor(&raw.key, proxies.as_ref(), reg)?;
        let quota = raw.static_quota();
        let mut rule = Rule::new(raw.name, key, quota)
            .algorithm(raw.algorithm)
            .shadow(raw.shadow)
            .hidden(raw.hidden)
            .blockable(raw.blockable)
            .partition_key(raw.partition_key)
            .split_across_instances(raw.split_across_instances)
            .set(raw.on_quota_change, Rule::on_quota_change)
            .set(raw.cost, Rule::cost)
            .set(raw.max_keys, Rule::max_keys)
            .set(raw.lockout, |r, l| {
                r.lockout(Lockout::new(l.after, l.within.0, l.block_for.0))
            })
            .set(raw.exempt_ips.as_ref(), Rule::exempt_ips)
            .set(raw.near_limit_ratio, |r, n| r.near_limit_ratio(n.0))
            .set(raw.on_key_space_full, Rule::on_key_space_full);
        rule.group = raw.any_of.map(Into::into);
        if let Some(name) = raw.quota_fn {
            rule.quota = QuotaSource::Dynamic(lookup(&reg.quotas, "quota_fn", &name)?.clone());
        }
        if let Some(name) = &raw.exempt_fn {
            let f = lookup(&reg.exempts, "exempt_fn", name)?.clone();
            rule = rule.exempt(move |p| f(p));
        }
        if let Some(name) = raw.cost_fn {
            rule.cost = Cost::Dynamic(lookup(&reg.costs, "cost_fn", &name)?.clone());
        }
        if let Some(m) = &raw.on_missing_key {
            rule = rule.on_missing_key(on_missing(m, proxies.as_ref(), reg)?);
        }
        #[cfg(not(feature = "redis"))]
        if raw.scope == ScopeSpec::Global {
            return Err("`scope = \"global\"` needs the crate's `redis` feature".into());
        }
        #[cfg(feature = "redis")]
        if raw.scope == ScopeSpec::Global {
            let redis = reg.redis.clone().ok_or(
                "`scope = \"global\"` needs a Redis backend: pass one with `Registry::redis`",
            )?;
            rule = rule
                .global(redis)
                .set(raw.failure_mode, Rule::on_redis_failure)
                .set(raw.timeout, |r, t| r.redis_timeout(t.0))
                .set(raw.coalesce, Rule::coalesce)
                .set(raw.lease, |r, l| r.lease(l.policy()))
                .set(raw.breaker, |r, b| {
                    let cfg = BreakerConfig::default()
                        .set(b.failure_threshold, BreakerConfig::failure_threshold)
                        .set(b.open_for, |c, d| c.open_for(d.0));
                    r.circuit_breaker(cfg)
                });
        }
        Ok(rule)
    }
}

/// The policy a missing-key spec names.
pub(super) fn on_missing(
    m: &MissingSpec,
    proxies: Option<&TrustedProxies>,
    reg: &Registry,
) -> Result<OnMissingKey, String> {
    Ok(match m {
        MissingSpec::Skip => OnMissingKey::Skip,
        MissingSpec::Reject(status) => OnMissingKey::Reject(*status),
        MissingSpec::Fallback(k) => OnMissingKey::Fallback(key_extractor(k, proxies, reg)?),
    })
}

/// Builds the extractor a key spec names: alternatives joined with
/// [`KeyExtractor::or`], parts with [`KeyExtractor::and`].
pub(super) fn key_extractor(
    spec: &KeySpec,
    proxies: Option<&TrustedProxies>,
    reg: &Registry,
) -> Result<KeyExtractor, String> {
    let atom = |a: &KeyAtom| -> Result<KeyExtractor, String> {
        Ok(match a {
            KeyAtom::Header(h) => KeyExtractor::header(h.as_str()),
            KeyAtom::Extension(name) => lookup(&reg.keys, "key", name)?.clone(),
            KeyAtom::PeerIp => KeyExtractor::peer_ip(),
            // The rule checked that `client_ip` comes with proxies.
            KeyAtom::ClientIp => KeyExtractor::client_ip(proxies.cloned().unwrap_or_else(|| {
                TrustedProxies::new::<_, &str>([]).expect("no proxies is valid")
            })),
            KeyAtom::MatchedRoute => KeyExtractor::matched_route(),
            KeyAtom::Everyone => KeyExtractor::everyone(),
        })
    };
    let joined = |keys: Vec<KeyExtractor>, f: fn(KeyExtractor, KeyExtractor) -> KeyExtractor| {
        keys.into_iter()
            .reduce(f)
            .ok_or_else(|| "empty key".to_owned())
    };
    let mut alts = Vec::new();
    for alt in &spec.0 {
        let atoms = alt.iter().map(atom).collect::<Result<_, _>>()?;
        alts.push(joined(atoms, KeyExtractor::and)?);
    }
    joined(alts, KeyExtractor::or)
}
