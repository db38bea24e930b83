//! Every build-time check of a rule, in one place: the layer's build and
//! a reload run them, and a rule file's rules are built through them.

use super::rule::share;
use crate::error::BuildError;
use crate::key::lookup::OnMissingKey;
use crate::policy::OnDeny;
use crate::rule::{Cost, QuotaSource, Rule, Scope, valid_name};

pub(super) fn validate(rule: &Rule, instances: Option<u32>) -> Result<(), BuildError> {
    let name = &rule.name;
    if !valid_name(name) {
        return Err(BuildError::InvalidRuleName(name.to_string()));
    }
    let rule_err = || name.to_string();
    OnMissingKey::validate_keys(rule.on_missing.as_ref(), &rule.key, name)?;
    if let Some(lockout) = rule.lock_policy.lockout {
        lockout.validate()?;
        BuildError::invalid_if(
            matches!(rule.on_deny, OnDeny::Wait { .. }),
            "a lockout and OnDeny::Wait don't go together: a waiting request is slowed, not refused",
        )?;
    }
    BuildError::invalid_if(
        rule.settles() && matches!(rule.cost, Cost::Fixed(0)),
        "count_if and cost_from_response need a request cost of at least 1: it is the reservation",
    )?;
    if let Some(cidr) = rule.exempt.as_ref().and_then(|e| e.invalid.clone()) {
        return Err(BuildError::InvalidExemptIp {
            rule: rule_err(),
            cidr,
        });
    }
    BuildError::invalid_if(
        rule.quota_use
            .near_limit
            .is_some_and(|r| !(r > 0.0 && r <= 1.0)),
        "near_limit_ratio must be in (0, 1], or None to turn it off",
    )?;
    BuildError::invalid_if(rule.key_space.max_keys == 0, "max_keys must be at least 1")?;
    BuildError::invalid_if(
        matches!(rule.on_deny, OnDeny::Wait { max, queue } if max.is_zero() || queue == 0),
        "OnDeny::Wait needs a positive max and a queue of at least 1",
    )?;
    #[cfg(feature = "redis")]
    super::validate_global::validate(rule, instances)?;
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
