#![doc = include_str!("../../docs/observe.md")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::util::throttle::Throttle;

#[cfg(any(feature = "redis", feature = "rls"))]
mod breaker;
#[cfg(feature = "redis")]
mod global;
#[cfg(any(feature = "redis", feature = "rls"))]
pub(crate) use breaker::*;
#[cfg(feature = "redis")]
pub(crate) use global::*;

/// The `tracing` target of every event.
pub const TARGET: &str = "keyed_rate_limit";

/// Counter: every decision a rule makes, counted once by its verdict
/// (`outcome` = `allow`, `deny`, `shadow_deny`, `locked`), and beside it
/// what made or marked it: a failure mode (`fail_open`, `fail_closed`,
/// `local_fallback`, `refuse_percent`, with `cause` = `timeout`, `error`,
/// `circuit_open`), a full key space (`key_space_full`,
/// `key_space_overflow`), a limit nearly reached (`near_limit`), the
/// fallback's key (`fallback_key`); and counts that are not decisions:
/// units not settled in Redis (`settle_failed`, with `cause`), refunds
/// dropped because the window they were charged in had ended
/// (`refund_void`), requests a rule let through without its key
/// (`unkeyed`), and requests a rule exempts (`exempt`). Labels `rule`,
/// `outcome`, and `cause` where said. [`OUTCOMES`] lists them. A request
/// the layer-wide exemption lets through is counted once with `rule="*"`
/// ([`LAYER_RULE`]).
///
/// A rule's deny share is `deny + locked` over
/// `allow + deny + shadow_deny + locked`; its share decided without Redis,
/// the failure-mode outcomes over the same sum.
pub const DECISIONS_TOTAL: &str = "rate_limit_decisions_total";

/// Counter: a rule's Redis circuit breaker opened, once per outage (from
/// closed: the failures reached the threshold, or a refused connection);
/// label `rule`. A half-open probe that fails and keeps it open is
/// [`BREAKER_PROBE_FAILED_TOTAL`], not another opening.
pub const BREAKER_OPENED_TOTAL: &str = "rate_limit_breaker_opened_total";

/// Counter: a half-open probe of a rule's open Redis circuit breaker failed,
/// so the breaker stays open for another `open_for`; label `rule`. During
/// an outage it grows about once per `open_for` while requests come.
pub const BREAKER_PROBE_FAILED_TOTAL: &str = "rate_limit_breaker_probe_failed_total";

/// Histogram: seconds one Redis decision (or lease operation) took, from
/// send to answer or failure; labels `rule`, `backend` (`redis`).
pub const BACKEND_SECONDS: &str = "rate_limit_backend_seconds";

/// Gauge: a global rule's Redis timeout in seconds (`redis_timeout`), set
/// when the layer is built; label `rule`. What the latency alert compares
/// [`BACKEND_SECONDS`] with.
pub const REDIS_TIMEOUT_SECONDS: &str = "rate_limit_redis_timeout_seconds";

/// Gauge: a global rule's circuit breaker, 0 closed, 1 open, 2 half-open
/// (one probe in flight); label `rule`. Set when it changes.
pub const BREAKER_STATE: &str = "rate_limit_breaker_state";

/// Gauge: keys a rule holds in this process (its local store or, for a
/// global rule, its fallback shares, cached denies and leases, with its
/// locks); label `rule`. Set after each background sweep
/// ([`cleanup_interval`](crate::rate_limit::RateLimitBuilder::cleanup_interval), 60 s by
/// default).
pub const KEYS: &str = "rate_limit_keys";

/// A refund dropped: the window its units were charged in had ended, and
/// giving them to the next would admit more than the quota.
pub(crate) fn refund_void(rule: &Arc<str>) {
    count(DECISIONS_TOTAL, rule, &[("outcome", "refund_void")]);
}

/// The keys `rule` holds after a sweep.
pub(crate) fn keys_held(rule: &Arc<str>, keys: usize) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(KEYS, "rule" => rule.clone()).set(keys as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = (rule, keys);
}

/// Counter: edits of a watched rules file; label `outcome` (`applied`,
/// `rejected`). See `RulesConfig::watch` (feature `config`).
pub const CONFIG_RELOADS_TOTAL: &str = "rate_limit_config_reloads_total";

/// Counter: a request a rule could not key because its key's source is
/// missing from the setup (no `ConnectInfo`, the layer outside the router
/// or before the layer that inserts the extension); labels `rule`, `kind`
/// (`no_connect_info`, `outside_router`, `no_extension`). Logged at most once
/// a minute per rule, counted every time.
pub const MISCONFIG_TOTAL: &str = "rate_limit_misconfig_total";

/// Every `outcome` of [`DECISIONS_TOTAL`], and what it counts. The first
/// four are the verdicts: each decision is counted once among them.
pub const OUTCOMES: [(&str, &str); 16] = [
    (
        "allow",
        "allowed (a shadow rule's too, and a failure mode's admits)",
    ),
    (
        "deny",
        "refused: over the limit, by a failure mode, or for want of a key-space place",
    ),
    (
        "shadow_deny",
        "a shadow rule would refuse; the request went on",
    ),
    ("locked", "refused because the key is locked out"),
    (
        "fail_open",
        "decided without Redis by `FailOpen` (also `allow`)",
    ),
    (
        "fail_closed",
        "decided without Redis by `FailClosed` (also `deny`)",
    ),
    (
        "local_fallback",
        "decided without Redis by `LocalFallback` (also `allow` or `deny`)",
    ),
    (
        "refuse_percent",
        "decided without Redis by `RefusePercent` (also `allow` or `deny`)",
    ),
    (
        "key_space_overflow",
        "a new key counted in the shared bucket (also `allow` or `deny`)",
    ),
    (
        "key_space_full",
        "a new key refused: the key space is full (also `deny`)",
    ),
    (
        "near_limit",
        "allowed with less than the near-limit ratio left (also `allow`)",
    ),
    (
        "settle_failed",
        "units not settled in Redis after the response: not a decision",
    ),
    (
        "refund_void",
        "a refund dropped: the window it was charged in had ended; not a decision",
    ),
    (
        "unkeyed",
        "a request the rule let through without its key: not a decision",
    ),
    (
        "fallback_key",
        "decided on the fallback's key, not the rule's own (also `allow` or `deny`)",
    ),
    ("exempt", "a request the rule exempts: not a decision"),
];

/// Every metric the crate emits: name, kind, labels (for the tests that
/// check the shipped dashboard and alerts against them).
#[doc(hidden)]
pub const METRICS: [(&str, &str, &str); 10] = [
    (DECISIONS_TOTAL, "counter", "rule, outcome, cause"),
    (BREAKER_OPENED_TOTAL, "counter", "rule"),
    (BREAKER_PROBE_FAILED_TOTAL, "counter", "rule"),
    (BREAKER_STATE, "gauge", "rule"),
    (BACKEND_SECONDS, "histogram", "rule, backend"),
    (REDIS_TIMEOUT_SECONDS, "gauge", "rule"),
    (KEYS, "gauge", "rule"),
    (PROXY_MISCONFIG_TOTAL, "counter", "kind"),
    (MISCONFIG_TOTAL, "counter", "rule, kind"),
    (CONFIG_RELOADS_TOTAL, "counter", "outcome"),
];

/// A watched rules file was applied, or rejected with `error` (and where).
#[cfg(feature = "config")]
pub(crate) fn config_reload(
    path: &dyn std::fmt::Display,
    error: Option<(&dyn std::fmt::Display, Option<usize>, Option<usize>)>,
) {
    let outcome = match error {
        None => {
            tracing::info!(target: TARGET, %path, "rate-limit rules file applied");
            "applied"
        }
        Some((error, line, column)) => {
            tracing::error!(target: TARGET, %path, line, column, %error, "rate-limit rules file rejected; the running rules stay");
            "rejected"
        }
    };
    #[cfg(feature = "metrics")]
    metrics::counter!(CONFIG_RELOADS_TOTAL, "outcome" => outcome).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = outcome;
}

/// Counter: a request showed a likely proxy misconfiguration; label `kind`
/// (`peer_ip_behind_proxy`, `untrusted_forwarder`). Logged at most once a
/// minute per key extractor, counted every time.
pub const PROXY_MISCONFIG_TOTAL: &str = "rate_limit_proxy_misconfig_total";

/// A likely proxy misconfiguration, seen by a key extractor: always
/// counted, logged when `log` (the extractor's once-a-minute throttle).
pub(crate) fn proxy_misconfig(kind: &'static str, what: &'static str, log: bool) {
    if log {
        tracing::warn!(target: TARGET, kind, "{what}");
    }
    #[cfg(feature = "metrics")]
    metrics::counter!(PROXY_MISCONFIG_TOTAL, "kind" => kind).increment(1);
}

/// A rule's key source is missing from the setup: always counted, logged
/// when `log` (the rule's once-a-minute throttle).
pub(crate) fn key_misconfig(
    rule: &Arc<str>,
    extractor: &str,
    kind: &'static str,
    what: &dyn std::fmt::Display,
    fix: &'static str,
    log: bool,
) {
    if log {
        tracing::error!(target: TARGET, rule = %rule, extractor, kind, "rate limit cannot find its key: {what}; {fix}");
    }
    count(MISCONFIG_TOTAL, rule, &[("kind", kind)]);
}

/// A rule found no key in any of the `skipped` requests of the last
/// `period`: it limits nothing.
pub(crate) fn no_key_found(rule: &Arc<str>, extractor: &str, skipped: u64, period: Duration) {
    let period_s = period.as_secs();
    tracing::warn!(target: TARGET, rule = %rule, extractor, skipped, period_s, "rate limit found no key in any request: it limits nothing");
}

/// A request a rule let through without its key (`outcome="unkeyed"`) or
/// counted on its fallback's key (`"fallback_key"`): counted every time;
/// `log` while the rule has never found its own key.
pub(crate) fn unkeyed(rule: &Arc<str>, extractor: &str, outcome: &'static str, log: bool) {
    if log {
        tracing::warn!(target: TARGET, rule = %rule, extractor, outcome, "rate limit has not found its own key in any request yet: every one so far went unkeyed or on its fallback's key; is the layer before the one that sets the key (auth)?");
    }
    count(DECISIONS_TOTAL, rule, &[("outcome", outcome)]);
}

/// A new key found the rule's key space full: counted every time, with
/// `outcome="key_space_overflow"` (counted in the shared bucket) or
/// `"key_space_full"` (refused); logged at most once a minute per rule.
pub(crate) fn key_space_full(
    rule: &Arc<str>,
    how: crate::policy::KeySpaceFull,
    max_keys: usize,
    warned: &crate::util::throttle::Throttle,
) {
    let outcome = match how {
        crate::policy::KeySpaceFull::Refuse => "key_space_full",
        _ => "key_space_overflow",
    };
    if warned.ready(Duration::from_secs(60)) {
        tracing::warn!(target: TARGET, rule = %rule, max_keys, outcome, "key space full: new keys are not counted on their own (a flood of distinct keys?)");
    }
    count(DECISIONS_TOTAL, rule, &[("outcome", outcome)]);
}

/// One event per period for a line that would repeat on every request,
/// standing for those it held back (`suppressed`): a flood of denies or of
/// failure-mode decisions stays a few lines a second per rule, while the
/// counters count each one.
#[derive(Debug, Default)]
pub(crate) struct Sampled {
    gate: Throttle,
    held: AtomicU64,
}

impl Sampled {
    /// `Some(held back since the last event)` when this one is logged.
    #[inline]
    pub(crate) fn take(&self, every: Duration) -> Option<u64> {
        if self.gate.ready(every) {
            Some(self.held.swap(0, Ordering::Relaxed))
        } else {
            self.held.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// At most one deny event per rule per second; also the period of the
/// other lines that could repeat on every request.
pub(crate) const DENY_EVERY: Duration = Duration::from_secs(1);

/// Every deny is counted; at most one a second per rule is logged (with the
/// key's fingerprint, never the key, and how many denies it stands for).
/// `key` makes the fingerprint, a SHA-256, only for a line written.
/// `retry_after` is `None` when waiting would not help.
pub(crate) fn deny(
    counted: &Counted,
    rule: &Arc<str>,
    key: impl FnOnce() -> String,
    retry_after: Option<Duration>,
    shadow: bool,
    log: &Sampled,
) {
    counted.deny(shadow);
    // The fingerprint (a SHA-256) only for the lines written.
    let Some(suppressed) = log.take(DENY_EVERY) else {
        return;
    };
    let key = key();
    // 0 means waiting would not help.
    let retry_after_ms = retry_after.map_or(0, |w| w.as_millis() as u64);
    if shadow {
        tracing::info!(target: TARGET, rule = %rule, %key, retry_after_ms, suppressed, "shadow rule would deny");
    } else {
        tracing::info!(target: TARGET, rule = %rule, %key, retry_after_ms, suppressed, "rate limited");
    }
}

/// A key was just locked out for `block`: a warning with its fingerprint.
/// Its denies while locked are counted by [`locked_deny`].
pub(crate) fn locked(rule: &Arc<str>, key: &str, block: Duration) {
    let block_ms = block.as_millis() as u64;
    tracing::warn!(target: TARGET, rule = %rule, %key, block_ms, "key locked out");
}

/// The `rule` label of requests exempt from the whole layer
/// (`RateLimitBuilder::exempt`); a rule named `*` would share it.
///
/// ```
/// use keyed_rate_limit::observe::{DECISIONS_TOTAL, LAYER_RULE};
/// // Health checks that skipped the limiter, in PromQL:
/// let query = format!(r#"sum(rate({DECISIONS_TOTAL}{{rule="{LAYER_RULE}",outcome="exempt"}}[5m]))"#);
/// assert_eq!(query, r#"sum(rate(rate_limit_decisions_total{rule="*",outcome="exempt"}[5m]))"#);
/// ```
pub const LAYER_RULE: &str = "*";

/// A request a rule's exemption let through: `outcome="exempt"`.
#[cold]
pub(crate) fn exempt(rule: &Arc<str>) {
    count(DECISIONS_TOTAL, rule, &[("outcome", "exempt")]);
}

/// A request the layer-wide exemption let through: counted once, with
/// `rule="*"`.
#[cold]
pub(crate) fn layer_exempt() {
    #[cfg(feature = "metrics")]
    metrics::counter!(DECISIONS_TOTAL, "rule" => LAYER_RULE, "outcome" => "exempt").increment(1);
}

/// An allowed request left `remaining` of `limit`, under the rule's
/// near-limit ratio: counted every time (`outcome="near_limit"`), logged
/// at most once a second per rule. At `info`, as denies are: a client
/// nearing its quota is the limiter working, not a fault to page on, and
/// should not outrank the deny it may lead to.
pub(crate) fn near_limit(
    rule: &Arc<str>,
    key: impl FnOnce() -> String,
    remaining: u32,
    limit: u32,
    log: &Sampled,
) {
    count(DECISIONS_TOTAL, rule, &[("outcome", "near_limit")]);
    let Some(suppressed) = log.take(DENY_EVERY) else {
        return;
    };
    let key = key();
    tracing::info!(target: TARGET, rule = %rule, %key, remaining, limit, suppressed, "near the rate limit");
}

/// A deny because the key is locked: `outcome="locked"`.
pub(crate) fn locked_deny(rule: &Arc<str>) {
    count(DECISIONS_TOTAL, rule, &[("outcome", "locked")]);
}

/// The `# HELP` line of each metric, in [`METRICS`]' order.
#[cfg(feature = "metrics")]
const HELP: [&str; METRICS.len()] = [
    "Decisions of each rate-limit rule, by outcome (allow, deny, shadow_deny, locked) and what made or marked them",
    "Times a global rule's Redis circuit breaker opened: once per outage",
    "Half-open probes of a global rule's open Redis circuit breaker that failed",
    "A global rule's Redis circuit breaker: 0 closed, 1 open, 2 half-open",
    "Seconds one Redis decision or lease call took, send to answer or failure",
    "A global rule's Redis timeout in seconds",
    "Keys a rule holds in this process, after the last sweep",
    "Requests that showed a likely proxy misconfiguration",
    "Requests a rule could not key because the key's source is missing from the setup",
    "Edits of a watched rate-limit rules file, applied or rejected",
];

/// Hands every metric's description to the recorder: called whenever a
/// layer is built (descriptions are not kept without a recorder).
pub(crate) fn describe_metrics() {
    #[cfg(feature = "metrics")]
    for ((name, kind, _), help) in METRICS.iter().zip(HELP) {
        match *kind {
            "counter" => metrics::describe_counter!(*name, help),
            "gauge" => metrics::describe_gauge!(*name, help),
            _ => metrics::describe_histogram!(*name, help),
        }
    }
}

/// A rule's allowed and refused decisions (`outcome="allow"`, `"deny"`,
/// `"shadow_deny"`): the counters are resolved once, when the layer is
/// built, so counting one is an atomic add (no label hashing, no
/// allocation) on the hot path of an allow and of a 429. A layer built
/// before the `metrics` recorder is installed keeps handles that count
/// nowhere.
#[derive(Clone, Debug)]
pub(crate) struct Counted {
    #[cfg(feature = "metrics")]
    allow: metrics::Counter,
    #[cfg(feature = "metrics")]
    deny: metrics::Counter,
    #[cfg(feature = "metrics")]
    shadow_deny: metrics::Counter,
}

impl Counted {
    pub(crate) fn new(rule: &Arc<str>) -> Self {
        describe_metrics();
        #[cfg(feature = "metrics")]
        {
            let resolve = |outcome: &'static str| {
                let labels = vec![
                    metrics::Label::new("rule", rule.clone()),
                    metrics::Label::from_static_parts("outcome", outcome),
                ];
                metrics::counter!(DECISIONS_TOTAL, labels)
            };
            Self {
                allow: resolve("allow"),
                deny: resolve("deny"),
                shadow_deny: resolve("shadow_deny"),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = rule;
            Self {}
        }
    }

    /// One allowed decision.
    #[inline]
    pub(crate) fn allow(&self) {
        #[cfg(feature = "metrics")]
        self.allow.increment(1);
    }

    /// One refusal, or one a shadow rule would have made.
    #[inline]
    fn deny(&self, shadow: bool) {
        #[cfg(feature = "metrics")]
        if shadow {
            self.shadow_deny.increment(1);
        } else {
            self.deny.increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = shadow;
    }
}

/// The `metrics` recorder current when a chain resolved its rules'
/// counters, checked at each sweep: a recorder installed later gets none
/// of their allow and deny counts, while the other outcomes (counted
/// as they happen) reach it, and the shares read from them go wrong.
#[derive(Debug)]
pub(crate) struct RecorderSeen {
    at_build: usize,
    warned: std::sync::atomic::AtomicBool,
}

impl RecorderSeen {
    pub(crate) fn now() -> Self {
        Self {
            at_build: recorder_id(),
            warned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Warns once when the recorder is no longer the one the counters
    /// were resolved against.
    pub(crate) fn warn_if_replaced(&self, rules: usize) {
        if recorder_id() != self.at_build && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: TARGET, rules, "a metrics recorder was installed after this rate limit was built: its allow and deny counts go to the one before (none); install the recorder first, or reload the rules");
        }
    }
}

/// The current recorder's address: its identity for [`RecorderSeen`].
fn recorder_id() -> usize {
    #[cfg(feature = "metrics")]
    {
        metrics::with_recorder(|r| std::ptr::from_ref(r).cast::<()>() as usize)
    }
    #[cfg(not(feature = "metrics"))]
    0
}

#[cfg(feature = "metrics")]
pub(super) fn count(name: &'static str, rule: &Arc<str>, labels: &[(&'static str, &'static str)]) {
    let mut all = Vec::with_capacity(labels.len() + 1);
    // The rule's own Arc, not a copy of its name: no allocation.
    all.push(metrics::Label::new("rule", rule.clone()));
    all.extend(
        labels
            .iter()
            .map(|&(k, v)| metrics::Label::from_static_parts(k, v)),
    );
    metrics::counter!(name, all).increment(1);
}

#[cfg(not(feature = "metrics"))]
pub(super) fn count(_: &'static str, _: &Arc<str>, _: &[(&'static str, &'static str)]) {}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::RecorderSeen;

    #[test]
    fn a_recorder_installed_after_the_build_is_a_warning_once() {
        let (warns, _guard) = crate::util::warns::counted();
        let before = metrics_util::debugging::DebuggingRecorder::new();
        let after = metrics_util::debugging::DebuggingRecorder::new();
        let seen = metrics::with_local_recorder(&before, RecorderSeen::now);
        metrics::with_local_recorder(&before, || seen.warn_if_replaced(1));
        assert_eq!(*warns.lock().unwrap(), 0, "the same recorder");
        metrics::with_local_recorder(&after, || seen.warn_if_replaced(1));
        metrics::with_local_recorder(&after, || seen.warn_if_replaced(1));
        assert_eq!(*warns.lock().unwrap(), 1, "another one, said once");
    }
}
