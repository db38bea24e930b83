//! Any-of groups: rules a request is charged to the first of that admits it.

use std::sync::Arc;

use super::Rule;

/// An any-of group: `members` in order, a request charged to the first
/// that admits it and refused only when every member refuses. The group
/// stands in the chain as one rule: a rule before it that refuses skips
/// it, and a rule after it that refuses gives the charged member its
/// units back. For [`RateLimitBuilder::any_of`](crate::rate_limit::RateLimitBuilder::any_of)
/// and [`RateLimitLayer::reload`](crate::RateLimitLayer::reload).
///
/// - A refusal carries every member's `RateLimit` item, and the
///   `Retry-After` of the member whose units come back soonest.
/// - An allow carries every member too: those asked before the one that
///   admitted (all empty), that one, and the members after it read without
///   spending. A local member is read in place; a global one costs one
///   read-only Redis call (under its timeout; left out of the headers
///   while its breaker is open or Redis is slow). Put global members first
///   when that call matters: a global member that admits reads the local
///   ones after it for free.
/// - A member whose key is missing, or that exempts the request
///   ([`Rule::exempt`]), is skipped; one that rejects the request
///   (`OnMissingKey::Reject`) rejects it for the group.
/// - Members are ordinary rules with their own names, counters, metrics and
///   locks, but `shadow` and `OnDeny::Wait` are build errors in a member: a
///   member that never refuses, or waits, would keep the next from being
///   asked.
///
/// The classic use, a steady rate with a pool for bursts (as
/// rate-limiter-flexible's `BurstyRateLimiter`):
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, rule};
///
/// let key = KeyExtractor::header("x-api-key");
/// let steady = Rule::new("steady", key.clone(), Quota::per_second(5));
/// let burst = Rule::new("burst-pool", key, Quota::new(100, Duration::from_secs(3600)));
/// let layer = RateLimitLayer::builder().any_of("api", [steady, burst]).build()?;
/// assert_eq!(layer.rules()[1].group(), Some("api"));
/// // The same chain for a reload.
/// let again = rule::any_of("api", [
///     Rule::new("steady", KeyExtractor::header("x-api-key"), Quota::per_second(5)),
///     Rule::new("burst-pool", KeyExtractor::header("x-api-key"), Quota::new(100, Duration::from_secs(3600))),
/// ]);
/// layer.reload(again)?;
/// # Ok::<(), keyed_rate_limit::BuildError>(())
/// ```
pub fn any_of(name: impl Into<Arc<str>>, members: impl IntoIterator<Item = Rule>) -> Vec<Rule> {
    let name = name.into();
    members
        .into_iter()
        .map(|mut r| {
            r.group = Some(name.clone());
            r
        })
        .collect()
}
