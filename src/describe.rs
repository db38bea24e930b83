#![doc = include_str!("../docs/describe.md")]
#![cfg_attr(feature = "redis", doc = include_str!("../docs/describe_redis.md"))]

use std::fmt::Write;
use std::time::Duration;

use crate::key::lookup::OnMissingKey;
use crate::quota::{Offset, Period};
use crate::rule::Rule;
use crate::rule::{Cost, QuotaChange, QuotaSource};

/// What a [`RateLimitLayer`](crate::RateLimitLayer) enforces, rule by rule
/// in evaluation order; from [`RateLimitLayer::describe`](crate::RateLimitLayer::describe).
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
///
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("per-ip", KeyExtractor::peer_ip(), Quota::new(10, Duration::from_secs(5))))
///     .build()?;
/// let d = layer.describe();
/// assert!(d.markdown().contains("| per-ip | `peer_ip` | 10/5s | gcra | local | n/a | 429 + Retry-After; missing key: skip; 500 without ConnectInfo |"));
/// assert!(d.mermaid().starts_with("flowchart TD\n"));
/// # Ok::<(), keyed_rate_limit::BuildError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    rules: Vec<DescribedRule>,
    /// `RateLimitBuilder::exempt` is set.
    layer_exempt: bool,
    /// A bandwidth layer's budget: it delays bodies, refuses nothing.
    bandwidth: bool,
}

/// One rule, as text (for the crate's tests; users read the renderings).
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DescribedRule {
    /// The rule's name.
    pub name: String,
    /// The key extractor's name, e.g. `header:x-api-key|peer_ip`.
    pub key: String,
    /// The quota in config syntax (`100/min, burst 20`), the cost when it is
    /// not 1, or `per request (quota_fn)`.
    pub quota: String,
    /// `gcra`, `token_bucket`, `fixed_window` or `sliding_window`; for a
    /// calendar quota, `calendar window` or `aligned window`.
    pub algorithm: String,
    /// `local`, or `global` with its consistency: `global, exact`,
    /// `global, coalesced`, or `global, leased 50ms: Redis burst 4750` (the
    /// burst Redis counts leases in, which bounds what the fleet admits to
    /// the quota's `burst + rate × t`; for a window, `: ends with its window`).
    pub scope: String,
    /// A global rule's failure mode and Redis timeout, e.g. `fail_closed, 20ms timeout`.
    pub failure_mode: Option<String>,
    /// The answer to a request over quota: `429 + Retry-After`, or
    /// `log only (shadow)`; with `, lockout: 5 denies/1min -> 15min` for a
    /// rule with a [`Lockout`](crate::policy::Lockout), `, blockable` for
    /// a [blockable](crate::Rule::blockable) rule without one, `, hidden from
    /// headers` for a rule kept out of the rate-limit headers and `, pk`
    /// for one that sends its partition key; `, exempt: 10.0.0.0/8 + fn`
    /// for a rule with [`exempt_ips`](crate::Rule::exempt_ips) and
    /// [`exempt`](crate::Rule::exempt); `, near limit < 10%` for a
    /// [`near_limit_ratio`](crate::Rule::near_limit_ratio) other than the
    /// default 20%, `, near limit off` for none.
    pub on_deny: String,
    /// What a request without a key gets: `skip`, a status like `401`, or
    /// `fallback: peer_ip`; by default, for an extractor whose source the
    /// crate checks, `skip; 500 without ConnectInfo` (see
    /// [`OnMissingKey`]).
    pub on_missing_key: String,
    /// The [any-of group](crate::rule::any_of) the rule is a member of.
    pub group: Option<String>,
    reject: Option<u16>,
    shadow: bool,
    /// Who skips the rule: `10.0.0.0/8 + fn`.
    exempt: Option<String>,
}

impl DescribedRule {
    fn new(rule: &Rule) -> Self {
        let mut quota = match &rule.quota {
            QuotaSource::Static(q) if q.period().is_some() => {
                let mut s = match q.period() {
                    Some(Period::Aligned) => {
                        format!("{}/aligned_{}", q.limit(), window(q.window()))
                    }
                    p => format!("{}/calendar_{}", q.limit(), p.map_or("", Period::as_str)),
                };
                if q.utc_offset() != 0 {
                    let _ = write!(s, ", utc_offset {}", Offset(q.utc_offset()));
                }
                s
            }
            QuotaSource::Static(q) => {
                let mut s = format!("{}/{}", q.limit(), window(q.window()));
                if q.burst() != q.limit() {
                    let _ = write!(s, ", burst {}", q.burst());
                }
                s
            }
            QuotaSource::Dynamic(_) => "per request (quota_fn)".to_owned(),
        };
        match rule.cost {
            Cost::Fixed(1) => {}
            Cost::Fixed(n) => {
                let _ = write!(quota, ", cost {n}");
            }
            Cost::Dynamic(_) => quota.push_str(", cost per request (cost_fn)"),
        }
        let how = rule.quota_use.on_quota_change;
        if how != QuotaChange::default() {
            let _ = write!(quota, ", on change: {}", how.as_str());
        }
        let exempt = rule.exempt.as_ref().map(|e| {
            let mut who = e.written.clone();
            if e.f.is_some() {
                who.push("fn".to_owned());
            }
            who.join(" + ")
        });
        let (on_missing_key, reject) = match &rule.on_missing {
            None => match rule.key.needs() {
                Some(needs) => (format!("skip; 500 without {needs}"), None),
                None => ("skip".to_owned(), None),
            },
            Some(OnMissingKey::Skip) => ("skip".to_owned(), None),
            Some(OnMissingKey::Reject(s)) => (s.as_u16().to_string(), Some(s.as_u16())),
            Some(OnMissingKey::Fallback(k)) => (format!("fallback: {}", k.name()), None),
        };
        Self {
            name: rule.name().to_owned(),
            key: rule.key().name().to_owned(),
            quota,
            algorithm: match rule.static_quota().and_then(|q| q.period()) {
                Some(Period::Aligned) => "aligned window".to_owned(),
                Some(_) => "calendar window".to_owned(),
                None => rule.algorithm.as_str().to_owned(),
            },
            scope: scope(rule),
            failure_mode: rule.scope.is_global().then(|| {
                format!(
                    "{}, {} timeout",
                    rule.failure.mode,
                    duration(rule.failure.timeout)
                )
            }),
            on_deny: {
                let mut s = if rule.shadow {
                    "log only (shadow)"
                } else {
                    "429 + Retry-After"
                }
                .to_owned();
                if let Some(l) = rule.lock_policy.lockout {
                    let _ = write!(
                        s,
                        ", lockout: {} denies/{} -> {}",
                        l.after,
                        window(l.within),
                        window(l.block_for)
                    );
                } else if rule.lock_policy.blockable {
                    s.push_str(", blockable");
                }
                if rule.hidden {
                    s.push_str(", hidden from headers");
                } else if rule.key_space.partition_key {
                    s.push_str(", pk");
                }
                if let Some(who) = &exempt {
                    let _ = write!(s, ", exempt: {who}");
                }
                match rule.quota_use.near_limit {
                    None => s.push_str(", near limit off"),
                    Some(r) if r != crate::rule::DEFAULT_NEAR_LIMIT_RATIO => {
                        let _ = write!(s, ", near limit < {}%", (r * 10_000.0).round() / 100.0);
                    }
                    Some(_) => {}
                }
                s
            },
            on_missing_key,
            group: rule.group().map(str::to_owned),
            reject,
            shadow: rule.shadow,
            exempt,
        }
    }
}

/// A window in the quota syntax of config files: `s`, `min`, `10s`, `2h`.
fn window(d: Duration) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400, "day"), (3600, "h"), (60, "min"), (1, "s")];
    if d.subsec_nanos() == 0 && d.as_secs() > 0 {
        let secs = d.as_secs();
        for (unit, name) in UNITS {
            if secs.is_multiple_of(unit) {
                return match secs / unit {
                    1 => name.to_owned(),
                    n => format!("{n}{name}"),
                };
            }
        }
    }
    duration(d)
}

/// The scope, and for a global rule its consistency.
fn scope(rule: &Rule) -> String {
    if !rule.scope.is_global() {
        return rule.scope.as_str().to_owned();
    }
    #[cfg(feature = "redis")]
    if let Some(lease) = rule.global.lease {
        let mut s = format!("global, leased {}", duration(lease.ttl()));
        if let Some(counted) = rule
            .static_quota()
            .and_then(|q| lease.counted(q, rule.algorithm))
        {
            if rule.algorithm.has_burst() {
                let _ = write!(s, ": Redis burst {}", counted.burst());
            } else {
                s.push_str(": ends with its window");
            }
        }
        return s;
    }
    #[cfg(feature = "redis")]
    if rule.global.coalesce {
        return "global, coalesced".to_owned();
    }
    "global, exact".to_owned()
}

/// `20ms`, `1.5s`: what `Debug` prints, which is also what config files accept.
fn duration(d: Duration) -> String {
    format!("{d:?}")
}

/// `s` with each character of `table` replaced by its text.
fn escape(s: &str, table: &[(char, &str)]) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match table.iter().find(|(from, _)| *from == c) {
            Some((_, to)) => out.push_str(to),
            None => out.push(c),
        }
    }
    out
}

/// A table cell of text: a `|` would end the cell, and `<`, `>`, `&` are
/// HTML to a Markdown renderer (a rule named `plan<shadow>` would lose its
/// tail to an unknown tag), so they are written as entities.
fn cell(s: &str) -> String {
    escape(
        s,
        &[('|', "\\|"), ('<', "&lt;"), ('>', "&gt;"), ('&', "&amp;")],
    )
}

/// A table cell in a code span, where entities are not read: only `|`
/// needs escaping (GitHub's tables split on it even there).
fn code_cell(s: &str) -> String {
    escape(s, &[('|', "\\|")])
}

/// Mermaid labels are quoted and read as HTML: a quote would end the
/// label, and `<`, `>`, `&` would be markup. Each is Mermaid's entity code
/// (`#quot;`, `#lt;`, `#gt;`, `#amp;`), and so is `#` itself, which starts one.
fn label(s: &str) -> String {
    escape(
        s,
        &[
            ('#', "#35;"),
            ('"', "#quot;"),
            ('<', "#lt;"),
            ('>', "#gt;"),
            ('&', "#amp;"),
        ],
    )
}

impl Description {
    pub(crate) fn new<'a>(rules: impl Iterator<Item = &'a Rule>, layer_exempt: bool) -> Self {
        let mut rules: Vec<DescribedRule> = rules.map(DescribedRule::new).collect();
        // A group member's refusal asks the next member; the last one's answers.
        for i in 0..rules.len() {
            let Some(g) = rules[i].group.clone() else {
                continue;
            };
            let last = rules
                .get(i + 1)
                .is_none_or(|r| r.group.as_ref() != Some(&g));
            // What follows the refusal (lockout, exemptions...) stays.
            let rest = rules[i]
                .on_deny
                .strip_prefix("429 + Retry-After")
                .unwrap_or("")
                .to_owned();
            rules[i].on_deny = if last {
                format!(
                    "any_of {g}: 429 + Retry-After of the soonest member, once every member refused{rest}"
                )
            } else {
                format!("any_of {g}: the next member{rest}")
            };
        }
        Self {
            rules,
            layer_exempt,
            bandwidth: false,
        }
    }

    /// Where a "yes" from rule `i` (0-based) goes: past its group.
    fn after(&self, i: usize) -> usize {
        let group = &self.rules[i].group;
        let rest = self.rules[i + 1..].iter();
        i + 1
            + rest
                .take_while(|r| group.is_some() && r.group == *group)
                .count()
    }

    /// Whether some requests skip every rule
    /// ([`RateLimitBuilder::exempt`](crate::rate_limit::RateLimitBuilder::exempt)).
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("api", KeyExtractor::everyone(), Quota::per_second(5)))
    ///     .build()
    ///     .unwrap();
    /// assert!(!layer.describe().layer_exempt());
    /// ```
    pub fn layer_exempt(&self) -> bool {
        self.layer_exempt
    }

    /// A bandwidth limit's byte budget as one row: it delays a body
    /// (`what`, e.g. `response bodies`), it refuses nothing.
    /// The rule counts in units of bytes: `rate` and `burst` are in bytes.
    pub(crate) fn bandwidth(rule: &Rule, (rate, burst): (u32, u32), what: &str) -> Self {
        let mut r = DescribedRule::new(rule);
        r.quota = format!("{rate} bytes/s, burst {burst} bytes");
        r.on_deny = format!("delay {what}");
        Self {
            rules: vec![r],
            layer_exempt: false,
            bandwidth: true,
        }
    }

    /// The rules, in evaluation order.
    #[doc(hidden)]
    pub fn rules(&self) -> &[DescribedRule] {
        &self.rules
    }

    /// A Markdown table, one row per rule in evaluation order; after
    /// `Exempt from every rule: fn` and a blank line when the layer has a
    /// layer-wide exemption.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        if self.layer_exempt {
            out.push_str("Exempt from every rule: fn\n\n");
        }
        out.push_str(
            "| # | rule | key | quota | algorithm | scope | failure mode | on deny |\n\
             |---|---|---|---|---|---|---|---|\n",
        );
        for (i, r) in self.rules.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {} | {} | `{}` | {} | {} | {} | {} | {}; missing key: {} |",
                i + 1,
                cell(&r.name),
                code_cell(&r.key),
                cell(&r.quota),
                cell(&r.algorithm),
                cell(&r.scope),
                cell(r.failure_mode.as_deref().unwrap_or("n/a")),
                cell(&r.on_deny),
                cell(&r.on_missing_key),
            );
        }
        out
    }

    /// The metrics the layer emits, as a Markdown table for a dashboard:
    /// name, kind, labels, and the `rule` label's values for this chain;
    /// then the `outcome` values of `rate_limit_decisions_total`
    /// ([`OUTCOMES`](crate::observe::OUTCOMES)). Breaker and backend
    /// metrics only concern global rules.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("per-key", KeyExtractor::header("x-api-key"), Quota::per_minute(100)))
    ///     .build()
    ///     .unwrap();
    /// let table = layer.describe().metrics();
    /// assert!(table.contains("| `rate_limit_decisions_total` | counter | rule, outcome, cause | `per-key` |"));
    /// assert!(table.contains("| `allow` | allowed"));
    /// ```
    pub fn metrics(&self) -> String {
        let rules = self
            .rules
            .iter()
            .map(|r| format!("`{}`", r.name))
            .collect::<Vec<_>>()
            .join(", ");
        let mut out =
            String::from("| metric | kind | labels | `rule` values |\n|---|---|---|---|\n");
        for (name, kind, labels) in crate::observe::METRICS {
            let values = if labels.starts_with("rule") {
                rules.as_str()
            } else {
                ""
            };
            let _ = writeln!(out, "| `{name}` | {kind} | {labels} | {values} |");
        }
        out.push_str("\n| `outcome` | counts |\n|---|---|\n");
        for (outcome, counts) in crate::observe::OUTCOMES {
            let _ = writeln!(out, "| `{outcome}` | {counts} |");
        }
        out
    }

    /// A Mermaid flowchart: the client, the gateway, each rule in order with
    /// its store and decision, the requests exempt from it, the 429 (gRPC
    /// `RESOURCE_EXHAUSTED`) path, the path to the service, and metrics as
    /// dashed edges. A bandwidth layer's chart shows its byte budget, and
    /// the delay that stands for a refusal.
    pub fn mermaid(&self) -> String {
        let layer = if self.bandwidth {
            "BandwidthLimitLayer"
        } else {
            "RateLimitLayer"
        };
        let mut out =
            format!("flowchart TD\n    client([client]) --> gateway[\"gateway: {layer}\"]\n");
        if self.layer_exempt {
            out.push_str("    gateway -->|\"exempt from every rule: fn\"| service\n");
        }
        for (i, r) in self.rules.iter().enumerate() {
            let n = i + 1;
            let store = match r.failure_mode.as_deref() {
                None => "local store (governor)".to_owned(),
                Some(f) => format!("Redis<br/>on failure: {}", label(f)),
            };
            let (budget, question) = if self.bandwidth {
                (label(&r.quota), "bytes within budget?")
            } else {
                (
                    format!("{} ({})", label(&r.quota), label(&r.algorithm)),
                    "within quota?",
                )
            };
            let _ = writeln!(
                out,
                "    {}r{n}[\"{n}. {}<br/>key: {}<br/>{budget}\"]\n    \
                 r{n} --> s{n}[(\"{}\")]\n    s{n} --> d{n}{{{question}}}",
                // Later rules are reached by the previous rule's "yes" edge.
                if n == 1 { "gateway --> " } else { "" },
                label(&r.name),
                label(&r.key),
                store,
            );
            if let Some(status) = r.reject {
                let _ = writeln!(out, "    r{n} -->|missing key| m{n}[\"{status}\"]");
            }
            let node = |j: usize| {
                if j == self.rules.len() {
                    "service[service]".to_owned()
                } else {
                    format!("r{}", j + 1)
                }
            };
            let next = node(self.after(i));
            if let Some(who) = &r.exempt {
                // An exempt request skips this rule (a group member: the member).
                let _ = writeln!(
                    out,
                    "    r{n} -->|\"exempt: {}\"| {}",
                    label(who),
                    node(i + 1)
                );
            }
            if self.bandwidth {
                let _ = writeln!(out, "    d{n} -->|no| delay");
                let _ = writeln!(out, "    d{n} -->|yes| {next}");
                let _ = writeln!(out, "    delay -->|bytes back| {next}");
            } else if r.on_deny.contains(": the next member") {
                let _ = writeln!(out, "    d{n} -->|no| {}", node(i + 1));
                let _ = writeln!(out, "    d{n} -->|yes| {next}");
            } else if r.shadow {
                let _ = writeln!(
                    out,
                    "    d{n} -.->|\"no: shadow_deny\"| metrics\n    d{n} -->|\"yes, or no: log only (shadow)\"| {next}",
                );
            } else {
                let _ = writeln!(out, "    d{n} -->|no| deny");
                let _ = writeln!(out, "    d{n} -->|yes| {next}");
            }
        }
        if self.bandwidth {
            out.push_str("    delay[\"the body waits for its bytes<br/>nothing is refused\"]\n");
        } else {
            out.push_str(
                "    deny[\"429 Too Many Requests + Retry-After<br/>gRPC: RESOURCE_EXHAUSTED + grpc-retry-pushback-ms\"]\n    \
                 deny -.-> metrics[(\"metrics: rate_limit_decisions_total\")]\n",
            );
        }
        out
    }
}

impl std::fmt::Display for Description {
    /// The Markdown table.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.markdown())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows() {
        assert_eq!(window(Duration::from_secs(1)), "s");
        assert_eq!(window(Duration::from_secs(10)), "10s");
        assert_eq!(window(Duration::from_secs(60)), "min");
        assert_eq!(window(Duration::from_secs(900)), "15min");
        assert_eq!(window(Duration::from_secs(7200)), "2h");
        assert_eq!(window(Duration::from_secs(86_400)), "day");
        assert_eq!(window(Duration::from_millis(500)), "500ms");
        assert_eq!(cell("a|b"), "a\\|b");
    }

    /// Names holding every character either rendering reads as markup.
    #[test]
    fn names_are_escaped_in_both_renderings() {
        use crate::{key::KeyExtractor, quota::Quota, rate_limit::RateLimitLayer};
        let name = r#"plan<shadow> & "free"|#1"#;
        let layer = RateLimitLayer::builder()
            .rule(
                Rule::new(
                    name,
                    KeyExtractor::header("x-a").or(KeyExtractor::header("x-b")),
                    Quota::per_minute(5),
                )
                .exempt_ips(["10.0.0.0/8"]),
            )
            .build()
            .unwrap();
        let d = layer.describe();
        assert_eq!(d.rules()[0].name, name, "the plain facts stay plain");
        let md = d.markdown();
        assert!(
            md.contains(
                r#"| 1 | plan&lt;shadow&gt; &amp; "free"\|#1 | `header:x-a\|header:x-b` | 5/min |"#
            ),
            "{md}"
        );
        let m = d.mermaid();
        assert!(
            m.contains(r#"r1["1. plan#lt;shadow#gt; #amp; #quot;free#quot;|#35;1<br/>key: header:x-a|header:x-b<br/>5/min (gcra)"]"#),
            "{m}"
        );
        // No raw markup from the name anywhere in the chart.
        assert!(!m.contains("<shadow>") && !m.contains(" & "), "{m}");
        assert!(
            m.contains(r#"r1 -->|"exempt: 10.0.0.0/8"| service[service]"#),
            "the chart shows the exemption the table shows: {m}"
        );
        assert!(md.contains("exempt: 10.0.0.0/8"), "{md}");
    }
}
