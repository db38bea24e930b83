//! Every build-time check of a rule, in one place: the layer's build and
//! a reload run them, and a rule file's rules are built through them.

use super::rule::share;
#[cfg(feature = "redis")]
use crate::backend::redis::RedisBackend;
use crate::error::BuildError;
use crate::policy::OnDeny;
#[cfg(feature = "redis")]
use crate::policy::{FailureMode, FailurePolicy};
use crate::rule::{Cost, OnMissingKey, QuotaSource, Rule, Scope, valid_name};

pub(super) fn validate(rule: &Rule, instances: Option<u32>) -> Result<(), BuildError> {
    let name = &rule.name;
    if !valid_name(name) {
        return Err(BuildError::InvalidRuleName(name.to_string()));
    }
    let rule_err = || name.to_string();
    OnMissingKey::check_keys(rule.on_missing.as_ref(), &rule.key, name)?;
    if let Some(lockout) = rule.lockout {
        lockout.validate()?;
        if matches!(rule.on_deny, OnDeny::Wait { .. }) {
            return Err(BuildError::InvalidSetting(
                "a lockout and OnDeny::Wait don't go together: a waiting request is slowed, not refused",
            ));
        }
    }
    if rule.settles() && matches!(rule.cost, Cost::Fixed(0)) {
        return Err(BuildError::InvalidSetting(
            "count_if and cost_from_response need a request cost of at least 1: it is the reservation",
        ));
    }
    if rule.max_keys == 0 {
        return Err(BuildError::InvalidSetting("max_keys must be at least 1"));
    }
    if let OnDeny::Wait { max, queue } = rule.on_deny
        && (max.is_zero() || queue == 0)
    {
        return Err(BuildError::InvalidSetting(
            "OnDeny::Wait needs a positive max and a queue of at least 1",
        ));
    }
    #[cfg(feature = "redis")]
    if let Scope::Global(redis) = &rule.scope {
        validate_global(name, &rule.failure, redis, instances)?;
    }
    #[cfg(feature = "redis")]
    validate_lease(rule)?;
    // A calendar quota counts its own way, whatever the algorithm.
    let calendar = rule.static_quota().is_some_and(|q| q.period().is_some());
    if matches!(rule.scope, Scope::Local) && !rule.algorithm.runs_locally() && !calendar {
        return Err(BuildError::AlgorithmNotLocal {
            rule: rule_err(),
            algorithm: rule.algorithm,
        });
    }
    if let QuotaSource::Static(q) = rule.quota {
        q.validate().map_err(|error| BuildError::InvalidQuota {
            rule: rule_err(),
            error,
        })?;
        if !rule.algorithm.has_burst() && q.burst() != q.limit() {
            return Err(BuildError::BurstNotSupported {
                rule: rule_err(),
                algorithm: rule.algorithm,
            });
        }
        // Against what this instance enforces: a split rule's share.
        let capacity = share(rule, q, instances.unwrap_or(1)).burst();
        if let Cost::Fixed(cost) = rule.cost
            && cost > capacity
        {
            return Err(BuildError::CostAboveCapacity {
                rule: rule_err(),
                cost,
                capacity,
            });
        }
    }
    Ok(())
}

/// A lease needs a global rule without a lockout, and a static quota it
/// can keep its bound for (request-time quotas that cannot are decided
/// exactly).
#[cfg(feature = "redis")]
fn validate_lease(rule: &Rule) -> Result<(), BuildError> {
    let Some(lease) = rule.lease else {
        return Ok(());
    };
    lease.validate()?;
    if matches!(rule.scope, Scope::Local) {
        return Err(BuildError::InvalidSetting(
            "a lease needs a global rule: local rules already decide in the gateway",
        ));
    }
    if rule.lockout.is_some() {
        return Err(BuildError::InvalidSetting(
            "a lease and a lockout don't go together: every deny must reach Redis to count",
        ));
    }
    if let QuotaSource::Static(q) = rule.quota {
        let Some(counted) = lease.counted(q, rule.algorithm) else {
            return Err(BuildError::InvalidSetting(
                "this quota cannot be leased: a calendar quota, or a burst no larger than \
                 the units one lease ttl brings (shorten the ttl or raise the burst)",
            ));
        };
        if let Cost::Fixed(cost) = rule.cost
            && cost > rule.algorithm.capacity(&counted)
        {
            return Err(BuildError::InvalidSetting(
                "the request cost is above what Redis counts leases in (the burst less one ttl of units)",
            ));
        }
    }
    Ok(())
}

/// What a limit on Redis needs: a name that keeps the hash tag, a timeout
/// and a breaker that can trip. Also warns, naming the limit, about settings
/// that let a fleet over-admit: a local fallback with no instance count, and
/// a Redis that may evict limit state.
#[cfg(feature = "redis")]
pub(crate) fn validate_global(
    name: &str,
    failure: &FailurePolicy,
    redis: &RedisBackend,
    instances: Option<u32>,
) -> Result<(), BuildError> {
    if RedisBackend::validate_rule_name(name).is_err() {
        return Err(BuildError::InvalidRuleName(name.to_string()));
    }
    if failure.timeout.is_zero() {
        return Err(BuildError::InvalidSetting("redis_timeout must be positive"));
    }
    if failure.breaker.threshold() == 0 {
        return Err(BuildError::InvalidSetting(
            "failure_threshold must be at least 1",
        ));
    }
    if instances.is_none()
        && failure.mode == FailureMode::LocalFallback
        && !redis.counts_live_instances()
    {
        tracing::warn!(
            target: "keyed_rate_limit",
            rule = name,
            "local_fallback without instances(n): when Redis fails, every gateway admits the whole quota; \
             set instances to the number of gateways (or instances(1) for one)"
        );
    }
    if let Some(policy) = redis.evicting_policy() {
        tracing::warn!(
            target: "keyed_rate_limit",
            rule = name,
            maxmemory_policy = policy,
            "redis may evict this rule's keys under memory pressure, resetting its limits; \
             use maxmemory-policy noeviction"
        );
    }
    Ok(())
}
