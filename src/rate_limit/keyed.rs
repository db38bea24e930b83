//! The keyed door: a layer's rules deciding keys they are handed, with no
//! request around them (the way a rate-limit service reaches the engine).

use std::num::NonZeroU32;
use std::sync::Arc;

use std::time::Duration;

use super::shared::Shared;
use crate::decision::{Decision, Decisions, RuleDecision};
use crate::engine::Chain;
use crate::key::Key;
use crate::quota::Quota;
use crate::response::{Denied, refusal};

/// A layer's rules at one moment, deciding keys handed to them rather than
/// read from a request: how a rate-limit service (the `keyed-rls` crate,
/// Envoy's RLS v3) shares a layer's rules, stores, failure modes, metrics
/// and renderers, with no made-up request.
///
/// Taken by [`RateLimitLayer::keyed`](super::RateLimitLayer::keyed); a
/// [`reload`](super::RateLimitLayer::reload) after that does not change
/// it, so every decision of one call (e.g. all
/// of a request's descriptors) sees one set of rules. A rule's own steps
/// run (its store, lock, lockout, shadow mode, failure mode and metrics);
/// only its key extractor, cost and quota closures are left out, since the
/// caller hands over the key, the cost and, optionally, the quota.
///
/// ```
/// use std::num::NonZeroU32;
/// use keyed_rate_limit::{Key, KeyExtractor, Quota, RateLimitLayer, Rule};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keyed_rate_limit::BuildError> {
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("per-user", KeyExtractor::header("x-user"), Quota::per_minute(1)))
///     .build()?;
/// let rules = layer.keyed();
/// let at = rules.rule("per-user").expect("a rule of the layer");
/// let alice = Key::from("alice");
/// let first = rules.decide(at, alice.clone(), NonZeroU32::MIN, None).await.unwrap();
/// let second = rules.decide(at, alice.clone(), NonZeroU32::MIN, None).await.unwrap();
/// assert!(first.decision.is_allowed() && !second.decision.is_allowed());
/// // The refusal a client is given, rendered as the layer renders its own.
/// let answer = rules.answer([second]);
/// assert_eq!(answer.refusal.unwrap().status(), 429);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KeyedRules {
    pub(super) chain: Arc<Chain>,
    pub(super) shared: Arc<Shared>,
}

/// A rule's place in the [`KeyedRules`] it was found in; after a reload,
/// look it up again in a new [`RateLimitLayer::keyed`](super::RateLimitLayer::keyed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuleIndex(usize);

/// One decision of [`KeyedRules::decide_all`]: as
/// [`decide`](KeyedRules::decide)'s arguments.
#[derive(Debug, Clone)]
pub struct KeyedAsk {
    /// The rule that decides.
    pub rule: RuleIndex,
    /// The key it decides for.
    pub key: Key,
    /// The units asked for.
    pub cost: NonZeroU32,
    /// A quota other than the rule's own, counted apart.
    pub quota: Option<Quota>,
}

/// What the rules' decisions tell the client, as the layer would: an
/// allow's rate-limit headers, or a refusal's whole response.
#[derive(Debug)]
#[non_exhaustive]
pub struct KeyedAnswer {
    /// An allow's draft `RateLimit-Policy` and `RateLimit` headers (empty
    /// on a refusal, whose response carries its own).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// A refusal: status, `Retry-After` (the longest wait), headers and
    /// body (naming every rule that refused).
    pub refusal: Option<http::Response<bytes::Bytes>>,
}

impl KeyedRules {
    /// The rule named `name`.
    pub fn rule(&self, name: &str) -> Option<RuleIndex> {
        self.chain.position(name).map(RuleIndex)
    }

    /// Whether `rule` refuses when its store cannot answer (a global rule
    /// under [`FailureMode::FailClosed`](crate::failure::FailureMode::FailClosed)).
    pub fn fails_closed(&self, rule: RuleIndex) -> bool {
        self.chain.fails_closed(rule.0)
    }

    /// `rule` decides `cost` units of `key`, in `quota` or else its static
    /// quota, spending them if allowed. A `quota` other than the rule's
    /// counts apart (as each distinct quota of a rule does) and names no
    /// `RateLimit-Policy` member. `None` when `rule` is not one of these
    /// rules, or has no static quota and none is given.
    ///
    /// A store that cannot answer is the rule's failure mode's to decide:
    /// the decision's [`source`](RuleDecision::source) says so.
    pub async fn decide(
        &self,
        rule: RuleIndex,
        key: Key,
        cost: NonZeroU32,
        quota: Option<Quota>,
    ) -> Option<RuleDecision> {
        Some(
            self.chain
                .decide_key(rule.0, key, cost, quota)?
                .resolve()
                .await,
        )
    }

    /// Each ask decided as by [`decide`](Self::decide), all together, in
    /// order: the exact decisions of global rules on one Redis (a single
    /// server or a Sentinel's master, not a cluster, whose keys live on
    /// slots of their own) go in one round trip and one script call,
    /// beside the rules' coalescing queues. That call waits the shortest of
    /// the rules' timeouts; each rule's breaker and latency metric count
    /// it, and a failure goes to each rule's own failure mode. What a rule
    /// answers without Redis (a lease, a cached deny, a lock, an open
    /// breaker) it answers as alone.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use keyed_rate_limit::rate_limit::KeyedAsk;
    /// use keyed_rate_limit::{Key, KeyExtractor, Quota, RateLimitLayer, Rule};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_rate_limit::BuildError> {
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("per-user", KeyExtractor::header("x-user"), Quota::per_minute(5)))
    ///     .rule(Rule::new("per-route", KeyExtractor::matched_route(), Quota::per_minute(1)))
    ///     .build()?;
    /// let rules = layer.keyed();
    /// let ask = |rule: &str, key: &'static str| KeyedAsk {
    ///     rule: rules.rule(rule).unwrap(),
    ///     key: Key::from(key),
    ///     cost: NonZeroU32::MIN,
    ///     quota: None,
    /// };
    /// let decided = rules.decide_all([ask("per-user", "ann"), ask("per-route", "/a"), ask("per-route", "/a")]).await;
    /// let allowed: Vec<bool> = decided.iter().map(|d| d.as_ref().unwrap().decision.is_allowed()).collect();
    /// assert_eq!(allowed, [true, true, false]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn decide_all(
        &self,
        asks: impl IntoIterator<Item = KeyedAsk>,
    ) -> Vec<Option<RuleDecision>> {
        let asks = asks.into_iter().map(|a| (a.rule.0, a.key, a.cost, a.quota));
        self.chain.decide_keys(asks).await
    }

    /// What a request of one unit of `key` would be told by `rule`, without
    /// spending; `None` when `rule` is not one of these rules, has no quota
    /// to decide in, or its store does not answer within its timeout (or
    /// its breaker is open).
    pub async fn peek(&self, rule: RuleIndex, key: &Key, quota: Option<Quota>) -> Option<Decision> {
        self.chain.peek_key(rule.0, key, quota).await
    }

    /// The answer to decisions that must all allow (a request's
    /// descriptors): the headers of an allow, or the refusal of every rule
    /// that refused (shadow rules refuse nothing).
    pub fn answer(&self, decided: impl IntoIterator<Item = RuleDecision>) -> KeyedAnswer {
        let mut rules: Decisions = decided.into_iter().collect();
        let mut headers = crate::headers::Rendered::new();
        self.shared.headers.render(&mut rules, &mut headers);
        let refused: Vec<&RuleDecision> = rules
            .iter()
            .filter(|d| !d.decision.is_allowed() && !d.shadow)
            .collect();
        let wait = |d: &&&RuleDecision| d.decision.retry_after().unwrap_or(Duration::MAX);
        let Some(answer) = refused.iter().max_by_key(wait) else {
            return KeyedAnswer {
                headers: headers.into_vec(),
                refusal: None,
            };
        };
        let denied = Denied {
            hidden: answer.hidden,
            violated: match refused.len() {
                1 => Vec::new(),
                _ => refused
                    .iter()
                    .filter(|d| !d.hidden)
                    .map(|d| d.rule.clone())
                    .collect(),
            },
            ..Denied::new(answer.rule.clone(), answer.decision.retry_after())
        };
        let refusal = refusal(&self.shared.deny, &denied, &http::HeaderMap::new(), headers);
        KeyedAnswer {
            headers: Vec::new(),
            refusal: Some(refusal),
        }
    }
}

impl std::fmt::Debug for KeyedRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedRules")
            .field(
                "rules",
                &self.chain.rules().map(|r| &r.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}
