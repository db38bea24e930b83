//! A circuit breaker's reports: its state as a gauge, an outage's opening,
//! failed probes and closing as events and counters, for a global rule's
//! Redis and for the remote rate-limit service of `rls::client` alike.

use std::sync::Arc;
use std::time::Duration;

use super::{BREAKER_OPENED_TOTAL, BREAKER_PROBE_FAILED_TOTAL, TARGET, count};

/// What a breaker stands in front of, as its events name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guarded {
    /// A global rule's Redis.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Redis,
    /// A remote rate-limit service (`rls::client`).
    #[cfg_attr(not(feature = "rls"), allow(dead_code))]
    Service,
}

/// A breaker changed state: 0 closed, 1 open, 2 half-open.
pub(crate) fn breaker_state(rule: &Arc<str>, state: u8) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(super::BREAKER_STATE, "rule" => rule.clone()).set(f64::from(state));
    #[cfg(not(feature = "metrics"))]
    let _ = (rule, state);
}

/// `rule`'s circuit breaker opened after `detail`: a warning when an
/// outage begins (`first`), counted as an opening; a failed half-open
/// probe re-opening it is counted as one, and logged when `log` (at most
/// once a minute).
pub(crate) fn breaker_opened(
    rule: &Arc<str>,
    guarded: Guarded,
    detail: &dyn std::fmt::Display,
    (first, log): (bool, bool),
    out_for: Duration,
) {
    let out_for_ms = out_for.as_millis() as u64;
    match (guarded, first) {
        (Guarded::Redis, true) => {
            tracing::warn!(target: TARGET, rule = %rule, detail = %detail, "redis circuit breaker opened");
        }
        (Guarded::Service, true) => {
            tracing::warn!(target: TARGET, rule = %rule, detail = %detail, "rate-limit service circuit breaker opened");
        }
        (Guarded::Redis, false) if log => {
            tracing::warn!(target: TARGET, rule = %rule, detail = %detail, out_for_ms, "redis circuit breaker still open: half-open probe failed");
        }
        (Guarded::Service, false) if log => {
            tracing::warn!(target: TARGET, rule = %rule, detail = %detail, out_for_ms, "rate-limit service circuit breaker still open: half-open probe failed");
        }
        _ => {}
    }
    let counter = if first {
        BREAKER_OPENED_TOTAL
    } else {
        BREAKER_PROBE_FAILED_TOTAL
    };
    count(counter, rule, &[]);
    breaker_state(rule, 1);
}

/// `rule`'s circuit breaker closed after an outage of `out_for`.
pub(crate) fn breaker_closed(rule: &Arc<str>, guarded: Guarded, out_for: Duration) {
    let out_for_ms = out_for.as_millis() as u64;
    match guarded {
        Guarded::Redis => {
            tracing::info!(target: TARGET, rule = %rule, out_for_ms, "redis circuit breaker closed; redis answers again");
        }
        Guarded::Service => {
            tracing::info!(target: TARGET, rule = %rule, out_for_ms, "rate-limit service circuit breaker closed; the service answers again");
        }
    }
    breaker_state(rule, 0);
}
