//! The build-time checks only global rules (and global concurrency limits)
//! need: Redis names, the failure policy, leases.

use crate::backend::redis::RedisBackend;
use crate::error::BuildError;
use crate::policy::{FailureMode, FailurePolicy};
use crate::rule::{Cost, QuotaSource, Rule, Scope};

/// A rule's Redis checks: its scope's, then its lease's.
pub(super) fn validate(rule: &Rule, instances: Option<u32>) -> Result<(), BuildError> {
    if let Scope::Global(redis) = &rule.scope {
        validate_global(&rule.name, &rule.failure, redis, instances)?;
    }
    validate_lease(rule)
}

/// A lease needs a global rule without a lockout, and a static quota it
/// can keep its bound for (request-time quotas that cannot are decided
/// exactly).
fn validate_lease(rule: &Rule) -> Result<(), BuildError> {
    let Some(lease) = rule.global.lease else {
        return Ok(());
    };
    lease.validate()?;
    BuildError::invalid_if(
        matches!(rule.scope, Scope::Local),
        "a lease needs a global rule: local rules already decide in the gateway",
    )?;
    BuildError::invalid_if(
        rule.lock_policy.lockout.is_some(),
        "a lease and a lockout don't go together: every deny must reach Redis to count",
    )?;
    if let QuotaSource::Static(q) = rule.quota {
        let Some(counted) = lease.counted(q, rule.algorithm) else {
            return Err(BuildError::InvalidSetting(
                "this quota cannot be leased: a calendar quota, or a burst no larger than \
                 the units one lease ttl brings (shorten the ttl or raise the burst)",
            ));
        };
        BuildError::invalid_if(
            matches!(rule.cost, Cost::Fixed(cost) if cost > rule.algorithm.capacity(&counted)),
            "the request cost is above what Redis counts leases in (the burst less one ttl of units)",
        )?;
    }
    Ok(())
}

/// What a limit on Redis needs: a name that keeps the hash tag, a timeout
/// and a breaker that can trip. Also warns, naming the limit, about settings
/// that let a fleet over-admit: a local fallback with no instance count, and
/// a Redis that may evict limit state.
pub(crate) fn validate_global(
    name: &str,
    failure: &FailurePolicy,
    redis: &RedisBackend,
    instances: Option<u32>,
) -> Result<(), BuildError> {
    if RedisBackend::validate_rule_name(name).is_err() {
        return Err(BuildError::InvalidRuleName(name.to_string()));
    }
    BuildError::invalid_if(failure.timeout.is_zero(), "redis_timeout must be positive")?;
    BuildError::invalid_if(
        failure.breaker.get_failure_threshold() == 0,
        "failure_threshold must be at least 1",
    )?;
    BuildError::invalid_if(
        matches!(failure.mode, FailureMode::RefusePercent(p) if p > 100),
        "refuse_percent must be at most 100",
    )?;
    if instances.is_none()
        && failure.mode == FailureMode::LocalFallback
        && !redis.counts_live_instances()
    {
        tracing::warn!(
            target: crate::observe::TARGET,
            rule = name,
            "local_fallback without instances(n): when Redis fails, every gateway admits the whole quota; \
             set instances to the number of gateways (or instances(1) for one)"
        );
    }
    if let Some(policy) = redis.evicting_policy() {
        tracing::warn!(
            target: crate::observe::TARGET,
            rule = name,
            maxmemory_policy = policy,
            "redis may evict this rule's keys under memory pressure, resetting its limits; \
             use maxmemory-policy noeviction"
        );
    }
    Ok(())
}
