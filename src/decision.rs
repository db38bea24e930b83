//! What a rule decided for one request, as the headers and handlers see it.

use std::sync::Arc;
use std::time::Duration;

/// One rule's verdict on one request.
///
/// Backends produce it, the layer turns it into headers, and the handler can
/// read the whole list from the request extensions as a [`RateLimitDecision`].
///
/// The control handle's `peek` returns one without spending:
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(10)))
///     .build()
///     .unwrap();
/// let d = layer.control().peek("api", "acme").await.unwrap();
/// assert!(d.is_allowed());
/// assert_eq!((d.limit(), d.window(), d.remaining()), (10, Duration::from_secs(60), 10));
/// assert_eq!(d.retry_after(), None);
/// # }
/// /// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    allowed: bool,
    limit: u32,
    remaining: u32,
    // Durations as nanoseconds, saturating at `u64::MAX` (584 years), as
    // governor counts them: half the size of four `Duration`s, and a
    // decision moves through every step of a request.
    window: u64,
    reset: u64,
    /// `NO_RETRY` when there is no `Retry-After`.
    retry_after: u64,
    next: u64,
}

/// `retry_after`'s `None`. A real wait saturates one below it.
const NO_RETRY: u64 = u64::MAX;

/// `d` in nanoseconds, saturating.
const fn nanos(d: Duration) -> u64 {
    let n = d.as_nanos();
    if n > u64::MAX as u128 {
        u64::MAX
    } else {
        n as u64
    }
}

/// `d` in nanoseconds, saturating below [`NO_RETRY`].
const fn retry_nanos(d: Duration) -> u64 {
    let n = nanos(d);
    if n == NO_RETRY { NO_RETRY - 1 } else { n }
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.allowed)
            .field("limit", &self.limit)
            .field("window", &self.window())
            .field("remaining", &self.remaining)
            .field("reset", &self.reset())
            .field("retry_after", &self.retry_after())
            .field("next", &self.next_unit())
            .finish()
    }
}

impl Decision {
    /// The request may go on; `remaining` units are left, and the quota is
    /// whole again after `reset`. One more unit is taken to come back after
    /// `reset` too, unless [`with_next_unit`](Self::with_next_unit) says sooner.
    pub(crate) const fn allowed(
        limit: u32,
        window: Duration,
        remaining: u32,
        reset: Duration,
    ) -> Self {
        Self {
            allowed: true,
            limit,
            window: nanos(window),
            remaining,
            reset: nanos(reset),
            retry_after: NO_RETRY,
            next: nanos(reset),
        }
    }

    /// On an allow: one unit more than [`remaining`](Self::remaining) fits
    /// after `next` (zero when the quota is whole). The `RateLimit` header's
    /// `t`; see [`headers`](crate::headers).
    pub(crate) const fn with_next_unit(mut self, next: Duration) -> Self {
        if self.allowed {
            self.next = nanos(next);
        }
        self
    }

    /// The same decision over a window of another length: a calendar
    /// month's own.
    #[cfg(feature = "redis")]
    pub(crate) const fn with_window(mut self, window: Duration) -> Self {
        self.window = nanos(window);
        self
    }

    /// The request is over the limit; it could succeed after `retry_after`.
    pub(crate) const fn denied(
        limit: u32,
        window: Duration,
        retry_after: Duration,
        reset: Duration,
    ) -> Self {
        Self {
            allowed: false,
            limit,
            window: nanos(window),
            remaining: 0,
            reset: nanos(reset),
            retry_after: retry_nanos(retry_after),
            next: nanos(retry_after),
        }
    }

    /// The request can never pass, e.g. its cost is above the burst: no
    /// `Retry-After` is sent, because waiting would not help.
    pub(crate) const fn never(limit: u32, window: Duration) -> Self {
        Self {
            retry_after: NO_RETRY,
            ..Self::denied(limit, window, Duration::ZERO, Duration::ZERO)
        }
    }

    /// Whether the request may go on.
    pub const fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// The quota's limit per window.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The quota's window.
    pub const fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// Units left after this request.
    pub const fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Time until the quota is whole again.
    pub const fn reset(&self) -> Duration {
        Duration::from_nanos(self.reset)
    }

    /// On a deny, how long to wait before this request could pass; `None`
    /// when allowed or when it can never pass.
    pub const fn retry_after(&self) -> Option<Duration> {
        if self.retry_after == NO_RETRY {
            None
        } else {
            Some(Duration::from_nanos(self.retry_after))
        }
    }

    /// How long until one unit more than [`remaining`](Self::remaining) is
    /// available: on an allow, when the next unit comes back (zero when the
    /// quota is whole); on a deny, the retry-after (zero when the request can
    /// never pass).
    pub const fn next_unit(&self) -> Duration {
        Duration::from_nanos(self.next)
    }
}

/// Where a decision came from, so that operators can tell a real limit from
/// a failure mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The in-process governor limiter.
    Local,
    /// The shared Redis.
    Global,
    /// Redis failed and the rule fell back to its local share of the quota.
    Fallback,
    /// Redis failed and the rule let the request through.
    FailOpen,
    /// Redis failed and the rule refused the request.
    FailClosed,
    /// The key is locked: by the rule's [`Lockout`](crate::policy::Lockout),
    /// or blocked through the [`Control`](crate::rate_limit::Control) handle. Denied
    /// without asking the algorithm.
    Locked,
    /// Spent from this gateway's lease of the shared quota
    /// (`Rule::lease`, feature `redis`), without a Redis call.
    Leased,
}

impl Source {
    /// A short, stable name for logs and metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Global => "global",
            Self::Fallback => "fallback",
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
            Self::Locked => "locked",
            Self::Leased => "leased",
        }
    }
}

/// A rule's name with its decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleDecision {
    /// The rule's name.
    pub rule: Arc<str>,
    /// What it decided.
    pub decision: Decision,
    /// Which backend or failure mode decided.
    pub source: Source,
    /// The rule is in shadow mode: a deny was recorded, not enforced.
    pub shadow: bool,
    /// The rule counts requests in flight, not requests per window.
    pub concurrency: bool,
    /// The rule is kept out of the rate-limit headers ([`Rule::hidden`](crate::rule::Rule::hidden)).
    pub hidden: bool,
    /// The draft's `pk`: a prefix of the key's SHA-256 ([`Rule::partition_key`](crate::Rule::partition_key)).
    pub(crate) partition: Option<[u8; crate::key::PARTITION_LEN]>,
    /// The rule's `RateLimit-Policy` member when its quota is static.
    pub(crate) quota_member: Option<http::HeaderValue>,
}

/// Every evaluated rule's decision, in rule order; inserted into the request
/// extensions before the inner service runs.
///
/// ```
/// use axum::{Extension, routing::get, Router};
/// use keyed_rate_limit::decision::RateLimitDecision;
///
/// async fn handler(Extension(d): Extension<RateLimitDecision>) -> String {
///     match d.most_restrictive() {
///         Some(r) => format!("{} left under {}", r.decision.remaining(), r.rule),
///         None => "unlimited".to_owned(),
///     }
/// }
/// let app: Router = Router::new().route("/", get(handler));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimitDecision {
    pub(crate) rules: Decisions,
}

/// The decisions of one request: inline for the usual single rule, so the
/// extension is the request's only allocation for them.
pub(crate) type Decisions = smallvec::SmallVec<[RuleDecision; 1]>;

impl RateLimitDecision {
    /// The rules that applied to this request, in evaluation order; with
    /// stacked rate limiters, the outer one's first.
    ///
    /// ```
    /// use keyed_rate_limit::decision::RateLimitDecision;
    /// let d = RateLimitDecision::default();
    /// assert!(d.rules().is_empty());
    /// assert!(d.most_restrictive().is_none());
    /// ```
    pub fn rules(&self) -> &[RuleDecision] {
        &self.rules
    }

    /// The applied rule with the fewest units left (the first on a tie).
    pub fn most_restrictive(&self) -> Option<&RuleDecision> {
        tightest(self.rules.iter())
    }
}

/// Fewest units left, then the longest reset; the first on a tie.
pub(crate) fn tightest<'a>(
    rules: impl Iterator<Item = &'a RuleDecision>,
) -> Option<&'a RuleDecision> {
    rules.min_by_key(|r| {
        (
            r.decision.remaining(),
            std::cmp::Reverse(r.decision.reset()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip_and_saturate_at_u64_nanoseconds() {
        let (w, r, n) = (
            Duration::from_secs(60),
            Duration::from_millis(1500),
            Duration::from_nanos(7),
        );
        let d = Decision::allowed(10, w, 3, r).with_next_unit(n);
        assert_eq!((d.window(), d.reset(), d.next_unit()), (w, r, n));
        assert_eq!(d.retry_after(), None);
        let d = Decision::denied(10, w, r, w);
        assert_eq!((d.retry_after(), d.next_unit(), d.reset()), (Some(r), r, w));
        // Beyond 584 years: saturated, and a wait stays a wait.
        let d = Decision::denied(10, Duration::MAX, Duration::MAX, Duration::MAX);
        let max = Duration::from_nanos(u64::MAX);
        assert_eq!((d.window(), d.reset(), d.next_unit()), (max, max, max));
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(u64::MAX - 1)));
        assert_eq!(Decision::never(10, w).retry_after(), None);
        // Debug shows durations, as the derived one did.
        assert!(format!("{:?}", Decision::denied(1, w, r, w)).contains("retry_after: Some(1.5s)"));
    }
}
