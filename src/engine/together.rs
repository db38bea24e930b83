//! Several keyed decisions made together (the rate-limit service's
//! descriptors): each rule's own steps, except that the exact Redis calls
//! of global rules on one Redis (not a cluster) go as one script call,
//! under one wait, and each rule then learns from its own reply as from a
//! call of its own.
//!
//! Such a call bypasses the rules' coalescing queues: it is already one
//! call for the request's rules. It waits the shortest of their timeouts,
//! and every rule's breaker and latency metric counts it.

use std::num::NonZeroU32;
#[cfg(feature = "redis")]
use std::sync::Arc;

use futures_util::future::join_all;

use super::chain::Chain;
#[cfg(feature = "redis")]
use super::global::{Global, Quotas, locks};
use super::keyed::decided;
#[cfg(feature = "redis")]
use super::rule::{CompiledRule, Store};
use crate::decision::RuleDecision;
use crate::key::Key;
use crate::quota::Quota;
use crate::util::now_or_later::NowOrLater;

impl Chain {
    /// [`decide_key`](Self::decide_key) for each ask, together.
    pub(crate) async fn decide_keys(
        &self,
        asks: impl IntoIterator<Item = (usize, Key, NonZeroU32, Option<Quota>)>,
    ) -> Vec<Option<RuleDecision>> {
        let asks = asks.into_iter();
        let mut out = Vec::with_capacity(asks.size_hint().0);
        let mut later = Vec::new();
        #[cfg(feature = "redis")]
        let mut exact: Vec<(usize, bool, Exact)> = Vec::new();
        for (i, (at, key, cost, quota)) in asks.enumerate() {
            out.push(None);
            let Some((rule, quota, other)) = self.keyed(at, quota) else {
                continue;
            };
            #[cfg(feature = "redis")]
            let step = match rule.decide_or_ask(key, quota, cost) {
                Asking::Step(step) => step,
                Asking::Exact(ask) => {
                    exact.push((i, other, ask));
                    continue;
                }
            };
            #[cfg(not(feature = "redis"))]
            let step = rule.decide(key, quota, cost);
            match step {
                NowOrLater::Now(outcome) => out[i] = decided(outcome, other),
                NowOrLater::Later(f) => later.push(async move { (i, decided(f.await, other)) }),
            }
        }
        #[cfg(feature = "redis")]
        let (later, exact) = futures_util::future::join(
            join_all(later),
            join_all(by_backend(exact).into_iter().map(send)),
        )
        .await;
        #[cfg(not(feature = "redis"))]
        let (later, exact) = (join_all(later).await, Vec::<Vec<_>>::new());
        for (i, d) in later.into_iter().chain(exact.into_iter().flatten()) {
            out[i] = d;
        }
        out
    }
}

/// A global decision that Redis must make exactly, left to be sent with
/// others ([`send`]).
#[cfg(feature = "redis")]
pub(super) struct Exact {
    rule: Arc<CompiledRule>,
    global: Arc<Global>,
    key: Key,
    /// The key as the rule stores it.
    bounded: Key,
    /// The request's quota (`shown`), and the quota Redis counts.
    quotas: Quotas,
    cost: NonZeroU32,
}

/// What [`CompiledRule::decide_or_ask`] leaves: a rule's step, or an
/// exact decision to ask Redis with others.
#[cfg(feature = "redis")]
pub(super) enum Asking {
    Step(super::decide::Step),
    Exact(Exact),
}

#[cfg(feature = "redis")]
impl CompiledRule {
    /// [`decide`](Self::decide), except that an exact decision of a global
    /// rule that shares calls is handed back, to be asked with others.
    pub(super) fn decide_or_ask(
        self: &Arc<Self>,
        key: Key,
        quota: Quota,
        cost: NonZeroU32,
    ) -> Asking {
        let Store::Global(g) = &self.store else {
            return Asking::Step(self.decide(key, quota, cost));
        };
        if let Some(step) = self.refused_first(&key, quota, cost) {
            return Asking::Step(step);
        }
        let bounded = key.clone().bounded(self.max_key_len);
        let now = g.decide_now(&self.rule, &self.locks, &bounded, quota, cost);
        if let Err(super::global::Asked::Exact(quotas)) = now
            && g.redis.shares_calls()
        {
            return Asking::Exact(Exact {
                rule: self.clone(),
                global: g.clone(),
                key,
                bounded,
                quotas,
                cost,
            });
        }
        let checked = self.asked(g, bounded, cost, now);
        Asking::Step(self.then_settle(key, quota, cost, checked))
    }
}

/// The asks of each Redis, in order.
#[cfg(feature = "redis")]
fn by_backend(mut asks: Vec<(usize, bool, Exact)>) -> Vec<Vec<(usize, bool, Exact)>> {
    let mut groups = Vec::new();
    while let Some((_, _, first)) = asks.first() {
        let redis = first.global.redis.clone();
        // Most often one Redis: the asks as they are.
        if asks.iter().all(|(_, _, a)| a.global.redis.same(&redis)) {
            groups.push(asks);
            break;
        }
        let (same, other) = (asks.into_iter()).partition(|(_, _, a)| a.global.redis.same(&redis));
        groups.push(same);
        asks = other;
    }
    groups
}

/// One Redis's asks in one call (a lone ask as it would go alone), and
/// each rule's step after its reply.
#[cfg(feature = "redis")]
async fn send(mut asks: Vec<(usize, bool, Exact)>) -> Vec<(usize, Option<RuleDecision>)> {
    if let [(i, other, _)] = asks[..] {
        let Exact {
            rule,
            global,
            key,
            bounded,
            quotas,
            cost,
        } = asks.pop().expect("one ask").2;
        let pending = Err(super::global::Asked::Exact(quotas));
        let checked = rule.asked(&global, bounded, cost, pending);
        let outcome = (rule.then_settle(key, quotas.shown, cost, checked))
            .resolve()
            .await;
        return vec![(i, decided(outcome, other))];
    }
    // Known after each rule's first call: read side by side until then.
    if asks.iter().any(|(_, _, a)| !a.global.fleet.initialized()) {
        join_all(
            asks.iter()
                .map(|(_, _, a)| a.global.know_fleet(&a.rule.rule)),
        )
        .await;
    }
    let requests: Vec<_> = (asks.iter())
        .map(|(_, _, a)| {
            let target = crate::backend::redis::Target {
                rule: &a.rule.rule.name,
                algorithm: a.rule.rule.algorithm,
                quota: &a.quotas.counted,
                locks: locks(&a.rule.rule),
            };
            let previous = a.global.previous(a.quotas.counted);
            (target, &a.bounded, a.cost.get(), previous)
        })
        .collect();
    let redis = &asks[0].2.global.redis;
    let timeout = (asks.iter().map(|(_, _, a)| a.global.guard.timeout()))
        .min()
        .expect("several asks");
    let start = tokio::time::Instant::now();
    let outcome = {
        let call = std::pin::pin!(redis.check_together(&requests));
        crate::failure::wait(timeout, redis.reachability(), start, call).await
    };
    drop(requests);
    let (mut out, mut waits) = (Vec::with_capacity(asks.len()), Vec::new());
    for (n, (i, other, a)) in asks.into_iter().enumerate() {
        let own = match &outcome {
            Ok(Ok(decided)) => Ok(Ok(decided[n])),
            Ok(Err(e)) => Ok(Err(e.clone())),
            Err(took) => Err(*took),
        };
        let answer = a.global.guard.counted(start, own);
        let (rule, g) = (&a.rule, &a.global);
        if let Ok(d) = &answer {
            g.learn(&rule.rule, &a.bounded, &a.quotas.counted, &d.decision);
        }
        let decided_now = g.answered(
            &rule.rule,
            &rule.locks,
            &a.bounded,
            a.quotas,
            a.cost,
            answer,
        );
        match rule.then_settle(a.key, a.quotas.shown, a.cost, NowOrLater::Now(decided_now)) {
            NowOrLater::Now(outcome) => out.push((i, decided(outcome, other))),
            NowOrLater::Later(f) => waits.push(async move { (i, decided(f.await, other)) }),
        }
    }
    // A rule that waits out its deny (`OnDeny::Wait`) waits beside the
    // others, once every rule has its reply.
    out.extend(join_all(waits).await);
    out
}
