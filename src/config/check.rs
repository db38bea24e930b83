//! The checks across a rule's fields (`quota` with `quota_fn`, `lease` with
//! `lockout`, settings that only a global rule takes, ...). They run while
//! deserializing, through `#[serde(try_from = "RawRule")]`, so their errors
//! carry the rule's line and column.

use super::parse::{KeySpec, MissingSpec};
use super::schema::{RawRule, RuleConfig, ScopeSpec};
use crate::key::TrustedProxies;
use crate::rule::Lockout;

impl TryFrom<RawRule> for RuleConfig {
    type Error = String;

    fn try_from(raw: RawRule) -> Result<Self, String> {
        let name = &raw.name;
        let err = |msg: String| Err(format!("rule {name:?}: {msg}"));
        match (&raw.quota, &raw.quota_fn) {
            (Some(_), Some(_)) => return err("set `quota` or `quota_fn`, not both".into()),
            (None, None) => return err("missing field `quota` (or `quota_fn`)".into()),
            (None, Some(_)) if raw.burst.is_some() => {
                return err("`burst` needs a static `quota`; a `quota_fn` sets its own".into());
            }
            (None, Some(_)) if raw.utc_offset.is_some() => {
                return err(
                    "`utc_offset` needs a static `quota`; a `quota_fn` sets its own".into(),
                );
            }
            (Some(_), _) => {
                if let Err(e) = raw.static_quota().validate() {
                    return err(format!("invalid `quota`/`burst`/`utc_offset`: {e}"));
                }
            }
            _ => {}
        }
        if let Some(l) = raw.lockout
            && let Err(e) = Lockout::new(l.after, l.within.0, l.block_for.0).validate()
        {
            return err(format!("`lockout`: {e}"));
        }
        if raw.cost.is_some() && raw.cost_fn.is_some() {
            return err("set `cost` or `cost_fn`, not both".into());
        }
        #[cfg(feature = "redis")]
        if let Some(l) = raw.lease {
            let policy = l.policy();
            if let Err(e) = policy.validate() {
                return err(format!("`lease`: {e}"));
            }
            if raw.lockout.is_some() {
                return err(
                    "set `lease` or `lockout`, not both: every deny of a lockout must reach Redis"
                        .into(),
                );
            }
            if raw.quota.is_some() && policy.counted(raw.static_quota(), raw.algorithm).is_none() {
                return err(format!(
                    "`lease`: a ttl of {:?} holds back {} units, the whole burst of {} (shorten the ttl or raise the burst; calendar quotas are not leased)",
                    policy.ttl(),
                    policy.held_back(&raw.static_quota()),
                    raw.static_quota().burst()
                ));
            }
        }
        if raw.scope == ScopeSpec::Local {
            for (set, field) in [
                (raw.failure_mode.is_some(), "failure_mode"),
                (raw.timeout.is_some(), "timeout"),
                (raw.breaker.is_some(), "breaker"),
                (raw.coalesce.is_some(), "coalesce"),
                (raw.lease.is_some(), "lease"),
            ] {
                if set {
                    return err(format!("`{field}` only applies to `scope = \"global\"`"));
                }
            }
        }
        if let Some(bad) = raw
            .exempt_ips
            .iter()
            .flatten()
            .find(|s| crate::key::parse_net(s.trim()).is_none())
        {
            return err(format!("`exempt_ips`: {bad:?} is not a CIDR or IP address"));
        }
        let on_missing = raw.on_missing_key.as_ref();
        let proxies = proxies(&raw.key, on_missing, raw.trusted_proxies.as_ref())
            .map_err(|e| format!("rule {name:?}: {e}"))?;
        Ok(Self { raw, proxies })
    }
}

/// The trusted proxies of an entry whose key (or fallback key) is
/// `client_ip`; `trusted_proxies` without one is an error, and so is such a
/// key without them.
pub(super) fn proxies(
    key: &KeySpec,
    on_missing: Option<&MissingSpec>,
    trusted: Option<&Vec<String>>,
) -> Result<Option<TrustedProxies>, String> {
    let uses_client_ip = key.uses_client_ip()
        || matches!(on_missing, Some(MissingSpec::Fallback(k)) if k.uses_client_ip());
    match (trusted, uses_client_ip) {
        (Some(p), true) => Ok(Some(
            TrustedProxies::new(p).map_err(|e| format!("`trusted_proxies`: {e}"))?,
        )),
        (None, true) => Err("a `client_ip` key needs `trusted_proxies`".into()),
        (Some(_), false) => Err("`trusted_proxies` needs a `client_ip` key".into()),
        (None, false) => Ok(None),
    }
}
