//! The events and metrics of global rules: Redis latency, failure modes,
//! settlements that missed Redis, and the circuit breaker.

use std::sync::Arc;
use std::time::Duration;

use super::{DECISIONS_TOTAL, DENY_EVERY, Sampled, TARGET, count};

/// One guarded backend call took `took`.
pub(crate) fn backend_latency(rule: &Arc<str>, backend: &'static str, took: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!(super::BACKEND_SECONDS, "rule" => rule.clone(), "backend" => backend)
        .record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (rule, backend, took);
}

/// A global rule was built with this Redis timeout.
pub(crate) fn redis_timeout(rule: &Arc<str>, timeout: Duration) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(super::REDIS_TIMEOUT_SECONDS, "rule" => rule.clone())
        .set(timeout.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (rule, timeout);
}

/// A refund or a charge after the response could not reach Redis:
/// `outcome="settle_failed"`, with the cause, counted each time and logged
/// at most once a second per rule. `fallback`: a charge went to the local
/// fallback share instead.
pub(crate) fn settle_failed(
    rule: &Arc<str>,
    key: impl FnOnce() -> String,
    units: i64,
    cause: &crate::policy::Cause,
    fallback: bool,
    log: &Sampled,
) {
    if let Some(suppressed) = log.take(DENY_EVERY) {
        tracing::warn!(
            target: TARGET,
            rule = %rule,
            key = %key(),
            units,
            cause = cause.kind(),
            detail = %cause,
            fallback,
            suppressed,
            "redis unavailable; units not settled in redis"
        );
    }
    count(
        DECISIONS_TOTAL,
        rule,
        &[("outcome", "settle_failed"), ("cause", cause.kind())],
    );
}

/// A decision made without Redis: `mode` decided it, because of `cause`.
/// Counted each time; logged at most once a second per rule, with how
/// many it stands for.
pub(crate) fn failure_mode(
    rule: &Arc<str>,
    key: impl FnOnce() -> String,
    cause: &'static str,
    detail: &dyn std::fmt::Display,
    mode: &'static str,
    allowed: bool,
    log: &Sampled,
) {
    if let Some(suppressed) = log.take(DENY_EVERY) {
        let key = key();
        tracing::warn!(
            target: TARGET,
            rule = %rule,
            %key,
            cause,
            detail = %detail,
            mode,
            allowed,
            suppressed,
            "redis unavailable; rule decided by its failure mode"
        );
    }
    count(
        DECISIONS_TOTAL,
        rule,
        &[("outcome", mode), ("cause", cause)],
    );
}
