#![doc = include_str!("../docs/headers.md")]

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::decision::RuleDecision;

/// Which rate-limit headers responses carry.
///
/// | style | headers |
/// |---|---|
/// | `Draft` (default) | `RateLimit-Policy: "rule";q=100;w=60` and `RateLimit: "rule";r=50;t=30`, one list member per rule |
/// | `Legacy` | `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds) of the most restrictive rule |
/// | `Both` | all of the above |
/// | `None` | nothing (a 429 still carries `Retry-After`) |
///
/// `Draft` follows draft-ietf-httpapi-ratelimit-headers-10, whose values are
/// RFC 9651 structured fields: `q` is the quota, `w` its window in seconds,
/// `r` the units left and `t` the seconds until more quota is available,
/// rounded up:
///
/// - on an allow that leaves units (`r > 0`): when the next unit comes back,
///   0 when nothing is spent ([`Decision::next_unit`](crate::decision::Decision::next_unit));
/// - on an allow that leaves none (`r = 0`), and on a deny: the `Retry-After`
///   seconds, so the two never disagree (a cost that can never pass has no
///   `Retry-After` and `t=0`).
///
/// The window algorithms give their units back when the window ends, so `t`
/// is the time to the window's end (fixed) or to the next unit the decaying
/// previous window frees (sliding). Locally (governor) the next unit is at
/// most one emission interval away, and governor does not expose the exact
/// arrival time: `t` is the interval rounded up, which is exact for quotas of
/// at least one unit per second (the next unit is then under a second away)
/// and otherwise late by less than one interval, never early.
/// `RateLimit-Policy` is constant for a static quota. Shadow rules, and
/// global rules that failed open, are never shown to clients.
///
/// ```
/// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, headers::HeaderStyle};
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("api", KeyExtractor::everyone(), Quota::per_second(10)))
///     .headers(HeaderStyle::Legacy)
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "config",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (IETF draft).
    #[default]
    Draft,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    Legacy,
    /// Draft and legacy headers.
    Both,
    /// No rate-limit headers.
    None,
}

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds, rounded up: a client that waits the advertised time must
/// not arrive early.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The `Retry-After` delay: whole seconds, rounded up, at least one.
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// The draft's `t` for one decision; see [`HeaderStyle`].
pub(crate) fn t_secs(d: &crate::decision::Decision) -> u64 {
    if d.is_allowed() && d.remaining() > 0 || d.next_unit().is_zero() {
        ceil_secs(d.next_unit())
    } else {
        retry_after_secs(d.next_unit())
    }
}

/// Rendered rate-limit headers: at most five; the usual two (draft style)
/// stay inline, saving an allocation per request.
pub(crate) type Rendered = smallvec::SmallVec<[(HeaderName, HeaderValue); 2]>;

/// What a policy's quota counts (the draft's `qu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// Requests in a window (the default unit: no `qu`).
    Requests,
    /// Requests in flight: no window.
    Concurrent,
    /// Body bytes in a window.
    ContentBytes,
}

impl Unit {
    pub(crate) fn of(concurrency: bool) -> Self {
        if concurrency {
            Self::Concurrent
        } else {
            Self::Requests
        }
    }
}

/// One rule's `RateLimit-Policy` list member, e.g. `"api";q=100;w=60`.
pub(crate) fn quota_member(out: &mut String, rule: &str, limit: u32, window: Duration, unit: Unit) {
    use std::fmt::Write;
    push_sf_string(out, rule);
    let _ = write!(out, ";q={limit}");
    if unit != Unit::Concurrent {
        // A count of requests in flight has no window, and `w` is optional.
        let _ = write!(out, ";w={}", ceil_secs(window).max(1));
    }
    match unit {
        Unit::Requests => {}
        Unit::Concurrent => out.push_str(";qu=\"concurrent-requests\""),
        Unit::ContentBytes => out.push_str(";qu=\"content-bytes\""),
    }
}

/// A static rule's policy member, rendered once when the layer is built and
/// used for the decisions that carry that same quota.
#[derive(Debug, Clone)]
pub(crate) struct StaticQuotaMember {
    limit: u32,
    window: Duration,
    value: HeaderValue,
}

impl StaticQuotaMember {
    pub(crate) fn new(rule: &str, limit: u32, window: Duration, unit: Unit) -> Option<Self> {
        let mut item = String::new();
        quota_member(&mut item, rule, limit, window, unit);
        let value = HeaderValue::try_from(item).ok()?;
        Some(Self {
            limit,
            window,
            value,
        })
    }

    /// The rendered member, unless `d` has another quota (e.g. a fallback share).
    pub(crate) fn for_decision(
        this: &Option<Self>,
        d: &crate::decision::Decision,
    ) -> Option<HeaderValue> {
        this.as_ref()
            .filter(|p| p.limit == d.limit() && p.window == d.window())
            .map(|p| p.value.clone())
    }
}

/// What `X-RateLimit-Reset` counts, in the legacy header styles.
///
/// | format | `X-RateLimit-Reset` | as in |
/// |---|---|---|
/// | `DeltaSeconds` (default) | seconds until the quota is whole again | the early RateLimit drafts, Twitter |
/// | `UnixSeconds` | the Unix time (seconds) it is whole again | GitHub, express-rate-limit |
///
/// ```
/// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, headers::{HeaderStyle, ResetFormat}};
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("api", KeyExtractor::everyone(), Quota::per_second(10)))
///     .headers(HeaderStyle::Legacy)
///     .legacy_reset(ResetFormat::UnixSeconds)
///     .build();
/// assert!(layer.is_ok());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "config",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum ResetFormat {
    /// Seconds from now, rounded up.
    #[default]
    DeltaSeconds,
    /// Seconds since the Unix epoch, rounded up.
    UnixSeconds,
}

impl ResetFormat {
    fn value(self, reset: Duration) -> u64 {
        let delta = ceil_secs(reset);
        match self {
            Self::DeltaSeconds => delta,
            Self::UnixSeconds => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |now| ceil_secs(now.saturating_add(reset))),
        }
    }
}

impl HeaderStyle {
    /// Whether responses carry the draft fields, `RateLimit-Policy` among them.
    pub(crate) fn draft(self) -> bool {
        matches!(self, Self::Draft | Self::Both)
    }
}

/// What the layer renders: the style, and the legacy reset's format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Headers {
    pub(crate) style: HeaderStyle,
    pub(crate) reset: ResetFormat,
}

impl From<HeaderStyle> for Headers {
    fn from(style: HeaderStyle) -> Self {
        Self {
            style,
            reset: ResetFormat::default(),
        }
    }
}

impl Headers {
    pub(crate) fn draft(self) -> bool {
        self.style.draft()
    }

    /// Renders the headers for `decisions` (the rules that applied, in order).
    ///
    /// A lone rule's pre-rendered policy value is moved out of its decision
    /// into the header rather than cloned again: each clone touches a
    /// reference count that every core shares.
    pub(crate) fn render(self, decisions: &mut [RuleDecision], out: &mut Rendered) {
        if self.style == HeaderStyle::None {
            return;
        }
        // Shadow rules are not the client's business; a fail-open rule knows no numbers.
        // A hidden rule's limits are not told either.
        let shown = |d: &RuleDecision| {
            !d.shadow && !d.hidden && d.source != crate::decision::Source::FailOpen
        };
        let mut at = (0..decisions.len()).filter(|&i| shown(&decisions[i]));
        let Some(first) = at.next() else { return };
        let single = at.next().is_none();
        let lone_member = if single && self.draft() {
            decisions[first].quota_member.take()
        } else {
            None
        };
        let decisions = &*decisions;
        let visible = || decisions.iter().filter(|d| shown(d));
        if self.draft() {
            let policy = match lone_member {
                Some(v) => Some(v),
                None => {
                    let mut policy = String::with_capacity(32 * decisions.len());
                    for d in visible() {
                        if !policy.is_empty() {
                            policy.push_str(", ");
                        }
                        let dec = &d.decision;
                        match d.quota_member.as_ref().and_then(|v| v.to_str().ok()) {
                            Some(item) => policy.push_str(item),
                            None => quota_member(
                                &mut policy,
                                &d.rule,
                                dec.limit(),
                                dec.window(),
                                Unit::of(d.concurrency),
                            ),
                        }
                    }
                    HeaderValue::try_from(policy).ok()
                }
            };
            // Exactly sized: `Bytes` takes a `String` that is full as is, but
            // allocates again for one with spare capacity. One pass sizes it
            // and counts the members.
            let (mut len, mut n) = (0, 0);
            for d in visible() {
                let dec = &d.decision;
                len += sf_string_len(&d.rule)
                    + ";r=;t=".len()
                    + digits(dec.remaining().into())
                    + digits(t_secs(dec))
                    + d.partition.map_or(0, |_| PK_LEN);
                n += 1;
            }
            let len = len + ", ".len() * (n - 1);
            let mut state = String::with_capacity(len);
            for d in visible() {
                if !state.is_empty() {
                    state.push_str(", ");
                }
                push_sf_string(&mut state, &d.rule);
                let dec = &d.decision;
                // itoa: this runs on every response, and `fmt` is the slow part.
                let mut n = itoa::Buffer::new();
                state.push_str(";r=");
                state.push_str(n.format(dec.remaining()));
                state.push_str(";t=");
                state.push_str(n.format(t_secs(dec)));
                if let Some(pk) = &d.partition {
                    push_pk(&mut state, pk);
                }
            }
            debug_assert_eq!(state.len(), len, "state header sized exactly");
            // Rule names are checked to be printable ASCII at build time.
            if let (Some(policy), Ok(state)) = (policy, HeaderValue::try_from(state)) {
                out.push((RATELIMIT_POLICY, policy));
                out.push((RATELIMIT, state));
            }
        }
        if matches!(self.style, HeaderStyle::Legacy | HeaderStyle::Both)
            && let Some(d) = crate::decision::tightest(visible()).map(|d| d.decision)
        {
            out.push((X_RATELIMIT_LIMIT, HeaderValue::from(d.limit())));
            out.push((X_RATELIMIT_REMAINING, HeaderValue::from(d.remaining())));
            let reset = self.reset.value(d.reset());
            out.push((X_RATELIMIT_RESET, HeaderValue::from(reset)));
        }
    }
}

/// `;pk=:<12 base64 digits>:`.
const PK_LEN: usize = ";pk=::".len() + crate::key::PARTITION_LEN / 3 * 4;

/// Appends the partition key as an sf-binary (RFC 9651 §3.3.5): base64 of
/// whole 3-byte groups, so no padding. Nine bytes need no base64 crate.
fn push_pk(out: &mut String, pk: &[u8; crate::key::PARTITION_LEN]) {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    out.push_str(";pk=:");
    for g in pk.chunks_exact(3) {
        let n = u32::from(g[0]) << 16 | u32::from(g[1]) << 8 | u32::from(g[2]);
        for shift in [18, 12, 6, 0] {
            out.push(char::from(B64[(n >> shift & 63) as usize]));
        }
    }
    out.push(':');
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// The length of `s` as a structured-field string.
fn sf_string_len(s: &str) -> usize {
    s.len() + 2 + s.bytes().filter(|&b| sf_escaped(b)).count()
}

/// Whether `b` is escaped in a structured-field string.
fn sf_escaped(b: u8) -> bool {
    b == b'"' || b == b'\\'
}

/// Appends a structured-field string (RFC 8941 §3.3.3): quoted, `"` and `\` escaped.
fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    // A byte scan: a `char` pattern's search costs more than the short names.
    if s.bytes().any(sf_escaped) {
        for c in s.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    } else {
        out.push_str(s);
    }
    out.push('"');
}

/// Appends the headers: lists may span several lines, so an outer layer's
/// entries join an inner one's instead of replacing them.
pub(crate) fn apply(headers: &mut HeaderMap, entries: &mut Rendered) {
    if entries.is_empty() {
        return;
    }
    for (name, value) in entries.drain(..) {
        if name.as_str().starts_with("x-") {
            headers.insert(name, value);
        } else {
            headers.append(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decision::Decision, decision::Source};

    fn rd(rule: &str, d: Decision) -> RuleDecision {
        RuleDecision {
            rule: rule.into(),
            decision: d,
            source: Source::Local,
            shadow: false,
            concurrency: false,
            hidden: false,
            partition: None,
            quota_member: None,
        }
    }

    #[test]
    fn hidden_rules_are_left_out_and_pk_is_sf_binary() {
        let q = Duration::from_secs(60);
        let mut ds = [
            rd("abuse", Decision::allowed(5, q, 4, q)),
            RuleDecision {
                partition: Some(*b"\x00\x01\x02\xfd\xfe\xff\x10\x20\x30"),
                ..rd(
                    "per-key",
                    Decision::allowed(10, q, 9, q).with_next_unit(Duration::from_secs(6)),
                )
            },
        ];
        ds[0].hidden = true;
        let mut out = Rendered::new();
        Headers::from(HeaderStyle::Draft).render(&mut ds, &mut out);
        assert_eq!(out[0].1, r#""per-key";q=10;w=60"#);
        assert_eq!(out[1].1, r#""per-key";r=9;t=6;pk=:AAEC/f7/ECAw:"#);
    }

    #[test]
    fn rounding() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(2000)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
        assert_eq!(retry_after_secs(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    #[test]
    fn draft_lists_every_visible_rule_and_escapes_names() {
        let w = Duration::from_secs(60);
        let mut shadow = rd("hidden", Decision::allowed(1, w, 0, w));
        shadow.shadow = true;
        let mut ds = [
            rd(
                "a",
                Decision::allowed(100, w, 50, Duration::from_millis(29_500)),
            ),
            shadow,
            rd(
                "q\"b",
                Decision::allowed(10, Duration::from_millis(500), 9, Duration::ZERO),
            ),
        ];
        let mut out = Rendered::new();
        Headers::from(HeaderStyle::Both).render(&mut ds, &mut out);
        let get = |n: &HeaderName| {
            out.iter()
                .find(|(k, _)| k == n)
                .unwrap()
                .1
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(get(&RATELIMIT_POLICY), r#""a";q=100;w=60, "q\"b";q=10;w=1"#);
        assert_eq!(get(&RATELIMIT), r#""a";r=50;t=30, "q\"b";r=9;t=0"#);
        assert_eq!(digits(0), 1);
        assert_eq!(digits(10), 2);
        assert_eq!(digits(u64::MAX), 20);
        assert_eq!(sf_string_len("q\"b"), r#""q\"b""#.len());
        assert_eq!(get(&X_RATELIMIT_REMAINING), "9");
        assert_eq!(get(&X_RATELIMIT_LIMIT), "10");
        assert_eq!(get(&X_RATELIMIT_RESET), "0");
    }

    #[test]
    fn concurrency_policy_has_a_unit_and_no_window() {
        let mut d = rd(
            "exports",
            Decision::allowed(2, Duration::from_secs(1), 1, Duration::ZERO),
        );
        d.concurrency = true;
        let mut out = Rendered::new();
        Headers::from(HeaderStyle::Draft).render(&mut [d], &mut out);
        assert_eq!(out[0].1, r#""exports";q=2;qu="concurrent-requests""#);
        assert_eq!(out[1].1, r#""exports";r=1;t=0"#);
    }

    #[test]
    fn nothing_for_none_or_only_shadow() {
        let w = Duration::from_secs(1);
        let mut out = Rendered::new();
        Headers::from(HeaderStyle::None)
            .render(&mut [rd("a", Decision::allowed(1, w, 0, w))], &mut out);
        let mut s = rd("a", Decision::allowed(1, w, 0, w));
        s.shadow = true;
        Headers::from(HeaderStyle::Both).render(&mut [s], &mut out);
        assert!(out.is_empty());
    }

    /// Every value the renderer can emit parses as an RFC 9651 list whose
    /// members and parameters carry the numbers back, whatever the name.
    mod parses_back {
        use super::*;
        use proptest::prelude::*;
        use sfv::{ListEntry, Parser};

        type Params = Vec<(String, sfv::BareItem)>;

        fn members(v: &HeaderValue) -> Vec<(String, Params)> {
            let list: sfv::List = Parser::new(v.as_bytes())
                .parse()
                .expect("a structured-field list");
            list.into_iter()
                .map(|e| match e {
                    ListEntry::Item(i) => (
                        i.bare_item
                            .as_string()
                            .expect("an sf-string name")
                            .as_str()
                            .to_owned(),
                        i.params
                            .into_iter()
                            .map(|(k, v)| (k.as_str().to_owned(), v))
                            .collect(),
                    ),
                    ListEntry::InnerList(_) => panic!("no inner lists"),
                })
                .collect()
        }

        fn int(params: &Params, key: &str) -> Option<i64> {
            params
                .iter()
                .find(|(k, _)| k == key)?
                .1
                .as_integer()
                .map(i64::from)
        }

        proptest! {
            #[test]
            fn rendered_members_parse_with_their_values(
                names in proptest::collection::vec("[ -~]{1,24}", 1..4),
                limit in 1u32..1_000_000,
                window_s in 1u64..100_000,
                remaining in 0u32..1_000_000,
                next_ms in 0u64..10_000_000,
                pk in proptest::option::of(any::<[u8; 9]>()),
                concurrency in any::<bool>(),
            ) {
                let window = Duration::from_secs(window_s);
                let next = Duration::from_millis(next_ms);
                let mut ds: Vec<RuleDecision> = names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| RuleDecision {
                        rule: format!("{n}{i}").into(),
                        concurrency,
                        partition: pk,
                        ..rd("", Decision::allowed(limit, window, remaining, window).with_next_unit(next))
                    })
                    .collect();
                let mut out = Rendered::new();
                Headers::from(HeaderStyle::Draft).render(&mut ds, &mut out);
                let policy = members(&out[0].1);
                let state = members(&out[1].1);
                prop_assert_eq!(policy.len(), ds.len());
                for ((d, (pn, pp)), (sn, sp)) in ds.iter().zip(&policy).zip(&state) {
                    prop_assert_eq!(pn.as_str(), &*d.rule);
                    prop_assert_eq!(sn.as_str(), &*d.rule);
                    prop_assert_eq!(int(pp, "q"), Some(i64::from(limit)));
                    if concurrency {
                        prop_assert!(int(pp, "w").is_none());
                    } else {
                        prop_assert_eq!(int(pp, "w"), Some(window_s as i64));
                    }
                    prop_assert_eq!(int(sp, "r"), Some(i64::from(remaining)));
                    prop_assert_eq!(int(sp, "t"), Some(t_secs(&d.decision) as i64));
                    let got_pk = sp
                        .iter()
                        .find(|(k, _)| k == "pk")
                        .and_then(|(_, v)| v.as_byte_sequence().map(<[u8]>::to_vec));
                    prop_assert_eq!(got_pk, pk.map(|p| p.to_vec()));
                }
            }
        }
    }
}
