//! The keyed door: one rule of a chain decides a key it is handed, with
//! no request around it (the rate-limit service's way in). The rule's own
//! steps run, with its store, locks, failure mode and metrics; only the
//! key's extraction is left out.

use std::num::NonZeroU32;
use std::sync::Arc;

use super::chain::Chain;
use super::decide::Outcome;
use super::rule::{CompiledRule, Store};
use crate::decision::{Decision, RuleDecision};
use crate::key::Key;
use crate::quota::Quota;
use crate::util::now_or_later::NowOrLater;

impl Chain {
    /// Where the rule named `name` is in the chain, for the calls below.
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.rules.iter().position(|r| &*r.rule.name == name)
    }

    /// Whether rule `at` fails closed on a store that cannot answer (a
    /// global rule under `FailClosed`).
    pub(crate) fn fails_closed(&self, at: usize) -> bool {
        self.rules.get(at).is_some_and(|r| {
            r.rule.scope.is_global()
                && r.rule.failure.mode == crate::policy::FailureMode::FailClosed
        })
    }

    /// Rule `at` decides `cost` units of `key` in `quota`, or in its
    /// static quota; `None` when there is no such rule, or no quota to
    /// decide in. A quota other than the rule's keeps counters apart
    /// (as each distinct quota of a rule does), and its decision names no
    /// static `RateLimit-Policy` member.
    pub(crate) fn decide_key(
        &self,
        at: usize,
        key: Key,
        cost: NonZeroU32,
        quota: Option<Quota>,
    ) -> Option<NowOrLater<RuleDecision>> {
        let (rule, quota, other) = self.keyed(at, quota)?;
        Some(match rule.decide(key, quota, cost) {
            NowOrLater::Now(outcome) => NowOrLater::Now(decided(outcome, other)?),
            NowOrLater::Later(f) => NowOrLater::Later(Box::pin(async move {
                decided(f.await, other).expect("a keyed rule decides")
            })),
        })
    }

    /// Rule `at`, the quota it decides in (`quota`, or its static quota)
    /// and whether that is another quota than its own.
    pub(super) fn keyed(
        &self,
        at: usize,
        quota: Option<Quota>,
    ) -> Option<(&Arc<CompiledRule>, Quota, bool)> {
        let rule = self.rules.get(at)?;
        let own = rule.rule.static_quota();
        let quota = quota.or(own)?;
        Some((rule, quota, Some(quota) != own))
    }

    /// What a request of one unit of `key` would be told by rule `at`, in
    /// `quota` or its static quota, without spending; `None` when there is
    /// no such rule, or a global rule's store does not answer within its
    /// timeout (or its breaker is open).
    pub(crate) async fn peek_key(
        &self,
        at: usize,
        key: &Key,
        quota: Option<Quota>,
    ) -> Option<Decision> {
        let rule = self.rules.get(at)?;
        let quota = quota.or(rule.rule.static_quota())?;
        let key = rule.bounded(key);
        let d = match &rule.store {
            Store::Local(store) => store.adjust(&key, quota, 0),
            #[cfg(feature = "redis")]
            Store::Global(g) => g.read(&rule.rule, &key, quota).await?,
        };
        Some(match rule.locks.locked(&key) {
            Some(left) => Decision::denied(quota.limit(), quota.window(), left, left),
            None => d,
        })
    }
}

/// A keyed decision's outcome as the caller sees it: a quota other than
/// the rule's (`other`) names no static `RateLimit-Policy` member.
pub(super) fn decided(outcome: Outcome, other: bool) -> Option<RuleDecision> {
    match outcome {
        Outcome::Decided(mut d, _) => {
            if other {
                d.quota_member = None;
            }
            Some(d)
        }
        _ => None,
    }
}
